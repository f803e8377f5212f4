/*
 * kernels/skinny.h — products of a few tokens (2 .. 32) on tensor cores that read each weight
 * byte once for all the tokens: Y [n, rows] = X [n, cols] Wᵀ, W BF16 or MXFP4, x and y fp32.
 * Conventions: kernels/gpu_api.h.  kl_gpu_matmul (dense.h) sends 2 <= n < KL_GPU_GEMM_MIN_N
 * here when kl_gpu_skinny_takes says so (switched on by KL_GPU_SKINNY=v1 or v2; off, the
 * default for now, keeps its fp32 SIMT kernels).
 *
 * As exact as the prefill products' form 2 (gemm.h): x split into three bf16 parts (hi, lo,
 * lo2), W exact in bf16 (MXFP4 decoded with its scale), each K step's MMAs summed in fresh
 * fragments and added to fp32 sums.  How (kernels/skinny.cu): warps of 32 weight rows x all
 * tokens on mma.sync.m16n8k16, weights loaded 16 bytes a lane straight into registers (the
 * next step's in flight during this one's products; kernels/skinny_map.h), x staged in shared
 * memory as bf16 parts, K split over the blocks of a column of the grid when the rows alone
 * give too few blocks; the splits' sums are added in split order by a second kernel
 * (deterministic).  Their partial sums live in a buffer of skinny.cu: calls on two streams at
 * once must not both split K (one stream, as the engine runs, is safe).  CUDA only: on HIP
 * kl_gpu_skinny_takes is 0 (kl_gpu_matmul keeps its SIMT kernels).
 */
#ifndef KL_KERNELS_SKINNY_H
#define KL_KERNELS_SKINNY_H

#include "kernels/gpu_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KL_GPU_SKINNY_MAX_N 32u

/* Which skinny kernels run: 1 (KL_GPU_SKINNY=v1: BF16 in K steps of 64 columns, two register
 * sets of 32 a lane), 2 (KL_GPU_SKINNY=v2: steps of 128, twice the weight bytes in flight a
 * warp, more registers, fewer blocks an SM), or 0 (KL_GPU_SKINNY=0 or off: kl_gpu_matmul keeps
 * its per-token SIMT kernels).  Version 1 is the default.  MXFP4 takes steps of 128 in both.
 * Read from the environment at the first call; kl_gpu_skinny_version_set (0, 1 or 2)
 * overrides it (the device test runs each). */
int  kl_gpu_skinny_version(void);
void kl_gpu_skinny_version_set(int version);

/* Whether kl_gpu_skinny runs y = x Wᵀ for n tokens and kl_gpu_matmul sends it there: switched
 * on (version 1 or 2), CUDA, 2 <= n <= KL_GPU_SKINNY_MAX_N (not 2 tokens by a matrix of at
 * most 1024 x 2304 weights, where the per-token kernels are faster), W BF16 (data 16-byte
 * aligned) or MXFP4 (codes 16-, scales 4-byte aligned), cols a multiple of 128, x 16-byte
 * aligned. */
int kl_gpu_skinny_takes(const kl_gpu_mat *w, const float *x, uint32_t n);

/* y [n, w->rows] = x [n, w->cols] Wᵀ (version 2's kernels when kl_gpu_skinny_version() is 2,
 * else version 1's, switched off or not; KL_E_USAGE where kl_gpu_skinny_takes would say no
 * for another reason). */
int kl_gpu_skinny(const kl_gpu_mat *w, const float *x, uint32_t n, float *y, kl_gpu_stream s,
                  kl_err *err);

/* Where the rows of a product go: part i (of count, 1 .. KL_GPU_SKINNY_MAX_PARTS) is rows
 * [end[i - 1], end[i]) (from 0 for i = 0; end[count - 1] = the matrix's rows), written to
 * y[i] [n, end[i] - end[i - 1]].  So one product over matrices stacked by rows (a layer's
 * fused input products) fills each member's own output. */
#define KL_GPU_SKINNY_MAX_PARTS 8
typedef struct kl_gpu_skinny_out {
    uint32_t count;
    uint32_t end[KL_GPU_SKINNY_MAX_PARTS];
    float   *y[KL_GPU_SKINNY_MAX_PARTS];
} kl_gpu_skinny_out;

/* kl_gpu_skinny with y split by rows as out says (KL_E_USAGE for a malformed out). */
int kl_gpu_skinny_parts(const kl_gpu_mat *w, const float *x, uint32_t n,
                        const kl_gpu_skinny_out *out, kl_gpu_stream s, kl_err *err);

/* Blocks a product aims at per multiprocessor (0, the default: as many as fit at once, the
 * kernel's occupancy): K is split until the grid fills one such wave.  For the device test's
 * sweep. */
void kl_gpu_skinny_blocks_set(unsigned per_sm);

#ifdef __cplusplus
}
#endif

#endif
