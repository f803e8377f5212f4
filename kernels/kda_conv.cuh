/*
 * kernels/kda_conv.cuh — KDA's short conv + SiLU (kda.h), one thread's share: the device code
 * of kl_gpu_kda_conv (kda.cu) and of the one-token products that carry it in their launch
 * (dense.cu, kl_gpu_matmul_pair_conv).
 */
#ifndef KL_KERNELS_KDA_CONV_CUH
#define KL_KERNELS_KDA_CONV_CUH

#include "kernels/gpu.h"
#include "kernels/kda.h"
#include "kernels/tokens.h"

#define CONV_MAX_W 8 /* taps per channel at most */

/* 0 when kl_gpu_kda_conv takes a and t, else the error. */
static inline int kda_conv_check(const kl_gpu_kda_conv_args *a, const kl_gpu_tokens *t,
                                 kl_err *err)
{
    if (!a || !a->win)
        return kl_fail(err, KL_E_USAGE, "kda conv: arguments or window pool NULL");
    for (int i = 0; i < 3; i++)
        if (!a->qkv[i] || !a->taps[i])
            return kl_fail(err, KL_E_USAGE, "kda conv: input %d or its taps NULL", i);
    if (a->D == 0 || a->W == 0 || a->W > CONV_MAX_W)
        return kl_fail(err, KL_E_USAGE, "kda conv: D %u, W %u (need D >= 1, 1 <= W <= %d)",
                       a->D, a->W, CONV_MAX_W);
    if (a->win_stride < 3 * (size_t)a->D * (a->W - 1))
        return kl_fail(err, KL_E_USAGE, "kda conv: window stride %zu < 3 * D * (W - 1)",
                       a->win_stride);
    if (kl_gpu_tokens_check("kda conv", t, 0, err))
        return err->code;
    return 0;
}

__device__ static inline float kda_silu(float z)
{
    return z / (1.0f + expf(-z));
}

/* Channel c of x = qkv[which] over run r, cut into S segments of consecutive tokens: this
 * thread's segment seg.  It first reads the W - 1 inputs before its segment (the slot's
 * window before the run), then, after the block's barrier when `barrier` (S > 1: no input
 * is overwritten before every thread has read what it needs; with S = 1 a thread reads only
 * what it writes), walks its segment in order, exactly as short_conv does; the thread of
 * the last token writes the window back. */
__device__ static inline void kda_conv_thread(const kl_gpu_kda_conv_args &a,
                                              const uint32_t *run_start,
                                              const uint32_t *run_slot, uint32_t c,
                                              uint32_t which, uint32_t r, uint32_t seg,
                                              uint32_t S, bool barrier)
{
    const uint32_t W = a.W;
    const uint32_t t0 = run_start[r], len = run_start[r + 1] - t0, L = (len + S - 1) / S;
    const uint32_t s0 = t0 + (seg * L < len ? seg * L : len);
    const uint32_t s1 = t0 + ((seg + 1) * L < len ? (seg + 1) * L : len);
    const bool on = c < a.D;
    /* selects, not a[which]: a dynamic index into the parameters copies them to the stack */
    float *x = which == 0 ? a.qkv[0] : which == 1 ? a.qkv[1] : a.qkv[2];
    const float *w = (which == 0 ? a.taps[0] : which == 1 ? a.taps[1] : a.taps[2]) +
                     (size_t)(on ? c : 0) * W;
    float *st = a.win + run_slot[r] * a.win_stride + ((size_t)which * a.D + c) * (W - 1);
    float win[CONV_MAX_W]; /* unrolled with guards, so it stays in registers */
#pragma unroll
    for (int j = 0; j < CONV_MAX_W - 1; j++) { /* input at token s0 - (W - 1) + j */
        const int64_t at = (int64_t)s0 - (int64_t)(W - 1) + j;
        win[j] = !on || j + 1 >= (int)W ? 0.0f
                 : at < (int64_t)t0      ? st[j + (s0 - t0)]
                                         : x[(size_t)at * a.D + c];
    }
    if (barrier)
        __syncthreads();
    if (!on)
        return;
    for (uint32_t t = s0; t < s1; t++) {
        const float in = x[(size_t)t * a.D + c];
        float acc = w[W - 1] * in; /* tap W-1: the current token */
#pragma unroll
        for (int j = 0; j < CONV_MAX_W - 1; j++)
            if (j + 1 < (int)W)
                acc += w[j] * win[j];
#pragma unroll
        for (int j = 0; j < CONV_MAX_W - 1; j++) /* slide: drop the oldest, append `in` */
            if (j + 1 < (int)W)
                win[j] = j + 2 < (int)W ? win[j + 1] : in;
        x[(size_t)t * a.D + c] = kda_silu(acc);
    }
    if (len && s0 < s1 && s1 == t0 + len)
#pragma unroll
        for (int j = 0; j < CONV_MAX_W - 1; j++)
            if (j + 1 < (int)W)
                st[j] = win[j];
}

#endif
