/*
 * common/mxfp4_format.h — the OCP MXFP4 number format: E2M1 elements, E8M0 block scales.
 *
 * The one definition of the format for every part of kl: the quantizer (convert/mxfp4.c, which
 * adds the scale rules), the CPU kernels (engine/matvec.c), verification, and the GPU kernels
 * (kernels/, CUDA and HIP).  Header only: static inline, plain C that also compiles as C++,
 * CUDA and HIP (KL_HD marks the functions __host__ __device__ under nvcc and hipcc), no library
 * call but memcpy, no tables outside a function.
 *
 * Layout (compressed-tensors "mxfp4-pack-quantized", as gpt-oss and OCP-based converters):
 *   packed[i/2]: element 2i in the LOW nibble, element 2i+1 in the HIGH nibble;
 *   scale[b]:    E8M0 byte s, block value X = 2^(s-127), one per 32 consecutive elements.
 * E2M1 code: bits 0-2 index the magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 is the sign
 * (code 8 is -0).  E8M0: s = 0 is 2^-127 (a float subnormal), 255 is NaN.
 * Encoding rounds |x| / X to the nearest magnitude, ties to the even code (mantissa bit 0), and
 * saturates at 6; a value that rounds to zero gets code 0, never -0.
 */
#ifndef KL_COMMON_MXFP4_FORMAT_H
#define KL_COMMON_MXFP4_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define KL_HD __host__ __device__
#else
#define KL_HD
#endif

#define KL_MXFP4_BLOCK  32      /* elements per E8M0 scale */
#define KL_E2M1_SIGN    8u      /* sign bit of an E2M1 code */
#define KL_E8M0_BIAS    127
#define KL_E8M0_EXP_MIN (-127)  /* block exponents an E8M0 byte can hold (255 is NaN) */
#define KL_E8M0_EXP_MAX 127

/* Twice the E2M1 value of codes 0..15, all small integers (an int8 lookup table for SIMD
 * decoders; -0 reads as 0 here). */
#define KL_E2M1_X2_CODES 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12

KL_HD static inline float kl_mxfp4_f32_from_bits(uint32_t u)
{
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __uint_as_float(u); /* memcpy would go through a local-memory stack slot */
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* ---- E2M1 ---------------------------------------------------------------------------------- */

/* Value of code 0..15 (code 8 is -0); NaN for any other code. */
KL_HD static inline float kl_e2m1_value(unsigned code)
{
    const signed char x2[16] = {KL_E2M1_X2_CODES};
    if (code > 15)
        return kl_mxfp4_f32_from_bits(0x7fc00000u);
    float m = 0.5f * (float)x2[code & 7];
    return code & KL_E2M1_SIGN ? -m : m;
}

/* Magnitude code 0..7 of q = |x| / X >= 0: the number of midpoints between consecutive
 * magnitudes that q lies above.  Ties go to the even code: 0.25, 1.25, 2.5 and 5 round down
 * (q > t counts), 0.75, 1.75 and 3.5 round up (q >= t counts); q above 5 saturates to 6. */
KL_HD static inline unsigned kl_e2m1_magnitude_code(float q)
{
    return (unsigned)(q > 0.25f) + (unsigned)(q >= 0.75f) + (unsigned)(q > 1.25f) +
           (unsigned)(q >= 1.75f) + (unsigned)(q > 2.5f) + (unsigned)(q >= 3.5f) +
           (unsigned)(q > 5.0f);
}

/* Code of x already divided by the block scale (finite): the sign only on a nonzero
 * magnitude, so nothing codes as -0. */
KL_HD static inline unsigned kl_e2m1_encode(float x)
{
    unsigned m = kl_e2m1_magnitude_code(x < 0.0f ? -x : x);
    return m && x < 0.0f ? m | KL_E2M1_SIGN : m;
}

/* ---- E8M0 ---------------------------------------------------------------------------------- */

/* f32 bits of 2^(s-127): s = 0 gives the subnormal 2^-127, s = 255 a quiet NaN. */
KL_HD static inline uint32_t kl_e8m0_bits(uint8_t s)
{
    return s == 255 ? 0x7fc00000u : s ? (uint32_t)s << 23 : 0x00400000u;
}

/* f32 bits of half the scale, 2^(s-128), exact (subnormal for s <= 1); 255 stays NaN.  For
 * decoders that multiply twice the E2M1 value (KL_E2M1_X2_CODES). */
KL_HD static inline uint32_t kl_e8m0_half_bits(uint8_t s)
{
    return s == 255 ? 0x7fc00000u : s >= 2 ? (uint32_t)(s - 1) << 23 : 0x00200000u << s;
}

KL_HD static inline float kl_e8m0_value(uint8_t s)
{
    return kl_mxfp4_f32_from_bits(kl_e8m0_bits(s));
}

/* Block exponent e (X = 2^e) clamped to [KL_E8M0_EXP_MIN, KL_E8M0_EXP_MAX]. */
KL_HD static inline int kl_e8m0_clamp_exp(int e)
{
    return e < KL_E8M0_EXP_MIN ? KL_E8M0_EXP_MIN : e > KL_E8M0_EXP_MAX ? KL_E8M0_EXP_MAX : e;
}

/* E8M0 byte of block exponent e, clamped: 0..254, never the NaN byte. */
KL_HD static inline uint8_t kl_e8m0_encode(int e)
{
    return (uint8_t)(kl_e8m0_clamp_exp(e) + KL_E8M0_BIAS);
}

/* ---- rows ---------------------------------------------------------------------------------- */

/* Dequantizes one row of n elements: out[i] = E2M1(code i) * 2^(scale[i/32] - 127); scale 255
 * gives NaN.  n need not be a multiple of 32 (the last block may be partial).  Per block, the
 * 16 values times X are tabulated: value * X is exact (2 significant bits times a power of
 * two) except that values of 2^128 and above (4 * 2^126, say) overflow to Inf. */
KL_HD static inline void kl_mxfp4_dequantize_row(const uint8_t *packed, const uint8_t *scale,
                                                 size_t n, float *out)
{
    for (size_t b = 0; b * KL_MXFP4_BLOCK < n; b++) {
        float x = kl_e8m0_value(scale[b]), t[16];
        for (unsigned c = 0; c < 16; c++)
            t[c] = kl_e2m1_value(c) * x;
        size_t i0 = b * KL_MXFP4_BLOCK;
        if (n - i0 >= KL_MXFP4_BLOCK) {
            for (size_t i = 0; i < KL_MXFP4_BLOCK / 2; i++) {
                uint8_t v = packed[i0 / 2 + i];
                out[i0 + 2 * i] = t[v & 15];
                out[i0 + 2 * i + 1] = t[v >> 4];
            }
        } else { /* a partial last block */
            for (size_t i = i0; i < n; i++)
                out[i] = t[(packed[i / 2] >> (4 * (i & 1))) & 15];
        }
    }
}

#endif
