#!/bin/bash
# Issue 3 measurements on the GPU machine (carry build/portable and .ref).
#   fidelity: tiny and small BF16 synth -> kl convert (each scale rule for tiny) -> mean KL
#             divergence of next-token distributions vs the BF16 source, through transformers
#   perf:     synth --preset full --layers 8 (about 30 GB BF16); with caches dropped: dd read of
#             the source, dd write of an output-sized file, then kl convert end to end (peak
#             RSS from /usr/bin/time); kl bench mxfp4 on all cores.
#   split:    the same source with the output in tmpfs, then the source in tmpfs and the output
#             on the disk: conversion time vs the one device's own read or write time.
# Usage: scripts/gpu/convert.sh [STEPS]  (STEPS: any of "fidelity perf split"; default the
#        first two)
set -u
OUT=${OUT:-/tmp/kl-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/convert.log") 2>&1
export LD_LIBRARY_PATH="$PWD/build/portable${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
KL="$PWD/build/portable/kl"; W=${W:-/tmp/klconv}; STEPS=${1:-"fidelity perf"}
mkdir -p "$W"
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(drop_caches FAILED)"; }
rate() { python3 -c "import sys; b,t=float(sys.argv[1]),float(sys.argv[2]); print(f'{b/1e9:.2f} GB in {t:.2f} s = {b/t/1e9:.3f} GB/s')" "$1" "$2"; }
echo "== $(date -u +%FT%TZ) $(nproc) cpus"

if has fidelity; then
    for p in tiny small; do
        rm -rf "$W/$p"; "$KL" synth "$W/$p" --preset $p --seed 5 -q
        rules="ocp"; [ $p = tiny ] && rules="ocp round ceil mse"
        for r in $rules; do
            rm -rf "$W/$p-$r"; "$KL" convert "$W/$p" "$W/$p-$r" --scale-rule $r -q || echo "FAIL convert $p $r"
            "$KL" audit "$W/$p-$r" -q
            python3 scripts/gpu/kl_divergence.py "$W/$p" "$W/$p-$r" --tokens 128 --ref-py .ref
        done
    done
fi

if has perf; then
    S="$W/src8"; D="$W/out8"
    [ -f "$S/config.json" ] || "$KL" synth "$S" --preset full --layers 8 --seed 9 -q
    du -sh "$S"
    drop; t0=$(date +%s.%N); tot=0
    for f in "$S"/*.safetensors; do dd if="$f" of=/dev/null bs=64M iflag=direct status=none; tot=$((tot + $(stat -c %s "$f"))); done
    echo "read source (dd iflag=direct): $(rate $tot $(echo "$(date +%s.%N) $t0" | awk '{print $1-$2}'))"
    # the converter's own I/O: the staged reader (io_uring, O_DIRECT, queue of 8 MiB reads)
    drop; echo "read source (kl read --direct): $("$KL" read "$S" --direct --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.2f s = %.3f GB/s" % (r["elapsed_s"], r["read_gbps"]))')"
    outbytes=9500000000
    drop; t0=$(date +%s.%N)
    dd if=/dev/zero of="$W/ddout" bs=64M count=$((outbytes / 67108864)) oflag=direct status=none
    echo "write output-sized file (dd oflag=direct): $(rate $((outbytes / 67108864 * 67108864)) $(echo "$(date +%s.%N) $t0" | awk '{print $1-$2}'))"
    rm -f "$W/ddout"
    # Can the disk read and write at full speed at once?  The same dd read and write together.
    drop; t0=$(date +%s.%N)
    ( for f in "$S"/*.safetensors; do dd if="$f" of=/dev/null bs=64M iflag=direct status=none; done ) &
    reader=$!
    dd if=/dev/zero of="$W/ddout" bs=64M count=$((outbytes / 67108864)) oflag=direct status=none
    wait "$reader" # not a bare wait: the tee behind `exec >` is a child too and never exits
    echo "read and write together: $(echo "$(date +%s.%N) $t0" | awk '{printf "%.2f s", $1-$2}')"
    rm -f "$W/ddout"
    for rep in $(seq 1 ${REPS:-2}); do
        rm -rf "$D" "$D.partial"; drop
        /usr/bin/time -v "$KL" convert "$S" "$D" --json 2> "$W/time.txt"
        grep -E "Elapsed|Maximum resident" "$W/time.txt"
    done
    du -sh "$D"; "$KL" audit "$D" -q
    for r in ocp mse; do "$KL" bench mxfp4 --rule $r; done
fi
if has split; then
    # Source and output on different devices (the case the 1.1x target assumes): once with
    # the output in tmpfs (the disk only reads), once with the source in tmpfs (it only writes).
    S="$W/src8"; M=/dev/shm/klconv; mkdir -p "$M"
    [ -f "$S/config.json" ] || "$KL" synth "$S" --preset full --layers 8 --seed 9 -q
    secs() { echo "$(date +%s.%N) $1" | awk '{printf "%.2f", $1-$2}'; }
    drop; t0=$(date +%s.%N)
    for f in "$S"/*.safetensors; do dd if="$f" of=/dev/null bs=64M iflag=direct status=none; done
    echo "disk -> tmpfs: read source from disk (dd iflag=direct): $(secs $t0) s"
    drop; echo "disk -> tmpfs: read source from disk (kl read --direct): $("$KL" read "$S" --direct --json | python3 -c 'import json,sys; print("%.2f s" % json.load(sys.stdin)["elapsed_s"])')"
    t0=$(date +%s.%N); dd if=/dev/zero of="$M/ddout" bs=64M count=141 status=none
    echo "disk -> tmpfs: write 9.46 GB to tmpfs (dd): $(secs $t0) s"; rm -f "$M/ddout"
    for rep in $(seq 1 ${REPS:-2}); do
        rm -rf "$M/out8" "$M/out8.partial"; drop
        "$KL" convert "$S" "$M/out8" --json
    done
    rm -rf "$M/out8"
    cp -r "$S" "$M/src8"
    t0=$(date +%s.%N); cat "$M"/src8/*.safetensors > /dev/null
    echo "tmpfs -> disk: read source from tmpfs (cat): $(secs $t0) s"
    drop; t0=$(date +%s.%N)
    dd if=/dev/zero of="$W/ddout" bs=64M count=141 oflag=direct status=none; sync
    echo "tmpfs -> disk: write 9.46 GB to disk (dd oflag=direct): $(secs $t0) s"; rm -f "$W/ddout"
    for rep in $(seq 1 ${REPS:-2}); do
        rm -rf "$W/out8s" "$W/out8s.partial"; sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
        cat "$M"/src8/*.safetensors > /dev/null
        "$KL" convert "$M/src8" "$W/out8s" --json
    done
    rm -rf "$M" "$W/out8s"
fi
echo "== done $(date -u +%FT%TZ)"
