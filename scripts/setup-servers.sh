#!/usr/bin/env bash
# Installs the database servers the PostgreSQL and Redis tests start private
# instances of, busybox (the end-to-end suite's stand-in app image) and
# Prometheus (promtool tests the alerting rules; the end-to-end suite runs
# the server), when the machine lacks them (Debian packages; needs root).
set -euo pipefail
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v busybox >/dev/null || missing+=(busybox)
command -v promtool >/dev/null || missing+=(prometheus)
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then
  missing+=(postgresql)
fi
if ((${#missing[@]})); then
  echo "installing ${missing[*]} for the tests" >&2
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi
