#!/usr/bin/env bash
# The whole job on the local devnet, to look at: Litecoin regtest behind ElectrumX and anvil
# (started if they are not running), `payrecon serve` on SQLite, a rental order and a top-up,
# one paid in LTC and one in USDT on anvil from the chains' own wallets, and the three pages to
# open. It then prints each payment's state as it changes until Ctrl-C, and stops what it
# started.
#
#   scripts/demo.sh            interactive, HTTP on 127.0.0.1:8080
#   scripts/demo.sh --check    what scripts/test.sh runs: on a free port, exits 0 once both
#                              payments settled and every page and report answered, 1 on any
#                              failed step
#
# PAYRECON_BIN: a payrecon binary built from this checkout (else `cargo build --release`), or
# an installed one. PAYRECON_RUN_AS: a user to run it as (the package test runs the packaged
# binary as the payrecon user); its files then live under DEMO_WORK, a directory that user owns.
set -euo pipefail
cd "$(dirname "$0")/.."

check=false
[ "${1:-}" = "--check" ] && check=true

json() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }
say() { printf '%s\n' "demo: $*"; }
fail() { say "$*" >&2; exit 1; }

# The devnet: left running if it was, started (and stopped at the end) if not.
started_devnet=false
if ! curl -fs -m 2 -H 'content-type: application/json' -d '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}' http://127.0.0.1:8545 >/dev/null; then
  started_devnet=true
fi
eval "$(scripts/devnet.sh up)"
eth_rpc=${PAYRECON_TEST_ETH_RPC:-http://127.0.0.1:8545}
electrum=${PAYRECON_TEST_ELECTRUM%%,*}
electrum=${electrum:-tcp://127.0.0.1:50001}

work=$(mktemp -d "${DEMO_WORK:-${TMPDIR:-/tmp}}/payrecon-demo.XXXXXX")
run_as=()
if [ -n "${PAYRECON_RUN_AS:-}" ]; then
  chown "$PAYRECON_RUN_AS:" "$work"
  # setpriv execs payrecon in place, so `$!` below is payrecon itself and gets the SIGTERM.
  run_as=(setpriv --reuid="$PAYRECON_RUN_AS" --regid="$PAYRECON_RUN_AS" --init-groups)
fi
serve=""
finish() {
  if [ -n "$serve" ]; then kill "$serve" 2>/dev/null || true; wait "$serve" 2>/dev/null || true; fi
  if $started_devnet; then scripts/devnet.sh down >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap finish EXIT
trap 'echo; say "stopping"; exit 0' INT TERM

eth() {
  curl -fsS -H 'content-type: application/json' \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$1\",\"params\":$2}" "$eth_rpc" | json '["result"]'
}
wallet=$(eth eth_accounts '[]' | python3 -c 'import ast, sys; print(ast.literal_eval(sys.stdin.read())[0])')

# USDT on anvil: the tests' 6-decimal ERC-20 (fixtures/ethereum), a million minted to the wallet.
bytecode=$(tr -d '\n' < fixtures/ethereum/TestToken.bin)
supply=$(printf '%064x' 1000000000000)
deploy=$(eth eth_sendTransaction "[{\"from\":\"$wallet\",\"data\":\"0x$bytecode$supply\",\"gas\":\"0x200000\"}]")
eth anvil_mine '["0x1"]' >/dev/null
usdt=$(eth eth_getTransactionReceipt "[\"$deploy\"]" | python3 -c 'import ast, sys; print(ast.literal_eval(sys.stdin.read())["contractAddress"])')

port=8080
$check && port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sed -e "s|^database_url = .*|database_url = \"sqlite://$work/demo.db\"|" \
    -e "s|^listen = .*|listen = \"127.0.0.1:$port\"|" \
    -e "s|^enabled_methods = .*|enabled_methods = [\"ltc\", \"eth\", \"usdt-erc20\"]|" \
    -e "s|^electrum_url = .*|electrum_url = \"$electrum\"|" \
    -e "s|^rpc_url = .*|rpc_url = \"$eth_rpc\"\nusdt_contract = \"$usdt\"|" \
    -e "s|\.\./fixtures|$PWD/fixtures|" examples/devnet.toml > "$work/devnet.toml"

bin=${PAYRECON_BIN:-}
if [ -z "$bin" ]; then
  say "building payrecon (release; the first time takes a while)"
  cargo build --quiet --release --locked
  bin=target/release/payrecon
fi
payrecon() { "${run_as[@]}" "$bin" --config "$work/devnet.toml" "$@"; }
base="http://127.0.0.1:$port"

payrecon init >/dev/null
shop=$(payrecon token create --name shop-backend --role shop --json | json '["token"]')
operator=$(payrecon token create --name ops --role operator --json | json '["token"]')
finance=$(payrecon token create --name finance --role finance --json | json '["token"]')
# Started directly, so that `$!` is the server and not a subshell running a function.
"${run_as[@]}" "$bin" --config "$work/devnet.toml" serve > "$work/serve.log" 2>&1 &
serve=$!
for _ in $(seq 1 100); do curl -fs "$base/ready" >/dev/null && break; sleep 0.1; done
curl -fs "$base/ready" >/dev/null || { cat "$work/serve.log" >&2; fail "payrecon serve did not come up"; }

call() { curl -fsS -H "Authorization: Bearer $1" -H 'content-type: application/json' "${@:2}"; }
# has PATTERN COMMAND...: COMMAND's whole answer contains PATTERN (read whole first: `curl |
# grep -q` can fail curl with a broken pipe).
has() {
  local answer; answer=$("${@:2}")
  grep -q -- "$1" <<<"$answer" || fail "${!#} does not show '$1'"
}

# The shop: a rental paid in USDT on Ethereum, a top-up paid in LTC.
call "$shop" -X POST "$base/v1/orders" -d '{"reference":"demo-rental","account_id":"alice","gpu_model":"H100","duration_days":7,"lots":1,"total_usd":"420.00"}' >/dev/null
call "$shop" -X POST "$base/v1/topups" -d '{"reference":"demo-topup","account_id":"alice","amount_usd":"100"}' >/dev/null
rental=$(call "$shop" -X POST "$base/v1/payments" -d '{"order":"demo-rental","method":"usdt-erc20"}')
topup=$(call "$shop" -X POST "$base/v1/payments" -d '{"order":"demo-topup","method":"ltc"}')
rental_id=$(json '["id"]' <<<"$rental")
topup_id=$(json '["id"]' <<<"$topup")

say "paying $(json '["amount_decimal"]' <<<"$topup") LTC for the top-up, $(json '["amount_decimal"]' <<<"$rental") USDT for the rental"
scripts/devnet.sh litecoin-cli -rpcwallet=miner sendtoaddress "$(json '["pay_to"]' <<<"$topup")" "$(json '["amount_decimal"]' <<<"$topup")" >/dev/null
transfer=$(python3 -c '
import sys
from decimal import Decimal
to, amount = sys.argv[1], Decimal(sys.argv[2])
print("0xa9059cbb" + to.lower().removeprefix("0x").rjust(64, "0") + format(int(amount * 10**6), "064x"))
' "$(json '["pay_to"]' <<<"$rental")" "$(json '["amount_decimal"]' <<<"$rental")")
eth eth_sendTransaction "[{\"from\":\"$wallet\",\"to\":\"$usdt\",\"data\":\"$transfer\",\"gas\":\"0x100000\"}]" >/dev/null
scripts/devnet.sh mine 2 2>/dev/null
eth anvil_mine '["0x3"]' >/dev/null

checkout="$base$(json '["checkout_path"]' <<<"$topup")"
pages=("$checkout" "$base/ui/stuck#token=$operator" "$base/ui/reconcile#token=$finance&month=$(date -u +%Y-%m)")
cat <<EOF

  The customer's checkout page (the LTC top-up): ${pages[0]}
  The operators' page (stuck payments):         ${pages[1]}
  The finance page (reconciliation and books):  ${pages[2]}
  API: $base/openapi.json   metrics: $base/metrics

EOF

# Each payment's state as it changes.
declare -A last=()
settled() { [ "${last[$rental_id]:-}" = settled ] && [ "${last[$topup_id]:-}" = settled ]; }
# Interactive: until Ctrl-C. --check: until both settled, for five minutes at most.
round=0
while true; do
  round=$((round + 1))
  for id in "$rental_id" "$topup_id"; do
    state=$(call "$shop" "$base/v1/payments/$id" | json '["status"]')
    if [ "$state" != "${last[$id]:-}" ]; then
      say "$(date -u +%T) $id $state"
      last[$id]=$state
    fi
  done
  if $check && { settled || (( round >= 600 )); }; then break; fi
  # Keep both chains moving so that confirmations arrive as they would.
  if (( round % 10 == 0 )) && ! settled; then scripts/devnet.sh mine 1 2>/dev/null; eth anvil_mine '["0x1"]' >/dev/null; fi
  sleep 0.5
done

$check || exit 0
settled || { cat "$work/serve.log" >&2; fail "the payments did not settle: ${last[*]}"; }
for page in "${pages[@]}"; do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "${page%%#*}")" = 200 ] || fail "$page did not answer 200"
done
has "Zahlen Sie\|Paid. Thank you!\|Bezahlt" curl -fsS -H 'Accept-Language: de' "$checkout"
has "Paid. Thank you!" curl -fsS "$checkout"
[ "$(call "$shop" "$base/v1/balances/alice" | json '["available_usd"]')" = "100.00" ] || fail "alice's balance is not 100.00"
call "$shop" "$base/v1/orders/demo-rental" | json '["order"]["status"]' | grep -qi settled || fail "the rental is not settled"
call "$operator" "$base/v1/stuck" >/dev/null
has '^ltc,LTC,1,1,0,0,' call "$finance" "$base/v1/reports/reconcile?from=$(date -u +%F)&to=$(date -u -d tomorrow +%F)&format=csv&section=summary"
has 'payrecon_intents{state="settled"} 2' curl -fsS "$base/metrics"
kill "$serve"; wait "$serve" || fail "payrecon serve did not exit 0 on SIGTERM"
serve=""
say "both payments settled; the three pages, the reports and /metrics answered; payrecon serve stopped"
