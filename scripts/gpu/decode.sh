#!/bin/bash
# Issue 4 on the GPU machine's CPUs (carry build/portable): decode tok/s of the full 48B-A3B
# geometry with MXFP4 experts on the CPU engine, and the memory-read ceiling in the same run.
#   kl synth --preset full --format mxfp4 (about 29 GB), then kl bench decode, twice.
set -u
OUT=${OUT:-/tmp/kl-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/decode.log") 2>&1
export LD_LIBRARY_PATH="$PWD/build/portable${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
KL="$PWD/build/portable/kl"; W=${W:-/tmp/kldec}; mkdir -p "$W"
echo "== $(date -u +%FT%TZ) $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo)"
D="$W/full-mxfp4"
[ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --format mxfp4 --seed 11 --json
du -sh "$D"
for rep in 1 2; do
    /usr/bin/time -v "$KL" bench decode "$D" --prompt-tokens ${PROMPT:-64} --tokens ${TOKENS:-32} --json 2> "$W/time.txt"
    grep -E "Elapsed|Maximum resident" "$W/time.txt"
done
[ -n "${KEEP:-}" ] || rm -rf "$D"
echo "== done $(date -u +%FT%TZ)"
