#!/usr/bin/env bash
# The disposable cluster of the end-to-end suite (tests/e2e).
#
#   scripts/e2e-cluster.sh up      starts a cluster and loads the leasehold image;
#                                  prints `export VAR=...` lines for the suite
#   scripts/e2e-cluster.sh image   rebuilds the image from the current tree, loads it and
#                                  restarts the operator (if installed) on it
#   scripts/e2e-cluster.sh down    stops the cluster (and the second one) and removes their files
#   scripts/e2e-cluster.sh east up|down
#                                  starts (prints its `export` lines) or stops only the
#                                  second, control-plane-only cluster "east" beside the
#                                  first: the two-cluster scenarios (tests/e2e/clusters.rs)
#                                  run its operator and candidates as host processes
#
# It starts the cluster with a Kubernetes test-cluster tool named by
# LEASEHOLD_KUBERNETES_TOOL: a folder holding start.sh DIR, stop.sh DIR --rm,
# component.sh DIR NAME stop|start|pause|resume and image.py NAME:TAG OUT.tar
# (a single-node cluster with a real kubelet and containerd). Users with a
# disposable cluster of their own (e.g. kind) skip this script and set the
# suite's variables themselves (README, "End-to-end tests").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tool="${LEASEHOLD_KUBERNETES_TOOL:?LEASEHOLD_KUBERNETES_TOOL names the test-cluster tool folder}"
dir="${LEASEHOLD_E2E_CLUSTER_DIR:-/tmp/leasehold-e2e-cluster}"
# The second cluster: its own etcd, CA and controllers, no node, API on 6444
# (the tool's README, "A second cluster beside it").
east_dir="${LEASEHOLD_E2E_EAST_DIR:-/tmp/leasehold-e2e-east}"
east_port=6444
# The README's walkthrough installs the chart with this image.
image="${LEASEHOLD_E2E_IMAGE:-leasehold:dev}"
# The stand-in app: busybox's httpd, which as PID 1 ignores SIGTERM like many real apps.
app_image="${LEASEHOLD_E2E_APP_IMAGE:-leasehold-e2e-app:busybox}"
target="${CARGO_TARGET_DIR:-target}"

# The binary's path inside the image, from the Dockerfile's ENTRYPOINT (its one owner):
# the last stage's, the full image this one stands in for (the candidate stage has the
# same path; two lines made a path with a newline in it).
entrypoint() {
  sed -n 's/^ENTRYPOINT \["\([^"]*\)".*/\1/p' Dockerfile | tail -n 1
}

load_image() {
  local binary="$dir/leasehold" path
  path="$(entrypoint)"
  [[ -n "$path" ]] || { echo "no ENTRYPOINT in the Dockerfile" >&2; exit 1; }
  command -v busybox >/dev/null || {
    echo "busybox (the stand-in app's image) is missing: scripts/setup-servers.sh installs it" >&2
    exit 1
  }
  # With the test suite in the same build, over the whole workspace, cargo
  # resolves features as the test builds do (dev-dependencies on: the crate
  # with `testing`, tokio with test-util), so this is the binary `cargo
  # nextest run --workspace` builds (and the suite it compiles), not a
  # second compile of the crate and of everything under tokio. Every build
  # of the binary lands at target/debug/leasehold whatever its features, so
  # the build and the copy hold the lock scripts/candidate-binary.sh holds
  # (scripts/test.sh starts the cluster while that builds the candidate).
  mkdir -p "$target/debug"
  {
    flock 9
    cargo build -q --workspace --bin leasehold --test suite --example fenced-workload >&2
    cp "$target/debug/leasehold" "$binary"
  } 9>"$target/debug/.leasehold-binary.lock"
  # The fenced workload (tests/e2e/fenced_workload.rs) runs as an app
  # container from this image, beside the entrypoint.
  python3 "$tool/image.py" "$image" "$dir/image.tar" --bin "$binary:$path" \
    --bin "$target/debug/examples/fenced-workload:$(dirname "$path")/fenced-workload" \
    --user 65532:65532 --entrypoint "$path" >&2
  # A container wrapped with `leasehold run` runs leasehold from the app's
  # image, which must provide its shared libraries (glibc, libm, libgcc_s;
  # docs/run.md), as a Debian-based app image does.
  local libs=()
  for lib in $(ldd "$binary" | grep -o '/[^ ]*\.so[^ ]*'); do libs+=(--add "$lib:$lib"); done
  python3 "$tool/image.py" "$app_image" "$dir/app.tar" --bin "$(command -v busybox):/bin/busybox" \
    "${libs[@]}" \
    --entrypoint '["/bin/busybox", "httpd", "-f", "-p", "8080"]' >&2
  for tar in image app; do
    ctr --address "$dir/containerd/containerd.sock" -n k8s.io images import "$dir/$tar.tar" >/dev/null
  done
}

east_up() {
  "$tool/stop.sh" "$east_dir" --rm >/dev/null 2>&1 || true
  "$tool/start.sh" "$east_dir" --no-node --api-port "$east_port" >&2
  echo "export LEASEHOLD_E2E_EAST_KUBECONFIG=$east_dir/kubeconfig"
  echo "export LEASEHOLD_E2E_EAST_COMPONENT=\"$tool/component.sh $east_dir\""
}

east_down() {
  "$tool/stop.sh" "$east_dir" --rm >&2
}

case "${1:-}" in
  up)

    "$tool/stop.sh" "$dir" --rm >/dev/null 2>&1 || true
    "$tool/start.sh" "$dir" >&2
    load_image
    # shellcheck disable=SC1091
    source "$dir/env"
    echo "export LEASEHOLD_E2E_KUBECONFIG=$dir/kubeconfig"
    echo "export LEASEHOLD_E2E_IMAGE=$image"
    echo "export LEASEHOLD_E2E_APP_IMAGE=$app_image"
    echo "export LEASEHOLD_E2E_HOST_IP=$KUBE_HOST_IP"
    echo "export LEASEHOLD_E2E_COMPONENT=\"$tool/component.sh $dir\""
    # client-go's leader election for the benchmark's comparison (cargo bench, kubernetes part).
    echo "export LEASEHOLD_E2E_KUBE_SCHEDULER=\"$("$tool/install.sh" | tail -n 1)/kube-multi kube-scheduler\""
    east_up

    ;;
  image)
    load_image
    # Running pods keep the image they started with: the tag is the same,
    # so only new pods run this tree. The operator's pods are not new in a
    # scenario: restart them, or the scenarios judge an earlier load's
    # operator (seen on a shared cluster: a change to the operator passed
    # unrun). The suite's kubectl (scripts/setup-python.sh).
    kubectl=(.venv/bin/kubectl --kubeconfig "${LEASEHOLD_E2E_KUBECONFIG:-$dir/kubeconfig}" -n leasehold-system)
    if "${kubectl[@]}" get deployment/leasehold-operator >/dev/null 2>&1; then
      "${kubectl[@]}" rollout restart deployment/leasehold-operator >&2
      "${kubectl[@]}" rollout status deployment/leasehold-operator --timeout=180s >&2
    fi
    ;;
  down)
    east_down
    "$tool/stop.sh" "$dir" --rm >&2
    ;;
  east)
    case "${2:-}" in
      up) east_up ;;
      down) east_down ;;
      *) echo "usage: $0 east up|down" >&2; exit 2 ;;
    esac
    ;;
  *) echo "usage: $0 up|image|down|east up|down" >&2; exit 2 ;;
esac
