#!/bin/sh
# tests/install.sh — `make install` puts build/kl under $(DESTDIR)$(PREFIX)/bin, and
# `make portable` gives a folder that runs from anywhere without LD_LIBRARY_PATH: its kl finds
# the libcjson.so.1 beside it (an $ORIGIN rpath), not the system's.  Run by `make test`.
set -eu
unset MAKEFLAGS MFLAGS MAKELEVEL
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make -s -j2 install DESTDIR="$tmp/root" PREFIX=/opt/kl > "$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
if ! [ -x "$tmp/root/opt/kl/bin/kl" ]; then
    echo "install: no $tmp/root/opt/kl/bin/kl" >&2; exit 1
fi
"$tmp/root/opt/kl/bin/kl" --version | grep -q '^kl '
make -s -j2 portable BP="$tmp/portable" > "$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
mv "$tmp/portable" "$tmp/moved"
env -u LD_LIBRARY_PATH "$tmp/moved/kl" --version | grep -q '^kl '
lib=$(env -u LD_LIBRARY_PATH ldd "$tmp/moved/kl" | awk '/libcjson/ {print $3}')
if [ "$lib" != "$tmp/moved/libcjson.so.1" ]; then
    echo "portable: kl loads libcjson from '$lib', not from beside it ($tmp/moved)" >&2; exit 1
fi
for l in liburing libaio libcrypto libpcre2; do
    if env -u LD_LIBRARY_PATH ldd "$tmp/moved/kl" | grep -q "$l"; then
        echo "portable: $l is not linked statically" >&2; exit 1
    fi
done
echo "install: ok"
