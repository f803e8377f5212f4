/*
 * kernels/gemm_split.cuh — x as bf16 parts for the tensor-core products (the split form of
 * gemm.h), host and device (KL_HD), shared by gemm.cu's version 1 and gemm_mma.cu's version 4.
 * Included by .cu files only.
 */
#ifndef KL_KERNELS_GEMM_SPLIT_CUH
#define KL_KERNELS_GEMM_SPLIT_CUH

#include "kernels/gpu.h"

#include "kernels/mx_bf16.h"

#include <stdint.h>

/* fp32 to bf16 bits, round to nearest even (NaN stays a quiet NaN). */
KL_HD static inline uint32_t kl_gt_bf16(float f)
{
    const uint32_t u = kl_mx_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* x as three bf16 parts: hi (nearest), lo = bf16(x - hi), lo2 = bf16(x - hi - lo).  Each
 * difference is exact in fp32 (the parts are within a factor of two of what they round), so
 * hi + lo + lo2 is x to ~2^-26 relative: products with exactly-bf16 weights then match fp32
 * arithmetic.  Two parts (2^-17) were measured not to be enough: the full 48B geometry's
 * routing flipped (docs/CORRECTNESS.md).  lo, lo2 0 where hi is not finite. */
KL_HD static inline uint32_t kl_gt_split(float x, uint32_t *lo, uint32_t *lo2)
{
    const uint32_t hi = kl_gt_bf16(x);
    const int fin = (hi & 0x7f80u) != 0x7f80u;
    const float r1 = x - kl_mxfp4_f32_from_bits(hi << 16);
    *lo = fin ? kl_gt_bf16(r1) : 0u;
    *lo2 = fin ? kl_gt_bf16(r1 - kl_mxfp4_f32_from_bits(*lo << 16)) : 0u;
    return hi;
}

/* Tokens [0, nt) rounded up to whole 16-row fragments: the X tile rows the products read. */
KL_HD static inline unsigned kl_gt_frag_rows(uint32_t nt)
{
    return (nt + 15u) & ~15u;
}

/* Four floats as bf16 parts into the X tiles at element `at` (SP: the two lower parts too). */
template <int SP>
KL_HD static inline void kl_gt_stage_x4(float4 v, uint16_t *xt, unsigned xt_elems,
                                        unsigned at)
{
    const float f[4] = {v.x, v.y, v.z, v.w};
    uint32_t h[4], l[4], l2[4];
    for (int c = 0; c < 4; c++)
        h[c] = kl_gt_split(f[c], &l[c], &l2[c]);
    *(uint2 *)&xt[at] = make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
    if (SP) {
        *(uint2 *)&xt[xt_elems + at] = make_uint2(l[0] | l[1] << 16, l[2] | l[3] << 16);
        *(uint2 *)&xt[2 * xt_elems + at] = make_uint2(l2[0] | l2[1] << 16, l2[2] | l2[3] << 16);
    }
}

#endif
