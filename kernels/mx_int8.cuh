/*
 * kernels/mx_int8.cuh — MXFP4 rows against one fp32 vector by integer dot products (the
 * experts' one-token gate/up, KL_GPU_MOE_DECODE=i8).  Included by .cu files only.
 *
 * Why: the fp32 form (row_dot.cuh's kl_mx2_*) spends ~5 warp instructions a code (measured:
 * docs/PERFORMANCE.md, session 21, run 9), and at the IPC its few warps reach, those
 * instructions take most of the kernel's time.  Here a word of 8 codes costs 7 integer
 * operations and 12 dp4a:
 *   - 2·E2M1 is an int8 in {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12}.  A byte permute (PTX prmt, its
 *     default mode) with the 8 magnitudes as its table turns 4 codes into 4 bytes; a selector
 *     nibble with bit 3 set (a negative code) yields the sign of the table's byte, 0.  So
 *     P = prmt(q) holds the positive codes' magnitudes, Q = prmt(q ^ 0x88888888) the negative
 *     ones', and a code times x is dp4a(P, x) - dp4a(Q, x).
 *   - x is staged in shared memory as three int8 digits under a per-32-block exponent:
 *     X_i = rint(x_i · 2^k) with 2^22 <= max |X| < 2^23, X = 65536 hi + 256 mid + lo (hi
 *     signed, mid and lo unsigned): x to 2^-23 of the block's largest, fp32's own precision.
 *   - Each digit's sum over a block is exact in int32 (|sum| <= 12 · 255 · 32); the block's
 *     value (65536 S_hi + 256 S_mid + S_lo) is made in fp32 and times the block's scale and
 *     2^-k / 2, accumulated in fp32 as the fp32 form does.
 * Loads are the fp32 form's (kl_mx2_buf, kl_mx2_load: a team of KL_MX2_TEAM lanes, each a
 * 16-byte block of codes and its scale byte, rounds in flight); only x's staging and the
 * arithmetic differ, so the sums differ from the fp32 form's by fp32 rounding only.
 * Measured (session 21): exact, but no faster in the experts' gate/up (moe.cu, version 7).
 */
#ifndef KL_KERNELS_MX_INT8_CUH
#define KL_KERNELS_MX_INT8_CUH

#include "kernels/row_dot.cuh"

#define KL_MXI_CHUNKS 6   /* 16-byte chunks of a staged block: hi, mid, lo digits, 32 each */

/* Shared memory of x [cols] staged by kl_mxi_x_fill: the digits, then a float a block. */
__host__ __device__ static inline size_t kl_mxi_x_bytes(uint32_t cols)
{
    return (size_t)cols / KL_MXFP4_BLOCK * (KL_MXI_CHUNKS * 16 + sizeof(float));
}

/* PTX prmt.b32 in its default mode: byte i of the result is byte (s_i & 7) of b:a, or, when
 * s_i (nibble i of s) has bit 3 set, that byte's sign bit repeated. */
__device__ static inline uint32_t kl_prmt(uint32_t a, uint32_t b, uint32_t s)
{
#if defined(__CUDA_ARCH__) && !defined(__HIP_PLATFORM_AMD__)
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
    return d;
#else
    const uint64_t v = (uint64_t)b << 32 | a;
    uint32_t d = 0;
    for (int i = 0; i < 4; i++) {
        const uint32_t n = (s >> (4 * i)) & 15u, byte = (uint32_t)(v >> (8 * (n & 7u))) & 255u;
        d |= (n & 8u ? (byte & 128u ? 255u : 0u) : byte) << (8 * i);
    }
    return d;
#endif
}

/* c + Σ_j a_j · b_j over the 4 bytes, a signed; b signed (SB) or unsigned. */
template <bool SB> __device__ static inline int32_t kl_dp4a(uint32_t a, uint32_t b, int32_t c)
{
#if defined(__CUDA_ARCH__) && !defined(__HIP_PLATFORM_AMD__)
    int32_t d;
    if (SB)
        asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    else
        asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    for (int j = 0; j < 4; j++) {
        const int32_t ab = (int8_t)(a >> (8 * j));
        const int32_t bb = SB ? (int32_t)(int8_t)(b >> (8 * j)) : (int32_t)((b >> (8 * j)) & 255u);
        c += ab * bb;
    }
    return c;
#endif
}

/* The 8 magnitudes of 2·E2M1 (codes 0-7) as prmt's table: bytes 0-3 and 4-7. */
#define KL_MXI_T0 0x03020100u
#define KL_MXI_T1 0x0c080604u

/* x [cols] (cols % 32 == 0) staged into sh for kl_mxi_*: block b's digits at sh + 96 b (hi,
 * mid, lo: 32 bytes each, code order), 2^-k / 2 of block b at the float (float *)(sh +
 * 96 nb) + b (NaN where the block holds an Inf or a NaN).  Every thread of the block; a warp a
 * 32-block at a time, lane i its element i; a barrier after. */
__device__ static inline void kl_mxi_x_fill(uint8_t *sh, const float *x, uint32_t cols)
{
    const uint32_t nb = cols / KL_MXFP4_BLOCK, lane = threadIdx.x % KL_GPU_GROUP;
    float *fac = (float *)(sh + (size_t)nb * KL_MXI_CHUNKS * 16);
    for (uint32_t b = threadIdx.x / KL_GPU_GROUP; b < nb; b += blockDim.x / KL_GPU_GROUP) {
        const float v = x[(size_t)b * KL_MXFP4_BLOCK + lane];
        float amax = isnan(v) ? INFINITY : fabsf(v);   /* fmaxf would drop a NaN */
        for (int o = KL_GPU_GROUP / 2; o > 0; o /= 2)
            amax = fmaxf(amax, kl_gpu_shfl_xor(amax, o));
        int e = 0;
        (void)frexpf(amax, &e);              /* amax < 2^e */
        const int k = amax > 0.0f ? 23 - e : 0;
        const int32_t X = isfinite(amax) ? __float2int_rn(ldexpf(v, k)) : 0;
        uint8_t *d = sh + (size_t)b * KL_MXI_CHUNKS * 16 + lane;
        d[0] = (uint8_t)((uint32_t)X >> 16);   /* hi: X >> 16 (arithmetic) in [-128, 127] */
        d[32] = (uint8_t)((uint32_t)X >> 8);
        d[64] = (uint8_t)X;
        if (lane == 0)
            fac[b] = isfinite(amax) ? ldexpf(0.5f, -k) : __int_as_float(0x7fc00000);
    }
}

/* acc[i] += the round's blocks of row i (w: kl_mx2_load's) times x staged by kl_mxi_x_fill. */
template <int R, int U>
__device__ static inline void kl_mxi_dot(const kl_mx2_buf<R, U> &w, const uint8_t *xs,
                                         uint32_t nb, uint32_t b0, float *acc)
{
    const float *fac = (const float *)(xs + (size_t)nb * KL_MXI_CHUNKS * 16);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t b = b0 + u * KL_MX2_TEAM;
        if (b >= nb)
            continue;
        const uint4 *xb = (const uint4 *)(xs + (size_t)b * KL_MXI_CHUNKS * 16);
        uint32_t dg[3][8];   /* digits hi, mid, lo: word j holds codes 4j .. 4j + 3 */
#pragma unroll
        for (int c = 0; c < KL_MXI_CHUNKS; c++) {
            const uint4 v = xb[c];
            uint32_t *o = &dg[c / 2][(c % 2) * 4];
            o[0] = v.x;
            o[1] = v.y;
            o[2] = v.z;
            o[3] = v.w;
        }
        const float f = fac[b];
#pragma unroll
        for (int i = 0; i < R; i++) {
            const uint4 &q4 = w.q[u][i];
            int32_t pos[3] = {0, 0, 0}, neg[3] = {0, 0, 0};
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const uint32_t q = v == 0 ? q4.x : v == 1 ? q4.y : v == 2 ? q4.z : q4.w;
                const uint32_t qn = q ^ 0x88888888u;
                const uint32_t p0 = kl_prmt(KL_MXI_T0, KL_MXI_T1, q),
                               p1 = kl_prmt(KL_MXI_T0, KL_MXI_T1, q >> 16),
                               n0 = kl_prmt(KL_MXI_T0, KL_MXI_T1, qn),
                               n1 = kl_prmt(KL_MXI_T0, KL_MXI_T1, qn >> 16);
                pos[0] = kl_dp4a<true>(p1, dg[0][2 * v + 1],
                                       kl_dp4a<true>(p0, dg[0][2 * v], pos[0]));
                neg[0] = kl_dp4a<true>(n1, dg[0][2 * v + 1],
                                       kl_dp4a<true>(n0, dg[0][2 * v], neg[0]));
#pragma unroll
                for (int g = 1; g < 3; g++) {
                    pos[g] = kl_dp4a<false>(p1, dg[g][2 * v + 1],
                                            kl_dp4a<false>(p0, dg[g][2 * v], pos[g]));
                    neg[g] = kl_dp4a<false>(n1, dg[g][2 * v + 1],
                                            kl_dp4a<false>(n0, dg[g][2 * v], neg[g]));
                }
            }
            const float block = ((float)(pos[0] - neg[0]) * 65536.0f +
                                 (float)(pos[1] - neg[1]) * 256.0f) +
                                (float)(pos[2] - neg[2]);
            acc[i] = fmaf(block, kl_e8m0_value((uint8_t)w.s[u][i]) * f, acc[i]);
        }
    }
}

/* kl_mx2_block_run with x [cols] staged into sh by kl_mxi_x_fill and the team's R rows in
 * kl_mx2_rounds_pipe's rounds by kl_mxi_dot. */
template <int R, int U>
__device__ static inline void kl_mxi_block_dot(const uint8_t *const *rows,
                                               const uint8_t *const *scales, const float *x,
                                               uint32_t cols, uint8_t *sh, unsigned tl,
                                               float *out)
{
    kl_mx2_block_run<R, U>(
        rows, scales, cols, tl, [&] { kl_mxi_x_fill(sh, x, cols); },
        [&](kl_mx2_buf<R, U> &w, uint32_t nb) {
            kl_mx2_rounds_pipe<R, U>(
                w, rows, scales, nb, tl, out,
                [&](const kl_mx2_buf<R, U> &b, uint32_t b0, float *acc) {
                    kl_mxi_dot<R, U>(b, sh, nb, b0, acc);
                },
                1.0f);
        });
}

#endif
