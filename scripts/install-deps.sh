#!/bin/sh
# Installs every Debian package kl's build, tests and fuzzing need, then the npm packages of the
# tokenizer parity test (tests/tokenizer, pinned by its package-lock.json).  Idempotent: installs
# only what is missing, and runs apt-get update only when something must be installed.
set -eu
PKGS="build-essential pkg-config liburing-dev libaio-dev libssl-dev libcjson-dev libpcre2-dev libxxhash-dev libmicrohttpd-dev check clang hipcc"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "install-deps: all packages present"
else
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "install-deps: installing$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

# npm packages of the tokenizer parity test (node and npm come with the CI image).  `npm ls`
# fails when the installed tree does not match package.json/package-lock.json; only then is
# `npm ci` run.  Not fatal here (`make demo` needs no node): the parity test in `make test`
# fails with a pointer back to this script when the packages are missing.
tok="$(cd "$(dirname "$0")/.." && pwd)/tests/tokenizer"
if ! command -v npm >/dev/null 2>&1; then
    echo "install-deps: warning: npm not found; make test's tokenizer parity test needs node" >&2
elif (cd "$tok" && npm ls --silent >/dev/null 2>&1); then
    echo "install-deps: npm packages present"
else
    echo "install-deps: npm ci in tests/tokenizer"
    (cd "$tok" && npm ci --no-audit --no-fund --silent) ||
        echo "install-deps: warning: npm ci failed in $tok" >&2
fi
