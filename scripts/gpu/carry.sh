#!/bin/sh
# Readies build/gpu-$GPU (default cuda) for the GPU machine, which has no Debian -dev
# libraries: strips the binaries (the device call carries at most 64 MiB) and copies the
# shared libraries kl needs beyond glibc and the C++ runtime into fallback-libs (engine.sh
# puts them on LD_LIBRARY_PATH only where the loader there misses one).
set -eu
BG=build/gpu-${GPU:-cuda}
[ -x "$BG/kl" ] || { echo "carry.sh: no $BG/kl (make GPU=cuda gpu)" >&2; exit 1; }
for f in "$BG"/kl "$BG"/test_*; do
    [ -f "$f" ] && strip "$f"
done
mkdir -p "$BG/fallback-libs"
ldd "$BG/kl" | awk '$3 ~ /^\// { print $3 }' | while read -r lib; do
    case $(basename "$lib") in
    libc.so* | libm.so* | libpthread* | libdl.so* | librt.so* | ld-linux*) ;;
    libstdc++* | libgcc_s*) ;;
    *) cp -L "$lib" "$BG/fallback-libs/" ;;
    esac
done
du -sh "$BG" "$BG/fallback-libs"
