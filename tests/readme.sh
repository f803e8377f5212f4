#!/bin/sh
# tests/readme.sh — the example commands of README.md run top to bottom, as written, in a fresh
# folder standing in for /tmp (kl = $KL_BIN).  Synopsis lines (with [options] or DIR/MODEL/SRC
# placeholders) are skipped, and so are the 9 GB /tmp/kl8 examples (synth and read) and
# `kl serve` (it runs until stopped: tests/test_serve.c and tests/serve/ cover it).
# Run by `make test`; exit 0 when every command exits 0.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
kl=${KL_BIN:-$here/build/kl}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin" "$tmp/t"
ln -s "$kl" "$tmp/bin/kl"
grep -E '^    (kl |\(cd |printf )' "$here/README.md" | grep -vE '\[|DIR|MODEL|SRC|OUT |/kl8|kl serve' |
    sed -e 's/^    //' -e "s|/tmp/|$tmp/t/|g" > "$tmp/commands"
n=0
while IFS= read -r line; do
    n=$((n + 1))
    if ! (cd "$tmp" && PATH="$tmp/bin:$PATH" sh -c "$line") > "$tmp/out" 2> "$tmp/err" < /dev/null; then
        echo "readme: command $n failed: $line" >&2
        tail -5 "$tmp/err" >&2
        exit 1
    fi
done < "$tmp/commands"
[ "$n" -ge 15 ] || { echo "readme: only $n commands found" >&2; exit 1; }
echo "readme: $n commands ok"
