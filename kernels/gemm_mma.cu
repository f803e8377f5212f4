/*
 * kernels/gemm_mma.cu — versions 4 and 5 of the prefill products (gemm.h):
 * Y = X Wᵀ on mma.sync.m16n8k16 with ldmatrix fragment loads, the split form of gemm.h
 * (x = hi + lo + lo2, three bf16 products per K slice, each 16-wide slice's products summed
 * in a fresh fragment and added to the running sums in fp32: form 2).
 *
 * Block: RW x TW warps; warp (w % RW, w / RW) owns W rows 64 (w % RW) .. +64 (A: four m16
 * fragments) and tokens 32 (w / RW) .. +32 (B: four n8 fragments) of the block's tile, so per
 * 16-wide K slice it loads 4 A fragments and 2 x 3 B pairs (10 ldmatrix.x4) for 48 MMAs (16
 * with bf16 X), and keeps 64 fp32 sums.  Dense products take 2 x 4 warps (128 rows x 128
 * tokens), grouped ones 4 x 2 (256 rows x 64 tokens: segments are ~32 rows at chunks of
 * 1,024 tokens).  Warps whose tokens are all past the tile's skip the products; n8 fragments
 * past the last token are skipped too.
 *
 * K walks in steps of 64: each thread loads its share of the next step into registers (W: BF16
 * 16-byte pieces or MXFP4 32-code blocks with their scale; X: float4) while the warps multiply
 * the current one, then decodes / splits it into the other of two shared-memory stages (rows
 * of 72 bf16 = 144 bytes: the 8 rows of an ldmatrix land on distinct banks, and so do the
 * stores).  One barrier per step: a stage is written only after every warp has passed the
 * barrier that follows its last read.  Rows and tokens past the matrix or segment are never
 * stored; unstaged token rows only feed sums that are not stored (a B column is one token).
 *
 * Count (dense BF16 [4096, 2304] x 1024 tokens, form 2): 32 x 8 = 256 blocks, 36 steps each.
 * Per block-step: 8 warps x 4 slices x 48 = 1,536 MMAs of 2,048 multiply-adds, about 3,000
 * tensor clocks if mma.sync sustains ~2 clocks per m16n8k16 per SM; ldmatrix 320 x 4
 * wavefronts and stores ~500 wavefronts (< 1,900 clocks of shared memory); issue ~1,200 clocks
 * (decode/split ~3,200 warp instructions, 1,536 MMAs, 2,048 FADDs).  So ~3,000 clocks a step;
 * one block per SM (144 KiB of stages), two waves: 216K clocks = 113 µs at 1.9 GHz, 171 TFLOPS
 * of the product (513 of tensor work), against version 1's ~800 µs (47 TFLOPS at n = 512).
 * Grouped MXFP4 gate [1024, 2304] over 8,192 rows (chunk of 1,024 tokens): 4 x 256 blocks of
 * ~1 tile, 36 steps, half the warps multiplying (32 tokens): ~1,500 tensor + ~1,000 decode
 * clocks a step, serialised by the barrier at one block per SM: ~90K clocks per block, 7.8
 * waves: ~370 µs against version 1's ~1.5 ms.
 *
 * Measured (H200, session 8): dense 376.5 µs (version 1: 405.0), grouped gate over 8,192 rows
 * 901 µs (version 1: 1,178).  The miss: an mma.sync probe reaches 610-640 TFLOPS, so not the
 * tensor pipe; Nsight Compute on the grouped kernel shows it 12.5% active, one block of 8
 * warps per SM and no eligible warp in 66% of cycles: latency-bound, the next step's loads
 * and the in-loop split of x waiting behind the block's barrier.
 *
 * Version 5 (the default, dense and grouped, blocks of 4 x 2 warps): x is split once per
 * product input into bf16 parts (m5_split_kernel: [m][3][cols], gathered through x_row; the
 * up product reuses the gate product's parts, a dense group's products share one split), and
 * each K step's parts and weights are copied by cp.async two steps ahead into a ring of three
 * slots (no loads held in registers, no split in the loop); MXFP4 codes are decoded from the
 * slot into one of two bf16 W tiles, the block rows' scales of the whole K copied once per
 * tile.  Count (gate over 32,768 rows, chunks of 4,096: 4 x 256 blocks,
 * ~2 tiles of 64 tokens each, 36 steps): per block-step 1,536 MMAs (~2,600 clocks at the
 * probe's 1.7) and a decode of 2 code blocks a thread (~400 clocks with the barrier) with the
 * copies in flight underneath: ~3,000 clocks, 7.8 blocks per SM x 72 steps = 1.7M clocks =
 * ~0.85 ms, plus the split (755 MB moved, ~0.25 ms, shared with the up product), against
 * version 4's ~3.5 ms.  Measured (session 9): 2,375 µs (65 TFLOPS of product; version 4
 * 2,728), the dense [4096, 2304] x 4,096 829 µs (93 TFLOPS; version 1 1,474): a block-step
 * takes ~3 µs (~5,900 clocks) against ~2,600 clocks of MMAs at the probe's rate, and the
 * grouped tiles are ~80% full (segments of ~128 rows in tiles of 64).
 */
#include "kernels/gemm_mma.h"
#include "kernels/gpu.h"

#include "kernels/gemm_split.cuh"
#include "kernels/mma.cuh"
#include "kernels/mx_bf16.h"

#define MT_KT KL_GPU_MMA_KT
#define MT_LD (MT_KT + 8) /* bf16 per staged row */

/* A block of RW x TW warps: its tile, shared memory and per-thread load shares. */
template <int RW, int TW> struct mt {
    enum : unsigned {
        THREADS = 32 * RW * TW,
        BR = 64 * RW,                           /* W rows */
        BT = 32 * TW,                           /* tokens */
        W_ELEMS = BR * MT_LD,                   /* bf16 of the W tile */
        X_ELEMS = BT * MT_LD,                   /* bf16 of one X part */
        STAGE = W_ELEMS + 3 * X_ELEMS,          /* bf16 of a stage */
        SMEM = 2 * STAGE * 2,                   /* bytes: two stages */
        U_BF16 = BR * (MT_KT / 8) / THREADS,    /* BF16 W: 16-byte pieces a thread */
        U_MX = BR * (MT_KT / 32) / THREADS,     /* MXFP4 W: 32-code blocks a thread */
        U_X = BT * (MT_KT / 4) / THREADS,       /* X: float4 a thread */
    };
};

/* What a block multiplies: W rows [r0, r0 + BR) of the matrix at stored row wrow0. */
struct mt_job {
    kl_gpu_mat      m;
    size_t          wrow0;
    uint32_t        r0;
    const float    *x;
    const uint32_t *x_row; /* NULL: identity */
    float          *y;
};

/* One step's raw loads of one thread. */
template <int MX, int RW, int TW> struct mt_regs {
    uint4   w[MX ? mt<RW, TW>::U_MX : mt<RW, TW>::U_BF16];
    uint8_t s[MX ? mt<RW, TW>::U_MX : 1];
    float4  x[mt<RW, TW>::U_X];
};

/* W pieces: MXFP4 unit u = row u / 2, codes 32 (u % 2) ..; BF16 unit u = row u / 8, columns
 * 8 (u % 8) ..; X unit u = token u / 16, columns 4 (u % 16) .. (tokens >= nt not loaded). */
template <int MX, int RW, int TW>
__device__ static inline void mt_load(const mt_job &j, uint32_t t0, uint32_t nt, uint32_t k0,
                                      mt_regs<MX, RW, TW> &g)
{
    typedef mt<RW, TW> T;
    const unsigned t = threadIdx.x;
    const uint32_t cols = j.m.cols;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    if (MX) {
#pragma unroll
        for (unsigned i = 0; i < T::U_MX; i++) {
            const unsigned u = t + T::THREADS * i, r = u / 2, h = u % 2;
            const int ok = j.r0 + r < j.m.rows;
            const size_t row = j.wrow0 + j.r0 + r;
            g.w[i] = ok ? *(const uint4 *)(j.m.packed + row * (cols / 2) + k0 / 2 + 16 * h) : zero;
            g.s[i] = ok ? j.m.scale[row * (cols / KL_MXFP4_BLOCK) + k0 / KL_MXFP4_BLOCK + h] : 0;
        }
    } else {
        const uint16_t *d = (const uint16_t *)j.m.data;
#pragma unroll
        for (unsigned i = 0; i < T::U_BF16; i++) {
            const unsigned u = t + T::THREADS * i, r = u / 8;
            const int ok = j.r0 + r < j.m.rows;
            g.w[i] = ok ? *(const uint4 *)(d + (j.wrow0 + j.r0 + r) * cols + k0 + 8 * (u % 8))
                        : zero;
        }
    }
#pragma unroll
    for (unsigned i = 0; i < T::U_X; i++) {
        const unsigned u = t + T::THREADS * i, tok = u / 16;
        if (tok < nt) {
            const size_t src = j.x_row ? j.x_row[t0 + tok] : t0 + tok;
            g.x[i] = *(const float4 *)(j.x + src * cols + k0 + 4 * (u % 16));
        }
    }
}

/* The registers into a stage: W decoded to bf16 (MXFP4: exact, mx_bf16.h), X split into its
 * parts (SP 0: hi only; kl_gt_stage_x4). */
template <int MX, int SP, int RW, int TW>
__device__ static inline void mt_stage(const mt_regs<MX, RW, TW> &g, uint32_t nt, uint16_t *wt)
{
    typedef mt<RW, TW> T;
    const unsigned t = threadIdx.x;
    if (MX) {
#pragma unroll
        for (unsigned i = 0; i < T::U_MX; i++) {
            const unsigned u = t + T::THREADS * i;
            const uint32_t q[4] = {g.w[i].x, g.w[i].y, g.w[i].z, g.w[i].w};
            uint32_t out[16];
            kl_mx_decode32(q, g.s[i], out);
            uint4 *dst = (uint4 *)&wt[(u / 2) * MT_LD + 32 * (u % 2)];
#pragma unroll
            for (unsigned c = 0; c < 4; c++)
                dst[c] = make_uint4(out[4 * c], out[4 * c + 1], out[4 * c + 2], out[4 * c + 3]);
        }
    } else {
#pragma unroll
        for (unsigned i = 0; i < T::U_BF16; i++) {
            const unsigned u = t + T::THREADS * i;
            *(uint4 *)&wt[(u / 8) * MT_LD + 8 * (u % 8)] = g.w[i];
        }
    }
    uint16_t *xt = wt + T::W_ELEMS;
#pragma unroll
    for (unsigned i = 0; i < T::U_X; i++) {
        const unsigned u = t + T::THREADS * i, tok = u / 16;
        if (tok < nt)
            kl_gt_stage_x4<SP != 0>(g.x[i], xt, T::X_ELEMS, tok * MT_LD + 4 * (u % 16));
    }
}

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

/* acc[i][j] += W rows (16 i ..) x tokens (8 j ..) of this warp over the staged step: the W
 * tile wt [BR][MT_LD], the X parts xt [3][BT][MT_LD].  Form 2 (SP 2) sums the step's 12
 * products of a fragment in a fresh one and adds it to acc in fp32 once per step of 64, as
 * version 1 does (session 8 added it every 16-wide slice: 4x the additions). */
template <int SP, int RW, int TW>
__device__ static inline void mt_mul(float (&acc)[4][4][4], const uint16_t *wt,
                                     const uint16_t *xt, uint32_t nt)
{
    typedef mt<RW, TW> T;
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
#pragma unroll
        for (unsigned i = 0; i < 4; i++)
            ldsm4(a[i], pa + 16 * i * MT_LD + kk);
#pragma unroll
        for (unsigned p = 0; p < (SP ? 3u : 1u); p++)
#pragma unroll
            for (unsigned jj = 0; jj < 2; jj++) {
                if (2 * jj >= ng)
                    continue;
                uint32_t r[4];
                ldsm4(r, pb + p * T::X_ELEMS + 16 * jj * MT_LD + kk);
                b[p][2 * jj][0] = r[0], b[p][2 * jj][1] = r[1];
                b[p][2 * jj + 1][0] = r[2], b[p][2 * jj + 1][1] = r[3];
            }
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

/* The warp's sums into y [*, R] rows t0 + token (packed order), columns from the block's
 * first W row r0, masked to the matrix (R rows) and tile. */
template <int RW, int TW>
__device__ static inline void mt_store(const float (&acc)[4][4][4], uint32_t R, uint32_t r0,
                                       float *y, uint32_t t0, uint32_t nt)
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
                    y[(size_t)(t0 + tok) * R + row] = acc[i][jn][e];
            }
}

/* y rows [t0, t0 + nt) of the block's W rows: every thread of the block calls it. */
template <int MX, int SP, int RW, int TW>
__device__ static void mt_tile(const mt_job &j, uint32_t t0, uint32_t nt, uint16_t *sm)
{
    typedef mt<RW, TW> T;
    float acc[4][4][4];
    mt_zero(acc);
    mt_regs<MX, RW, TW> g;
    const uint32_t steps = j.m.cols / MT_KT;
    mt_load<MX, RW, TW>(j, t0, nt, 0, g);
    for (uint32_t k = 0; k < steps; k++) {
        uint16_t *st = sm + (k % 2) * T::STAGE;
        mt_stage<MX, SP, RW, TW>(g, nt, st);
        __syncthreads();
        if (k + 1 < steps)
            mt_load<MX, RW, TW>(j, t0, nt, (k + 1) * MT_KT, g);
        mt_mul<SP, RW, TW>(acc, st, st + T::W_ELEMS, nt);
    }
    mt_store<RW, TW>(acc, j.m.rows, j.r0, j.y, t0, nt);
    __syncthreads(); /* the next tile stages into stage 0, which the last products may read */
}

template <int MX, int SP, int RW, int TW>
__global__ static void __launch_bounds__(32 * RW * TW, 1)
    mt_dense_kernel(kl_gpu_mat m, const float *x, uint32_t n, float *y)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ uint4 mt_smem[];
    typedef mt<RW, TW> T;
    const mt_job j = {m, 0, blockIdx.x * T::BR, x, NULL, y};
    const uint32_t t0 = blockIdx.y * T::BT;
    mt_tile<MX, SP, RW, TW>(j, t0, n - t0 < T::BT ? n - t0 : T::BT, (uint16_t *)mt_smem);
}

template <int MX, int SP, int RW, int TW>
__global__ static void __launch_bounds__(32 * RW * TW, 1)
    mt_grouped_kernel(kl_gpu_mat m, const float *x, const uint32_t *x_row, const uint32_t *seg,
                      float *y)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ uint4 mt_smem[];
    typedef mt<RW, TW> T;
    const uint32_t e = blockIdx.y, s0 = seg[e], s1 = seg[e + 1];
    const mt_job j = {m, (size_t)e * m.rows, blockIdx.x * T::BR, x, x_row, y};
    for (uint32_t t0 = s0; t0 < s1; t0 += T::BT)
        mt_tile<MX, SP, RW, TW>(j, t0, s1 - t0 < T::BT ? s1 - t0 : T::BT, (uint16_t *)mt_smem);
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
    const unsigned parts = SP ? 3 : 1;
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

/* MXFP4: a slot's raw codes of the step at k0 into a bf16 W tile (mx_bf16.h, exact).  Each
 * thread takes the 16-byte units m5_issue gave it to copy, so its own wait suffices. */
template <int RW, int TW>
__device__ static inline void m5_decode(const uint8_t *raw, const uint8_t *sc, uint32_t cols,
                                        uint32_t k0, uint16_t *wt)
{
    typedef mt<RW, TW> T;
    for (unsigned u = threadIdx.x; u < T::BR * 2; u += T::THREADS) {
        const unsigned r = u / 2, h = u % 2;
        const uint4 q4 = *(const uint4 *)(raw + 32 * r + 16 * h);
        const uint32_t q[4] = {q4.x, q4.y, q4.z, q4.w};
        uint32_t out[16];
        kl_mx_decode32(q, sc[r * (cols / KL_MXFP4_BLOCK) + k0 / KL_MXFP4_BLOCK + h], out);
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
            m5_decode<RW, TW>(slot + S::X_BYTES, sm + S::SC, j.m.cols, k * MT_KT, dec);
            wt = dec;
        }
        __syncthreads();
        m5_issue<MX, SP, RW, TW>(j, t0, nt, (k + 2) * MT_KT, sm + (k + 2) % M5_SLOTS * S::SLOT);
        copy_commit();
        mt_mul<SP, RW, TW>(acc, wt, (const uint16_t *)slot, nt);
    }
    copy_wait<0>();
    mt_store<RW, TW>(acc, j.m.rows, j.r0, j.y, t0, nt);
    __syncthreads(); /* the next tile's copies take slots 0 and 1 */
}

template <int MX, int SP, int RW, int TW>
__global__ static void __launch_bounds__(32 * RW * TW, 1)
    m5_grouped_kernel(kl_gpu_mat m, const uint16_t *parts, const uint32_t *seg, float *y)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ uint4 mt_smem[];
    typedef mt<RW, TW> T;
    const uint32_t e = blockIdx.y, s0 = seg[e], s1 = seg[e + 1];
    const m5_job j = {m, (size_t)e * m.rows, blockIdx.x * T::BR, parts, y};
    for (uint32_t t0 = s0; t0 < s1; t0 += T::BT)
        m5_tile<MX, SP, RW, TW>(j, t0, s1 - t0 < T::BT ? s1 - t0 : T::BT, (uint8_t *)mt_smem);
}

template <int MX, int SP, int RW, int TW>
__global__ static void __launch_bounds__(32 * RW * TW, 1)
    m5_dense_kernel(kl_gpu_mat m, const uint16_t *parts, uint32_t n, float *y)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ uint4 mt_smem[];
    typedef mt<RW, TW> T;
    const m5_job j = {m, 0, blockIdx.x * T::BR, parts, y};
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

#define MT_DENSE_RW  2
#define MT_DENSE_TW  4
#define MT_GROUP_RW  4
#define MT_GROUP_TW  2

typedef void (*mt_dense_fn)(kl_gpu_mat, const float *, uint32_t, float *);
typedef void (*mt_grouped_fn)(kl_gpu_mat, const float *, const uint32_t *, const uint32_t *,
                              float *);

#define MT_D(mx, sp) {mt_dense_kernel<mx, sp, MT_DENSE_RW, MT_DENSE_TW>, \
                      mt<MT_DENSE_RW, MT_DENSE_TW>::SMEM, 0}
#define MT_G(mx, sp) {mt_grouped_kernel<mx, sp, MT_GROUP_RW, MT_GROUP_TW>, \
                      mt<MT_GROUP_RW, MT_GROUP_TW>::SMEM, 0}

/* [BF16, MXFP4][form] */
static mt_kernel<mt_dense_fn> mt_dense[2][3] = {{MT_D(0, 0), MT_D(0, 1), MT_D(0, 2)},
                                                {MT_D(1, 0), MT_D(1, 1), MT_D(1, 2)}};
static mt_kernel<mt_grouped_fn> mt_grouped[2][3] = {{MT_G(0, 0), MT_G(0, 1), MT_G(0, 2)},
                                                    {MT_G(1, 0), MT_G(1, 1), MT_G(1, 2)}};

extern "C" int kl_gpu_gemm_mma(const kl_gpu_mat *w, const float *x, uint32_t n, float *y,
                               int split, kl_gpu_stream s, kl_err *err)
{
    typedef mt<MT_DENSE_RW, MT_DENSE_TW> T;
    mt_kernel<mt_dense_fn> &k = mt_dense[w->kind == KL_GPU_W_MXFP4][split];
    if (mt_opt_in(k, err))
        return err->code;
    const dim3 grid((w->rows + T::BR - 1) / T::BR, (n + T::BT - 1) / T::BT);
    k.fn<<<grid, T::THREADS, k.smem, (hipStream_t)s>>>(*w, x, n, y);
    return KL_GPU_CHECK(err, hipGetLastError());
}

extern "C" int kl_gpu_gemm_mma_grouped(const kl_gpu_gemm_grouped_args *a, int split,
                                       kl_gpu_stream s, kl_err *err)
{
    typedef mt<MT_GROUP_RW, MT_GROUP_TW> T;
    mt_kernel<mt_grouped_fn> &k = mt_grouped[a->w->m.kind == KL_GPU_W_MXFP4][split];
    if (mt_opt_in(k, err))
        return err->code;
    const dim3 grid((a->w->m.rows + T::BR - 1) / T::BR, a->w->n);
    k.fn<<<grid, T::THREADS, k.smem, (hipStream_t)s>>>(a->w->m, a->x, a->x_row, a->seg, a->y);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ---- version 5's launchers ---------------------------------------------------------------- */

#define M5_MAX_COLS 4096u /* MXFP4: the scales of the whole K fit the shared memory */
#define M5_RW 4            /* blocks of 4 x 2 warps, 256 rows x 64 tokens, dense and grouped */
#define M5_TW 2

typedef void (*m5_grouped_fn)(kl_gpu_mat, const uint16_t *, const uint32_t *, float *);
typedef void (*m5_dense_fn)(kl_gpu_mat, const uint16_t *, uint32_t, float *);

#define M5_G(mx, sp) {m5_grouped_kernel<mx, sp, M5_RW, M5_TW>, \
                      m5<mx, M5_RW, M5_TW>::smem(M5_MAX_COLS), 0}
#define M5_D(mx, sp) {m5_dense_kernel<mx, sp, M5_RW, M5_TW>, \
                      m5<mx, M5_RW, M5_TW>::smem(M5_MAX_COLS), 0}

/* [BF16, MXFP4][form] */
static mt_kernel<m5_grouped_fn> m5_grouped[2][3] = {{M5_G(0, 0), M5_G(0, 1), M5_G(0, 2)},
                                                    {M5_G(1, 0), M5_G(1, 1), M5_G(1, 2)}};
static mt_kernel<m5_dense_fn> m5_dense[2][3] = {{M5_D(0, 0), M5_D(0, 1), M5_D(0, 2)},
                                                {M5_D(1, 0), M5_D(1, 1), M5_D(1, 2)}};

/* Shared memory of a version 5 launch over w. */
static unsigned m5_smem(const kl_gpu_mat &w)
{
    return w.kind == KL_GPU_W_MXFP4 ? m5<1, M5_RW, M5_TW>::smem(w.cols)
                                    : m5<0, M5_RW, M5_TW>::smem(w.cols);
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

extern "C" int kl_gpu_gemm_mma5_grouped(const kl_gpu_gemm_grouped_args *a, int split,
                                        kl_gpu_stream s, kl_err *err)
{
    const kl_gpu_mat &w = a->w->m;
    if (!a->parts_ready &&
        kl_gpu_gemm_split_x(a->x, a->x_row, a->seg + a->w->n, a->m_max, w.cols, a->parts, s, err))
        return err->code;
    mt_kernel<m5_grouped_fn> &k = m5_grouped[w.kind == KL_GPU_W_MXFP4][split];
    if (mt_opt_in(k, err))
        return err->code;
    typedef mt<M5_RW, M5_TW> T;
    const dim3 grid((w.rows + T::BR - 1) / T::BR, a->w->n);
    k.fn<<<grid, T::THREADS, m5_smem(w), (hipStream_t)s>>>(w, a->parts, a->seg, a->y);
    return KL_GPU_CHECK(err, hipGetLastError());
}

extern "C" int kl_gpu_gemm_mma5(const kl_gpu_mat *w, const uint16_t *parts, uint32_t n,
                                float *y, int split, kl_gpu_stream s, kl_err *err)
{
    mt_kernel<m5_dense_fn> &k = m5_dense[w->kind == KL_GPU_W_MXFP4][split];
    if (mt_opt_in(k, err))
        return err->code;
    typedef mt<M5_RW, M5_TW> T;
    const dim3 grid((w->rows + T::BR - 1) / T::BR, (n + T::BT - 1) / T::BT);
    k.fn<<<grid, T::THREADS, m5_smem(*w), (hipStream_t)s>>>(*w, parts, n, y);
    return KL_GPU_CHECK(err, hipGetLastError());
}
