#!/bin/bash
# Where does the page-cache read rate stop?  Compares kl read --buffered with 16 parallel
# `dd bs=2M` over disjoint ranges of the same cached files (the kernel's own parallel copy
# rate), and sweeps the pread backend's queue depth, interleaved with the memory-read ceiling.
set -u
export LD_LIBRARY_PATH="$PWD/build/portable"
KL="$PWD/build/portable/kl"
D=${D:-/tmp/klwork/big}
[ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --layers 7 --seed 3 -q
cat "$D"/*.safetensors > /dev/null
pdd() {  # 16 dd readers, 3 or 4 ranges per shard
    local t0 t1 total=0 n=0
    t0=$(date +%s.%N)
    for f in "$D"/*.safetensors; do
        sz=$(stat -c %s "$f"); blocks=$(( (sz + 2097151) / 2097152 )); per=$(( (blocks + 2) / 3 ))
        for k in 0 1 2; do dd if="$f" of=/dev/null bs=2M skip=$((k * per)) count=$per status=none & done
        total=$((total + sz))
    done
    wait
    t1=$(date +%s.%N)
    python3 -c "import sys; b,a,c=int(sys.argv[1]),float(sys.argv[2]),float(sys.argv[3]); print(f'parallel dd (15 readers, bs=2M): {b/(c-a)/1e9:.1f} GB/s')" "$total" "$t0" "$t1"
}
g() {
    python3 -c 'import json,sys
d = json.load(sys.stdin)
print("read %.1f ceiling %.1f ratio %.3f" % (d["read_gbps"], d.get("ceiling_gbps", 0), d.get("ceiling_ratio", 0)))'
}
for rep in 1 2 3; do
    pdd
    echo "default: $("$KL" read "$D" --buffered --json --ceiling | g)"
    for qd in 16 64; do
        echo "threads 16 qd $qd chunk 1M: $("$KL" read "$D" --buffered --io pread --threads 16 --queue-depth $qd --chunk 1M --json --ceiling | g)"
    done
    echo "threads 8 qd 16 chunk 2M: $("$KL" read "$D" --buffered --io pread --threads 8 --queue-depth 16 --chunk 2M --json --ceiling | g)"
    echo "uring qd 64 chunk 1M: $("$KL" read "$D" --buffered --io uring --queue-depth 64 --chunk 1M --json --ceiling | g)"
done
