#!/usr/bin/env bash
# Builds the candidate `leasehold` (Cargo feature `candidate`: only what a
# candidate pod runs, as the Dockerfile's `sidecar` image) in the debug
# profile and prints its path, for tests/processes/candidate.rs:
#   export LEASEHOLD_CANDIDATE_BINARY=$(scripts/candidate-binary.sh)
# Linked statically, as the image's, so it builds for the host as a
# `--target` of its own (target/<host>/debug/leasehold); it is linked (not
# copied) to target/<host>/debug/candidate/leasehold, which no other build
# touches.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The build and the link hold the lock scripts/e2e-cluster.sh holds for the
# full build and its copy, so neither takes the other's binary.
debug="${CARGO_TARGET_DIR:-target}/debug"
mkdir -p "$debug"
{
  flock 9
  # Linked statically, as the image's (Dockerfile: glibc's resolver and
  # files are built into it since 2.34, so the image needs no libc).
  # `--target` keeps the flag off build scripts and proc-macros.
  host="$(rustc -vV | sed -n 's/^host: //p')"
  executable="$(RUSTFLAGS="-C target-feature=+crt-static" cargo build -q --locked --target "$host" \
    --no-default-features --features candidate --bin leasehold --message-format=json \
    | grep -o '"executable":"[^"]*"' | cut -d'"' -f4)"
  [[ -x "$executable" ]] || { echo "candidate-binary.sh: cargo named no executable" >&2; exit 1; }
  candidate="$(dirname "$executable")/candidate/leasehold"
  mkdir -p "$(dirname "$candidate")"
  ln -f "$executable" "$candidate"
} 9>"$debug/.leasehold-binary.lock"
echo "$candidate"
