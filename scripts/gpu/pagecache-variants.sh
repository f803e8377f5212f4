#!/bin/bash
# Variants of the mapped page-cache read, each as kl read --mapped --ceiling --repeat 6 (paired
# memory-read passes): the default, 8 MiB chunks, an experimental build in build/exp/portable
# (e.g. -DKL_MAPPED_RELEASE_BYTES / -DKL_MAPPED_LOOKAHEAD_BYTES), 15 threads.  Carry
# build/portable and build/exp/portable.
set -u
export LD_LIBRARY_PATH="$PWD/build/portable"
KL="$PWD/build/portable/kl"; EXP="$PWD/build/exp/portable/kl"; D=/tmp/klwork/big
[ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --layers 7 --seed 3 -q
cat "$D"/*.safetensors > /dev/null
g() { python3 -c 'import json,sys
r = json.load(sys.stdin)
print("median %.1f best %.1f | ceiling median %.1f | ratio %.3f" % (r["read_gbps"], r["read_best_gbps"], r["ceiling_gbps"], r["ceiling_ratio"]))'; }
for k in 1 2; do
echo "default:        $($KL read $D --mapped --json --ceiling --repeat 6 | g)"
echo "chunk 8M:       $($KL read $D --mapped --chunk 8M --json --ceiling --repeat 6 | g)"
echo "exp no-release: $($EXP read $D --mapped --json --ceiling --repeat 6 | g)"
echo "threads 15:     $($KL read $D --mapped --threads 15 --json --ceiling --repeat 6 | g)"
done
