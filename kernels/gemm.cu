/*
 * kernels/gemm.cu — tensor-core products for chunks of many tokens (see gemm.h).
 *
 * One tile scheme for both launchers.  A block owns BM = 128 rows of W (output columns) and
 * computes them for up to BN = 64 tokens at a time, walking K in steps of KT = 64:
 *   stage: W's tile [128, 64] decoded to bf16 (MXFP4: thread i reads one 16-byte word, the 32
 *          codes of one scale block, of row i / 2, and decodes it with byte permutes,
 *          mx_bf16.h; BF16: four 16-byte pieces), X's tile [64, 64] fp32 as bf16 high parts
 *          (and lower parts, split form: x = hi + lo + lo2), four float4 per thread, in shared
 *          memory; X rows past the tile's tokens (rounded up to 16) are not staged;
 *   mma:   8 warps, warp w: tokens 32 (w % 2) .. +32, W rows 32 (w / 2) .. +32, i.e. 2 x 2
 *          WMMA bf16 16x16x16 fragments with fp32 accumulators, skipping token fragments past
 *          the tile's tokens; split: three products (hi, lo2, lo) into the same accumulators
 *          (HIP: a SIMT loop, 32 sums per thread, the same tiles);
 *   two register sets (even and odd steps): while the tensor cores work on step k, the loads
 *   of steps k + 1 and k + 2 are in flight.
 * After K, the accumulators go through shared memory (the staging area, reused) to y, masked
 * to the valid tokens and rows (coalesced 4-byte stores along y's rows).
 *
 * Bytes and FLOPs (MXFP4 W [R, K], n tokens): FLOPs 2 n R K; W bytes R K (1/2 + 1/32) read once
 * per token tile (dense: ceil(n / 64) times, mostly from L2; grouped: once per block when the
 * segment is <= 64 rows); X bytes 4 n K per row tile (R / 128 times, from L2).  A routed
 * expert [1024, 2304] with 8 rows: 0.6 MB of codes for 38 MFLOP, so the grouped product is
 * bound by the weights (~9 GFLOP and 0.96 GB per layer and chunk of 256 tokens), the dense
 * ones at n >= 256 by the tensor cores (e.g. [4096, 2304] x 256: 4.8 GFLOP, 4.7 MB MXFP4).
 *
 * Count for the grouped MXFP4 gate product of a 256-token chunk (E = 256 experts [1024, 2304],
 * m = 2048 rows, ~8 per expert; measured 676 µs = 515 GB/s before this version): 2048 blocks,
 * one tile each, 36 K steps: 73,728 block-steps, 559 per SM.  Per block-step:
 *   decode: 8192 values (604 M per call, each weight once).  Before: per value a shared LUT
 *     load, an FMUL, 2 shifts and half a pack (~4.5 instructions + 1 LDS); now ~3 integer
 *     instructions and no shared memory (23 per 8 codes + 8 per scale, mx_bf16.h).
 *   shared-memory wavefronts (128 bytes each, 1 per clock per SM): before 960 = LUT 256 +
 *     W stores 128 (conflict-free: see stage) + X stores 64 + fragment loads 512 (8 warps x 4
 *     k x 4 fragments x 4); now, tiles of <= 16 tokens: 416 split (W 128, X hi + lo 32, 4
 *     warps x 4 k x (2 W + 2 X) x 4 = 256), 336 with one bf16 X.
 *   MMAs 16x16x16: before 128 (7/8 of them on empty token rows); now 64 split, 32 bf16 X.
 * Prediction: shared memory was ~270 µs of the 676 (559 x 960 clocks at 1.98 GHz), now
 * ~120 µs; the decode's ~800 warp instructions per block-step (~56 µs at 4 issues per clock)
 * overlap it; the weights (348 MB) need ~85 µs at 4.1 TB/s but a block has only 2 steps
 * (2 x 4 KiB of codes) in flight, 2 blocks per SM: ~16 KiB per SM, ~2 TB/s at ~1 µs latency.
 * So ~170-200 µs (1.7-2 TB/s) for the gate product, both forms, if latency is the bound
 * left; the dense products (n >= 256, full tiles) keep their speed without split and pay up
 * to 2x in tensor-core time with it (they are bound by the MMAs there).
 *
 * Grouped: grid (row tiles, experts); the block of expert e reads seg[e], seg[e + 1] on the
 * device, leaves at once when the segment is empty, else loops over the segment's rows in
 * tiles of 64, so each weight tile is read once per block for all its rows.
 * Measured (H200, form 2): the grouped gate product above 723 µs (0.11 of HBM), dense
 * [4096, 2304] x 256 147 µs (33 TFLOPS).  ptxas: 128 registers and 88-516 bytes of spills
 * in form 2 (the two register sets of raw loads, 42 registers, plus 2 x 32 of sums).
 *
 * Version 5 (kernels/gemm_mma.cu, the default) is the tensor-core path on CUDA; session 7's
 * versions 2 and 3 (a cp.async ring decoded in shared memory, WMMA) and session 8's version 4
 * (mma.sync with loads held in registers) measured slower and were removed.
 */
#include "kernels/gemm.h"
#include "kernels/gemm_mma.h"
#include "kernels/gpu.h"

#include "kernels/gemm_split.cuh"
#include "kernels/mx_bf16.h"

#include <stdlib.h>
#include <string.h>

#if !defined(__HIP_PLATFORM_AMD__)
#include <mma.h>
#define GEMM_WMMA 1
#else
#define GEMM_WMMA 0
#endif

#define BM      128          /* W rows per block */
#define BN      64           /* tokens per tile */
#define KT      64           /* K per step */
#define LDS     (KT + 8)     /* bf16 per staged row (16-byte aligned, banks spread) */
#define LDC     (BM + 4)     /* floats per row of the output staging */
#define THREADS 256

/* Shared memory of a block: the staged tiles (X: bf16 high parts, and the two lower parts
 * when split), or (after K) the output tile.  45 KiB. */
struct gemm_smem {
    union {
        struct {
            uint16_t w[BM * LDS];
            uint16_t x[BN * LDS];
            uint16_t xl[BN * LDS];
            uint16_t xl2[BN * LDS];
        } in;
        float c[BN * LDC];
    };
};

/* What a block multiplies: W rows [r0, r0 + BM) of matrix m (expert rows already offset). */
struct gemm_job {
    kl_gpu_mat     m;         /* kind, cols, payloads; rows: valid rows of this matrix */
    size_t         wrow0;     /* first stored row of this matrix (expert e: e * rows) */
    uint32_t       r0;
    const float   *x;
    const uint32_t *x_row;    /* NULL: identity */
    float         *y;
};

/* The raw loads of one K step for one thread (W: MXFP4 one word, BF16 four; X: four float4). */
template <int MX> struct gemm_regs {
    uint4   w[MX ? 1 : 4];
    uint8_t s;
    float4  x[4];
};

template <int MX>
__device__ static inline void load_w(const gemm_job &j, uint32_t k0, gemm_regs<MX> &g)
{
    const unsigned t = threadIdx.x;
    const uint32_t cols = j.m.cols;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    if (MX) {
        const uint32_t r = j.r0 + t / 2, k = k0 + (t % 2) * 32;
        const int ok = r < j.m.rows && k < cols;
        const size_t row = j.wrow0 + r;
        g.w[0] = ok ? *(const uint4 *)(j.m.packed + row * (cols / 2) + k / 2) : zero;
        g.s = ok ? j.m.scale[row * (cols / KL_MXFP4_BLOCK) + k / KL_MXFP4_BLOCK] : 0;
        return;
    }
    const uint16_t *d = (const uint16_t *)j.m.data;
#pragma unroll
    for (int i = 0; i < (MX ? 1 : 4); i++) {
        const unsigned p = t + THREADS * i; /* piece p: row p / 8, columns 8 (p % 8) .. +8 */
        const uint32_t r = j.r0 + p / 8, k = k0 + (p % 8) * 8;
        const int ok = r < j.m.rows && k < cols;
        g.w[i] = ok ? *(const uint4 *)(d + (j.wrow0 + r) * cols + k) : zero;
    }
}

/* X pieces: p = t + 256 i, token p / 16, columns 4 (p % 16) .. +4; nt valid tokens from t0. */
template <int MX>
__device__ static inline void load_x(const gemm_job &j, uint32_t t0, uint32_t nt, uint32_t k0,
                                     gemm_regs<MX> &g)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const unsigned p = threadIdx.x + THREADS * i, tok = p / 16;
        const uint32_t k = k0 + (p % 16) * 4;
        g.x[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (tok < nt && k < j.m.cols) {
            const size_t src = j.x_row ? j.x_row[t0 + tok] : t0 + tok;
            g.x[i] = *(const float4 *)(j.x + src * j.m.cols + k);
        }
    }
}

/* X's registers into shared memory (rows < kl_gt_frag_rows(nt) only: the rest is not read). */
template <int MX, int SP>
__device__ static inline void stage_x(const gemm_regs<MX> &g, uint32_t nt, gemm_smem &sh)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const unsigned p = threadIdx.x + THREADS * i, tok = p / 16;
        if (tok < kl_gt_frag_rows(nt)) /* x, xl, xl2 follow each other in gemm_smem */
            kl_gt_stage_x4<SP>(g.x[i], sh.in.x, BN * LDS, tok * LDS + (p % 16) * 4);
    }
}

/* The registers into shared memory as bf16 (MXFP4 codes times the scale: exact; decoded by
 * byte permutes, mx_bf16.h).  MXFP4: thread t writes 64 bytes at row t / 2, column
 * 32 (t % 2); a quarter warp's 16-byte stores then cover all 32 banks once (rows are 144
 * bytes apart), so the stores are conflict-free. */
template <int MX, int SP>
__device__ static inline void stage(const gemm_regs<MX> &g, uint32_t nt, gemm_smem &sh)
{
    const unsigned t = threadIdx.x;
    if (MX) {
        const uint32_t q[4] = {g.w[0].x, g.w[0].y, g.w[0].z, g.w[0].w};
        uint32_t out[16];
        kl_mx_decode32(q, g.s, out);
        uint4 *dst = (uint4 *)&sh.in.w[(t / 2) * LDS + (t % 2) * 32];
#pragma unroll
        for (int i = 0; i < 4; i++)
            dst[i] = make_uint4(out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
    } else {
#pragma unroll
        for (int i = 0; i < (MX ? 1 : 4); i++) {
            const unsigned p = t + THREADS * i;
            *(uint4 *)&sh.in.w[(p / 8) * LDS + (p % 8) * 8] = g.w[i];
        }
    }
    stage_x<MX, SP>(g, nt, sh);
}

#if GEMM_WMMA
namespace wm = nvcuda::wmma;
typedef wm::fragment<wm::accumulator, 16, 16, 16, float> gemm_acc[2][2];

__device__ static inline void acc_zero(gemm_acc &acc)
{
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            wm::fill_fragment(acc[a][b], 0.0f);
}

typedef wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> gemm_fa;
typedef wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major> gemm_fb;

/* acc[a][b] += X tokens (32 tw + 16 a) · W rows (32 ww + 16 b), over the staged K step.
 * X is matrix_a (row-major [token][k]); W's [row][k] is matrix_b [k][row] column-major.
 * Fragments of tokens >= nt are skipped (warp-uniform: a whole warp, or its a = 1 half);
 * split: the high parts' product, then the two lower parts' into the same accumulator. */
template <int SP>
__device__ static inline void acc_step(gemm_acc &acc_out, const gemm_smem &sh, uint32_t nt)
{
    const unsigned warp = threadIdx.x / 32, tw = warp % 2, ww = warp / 2;
    const unsigned na = 32 * tw >= nt ? 0 : 32 * tw + 16 >= nt ? 1 : 2;
    if (na == 0)
        return;
    /* SP 2: this K step's products summed in fresh fragments, then added to the running sums
     * with ordinary fp32 additions (the MMA's own accumulation then spans only one step) */
    gemm_acc part;
    if (SP == 2)
        acc_zero(part);
    gemm_acc &acc = SP == 2 ? part : acc_out;
    const __nv_bfloat16 *xs = (const __nv_bfloat16 *)sh.in.x;
    const __nv_bfloat16 *xl = (const __nv_bfloat16 *)sh.in.xl;
    const __nv_bfloat16 *xl2 = (const __nv_bfloat16 *)sh.in.xl2;
    const __nv_bfloat16 *ws = (const __nv_bfloat16 *)sh.in.w;
#pragma unroll
    for (int kk = 0; kk < KT; kk += 16) {
        gemm_fb fb[2];
#pragma unroll
        for (int b = 0; b < 2; b++)
            wm::load_matrix_sync(fb[b], ws + (32 * ww + 16 * b) * LDS + kk, LDS);
#pragma unroll
        for (unsigned a = 0; a < 2; a++) { /* constant a: acc stays in registers */
            if (a >= na)
                break;
            const unsigned at = (32 * tw + 16 * a) * LDS + kk;
            gemm_fa fa;
            wm::load_matrix_sync(fa, xs + at, LDS);
#pragma unroll
            for (int b = 0; b < 2; b++)
                wm::mma_sync(acc[a][b], fa, fb[b], acc[a][b]);
            if (SP) {   /* the two lower parts of X */
                wm::load_matrix_sync(fa, xl2 + at, LDS);
#pragma unroll
                for (int b = 0; b < 2; b++)
                    wm::mma_sync(acc[a][b], fa, fb[b], acc[a][b]);
                wm::load_matrix_sync(fa, xl + at, LDS);
#pragma unroll
                for (int b = 0; b < 2; b++)
                    wm::mma_sync(acc[a][b], fa, fb[b], acc[a][b]);
            }
        }
    }
    if (SP == 2) { /* same fragment type: the same element layout */
#pragma unroll
        for (unsigned a = 0; a < 2; a++) { /* constant indices: the fragments stay in registers */
            if (a >= na)
                break;
#pragma unroll
            for (int b = 0; b < 2; b++)
#pragma unroll
                for (int i = 0; i < part[a][b].num_elements; i++)
                    acc_out[a][b].x[i] += part[a][b].x[i];
        }
    }
}

/* The accumulators into sh.c [token][row] (the staged tiles are dead by now). */
__device__ static inline void acc_store(const gemm_acc &acc, gemm_smem &sh)
{
    const unsigned warp = threadIdx.x / 32, tw = warp % 2, ww = warp / 2;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            wm::store_matrix_sync(sh.c + (32 * tw + 16 * a) * LDC + 32 * ww + 16 * b,
                                  acc[a][b], LDC, wm::mem_row_major);
}
#else
/* SIMT: thread t sums token t / 4 against rows t % 4 + 4 i, i < 32. */
typedef float gemm_acc[32];

__device__ static inline void acc_zero(gemm_acc &acc)
{
    for (int i = 0; i < 32; i++)
        acc[i] = 0.0f;
}

__device__ static inline float bf16_val(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

template <int SP>
__device__ static inline void acc_step(gemm_acc &acc, const gemm_smem &sh, uint32_t nt)
{
    const unsigned tok = threadIdx.x / 4, r0 = threadIdx.x % 4;
    if (tok >= nt)
        return;
    for (int k = 0; k < KT; k++) {
        const float xv = bf16_val(sh.in.x[tok * LDS + k]) +
                         (SP ? bf16_val(sh.in.xl[tok * LDS + k]) +
                                   bf16_val(sh.in.xl2[tok * LDS + k]) : 0.0f);
#pragma unroll
        for (int i = 0; i < 32; i++)
            acc[i] = fmaf(xv, bf16_val(sh.in.w[(r0 + 4 * i) * LDS + k]), acc[i]);
    }
}

__device__ static inline void acc_store(const gemm_acc &acc, gemm_smem &sh)
{
    const unsigned tok = threadIdx.x / 4, r0 = threadIdx.x % 4;
    for (int i = 0; i < 32; i++)
        sh.c[tok * LDC + r0 + 4 * i] = acc[i];
}
#endif

/* The loads of the K step at k0 (nothing past K) into g. */
template <int MX>
__device__ static inline void load_step(const gemm_job &j, uint32_t t0, uint32_t nt,
                                        uint32_t k0, gemm_regs<MX> &g)
{
    if (k0 < j.m.cols) {
        load_w<MX>(j, k0, g);
        load_x<MX>(j, t0, nt, k0, g);
    }
}

/* One K step: g (step k0) staged, then g reloaded with step k0 + 2 KT while the products of
 * step k0 run (two steps' loads are in flight at any time). */
template <int MX, int SP>
__device__ static inline void gemm_step(const gemm_job &j, uint32_t t0, uint32_t nt,
                                        uint32_t k0, gemm_regs<MX> &g, gemm_acc &acc,
                                        gemm_smem &sh)
{
    stage<MX, SP>(g, nt, sh);
    __syncthreads();
    load_step<MX>(j, t0, nt, k0 + 2 * KT, g);
    acc_step<SP>(acc, sh, nt);
    __syncthreads();
}

/* y rows [t0, t0 + nt) (packed order), columns [r0, r0 + BM) of the block's matrix: every
 * thread of the block calls it (barriers inside).  Even steps use g0, odd ones g1. */
template <int MX, int SP>
__device__ static void gemm_tile(const gemm_job &j, uint32_t t0, uint32_t nt, gemm_smem &sh)
{
    gemm_acc acc;
    acc_zero(acc);
    gemm_regs<MX> g0, g1;
    load_step<MX>(j, t0, nt, 0, g0);
    load_step<MX>(j, t0, nt, KT, g1);
    for (uint32_t k0 = 0; k0 < j.m.cols; k0 += 2 * KT) {
        gemm_step<MX, SP>(j, t0, nt, k0, g0, acc, sh);
        if (k0 + KT < j.m.cols)
            gemm_step<MX, SP>(j, t0, nt, k0 + KT, g1, acc, sh);
    }
    acc_store(acc, sh);
    __syncthreads();
    const uint32_t R = j.m.rows;
    for (unsigned i = threadIdx.x; i < nt * BM; i += THREADS) {
        const unsigned tok = i / BM, c = i % BM;
        if (j.r0 + c < R)
            j.y[(size_t)(t0 + tok) * R + j.r0 + c] = sh.c[tok * LDC + c];
    }
    __syncthreads(); /* sh is staged again by the next tile */
}

template <int MX, int SP>
__global__ static void __launch_bounds__(THREADS, 2)
    gemm_kernel(kl_gpu_mat m, const float *x, uint32_t n, float *y)
{
    KL_GPU_GRID_WAIT();
    __shared__ __align__(128) gemm_smem sh;
    const gemm_job j = {m, 0, blockIdx.x * BM, x, NULL, y};
    const uint32_t t0 = blockIdx.y * BN;
    gemm_tile<MX, SP>(j, t0, n - t0 < BN ? n - t0 : BN, sh);
}

template <int MX, int SP>
__global__ static void __launch_bounds__(THREADS, 2)
    gemm_grouped_kernel(kl_gpu_mat m, const float *x, const uint32_t *x_row,
                        const uint32_t *seg, float *y)
{
    KL_GPU_GRID_WAIT();
    __shared__ __align__(128) gemm_smem sh;
    const uint32_t e = blockIdx.y, s0 = seg[e], s1 = seg[e + 1];
    if (s1 <= s0)
        return;
    const gemm_job j = {m, (size_t)e * m.rows, blockIdx.x * BM, x, x_row, y};
    for (uint32_t t0 = s0; t0 < s1; t0 += BN)
        gemm_tile<MX, SP>(j, t0, s1 - t0 < BN ? s1 - t0 : BN, sh);
}

static int split_mode = -1; /* -1: KL_GPU_GEMM_SPLIT not read yet; else the form, 0-3 */

extern "C" int kl_gpu_gemm_split(void)
{
    if (split_mode < 0) {
        const char *v = getenv("KL_GPU_GEMM_SPLIT");
        split_mode = v && !strcmp(v, "0")   ? 0
                     : v && !strcmp(v, "1") ? 1
                     : v && !strcmp(v, "2") ? 2
                                            : 3;
    }
    return split_mode;
}

extern "C" void kl_gpu_gemm_split_set(int form)
{
    split_mode = form < 0 ? 0 : form > 3 ? 3 : form;
}

/* The form version 1 runs: form 3 (version 5's fp16 operands) as form 2. */
static int v1_form(void)
{
    return kl_gpu_gemm_split() == 3 ? 2 : kl_gpu_gemm_split();
}

/* 0, or KL_E_USAGE: m is BF16 or MXFP4 with cols % 32 == 0 and 16-byte aligned payloads. */
static int gemm_mat_check(const kl_gpu_mat *m, const float *x, const char *what, kl_err *err)
{
    if (!m || (m->kind != KL_GPU_W_BF16 && m->kind != KL_GPU_W_MXFP4))
        return kl_fail(err, KL_E_USAGE, "%s: weights must be BF16 or MXFP4", what);
    const void *p = m->kind == KL_GPU_W_BF16 ? m->data : (const void *)m->packed;
    if (m->rows == 0 || m->cols == 0 || m->cols % 32 || !p ||
        (m->kind == KL_GPU_W_MXFP4 && !m->scale) || (uintptr_t)p % 16)
        return kl_fail(err, KL_E_USAGE,
                       "%s: [%u, %u] needs rows, cols a multiple of 32 and 16-byte aligned "
                       "payloads", what, m->rows, m->cols);
    if (!x || (uintptr_t)x % 16)
        return kl_fail(err, KL_E_USAGE, "%s: x is NULL or not 16-byte aligned", what);
    return 0;
}

/* [dense, grouped]: 0 until read from the environment, then 1 or 5 */
static int tiles_version[2];

/* KL_GPU_GEMM_TILES (dense) or KL_GPU_GEMM_GROUPED: v1, else the default (5). */
static int tiles_from_env(int grouped)
{
    const char *v = getenv(grouped ? "KL_GPU_GEMM_GROUPED" : "KL_GPU_GEMM_TILES");
    return v && !strcmp(v, "v1") ? 1 : 5;
}

extern "C" int kl_gpu_gemm_tiles(int grouped)
{
    grouped = grouped != 0;
    if (!tiles_version[grouped])
        tiles_version[grouped] = tiles_from_env(grouped);
    return tiles_version[grouped];
}

extern "C" void kl_gpu_gemm_tiles_set(int dense, int grouped)
{
    tiles_version[0] = dense == 1 || dense == 5 ? dense : 0;
    tiles_version[1] = grouped == 1 || grouped == 5 ? grouped : 0;
}

/* Whether version 5 (kernels/gemm_mma.cu) takes m: selected, parts given, K in whole steps,
 * CUDA (its stages are more than HIP targets' 64 KiB of LDS: version 1 there). */
static int v5_takes(const kl_gpu_mat *m, const uint16_t *parts, int grouped)
{
    return GEMM_WMMA && parts && kl_gpu_gemm_tiles(grouped) == 5 &&
           m->cols % KL_GPU_MMA_KT == 0 && kl_gpu_gemm_mma5_takes(m);
}

extern "C" int kl_gpu_gemm_uses_parts(const kl_gpu_mat *w, const uint16_t *parts)
{
    return v5_takes(w, parts, 0);
}

extern "C" int kl_gpu_gemm(const kl_gpu_mat *w, const float *x, uint32_t n, float *y,
                           kl_gpu_stream s, kl_err *err)
{
    return kl_gpu_gemm_p(w, x, n, y, NULL, 0, s, err);
}

extern "C" int kl_gpu_gemm_p(const kl_gpu_mat *w, const float *x, uint32_t n, float *y,
                             uint16_t *parts, int parts_ready, kl_gpu_stream s, kl_err *err)
{
    int rc = gemm_mat_check(w, x, "gemm", err);
    if (rc)
        return rc;
    if (!y || n == 0 || (n + BN - 1) / BN > 65535)
        return kl_fail(err, KL_E_USAGE, "gemm: y is NULL, or n (%u) is 0 or too large", n);
    if ((uintptr_t)parts % 16)
        return kl_fail(err, KL_E_USAGE, "gemm: parts not 16-byte aligned");
    if (kl_gpu_gemm_uses_parts(w, parts))
        return kl_gpu_gemm_mma5(w, x, parts, parts_ready, n, y, kl_gpu_gemm_split(), s, err);
    typedef void (*kernel)(kl_gpu_mat, const float *, uint32_t, float *);
    static const kernel k[2][3] = {{gemm_kernel<0, 0>, gemm_kernel<0, 1>, gemm_kernel<0, 2>},
                                   {gemm_kernel<1, 0>, gemm_kernel<1, 1>, gemm_kernel<1, 2>}};
    const dim3 grid((w->rows + BM - 1) / BM, (n + BN - 1) / BN);
    k[w->kind == KL_GPU_W_MXFP4][v1_form()]<<<grid, THREADS, 0, (hipStream_t)s>>>(
        *w, x, n, y);
    return KL_GPU_CHECK(err, hipGetLastError());
}

extern "C" int kl_gpu_gemm_grouped_uses_parts(const kl_gpu_gemm_grouped_args *a)
{
    return v5_takes(&a->w->m, a->parts, 1);
}

extern "C" int kl_gpu_gemm_grouped(const kl_gpu_gemm_grouped_args *a, kl_gpu_stream s,
                                   kl_err *err)
{
    if (!a || !a->w || !a->seg || !a->y)
        return kl_fail(err, KL_E_USAGE, "gemm_grouped: a, w, seg or y is NULL");
    int rc = gemm_mat_check(&a->w->m, a->x, "gemm_grouped", err);
    if (rc)
        return rc;
    if (a->w->n == 0 || a->w->n > 65535)
        return kl_fail(err, KL_E_USAGE, "gemm_grouped: %u experts (1 to 65535)", a->w->n);
    if (a->m_max == 0)
        return 0; /* no rows: nothing to do */
    if ((uintptr_t)a->parts % 16)
        return kl_fail(err, KL_E_USAGE, "gemm_grouped: parts not 16-byte aligned");
    if (kl_gpu_gemm_grouped_uses_parts(a))
        return kl_gpu_gemm_mma5_grouped(a, kl_gpu_gemm_split(), s, err);
    typedef void (*kernel)(kl_gpu_mat, const float *, const uint32_t *, const uint32_t *,
                           float *);
    static const kernel k[2][3] = {
        {gemm_grouped_kernel<0, 0>, gemm_grouped_kernel<0, 1>, gemm_grouped_kernel<0, 2>},
        {gemm_grouped_kernel<1, 0>, gemm_grouped_kernel<1, 1>, gemm_grouped_kernel<1, 2>}};
    const dim3 grid((a->w->m.rows + BM - 1) / BM, a->w->n);
    k[a->w->m.kind == KL_GPU_W_MXFP4][v1_form()]<<<grid, THREADS, 0,
                                                              (hipStream_t)s>>>(
        a->w->m, a->x, a->x_row, a->seg, a->y);
    return KL_GPU_CHECK(err, hipGetLastError());
}

extern "C" size_t kl_gpu_gemm_parts_bytes(uint32_t m, uint32_t cols)
{
    return (size_t)m * 3 * cols * sizeof(uint16_t) + (size_t)m * sizeof(float);
}
