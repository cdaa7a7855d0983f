#!/usr/bin/env bash
# Installs the database servers the PostgreSQL and Redis tests start private
# instances of, and busybox (the end-to-end suite's stand-in app image), when
# the machine lacks them (Debian packages; needs root).
set -euo pipefail
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v busybox >/dev/null || missing+=(busybox)
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then
  missing+=(postgresql)
fi
if ((${#missing[@]})); then
  echo "installing ${missing[*]} for the store tests" >&2
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi
