/*
 * kernels/gemm_mma.h — version 5 of the prefill products (kernels/gemm_mma.cu), reached
 * through kl_gpu_gemm_p / kl_gpu_gemm_grouped (gemm.h) when KL_GPU_GEMM_TILES or
 * KL_GPU_GEMM_GROUPED selects it, parts are given and the matrix fits.  Internal to kernels/:
 * arguments are checked by gemm.cu's public launchers; split is the form (0, 1 or 2, gemm.h).
 */
#ifndef KL_KERNELS_GEMM_MMA_H
#define KL_KERNELS_GEMM_MMA_H

#include "kernels/gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KL_GPU_MMA_KT 64u   /* K per step: version 5 takes cols % 64 == 0 */

/* Version 5: x split once into bf16 parts (kl_gpu_gemm_split_x, unless
 * a->parts_ready), then gemm_mma.cu's m5 kernels; needs a->parts.  kl_gpu_gemm_mma5_takes:
 * whether the matrix fits it (K in whole steps; MXFP4: cols % 128 == 0, <= 4096, 4-byte
 * aligned scales; CUDA). */
int kl_gpu_gemm_mma5_takes(const kl_gpu_mat *m);
int kl_gpu_gemm_mma5_grouped(const kl_gpu_gemm_grouped_args *a, int split, kl_gpu_stream s,
                             kl_err *err);
/* Version 5 of a dense product: x split into parts (unless parts_ready), then the products. */
int kl_gpu_gemm_mma5(const kl_gpu_mat *w, const float *x, uint16_t *parts, int parts_ready,
                     uint32_t n, float *y, int split, kl_gpu_stream s, kl_err *err);

#ifdef __cplusplus
}
#endif

#endif
