#!/bin/sh
# tests/serve/client.sh — `kl serve` (KL_BIN, the kl under test) on a tiny synthetic checkpoint
# at a free port of 127.0.0.1, driven by the official `openai` npm client (client.cjs), then
# stopped with SIGTERM (exit 0 wanted).  Run by `make test`; needs node and `npm ci` in this
# directory (scripts/install-deps.sh does it).  Skipped (exit 0, with a message) without node.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
kl=${KL_BIN:-$here/../../build/kl}
if ! command -v node >/dev/null 2>&1; then
    echo "serve client: SKIPPED: node not found (install node, then scripts/install-deps.sh)" >&2
    exit 0
fi
if [ ! -f "$here/node_modules/openai/package.json" ]; then
    echo "serve client: npm packages missing in $here; run scripts/install-deps.sh" >&2
    exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kl-serve-XXXXXX")
pid=""
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
"$kl" synth "$tmp/tiny" --preset tiny --seed 3 -q > /dev/null
mkfifo "$tmp/out"
"$kl" serve "$tmp/tiny" --port 0 --json --threads 2 --api-key k3y --served-model-name tiny -q \
    > "$tmp/out" &
pid=$!
read -r line < "$tmp/out"
port=$(printf '%s' "$line" | sed -n 's/.*"port":\([0-9]*\).*/\1/p')
[ -n "$port" ] || { echo "serve client: no port in: $line" >&2; exit 1; }
node "$here/client.cjs" "http://127.0.0.1:$port" k3y "$kl" "$tmp/tiny"
kill -TERM "$pid"
st=0
wait "$pid" || st=$?
pid=""
[ "$st" -eq 0 ] || { echo "serve client: kl serve ended with status $st" >&2; exit 1; }
echo "serve client: ok"
