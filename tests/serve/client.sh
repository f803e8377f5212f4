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
. "$here/server.sh"
serve_start "serve client" --api-key k3y
node "$here/client.cjs" "http://127.0.0.1:$port" k3y "$kl" "$tmp/tiny"
serve_stop "serve client"
echo "serve client: ok"
