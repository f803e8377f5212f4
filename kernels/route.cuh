/*
 * kernels/route.cuh — the router's top-k for one token by one group of 32 lanes (moe.h's
 * steps 1-4), shared by kl_gpu_route's kernel (moe.cu) and the launch where it rides along
 * with the shared expert's down product (dense.cu, kl_gpu_matmul_glu_route).
 *
 * Lane l owns experts l, l + 32, ...; each of the top_k rounds is a group arg-max by
 * shuffles (kl_best_group: ties to the lowest id).  Up to ROUTE_BATCH * 32 experts
 * (Kimi-Linear's 256) the scores stay in registers and each lane keeps its best between
 * rounds, so a round is one group arg-max and the winner's lane rescanning its 8.
 */
#ifndef KL_KERNELS_ROUTE_CUH
#define KL_KERNELS_ROUTE_CUH

#include "kernels/moe.h"
#include "kernels/row_dot.cuh" /* kl_best */

#include <math.h>

#define ROUTE_MAX_E 1024 /* 2 floats per expert and token: 32 KiB of shared memory a block */
#define ROUTE_MAX_K 64
#define ROUTE_BATCH 8    /* logits a lane loads at once */

/* 0 when a routes well-formed inputs, else the error (named for `who`). */
static inline int route_check(const kl_gpu_route_args *a, const char *who, kl_err *err)
{
    if (!a || !a->logits || !a->idx || !a->wt || a->n == 0 || a->n > 0x7fffffffu)
        return kl_fail(err, KL_E_USAGE, "%s: logits, idx or wt is NULL, or n is 0", who);
    if (a->n_experts == 0 || a->n_experts > ROUTE_MAX_E || a->top_k == 0 ||
        a->top_k > a->n_experts || a->top_k > ROUTE_MAX_K)
        return kl_fail(err, KL_E_USAGE,
                       "%s: %u experts, top %u (need 1 <= top_k <= min(E, %d), E <= %d)", who,
                       a->n_experts, a->top_k, ROUTE_MAX_K, ROUTE_MAX_E);
    if (a->held && (a->first >= a->n_experts || a->held > a->n_experts - a->first))
        return kl_fail(err, KL_E_USAGE, "%s: experts [%u, %u) held of %u", who, a->first,
                       a->first + a->held, a->n_experts);
    return 0;
}

/* Whether the scores of E experts fit in a lane's registers (route_in_registers). */
__host__ __device__ static inline int route_in_registers_ok(uint32_t E)
{
    return E <= ROUTE_BATCH * KL_GPU_GROUP;
}

/* Expert e's id on a rank holding experts [first, first + held) (held 0: every expert). */
__device__ static int32_t held_id(uint32_t e, uint32_t first, uint32_t held)
{
    if (!held)
        return (int32_t)e;   /* unsigned difference below: ids under first wrap past held */
    return e - first < held ? (int32_t)(e - first) : KL_GPU_EXPERT_ELSEWHERE;
}

/* Choice k of token t is b: its id into idx, its weight (s, or s + bias with biased weights)
 * added to wsum and kept by lane k % 32 (w_lo for k < 32, w_hi for the next 32). */
__device__ static inline void route_take(const kl_gpu_route_args &a, uint32_t t, uint32_t k,
                                         kl_best b, unsigned lane, float *wsum, float *w_lo,
                                         float *w_hi)
{
    const float w = a.biased_weights ? b.v : b.p;
    *wsum += w;
    *w_lo = k == lane ? w : *w_lo;
    *w_hi = k == lane + KL_GPU_GROUP ? w : *w_hi;
    if (lane == 0)
        a.idx[(size_t)t * a.top_k + k] = held_id(b.i, a.first, a.held);
}

/* 4. renormalise (+1e-20 as HF), then the routed scaling factor */
__device__ static inline void route_weights(const kl_gpu_route_args &a, uint32_t t,
                                            unsigned lane, float wsum, float w_lo, float w_hi)
{
    float *wt = a.wt + (size_t)t * a.top_k;
    for (uint32_t k = lane, h = 0; k < a.top_k && h < 2; k += KL_GPU_GROUP, h++) {
        float w = h ? w_hi : w_lo;
        if (a.renormalize)
            w /= wsum + 1e-20f;
        wt[k] = w * a.scaling;
    }
}

/* The best of a lane's experts e = lane + 32 u (u < ROUTE_BATCH, e < E) by selection score q
 * (ties: the lower id), as the shared-memory loop scans them. */
__device__ static inline kl_best route_lane_best(const float *q, const float *v, unsigned lane,
                                                 uint32_t E)
{
    kl_best b = {-INFINITY, UINT32_MAX, 0.0f};
#pragma unroll
    for (int u = 0; u < ROUTE_BATCH; u++) {
        const uint32_t e = lane + u * KL_GPU_GROUP;
        const kl_best c = {q[u], e, v[u]};
        if (e < E && kl_best_above(c, b))
            b = c;
    }
    return b;
}

/* 1. sigmoid; selection score s + bias (NaN never wins, as in the CPU's strict >) of experts
 * e0 + 32 u (u < ROUTE_BATCH; past E: whatever, unused): every logit and bias is loaded before
 * any is used, one wait for memory per 256 experts instead of one per expert a lane owns. */
__device__ static inline void route_scores(const kl_gpu_route_args &a, const float *lg,
                                           uint32_t e0, float *v, float *q)
{
    const uint32_t E = a.n_experts;
    float l[ROUTE_BATCH], b[ROUTE_BATCH];
#pragma unroll
    for (int u = 0; u < ROUTE_BATCH; u++) {
        const uint32_t e = e0 + u * KL_GPU_GROUP;
        l[u] = e < E ? lg[e] : 0.0f;
        b[u] = e < E && a.bias ? a.bias[e] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < ROUTE_BATCH; u++) {
        v[u] = 1.0f / (1.0f + expf(-l[u]));
        const float s = v[u] + b[u];
        q[u] = isnan(s) ? -INFINITY : s;
    }
}

/* Token t's routing for E <= ROUTE_BATCH * 32 experts with each lane's scores in registers:
 * a lane's best is kept between rounds, and only the winner's lane finds its next best (the
 * shared-memory form rescans every expert each round).  The same choices and weights. */
__device__ static void route_in_registers(const kl_gpu_route_args &a, uint32_t t, unsigned lane)
{
    const uint32_t E = a.n_experts;
    float v[ROUTE_BATCH], q[ROUTE_BATCH];
    route_scores(a, a.logits + (size_t)t * E, lane, v, q);
    kl_best mine = route_lane_best(q, v, lane, E);
    float wsum = 0.0f, w_lo = 0.0f, w_hi = 0.0f;
    for (uint32_t k = 0; k < a.top_k; k++) {
        const kl_best best = kl_best_group(mine);
        if (best.i % KL_GPU_GROUP == lane) {
#pragma unroll
            for (int u = 0; u < ROUTE_BATCH; u++)
                q[u] = (uint32_t)u == best.i / KL_GPU_GROUP ? -INFINITY : q[u];
            mine = route_lane_best(q, v, lane, E);
        }
        route_take(a, t, k, best, lane, &wsum, &w_lo, &w_hi);
    }
    route_weights(a, t, lane, wsum, w_lo, w_hi);
}

#endif
