/*
 * kernels/gemm_mma.cu — version 5 of the prefill products (gemm.h): Y = X Wᵀ on
 * mma.sync.m16n8k16 with ldmatrix fragment loads, in the split form of gemm.h (x = hi + lo +
 * lo2, three bf16 products per K slice; form 2 sums a fragment's products of each K step of
 * 64 in a fresh fragment and adds it to the running sums in fp32).
 *
 * x is split once per product input into bf16 parts (m5_split_kernel: [m][3][cols], gathered
 * through x_row; a dense group's products share one split, the routed experts' up product
 * reuses the gate product's).  Block: 4 x 2 warps; warp (w % 4, w / 4) owns W rows 64 (w % 4)
 * .. +64 (A: four m16 fragments) and tokens 32 (w / 4) .. +32 (B: four n8 fragments) of the
 * block's tile of 256 rows x 64 tokens, so per 16-wide K slice it loads 4 A fragments and
 * 2 x 3 B pairs (10 ldmatrix.x4) for 48 MMAs, and keeps 64 fp32 sums (and 64 of the step).
 * Warps whose tokens are all past the tile's skip the products; n8 fragments past the last
 * token are skipped too.  Dense products: a block per (256 rows, 64 tokens); grouped: a block
 * per (256 rows, expert) walks its segment in tiles of 64.
 *
 * Each K step's parts and weights are copied by cp.async two steps ahead into a ring of three
 * slots (rows of 72 bf16 = 144 bytes: the 8 rows of an ldmatrix land on distinct banks); MXFP4
 * codes are decoded from the slot into one of two bf16 W tiles by the threads that copied
 * them, the block rows' scales of the whole K copied once per tile.  One barrier per step.
 *
 * Count (grouped MXFP4 gate [1024, 2304] over 32,768 rows, chunks of 4,096: 4 x 256 blocks,
 * ~2 tiles of 64 tokens each, 36 steps): per block-step 1,536 MMAs (~2,600 clocks at the
 * mma.sync probe's 1.7 per MMA per SM) and a decode of 2 code blocks a thread with the copies
 * in flight underneath: ~3,000 clocks, 7.8 blocks per SM x 72 steps = 1.7M clocks = ~0.85 ms,
 * plus the split (755 MB moved, ~0.25 ms, shared with the up product).  Measured (H200,
 * session 9): 2,375 µs (65 TFLOPS of product), the dense [4096, 2304] x 4,096 829 µs (93
 * TFLOPS): a block-step takes ~3 µs (~5,900 clocks), one block of 8 warps per SM (232
 * registers, ~190 KiB of shared memory) hides little latency, and the grouped tiles are ~80%
 * full (segments of ~128 rows in tiles of 64).  Version 4 (the same warps with the next step's
 * loads held in registers and x split in the loop, session 8) measured slower at every shape
 * (2,728 and 1,229 µs) and was removed.
 */
#include "kernels/gemm_mma.h"
#include "kernels/gpu.h"

#include "kernels/gemm_split.cuh"
#include "kernels/mma.cuh"
#include "kernels/mx_bf16.h"

#define MT_KT KL_GPU_MMA_KT
#define MT_LD (MT_KT + 8) /* bf16 per staged row */

/* A block of RW x TW warps: its tile and staged sizes. */
template <int RW, int TW> struct mt {
    enum : unsigned {
        THREADS = 32 * RW * TW,
        BR = 64 * RW,                           /* W rows */
        BT = 32 * TW,                           /* tokens */
        W_ELEMS = BR * MT_LD,                   /* bf16 of the W tile */
        X_ELEMS = BT * MT_LD,                   /* bf16 of one X part */
    };
};

__device__ static inline void mt_zero(float (&acc)[4][4][4])
{
#pragma unroll
    for (unsigned i = 0; i < 4; i++)
#pragma unroll
        for (unsigned jn = 0; jn < 4; jn++)
#pragma unroll
            for (unsigned e = 0; e < 4; e++)
                acc[i][jn][e] = 0.0f;
}

/* One 16-wide slice's products into s, part by part (hi, lo2, lo; SP 0: hi only) over all
 * the fragments in use, so consecutive MMAs are independent. */
template <int SP>
__device__ static inline void mul_slice(float (&s)[4][4][4], const uint32_t (&a)[4][4],
                                        const uint32_t (&b)[3][4][2], unsigned ng)
{
    const unsigned order[3] = {0, 2, 1}; /* hi, lo2, lo */
#pragma unroll
    for (unsigned o = 0; o < (SP ? 3u : 1u); o++)
#pragma unroll
        for (unsigned j = 0; j < 4; j++) {
            if (j >= ng)
                continue;
#pragma unroll
            for (unsigned i = 0; i < 4; i++)
                mma16816(s[i][j], a[i], b[order[o]][j][0], b[order[o]][j][1]);
        }
}

/* The warp's A fragments (W rows 16 i .. of its 64) and the B fragments of X parts p < np
 * (tokens 8 j .., n8 fragments j < ng) at column kk of the staged step, by ldmatrix. */
template <int RW, int TW, unsigned P>
__device__ static inline void mt_frags(uint32_t (&a)[4][4], uint32_t (&b)[P][4][2],
                                       const uint16_t *pa, const uint16_t *pb, unsigned kk,
                                       unsigned np, unsigned ng)
{
    typedef mt<RW, TW> T;
#pragma unroll
    for (unsigned i = 0; i < 4; i++)
        ldsm4(a[i], pa + 16 * i * MT_LD + kk);
#pragma unroll
    for (unsigned p = 0; p < P; p++)
#pragma unroll
        for (unsigned jj = 0; jj < 2; jj++) {
            if (p >= np || 2 * jj >= ng)
                continue;
            uint32_t r[4];
            ldsm4(r, pb + p * T::X_ELEMS + 16 * jj * MT_LD + kk);
            b[p][2 * jj][0] = r[0], b[p][2 * jj][1] = r[1];
            b[p][2 * jj + 1][0] = r[2], b[p][2 * jj + 1][1] = r[3];
        }
}

/* acc[i][j] += W rows (16 i ..) x tokens (8 j ..) of this warp over the staged step: the W
 * tile wt [BR][MT_LD], the X parts xt [3][BT][MT_LD].  Form 2 (SP 2) sums the step's 12
 * products of a fragment in a fresh one and adds it to acc in fp32 once per step of 64, as
 * version 1 does (session 8 added it every 16-wide slice: 4x the additions). */
template <int SP, int RW, int TW>
__device__ static inline void mt_mul(float (&acc)[4][4][4], const uint16_t *wt,
                                     const uint16_t *xt, uint32_t nt)
{
    const unsigned lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const unsigned row0 = 64 * (w % RW), tok0 = 32 * (w / RW);
    if (tok0 >= nt)
        return;
    const unsigned ng = nt - tok0 >= 32 ? 4 : (nt - tok0 + 7) / 8; /* n8 fragments in use */
    const uint16_t *pa = wt + (row0 + lane % 16) * MT_LD + (lane / 16) * 8;
    const uint16_t *pb = xt + (tok0 + (lane / 16) * 8 + lane % 8) * MT_LD + ((lane / 8) % 2) * 8;
    float part[4][4][4];
    if (SP == 2)
        mt_zero(part);
#pragma unroll
    for (unsigned kk = 0; kk < MT_KT; kk += 16) {
        uint32_t a[4][4], b[3][4][2];
        mt_frags<RW, TW>(a, b, pa, pb, kk, SP ? 3u : 1u, ng);
        if (SP == 2)
            mul_slice<SP>(part, a, b, ng);
        else
            mul_slice<SP>(acc, a, b, ng);
    }
    if (SP == 2)
#pragma unroll
        for (unsigned i = 0; i < 4; i++)
#pragma unroll
            for (unsigned j = 0; j < 4; j++)
#pragma unroll
                for (unsigned e = 0; e < 4; e++)
                    acc[i][j][e] += part[i][j][e];
}

/* Form 3 (gemm.h: fp16 operands, MXFP4 weights): acc[i][j] += the step's products, the two
 * parts (hi, lo) of x against the unscaled codes of each 32-wide scale block summed in a fresh
 * fragment, added times the block's scale of each row (sc: the block rows' E8M0 scales,
 * sc_stride a row, blk0 the step's first block). */
template <int RW, int TW>
__device__ static inline void mt_mul16(float (&acc)[4][4][4], const uint16_t *wt,
                                       const uint16_t *xt, uint32_t nt, const uint8_t *sc,
                                       uint32_t sc_stride, uint32_t blk0)
{
    const unsigned lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4;
    const unsigned row0 = 64 * (w % RW), tok0 = 32 * (w / RW);
    if (tok0 >= nt)
        return;
    const unsigned ng = nt - tok0 >= 32 ? 4 : (nt - tok0 + 7) / 8; /* n8 fragments in use */
    const uint16_t *pa = wt + (row0 + lane % 16) * MT_LD + (lane / 16) * 8;
    const uint16_t *pb = xt + (tok0 + (lane / 16) * 8 + lane % 8) * MT_LD + ((lane / 8) % 2) * 8;
    for (unsigned blk = 0; blk < MT_KT / KL_MXFP4_BLOCK; blk++) {
        float part[4][4][4];
        mt_zero(part);
#pragma unroll
        for (unsigned half = 0; half < 2; half++) {
            const unsigned kk = KL_MXFP4_BLOCK * blk + 16 * half;
            uint32_t a[4][4], b[2][4][2];
            mt_frags<RW, TW>(a, b, pa, pb, kk, 2u, ng);
#pragma unroll
            for (unsigned p = 0; p < 2; p++)
#pragma unroll
                for (unsigned j = 0; j < 4; j++) {
                    if (j >= ng)
                        continue;
#pragma unroll
                    for (unsigned i = 0; i < 4; i++)
                        mma16816_f16(part[i][j], a[i], b[p][j][0], b[p][j][1]);
                }
        }
#pragma unroll
        for (unsigned i = 0; i < 4; i++)
#pragma unroll
            for (unsigned h = 0; h < 2; h++) {
                const unsigned r = row0 + 16 * i + g + 8 * h;
                const float s = kl_e8m0_value(sc[r * sc_stride + blk0 + blk]);
#pragma unroll
                for (unsigned j = 0; j < 4; j++) {
                    acc[i][j][2 * h] += part[i][j][2 * h] * s;
                    acc[i][j][2 * h + 1] += part[i][j][2 * h + 1] * s;
                }
            }
    }
}

/* The warp's sums into y [*, R] rows t0 + token (packed order), columns from the block's
 * first W row r0, masked to the matrix (R rows) and tile; xs (form 3, else NULL): each packed
 * row's factor undoing its scaling. */
template <int RW, int TW>
__device__ static inline void mt_store(const float (&acc)[4][4][4], uint32_t R, uint32_t r0,
                                       float *y, uint32_t t0, uint32_t nt, const float *xs)
{
    const unsigned lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, q = lane % 4;
    const uint32_t row0 = r0 + 64 * (w % RW), tok0 = 32 * (w / RW);
#pragma unroll
    for (unsigned i = 0; i < 4; i++)
#pragma unroll
        for (unsigned jn = 0; jn < 4; jn++)
#pragma unroll
            for (unsigned e = 0; e < 4; e++) {
                const uint32_t row = row0 + 16 * i + g + 8 * (e / 2);
                const uint32_t tok = tok0 + 8 * jn + 2 * q + e % 2;
                if (row < R && tok < nt)
                    y[(size_t)(t0 + tok) * R + row] = xs ? acc[i][jn][e] * xs[t0 + tok]
                                                         : acc[i][jn][e];
            }
}

/* ---- version 5: X split once into bf16 parts, each step copied by cp.async two ahead ------ */

/* x rows (x_row[i], or i) as their three bf16 parts, row i of parts [m][3][cols], for rows
 * below *count (NULL: m); a thread per four values. */
__global__ static void m5_split_kernel(const float *x, const uint32_t *x_row,
                                       const uint32_t *count, uint32_t m, uint32_t cols,
                                       uint16_t *parts)
{
    KL_GPU_GRID_WAIT();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, q = cols / 4;
    if (i >= (size_t)m * q || i / q >= (count ? *count : m))
        return;
    const size_t row = i / q, c = 4 * (i % q), src = x_row ? x_row[row] : row;
    kl_gt_stage_x4<1>(*(const float4 *)(x + src * cols + c), parts + row * 3 * cols, cols, c);
}

/* Form 3: x rows (x_row[i], or i) scaled by a power of two s_i that puts their largest |x| in
 * [2^13, 2^14), as two fp16 parts hi = fp16(s x), lo = fp16(s x - hi) in parts [m][3][cols]
 * (the third part unused), 1 / s_i in xs[i]; rows below *count (NULL: m); a group of 32 lanes
 * per row (cols % 4 == 0). */
__global__ static void m5_split16_kernel(const float *x, const uint32_t *x_row,
                                         const uint32_t *count, uint32_t m, uint32_t cols,
                                         uint16_t *parts, float *xs)
{
    KL_GPU_GRID_WAIT();
    const uint32_t row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= m || row >= (count ? *count : m))
        return;
    const float *xr = x + (size_t)(x_row ? x_row[row] : row) * cols;
    float most = 0.0f;
    for (uint32_t c = 4 * lane; c < cols; c += 128) {
        const float4 v = *(const float4 *)(xr + c);
        most = fmaxf(most, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    for (int o = 16; o > 0; o /= 2)
        most = fmaxf(most, kl_gpu_shfl_xor(most, o));
    int e = 0;
    frexpf(most, &e); /* most = f 2^e, f in [0.5, 1) */
    const int sh = most > 0.0f ? (14 - e < 126 ? 14 - e : 126) : 0;
    const float s = ldexpf(1.0f, sh);
    __half *hi = (__half *)(parts + (size_t)row * 3 * cols), *lo = hi + cols;
    for (uint32_t c = lane; c < cols; c += 32) {
        const float v = xr[c] * s;
        const __half h = __float2half_rn(v);
        hi[c] = h;
        lo[c] = __float2half_rn(v - __half2float(h));
    }
    if (lane == 0)
        xs[row] = ldexpf(1.0f, -sh);
}

#define M5_SLOTS 3 /* ring slots: steps k (read), k + 1 (landed or landing), k + 2 (issued) */

/* Shared memory of a version 5 block, in bytes: M5_SLOTS slots of [X parts 3 x BT x MT_LD
 * bf16 | W: BF16 the tile BR x MT_LD itself, MXFP4 the raw codes BR x 32 bytes], then for
 * MXFP4 two decoded W tiles and the block rows' scales of the whole K (BR x cols / 32). */
template <int MX, int RW, int TW> struct m5 {
    typedef mt<RW, TW> T;
    enum : unsigned {
        X_BYTES = 3 * T::X_ELEMS * 2,
        W_BYTES = MX ? T::BR * 32 : T::W_ELEMS * 2,
        SLOT = X_BYTES + W_BYTES,
        WT = M5_SLOTS * SLOT,                     /* MXFP4: decoded tiles */
        SC = WT + (MX ? 2 * T::W_ELEMS * 2 : 0),  /* MXFP4: scales */
    };
    static unsigned smem(uint32_t cols)
    {
        return SC + (MX ? T::BR * (cols / KL_MXFP4_BLOCK) : 0);
    }
};

/* What a version 5 block multiplies: W rows [r0, r0 + BR) of the matrix at stored row wrow0,
 * against rows t0 .. of parts (packed order). */
struct m5_job {
    kl_gpu_mat      m;
    size_t          wrow0;
    uint32_t        r0;
    const uint16_t *parts; /* [*][3][cols] */
    float          *y;
    const float    *xs;    /* form 3: each packed row's 1 / scale (else NULL) */
};

/* Thread t's copies of the step at k0 into a slot (nothing past K, nor for tokens >= nt: the
 * products of those tokens are not stored).  Rows past the matrix are zero-filled. */
template <int MX, int SP, int RW, int TW>
__device__ static inline void m5_issue(const m5_job &j, uint32_t t0, uint32_t nt, uint32_t k0,
                                       uint8_t *slot)
{
    typedef mt<RW, TW> T;
    const uint32_t cols = j.m.cols;
    if (k0 >= cols)
        return;
    uint16_t *xs = (uint16_t *)slot;
    const unsigned parts = SP == 3 ? 2 : SP ? 3 : 1;
    for (unsigned u = threadIdx.x; u < T::BT * parts * 8; u += T::THREADS) {
        const unsigned tok = u / (parts * 8), p = (u / 8) % parts, c = u % 8;
        if (tok < nt)
            copy16(xs + p * T::X_ELEMS + tok * MT_LD + 8 * c,
                   j.parts + ((size_t)(t0 + tok) * 3 + p) * cols + k0 + 8 * c, 16);
    }
    uint8_t *ws = slot + m5<MX, RW, TW>::X_BYTES;
    if (MX) {
        for (unsigned u = threadIdx.x; u < T::BR * 2; u += T::THREADS) {
            const unsigned r = u / 2, h = u % 2;
            const int ok = j.r0 + r < j.m.rows;
            const uint8_t *src = j.m.packed + (j.wrow0 + j.r0 + r) * (cols / 2) + k0 / 2 + 16 * h;
            copy16(ws + 32 * r + 16 * h, ok ? src : j.m.packed, ok ? 16 : 0);
        }
        return;
    }
    const uint16_t *d = (const uint16_t *)j.m.data;
    for (unsigned u = threadIdx.x; u < T::BR * 8; u += T::THREADS) {
        const unsigned r = u / 8, c = u % 8;
        const int ok = j.r0 + r < j.m.rows;
        const uint16_t *src = d + (j.wrow0 + j.r0 + r) * cols + k0 + 8 * c;
        copy16((uint16_t *)ws + r * MT_LD + 8 * c, ok ? src : d, ok ? 16 : 0);
    }
}

/* MXFP4: the block rows' scales of the whole K into shared memory (cols % 128 == 0, 4-byte
 * aligned rows); rows past the matrix are left alone (their products are not stored). */
template <int RW, int TW>
__device__ static inline void m5_scales(const m5_job &j, uint8_t *sc)
{
    typedef mt<RW, TW> T;
    const unsigned words = j.m.cols / KL_MXFP4_BLOCK / 4;
    for (unsigned u = threadIdx.x; u < T::BR * words; u += T::THREADS) {
        const unsigned r = u / words, w = u % words;
        if (j.r0 + r < j.m.rows)
            copy4(sc + 4 * u,
                  j.m.scale + (j.wrow0 + j.r0 + r) * (j.m.cols / KL_MXFP4_BLOCK) + 4 * w);
    }
}

/* MXFP4: a slot's raw codes of the step at k0 into a bf16 W tile (mx_bf16.h, exact; F16: fp16
 * without the scale, form 3).  Each thread takes the 16-byte units m5_issue gave it to copy,
 * so its own wait suffices. */
template <int RW, int TW, int F16>
__device__ static inline void m5_decode(const uint8_t *raw, const uint8_t *sc, uint32_t cols,
                                        uint32_t k0, uint16_t *wt)
{
    typedef mt<RW, TW> T;
    for (unsigned u = threadIdx.x; u < T::BR * 2; u += T::THREADS) {
        const unsigned r = u / 2, h = u % 2;
        const uint4 q4 = *(const uint4 *)(raw + 32 * r + 16 * h);
        const uint32_t q[4] = {q4.x, q4.y, q4.z, q4.w};
        uint32_t out[16];
        if (F16) {
            const kl_mx_tab t = kl_mx_tab_f16();
            for (unsigned i = 0; i < 4; i++)
                kl_mx_decode8(q[i], &t, out + 4 * i);
        } else {
            kl_mx_decode32(q, sc[r * (cols / KL_MXFP4_BLOCK) + k0 / KL_MXFP4_BLOCK + h], out);
        }
        uint4 *dst = (uint4 *)&wt[r * MT_LD + 32 * h];
#pragma unroll
        for (unsigned c = 0; c < 4; c++)
            dst[c] = make_uint4(out[4 * c], out[4 * c + 1], out[4 * c + 2], out[4 * c + 3]);
    }
}

/* y rows [t0, t0 + nt) of the block's W rows, every thread of the block.  Step k's copies are
 * committed as group k (one group per step, empty past K).  At step k a thread waits for its
 * own copies of step k (step k + 1's stay in flight), MXFP4: decodes the codes it copied
 * itself into tile k % 2 (last read by the products of step k - 2, before the previous
 * barrier), then the one barrier of the step makes step k visible to every warp and ends
 * their products of step k - 1, whose slot step k + 2's copies then take.  So a warp done
 * with its products decodes the next step while the others still multiply (with a barrier
 * between the decode and the products the tensor cores idled through every decode).  The
 * scales are read by other threads than copied them: one barrier before the first decode. */
template <int MX, int SP, int RW, int TW>
__device__ static void m5_tile(const m5_job &j, uint32_t t0, uint32_t nt, uint8_t *sm)
{
    typedef m5<MX, RW, TW> S;
    float acc[4][4][4];
    mt_zero(acc);
    const uint32_t steps = j.m.cols / MT_KT;
    if (MX)
        m5_scales<RW, TW>(j, sm + S::SC);
    for (uint32_t k = 0; k < 2; k++) {
        m5_issue<MX, SP, RW, TW>(j, t0, nt, k * MT_KT, sm + k * S::SLOT);
        copy_commit();
    }
    for (uint32_t k = 0; k < steps; k++) {
        copy_wait<1>();
        uint8_t *slot = sm + k % M5_SLOTS * S::SLOT;
        const uint16_t *wt = (const uint16_t *)(slot + S::X_BYTES);
        if (MX) {
            if (k == 0)
                __syncthreads(); /* every thread's scales */
            uint16_t *dec = (uint16_t *)(sm + S::WT) + (k % 2) * mt<RW, TW>::W_ELEMS;
            m5_decode<RW, TW, SP == 3>(slot + S::X_BYTES, sm + S::SC, j.m.cols, k * MT_KT,
                                       dec);
            wt = dec;
        }
        __syncthreads();
        m5_issue<MX, SP, RW, TW>(j, t0, nt, (k + 2) * MT_KT, sm + (k + 2) % M5_SLOTS * S::SLOT);
        copy_commit();
        if (SP == 3 && MX)
            mt_mul16<RW, TW>(acc, wt, (const uint16_t *)slot, nt, sm + S::SC,
                             j.m.cols / KL_MXFP4_BLOCK, k * (MT_KT / KL_MXFP4_BLOCK));
        else
            mt_mul<SP == 3 ? 2 : SP, RW, TW>(acc, wt, (const uint16_t *)slot, nt);
    }
    copy_wait<0>();
    mt_store<RW, TW>(acc, j.m.rows, j.r0, j.y, t0, nt, SP == 3 ? j.xs : NULL);
    __syncthreads(); /* the next tile's copies take slots 0 and 1 */
}

template <int MX, int SP, int RW, int TW>
__global__ static void __launch_bounds__(32 * RW * TW, 1)
    m5_grouped_kernel(kl_gpu_mat m, const uint16_t *parts, const float *xs, const uint32_t *seg,
                      float *y)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ uint4 mt_smem[];
    typedef mt<RW, TW> T;
    const uint32_t e = blockIdx.y, s0 = seg[e], s1 = seg[e + 1];
    const m5_job j = {m, (size_t)e * m.rows, blockIdx.x * T::BR, parts, y, xs};
    for (uint32_t t0 = s0; t0 < s1; t0 += T::BT)
        m5_tile<MX, SP, RW, TW>(j, t0, s1 - t0 < T::BT ? s1 - t0 : T::BT, (uint8_t *)mt_smem);
}

template <int MX, int SP, int RW, int TW>
__global__ static void __launch_bounds__(32 * RW * TW, 1)
    m5_dense_kernel(kl_gpu_mat m, const uint16_t *parts, const float *xs, uint32_t n, float *y)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ uint4 mt_smem[];
    typedef mt<RW, TW> T;
    const m5_job j = {m, 0, blockIdx.x * T::BR, parts, y, xs};
    const uint32_t t0 = blockIdx.y * T::BT;
    m5_tile<MX, SP, RW, TW>(j, t0, n - t0 < T::BT ? n - t0 : T::BT, (uint8_t *)mt_smem);
}

/* A kernel, its shared memory, and whether its limit was raised (once, at the first launch:
 * a setting of the function, not a stream operation). */
template <class F> struct mt_kernel {
    F        fn;
    unsigned smem;
    int      opted;
};

template <class F> static int mt_opt_in(mt_kernel<F> &k, kl_err *err)
{
    if (k.opted)
        return 0;
    if (KL_GPU_CHECK(err, hipFuncSetAttribute((const void *)k.fn,
                                              hipFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)k.smem)))
        return err->code;
    k.opted = 1;
    return 0;
}

/* ---- version 5's launchers ---------------------------------------------------------------- */

#define M5_MAX_COLS 4096u /* MXFP4: the scales of the whole K fit the shared memory */
#define M5_RW 4            /* blocks of 4 x 2 warps, 256 rows x 64 tokens, dense and grouped */
#define M5_TW 2

typedef void (*m5_grouped_fn)(kl_gpu_mat, const uint16_t *, const float *, const uint32_t *,
                              float *);
typedef void (*m5_dense_fn)(kl_gpu_mat, const uint16_t *, const float *, uint32_t, float *);

#define M5_G(mx, sp) {m5_grouped_kernel<mx, sp, M5_RW, M5_TW>, \
                      m5<mx, M5_RW, M5_TW>::smem(M5_MAX_COLS), 0}
#define M5_D(mx, sp) {m5_dense_kernel<mx, sp, M5_RW, M5_TW>, \
                      m5<mx, M5_RW, M5_TW>::smem(M5_MAX_COLS), 0}

/* [BF16, MXFP4][form]; form 3 runs only on MXFP4 (BF16 weights take form 2: m5_form) */
static mt_kernel<m5_grouped_fn> m5_grouped[2][4] = {
    {M5_G(0, 0), M5_G(0, 1), M5_G(0, 2), M5_G(0, 2)},
    {M5_G(1, 0), M5_G(1, 1), M5_G(1, 2), M5_G(1, 3)}};
static mt_kernel<m5_dense_fn> m5_dense[2][4] = {
    {M5_D(0, 0), M5_D(0, 1), M5_D(0, 2), M5_D(0, 2)},
    {M5_D(1, 0), M5_D(1, 1), M5_D(1, 2), M5_D(1, 3)}};

/* Shared memory of a version 5 launch over w. */
static unsigned m5_smem(const kl_gpu_mat &w)
{
    return w.kind == KL_GPU_W_MXFP4 ? m5<1, M5_RW, M5_TW>::smem(w.cols)
                                    : m5<0, M5_RW, M5_TW>::smem(w.cols);
}

/* The form version 5 runs for w when asked for `split`: form 3 needs MXFP4 weights. */
static int m5_form(const kl_gpu_mat &w, int split)
{
    return split == 3 && w.kind != KL_GPU_W_MXFP4 ? 2 : split;
}

/* Form 3's factors after the parts of m rows of cols (gemm.h: kl_gpu_gemm_parts_bytes). */
static float *m5_row_factors(uint16_t *parts, uint32_t m, uint32_t cols)
{
    return (float *)(parts + (size_t)m * 3 * cols);
}

extern "C" int kl_gpu_gemm_mma5_takes(const kl_gpu_mat *m)
{
#if defined(__HIP_PLATFORM_AMD__)
    return m && 0;
#else
    if (m->cols % MT_KT)
        return 0;
    return m->kind == KL_GPU_W_BF16 ||
           (m->cols % 128 == 0 && m->cols <= M5_MAX_COLS && (uintptr_t)m->scale % 4 == 0);
#endif
}

extern "C" int kl_gpu_gemm_split_x(const float *x, const uint32_t *x_row, const uint32_t *count,
                                   uint32_t m, uint32_t cols, uint16_t *parts, kl_gpu_stream s,
                                   kl_err *err)
{
    const size_t n4 = (size_t)m * (cols / 4);
    if (n4 == 0)
        return 0;
    m5_split_kernel<<<(unsigned)((n4 + 255) / 256), 256, 0, (hipStream_t)s>>>(x, x_row, count, m,
                                                                              cols, parts);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* x split for version 5 in form `form` (3: fp16 parts and row factors, else bf16 parts). */
static int m5_split(const float *x, const uint32_t *x_row, const uint32_t *count, uint32_t m,
                    uint32_t cols, uint16_t *parts, int form, hipStream_t s, kl_err *err)
{
    if (form != 3)
        return kl_gpu_gemm_split_x(x, x_row, count, m, cols, parts, (kl_gpu_stream)s, err);
    if (m == 0)
        return 0;
    m5_split16_kernel<<<(m + 7) / 8, 256, 0, s>>>(x, x_row, count, m, cols, parts,
                                                 m5_row_factors(parts, m, cols));
    return KL_GPU_CHECK(err, hipGetLastError());
}

extern "C" int kl_gpu_gemm_mma5_grouped(const kl_gpu_gemm_grouped_args *a, int split,
                                        kl_gpu_stream s, kl_err *err)
{
    const kl_gpu_mat &w = a->w->m;
    const int form = m5_form(w, split);
    if (!a->parts_ready && m5_split(a->x, a->x_row, a->seg + a->w->n, a->m_max, w.cols,
                                    a->parts, form, (hipStream_t)s, err))
        return err->code;
    mt_kernel<m5_grouped_fn> &k = m5_grouped[w.kind == KL_GPU_W_MXFP4][form];
    if (mt_opt_in(k, err))
        return err->code;
    typedef mt<M5_RW, M5_TW> T;
    const dim3 grid((w.rows + T::BR - 1) / T::BR, a->w->n);
    k.fn<<<grid, T::THREADS, m5_smem(w), (hipStream_t)s>>>(
        w, a->parts, m5_row_factors(a->parts, a->m_max, w.cols), a->seg, a->y);
    return KL_GPU_CHECK(err, hipGetLastError());
}

extern "C" int kl_gpu_gemm_mma5(const kl_gpu_mat *w, const float *x, uint16_t *parts,
                                int parts_ready, uint32_t n, float *y, int split,
                                kl_gpu_stream s, kl_err *err)
{
    const int form = m5_form(*w, split);
    if (!parts_ready &&
        m5_split(x, NULL, NULL, n, w->cols, parts, form, (hipStream_t)s, err))
        return err->code;
    mt_kernel<m5_dense_fn> &k = m5_dense[w->kind == KL_GPU_W_MXFP4][form];
    if (mt_opt_in(k, err))
        return err->code;
    typedef mt<M5_RW, M5_TW> T;
    const dim3 grid((w->rows + T::BR - 1) / T::BR, (n + T::BT - 1) / T::BT);
    k.fn<<<grid, T::THREADS, m5_smem(*w), (hipStream_t)s>>>(
        *w, parts, m5_row_factors(parts, n, w->cols), n, y);
    return KL_GPU_CHECK(err, hipGetLastError());
}
