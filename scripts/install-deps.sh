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

# npm packages of the tokenizer parity test (tests/tokenizer) and of the serve client test
# (tests/serve: the official openai client); node and npm come with the CI image.  `npm ls`
# fails when the installed tree does not match package.json/package-lock.json; only then is
# `npm ci` run.  Not fatal here (`make demo` needs no node): the tests in `make test` fail with
# a pointer back to this script when the packages are missing.
root="$(cd "$(dirname "$0")/.." && pwd)"
for dir in "$root/tests/tokenizer" "$root/tests/serve"; do
    if ! command -v npm >/dev/null 2>&1; then
        echo "install-deps: warning: npm not found; make test's node tests need node" >&2
        break
    elif (cd "$dir" && npm ls --silent >/dev/null 2>&1); then
        echo "install-deps: npm packages present in $dir"
    else
        echo "install-deps: npm ci in $dir"
        (cd "$dir" && npm ci --no-audit --no-fund --silent) ||
            echo "install-deps: warning: npm ci failed in $dir" >&2
    fi
done
