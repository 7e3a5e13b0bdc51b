#!/usr/bin/env bash
# Local chain nodes for the tests and for trying payrecon, all on loopback and installed on first
# use: Litecoin Core in regtest behind a real ElectrumX server (Debian's litecoind, PyPI's e-x),
# and anvil for Ethereum (npm's @foundry-rs/anvil-linux-amd64). Everything lives under
# $DEVNET_DIR.
#
#   scripts/devnet.sh up                      start (fresh chains) or reuse; prints `export` lines
#   scripts/devnet.sh down                    stop everything started by `up`
#   scripts/devnet.sh litecoin-cli ARGS…      the node's litecoin-cli (wallets: -rpcwallet=miner, and
#                                             -rpcwallet=mweb, which holds MWEB coins only)
#   scripts/devnet.sh mine [N]                mine N Litecoin blocks (default 1)
#   scripts/devnet.sh node-restart            stop litecoind and start it again (same chain)
#   scripts/devnet.sh electrumx-start DIR PORT   one more ElectrumX over the same node
#   scripts/devnet.sh electrumx-stop DIR         stop that one (its index stays in DIR)
#
# DEVNET_LANES=N (default 1) makes `up` start N independent Litecoin chains, each a litecoind
# with its own ElectrumX: lane 0 on the ports below, lane i on each port + 100*i, under
# $DEVNET_DIR/lane<i>. The tests take one lane per test, so tests that mine, reorg or restart
# the node run side by side without seeing each other's blocks. DEVNET_LANE=i points
# litecoin-cli, mine, node-restart and electrumx-start at lane i.
#
# Pitfalls handled here: the real litecoind binary is /usr/lib/litecoin/litecoind (the /usr/bin
# wrapper writes ~/.litecoin); -conf must be absolute; ElectrumX needs DB_ENGINE=leveldb with
# plyvel, ALLOW_ROOT as root, fast polling and no per-session cost limits for tests, and opens
# its port only once it has caught up with the node.
#
# ElectrumX 2.0 pads its answers against traffic analysis and holds a small one up to a second,
# waiting for more to send with it (PaddedRSTransport): every round trip of a client that asks
# one thing at a time costs that second. The lanes' servers wait DEVNET_ELECTRUM_HOLD_SECONDS
# (0.02) instead, so a test's dozens of round trips stay quick; `electrumx-start` keeps the
# server's own second, which a test runs a watcher against.
set -euo pipefail

DEVNET_DIR=${DEVNET_DIR:-/tmp/payrecon-devnet}
DEVNET_LANES=${DEVNET_LANES:-1}
BASE_RPC_PORT=${LTC_RPC_PORT:-19443}
BASE_P2P_PORT=${LTC_P2P_PORT:-19444}
BASE_ELECTRUM_PORT=${ELECTRUM_PORT:-50001}
ANVIL_PORT=${ANVIL_PORT:-8545}
ANVIL_VERSION=1.7.1
VENV=$DEVNET_DIR/venv-electrumx
NPM_DIR=$DEVNET_DIR/npm
ANVIL=$NPM_DIR/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil
SCRIPT=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

log() { echo "devnet: $*" >&2; }

# use_lane I: the Litecoin chain the commands below act on.
use_lane() {
  LANE=$1
  LANE_DIR=$DEVNET_DIR
  [ "$LANE" = 0 ] || LANE_DIR=$DEVNET_DIR/lane$LANE
  LTC_DIR=$LANE_DIR/ltc
  LTC_RPC_PORT=$((BASE_RPC_PORT + 100 * LANE))
  LTC_P2P_PORT=$((BASE_P2P_PORT + 100 * LANE))
  ELECTRUM_PORT=$((BASE_ELECTRUM_PORT + 100 * LANE))
}
use_lane "${DEVNET_LANE:-0}"

cli() { litecoin-cli -conf="$LTC_DIR/litecoin.conf" -datadir="$LTC_DIR/data" "$@"; }

install() {
  if ! command -v litecoind >/dev/null; then
    log "installing litecoind (Debian package)"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq litecoind >&2
  fi
  if [ ! -x "$VENV/bin/electrumx_server" ]; then
    log "installing ElectrumX (PyPI e-x 2.0.0 with plyvel)"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q e-x==2.0.0 plyvel==1.5.1 >&2
  fi
  if [ ! -x "$ANVIL" ]; then
    log "installing anvil $ANVIL_VERSION (npm)"
    mkdir -p "$NPM_DIR"
    [ -f "$NPM_DIR/package.json" ] || echo '{"name":"payrecon-devnet","private":true}' > "$NPM_DIR/package.json"
    (cd "$NPM_DIR" && npm install --no-audit --no-fund --silent "@foundry-rs/anvil-linux-amd64@$ANVIL_VERSION" >&2)
  fi
}

# Blocks are mined only when asked (anvil_mine), so tests decide what each block holds.
start_anvil() {
  mkdir -p "$DEVNET_DIR/anvil"
  "$ANVIL" --host 127.0.0.1 --port "$ANVIL_PORT" --chain-id 31337 --no-mining \
    --accounts 5 --balance 1000000 > "$DEVNET_DIR/anvil/anvil.log" 2>&1 &
  echo $! > "$DEVNET_DIR/anvil/anvil.pid"
  for _ in $(seq 1 100); do
    if python3 - "$ANVIL_PORT" <<'PY' 2>/dev/null
import json, sys, urllib.request
body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}", body, {"Content-Type": "application/json"})
json.load(urllib.request.urlopen(request, timeout=1))["result"]
PY
    then log "anvil up on 127.0.0.1:$ANVIL_PORT"; return 0; fi
    sleep 0.1
  done
  cat "$DEVNET_DIR/anvil/anvil.log" >&2
  log "anvil did not start"
  exit 1
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Starts litecoind on the configuration in $LTC_DIR and waits for its RPC.
run_litecoind() {
  local daemon=/usr/lib/litecoin/litecoind
  [ -x "$daemon" ] || daemon=litecoind
  "$daemon" -conf="$LTC_DIR/litecoin.conf" -datadir="$LTC_DIR/data" -pid="$LTC_DIR/litecoind.pid"
  for _ in $(seq 1 150); do cli getblockcount >/dev/null 2>&1 && break; sleep 0.2; done
  cli getblockcount >/dev/null
}

stop_litecoind() {
  if alive "$LTC_DIR/litecoind.pid"; then
    local pid
    pid=$(cat "$LTC_DIR/litecoind.pid")
    cli stop >/dev/null 2>&1 || kill "$pid"
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      log "litecoind (lane $LANE) did not stop within 60 s"
      exit 1
    fi
  fi
}

start_litecoind() {
  rm -rf "$LTC_DIR"
  mkdir -p "$LTC_DIR/data"
  cat > "$LTC_DIR/litecoin.conf" <<CONF
regtest=1
server=1
daemon=1
txindex=1
fallbackfee=0.0001
walletrbf=1
# Litecoin Core refuses BIP125 replacements unless told (tests replace transactions).
mempoolreplacement=1
# payrecon's full-node scanner hears block and transaction announcements as a P2P peer on
# loopback; noban lets the node announce transactions to it at once.
listen=1
# No Tor onion service. Its listener is bound all the same (Litecoin Core 0.21 binds the onion
# target even with listenonion=0), at 127.0.0.1:19444 unless a bind says otherwise: that is
# lane 0's own P2P port, so whenever another lane's node started first, lane 0's node could
# not start. Each lane names its own onion port below.
listenonion=0
discover=0
dnsseed=0
printtoconsole=0
[regtest]
rpcuser=user
rpcpassword=pass
rpcbind=127.0.0.1
rpcallowip=127.0.0.1
rpcport=$LTC_RPC_PORT
# On stop the node waits for idle keep-alive RPC connections (ElectrumX's, the watchers') up to
# this timeout, 30 s by default: node-restart under load then outlasted its wait.
rpcservertimeout=5
port=$LTC_P2P_PORT
bind=127.0.0.1
bind=127.0.0.1:$((LTC_P2P_PORT + 1))=onion
whitelist=noban@127.0.0.1
CONF
  run_litecoind
  cli -named createwallet wallet_name=miner >/dev/null
  activate_mweb
  log "litecoind regtest (lane $LANE) up at height $(cli getblockcount), MWEB active"
}

# Brings the fresh chain past Litecoin's MWEB activation (height 432), as mainnet has been since
# May 2022, so every block from there on ends with a HogEx transaction. Block 432 can only be
# mined with a peg-in beside it (without one, `bad-txns-vin-empty`). The peg-in comes from the
# `mweb` wallet, which sends its whole canonical balance into MWEB: it then holds MWEB coins
# only, the customer who pays from a private balance, while the miner wallet, which every other
# test pays from, never holds an MWEB coin (Litecoin Core would spend one as a peg-out).
activate_mweb() {
  local mine_to
  mine_to=$(cli -rpcwallet=miner getnewaddress '' bech32)
  cli -named createwallet wallet_name=mweb >/dev/null
  # Coinbase outputs mature after 100 blocks.
  cli -rpcwallet=miner generatetoaddress 101 "$mine_to" >/dev/null
  cli -rpcwallet=miner sendtoaddress "$(cli -rpcwallet=mweb getnewaddress '' bech32)" 25 >/dev/null
  cli -rpcwallet=miner generatetoaddress $((431 - 101)) "$mine_to" >/dev/null
  cli -rpcwallet=mweb -named sendtoaddress address="$(cli -rpcwallet=mweb getnewaddress '' mweb)" \
    amount=25 subtractfeefromamount=true >/dev/null
  cli -rpcwallet=miner generatetoaddress 2 "$mine_to" >/dev/null
}

# electrumx_start DIR PORT [HOLD]: ElectrumX over the node, listening on 127.0.0.1:PORT, holding
# a small answer HOLD seconds at most (default: the server's own second).
electrumx_start() {
  local dir=$1 port=$2 hold=${3:-}
  local server=("$VENV/bin/electrumx_server")
  if [ -n "$hold" ]; then
    server=("$VENV/bin/python3" -c "import sys
from electrumx.server.transport import PaddedRSTransport
PaddedRSTransport.WAIT_FOR_BUFFER_GROWTH_SECONDS = float(sys.argv[1])
from electrumx.cli.electrumx_server import main
sys.exit(main())" "$hold")
  fi
  mkdir -p "$dir/db"
  env -i PATH="$PATH" HOME="$HOME" \
    COIN=Litecoin NET=regtest \
    DAEMON_URL="http://user:pass@127.0.0.1:$LTC_RPC_PORT/" \
    DB_DIRECTORY="$dir/db" DB_ENGINE=leveldb \
    SERVICES="tcp://127.0.0.1:$port" \
    PEER_DISCOVERY=off PEER_ANNOUNCE= \
    LOG_LEVEL=info CACHE_MB=100 \
    DAEMON_POLL_INTERVAL_BLOCKS=100 DAEMON_POLL_INTERVAL_MEMPOOL=100 \
    COST_SOFT_LIMIT=0 COST_HARD_LIMIT=0 REQUEST_SLEEP=0 INITIAL_CONCURRENT=1000 \
    MAX_SEND=10000000 \
    ALLOW_ROOT="$([ "$(id -u)" = 0 ] && echo 1)" \
    "${server[@]}" >> "$dir/electrumx.log" 2>&1 &
  echo $! > "$dir/electrumx.pid"
  for _ in $(seq 1 300); do
    alive "$dir/electrumx.pid" || { tail -30 "$dir/electrumx.log" >&2; log "ElectrumX died"; exit 1; }
    if python3 - "$port" <<'PY' 2>/dev/null
import json, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"server.version","params":["probe","1.4"]}\n')
json.loads(s.makefile().readline())["result"]
PY
    then log "ElectrumX up on 127.0.0.1:$port"; return 0; fi
    sleep 0.2
  done
  tail -30 "$dir/electrumx.log" >&2
  log "ElectrumX did not open its port"
  exit 1
}

electrumx_stop() {
  local dir=$1
  if alive "$dir/electrumx.pid"; then
    local pid
    pid=$(cat "$dir/electrumx.pid")
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/electrumx.pid"
}

# The lanes' endpoints, comma-separated in lane order (the tests' pool of chains).
print_env() {
  local rpc=() p2p=() electrum=()
  for lane in $(seq 0 $((DEVNET_LANES - 1))); do
    use_lane "$lane"
    rpc+=("http://user:pass@127.0.0.1:$LTC_RPC_PORT")
    p2p+=("127.0.0.1:$LTC_P2P_PORT")
    electrum+=("tcp://127.0.0.1:$ELECTRUM_PORT")
  done
  local IFS=,
  echo "export PAYRECON_TEST_LTC_RPC=${rpc[*]}"
  echo "export PAYRECON_TEST_LTC_P2P=${p2p[*]}"
  echo "export PAYRECON_TEST_ELECTRUM=${electrum[*]}"
  echo "export PAYRECON_TEST_ETH_RPC=http://127.0.0.1:$ANVIL_PORT"
  echo "export PAYRECON_TEST_DEVNET=$SCRIPT"
  # Commands run from a test (node-restart, electrumx-start) find the lanes through these.
  echo "export DEVNET_DIR=$DEVNET_DIR LTC_RPC_PORT=$BASE_RPC_PORT LTC_P2P_PORT=$BASE_P2P_PORT ELECTRUM_PORT=$BASE_ELECTRUM_PORT"
}

# lane_up: this lane's node and ElectrumX, reused when both run, else started on a fresh chain.
lane_up() {
  if alive "$LTC_DIR/litecoind.pid" && alive "$LANE_DIR/electrumx/electrumx.pid"; then
    log "lane $LANE already running"
    return
  fi
  electrumx_stop "$LANE_DIR/electrumx"
  stop_litecoind
  mkdir -p "$LANE_DIR"
  start_litecoind
  rm -rf "$LANE_DIR/electrumx"
  electrumx_start "$LANE_DIR/electrumx" "$ELECTRUM_PORT" "${DEVNET_ELECTRUM_HOLD_SECONDS:-0.02}"
}

# Every lane ever started under $DEVNET_DIR, whatever DEVNET_LANES says now.
started_lanes() {
  echo 0
  for dir in "$DEVNET_DIR"/lane*; do
    [ -d "$dir" ] && echo "${dir##*/lane}"
  done
}

case "${1:-}" in
  up)
    install
    # The lanes start side by side: each mines its own chain to MWEB's activation and has its
    # ElectrumX index it.
    starting=()
    for lane in $(seq 0 $((DEVNET_LANES - 1))); do
      (use_lane "$lane" && lane_up) &
      starting+=($!)
    done
    for pid in "${starting[@]}"; do wait "$pid"; done
    if alive "$DEVNET_DIR/anvil/anvil.pid"; then
      log "anvil already running"
    else
      start_anvil
    fi
    print_env
    ;;
  down)
    for lane in $(started_lanes); do
      use_lane "$lane"
      electrumx_stop "$LANE_DIR/electrumx"
      stop_litecoind
    done
    if alive "$DEVNET_DIR/anvil/anvil.pid"; then kill "$(cat "$DEVNET_DIR/anvil/anvil.pid")"; fi
    ;;
  node-restart)
    # Stops litecoind and starts it again on the same chain (what a node upgrade does).
    stop_litecoind
    run_litecoind
    cli loadwallet miner >/dev/null
    cli loadwallet mweb >/dev/null
    ;;
  litecoin-cli)
    # The devnet node's litecoin-cli, e.g. `litecoin-cli -rpcwallet=miner sendtoaddress ADDR 1.5`.
    shift
    cli "$@"
    ;;
  mine)
    # Mines N blocks (default 1) to the devnet wallet.
    cli -rpcwallet=miner generatetoaddress "${2:-1}" "$(cli -rpcwallet=miner getnewaddress '' bech32)" >/dev/null
    log "mined ${2:-1} block(s); height $(cli getblockcount)"
    ;;
  electrumx-start) electrumx_start "$2" "$3" ;;
  electrumx-stop) electrumx_stop "$2" ;;
  *)
    echo "usage: $0 up | down | litecoin-cli ARGS… | mine [N] | electrumx-start DIR PORT | electrumx-stop DIR" >&2
    exit 2
    ;;
esac
