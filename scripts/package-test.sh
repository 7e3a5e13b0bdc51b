#!/usr/bin/env bash
# The Debian package, end to end on this machine (scripts/test.sh runs it; it needs root and
# the devnet): `cargo deb -p payrecon` builds it, `dpkg -i` installs it, the files, the
# payrecon user, the conffile and the unit are checked (`systemd-analyze verify`), the
# installed binary runs `init` and `serve` as the payrecon user against the devnet until a
# payment settles and SIGTERM stops it with status 0 (scripts/demo.sh --check), and the
# package is purged.
#
# It never touches a payrecon installed on this machine: where the payrecon package is
# installed (or purged but for its configuration), it says so and skips, leaving it as it is.
#
# PAYRECON_DEB_PROFILE: the cargo profile of the package's binary: `release` (the default,
# built here) is what ships; `dev` packages the debug binary the test suite just built, as it
# is (scripts/test.sh), instead of spending a release build on a test.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '%s\n' "package-test: $*"; }
fail() { say "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "installing a package needs root"
if state=$(dpkg-query -W -f='${db:Status-Status}' payrecon 2>/dev/null) && [ "$state" != not-installed ]; then
  say "skipped: the payrecon package is on this machine ($state); this test would replace and purge it"
  exit 0
fi

profile=${PAYRECON_DEB_PROFILE:-release}
if ! command -v cargo-deb >/dev/null; then
  say "installing cargo-deb"
  cargo install --locked --quiet cargo-deb
fi
build=()
[ "$profile" = dev ] && build=(--no-build)
deb=$(cargo deb -p payrecon --locked --profile "$profile" "${build[@]}" --output target/debian/ 2>/dev/null | tail -n 1)
[ -f "$deb" ] || fail "cargo deb made no package"
say "built $deb"

installed=false
cleanup() {
  if $installed; then
    dpkg --purge payrecon >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
dpkg -i "$deb" >/dev/null
installed=true

# What the package holds and what its scripts made.
for path in /usr/bin/payrecon /etc/payrecon/payrecon.toml /usr/lib/systemd/system/payrecon.service \
  /usr/share/doc/payrecon/docs/deploy.md /usr/share/doc/payrecon/deploy/caddy/Caddyfile /usr/share/payrecon/prometheus/alerts.yml /usr/share/payrecon/grafana/payrecon.json; do
  [ -e "$path" ] || fail "$path is not installed"
done
dpkg-query -W -f='${Conffiles}\n' payrecon | grep -q '^ /etc/payrecon/payrecon.toml ' || fail "the configuration is not a conffile"
getent passwd payrecon | grep -q ':/var/lib/payrecon:' || fail "no payrecon system user with its home in /var/lib/payrecon"
[ "$(stat -c '%U:%G %a' /var/lib/payrecon)" = "payrecon:payrecon 750" ] || fail "/var/lib/payrecon is $(stat -c '%U:%G %a' /var/lib/payrecon)"
[ "$(stat -c '%U:%G %a' /etc/payrecon/payrecon.toml)" = "root:payrecon 640" ] || fail "the configuration is $(stat -c '%U:%G %a' /etc/payrecon/payrecon.toml)"
unit=/usr/lib/systemd/system/payrecon.service
for line in 'ExecStartPre=/usr/bin/payrecon --config /etc/payrecon/payrecon.toml init' \
  'ExecStart=/usr/bin/payrecon --config /etc/payrecon/payrecon.toml serve' 'Restart=on-failure' \
  'User=payrecon' 'NoNewPrivileges=yes' 'ProtectSystem=strict' 'ProtectHome=yes' 'PrivateTmp=yes' \
  'ReadWritePaths=/var/lib/payrecon' 'SystemCallFilter=@system-service'; do
  grep -qxF "$line" "$unit" || fail "the unit lacks $line"
done
stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s$/\1/p' "$unit")
shutdown=$(sed -n 's/^shutdown_seconds = \([0-9]*\)$/\1/p' /etc/payrecon/payrecon.toml)
[ "$stop" -gt "$shutdown" ] || fail "TimeoutStopSec ($stop s) is not above serve.shutdown_seconds ($shutdown s)"
verify=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $verify"
if [ -n "$verify" ]; then fail "systemd-analyze verify: $verify"; fi
# The guides as in the repository: every relative link between them leads to a file.
python3 - /usr/share/doc/payrecon <<'PY' || fail "an installed guide links to a file the package lacks"
import pathlib, re, sys
root = pathlib.Path(sys.argv[1])
def prose(doc):
    return re.sub(r"`[^`]*`", "", re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M))
broken = [f"{doc}: {target}" for doc in root.rglob("*.md")
          for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", prose(doc))
          if not (doc.parent / target).exists()]
print("\n".join(broken), file=sys.stderr)
sys.exit(1 if broken else 0)
PY
say "files, user, conffile, unit and guides as they should be"

# The packaged configuration starts as it is, and the service's own commands work as its user.
setpriv --reuid=payrecon --regid=payrecon --init-groups /usr/bin/payrecon --config /etc/payrecon/payrecon.toml init >/dev/null
[ -f /var/lib/payrecon/payrecon.db ] || fail "init made no database in /var/lib/payrecon"

# A payment settles through the installed binary, run as the payrecon user; SIGTERM exits 0.
PAYRECON_BIN=/usr/bin/payrecon PAYRECON_RUN_AS=payrecon DEMO_WORK=/var/lib/payrecon scripts/demo.sh --check

dpkg --purge payrecon >/dev/null
installed=false
[ ! -e /usr/bin/payrecon ] && [ ! -e /etc/payrecon/payrecon.toml ] || fail "the purge left files behind"
say "installed, ran as payrecon, settled a payment, stopped cleanly, purged"
