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

/* How X enters the tensor cores, for both launchers.  Split stages x = hi + lo + lo2,
 * hi = bf16(x), lo = bf16(x - hi), lo2 = bf16(x - hi - lo), and runs the three products (W
 * is exact in bf16, so each is exact to ~2^-26 relative).  Form 2 (the default) sums each K
 * step's products in fresh fragments and adds them to the running sums in fp32 registers:
 * 3e-7 .. 7e-7 of fp32 at the model's shapes, and the full 48B geometry matches the CPU
 * engine (docs/CORRECTNESS.md).  Form 1 (KL_GPU_GEMM_SPLIT=1) lets the MMAs accumulate over
 * the whole K: Hopper's MMA adds into its accumulator without fp32 rounding (it truncates), a
 * bias that grows with K to ~1e-5 and flipped expert choices of the random full geometry.
 * Form 0 (KL_GPU_GEMM_SPLIT=0) stages bf16(x) only: ~2e-3, a third of the tensor-core work.
 * The environment is read at the first call; kl_gpu_gemm_split_set overrides it. */
int  kl_gpu_gemm_split(void);            /* the form: 0, 1 or 2 */
void kl_gpu_gemm_split_set(int form);

/* Which kernels run.  By default (0) version 4 for the grouped products and version 1 for
 * the dense ones, which is what measured fastest (session 8, H200, form 2: grouped MXFP4
 * gate [1024, 2304] over 8,192 rows 901 µs against 1,178; dense products within +-15% of each
 * other, version 1 ahead at n <= 256).  KL_GPU_GEMM_TILES=v1..v4 forces one version for both.
 * Version 1: loads held in registers, WMMA tiles of 64 tokens x 128 rows (gemm.cu's
 * header).  Version 2 (kernels/gemm_tile.cuh): a ring of 2-4 K steps of raw weights, scales
 * and x rows copied asynchronously (cp.async) into shared memory and decoded / split there,
 * tiles of 16 tokens x 256 rows (grouped, and dense n <= 32) or 64 x 128 (dense); cols % 64
 * == 0 (and 4-byte aligned MXFP4 scales), the others go to version 1.  Version 3: version 2
 * with dense products in tiles of 16 tokens at any n.  Version 4 (kernels/gemm_mma.cu):
 * mma.sync with ldmatrix, warps of 64 rows x 32 tokens, blocks of 128 x 128 (dense) or 256 x
 * 64 (grouped); cols % 64 == 0, CUDA only (HIP runs version 1).  All are exact in form 2.
 * Read from the environment at the first call; kl_gpu_gemm_tiles_set overrides it. */
int  kl_gpu_gemm_tiles(void);            /* 0 (the default), 1, 2, 3 or 4 */
void kl_gpu_gemm_tiles_set(int version);

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
