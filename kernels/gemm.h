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

/* The smallest n the backend should send here rather than to kl_gpu_matmul: below it the
 * tensor-core products' fixed cost (a block walks all of K in ~3 us steps, and few blocks fill
 * the GPU) exceeds kl_gpu_matmul's, which reads the weights once per 8 tokens (H200, full
 * geometry, session 9: prompts of 16 tokens 806 tok/s on kl_gpu_matmul throughout against
 * 551 with the dense products here; 32 tokens 905 against 886; 64 tokens 976 against 1,160). */
#define KL_GPU_GEMM_MIN_N 32u

/* How X enters the tensor cores, for both launchers.  Split stages x = hi + lo + lo2,
 * hi = bf16(x), lo = bf16(x - hi), lo2 = bf16(x - hi - lo), and runs the three products (W
 * is exact in bf16, so each is exact to ~2^-26 relative).  Form 2 (KL_GPU_GEMM_SPLIT=2) sums
 * each K step's products in fresh fragments and adds them to the running sums in fp32
 * registers: 3e-7 .. 7e-7 of fp32 at the model's shapes, and the full 48B geometry matches
 * the CPU engine (docs/CORRECTNESS.md).  Form 1 (KL_GPU_GEMM_SPLIT=1) lets the MMAs accumulate
 * over the whole K: Hopper's MMA adds into its accumulator without fp32 rounding (it
 * truncates), a bias that grows with K to ~1e-5 and flipped expert choices of the random full
 * geometry.  Form 0 (KL_GPU_GEMM_SPLIT=0) stages bf16(x) only: ~2e-3, a third of the
 * tensor-core work.  Form 3 (the default; version 5 with MXFP4 weights, form 2 elsewhere):
 * each row of x scaled by a power of two that puts its largest |x| in [2^13, 2^14) and split
 * into two fp16 parts, the MXFP4 codes as fp16 (exact) and each 32-wide block's sums times
 * its scale in fp32, the row's factor undone at the store: two products a slice instead of
 * three, as exact as form 2 (host model scripts/split_forms.c: 1.89e-7 against 1.85e-7; on
 * the H200 3.1e-7 .. 3.4e-7 of fp32, test_gemm) and 17% faster on the grouped experts.
 * The environment is read at the first call; kl_gpu_gemm_split_set overrides it. */
int  kl_gpu_gemm_split(void);            /* the form: 0, 1, 2 or 3 */
void kl_gpu_gemm_split_set(int form);

/* Which kernels run, for the dense products (grouped = 0) and the grouped ones (1): version 5
 * by default where parts are given and the matrix fits (CUDA; K in steps of 64; MXFP4 K a
 * multiple of 128 up to 4,096), else version 1; KL_GPU_GEMM_TILES=v1 (dense) and
 * KL_GPU_GEMM_GROUPED=v1 choose version 1.
 * Version 1 (gemm.cu): loads held in registers, WMMA tiles of 64 tokens x 128 rows; HIP runs
 * it as a SIMT loop.
 * Version 5 (kernels/gemm_mma.cu): mma.sync with ldmatrix, warps of 64 rows x 32 tokens in
 * blocks of 256 rows x 64 tokens, x split once into bf16 parts (kl_gpu_gemm_split_x) and steps
 * copied by cp.async two ahead (MXFP4 codes decoded in shared memory).  Measured on the H200
 * (session 9, form 2, versions 1 / 5): dense BF16 [4096, 2304] x 4,096 tokens 1,474 / 829 µs;
 * grouped MXFP4 gate [1024, 2304] over 32,768 rows 3,565 / 2,375 µs; an 8K prompt 5,583-5,602
 * tok/s with the defaults.  Both are exact in form 2.  Read from the environment at the first
 * call; kl_gpu_gemm_tiles_set(dense, grouped) overrides both (0: the defaults). */
int  kl_gpu_gemm_tiles(int grouped);     /* 1 or 5 */
void kl_gpu_gemm_tiles_set(int dense, int grouped);

/* y [n, w->rows] = x [n, w->cols] Wᵀ; w BF16 or MXFP4 (KL_E_USAGE for other kinds);
 * w->cols a multiple of 32.  Without parts version 5 cannot run: version 1 does. */
int kl_gpu_gemm(const kl_gpu_mat *w, const float *x, uint32_t n, float *y, kl_gpu_stream s,
                kl_err *err);

/* kl_gpu_gemm with a scratch for x's bf16 parts (kl_gpu_gemm_parts_bytes(n, w->cols), 16-byte
 * aligned): version 5 splits x into it, unless parts_ready (an earlier call split this x, the
 * same n and cols: products of one input share one split), and multiplies from it. */
int kl_gpu_gemm_p(const kl_gpu_mat *w, const float *x, uint32_t n, float *y, uint16_t *parts,
                  int parts_ready, kl_gpu_stream s, kl_err *err);

/* Whether kl_gpu_gemm_p(w, .., parts, ..) splits x into parts and reads them. */
int kl_gpu_gemm_uses_parts(const kl_gpu_mat *w, const uint16_t *parts);

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
    uint16_t           *parts;    /* scratch of kl_gpu_gemm_parts_bytes(m_max, cols), 16-byte
                                     aligned, or NULL (version 5 then does not run) */
    int                 parts_ready; /* parts already hold these rows of x (x_row applied),
                                        split by an earlier call with the same x, x_row, cols */
} kl_gpu_gemm_grouped_args;

/* Bytes of the parts scratch for m rows of cols: [m][3][cols] bf16, then form 3's m row
 * factors (fp32). */
size_t kl_gpu_gemm_parts_bytes(uint32_t m, uint32_t cols);

/* parts row i = the bf16 parts (hi, lo, lo2) of x row x_row[i] (or i), for i < *count (count
 * a device pointer, NULL: m). */
int kl_gpu_gemm_split_x(const float *x, const uint32_t *x_row, const uint32_t *count,
                        uint32_t m, uint32_t cols, uint16_t *parts, kl_gpu_stream s,
                        kl_err *err);

int kl_gpu_gemm_grouped(const kl_gpu_gemm_grouped_args *a, kl_gpu_stream s, kl_err *err);

/* Whether kl_gpu_gemm_grouped(a) runs version 5, i.e. splits x into a->parts (unless
 * parts_ready) and reads the parts: a caller reusing the parts for a second product of the
 * same x asks this of both calls before it sets parts_ready. */
int kl_gpu_gemm_grouped_uses_parts(const kl_gpu_gemm_grouped_args *a);

#ifdef __cplusplus
}
#endif

#endif
