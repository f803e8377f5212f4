/*
 * kernels/gemm.h — tensor-core products for chunks of many tokens (prefill): Y = X Wᵀ with the
 * rows of X (fp32 in memory) split into two bf16 parts (or rounded to bf16: kl_gpu_gemm_split)
 * as they are staged, W BF16 or MXFP4 (decoded to bf16 in shared memory), products summed in
 * fp32.  Conventions: kernels/gpu_api.h.
 *
 * These are for n >= KL_GPU_GEMM_MIN_N tokens, where each weight tile is read once for many
 * rows and tensor cores do the arithmetic; kl_gpu_matmul (dense.h) stays the one-token path.
 * On HIP the same launchers run a SIMT tile loop (no matrix cores yet): same results within
 * rounding, slower.
 */
#ifndef KL_KERNELS_GEMM_H
#define KL_KERNELS_GEMM_H

#include "kernels/gpu_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The smallest n the backend should send here rather than to kl_gpu_matmul. */
#define KL_GPU_GEMM_MIN_N 16u

/* How X enters the tensor cores, for both launchers: split (1, the default) stages
 * x = hi + lo + lo2, hi = bf16(x), lo = bf16(x - hi), lo2 = bf16(x - hi - lo), and sums the
 * three products into the same fp32 accumulators (W is exact in bf16, so each product is
 * exact to ~2^-26 relative: fp32-like results); 0 (KL_GPU_GEMM_SPLIT=0 in the environment,
 * read at the first call) stages bf16(x) only (one product: ~2e-3 relative error, a third of
 * the tensor-core work); 2 (KL_GPU_GEMM_SPLIT=2) is split with each K step's products summed
 * in fresh fragments and added to the running sums in fp32 registers: the two-part and
 * three-part forms measured the same ~1e-5 error on the H200, so the MMA's own accumulation
 * over a whole K is the suspect (docs/CORRECTNESS.md); not yet measured.
 * kl_gpu_gemm_split_set overrides the environment (the device test runs both). */
int  kl_gpu_gemm_split(void);            /* the form: 0, 1 or 2 */
void kl_gpu_gemm_split_set(int form);

/* y [n, w->rows] = x [n, w->cols] Wᵀ; w BF16 or MXFP4 (KL_E_USAGE for other kinds);
 * w->cols a multiple of 32. */
int kl_gpu_gemm(const kl_gpu_mat *w, const float *x, uint32_t n, float *y, kl_gpu_stream s,
                kl_err *err);

/* The products of a layer's routed experts for rows grouped by expert ("packed" rows):
 *     y[i] = x[x_row[i]] W_eᵀ   for i in [seg[e], seg[e+1]), every expert e < w->n
 * (x_row NULL: x_row[i] = i).  seg and x_row are device arrays written by an earlier kernel,
 * so the host knows only the bound m_max >= seg[w->n], which sizes the grid; blocks find their
 * rows from seg on the device.  Deterministic: each y element is one block's sum. */
typedef struct kl_gpu_gemm_grouped_args {
    const kl_gpu_stack *w;        /* E matrices [rows, cols], BF16 or MXFP4 */
    const float        *x;        /* source rows [*, cols] fp32 */
    const uint32_t     *x_row;    /* [m] device, or NULL */
    const uint32_t     *seg;      /* [E + 1] device, seg[0] = 0, non-decreasing */
    uint32_t            m_max;    /* host bound on seg[E] */
    float              *y;        /* [seg[E], rows] out, packed order */
} kl_gpu_gemm_grouped_args;

int kl_gpu_gemm_grouped(const kl_gpu_gemm_grouped_args *a, kl_gpu_stream s, kl_err *err);

#ifdef __cplusplus
}
#endif

#endif
