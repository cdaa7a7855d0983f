#!/usr/bin/env bash
# Builds the candidate `leasehold` (Cargo feature `candidate`: only what a
# candidate pod runs, as the Dockerfile's `sidecar` image) in the debug
# profile and prints its path, for tests/processes/candidate.rs:
#   export LEASEHOLD_CANDIDATE_BINARY=$(scripts/candidate-binary.sh)
# Cargo puts every build of the binary at target/debug/leasehold, whichever
# features it had: the candidate one is linked (not copied) to
# target/debug/candidate/leasehold, which the full build leaves alone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The build and the link hold the lock scripts/e2e-cluster.sh holds for the
# full build and its copy, so neither takes the other's binary.
debug="${CARGO_TARGET_DIR:-target}/debug"
mkdir -p "$debug"
{
  flock 9
  executable="$(cargo build -q --locked --no-default-features --features candidate --bin leasehold --message-format=json \
    | grep -o '"executable":"[^"]*"' | cut -d'"' -f4)"
  [[ -x "$executable" ]] || { echo "candidate-binary.sh: cargo named no executable" >&2; exit 1; }
  candidate="$(dirname "$executable")/candidate/leasehold"
  mkdir -p "$(dirname "$candidate")"
  ln -f "$executable" "$candidate"
} 9>"$debug/.leasehold-binary.lock"
echo "$candidate"
