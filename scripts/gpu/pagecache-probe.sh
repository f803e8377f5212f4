#!/bin/bash
# Where does the mapped page-cache read stop, and what is a fair ceiling for it?  Interleaves,
# over one cached 24 GB checkpoint: the mapped read against the default ceiling (best of five
# 4 GiB passes) and against a ceiling over as many bytes as the read, and variants of the
# mapped reader (a build in build/exp/portable, e.g. other release batches; larger chunks).
# Carry build/portable and build/exp/portable.
set -u
OUT=${OUT:-/tmp/kl-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/pagecache-probe.log") 2>&1
export LD_LIBRARY_PATH="$PWD/build/portable"
KL="$PWD/build/portable/kl"; EXP="$PWD/build/exp/portable/kl"
D=${D:-/tmp/klwork/big}
[ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --layers 7 --seed 3 -q
cat "$D"/*.safetensors > /dev/null
size=$(cat "$D"/*.safetensors | wc -c)
echo "== $(date -u +%FT%TZ) $size bytes cached; $(grep FileHugePages /proc/meminfo | tr -s ' ')"
steal0=$(awk '/^cpu /{print $9}' /proc/stat)
g() { python3 -c 'import json,sys
d = json.load(sys.stdin)
print("read %.1f ceiling %.1f (median pass %.1f) ratio %.3f" % (d["read_gbps"], d["ceiling_gbps"],
      d["ceiling_median_pass_gbps"], d["ceiling_ratio"]))'; }
for rep in $(seq 1 ${REPS:-3}); do
    echo "mapped, 4 GiB ceiling:          $("$KL" read "$D" --mapped --json --ceiling | g)"
    echo "mapped, read-sized ceiling:     $("$KL" read "$D" --mapped --json --ceiling-size "$size" | g)"
    echo "exp build, read-sized ceiling:  $("$EXP" read "$D" --mapped --json --ceiling-size "$size" | g)"
done
echo "cpu steal (jiffies, all CPUs): $(awk '/^cpu /{print $9}' /proc/stat) now, $steal0 at the start"
echo "== done $(date -u +%FT%TZ)"
