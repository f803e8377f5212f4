#!/bin/sh
# Installs every Debian package kl's build, tests and fuzzing need.  Idempotent: installs only
# what is missing, and runs apt-get update only when something must be installed.
set -eu
PKGS="build-essential pkg-config liburing-dev libaio-dev libssl-dev libcjson-dev check clang"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "install-deps: all packages present"
    exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
