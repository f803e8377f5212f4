#!/bin/bash
# Issue 2 checks on the GPU machine (run from the repository root through the device tool,
# carrying build/portable and .ref).  Everything it prints also lands in $OUT/foundation.log.
#   1. transformers-written checkpoints (tiny, small) audited by kl: zero problems expected;
#      the tiny one is copied to $OUT for the test fixture.
#   2. kl synth tiny/small loaded by transformers (kimi_ref.py run): no missing/unexpected keys.
#   3. kl synth --preset full --sparse, then kl audit timing (< 0.2 s target).
#   4. a 20+ GB synthetic checkpoint: dd iflag=direct vs kl read --direct (cache dropped),
#      then page-cache reads vs the memory-read ceiling.
# Usage: scripts/gpu/foundation.sh [STEPS]   STEPS: any of "ref synth sparse read cache" (default all)
set -u
OUT=${OUT:-/tmp/kl-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/foundation.log") 2>&1
export LD_LIBRARY_PATH="$PWD/build/portable${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
KL="$PWD/build/portable/kl"
W=${W:-/tmp/klwork}
STEPS=${1:-"ref synth sparse read cache"}
mkdir -p "$W"
echo "== $(date -u +%FT%TZ) $(uname -r) $(nproc) cpus"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
df -h "$W" | tail -1

has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }

if has ref; then
    for p in tiny small; do
        rm -rf "$W/ref_$p"
        python3 .ref/kimi_ref.py make --out "$W/ref_$p" --preset $p --seed 1 || echo "FAIL make $p"
        echo "-- kl audit transformers $p"
        "$KL" audit "$W/ref_$p" -v; echo "exit=$?"
        "$KL" audit "$W/ref_$p" --json > "$OUT/audit_ref_$p.json"; echo "exit=$?"
    done
    tar -C "$W" -czf "$OUT/ref_tiny.tgz" ref_tiny
fi

if has synth; then
    for p in tiny small; do
        for f in bf16 mxfp4; do
            rm -rf "$W/syn_${p}_$f"
            "$KL" synth "$W/syn_${p}_$f" --preset $p --format $f --seed 7 || echo "FAIL synth $p $f"
            "$KL" audit "$W/syn_${p}_$f" -q; echo "audit exit=$?"
            echo "-- transformers loads kl synth $p $f"
            python3 .ref/kimi_ref.py run --model "$W/syn_${p}_$f" --ids 1,2,3,4,5 --steps 2 \
                --out "$W/run_${p}_$f.json"; echo "kimi_ref run exit=$?"
        done
    done
fi

if has sparse; then
    rm -rf "$W/full_sparse"
    /usr/bin/time -v "$KL" synth "$W/full_sparse" --preset full --sparse 2>&1 | grep -E 'Elapsed|Maximum resident|tensors|shards' 
    for i in 1 2 3; do
        /usr/bin/time -f "audit wall %e s, rss %M KB" "$KL" audit "$W/full_sparse" -q
    done
    "$KL" audit "$W/full_sparse" --json > "$OUT/audit_full_sparse.json"
    rm -rf "$W/full_sparse"
fi

if has read; then
    D="$W/big"
    LAYERS=${LAYERS:-6}
    if [ ! -f "$D/config.json" ]; then
        rm -rf "$D"
        "$KL" synth "$D" --preset full --layers "$LAYERS" --seed 3 --json
    fi
    du -sh "$D"
    drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo "(caches dropped)" || echo "(drop_caches FAILED)"; }
    ddread() {  # one dd per shard, back to back; prints the aggregate rate
        local t0 t1 total=0
        t0=$(date +%s.%N)
        for f in "$D"/*.safetensors; do
            dd if="$f" of=/dev/null bs=64M iflag=direct status=none
            total=$((total + $(stat -c %s "$f")))
        done
        t1=$(date +%s.%N)
        python3 -c "import sys; b,t0,t1=int(sys.argv[1]),float(sys.argv[2]),float(sys.argv[3]); print(f'dd iflag=direct bs=64M: {b} bytes in {t1-t0:.3f} s = {b/(t1-t0)/1e9:.3f} GB/s')" "$total" "$t0" "$t1"
    }
    for rep in 1 2 3; do
        drop; ddread
        for io in auto uring aio pread; do
            drop
            "$KL" read "$D" --direct --io $io --json
        done
    done
fi

if has cache; then
    D="$W/big"
    LAYERS=${LAYERS:-6}
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --layers "$LAYERS" --seed 3 --json
    dev=$(basename "$(df --output=source "$W" | tail -1)")
    echo "-- page cache: fs $(stat -f -c %T "$W"), read_ahead_kb $(cat /sys/block/$dev/queue/read_ahead_kb 2>/dev/null)," \
         "THP $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
    filehuge() { echo "   $(grep -E 'FileHugePages' /proc/meminfo | tr -s ' ')"; }
    drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(drop_caches FAILED)"; }
    # 1. cached by cat (folios as large as the device's read-ahead window allows)
    drop; cat "$D"/*.safetensors > /dev/null; echo "cached by cat"; filehuge
    "$KL" read "$D" --mapped --json --ceiling --repeat 4
    # 2. cached by kl's own mapped read (MADV_HUGEPAGE: 2 MiB folios, PMD-mapped afterwards)
    drop; "$KL" read "$D" --mapped --json; echo "cached by kl read --mapped"; filehuge
    # each round: the read, then a memory-read pass over as many bytes
    "$KL" read "$D" --mapped --json --ceiling --repeat ${CACHE_REPS:-8}
    "$KL" read "$D" --buffered --io pread --json --ceiling --repeat 3
fi
echo "== done $(date -u +%FT%TZ)"
