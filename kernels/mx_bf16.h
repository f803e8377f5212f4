/*
 * kernels/mx_bf16.h — MXFP4 codes to bf16 bits with integer operations, eight codes (one
 * 32-bit word) at a time, for kernels that stage decoded weights (gemm.cu).  Host and device
 * (KL_HD), so tests/test_mxfp4.c checks every code and scale here against kl_e2m1_value ·
 * kl_e8m0_value.
 *
 * An E2M1 magnitude (3 bits) times 2^(s - 127) is, for 2 <= s <= 252, a normal bf16 whose
 * bits are a per-scale table of 8 entries (entry 0 stays +0; the others are the unscaled bf16
 * bits plus (s - 127) << 7 in the exponent field).  The table is held as two 8-byte halves
 * (low bytes, high bytes) so that byte permutes (__byte_perm: 8 source bytes, 4 selectors)
 * look up four codes at once; two more permutes interleave the bytes into bf16 pairs and the
 * sign bits are moved to bits 15 and 31 with one multiply.  Per word: 1 AND, 1 shift, 4
 * lookups, 4 interleaves, 1 shift and 4 × (AND, IMUL, LOP3) for the signs: 23 operations for
 * 8 codes, no shared memory; building the table: 4 integer ops and 4 permutes per scale.
 * Other scales (s < 2: subnormal results; s > 252: overflow; 255: NaN) take the float path
 * (kl_mx_decode8_slow), which is what the table reproduces bit for bit.
 */
#ifndef KL_KERNELS_MX_BF16_H
#define KL_KERNELS_MX_BF16_H

#include "common/mxfp4_format.h"

#include <stdint.h>

/* r byte n = byte (s >> 4n) & 7 of (b:a) (a bytes 0..3, b bytes 4..7); selectors < 8. */
KL_HD static inline uint32_t kl_mx_prmt(uint32_t a, uint32_t b, uint32_t s)
{
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __byte_perm(a, b, s);
#else
    const uint64_t v = (uint64_t)b << 32 | a;
    uint32_t r = 0;
    for (unsigned n = 0; n < 4; n++)
        r |= (uint32_t)(v >> 8 * ((s >> 4 * n) & 7u) & 0xffu) << 8 * n;
    return r;
#endif
}

/* The bits of f. */
KL_HD static inline uint32_t kl_mx_f32_bits(float f)
{
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

/* The low and high bytes of the bf16 bits of magnitudes 0..3 (lo0, hi0) and 4..7 (lo1, hi1)
 * times one scale. */
typedef struct kl_mx_tab {
    uint32_t lo0, lo1, hi0, hi1;
} kl_mx_tab;

/* Whether scale s takes the table (every nonzero product a normal bf16). */
KL_HD static inline int kl_mx_tab_ok(uint8_t s)
{
    return s >= 2 && s <= 252;
}

/* A table from the magnitudes' pairs as 16-bit pairs (a01 holds magnitude 1 in its high half,
 * its low half 0 for code 0), split into the byte permutes' operands. */
KL_HD static inline kl_mx_tab kl_mx_tab_pairs(uint32_t a01, uint32_t a23, uint32_t a45,
                                              uint32_t a67)
{
    kl_mx_tab t;
    t.lo0 = kl_mx_prmt(a01, a23, 0x6420u);
    t.hi0 = kl_mx_prmt(a01, a23, 0x7531u);
    t.lo1 = kl_mx_prmt(a45, a67, 0x6420u);
    t.hi1 = kl_mx_prmt(a45, a67, 0x7531u);
    return t;
}

/* The table of scale s (kl_mx_tab_ok(s)).  Pairs of entries as bf16 pairs: magnitudes 1..7
 * are 0.5, 1, 1.5, 2, 3, 4, 6 = 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0. */
KL_HD static inline kl_mx_tab kl_mx_tab_make(uint8_t s)
{
    const uint32_t d = (uint32_t)((int)s - 127) * 128u; /* added to each exponent field */
    const uint32_t a01 = (0x3f00u + d) << 16, dd = d * 0x10001u;
    return kl_mx_tab_pairs(a01, 0x3fc03f80u + dd, 0x40404000u + dd, 0x40c04080u + dd);
}

/* The table of the unscaled magnitudes as fp16 bits (0.5 .. 6 = 0x3800, 0x3c00, 0x3e00, 0x4000,
 * 0x4200, 0x4400, 0x4600): with kl_mx_decode8, codes to fp16 pairs, exact (the scale is then
 * applied to the products' sums: gemm.h form 3). */
KL_HD static inline kl_mx_tab kl_mx_tab_f16(void)
{
    return kl_mx_tab_pairs(0x3800u << 16, 0x3e003c00u, 0x42004000u, 0x46004400u);
}

/* The sign bits of codes 2k, 2k + 1 of q at bits 15, 31 (k < 4). */
KL_HD static inline uint32_t kl_mx_signs(uint32_t q, unsigned k)
{
    const uint32_t h = k < 2 ? q : q >> 16;
    return (k & 1u ? (h & 0x8800u) * 0x00010010u : (h & 0x88u) * 0x01001000u) & 0x80008000u;
}

/* Codes 0..7 of q (code i: bits 4i .. 4i + 3) with table t into out[k] = bf16 bits of codes
 * 2k (low half) and 2k + 1 (high half). */
KL_HD static inline void kl_mx_decode8(uint32_t q, const kl_mx_tab *t, uint32_t out[4])
{
    const uint32_t m = q & 0x77777777u, m4 = m >> 16;
    const uint32_t lo03 = kl_mx_prmt(t->lo0, t->lo1, m), hi03 = kl_mx_prmt(t->hi0, t->hi1, m);
    const uint32_t lo47 = kl_mx_prmt(t->lo0, t->lo1, m4);
    const uint32_t hi47 = kl_mx_prmt(t->hi0, t->hi1, m4);
    out[0] = kl_mx_prmt(lo03, hi03, 0x5140u) | kl_mx_signs(q, 0);
    out[1] = kl_mx_prmt(lo03, hi03, 0x7362u) | kl_mx_signs(q, 1);
    out[2] = kl_mx_prmt(lo47, hi47, 0x5140u) | kl_mx_signs(q, 2);
    out[3] = kl_mx_prmt(lo47, hi47, 0x7362u) | kl_mx_signs(q, 3);
}

/* Codes i and i + 4 of q as an fp16 pair (i < 4: out[i], code i in the low half), each the
 * E2M1 value times 2^-14, exact, no table: a code's 3 magnitude bits placed at fp16 bits 9..11
 * (the exponent's two low bits and the top mantissa bit) read as 2^(e - 15) (1 + m/2), and
 * as the subnormal 2^-14 m/2 for e = 0, which is the code's value times 2^-14 in both cases;
 * the sign goes to bit 15.  Both codes of a pair sit 16 bits apart in q, so one shift moves
 * both: 2 shifts, 2 logic operations a pair, 15 operations for 8 codes.  The pairs (i, i + 4)
 * instead of (2k, 2k + 1) cost nothing where the vector is laid out the same way
 * (kernels/moe.cu's tensor-core decode). */
KL_HD static inline void kl_mx_f16_pairs(uint32_t q, uint32_t out[4])
{
    out[0] = ((q << 9) & 0x0e000e00u) | ((q << 12) & 0x80008000u);
    out[1] = ((q << 5) & 0x0e000e00u) | ((q << 8) & 0x80008000u);
    out[2] = ((q << 1) & 0x0e000e00u) | ((q << 4) & 0x80008000u);
    out[3] = ((q >> 3) & 0x0e000e00u) | (q & 0x80008000u);
}

/* The same for any scale: each code's fp32 product, its top 16 bits (exact in bf16 unless
 * subnormal below bf16's range, where this truncates as the float path always did). */
KL_HD static inline void kl_mx_decode8_slow(uint32_t q, uint8_t s, uint32_t out[4])
{
    const float sc = kl_e8m0_value(s);
    for (unsigned k = 0; k < 4; k++) {
        const uint32_t b = q >> 8 * k;
        const uint32_t lo = kl_mx_f32_bits(kl_e2m1_value(b & 15u) * sc) >> 16;
        const uint32_t hi = kl_mx_f32_bits(kl_e2m1_value((b >> 4) & 15u) * sc) >> 16;
        out[k] = lo | hi << 16;
    }
}

/* Four words (32 codes, one scale block) into 16 bf16 pairs. */
KL_HD static inline void kl_mx_decode32(const uint32_t q[4], uint8_t s, uint32_t out[16])
{
    if (kl_mx_tab_ok(s)) {
        const kl_mx_tab t = kl_mx_tab_make(s);
        for (unsigned i = 0; i < 4; i++)
            kl_mx_decode8(q[i], &t, out + 4 * i);
    } else {
        for (unsigned i = 0; i < 4; i++)
            kl_mx_decode8_slow(q[i], s, out + 4 * i);
    }
}

#endif
