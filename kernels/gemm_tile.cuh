/*
 * kernels/gemm_tile.cuh — the tile geometry and the walk of gemm.cu's version 2 kernels
 * (KL_GPU_GEMM_TILES=v2, the default), host and device (KL_HD): the raw copies of a K step,
 * their decode into the bf16 tiles, the warps' fragment origins and the output.  The kernels
 * run these with threadIdx.x and cp.async; tests/gpu/test_gemm.cu runs the very same
 * functions on the host for every thread (copies done at once) and replays the fragments in
 * double, so the index arithmetic is checked where no GPU is.  Included by .cu files only.
 *
 * A block (256 threads, 8 warps) owns WROWS rows of W and BN tokens; K walks in steps of KT = 64
 * (cols % 64 == 0).  Two shapes:
 *   BN 16 (grouped: segments of ~8 rows): WROWS 256, warps 8 (W) x 1 (tokens);
 *   BN 64 (dense):                        WROWS 128, warps 4 (W) x 2 (tokens);
 * warp w covers W rows 16 FW (w % WARPS_W) .. + 16 FW and tokens 16 FT (w / WARPS_W) .. + 16 FT
 * as FW x FT fragments of 16 x 16.
 * Shared memory, in bytes from the dynamic base (every region 32-byte aligned):
 *   ring  [STAGES][W raw | scale words (MXFP4) | X raw fp32]  the raw copies of a step
 *   wt    [WROWS][LDS] bf16                                       W decoded
 *   xt    [3][BN][LDS] bf16                                    X as hi, lo, lo2
 *   xsrc  [BN] u32                                             the tile's source rows of x
 * After K the ring holds the output tile c [BN][C_LD] fp32.
 * Step k's copies go to stage k % STAGES; they are issued STAGES - 1 steps ahead.
 */
#ifndef KL_KERNELS_GEMM_TILE_CUH
#define KL_KERNELS_GEMM_TILE_CUH

#include "kernels/gpu.h"

#include "kernels/mx_bf16.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KL_GT_THREADS 256u
#define KL_GT_KT      64u /* K per step */
#define KL_GT_LDS     72u /* bf16 per tile row: 144 bytes, fragment rows 32-byte aligned */
#define KL_GT_FW      2u  /* W fragments per warp */

/* The geometry of the tile of BN tokens (16 or 64) with MX (1: MXFP4 W, 0: BF16). */
template <int MX, int BN> struct kl_gt {
    static constexpr unsigned WROWS = BN == 16 ? 256u : 128u;
    static constexpr unsigned WARPS_W = WROWS / (16u * KL_GT_FW);
    static constexpr unsigned WARPS_T = 8u / WARPS_W;
    static constexpr unsigned FT = BN / (16u * WARPS_T);
    static constexpr unsigned STAGES = MX ? (BN == 16 ? 4u : 3u) : (BN == 16 ? 3u : 2u);
    static constexpr unsigned W_UNITS = WROWS * (MX ? 2u : 8u); /* 16-byte pieces of W a step */
    static constexpr unsigned X_UNITS = 16u * BN;            /* 16-byte pieces of X a step */
    static constexpr unsigned W_BYTES = 16u * W_UNITS;
    static constexpr unsigned SC_BYTES = MX ? 4u * WROWS : 0u;
    static constexpr unsigned X_OFF = W_BYTES + SC_BYTES; /* in a stage */
    static constexpr unsigned STAGE = X_OFF + 16u * X_UNITS;
    static constexpr unsigned RING = STAGES * STAGE;
    static constexpr unsigned WT = RING;
    static constexpr unsigned XT_BYTES = BN * KL_GT_LDS * 2u;
    static constexpr unsigned XT = WT + WROWS * KL_GT_LDS * 2u;
    static constexpr unsigned XSRC = XT + 3u * XT_BYTES;
    static constexpr unsigned SMEM = XSRC + 4u * BN;
    static constexpr unsigned C_LD = WROWS + 4u; /* floats per row of c */
    static_assert(WARPS_W * WARPS_T == 8 && FT * 16u * WARPS_T == BN, "8 warps cover the tile");
    static_assert(RING % 32 == 0 && XT % 32 == 0 && XT_BYTES % 32 == 0, "32-byte regions");
    static_assert(4u * BN * C_LD <= RING, "c fits in the ring");
    static_assert(SMEM <= (MX || BN == 64 ? 113u : 227u) * 1024u,
                  "two blocks per multiprocessor (BF16 tiles of 16 tokens: one)");
};

/* Where a block's rows are: rows r0 .. r0 + WROWS of a matrix of `rows` valid rows and `cols`
 * columns whose first stored row is wrow0 (expert e of a stack: e * rows). */
struct kl_gt_rows {
    uint32_t rows, cols, r0;
    size_t   wrow0;
};

/* The payloads a step copies from (device or, in the test, host memory). */
struct kl_gt_src {
    const uint8_t  *w;     /* MXFP4 codes or BF16 values of the whole stack */
    const uint8_t  *scale; /* MXFP4 scales, or NULL */
    const float    *x;
};

/* Copies `bytes` of src to dst (size 16 or 4) and zero-fills the rest of size; bytes 0 reads
 * nothing.  CUDA: cp.async, completed by kl_gt_commit / kl_gt_wait; elsewhere at once. */
KL_HD static inline void kl_gt_copy(uint8_t *dst, const uint8_t *src, unsigned size,
                                    unsigned bytes)
{
#if defined(__CUDA_ARCH__) && !defined(__HIP_PLATFORM_AMD__)
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (size == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                     "r"(bytes)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
                     "r"(bytes)
                     : "memory");
#elif defined(__HIP_DEVICE_COMPILE__)
    if (size == 16 && bytes == 16) {
        *(uint4 *)dst = *(const uint4 *)src;
        return;
    }
    for (unsigned i = 0; i < size; i++)
        dst[i] = i < bytes ? src[i] : 0;
#else
    memcpy(dst, src, bytes);
    memset(dst + bytes, 0, size - bytes);
#endif
}

/* The byte index in the scale array of row grow's first scale of the step at k0: even, since
 * cols % 64 == 0 and k0 % 64 == 0. */
KL_HD static inline size_t kl_gt_scale_idx(size_t grow, uint32_t cols, uint32_t k0)
{
    return grow * (cols / 32u) + k0 / 32u;
}

/* Thread t's copies of the step at k0 (nothing past K) into `stage`: W unit u (MXFP4: row
 * u / 2, the 32 codes at column k0 + 32 (u % 2); BF16: row u / 8, the 8 values at column
 * k0 + 8 (u % 8)) to stage + 16 u; MXFP4 row r's scale word, the aligned word holding the
 * step's two scales a, a + 1 (a = kl_gt_scale_idx, even), read whole when a % 4 == 2 and as
 * its first 2 bytes when a % 4 == 0 (nothing past a + 1 is read), to W_BYTES + 4 r; X unit u
 * (token u / 16, source row xsrc[u / 16], the 4 floats at column k0 + 4 (u % 16)) to X_OFF +
 * 16 u.  Rows past b.rows and tokens past nt are zero-filled. */
template <int MX, int BN>
KL_HD static inline void kl_gt_issue(const kl_gt_rows &b, const kl_gt_src &s,
                                     const uint32_t *xsrc, uint32_t nt, uint32_t k0,
                                     uint8_t *stage, unsigned t)
{
    typedef kl_gt<MX, BN> G;
    if (k0 >= b.cols)
        return;
    for (unsigned u = t; u < G::W_UNITS; u += KL_GT_THREADS) {
        const unsigned r = MX ? u / 2u : u / 8u, p = MX ? u % 2u : u % 8u;
        const size_t grow = b.wrow0 + b.r0 + r;
        const size_t src = MX ? grow * (b.cols / 2u) + k0 / 2u + 16u * p
                              : 2u * (grow * b.cols + k0 + 8u * p);
        const int ok = b.r0 + r < b.rows;
        kl_gt_copy(stage + 16u * u, s.w + (ok ? src : 0), 16, ok ? 16 : 0);
    }
    for (unsigned r = t; MX && r < G::WROWS; r += KL_GT_THREADS) {
        const size_t a = kl_gt_scale_idx(b.wrow0 + b.r0 + r, b.cols, k0);
        const int ok = b.r0 + r < b.rows;
        kl_gt_copy(stage + G::W_BYTES + 4u * r, s.scale + (ok ? a & ~(size_t)3 : 0), 4,
                   ok ? (a & 3u ? 4 : 2) : 0);
    }
    for (unsigned u = t; u < G::X_UNITS; u += KL_GT_THREADS) {
        const unsigned tok = u / 16u;
        const int ok = tok < nt;
        const size_t src = ok ? ((size_t)xsrc[tok] * b.cols + k0 + 4u * (u % 16u)) * 4u : 0;
        kl_gt_copy(stage + G::X_OFF + 16u * u, (const uint8_t *)s.x + src, 16, ok ? 16 : 0);
    }
}

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

/* Thread t's part of decoding the step at k0 from `stage` into the tiles of sm (the dynamic
 * base): W unit u to wt row r, columns 32 (u % 2) .. + 32 (MXFP4, codes times the row's
 * scale, exact; mx_bf16.h) or 8 (u % 8) .. + 8 (BF16); X unit u, if its token is below
 * kl_gt_frag_rows(nt), to the three parts' rows u / 16, columns 4 (u % 16) .. + 4. */
template <int MX, int SP, int BN>
KL_HD static inline void kl_gt_decode(const kl_gt_rows &b, uint32_t k0, uint32_t nt,
                                      const uint8_t *stage, uint8_t *sm, unsigned t)
{
    typedef kl_gt<MX, BN> G;
    uint16_t *wt = (uint16_t *)(sm + G::WT), *xt = (uint16_t *)(sm + G::XT);
    for (unsigned u = t; u < G::W_UNITS; u += KL_GT_THREADS) {
        const uint4 q = *(const uint4 *)(stage + 16u * u);
        if (!MX) {
            *(uint4 *)&wt[(u / 8u) * KL_GT_LDS + 8u * (u % 8u)] = q;
            continue;
        }
        const unsigned r = u / 2u, h = u % 2u;
        const unsigned a = (unsigned)(kl_gt_scale_idx(b.wrow0 + b.r0 + r, b.cols, k0) & 3u);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        uint32_t out[16];
        kl_mx_decode32(w, stage[G::W_BYTES + 4u * r + a + h], out);
        uint4 *dst = (uint4 *)&wt[r * KL_GT_LDS + 32u * h];
        for (int i = 0; i < 4; i++)
            dst[i] = make_uint4(out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
    }
    for (unsigned u = t; u < G::X_UNITS; u += KL_GT_THREADS) {
        if (u / 16u >= kl_gt_frag_rows(nt))
            continue;
        const float4 v = *(const float4 *)(stage + G::X_OFF + 16u * u);
        kl_gt_stage_x4<SP>(v, xt, BN * KL_GT_LDS, (u / 16u) * KL_GT_LDS + 4u * (u % 16u));
    }
}

/* Warp w's first W row and first token in the tile. */
template <int BN> KL_HD static inline unsigned kl_gt_warp_row(unsigned w)
{
    return 16u * KL_GT_FW * (w % kl_gt<1, BN>::WARPS_W);
}

template <int BN> KL_HD static inline unsigned kl_gt_warp_tok(unsigned w)
{
    return 16u * kl_gt<1, BN>::FT * (w / kl_gt<1, BN>::WARPS_W);
}

/* Thread t's part of writing the output tile c [token][row] (fp32, C_LD a row) to y rows
 * t0 .. t0 + nt (packed order), columns b.r0 .. of the matrix's b.rows. */
template <int BN>
KL_HD static inline void kl_gt_write_y(const kl_gt_rows &b, const float *c, uint32_t t0,
                                       uint32_t nt, float *y, unsigned t)
{
    typedef kl_gt<1, BN> G;
    for (unsigned i = t; i < nt * G::WROWS; i += KL_GT_THREADS) {
        const unsigned tok = i / G::WROWS, col = i % G::WROWS;
        if (b.r0 + col < b.rows)
            y[(size_t)(t0 + tok) * b.rows + b.r0 + col] = c[tok * G::C_LD + col];
    }
}

#endif
