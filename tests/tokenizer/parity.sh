#!/bin/sh
# tests/tokenizer/parity.sh — `kl tokenize` against OpenAI's tiktoken core (npm tiktoken, WASM)
# with Kimi's pattern, o200k ranks and Kimi's special layout (see oracle.cjs): >= 1 MB of
# mixed-script text, adversarial strings, long runs and the 400k/25k cuts, 3,000+ cases in all.
# Run by `make test` (KL_BIN = the kl under test); needs node and `npm ci` in this directory
# (scripts/install-deps.sh does it).  Exit 0 all identical, 1 a mismatch or failure.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
kl=${KL_BIN:-$here/../../build/kl}
if ! command -v node >/dev/null 2>&1; then
    echo "parity: node not found; install node and run scripts/install-deps.sh" >&2
    exit 1
fi
if [ ! -f "$here/node_modules/tiktoken/lite/tiktoken.cjs" ] ||
   [ ! -f "$here/node_modules/gpt-tokenizer/data/o200k_base.tiktoken" ]; then
    echo "parity: npm packages missing in $here; run scripts/install-deps.sh" >&2
    exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kl-tokparity-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
node "$here/oracle.cjs" "$tmp"
cd "$tmp"
# one kl process for all cases: each --file is encoded separately, one line of ids each
set --
for f in in/*.txt; do set -- "$@" --file "$f"; done
"$kl" tokenize tok "$@" > got.txt
node "$here/oracle.cjs" --compare "$tmp" got.txt
# throughput of the kl under test on the same 1 MB text (under make test: the ASan build)
echo "parity: encode throughput of $kl:" >&2
"$kl" tokenize tok --file in/00000.txt --stats > /dev/null
