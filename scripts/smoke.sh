#!/usr/bin/env bash
# "Try it in five minutes" (README) as a script: the devnet, `payrecon serve` on the example
# devnet config and SQLite, a top-up paid from the devnet wallet, confirmed, credited, and
# the pages served. scripts/test.sh runs it after the test suite; it fails on any step.
set -euo pipefail
cd "$(dirname "$0")/.."

eval "$(scripts/devnet.sh up)"
work=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sed -e "s|^database_url = .*|database_url = \"sqlite://$work/devnet.db\"|" \
    -e "s|^listen = .*|listen = \"127.0.0.1:$port\"|" \
    -e "s|\.\./fixtures|$PWD/fixtures|" examples/devnet.toml > "$work/devnet.toml"
# PAYRECON_BIN: a payrecon binary already built from this checkout (scripts/test.sh passes the
# one `cargo test` just built, which `cargo build` would build again for its other features).
bin=${PAYRECON_BIN:-}
if [ -z "$bin" ]; then
  cargo build --quiet --locked
  bin=target/debug/payrecon
fi
payrecon() { "$bin" --config "$work/devnet.toml" "$@"; }
json() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }
base="http://127.0.0.1:$port"

payrecon init
shop=$(payrecon token create --name shop-backend --role shop --json | json '["token"]')
operator=$(payrecon token create --name ops --role operator --json | json '["token"]')
finance=$(payrecon token create --name finance --role finance --json | json '["token"]')
# Started directly, not through the payrecon function: `$!` after `function &` is the
# subshell running the function, and killing it left the server running.
"$bin" --config "$work/devnet.toml" serve > "$work/serve.log" 2>&1 &
serve=$!
stop_serve() { kill "$serve" 2>/dev/null || true; wait "$serve" 2>/dev/null || true; }
trap 'stop_serve; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do curl -fs "$base/ready" >/dev/null && break; sleep 0.1; done

call() { curl -fsS -H "Authorization: Bearer $1" -H 'content-type: application/json' "${@:2}"; }
# has PATTERN COMMAND...: COMMAND's whole answer contains PATTERN. Read whole first: in
# `curl | grep -q` grep stops reading at its first match, curl then fails writing the rest
# (exit 23) and pipefail fails the step; it did once in CI.
has() {
  local answer; answer=$("${@:2}")
  grep -q -- "$1" <<<"$answer" || { echo "smoke: ${!#} does not show '$1'" >&2; return 1; }
}
call "$shop" -X POST "$base/v1/topups" -d '{"reference":"smoke-1","account_id":"alice","amount_usd":"100"}' >/dev/null
payment=$(call "$shop" -X POST "$base/v1/payments" -d '{"order":"smoke-1","method":"ltc"}')
intent=$(echo "$payment" | json '["id"]')
address=$(echo "$payment" | json '["pay_to"]')
amount=$(echo "$payment" | json '["amount_decimal"]')
checkout="$base$(echo "$payment" | json '["checkout_path"]')"
has "Zahlen Sie $amount LTC" curl -fsS -H 'Accept-Language: de' "$checkout"
has "$address" curl -fsS "$checkout?lang=id"
echo "smoke: paying $amount LTC to $address for $intent"
scripts/devnet.sh litecoin-cli -rpcwallet=miner sendtoaddress "$address" "$amount" >/dev/null
scripts/devnet.sh mine 2

status=""
for _ in $(seq 1 300); do
  status=$(call "$shop" "$base/v1/payments/$intent" | json '["status"]')
  [ "$status" = settled ] && break
  sleep 0.2
done
[ "$status" = settled ] || { cat "$work/serve.log" >&2; echo "smoke: the payment did not settle ($status)" >&2; exit 1; }
balance=$(call "$shop" "$base/v1/balances/alice" | json '["available_usd"]')
[ "$balance" = "100.00" ] || { echo "smoke: balance $balance, expected 100.00" >&2; exit 1; }
has "Paid. Thank you!" curl -fsS "$checkout"
has "Stuck payments" curl -fsS "$base/ui/stuck"
has "Reconciliation report" curl -fsS "$base/ui/reconcile"
call "$operator" "$base/v1/stuck" >/dev/null
today=$(date -u +%F); tomorrow=$(date -u -d tomorrow +%F)
has '^ltc,LTC,1,1,0,0,1.17647059,1.17647059,' call "$finance" "$base/v1/reports/reconcile?from=$today&to=$tomorrow&format=csv&section=summary"
has 'payrecon_intents{state="settled"} 1' curl -fsS "$base/metrics"
echo "smoke: top-up settled, balance $balance USD, checkout page, pages and reports served"
stop_serve
if kill -0 "$serve" 2>/dev/null; then echo "smoke: payrecon serve is still running" >&2; exit 1; fi
echo "smoke: payrecon serve stopped"
