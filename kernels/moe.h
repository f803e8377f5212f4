/*
 * kernels/moe.h — the routed mixture of experts on the GPU (kimi-linear.md §3.4): router
 * top-k, the selected experts' SiLU-gated MLPs, and the weighted sum.  Conventions:
 * kernels/gpu_api.h.
 *
 * Router (steps 1-4): s = sigmoid(logit); selection score s + bias (bias may be NULL); the
 * top_k largest selection scores (ties: the lowest expert id), in descending order; weight
 * s (or s + bias when biased_weights) of each, divided by their sum + 1e-20 when renormalize,
 * times scaling.
 *
 * Experts (step 5-6): for token t and its k-th choice e = idx[t, k] with weight w = wt[t, k]:
 *     h = SiLU(w1_e x_t) ⊙ (w3_e x_t)          (w1 gate, w3 up: [I, H] each)
 *     y_t = Σ_k w · (w2_e h)                    (w2 down: [H, I]), summed in k order
 * only the selected experts' weights are read; any stored kind (MXFP4 the one that matters).
 * add_to_y: y_t += the sum instead of y_t = (the shared experts' output already in y).
 * An id KL_GPU_EXPERT_ELSEWHERE (an expert another tensor-parallel rank holds: expert
 * parallel) adds nothing; any other id outside [0, E) makes its token's outputs NaN.
 */
#ifndef KL_KERNELS_MOE_H
#define KL_KERNELS_MOE_H

#include "kernels/gpu_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KL_GPU_EXPERT_ELSEWHERE (-2)

typedef struct kl_gpu_route_args {
    const float *logits;      /* [n, n_experts] router logits (fp32) */
    const float *bias;        /* [n_experts] e_score_correction_bias, or NULL */
    uint32_t     n, n_experts, top_k;   /* top_k <= 64 and <= n_experts */
    int          biased_weights;        /* 1: weights from s + bias (HF remote code) */
    int          renormalize;
    float        scaling;               /* routed_scaling_factor */
    int32_t     *idx;         /* [n, top_k] out: chosen experts, descending selection score */
    float       *wt;          /* [n, top_k] out: their weights */
    /* expert parallel: the rank holds experts [first, first + held); each chosen id is written
     * local to it (id - first) or KL_GPU_EXPERT_ELSEWHERE (its weight kept).  held 0: every
     * expert, ids as chosen */
    uint32_t     first, held;
} kl_gpu_route_args;

int kl_gpu_route(const kl_gpu_route_args *a, kl_gpu_stream s, kl_err *err);

typedef struct kl_gpu_experts_args {
    const kl_gpu_stack *w1, *w2, *w3;   /* gate [E, I, H], down [E, H, I], up [E, I, H] */
    const float   *x;         /* [n, H] normed input */
    uint32_t       n, top_k;
    const int32_t *idx;       /* [n, top_k] */
    const float   *wt;        /* [n, top_k] */
    float         *scratch;   /* kl_gpu_experts_scratch(n, top_k, I, H) floats */
    float         *y;         /* [n, H] out */
    int            add_to_y;
} kl_gpu_experts_args;

/* Floats of scratch kl_gpu_experts needs for n tokens (n >= kl_gpu_experts_grouped_min(): room
 * for the grouped path, which needs at most 1024 experts). */
size_t kl_gpu_experts_scratch(uint32_t n, uint32_t top_k, uint32_t inter, uint32_t hidden);
int    kl_gpu_experts(const kl_gpu_experts_args *a, kl_gpu_stream s, kl_err *err);

/* Chunks of fewer tokens run the per-slot kernels below: each grouped product costs a block
 * ~36 K steps of ~3 us whatever its rows, so reading each slot's expert rows wins for short
 * chunks (H200, full geometry, session 9: prompts of 64 tokens 1,160 tok/s per slot against
 * 918 grouped, 128 tokens 1,638 against 1,610, 256 tokens 2,077 against 2,870).
 * $KL_GPU_MOE_GROUPED_MIN=N (read at the first use) or kl_gpu_experts_grouped_min_set (0: the
 * environment again) overrides it, before the scratch is sized. */
#define KL_GPU_EXPERTS_GROUPED_MIN_N 128u
uint32_t kl_gpu_experts_grouped_min(void);
void     kl_gpu_experts_grouped_min_set(uint32_t n);

/* The path of chunks of n >= kl_gpu_experts_grouped_min() tokens (kernels/gemm.h): 3 (the
 * default) sorts the (token, k) slots by expert and runs grouped tensor-core products, each
 * expert's tile read once for all its rows (BF16 or MXFP4 stacks, I and H multiples of 32,
 * E <= 1024; otherwise the per-slot kernels); 2 (KL_GPU_MOE=v2, read once) keeps the per-slot
 * kernels of shorter chunks for every n.  kl_gpu_experts_version_set (2 or 3) overrides the
 * environment. */
int  kl_gpu_experts_version(void);
void kl_gpu_experts_version_set(int version);

/* The per-slot path with MXFP4 stacks (n < kl_gpu_experts_grouped_min()): 5 (the default;
 * KL_GPU_MOE_DECODE=v3p) is 3 with gate/up's loads in rounds, the next round in flight while
 * one is multiplied; 3 (KL_GPU_MOE_DECODE=v3) runs
 * gate/up with each lane's whole row in flight, then the down product and the k-order
 * weighted sum in one launch that requests its weights before its grid wait (two launches,
 * no part buffer); 2 (KL_GPU_MOE_DECODE=v2, read once) the three launches of before
 * (gate_up, down, combine; KL_GPU_MX=v1 their round-1 kernels).  Version 3 needs H <= 8192
 * and a token's h (top_k · I floats, with its partial sums) in 46 KiB of shared memory
 * (top 8 of I = 1024: 32 KiB); otherwise version 2 runs.  Results equal version 2's (the
 * same fp32 sums in the same order).  KL_GPU_MOE_DECODE=v3t (version 4): version 3 with the
 * down launch let in while gate/up still runs (to measure; see moe.cu).
 * KL_GPU_MOE_DECODE=tc (version 6): version 3's launches on the tensor cores (kernels/
 * mx_mma.cuh; H and I multiples of 128, otherwise version 5 runs): sums equal to fp32 ones up
 * to rounding, not the same order.  KL_GPU_MOE_DECODE=i8 (version 7): version 5 with
 * gate/up on integer dot products (kernels/mx_int8.cuh: x as three int8 digits under a
 * per-32-block exponent, to fp32's precision; sums equal to fp32 ones up to rounding).
 * kl_gpu_experts_decode_version_set (2 .. 7) overrides the environment. */
int  kl_gpu_experts_decode_version(void);
void kl_gpu_experts_decode_version_set(int version);

#ifdef __cplusplus
}
#endif

#endif
