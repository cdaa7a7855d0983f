#!/usr/bin/env bash
# Type-checks Grafana dashboard JSON files against Grafana's own dashboard
# types (@grafana/schema, the npm package Grafana publishes from its schema)
# with the TypeScript compiler: a field Grafana does not know, or a value of
# the wrong type, fails with the compiler's message naming it. Installs the
# pinned packages of scripts/grafana-schema (npm ci) when missing.
#
#   scripts/check-dashboard.sh DASHBOARD.json...
set -euo pipefail
((${#@})) || { echo "usage: $0 DASHBOARD.json..." >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/grafana-schema" && pwd)"
if [[ ! -x "$here/node_modules/.bin/tsc" ]]; then
  command -v npm >/dev/null || { echo "check-dashboard: npm is missing (install Node.js)" >&2; exit 1; }
  npm ci --prefix "$here" --no-audit --no-fund --silent >&2
fi
# Inside the package folder, so that '@grafana/schema' resolves.
work="$(mktemp -d "$here/.check-XXXXXX")"
trap 'rm -rf "$work"' EXIT
for dashboard in "$@"; do
  name="$(basename "$dashboard" .json | tr -c 'A-Za-z0-9_\n' _)"
  {
    echo "import type { Dashboard } from '@grafana/schema';"
    echo "// Dashboard JSON holds an enum's string value."
    echo 'type Json<T> = T extends string ? `${T}` : T extends (infer U)[] ? Json<U>[] : T extends object ? { [K in keyof T]: Json<T[K]> } : T;'
    printf 'export const dashboard: Json<Dashboard> = '
    cat "$dashboard"
    echo ";"
  } > "$work/$name.ts"
done
cd "$work"
if ! "$here/node_modules/.bin/tsc" --noEmit --strict --module esnext --moduleResolution bundler --skipLibCheck ./*.ts; then
  echo "check-dashboard: not a Grafana dashboard (a line number above is the JSON's line + 3)" >&2
  exit 1
fi
