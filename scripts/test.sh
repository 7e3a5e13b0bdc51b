#!/usr/bin/env bash
# The whole test suite, on SQLite and PostgreSQL. PostgreSQL comes from DATABASE_URL when it is
# set; otherwise a throwaway server is started for this run and removed after it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${DATABASE_URL:-}" ]; then
  eval "$(scripts/postgres-throwaway.sh start)"
  trap 'scripts/postgres-throwaway.sh stop' EXIT
  echo "using a throwaway PostgreSQL: $DATABASE_URL"
else
  echo "using PostgreSQL from DATABASE_URL"
fi

cargo test --workspace --locked
