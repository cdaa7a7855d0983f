#!/usr/bin/env bash
# Creates the venv the manifest checks run in (${LEASEHOLD_VENV:-.venv}) and
# installs scripts/requirements-checks.txt into it, once.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv="${LEASEHOLD_VENV:-.venv}"
stamp="$venv/.requirements-checks.txt"
if [[ -f "$stamp" ]] && cmp -s "$stamp" scripts/requirements-checks.txt; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements-checks.txt
cp scripts/requirements-checks.txt "$stamp"
