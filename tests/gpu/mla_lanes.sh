#!/bin/sh
# tests/gpu/mla_lanes.sh — attend4 (kernels/mla.cu, MLA decode v4) run on the CPU at lane level:
# its device code (the HIP stand-in path: the mma.m16n8k16 fragments gathered by shuffles) is
# cut out of mla.cu verbatim and compiled with tests/gpu/mla_lanes.cpp, which runs each block
# as 256 threads (barriers for __syncthreads, shuffles and the MMA's gathers) and checks the
# combined split results against an attention in double; cp.async copies land only at the
# cp.async wait that completes their group (a read before it shows).  No GPU; minutes at the
# full shape.
# With "mha" first: mha_kernel (the prefill in MHA form) over a prompt of N tokens at
# positions POS0.. (its expanded keys and values filled at random), against double; "mha2":
# its v2 (mha_planes_kernel, mha2_kernel).
# Usage: sh tests/gpu/mla_lanes.sh [NH DR R SPLITS SPAN... | mha|mha2 NH DN DR DV R POS0 N]
# (default: two tiny cases of each; the MHA form at the full head shape:
# sh tests/gpu/mla_lanes.sh mha 1 128 64 128 32 5 70: 6.4e-6, a minute; mha2 likewise)
set -e
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
P='^typedef struct (mla_scratch|attend_ctx)|^__device__ static inline [a-z0-9_]+ '
P="$P(split_rows|bf16_bits|bf16_val|put_bf16x4|put_split4|row_max8|row_update8)\\("
awk -v p="$P" '$0 ~ p {f = 1} f {print} f && /^}/ {f = 0}' kernels/mla.cu > "$T/mla_lanes_deps.inc"
awk '/MHA form for the prefill of one prompt/ {f = 0} /Attend, v4:/ {f = 1; print prev} f {print}
     {prev = $0}' kernels/mla.cu > "$T/mla_lanes_v4.inc"
awk '/^static int check_attend/ {f = 0} /MHA form for the prefill of one prompt/ {f = 1}
     f {print}' kernels/mla.cu > "$T/mla_lanes_mha.inc"
${CXX:-g++} -std=c++17 -O2 -w -I. -I"$T" -o "$T/mla_lanes" tests/gpu/mla_lanes.cpp -lpthread
if [ $# -gt 0 ]; then
    "$T/mla_lanes" "$@"
else
    "$T/mla_lanes" 4 8 32 3 1 17 70
    "$T/mla_lanes" 3 4 16 5 1 2 300
    "$T/mla_lanes" mha 2 32 16 32 64 0 100
    "$T/mla_lanes" mha 3 32 16 32 64 37 70
    "$T/mla_lanes" mha2 2 32 16 32 64 0 100
    "$T/mla_lanes" mha2 3 32 16 32 64 37 170
fi
