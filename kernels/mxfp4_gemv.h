/*
 * kernels/mxfp4_gemv.h — y = W x for an MXFP4 matrix on the GPU (the decode step's expert and
 * projection products, one token).
 *
 * W is stored as kl convert writes routed experts (compressed-tensors mxfp4-pack-quantized):
 * packed [rows, cols/2] u8, element 2i in the low nibble (E2M1 codes), scale [rows, cols/32]
 * u8 (E8M0).  x [cols] and y [rows] are fp32.  All pointers are device memory; cols is a
 * multiple of 32 and at most 11264 (x is staged in 48 KiB of shared memory), packed and x are
 * 16-byte aligned.  Each row is summed in fp32 per 32-element block, then scaled: the order
 * differs from the CPU kernels', so results agree to rounding, not bit for bit.
 *
 * kl_gpu_mxfp4_gemv checks the arguments (KL_E_USAGE), enqueues the kernel on stream (NULL:
 * the default stream) and returns without waiting; launch errors are KL_E_GPU.
 */
#ifndef KL_KERNELS_MXFP4_GEMV_H
#define KL_KERNELS_MXFP4_GEMV_H

#include "kernels/gpu_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kl_mxfp4_gemv_args {
    const uint8_t *packed; /* [rows, cols/2] u8, E2M1 pairs, low nibble first */
    const uint8_t *scale;  /* [rows, cols/32] u8, E8M0 */
    const float   *x;      /* [cols] fp32 */
    float         *y;      /* [rows] fp32, out */
    size_t         rows, cols;
} kl_mxfp4_gemv_args;

int kl_gpu_mxfp4_gemv(const kl_mxfp4_gemv_args *a, kl_gpu_stream stream, kl_err *err);

#ifdef __cplusplus
}
#endif

#endif
