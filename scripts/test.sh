#!/usr/bin/env bash
# The whole test suite, on SQLite and PostgreSQL, against the real chain nodes.
#
# It needs root, and it installs on this machine what is missing: with apt, Debian's
# postgresql (when no DATABASE_URL is given), litecoind, chromium, strace, caddy and prometheus
# (for promtool); ElectrumX from PyPI into a virtualenv and anvil from npm, both under
# /tmp/payrecon-devnet (DEVNET_DIR); cargo-deb with cargo install. It builds payrecon's Debian
# package and installs, runs and purges it, but only where no payrecon package is installed: a
# payrecon installed here, its configuration and its database are left as they are (the
# package test says it skipped).
#
# - PostgreSQL comes from DATABASE_URL when it is set; otherwise a throwaway server is started
#   for this run and removed after it.
# - The Litecoin regtest node, ElectrumX and anvil come from PAYRECON_TEST_LTC_RPC,
#   PAYRECON_TEST_LTC_P2P, PAYRECON_TEST_ELECTRUM and PAYRECON_TEST_ETH_RPC when all are set; otherwise
#   scripts/devnet.sh installs (first run) and starts them for this run and stops them after it:
#   DEVNET_LANES (5) independent Litecoin chains, each a node with its own ElectrumX, so that as
#   many chain tests run at once (the three lists then name one chain per lane, comma-separated).
# - Tests run RUST_TEST_THREADS (8) at a time: most of them wait on a node, a server or a poll,
#   not on the CPU.
# - Headless Chromium for the browser test comes from PAYRECON_TEST_CHROMIUM or Debian's
#   chromium, installed here when missing; strace (the durability test watches `payrecon serve`
#   sync before it answers) and promtool (the alert rules' tests, from Debian's prometheus)
#   are installed here when missing too.
# - examples/embed, a crate outside the workspace, runs the shop flow through the public API. It
#   compiles payrecon and the chain crates again, without the test hooks, while the workspace's
#   tests run (they mostly wait on nodes and servers); the dependencies it reuses.
# - After the suite, `scripts/demo.sh --check` runs README's first command end to end,
#   non-interactively, with the payrecon binary `cargo test` built; scripts/package-test.sh
#   then packages that binary with cargo-deb (installed here when missing), installs the
#   package, runs it as the payrecon user against the devnet, and purges it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh needs root: it installs missing Debian packages and tests payrecon's own package (see its first lines)" >&2
  exit 1
fi

cleanup=()
finish() { for step in "${cleanup[@]}"; do eval "$step" || true; done; }
trap finish EXIT

if [ -z "${DATABASE_URL:-}" ]; then
  eval "$(scripts/postgres-throwaway.sh start)"
  cleanup+=("scripts/postgres-throwaway.sh stop")
  echo "using a throwaway PostgreSQL: $DATABASE_URL"
else
  echo "using PostgreSQL from DATABASE_URL"
fi

if [ -z "${PAYRECON_TEST_ELECTRUM:-}" ] || [ -z "${PAYRECON_TEST_LTC_RPC:-}" ] || [ -z "${PAYRECON_TEST_LTC_P2P:-}" ] || [ -z "${PAYRECON_TEST_ETH_RPC:-}" ]; then
  eval "$(DEVNET_LANES=${DEVNET_LANES:-5} scripts/devnet.sh up)"
  cleanup+=("scripts/devnet.sh down")
  echo "using fresh local nodes: Litecoin regtest behind ElectrumX at $PAYRECON_TEST_ELECTRUM, anvil at $PAYRECON_TEST_ETH_RPC"
else
  echo "using the nodes from PAYRECON_TEST_ELECTRUM, PAYRECON_TEST_LTC_RPC and PAYRECON_TEST_ETH_RPC"
fi

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "$@" >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q "$@" >/dev/null; }
}
if [ -z "${PAYRECON_TEST_CHROMIUM:-}" ] && ! [ -x /usr/bin/chromium ]; then
  echo "installing Debian's chromium for the browser test"
  apt_install chromium
fi
if ! command -v strace >/dev/null; then
  echo "installing strace for the durability test"
  apt_install strace
fi
if ! command -v caddy >/dev/null; then
  echo "installing Debian's caddy (the first deployment's HTTPS step)"
  apt_install caddy
fi
if ! command -v promtool >/dev/null; then
  echo "installing Debian's prometheus for promtool (the alert rules' tests)"
  apt_install --no-install-recommends prometheus
fi

export RUST_TEST_THREADS=${RUST_TEST_THREADS:-8}
# Everything the tests run, in one build whose features are those of `cargo test`: the test
# harnesses, and the binaries the CLI tests start (the benchmarks' among them, which
# `cargo test` alone would not build, as that crate has no tests of its own).
cargo build --workspace --all-targets --locked
# Every crate of the workspace: unit, integration and doc tests (README's library example is
# one), and the bench's CLI through `payrecon bench`. Its output is shown as it comes.
tests_log=$(mktemp)
cleanup+=("rm -f $tests_log")
cargo test --workspace --locked > "$tests_log" 2>&1 &
tests=$!
cleanup+=("kill $tests 2>/dev/null")
tail -n +1 -f --pid="$tests" "$tests_log" &
# A shop's crate outside the workspace, which sees only the public API, compiled once the
# workspace's tests run (cargo holds the build directory until then), and then run on both
# databases.
until grep -q '^     Running ' "$tests_log" || ! kill -0 "$tests" 2>/dev/null; do sleep 1; done
cargo test --locked --quiet --manifest-path examples/embed/Cargo.toml --target-dir target --no-run
wait "$tests"
cargo test --locked --manifest-path examples/embed/Cargo.toml --target-dir target
PAYRECON_BIN=target/debug/payrecon scripts/demo.sh --check
# The Debian package of that binary, installed, run as its user against the devnet, purged.
PAYRECON_DEB_PROFILE=dev scripts/package-test.sh
