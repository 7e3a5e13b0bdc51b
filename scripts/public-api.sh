#!/usr/bin/env bash
# The payrecon crate's public API, one item per line (kind and path), as rustdoc documents it
# for a shop: the default features, so without the workshop's `test_utils`. Run from any
# checkout: `scripts/public-api.sh [crate-dir]`.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
cargo doc --no-deps --locked -p payrecon --lib -q 2>/dev/null
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
python3 - "$target/doc/payrecon/all.html" <<'PY'
import html, re, sys
page = open(sys.argv[1]).read()
for section, items in re.findall(r'<h3 id="([a-z-]+)">.*?</h3><ul class="all-items">(.*?)</ul>', page, re.S):
    for item in re.findall(r'<a href="[^"]*">([^<]*)</a>', items):
        print(f"{section:<12} payrecon::{html.unescape(item)}")
PY
