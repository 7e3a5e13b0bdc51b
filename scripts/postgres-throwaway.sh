#!/usr/bin/env bash
# A throwaway PostgreSQL for the tests, on 127.0.0.1, in a temporary directory.
#   scripts/postgres-throwaway.sh start   prints `export DATABASE_URL=…; export TEST_PG_DIR=…`
#   scripts/postgres-throwaway.sh stop    stops the server started from $TEST_PG_DIR and removes it
# Installs Debian's postgresql package if no server binaries are present. fsync is off: for
# tests only, never for benchmark figures. initdb refuses root, so as root it runs as `postgres`.
set -euo pipefail

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

case "${1:-}" in
start)
  PGBIN=$(pg_bin || true)
  if [ -z "$PGBIN" ]; then
    echo "installing PostgreSQL (Debian package postgresql)" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2
    PGBIN=$(pg_bin)
  fi
  port=${PG_PORT:-55432}
  while (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  dir=$(mktemp -d /tmp/payrecon-pg.XXXXXX)
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  as_owner "$PGBIN/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
  as_owner "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null
  echo "export DATABASE_URL=postgres://postgres@127.0.0.1:$port/postgres; export TEST_PG_DIR=$dir"
  ;;
stop)
  dir=${TEST_PG_DIR:?TEST_PG_DIR is not set}
  as_owner "$(pg_bin)/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || true
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start|stop" >&2
  exit 2
  ;;
esac
