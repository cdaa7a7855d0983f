#!/usr/bin/env bash
# The whole test suite: unit, conformance (memory and the Spanner emulator),
# elector, simulation, Kubernetes wire-level, whole-process and manifest checks,
# and the end-to-end suite on a real cluster.
#
# Needs the Cloud Spanner emulator: SPANNER_EMULATOR_HOST (one already
# running), SPANNER_EMULATOR_DIR (folder with gateway_main and emulator_main),
# the gcloud SDK's cloud-spanner-emulator component, or both binaries on PATH.
# Needs the PostgreSQL server binaries and redis-server too (the PostgreSQL
# and Redis tests start private servers); scripts/setup-servers.sh installs
# them when missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Every prerequisite is listed in README.md, "The test suite".
# First, which cluster the end-to-end part (tests/e2e and the Kubernetes
# store's tests) will use, so a run without one says so before it starts.
if [[ -n "${LEASEHOLD_E2E_KUBECONFIG:-}" ]]; then
  server="$(sed -n 's/^ *server: *//p' "$LEASEHOLD_E2E_KUBECONFIG" 2>/dev/null | head -n 1)"
  echo "test.sh: end-to-end cluster: ${server:-<no server in it>} (LEASEHOLD_E2E_KUBECONFIG=$LEASEHOLD_E2E_KUBECONFIG)" >&2
elif [[ -n "${LEASEHOLD_KUBERNETES_TOOL:-}" ]]; then
  echo "test.sh: end-to-end cluster: one this script starts with LEASEHOLD_KUBERNETES_TOOL=$LEASEHOLD_KUBERNETES_TOOL (and stops at the end)" >&2
else
  echo "test.sh: no end-to-end cluster given (neither LEASEHOLD_E2E_KUBECONFIG nor LEASEHOLD_KUBERNETES_TOOL): the end-to-end tests (tests/e2e, tests/stores/kubernetes.rs) will fail; see docs/e2e.md" >&2
fi
# Each phase's wall time, printed as it ends (the figures in docs come from these).
phase_started=$SECONDS phase_name=""
phase() {
  [[ -z "$phase_name" ]] || echo "test.sh: phase ${phase_name}: $((SECONDS - phase_started)) s" >&2
  phase_started=$SECONDS phase_name="$1"
}
phase "setup"
scripts/setup-python.sh
scripts/setup-servers.sh
phase "examples and benches build"
# The example and the benchmark harness must keep compiling; the benchmarks
# themselves are a separate command (cargo bench --bench leasehold).
cargo build --workspace --examples --benches
# The end-to-end suite (tests/e2e) needs a disposable Kubernetes cluster:
# LEASEHOLD_E2E_KUBECONFIG and friends for one of yours (e.g. kind; README,
# "End-to-end tests"), or LEASEHOLD_KUBERNETES_TOOL, a test-cluster tool
# folder that this script starts one with (and stops at the end). Without
# either, the e2e tests fail saying so. The cluster starts in the background
# while the feature checks compile (its image's binary is the build above's:
# scripts/e2e-cluster.sh), and the run waits for it before the tests.
cluster_start=""
if [[ -z "${LEASEHOLD_E2E_KUBECONFIG:-}" && -n "${LEASEHOLD_KUBERNETES_TOOL:-}" ]]; then
  cluster_out="$(mktemp -d)"
  trap 'scripts/e2e-cluster.sh down; rm -rf "$cluster_out"' EXIT
  scripts/e2e-cluster.sh up >"$cluster_out/env" 2>"$cluster_out/log" &
  cluster_start=$!
fi
# Each crate builds warning-free on its own features (a workspace build
# unifies them, which would hide a crate that forgot one): the core without
# and with its schema derives, the database stores without a store and with
# each alone, each crate above them alone; the package's library with no
# feature and with each of its switches alone. The core is linted with its
# examples (library, many-locks, partitions: the core and the memory store
# alone), one compile rather than a check and a clippy.
phase "feature checks"
cargo clippy -q -p leasehold-core --lib --examples -- -D warnings
cargo clippy -q -p leasehold-core --features schema --lib -- -D warnings
cargo clippy -q -p leasehold-stores --lib -- -D warnings
for store in postgres redis spanner; do
  cargo clippy -q -p leasehold-stores --features "$store" --lib -- -D warnings
done
for crate in leasehold-kubernetes leasehold-runtime leasehold-sim leasehold-sidecar leasehold-operator leasehold-testkit; do
  cargo clippy -q -p "$crate" --lib -- -D warnings
done
cargo clippy -q --no-default-features --lib -- -D warnings
for features in postgres redis spanner kubernetes sidecar operator simulate; do
  cargo clippy -q --no-default-features --features "$features" --lib -- -D warnings
done
# The candidate binary (the `sidecar` image's: a pod's commands only) is
# linted, then built once for tests/processes/candidate.rs.
cargo clippy -q --no-default-features --features candidate --lib --bins -- -D warnings
LEASEHOLD_CANDIDATE_BINARY="$(scripts/candidate-binary.sh)"
export LEASEHOLD_CANDIDATE_BINARY
phase "examples run"
# The many-locks example checks its own outcome (every key one owner, higher tokens).
cargo run -q -p leasehold-core --example many-locks
# So does the partitions example (every partition one worker, shares as planned).
cargo run -q -p leasehold-core --example partitions
phase "emulator and cluster start"
# One emulator for the whole run (each test makes databases of its own);
# tests that must own an emulator (to restart it) start a private one.
if [[ -z "${SPANNER_EMULATOR_HOST:-}" ]]; then
  coproc EMULATOR { cargo run -q -p leasehold-testkit --example spanner-emulator; }
  read -r line <&"${EMULATOR[0]}" || { echo "the Spanner emulator did not start" >&2; exit 1; }
  export ${line?}
fi
if [[ -n "$cluster_start" ]]; then
  wait "$cluster_start" || {
    cat "$cluster_out/log" >&2
    echo "test.sh: the end-to-end cluster did not start (scripts/e2e-cluster.sh up, its output above)" >&2
    exit 1
  }
  eval "$(cat "$cluster_out/env")"
fi
# Two invocations, each parallel where that is safe:
# 1. every test that does not touch the shared cluster, beside the
#    end-to-end scenarios that disturb the whole cluster (the API server or
#    kubelet stopped, the operator scaled to 0, the CRD deleted, the chart
#    changed: `...::disruptive::...`), which run one at a time (group
#    cluster-disruptive), so no other test sees the cluster disturbed;
# 2. the other end-to-end scenarios and the Kubernetes store's tests, each in
#    a namespace of its own, two at a time (group cluster).
# The second runs even when the first failed; the script fails if either did.
disruptive='test(/^e2e::/) & test(/::disruptive::/)'
cluster="test(/^e2e::/) | test(/^stores::kubernetes::/)"
status=0
phase "nextest (build; every test off the cluster, beside the disruptive e2e scenarios one at a time)"
cargo nextest run --workspace --lib --bins --tests --no-fail-fast --profile "${NEXTEST_PROFILE:-default}" \
  -E "not ($cluster) | ($disruptive)" || status=$?
phase "nextest (the other e2e scenarios and the Kubernetes store, two at a time)"
cargo nextest run --test suite --no-fail-fast --profile "${NEXTEST_PROFILE:-default}" \
  -E "($cluster) & not ($disruptive)" || status=$?
phase ""
exit "$status"
