#!/bin/sh
# tests/gpu/skinny_lanes.sh — kernels/skinny.cu's kernels and plan (skinny_kernel,
# skinny_sum_kernel, sk_plan_for) run on the CPU at lane level by tests/gpu/skinny_lanes.cpp:
# the code from sk_part to the launchers' section is cut out of skinny.cu verbatim (with its
# SK_ constants), the split of x out of gemm_split.cuh; each block runs as its threads with
# barriers for __syncthreads and the MMA, whose fragments are gathered as the PTX ISA lays them
# out.  Checks against double (<= 1e-6).  No GPU; seconds to minutes.
# Usage: sh tests/gpu/skinny_lanes.sh [bf16|bf16v2|mxfp4 ROWS COLS N [RES8 RES4 [PARTS]]]
# (default: partial warps and tiles, one granule, several stages in a split, uneven splits,
# every n8 tile count, both kinds, BF16 in both versions' steps, outputs in row parts with
# and without K splits)
set -e
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
awk '/^#define SK_/ {print} /^static __device__ float sk_part/ {f = 1}
     /^\/\* ---- launchers/ {f = 0} f {print}' kernels/skinny.cu > "$T/skinny_lanes_kernel.inc"
awk '/^template <int SP>$/ || /^KL_HD static inline uint32_t kl_gt_/ {f = 1} f {print}
     f && /^}/ {f = 0}' kernels/gemm_split.cuh > "$T/skinny_lanes_split.inc"
${CXX:-g++} -std=c++17 -O2 -w -I. -I"$T" -o "$T/skinny_lanes" tests/gpu/skinny_lanes.cpp -lpthread
if [ $# -gt 0 ]; then
    "$T/skinny_lanes" "$@"
else
    "$T/skinny_lanes" bf16 37 128 2
    "$T/skinny_lanes" mxfp4 37 128 7
    "$T/skinny_lanes" bf16 300 640 13 1000 1000
    "$T/skinny_lanes" mxfp4 300 640 9 1000 1000
    "$T/skinny_lanes" bf16 64 2304 31 1 1
    "$T/skinny_lanes" mxfp4 64 2304 5 1 1
    "$T/skinny_lanes" bf16 40 1024 16 1 1
    "$T/skinny_lanes" bf16v2 300 640 3 1000 1000
    "$T/skinny_lanes" bf16v2 64 2304 12 1 1
    "$T/skinny_lanes" bf16v2 512 1152 27 10 10
    "$T/skinny_lanes" bf16 300 640 13 1000 1000 6
    "$T/skinny_lanes" mxfp4 200 256 9 1 1 3
    "$T/skinny_lanes" mxfp4 64 1024 32 1 1
    "$T/skinny_lanes" bf16 512 1152 5 10 10
    "$T/skinny_lanes" mxfp4 512 1152 20 10 10
fi
