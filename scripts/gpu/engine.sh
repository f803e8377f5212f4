#!/bin/bash
# Issue 10 on the GPU machine in one device call (build here with `make GPU=cuda gpu-kl`, carry
# build/gpu-cuda): the device tests, the GPU engine against the golden fixtures (transformers,
# fp32) and against the CPU engine teacher-forced, then the full 48B geometry with synthetic
# MXFP4 experts: GPU vs CPU on a 64-token prompt and kl bench decode.  Ends with a short table.
# Settings (environment):
#   STAGES    stages to run (default "tests golden full"); W: work folder; KEEP=1 keeps the
#             full model.
#   tests     the device tests; TESTS="test_mla ..." only those.
#   golden    the golden fixtures; GOLDEN_CONFIGS: once per configuration ("A=1 B=2;C=3",
#             see golden_configs).
#   full      kl bench on the full geometry: PROMPT_TOKENS (8192), TOKENS (32 decoded a
#             figure), AT (0,8192,65536), PF (512,8192: prefill lengths timed), BT (numbers of
#             sequences decoded together, --batch-at), NOGRAPHS=1 (a run without decode
#             graphs), LOADS="host read" (also loaded those ways), SHM=1 (also from
#             /dev/shm), PROFILE=1 (per-operation times of a PROFILE_PROMPT-token prompt,
#             2048), BENCH_CONFIGS (once per configuration), FULLCPU=0 (no comparison with
#             the CPU engine), RAWREAD=0 (no cat of the shards first: cached after kl synth).
#   fullcmp   GPU against CPU on a FULL_PROMPT-token prompt (64) of the full geometry.
#   chunks    a long prompt in chunks of 256 against CHUNKS (KL_GPU_CHUNK values), GPU only.
#   tpcheck   GPU tensor parallel (TPS, TP_CONFIG) against the CPU engine on the golden
#             fixtures and their MXFP4 conversions.
#   tpbench   the full model's load, decode and prefill of TP_PREFILL tokens (8192) at each
#             size of TPLOADS (TP_ARGS: more kl flags for both, e.g. --expert-parallel).
#   ncu       Nsight Compute's time of every kernel of one-token steps (NCU_PROMPT=N: of an
#             N-token prompt; KL_RUN_ARGS, e.g. --tp 2; NCU_TAG names its csv).
#   ncukernel its sections for NCU_KERNELS (a regex).
#   cpubatch  kl serve on CPU cores 0-7 against bench_serve.py on 8-15 (CPU_SERVE_ARGS,
#             CPU_STREAMS).
#   loadsweep the GPU load under LOAD_CONFIGS (";" between configurations; default a list of
#             ring / mapped / hybrid settings) from the page cache and /dev/shm (LOAD_FROM),
#             REPS times each, a table row a run (stage_loadsweep); a configuration naming
#             HOLD_DEVICE=1 loads while another process holds the device (hold_device_start).
#   trace     the kernel timeline of greedy decode (TRACE_CONFIGS, TRACE_TOKENS).
#   sampled   kl run's decode rate and ids under sampling flags (SAMPLED_FLAGS, KL_OLD).
#   serve     kl serve streams (see stage_serve).
#   pdl       teacher-forced logits with programmatic launches off and on, bytewise equal.
#   start     the device's start in fresh processes, step by step (START_CONFIGS, REPS).
set -u
export NCCL_NVLS_ENABLE=0   # never NVLink multicast on the lent hosts (kl sets it too)
OUT=${OUT:-/tmp/kl-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/engine.log") 2>&1
BG="$PWD/build/gpu-cuda"; KL=${KL:-$BG/kl}; W=${W:-/tmp/klgpu}; mkdir -p "$W"
# binaries carried packed (scripts/gpu/carry.sh): unpacked over what the folder holds
if [ -f build/carry/gpu-cuda.tar.xz ]; then
    mkdir -p "$BG" && xz -dc build/carry/gpu-cuda.tar.xz | tar -C "$BG" -xf - ||
        { echo "engine.sh: cannot unpack build/carry/gpu-cuda.tar.xz"; exit 1; }
fi
STAGES=${STAGES:-"tests golden pdl full"}
# shared libraries this machine may lack (copied beside the binary by hand into
# build/gpu-cuda/fallback-libs: used only when the loader reports one missing)
if ldd "$KL" | grep -q "not found" && [ -d "$BG/fallback-libs" ]; then
    export LD_LIBRARY_PATH="$BG/fallback-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
ldd "$KL" | grep "not found"
# NCCL (test_nccl, tensor parallel): not carried (218 MB); torch's wheel on the GPU machine has it
if [ -x "$BG/test_nccl" ] && ldd "$BG/test_nccl" | grep -q "libnccl.*not found"; then
    NCCL_DIR=$(python3 -c "import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null)
    [ -n "$NCCL_DIR" ] && export LD_LIBRARY_PATH="$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
TABLE="$OUT/table.txt"; : > "$TABLE"
row() { echo "$*" | tee -a "$TABLE"; }
GPU_INFO=$(nvidia-smi --query-gpu=name,memory.total,persistence_mode --format=csv,noheader)
echo "== $(date -u +%FT%TZ) $GPU_INFO"

stage_tests() {
    for t in "$BG"/test_*; do
        [ -z "${TESTS:-}" ] || case " $TESTS " in *" $(basename "$t") "*) ;; *) continue ;; esac
        echo "== $(basename "$t")"
        timeout ${TEST_TIMEOUT:-300} "$t" > "$W/$(basename "$t").json"; local rc=$?
        cat "$W/$(basename "$t").json"; cp "$W/$(basename "$t").json" "$OUT/" 2>/dev/null
        row "device-test $(basename "$t") rc=$rc"
    done
}

# runs a command in a subshell with one configuration's environment ("A=1 B=2", or blank)
with_config() {
    local cfg=$1
    shift
    ( [ -z "${cfg// }" ] || eval "export $cfg"; IFS=' '; "$@" )
}

# teacher-forced logits of DIR on DEVICE into FILE (prompt ids and forced ids as arguments);
# KL_RUN_ARGS: more flags for kl run (e.g. a config "KL_RUN_ARGS='--tp 2'")
forced() {  # dir device route prompt greedy file
    "$KL" run "$1" --device "$2" --route-weights "$3" --ids "$4" --force-ids "$5" \
        --logits-out "$6" -q ${KL_RUN_ARGS:-} > /dev/null
}

summary() {  # label, compare.py output
    python3 -c "import json,sys; d=json.loads(sys.argv[2]); print(sys.argv[1], 'max_rel_l2=%.3g' % d['max_rel_l2'], 'argmax_ok=%s' % d['argmax_ok'], 'PASS' if d['pass'] else 'FAIL')" "$1" "$2"
}

stage_golden() {
    local G=tests/fixtures/golden prompt
    prompt=$(cat $G/prompt.txt)
    rm -rf "$W/tiny-mxfp4"; "$KL" convert tests/fixtures/ref_tiny "$W/tiny-mxfp4" -q
    for name in tiny small4 heads4 multi tiny-mxfp4; do
        local dir=$G/$name
        [ $name = tiny ] && dir=tests/fixtures/ref_tiny
        [ $name = tiny-mxfp4 ] && dir=$W/tiny-mxfp4
        for route in unbiased biased; do
            local ref=$G/$name-$route.json tag=$name-$route greedy vocab
            greedy=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['greedy'])))" "$ref")
            vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab'])" "$ref")
            forced "$dir" gpu $route "$prompt" "$greedy" "$W/$tag-gpu.bin" || { row "$tag gpu run FAILED"; continue; }
            forced "$dir" cpu $route "$prompt" "$greedy" "$W/$tag-cpu.bin"
            row "$(summary "$tag gpu-vs-transformers" "$(python3 scripts/gpu/golden_compare.py --bound 2e-2 --margin 0.1 "$ref" "$W/$tag-gpu.bin")")"
            row "$(summary "$tag gpu-vs-cpu" "$(python3 scripts/gpu/golden_compare.py --bound 2e-2 --margin 0.1 --vocab $vocab "$W/$tag-cpu.bin" "$W/$tag-gpu.bin")")"
        done
        # the prompt in chunks vs one token at a time (its first id, the rest forced): the
        # chunked run's first row against the forced run's row after the whole prompt
        local first=${prompt%%,*} rest=${prompt#*,}
        forced "$dir" gpu unbiased "$first" "$rest" "$W/$name-tbt.bin" &&
            python3 - "$W/$name-unbiased-gpu.bin" "$W/$name-tbt.bin" $vocab "$name" <<'PY' | tee -a "$TABLE"
import struct, sys
chunked, tbt, vocab = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read(), int(sys.argv[3])
row = lambda raw, i: struct.unpack_from(f"<{vocab}f", raw, i * 4 * vocab)
a, b = row(chunked, 0), row(tbt, len(tbt) // (4 * vocab) - 1)
err = sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5 / (sum(y * y for y in b) ** 0.5 or 1)
same = max(range(vocab), key=lambda k: a[k]) == max(range(vocab), key=lambda k: b[k])
print(f"{sys.argv[4]} chunked-vs-token-by-token rel_l2={err:.3g} argmax_same={same}", "PASS" if err <= 2e-2 and same else "FAIL")
PY
    done
}

bench_one() {  # model, json out
    "$KL" bench decode "$1" --device gpu --prompt-tokens ${PROMPT_TOKENS:-8192} --tokens ${TOKENS:-32} \
        --decode-at ${AT:-0,8192,65536} --prefill-at ${PF:-512,8192} ${BT:+--batch-at $BT} \
        --json -q > "$2" ||
        { row "bench failed (rc $?)"; return 1; }
    python3 - "$2" <<'PY' | tee -a "$TABLE"
import json, sys
d = json.load(open(sys.argv[1]))
print("bench prefill %d tokens: %.0f tok/s; ttft %.2f s from process start; load %.2f s %.1f GB/s (%s, %d/%d windows pinned; upload %.2f s; pinned h2d %.1f GB/s; raw disk %.2f GB/s; host memcpy %.1f GB/s); host rss %.2f GB; gpu mem %.1f GB; hbm %.0f GB/s"
      % (d["prompt_tokens"], d["prefill_tok_s"], d["time_to_first_token_s"], d["load_s"], d["load_gbps"],
         d.get("load_how", ""), d.get("load_windows_pinned", 0), d.get("load_windows", 0), d["upload_s"],
         d["pinned_h2d_gbps"], d.get("disk_read_gbps", 0), d.get("host_copy_gbps", 0), d["peak_host_rss_bytes"] / 1e9, d["gpu_memory_used_bytes"] / 1e9, d["hbm_copy_gbps"]))
print("bench decode after the prefill: %.1f tok/s; %d launches per decode step" % (d["decode_tok_s"], d.get("launches_per_decode_step", 0)))
for a in d.get("prefill_at", []):
    print("bench prefill of %d tokens: %.0f tok/s" % (a["tokens"], a["prefill_tok_s"]))
for a in d.get("batch_at", []):
    print("bench batch of %d sequences: %.1f tok/s in all, %.2f ms per step" % (a["sequences"], a["decode_tok_s"], a["ms_per_step"]))
    p = a.get("profile_ms_per_step")
    if p:
        print("  profile ms per step: %s" % ", ".join("%s %.3f" % kv for kv in p.items() if not isinstance(kv[1], dict)))
        print("  parts: %s" % ", ".join("%s %.3f" % kv for kv in p["parts"].items()))
for a in d["decode_at_context"]:
    print("bench decode at context %d: %.1f tok/s, %.3f ms/token, %.3f GB/token, ratio %.3f"
          % (a["context"], a["decode_tok_s"], a["ms_per_token"], a["bytes_per_token"] / 1e9, a["ratio_to_ceiling"]))
PY
}

# tensor parallel on the GPU (issue 12): the golden fixtures and MXFP4 conversions of small4
# and heads4 at TP in $TPS (default "2 4") against the CPU engine at TP 1, teacher-forced on
# the reference's greedy ids; TP_CONFIG: settings for the GPU runs (e.g. KL_GPU_CHUNK=16, so
# that the prompt runs in skinny chunks)
stage_tpcheck() {
    local G=tests/fixtures/golden prompt name dir ref greedy vocab tp
    prompt=$(cat $G/prompt.txt)
    for name in small4 heads4; do
        rm -rf "$W/$name-mxfp4"; "$KL" convert $G/$name "$W/$name-mxfp4" -q
    done
    for name in tiny small4 heads4 multi small4-mxfp4 heads4-mxfp4; do
        dir=$G/$name ref=${name%-mxfp4}
        [ $name = tiny ] && dir=tests/fixtures/ref_tiny
        [ $name != $ref ] && dir=$W/$name
        greedy=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['greedy'])))" "$G/$ref-unbiased.json")
        vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab'])" "$G/$ref-unbiased.json")
        forced "$dir" cpu unbiased "$prompt" "$greedy" "$W/tp-$name-cpu.bin"
        for tp in ${TPS:-2 4}; do
            KL_RUN_ARGS="--tp $tp ${TP_ARGS:-}" with_config "${TP_CONFIG:-}" forced "$dir" gpu unbiased \
                "$prompt" "$greedy" "$W/tp-$name-$tp.bin" || { row "$name TP $tp: refused"; continue; }
            row "$(summary "$name gpu-tp$tp${TP_ARGS:+ $TP_ARGS}-vs-cpu-tp1 [${TP_CONFIG:-}]" "$(python3 scripts/gpu/golden_compare.py --bound 2e-2 --margin 0.1 --vocab $vocab "$W/tp-$name-cpu.bin" "$W/tp-$name-$tp.bin")")"
            [ $name = multi ] || [ $name = heads4 ] || continue
            # the captured step (every forced id a one-token step: graphs) against eager steps
            KL_GPU_GRAPHS=0 KL_RUN_ARGS="--tp $tp ${TP_ARGS:-}" with_config "${TP_CONFIG:-}" forced \
                "$dir" gpu unbiased "$prompt" "$greedy" "$W/tp-$name-$tp-eager.bin"
            if cmp -s "$W/tp-$name-$tp.bin" "$W/tp-$name-$tp-eager.bin"; then
                row "$name TP $tp graphs == eager (bytewise) PASS"
            else
                row "$(summary "$name TP $tp graphs-vs-eager (not bytewise)" "$(python3 scripts/gpu/golden_compare.py --bound 2e-2 --margin 0.1 --vocab $vocab "$W/tp-$name-$tp-eager.bin" "$W/tp-$name-$tp.bin")")"
            fi
        done
    done
}

# the full geometry loaded and decoded at each tensor-parallel size of TPLOADS (default
# "1 2 4"; the page cache warm): load s and GB/s, where the host memory peaked, time to first
# token, decode tok/s (ranks on one device take turns on its stream, one captured step: a
# cost, not the multi-GPU figure), launches per step, where the sums run
stage_tpbench() {
    local D="$W/full-mxfp4" tp
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --format mxfp4 --seed 11 -q
    cat "$D"/*.safetensors > /dev/null
    for tp in ${TPLOADS:-1 2 4}; do
        "$KL" bench decode "$D" --device gpu --tp $tp ${TP_ARGS:-} --prompt-tokens 64 --tokens 16 \
            --prefill-at ${TP_PREFILL:-8192} --json -q > "$W/tpbench-$tp.json" ||
            { row "tpbench TP $tp FAILED"; continue; }
        cp "$W/tpbench-$tp.json" "$OUT/"
        row "tpbench TP $tp ${TP_ARGS:-} $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('load %.2f s %.1f GB/s (%s; read %.2f GB, copied %.2f GB: %s per rank), host rss %.2f GB, ttft %.2f s, decode %.1f tok/s, %s launches/step, prefill %s, sums %s' % (d['load_s'], d['load_gbps'], d['load_how'], d['load_read_bytes']/1e9, d['load_copied_bytes']/1e9, '/'.join('%.2f' % (b / 1e9) for b in d.get('load_copied_bytes_per_rank', [])) or '-', d['peak_host_rss_bytes']/1e9, d['time_to_first_token_s'], d['decode_tok_s'], d.get('launches_per_decode_step'), ' '.join('%d: %.0f tok/s' % (p['tokens'], p['prefill_tok_s']) for p in d.get('prefill_at', [])) or '-', d.get('tp_sums', '-')))" "$W/tpbench-$tp.json")"
    done
}

# programmatic launches (KL_GPU_PDL=1) must not change a bit: teacher-forced logits (each
# forced id a one-token step, replayed as a decode graph), PDL off and on, compared bytewise
stage_pdl() {
    local G=tests/fixtures/golden prompt name greedy
    prompt=$(cat $G/prompt.txt)
    for name in small4 multi; do
        greedy=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['greedy'])))" "$G/$name-unbiased.json")
        KL_GPU_PDL=0 forced $G/$name gpu unbiased "$prompt" "$greedy" "$W/pdl0-$name.bin"
        KL_GPU_PDL=1 forced $G/$name gpu unbiased "$prompt" "$greedy" "$W/pdl1-$name.bin"
        if [ -s "$W/pdl0-$name.bin" ] && cmp -s "$W/pdl0-$name.bin" "$W/pdl1-$name.bin"; then
            row "$name teacher-forced logits PDL on == off (bytewise) PASS"
        else row "$name teacher-forced logits PDL on != off FAIL"; fi
    done
}

# kl serve on the GPU with the full geometry: one streamed request, then 1, 4 and 8
# concurrent streams (scripts/bench_serve.py); the server stopped with SIGINT.  SERVE_ARGS:
# more kl serve flags (e.g. --tp 2); SERVE_TAG names the copied bench-serve json;
# SERVE_SAMPLING: bench_serve.py's sampling flags (e.g. "--temperature 1 --top-p 0.95"); KL:
# another kl binary (default build/gpu-cuda/kl)
stage_serve() {
    local D="$W/full-mxfp4" pid port
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --format mxfp4 --seed 11 -q
    "$KL" serve "$D" --device gpu --port 0 --json -q ${SERVE_ARGS:-} > "$W/serve.json" \
        2> "$W/serve.err" &
    pid=$!
    [ -z "${SERVE_ARGS:-}" ] || row "serve with ${SERVE_ARGS}"
    for _ in $(seq 120); do [ -s "$W/serve.json" ] && break; sleep 1; done
    port=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['port'])" "$W/serve.json") ||
        { row "serve did not start: $(tail -2 "$W/serve.err")"; kill $pid; return; }
    # state reuse: the second turn of a conversation resumes from the first's snapshot
    python3 - "http://127.0.0.1:$port" "$D" <<'PY' | tee -a "$TABLE"
import json, sys, time, urllib.request
def chat(msgs):
    body = json.dumps({"model": sys.argv[2], "messages": msgs, "max_tokens": 16, "temperature": 0}).encode()
    t0 = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(sys.argv[1] + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}), timeout=600) as r:
        d = json.load(r)
    return d, time.perf_counter() - t0
first = [{"role": "user", "content": "Tell me about the sea and the wind. " * 40}]
a, ta = chat(first)
b, tb = chat(first + [a["choices"][0]["message"], {"role": "user", "content": "And the mountains?"}])
u = b["usage"]
print("serve reuse: turn 2 prompt %d tokens, cached %d; turn 1 %.3f s, turn 2 %.3f s"
      % (u["prompt_tokens"], u.get("prompt_tokens_details", {}).get("cached_tokens", 0), ta, tb))
PY
    python3 scripts/bench_serve.py --url "http://127.0.0.1:$port" --model "$D" \
        --streams ${SERVE_STREAMS:-1,4,8} --requests 2 --max-tokens 64 ${SERVE_SAMPLING:-} \
        > "$W/bench-serve.json" &&
        python3 - "$W/bench-serve.json" <<'PY' | tee -a "$TABLE"
import json, sys
for lv in json.load(open(sys.argv[1]))["levels"]:
    print("serve %d streams: %.1f output tok/s (x%.2f), ttft p50 %.3f s, itl p50 %.2f ms"
          % (lv["streams"], lv["output_tok_s"], lv["speedup_vs_first"], lv["ttft_p50_s"], lv["itl_p50_s"] * 1e3))
PY
    kill -INT $pid; wait $pid; row "serve stopped: rc $?"
    cp "$W/bench-serve.json" "$OUT/bench-serve${SERVE_TAG:-}.json" 2>/dev/null
}

# kl run on the GPU with the full geometry, 128 tokens from one 64-id prompt and seed, once per
# flag set of SAMPLED_FLAGS (";" between sets; default temperature 0.8, top-p 0.95, top-k 40
# and greedy), SAMPLED_REPS (2) rounds; with KL_OLD (another kl binary, beside build/gpu-cuda
# for its libraries) that binary too, each set in turn: a row per run with decode tok/s and
# the md5 of the generated ids (equal ids: the same sampling)
SAMPLED_FLAGS_DEFAULT="--temp 0.8;--temp 1 --top-p 0.95;--temp 0.7 --top-k 40;--temp 0"
stage_sampled() {
    local D="$W/full-mxfp4" p IFS=';' flags bin r args
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --format mxfp4 --seed 11 -q
    p=$(python3 -c "import random; r=random.Random(5); print(','.join(str(r.randrange(1, 160000)) for _ in range(64)))")
    for ((r = 0; r < ${SAMPLED_REPS:-2}; r++)); do
        for flags in ${SAMPLED_FLAGS:-$SAMPLED_FLAGS_DEFAULT}; do
            IFS=' ' read -ra args <<< "$flags"
            for bin in "$KL" ${KL_OLD:-}; do
                "$bin" run "$D" --device gpu --ids "$p" -n 128 --seed 7 "${args[@]}" --json -q \
                    > "$W/sampled.json" 2> "$W/sampled.err" || { row "sampled $(basename "$bin") [$flags] FAILED: $(tail -1 "$W/sampled.err")"; continue; }
                row "sampled $(basename "$bin") [$flags] $(python3 -c "import hashlib,json,sys; d=json.load(open(sys.argv[1])); print('%.1f tok/s ids %s' % (d['decode_tok_s'], hashlib.md5(str(d['generated_ids']).encode()).hexdigest()[:8]))" "$W/sampled.json")"
            done
        done
    done
}

# the full geometry, GPU against CPU on a FULL_PROMPT-token prompt (64) once per configuration of
# FULL_CONFIGS (as GOLDEN_CONFIGS), with the relative L2 of every step
stage_fullcmp() {
    local D="$W/full-mxfp4" p f IFS=';' cfg i=0 np=${FULL_PROMPT:-64}
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --format mxfp4 --seed 11 -q
    p=$(python3 -c "import random,sys; r=random.Random(5); print(','.join(str(r.randrange(1, 160000)) for _ in range(int(sys.argv[1]))))" $np)
    f=$(python3 -c "import random; r=random.Random(6); print(','.join(str(r.randrange(1, 160000)) for _ in range(8)))")
    IFS=' ' forced "$D" cpu unbiased "$p" "$f" "$W/full-cpu.bin"
    for cfg in ${FULL_CONFIGS:-" "}; do
        i=$((i + 1))
        with_config "$cfg" forced "$D" gpu unbiased "$p" "$f" "$W/full-gpu-$i.bin"
        IFS=' ' python3 scripts/gpu/golden_compare.py --bound 2e-2 --margin 0.1 --vocab 163840 "$W/full-cpu.bin" "$W/full-gpu-$i.bin" > "$W/fullcmp-$i.json"
        row "full-$np [${cfg# }] $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('max %.3g' % d['max_rel_l2'], 'PASS' if d['pass'] else 'FAIL', 'steps:', ' '.join('%.2g' % s['rel_l2'] for s in d['per_step']))" "$W/fullcmp-$i.json")"
    done
}

# the full geometry with a long prompt in chunks of 256 against larger chunks (CHUNKS, default
# "1024 4096"), GPU only: the chunk size must not change the logits beyond rounding
stage_chunks() {
    local D="$W/full-mxfp4" p f c
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --format mxfp4 --seed 11 -q
    p=$(python3 -c "import random; r=random.Random(7); print(','.join(str(r.randrange(1, 160000)) for _ in range(${CHUNK_PROMPT:-4096})))")
    f=$(python3 -c "import random; r=random.Random(8); print(','.join(str(r.randrange(1, 160000)) for _ in range(4)))")
    KL_GPU_CHUNK=256 forced "$D" gpu unbiased "$p" "$f" "$W/chunk-256.bin"
    for c in ${CHUNKS:-1024 4096}; do
        KL_GPU_CHUNK=$c forced "$D" gpu unbiased "$p" "$f" "$W/chunk-$c.bin" || { row "chunk $c run FAILED"; continue; }
        row "$(summary "full-${CHUNK_PROMPT:-4096} chunk $c vs 256" "$(python3 scripts/gpu/golden_compare.py --bound 2e-2 --margin 0.1 --vocab 163840 "$W/chunk-256.bin" "$W/chunk-$c.bin")")"
    done
}

# Nsight Compute's duration of every kernel of a prompt of one token and NCU_FORCED forced
# tokens (one-token steps, graphs off so each launch is seen), summed per kernel name:
# where a decode step's time goes, without launch gaps (ncu serialises the kernels).
# NCU_PROMPT=N instead profiles a prompt of N random ids (prefill, in chunks of KL_GPU_CHUNK)
# and prints milliseconds per kernel name over the whole prompt.
stage_ncu() {
    local D="$W/full-mxfp4" ncu ids steps
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --format mxfp4 --seed 11 -q
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
    [ -n "$ncu" ] || { row "ncu: not found"; return; }
    if [ -n "${NCU_PROMPT:-}" ]; then
        ids=$(python3 -c "import random,sys; r=random.Random(7); print(','.join(str(r.randrange(1, 160000)) for _ in range(int(sys.argv[1]))))" "$NCU_PROMPT")
        steps=prompt
    else
        ids=1; steps=$((1 + $(echo "${NCU_FORCED:-2,3}" | tr ',' '\n' | wc -l)))
    fi
    KL_GPU_GRAPHS=0 timeout ${NCU_TIMEOUT:-300} "$ncu" --clock-control none --csv --metrics gpu__time_duration.sum \
        "$KL" run "$D" --device gpu --ids "$ids" --force-ids ${NCU_FORCED:-2,3} --logits-out "$W/ncu.bin" -q \
        ${KL_RUN_ARGS:-} > "$W/ncu.csv" 2> "$W/ncu.err" || { row "ncu failed: $(tail -3 "$W/ncu.err")"; return; }
    cp "$W/ncu.csv" "$OUT/ncu-${NCU_PROMPT:-decode}${NCU_TAG:-}.csv" 2>/dev/null
    [ -z "${KL_RUN_ARGS:-}" ] || row "ncu with kl run ${KL_RUN_ARGS}"
    python3 - "$W/ncu.csv" "$steps" <<'PY' | tee -a "$TABLE"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
ki, ui, vi = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
per, cnt = collections.defaultdict(float), collections.Counter()
for r in rows:
    name = r[ki].split("(")[0].split("<")[0].replace("void ", "")
    per[name] += float(r[vi].replace(",", "")) * scale.get(r[ui], 1.0)
    cnt[name] += 1
tot = sum(per.values())
if sys.argv[2] == "prompt":  # the whole run: load kernels, the prompt's chunks, 3 short steps
    print("ncu prompt: %d kernels, %.1f ms (sum of kernel durations)" % (sum(cnt.values()), tot / 1e3))
    for name, us in sorted(per.items(), key=lambda kv: -kv[1])[:30]:
        print("ncu  %-44s %9.2f ms  %6d launches  %5.1f%%" % (name[:44], us / 1e3, cnt[name], 100 * us / tot))
    sys.exit(0)
steps = int(sys.argv[2])
print("ncu: %d kernels, %.1f us per one-token step (sum of kernel durations, %d steps)" % (sum(cnt.values()), tot / steps, steps))
for name, us in sorted(per.items(), key=lambda kv: -kv[1])[:25]:
    print("ncu  %-40s %8.1f us/step  %5d launches/step  %5.1f%%" % (name[:40], us / steps, cnt[name] // steps, 100 * us / tot))
PY
}

# the kernel timeline of greedy decode on the full model, graphs and programmatic launches as
# in a real step (tests/gpu/kernel_trace.c injected into kl run; make GPU=cuda gpu-trace):
# scripts/gpu/trace_step.py's time per kernel and grid, and one median step kernel by kernel
# (in $OUT).  Once per configuration of TRACE_CONFIGS (as GOLDEN_CONFIGS); TRACE_TOKENS (64).
stage_trace() {
    local D="$W/full-mxfp4" IFS=';' cfg i=0
    [ -f "$BG/libkernel_trace.so" ] || { row "trace: no $BG/libkernel_trace.so (make GPU=cuda gpu-trace)"; return; }
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --format mxfp4 --seed 11 -q
    for cfg in ${TRACE_CONFIGS:-" "}; do
        i=$((i + 1))
        row "== trace with [${cfg# }]"
        CUDA_INJECTION64_PATH="$BG/libkernel_trace.so" KL_TRACE_OUT="$W/trace-$i.txt" with_config "$cfg" \
            "$KL" run "$D" --device gpu --ids 1 -n ${TRACE_TOKENS:-64} > /dev/null 2> "$W/trace-run.err" ||
            { row "trace run failed: $(tail -2 "$W/trace-run.err")"; continue; }
        row "trace kl run: $(grep -i "tok/s" "$W/trace-run.err" | tail -1)"
        IFS=' ' python3 scripts/gpu/trace_step.py "$W/trace-$i.txt" --show-step > "$OUT/trace-step-$i.txt"
        grep -v "^step " "$OUT/trace-step-$i.txt" | head -${TRACE_ROWS:-45} | tee -a "$TABLE"
    done
}

# Nsight Compute's sections for a few launches of the kernels NCU_KERNELS (a regex) in a
# prompt of NCU_PROMPT ids (default 1,024; the configuration's environment applies): what
# binds them (tensor pipe, issue, shared memory, stalls).  NCU_SKIP launches are skipped first.
stage_ncukernel() {
    local D="$W/full-mxfp4" ncu ids
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --format mxfp4 --seed 11 -q
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
    [ -n "$ncu" ] || { row "ncu: not found"; return; }
    # why warps wait: cycles stalled per issued instruction, by reason
    local r NCU_STALLS=""
    for r in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait \
        not_selected dispatch_stall lg_throttle no_instruction branch_resolving; do
        NCU_STALLS+=",smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
    done
    ids=$(python3 -c "import random,sys; r=random.Random(7); print(','.join(str(r.randrange(1, 160000)) for _ in range(int(sys.argv[1]))))" "${NCU_PROMPT:-1024}")
    KL_GPU_GRAPHS=0 timeout ${NCU_TIMEOUT:-300} "$ncu" --clock-control none -k "regex:${NCU_KERNELS:-mt_}" \
        --launch-skip ${NCU_SKIP:-6} --launch-count ${NCU_COUNT:-2} \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum$NCU_STALLS \
        "$KL" run "$D" --device gpu --ids "$ids" -n 1 -q > "$W/ncuk.txt" 2> "$W/ncuk.err" ||
        { row "ncu failed: $(tail -3 "$W/ncuk.err")"; return; }
    grep -v "^==PROF==" "$W/ncuk.txt" | grep -E "mt_|gemm|${NCU_KERNELS:-mt_}|Duration|Throughput|Pipe|hmma|Issue|Stall|Warp Cycles|Eligible|Active Warps|Occupancy|bank|inst_executed|Registers|Shared Memory|Block Limit|No Eligible|One or More|issue_stalled" | cut -c1-150 | tee -a "$TABLE"
}

# CPU batching (issue 11) on this machine's cores: the server on CPUS_SERVER (with
# CPU_SERVE_ARGS, e.g. --cache-mb 0), the client on the others, small preset with MXFP4
# experts, scripts/bench_serve.py at CPU_STREAMS
stage_cpubatch() {
    local D="$W/small-mxfp4" pid port srv=${CPUS_SERVER:-0-7} cli=${CPUS_CLIENT:-8-15}
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset small --format mxfp4 --seed 11 -q
    taskset -c "$srv" "$KL" serve "$D" --device cpu --port 0 --threads ${CPU_THREADS:-8} \
        ${CPU_SERVE_ARGS:-} --json -q > "$W/serve-cpu.json" 2> "$W/serve-cpu.err" &
    pid=$!
    for _ in $(seq 120); do [ -s "$W/serve-cpu.json" ] && break; sleep 1; done
    port=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['port'])" "$W/serve-cpu.json") ||
        { row "cpu serve did not start: $(tail -2 "$W/serve-cpu.err")"; kill $pid; return; }
    taskset -c "$cli" python3 scripts/bench_serve.py --url "http://127.0.0.1:$port" --model "$D" \
        --streams ${CPU_STREAMS:-1,4,16} ${CPU_BENCH_ARGS:-} | tee -a "$TABLE"
    kill -INT $pid; wait $pid
}

stage_full() {
    local D="$W/full-mxfp4" p f
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --format mxfp4 --seed 11 -q
    p=$(python3 -c "import random; r=random.Random(5); print(','.join(str(r.randrange(1, 160000)) for _ in range(64)))")
    f=$(python3 -c "import random; r=random.Random(6); print(','.join(str(r.randrange(1, 160000)) for _ in range(8)))")
    [ "${FULLCPU:-1}" = 0 ] || { forced "$D" gpu unbiased "$p" "$f" "$W/full-gpu.bin" && forced "$D" cpu unbiased "$p" "$f" "$W/full-cpu.bin" &&
        row "$(summary "full-64 gpu-vs-cpu" "$(python3 scripts/gpu/golden_compare.py --bound 2e-2 --margin 0.1 --vocab 163840 "$W/full-cpu.bin" "$W/full-gpu.bin")")"; }
    [ -z "${NOGRAPHS:-}" ] || { KL_GPU_GRAPHS=0 "$KL" bench decode "$D" --device gpu --prompt-tokens 64 --tokens 32 --json -q > "$W/bench-nographs.json" &&
        row "bench ctx=64 without graphs: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('decode %.1f tok/s' % d['decode_tok_s'])" "$W/bench-nographs.json")"; }
    # the load paths compared (LOADS="host read"): KL_GPU_LOAD=host is the old one (host model, then copies)
    for how in ${LOADS:-}; do
        KL_GPU_LOAD=$how "$KL" bench decode "$D" --device gpu --prompt-tokens 64 --tokens 8 --json -q > "$W/bench-load-$how.json" &&
            row "bench load KL_GPU_LOAD=$how $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('load %.2f s %.1f GB/s, ttft %.2f s, host rss %.2f GB' % (d['load_s'], d['load_gbps'], d['time_to_first_token_s'], d['peak_host_rss_bytes']/1e9))" "$W/bench-load-$how.json")"
    done
    # the shards read once (the raw disk read rate; then the page cache is warm)
    local t0=$SECONDS bytes
    [ "${RAWREAD:-1}" = 0 ] || { bytes=$(cat "$D"/*.safetensors | wc -c)
        row "raw read of the shards (cat): $((bytes / 1000000)) MB in $((SECONDS - t0)) s"; }
    # time to first token of a short prompt, the page cache warm
    "$KL" bench decode "$D" --device gpu --prompt-tokens 64 --tokens 8 --json -q > "$W/bench-ttft.json" &&
        row "bench ttft (64-token prompt, warm page cache) $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('%.2f s; load %.2f s %.1f GB/s (%s; pinned h2d %.1f GB/s, ratio %.2f); raw disk %.2f GB/s' % (d['time_to_first_token_s'], d['load_s'], d['load_gbps'], d['load_how'], d['pinned_h2d_gbps'], d['load_gbps'] / d['pinned_h2d_gbps'], d.get('disk_read_gbps', 0)))" "$W/bench-ttft.json")"
    # per-operation shares (KL_GPU_PROFILE=1: graphs off, a sync per operation)
    [ -z "${PROFILE:-}" ] || { KL_GPU_PROFILE=1 "$KL" bench decode "$D" --device gpu --prompt-tokens ${PROFILE_PROMPT:-2048} --tokens 16 --json -q > "$W/bench-profile.json" &&
        python3 - "$W/bench-profile.json" <<'PY' | tee -a "$TABLE"; }
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("profile_prefill_ms", "profile_decode_ms_per_token"):
    ops = {a: b for a, b in d[k].items() if not isinstance(b, dict)}
    print("profile %s: %s" % (k, ", ".join("%s %.3f" % kv for kv in ops.items())))
    print("profile %s parts: %s" % (k, ", ".join("%s %.3f" % kv for kv in d[k].get("parts", {}).items())))
PY
    # tmpfs (SHM=1): the model copied to /dev/shm and loaded from there
    [ -z "${SHM:-}" ] || { rm -rf /dev/shm/klm; cp -r "$D" /dev/shm/klm && "$KL" bench decode /dev/shm/klm --device gpu --prompt-tokens 64 --tokens 8 --json -q > "$W/bench-shm.json" &&
        row "bench load from /dev/shm $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('load %.2f s %.1f GB/s (%s; pinned h2d %.1f GB/s), ttft %.2f s' % (d['load_s'], d['load_gbps'], d['load_how'], d['pinned_h2d_gbps'], d['time_to_first_token_s']))" "$W/bench-shm.json")"; rm -rf /dev/shm/klm; }
    # one load per configuration of BENCH_CONFIGS (as GOLDEN_CONFIGS): prefill of PROMPT ids
    # (default 8192), decode after it, then decode at each synthetic context of AT
    # (kl bench decode --decode-at), prefill at each length of PF
    local IFS=';' cfg i=0
    for cfg in ${BENCH_CONFIGS:-" "}; do
        i=$((i + 1))
        row "== bench with [${cfg# }]"
        with_config "$cfg" bench_one "$D" "$W/bench-$i.json"
        cp "$W/bench-$i.json" "$OUT/" 2>/dev/null
    done
    [ -n "${KEEP:-}" ] || rm -rf "$D"
}

# the GPU load once per configuration of LOAD_CONFIGS (as GOLDEN_CONFIGS; default: the list
# below) from the page cache (the shards read once first) and from tmpfs (the model copied to
# /dev/shm; LOAD_FROM="page-cache" skips it), REPS (1) times each: one row per run with load
# s, GB/s, ratio to the pinned copy rate of the same run, the phases (kl bench decode's
# load_phases), the fill's own rate, peak host RSS and time to first token (64-token prompt)
LOAD_CONFIGS_DEFAULT=" ;KL_GPU_LOAD_OVERLAP=0;KL_GPU_LOAD_HUGE=0"
LOAD_CONFIGS_DEFAULT+=";KL_GPU_LOAD_THREADS=4;KL_GPU_LOAD_THREADS=12;KL_GPU_LOAD_THREADS=16"
LOAD_CONFIGS_DEFAULT+=";KL_GPU_LOAD_THREADS=12 KL_GPU_LOAD_BUFFERS=24"
LOAD_CONFIGS_DEFAULT+=";KL_GPU_LOAD_WINDOW_MB=8 KL_GPU_LOAD_BUFFERS=24"
LOAD_CONFIGS_DEFAULT+=";KL_GPU_LOAD_WINDOW_MB=4 KL_GPU_LOAD_BUFFERS=32;KL_GPU_LOAD_WINDOW_MB=32"
LOAD_CONFIGS_DEFAULT+=";KL_GPU_LOAD=mapped;KL_GPU_LOAD=mapped KL_GPU_LOAD_THREADS=8"
LOAD_CONFIGS_DEFAULT+=";KL_GPU_LOAD=hybrid;KL_GPU_LOAD=hybrid KL_GPU_LOAD_MAPPED_PERCENT=50"
LOAD_CONFIGS_DEFAULT+=";KL_GPU_LOAD=hybrid KL_GPU_LOAD_MAPPED_PERCENT=20 KL_GPU_LOAD_THREADS=12"
# another process holding a context on the device while a configuration naming HOLD_DEVICE=1
# loads (what a persistence daemon or a running server gives: the driver's start without the
# device's own initialisation); hold_device_stop ends it
hold_device_start() {
    rm -f "$W/hold.ready"
    python3 -c "import sys, time, torch; torch.zeros(1, device='cuda')
open(sys.argv[1], 'w').write('ready'); time.sleep(3600)" "$W/hold.ready" &
    HOLD_PID=$!
    for ((t = 0; t < 300; t++)); do [ -f "$W/hold.ready" ] && return; sleep 0.1; done
    row "loadsweep: the holding process did not start"
}
hold_device_stop() {
    [ -n "${HOLD_PID:-}" ] || return 0
    kill "$HOLD_PID" 2>/dev/null; wait "$HOLD_PID" 2>/dev/null; HOLD_PID=
}
load_row() {  # where, configuration, bench json
    python3 - "$@" <<'PY' | tee -a "$TABLE"
import json, sys
where, cfg, path = sys.argv[1:4]
d = json.load(open(path))
ph = d.get("load_phases", {})
pin = d.get("pinned_h2d_gbps", 0) or 1
fd = d.get("load_fill_detail", {})
print("loadsweep %-10s [%s] load %.3f s %.1f GB/s ratio %.2f (pinned %.1f, host memcpy %.1f; after the device's start %.3f s, ratio %.2f) | %s | fill %.1f GB/s (%s) | %s %dx%dMiB %s threads %d lanes %d | rss %.2f GB | ttft %.2f s"
      % (where, cfg.strip() or "defaults", d["load_s"], d["load_gbps"], d["load_gbps"] / pin, d.get("pinned_h2d_gbps", 0),
         d.get("host_copy_gbps", 0), d.get("load_after_device_start_s", 0),
         d.get("load_after_device_start_ratio", 0),
         " ".join("%s %.3f" % kv for kv in ph.items()), d.get("load_fill_gbps", 0),
         " ".join("%s %.2f" % kv for kv in fd.items()), d.get("load_how", ""),
         d.get("load_buffers", 0), d.get("load_buffer_bytes", 0) >> 20, d.get("load_buffer_mem", ""),
         d.get("load_threads", 0), d.get("load_lanes", 0), d["peak_host_rss_bytes"] / 1e9,
         d["time_to_first_token_s"]))
PY
}

stage_loadsweep() {
    local D="$W/full-mxfp4" S=/dev/shm/kl-loadsweep IFS=';' cfg where dir i=0 r
    [ -f "$D/config.json" ] || "$KL" synth "$D" --preset full --format mxfp4 --seed 11 -q
    IFS=' '; cat "$D"/*.safetensors > /dev/null   # the page cache warm
    local froms=${LOAD_FROM:-"page-cache tmpfs"}
    case " $froms " in *" tmpfs "*) rm -rf "$S"; cp -r "$D" "$S" || { row "loadsweep: no room in /dev/shm"; froms=page-cache; } ;; esac
    # read once, as the page cache's files were: on this VM the first read of memory just
    # written runs at about half speed, whoever reads it (session 24)
    case " $froms " in *" tmpfs "*) local t0=$(date +%s.%N); cat "$S"/*.safetensors > /dev/null
        row "loadsweep: tmpfs read once after the copy in $(python3 -c "print('%.2f' % ($(date +%s.%N) - $t0))") s" ;; esac
    for where in $froms; do
        dir=$D; [ $where = tmpfs ] && dir=$S
        IFS=';'
        for cfg in ${LOAD_CONFIGS:-$LOAD_CONFIGS_DEFAULT}; do
            case "$cfg" in *HOLD_DEVICE=1*) hold_device_start ;; esac
            for ((r = 0; r < ${REPS:-1}; r++)); do
                i=$((i + 1))
                IFS=' ' with_config "$cfg" "$KL" bench decode "$dir" --device gpu --prompt-tokens 64 --tokens 4 --json -q > "$W/loadsweep-$i.json" &&
                    IFS=' ' load_row "$where" "$cfg" "$W/loadsweep-$i.json" || row "loadsweep $where [$cfg] FAILED"
                cp "$W/loadsweep-$i.json" "$OUT/" 2>/dev/null
            done
            hold_device_stop
        done
    done
    rm -rf "$S"
    [ -n "${KEEP:-}" ] || rm -rf "$D"
}

# the device's start in fresh processes (tests/gpu/test_start.cu), REPS (3) times under each
# configuration of START_CONFIGS (default: as the environment is, and with another process
# holding the device): a row a run, with the process's whole wall time beside its steps
stage_start() {
    local IFS=';' cfg r t0 t1 list=${START_CONFIGS:-" ;HOLD_DEVICE=1"}
    for cfg in $list; do   # (a quoted default inside the loop's word would not split)
        case "$cfg" in *HOLD_DEVICE=1*) hold_device_start ;; esac
        for ((r = 0; r < ${REPS:-3}; r++)); do
            t0=$(date +%s.%N)
            IFS=' ' with_config "$cfg" "$BG/test_start" > "$W/start.json" || { row "start [$cfg] FAILED"; continue; }
            t1=$(date +%s.%N)
            row "start [${cfg# }] process $(python3 -c "print('%.3f' % ($t1 - $t0))") s $(cat "$W/start.json")"
        done
        hold_device_stop
    done
}

# the golden stage once per configuration of GOLDEN_CONFIGS ("A=1 B=2;C=3": environment
# assignments, ";" between configurations; default: one run as the environment is)
golden_configs() {
    local IFS=';' cfg
    for cfg in ${GOLDEN_CONFIGS:-" "}; do
        row "== golden with [${cfg# }]"
        with_config "$cfg" stage_golden
    done
}
for s in $STAGES; do
    echo "== stage $s $(date -u +%T)"
    if [ $s = golden ]; then golden_configs; else stage_$s; fi
done
echo "== table"; cat "$TABLE"
echo "== done $(date -u +%FT%TZ)"
