#!/bin/sh
# Readies build/gpu-$GPU (default cuda) for the GPU machine, which has no Debian -dev
# libraries: strips the binaries, copies the shared libraries kl needs beyond glibc and the
# C++ runtime into fallback-libs (engine.sh puts them on LD_LIBRARY_PATH only where the loader
# there misses one), and packs kl, the device tests, those libraries and the tracer
# (libkernel_trace.so, libcupti) into build/carry/gpu-$GPU.tar.xz: ~20 MB where the files
# themselves are ~100 MB, and a device call carries at most 64 MiB with the working tree.
# Carry that one file (carry: ["build/carry/gpu-cuda.tar.xz"]); engine.sh unpacks it.
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
mkdir -p build/carry
files=$(cd "$BG" && for f in kl libcjson.so.1 fallback-libs libkernel_trace.so libcupti.so.* \
    test_*; do [ -e "$f" ] && case $f in *.o) ;; *) echo "$f" ;; esac; done)
# shellcheck disable=SC2086 # one name a word
tar -C "$BG" -cf - $files | xz -T0 -6 > "build/carry/gpu-${GPU:-cuda}.tar.xz"
du -sh "$BG" "$BG/fallback-libs" "build/carry/gpu-${GPU:-cuda}.tar.xz"
