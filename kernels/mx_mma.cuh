/*
 * kernels/mx_mma.cuh — MXFP4 rows against one fp32 vector on the tensor cores, for decode
 * (kernels/moe.cu's experts, version 6).  Included by .cu files after kernels/mma.cuh.
 *
 * Why: the fp32 path (kl_mx2_rows) spends ~4 operations a code, one of them a shared-memory
 * load of the E2M1 table, and an SM's shared memory serves 32 lanes' loads a cycle: at
 * Kimi-Linear's decode (top 8, I = 1024, H = 2304) that alone is ~75 M loads a layer, ~9 us
 * on 132 SMs against 7.2 us for the 30 MB of codes at the copy rate (session 16's trace:
 * gate/up 12.5, down 10.6 us a layer).  Here a code costs ~3 operations and no table.
 *
 * A group of 32 lanes (lane 4 g + c) multiplies a tile of 16 rows by the vector over a range
 * of 32-code blocks (whole quads of 4 blocks).  For one block, lane 4 g + c needs word c
 * (codes 8c .. 8c + 7) of rows g and g + 8: kl_mx_f16_pairs turns a word into 4 fp16 pairs
 * (codes i, i + 4), each code its E2M1 value times 2^-14, exact.  Two mma.m16n8k16 (fp16 in,
 * fp32 sums) then take A = pairs 0, 1 and 2, 3 of both rows (a[0], a[1] = row g, g + 8 of the
 * first pair, a[2], a[3] of the second), and B = the vector's matching values: the k order
 * inside a block is a permutation of the codes, the same in A and B, so the dot product is
 * unchanged.  B's column 0 holds the vector's fp16 high part, column 1 its low part (the rest
 * of fp32's mantissa: the two give ~22 bits), columns 2..7 repeat column 0 and are not read;
 * the vector is scaled by 2^k first so that its largest |value| is in [2^14, 2^15) (fp16 has
 * 5 exponent bits).  The sums of a block land in lane 4 g (rows g, g + 8, columns 0, 1); that
 * lane adds hi + lo times the block's scale (2^(s - 127)) to its row's fp32 sum, and the
 * caller multiplies the end sum by 2^(14 - k).  The sums differ from the fp32 path's in
 * rounding only (the products of fp16 values are exact; the tensor core adds them in fp32).
 *
 * Loads: a word a lane (8 rows x 16 bytes a warp load) touches 8 lines for 128 bytes, and
 * the first version, loading so, ran at ~1.2 TB/s (run 1 of session 17: gate/up 17.1 us a
 * layer against 12.6 for the fp32 path).  So lane 4 g + c loads block 4q + c of its rows
 * whole (16 bytes; the quad's 4 lanes 64 contiguous bytes of a row, 4 times the bytes a
 * load) and the quad transposes its 4 x 4 words by shuffles (kl_mxv_quad_transpose).
 *
 * The vector sits in shared memory per group as two planes (high, low parts) of 8-value
 * groups laid out as B reads them: group j = values 8j + {0, 4, 1, 5, 2, 6, 3, 7}, so lane
 * 4 g + c loads B of both mmas of block b with one 16-byte load of group 4b + c (lanes with
 * g = 1 from the low plane).
 *
 * Per lane, per quad and row pair of a matrix: 2 16-byte loads, 1 word of 4 scale bytes, 2
 * quad transposes (4 shuffles each), 8 x 15 integer operations, 8 mmas, 8 scale extractions,
 * 8 adds and 8 FMAs, and the 4 vector loads for every matrix the rows share: ~3 operations a
 * code, no table.
 */
#ifndef KL_KERNELS_MX_MMA_CUH
#define KL_KERNELS_MX_MMA_CUH

#include "kernels/gpu.h"
#include "kernels/mma.cuh"
#include "kernels/mx_bf16.h"

#define KL_MXV_TILE 16 /* rows a group multiplies together */

/* The 2^k that puts the largest |value| of a vector in [2^14, 2^15), as an exponent k
 * clamped to [-100, 100] (zero, subnormal or non-finite vectors stay finite where they can). */
__device__ static inline int kl_mxv_shift(float amax)
{
    const int k = 141 - (int)(__float_as_uint(amax) >> 23 & 255u);
    return k < -100 ? -100 : k > 100 ? 100 : k;
}

/* 2^k for |k| <= 126. */
__device__ static inline float kl_mxv_pow2(int k)
{
    return __uint_as_float((uint32_t)(k + 127) << 23);
}

/* fp16 pair (lo, hi) of two floats, rounded to nearest. */
__device__ static inline uint32_t kl_mxv_pair(float lo, float hi)
{
    return (uint32_t)__half_as_ushort(__float2half_rn(lo)) |
           (uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16;
}

/* The n values of x (n a multiple of 32, x 16-byte aligned) into a group's planes (n / 4
 * 16-byte entries: high parts, then low parts), scaled by 2^k; returns 2^(14 - k), the
 * factor of the group's end sums.  Every lane of the group calls it; the caller puts a
 * barrier between it and the first kl_mxv_block. */
__device__ static float kl_mxv_stage(const float *x, uint32_t n, uint4 *planes, unsigned lane)
{
    const float4 *x4 = (const float4 *)x;
    float amax = 0.0f;
    for (uint32_t j = lane; j < n / 8; j += KL_GPU_GROUP) {
        const float4 a = x4[2 * j], b = x4[2 * j + 1];
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w))));
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(b.x), fabsf(b.y)), fmaxf(fabsf(b.z), fabsf(b.w))));
    }
    for (int o = KL_GPU_GROUP / 2; o > 0; o /= 2)
        amax = fmaxf(amax, kl_gpu_shfl_xor(amax, o));
    const int k = kl_mxv_shift(amax);
    const float up = kl_mxv_pow2(k);
    for (uint32_t j = lane; j < n / 8; j += KL_GPU_GROUP) {
        const float4 a = x4[2 * j], b = x4[2 * j + 1];
        const float v[8] = {a.x * up, b.x * up, a.y * up, b.y * up,
                            a.z * up, b.z * up, a.w * up, b.w * up}; /* 0, 4, 1, 5, ... */
        uint32_t hi[4], lo[4];
        for (int i = 0; i < 4; i++) {
            hi[i] = kl_mxv_pair(v[2 * i], v[2 * i + 1]);
            const float h0 = __half2float(__ushort_as_half((unsigned short)(hi[i] & 0xffffu)));
            const float h1 = __half2float(__ushort_as_half((unsigned short)(hi[i] >> 16)));
            lo[i] = kl_mxv_pair(v[2 * i] - h0, v[2 * i + 1] - h1);
        }
        planes[j] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        planes[n / 8 + j] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
    return kl_mxv_pow2(14 - k);
}

/* A tile's two rows of one matrix for lane 4 g + c: codes and scale bytes of rows g, g + 8. */
struct kl_mxv_rows {
    const uint4   *q[2];
    const uint8_t *s[2];
};

/* Rows r (for lanes' row g) and r8 (row g + 8) of an MXFP4 matrix of cols columns. */
__device__ static inline kl_mxv_rows kl_mxv_rows_at(const uint8_t *packed, const uint8_t *scale,
                                                    uint32_t cols, size_t r, size_t r8)
{
    const size_t nb = cols / KL_MXFP4_BLOCK;
    const kl_mxv_rows t = {{(const uint4 *)(packed + r * (cols / 2)),
                            (const uint4 *)(packed + r8 * (cols / 2))},
                           {scale + r * nb, scale + r8 * nb}};
    return t;
}

/* Q quads of blocks (4 blocks, 16 bytes each a row) of R matrices' row pairs for one lane:
 * lane 4 g + c holds block 4 q + c of rows g and g + 8 (one 16-byte load each: a quad reads
 * 64 contiguous bytes of a row) and the 4 scale bytes of the quad of both rows. */
template <int R, int Q> struct kl_mxv_buf {
    uint4    w[R][2][Q];
    uint32_t s[R][2][Q];
};

/* Quads from block b (a multiple of 4) on, those below end (a multiple of 4), into w. */
template <int R, int Q>
__device__ static inline void kl_mxv_load(kl_mxv_buf<R, Q> &w, const kl_mxv_rows *rows,
                                          uint32_t b, uint32_t end, unsigned c)
{
#pragma unroll
    for (int q = 0; q < Q; q++) {
        const uint32_t bb = b + 4 * q;
#pragma unroll
        for (int m = 0; m < R; m++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                w.w[m][h][q] = bb < end ? rows[m].q[h][bb + c] : make_uint4(0, 0, 0, 0);
                w.s[m][h][q] = bb < end ? *(const uint32_t *)(rows[m].s[h] + bb) : 0u;
            }
        }
    }
}

/* The quad's 4 x 4 words transposed: lane c held words 0..3 of block c, it gets word c of
 * blocks 0..3 (two exchanges, with lanes c ^ 2 then c ^ 1, of 2 words each). */
__device__ static inline uint4 kl_mxv_quad_transpose(uint4 v, unsigned c)
{
    const int hi = c & 2, odd = c & 1;
    uint32_t r0 = kl_gpu_shfl_xor(hi ? v.x : v.z, 2), r1 = kl_gpu_shfl_xor(hi ? v.y : v.w, 2);
    const uint32_t a0 = hi ? r0 : v.x, a1 = hi ? r1 : v.y;
    const uint32_t a2 = hi ? v.z : r0, a3 = hi ? v.w : r1;
    r0 = kl_gpu_shfl_xor(odd ? a0 : a1, 1);
    r1 = kl_gpu_shfl_xor(odd ? a2 : a3, 1);
    return odd ? make_uint4(r0, a1, r1, a3) : make_uint4(a0, r0, a2, r1);
}

/* Scale byte j of a quad's word as a float: 2^(s - 127) for 1 <= s <= 254; s = 0 (2^-127)
 * reads as 0 and 255 (NaN) as infinity, so the sums differ from the fp32 path's only where
 * the products are below 2^-126 or not finite anyway.  Two operations. */
template <int J> __device__ static inline float kl_mxv_scale(uint32_t s4)
{
    return __uint_as_float((J < 3 ? s4 << (23 - 8 * J) : s4 >> 1) & 0x7f800000u);
}

/* acc[0] (row g), acc[1] (row g + 8) += one block of one matrix against B (xb). */
__device__ static inline void kl_mxv_block(uint32_t w0, uint32_t w8, float s0, float s8,
                                           uint4 xb, float (&acc)[2])
{
    uint32_t p0[4], p8[4];
    kl_mx_f16_pairs(w0, p0);
    kl_mx_f16_pairs(w8, p8);
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t a0[4] = {p0[0], p8[0], p0[1], p8[1]}, a1[4] = {p0[2], p8[2], p0[3], p8[3]};
    mma16816_f16(d, a0, xb.x, xb.y);
    mma16816_f16(d, a1, xb.z, xb.w);
    acc[0] = fmaf(s0, d[0] + d[1], acc[0]);
    acc[1] = fmaf(s8, d[2] + d[3], acc[1]);
}

/* One quad (held in w at q) of R matrices against the planes' blocks from xq. */
template <int R, int Q>
__device__ static inline void kl_mxv_quad(const kl_mxv_buf<R, Q> &w, int q, const uint4 *xq,
                                          unsigned c, float (&acc)[R][2])
{
    const uint4 xb[4] = {xq[0], xq[4], xq[8], xq[12]};
#pragma unroll
    for (int m = 0; m < R; m++) {
        const uint4 a = kl_mxv_quad_transpose(w.w[m][0][q], c);
        const uint4 b = kl_mxv_quad_transpose(w.w[m][1][q], c);
        const uint32_t s0 = w.s[m][0][q], s8 = w.s[m][1][q];
        kl_mxv_block(a.x, b.x, kl_mxv_scale<0>(s0), kl_mxv_scale<0>(s8), xb[0], acc[m]);
        kl_mxv_block(a.y, b.y, kl_mxv_scale<1>(s0), kl_mxv_scale<1>(s8), xb[1], acc[m]);
        kl_mxv_block(a.z, b.z, kl_mxv_scale<2>(s0), kl_mxv_scale<2>(s8), xb[2], acc[m]);
        kl_mxv_block(a.w, b.w, kl_mxv_scale<3>(s0), kl_mxv_scale<3>(s8), xb[3], acc[m]);
    }
}

/* acc[m] += the tile rows of matrix m against the staged vector over blocks b0 .. b1 - 1
 * (multiples of 4; planes staged from block b0 on, np entries a plane), Q quads a round with
 * the next round's loads in flight; w holds the first round (kl_mxv_load at b0), so a caller
 * can issue it early.  Valid sums on lanes 4 g (see the top). */
template <int R, int Q>
__device__ static inline void kl_mxv_run(kl_mxv_buf<R, Q> &w, const kl_mxv_rows *rows,
                                         uint32_t b0, uint32_t b1, const uint4 *planes,
                                         uint32_t np, unsigned lane, float (&acc)[R][2])
{
    const unsigned c = lane % 4;
    const uint4 *xp = planes + (lane / 4 == 1 ? np : 0) + c;
    for (uint32_t b = b0; b < b1; b += 4 * Q) {
        kl_mxv_buf<R, Q> next;
        if (b + 4 * Q < b1)
            kl_mxv_load<R, Q>(next, rows, b + 4 * Q, b1, c);
#pragma unroll
        for (int q = 0; q < Q; q++)
            if (b + 4 * q < b1) /* no break: hipcc then cannot unroll */
                kl_mxv_quad<R, Q>(w, q, xp + 4 * (b + 4 * q - b0), c, acc);
        if (b + 4 * Q < b1)
            w = next;
    }
}

#endif
