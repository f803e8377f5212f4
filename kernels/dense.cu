/*
 * kernels/dense.cu — products, embedding, residual + RMSNorm, SiLU gating and arg-max on the
 * GPU (see dense.h).
 *
 * kl_gpu_matmul: G groups of 32 lanes per weight row (kernels/row_dot.cuh; G = 1..8, more for
 * matrices of few long rows), KL_ROW_WARPS groups per block; tokens go in groups of NT = 1, 2,
 * 4 or 8 (the smallest that holds n, 8 above), one token group per grid row, so for n <= 8
 * each weight row is read once; every lane keeps NT partial sums.  MXFP4 at n = 1 with at
 * most 4096 columns takes the register kernel instead (x held in registers).  The bytes moved
 * are the weights' (x and y are small and cached).  2 <= n < KL_GPU_GEMM_MIN_N go to the
 * tensor-core kernel of skinny.h where it applies (KL_GPU_SKINNY=0 switches it off).
 */
#include "kernels/dense.h"
#include "kernels/bulk.cuh"
#include "kernels/gemm.h"
#include "kernels/kda_conv.cuh"
#include "kernels/route.cuh"
#include "kernels/runtime.h" /* kl_gpu_sm_count, kl_gpu_shared_optin */
#include "kernels/row_dot.cuh"
#include "kernels/skinny.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define THREADS      256
#define ARGMAX_THREADS 1024
#define ARGMAX_UNROLL  4
#define MAX_GRID_Y   65535u

/* ---- matmul ------------------------------------------------------------------------------ */

/* G groups per row (G = 1, 2, 4 or 8: more for matrices of few rows, so enough loads are in
 * flight), KL_ROW_WARPS / G rows per block; the groups' sums are added in group order. */
template <int NT>
__global__ static void __launch_bounds__(THREADS)
    matmul_kernel(kl_gpu_mat w, const float *x, uint32_t n, float *y, int vec, unsigned G)
{
    KL_GPU_GRID_WAIT();
    __shared__ float red[KL_ROW_WARPS][NT];
    kl_row_lut_init();
    __syncthreads();
    const unsigned wi = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    const size_t row = (size_t)blockIdx.x * (KL_ROW_WARPS / G) + wi / G;
    const uint32_t t0 = blockIdx.y * NT;
    const kl_row_x xs = {x + (size_t)t0 * w.cols, w.cols, n - t0 < NT ? n - t0 : NT};
    float acc[NT] = {0.0f};
    if (row < w.rows) /* the same for the whole group */
        kl_row_dot<NT>(w, row, xs, vec, wi % G * KL_GPU_GROUP + lane, G * KL_GPU_GROUP,
                       acc);
    if (G > 1) {
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < NT; t++)
                red[wi][t] = acc[t];
        __syncthreads();
#pragma unroll
        for (int t = 0; t < NT; t++) {
            acc[t] = 0.0f;
            for (unsigned g = 0; g < G; g++)
                acc[t] += red[wi / G * G + g][t];
        }
    }
    if (row >= w.rows || lane != 0 || wi % G != 0)
        return;
#pragma unroll
    for (int t = 0; t < NT; t++)
        if ((uint32_t)t < xs.nt)
            y[(size_t)(t0 + t) * w.rows + row] = acc[t];
}

/* MXFP4, one token: each group does rpw consecutive rows, x in registers, the next row's
 * loads in flight while it multiplies one (kl_mxw_run); KL_XREG_WARPS groups per block,
 * registers capped for 3 blocks an SM (measured: 0.35 of the copy rate against 0.31 uncapped
 * on [262144, 2304]; the experts' kernels are faster uncapped). */
template <int S>
__global__ static void __launch_bounds__(KL_XREG_WARPS * KL_GPU_GROUP, 3)
    matmul_mxfp4_xreg_kernel(kl_gpu_mat w, const float *x, float *y, uint32_t rpw)
{
    KL_GPU_GRID_WAIT();
    kl_row_lut_init();
    __syncthreads();
    const size_t r0 = ((size_t)blockIdx.x * KL_XREG_WARPS + threadIdx.x / KL_GPU_GROUP) * rpw;
    const unsigned lane = threadIdx.x % KL_GPU_GROUP;
    if (r0 >= w.rows)
        return;
    kl_xreg<S> xr;
    kl_xreg_load<S>(xr, x, w.cols, lane);
    kl_mxw_run<S, 1>(
        r0, r0 + rpw < w.rows ? r0 + rpw : w.rows, w.cols, xr, lane,
        [&](size_t r, const uint8_t **rows, const uint8_t **scales) {
            rows[0] = w.packed + r * (w.cols / 2);
            scales[0] = w.scale + r * (w.cols / KL_MXFP4_BLOCK);
        },
        [&](size_t r, const float *out) {
            if (lane == 0)
                y[r] = out[0];
        });
}

/* Rows per group of the register kernels: about 8192 groups in all, 1 to 32 rows each. */
static uint32_t rows_per_group(size_t rows)
{
    const size_t r = rows / KL_ROW_TARGET;
    return r < 1 ? 1 : r > 32 ? 32 : (uint32_t)r;
}

static void matmul_mxfp4_xreg(const kl_gpu_mat *w, const float *x, float *y, hipStream_t st)
{
    const uint32_t rpw = rows_per_group(w->rows);
    const size_t groups = (w->rows + rpw - 1) / rpw;
    const unsigned blocks = (unsigned)((groups + KL_XREG_WARPS - 1) / KL_XREG_WARPS);
    kl_xreg_dispatch(kl_xreg_s(w->cols), [&](auto sc) {
        matmul_mxfp4_xreg_kernel<decltype(sc)::value>
            <<<blocks, KL_XREG_WARPS * KL_GPU_GROUP, 0, st>>>(*w, x, y, rpw);
    });
}

/* MXFP4, one token, version 2 (kernels/row_dot.cuh): x in shared memory; team j of the block
 * takes rows 2j and 2j + 1 of each of its `passes` chunks of KL_MX2_ROWS rows. */
#define KL_MX2_ROWS   (2 * KL_MX2_TEAMS)
#define KL_MX2_BLOCKS 2048 /* blocks a product should have at least (chunks permitting) */

/* The codes and scales of rows r and r + 1 of w (the last row for any past the end). */
__device__ static inline void mx2_pair(const kl_gpu_mat &w, size_t r, const uint8_t **rows,
                                       const uint8_t **scales)
{
    for (int i = 0; i < 2; i++) {
        const size_t ri = r + i < w.rows ? r + i : w.rows - 1;
        rows[i] = w.packed + ri * (w.cols / 2);
        scales[i] = w.scale + ri * (w.cols / KL_MXFP4_BLOCK);
    }
}

__global__ static void __launch_bounds__(KL_MX2_THREADS, KL_MX2_MIN_BLOCKS)
    matmul_mx2_kernel(kl_gpu_mat w, const float *x, float *y, uint32_t passes)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ float4 mx2_x[];
    unsigned tl;
    const unsigned team = kl_mx2_team(&tl);
    const uint32_t nb = w.cols / KL_MXFP4_BLOCK;
    const uint8_t *rows[2], *scales[2];
    kl_mx2_buf<2> buf;
    mx2_pair(w, (size_t)blockIdx.x * passes * KL_MX2_ROWS + 2 * team, rows, scales);
    kl_mx2_load<2>(buf, rows, scales, nb, tl); /* in flight during the fill */
    kl_mx2_x_fill(mx2_x, x, w.cols);
    __syncthreads();
    for (uint32_t p = 0; p < passes; p++) {
        const size_t base = ((size_t)blockIdx.x * passes + p) * KL_MX2_ROWS;
        if (base >= w.rows) /* the same for the whole block */
            break;
        const size_t r = base + 2 * team;
        if (p > 0) {
            mx2_pair(w, r, rows, scales);
            kl_mx2_load<2>(buf, rows, scales, nb, tl);
        }
        float out[2];
        kl_mx2_rows<2>(buf, rows, scales, nb, mx2_x, tl, out);
        for (int i = 0; i < 2; i++)
            if (tl == 0 && r + i < w.rows)
                y[r + i] = out[i];
    }
}

static int versions[3]; /* by kl_gpu_kernels; 0: not read from the environment yet */
static const int newest[3] = {2, 3, 2};

extern "C" int kl_gpu_version(kl_gpu_kernels which)
{
    static const char *const names[3] = {"KL_GPU_MX", "KL_GPU_BF16", "KL_GPU_ARGMAX"};
    if (!versions[which]) {
        const char *v = getenv(names[which]);
        kl_gpu_version_set(which, v && v[0] == 'v' ? atoi(v + 1) : 0);
    }
    return versions[which];
}

extern "C" void kl_gpu_version_set(kl_gpu_kernels which, int version)
{
    versions[which] = version >= 1 && version <= newest[which] ? version : newest[which];
}

/* Version 2 takes MXFP4 at n = 1 when selected, x fits in shared memory and the rows give
 * at least 512 blocks (fewer rows: v1's group per row keeps more warps busy). */
static int matmul_mx2_ok(const kl_gpu_mat *w)
{
    return kl_gpu_version(KL_GPU_K_MX) == 2 && w->cols <= KL_MX2_MAX_COLS &&
           w->rows >= (uint32_t)KL_MX2_ROWS * 512;
}

static void matmul_mx2(const kl_gpu_mat *w, const float *x, float *y, hipStream_t st)
{
    const size_t chunks = (w->rows + KL_MX2_ROWS - 1) / KL_MX2_ROWS;
    const size_t passes = chunks / KL_MX2_BLOCKS < 1 ? 1 : chunks / KL_MX2_BLOCKS;
    const unsigned blocks = (unsigned)((chunks + passes - 1) / passes);
    matmul_mx2_kernel<<<blocks, KL_MX2_THREADS, w->cols * sizeof(float), st>>>(
        *w, x, y, (uint32_t)passes);
}

/* BF16 at n = 1, version 2, for matrices of 512 to 65536 rows (few enough blocks that the
 * launch's fixed costs matter; v1 keeps lm_head at the copy rate; 512 and 1024 rows are the
 * shared experts' gate + up at tensor-parallel 4 and 2): blocks of BF_THREADS, G = 1, 2, 4 or 8
 * groups per row; x in shared memory (float4 f at f ^ (f / 8 % 2): the 8 lanes of a
 * quarter warp read float4s 2c and 2c + 1 of 8 consecutive pieces c conflict-free), filled
 * once per block while the block's first weight loads are in flight (issued before
 * the grid wait: gpu.h, KL_GPU_EARLY_DEPENDENTS); BF_PIECES 16-byte pieces
 * per lane per round.  The groups of a row are summed in group order. */
#define BF_THREADS  512 /* 2 blocks an SM: registers capped at 64 a thread */
#define BF_WARPS    (BF_THREADS / KL_GPU_GROUP)
#define BF_PIECES   8
#define BF_MAX_COLS 10240 /* x in shared memory: at most 40 KiB */

__device__ static inline float4 bf_x(const float4 *sh, uint32_t f)
{
    return sh[f ^ ((f >> 3) & 1u)];
}

/* acc plus the dot product of BF16 piece q (8 weights) and x's floats 8c .. 8c + 8 (x in
 * shared memory as bf_x lays it out), in order. */
__device__ static inline float bf_piece_dot(uint4 q, const float4 *sh, uint32_t c, float acc)
{
    float wv[8];
    kl_row_unpack(q, wv, 1);
    const float4 a = bf_x(sh, 2 * c), b = bf_x(sh, 2 * c + 1);
    const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; i++)
        acc = fmaf(wv[i], xv[i], acc);
    return acc;
}

/* The lane's round of pieces c0 + u * lanes of row p (np pieces; none when p is NULL). */
__device__ static inline void bf_load(uint4 *q, const uint4 *p, uint32_t np, uint32_t c0,
                                      uint32_t lanes)
{
#pragma unroll
    for (int u = 0; u < BF_PIECES; u++) {
        const uint32_t c = c0 + u * lanes;
        q[u] = p && c < np ? p[c] : make_uint4(0, 0, 0, 0);
    }
}

/* SiLU(z) · u: the gated MLP's activation, the same expression as silu_mul_kernel's. */
__device__ static inline float kl_silu_mul(float z, float u)
{
    return z / (1.0f + expf(-z)) * u;
}

/* One one-token product: y = x Wᵀ; with gb, x is SiLU(x) ⊙ gb (made as it is staged). */
typedef struct bf_job {
    kl_gpu_mat   w;
    const float *x, *gb;
    float       *y;
} bf_job;

/* The residual add and RMSNorm of the token a one-token product multiplies, made as its
 * blocks stage x (kl_gpu_matmul_norm): xn = nw ⊙ (v / rms(v)), v = x + r; block 0 also writes
 * v to x_out and xn to xn_out for the kernels after.  x NULL: x is staged as it is. */
struct bf_norm {
    const float *x, *r, *nw;
    float       *x_out, *xn_out;
    float        eps;
};

/* Sum of v over the block (T threads) on every thread, the groups' sums added in group order;
 * red is free again after the caller's next barrier. */
template <int T> __device__ static float bf_block_sum(float v, float *red)
{
    v = kl_gpu_group_sum(v);
    if (threadIdx.x % KL_GPU_GROUP == 0)
        red[threadIdx.x / KL_GPU_GROUP] = v;
    __syncthreads();
    float s = 0.0f;
    for (int g = 0; g < T / KL_GPU_GROUP; g++)
        s += red[g];
    return s;
}

/* x of a one-token product into shared memory with the norm of nm (n4 float4s), by the
 * block's T threads: each stages v = x + r, the block sums v², then each thread scales its own
 * entries (so no barrier between); block `writer` also writes v and xn out. */
template <int T>
__device__ static void bf_stage_norm(const bf_norm &nm, float4 *sh, uint32_t n4, bool writer,
                                     float *red)
{
    const float4 *x4 = (const float4 *)nm.x, *r4 = (const float4 *)nm.r;
    float ss = 0.0f;
    for (uint32_t f = threadIdx.x; f < n4; f += T) {
        const float4 a = KL_LOAD_L2(&x4[f]), b = KL_LOAD_L2(&r4[f]); /* r: maybe written in
                                                                        this launch (chains) */
        const float4 v = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        sh[f ^ ((f >> 3) & 1u)] = v;
        ss = fmaf(v.x, v.x, ss);
        ss = fmaf(v.y, v.y, ss);
        ss = fmaf(v.z, v.z, ss);
        ss = fmaf(v.w, v.w, ss);
        if (writer)
            ((float4 *)nm.x_out)[f] = v;
    }
    const float inv = 1.0f / sqrtf(bf_block_sum<T>(ss, red) / (float)(4 * n4) + nm.eps);
    for (uint32_t f = threadIdx.x; f < n4; f += T) {
        const float4 v = sh[f ^ ((f >> 3) & 1u)], w = ((const float4 *)nm.nw)[f];
        const float4 o = make_float4(w.x * (v.x * inv), w.y * (v.y * inv), w.z * (v.z * inv),
                                     w.w * (v.w * inv));
        sh[f ^ ((f >> 3) & 1u)] = o;
        if (writer)
            ((float4 *)nm.xn_out)[f] = o;
    }
}

/* A small job that rides in a one-token product's launch, independent of the product: its
 * blocks come first in the grid (never in the products' last wave), one group of 32 lanes
 * per unit of work.  At decode it saves the job's own launch and its wait on the critical
 * path (kl_gpu_matmul_glu_route, kl_gpu_matmul_pair_conv). */
struct bf_rider {
    enum { NONE, ROUTE, CONV } kind;
    unsigned             blocks;
    kl_gpu_route_args    route;       /* ROUTE: a group per token */
    kl_gpu_kda_conv_args conv;        /* CONV: a group per (run, q/k/v, 32 channels) */
    const uint32_t      *run_start, *run_slot;
    uint32_t             n_runs;
};

__device__ static void bf_ride(const bf_rider &r)
{
    const uint32_t u = blockIdx.x * BF_WARPS + threadIdx.x / KL_GPU_GROUP;
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP;
    if (r.kind == bf_rider::ROUTE) {
        if (u < r.route.n)
            route_in_registers(r.route, u, lane);
        return;
    }
    const uint32_t cb = (r.conv.D + KL_GPU_GROUP - 1) / KL_GPU_GROUP, run = u / (3 * cb);
    if (run < r.n_runs) /* one segment a run: each thread reads only what it writes */
        kda_conv_thread(r.conv, r.run_start, r.run_slot, u % cb * KL_GPU_GROUP + lane,
                        u / cb % 3, run, 0, 1, false);
}

/* Blocks [0, rider.blocks) do the rider's job, then blocks [.., + nb_a) job a and the rest
 * job b (two products of one shape class, one launch). */
__global__ static void __launch_bounds__(BF_THREADS, 2)
    matmul_bf16_n1_kernel(bf_job ja, bf_job jb, unsigned nb_a, unsigned G, bf_rider rider,
                          bf_norm nm)
{
    KL_GPU_GRID_WAIT_LATER();
    if (blockIdx.x < rider.blocks) {
        KL_GPU_GRID_WAIT();
        bf_ride(rider);
        return;
    }
    const unsigned b = blockIdx.x - rider.blocks;
    extern __shared__ float4 bf_sh[];
    __shared__ float red[BF_WARPS];
    const int second = b >= nb_a;
    const kl_gpu_mat w = second ? jb.w : ja.w;
    const float *x = second ? jb.x : ja.x, *gb = second ? jb.gb : ja.gb;
    float *y = second ? jb.y : ja.y;
    const unsigned wi = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    const size_t row = (size_t)(b - (second ? nb_a : 0)) * (BF_WARPS / G) + wi / G;
    const uint32_t np = w.cols / 8, lanes = G * KL_GPU_GROUP, gl = wi % G * KL_GPU_GROUP + lane;
    const uint4 *p = row < w.rows ? (const uint4 *)w.data + row * np : NULL;
    uint4 q[BF_PIECES];
    bf_load(q, p, np, gl, lanes); /* weights: written before the step's first kernel */
    KL_GPU_GRID_WAIT();
    const float4 *x4 = (const float4 *)x, *g4 = (const float4 *)gb;
    if (nm.x)
        bf_stage_norm<BF_THREADS>(nm, bf_sh, w.cols / 4, b == 0, red);
    for (uint32_t f = threadIdx.x; !nm.x && f < w.cols / 4; f += BF_THREADS) {
        float4 v = x4[f];
        if (g4) {
            const float4 u = g4[f];
            v = make_float4(kl_silu_mul(v.x, u.x), kl_silu_mul(v.y, u.y), kl_silu_mul(v.z, u.z),
                            kl_silu_mul(v.w, u.w));
        }
        bf_sh[f ^ ((f >> 3) & 1u)] = v;
    }
    __syncthreads();
    float acc = 0.0f;
    for (uint32_t c0 = gl; c0 < np; c0 += lanes * BF_PIECES) {
        if (c0 != gl)
            bf_load(q, p, np, c0, lanes);
#pragma unroll
        for (int u = 0; u < BF_PIECES; u++) {
            const uint32_t c = c0 + u * lanes;
            if (c < np)
                acc = bf_piece_dot(q[u], bf_sh, c, acc);
        }
    }
    acc = kl_gpu_group_sum(acc);
    if (G > 1) { /* the same for the whole block */
        if (lane == 0)
            red[wi] = acc;
        __syncthreads();
        acc = 0.0f;
        for (unsigned g = 0; g < G; g++)
            acc += red[wi / G * G + g];
    }
    if (row < w.rows && lane == 0 && wi % G == 0)
        y[row] = acc;
}

/* BF16 at n = 1, version 3: rows streamed through shared memory by the copy engine.
 * Why: version 2 runs a block's rows in one or two rounds of register loads, in waves of two
 * blocks an SM, and after the grid wait each wave is a chain of DRAM latency, x's staging and
 * sums; session 19 measured [2304, 4096] at ~10 us with its weights in L2 against ~11.5 from
 * DRAM (4.4 us of bytes): the chain, not the bytes, bounds it.  Version 3: one block an SM
 * takes a contiguous range of rows (the grid one wave, rows split evenly) and streams them
 * through a ring of stages of BS_WARPS rows (kernels/bulk.cuh: one copy a stage); the whole
 * ring is asked for before the grid wait (the weights never change within a step), so a
 * matrix of up to ~25 MB is in flight before its input exists; x, or the norm of it
 * (bf_norm), is staged once a block; a warp sums a row, each lane its pieces lane, lane + 32,
 * .. in order (version 2's order at one group a row).  Measured (docs/PERFORMANCE.md session
 * 19): decode +2%, [2304, 4096] 8.2 us against 9.6; the marginal rate 0.89 of the copy rate
 * against 0.84, the fixed ~4 us a product (launch, first latency, x, tail) unchanged; filling
 * the stages by every thread's cp.async, or in 4 KiB copies, was slower. */
#define BS_THREADS    256
#define BS_WARPS      (BS_THREADS / KL_GPU_GROUP)
#define BS_MAX_COLS   4096
#define BS_MAX_SLOTS  8
#define BS_MIN_SLOTS  2

/* One product of a version-3 launch: y = W x, x staged as it is or (x NULL) as the norm nm;
 * each block takes its share of the rows (bs_span_of) in stages of BS_WARPS. */
struct bs_phase {
    kl_gpu_mat   w;
    const float *x;
    float       *y;
    bf_norm      nm;
};

/* This block's share of a phase's rows (even split, one block an SM), worked out once a
 * launch: a stage's address and size are then 32-bit products, not 64-bit divisions (those,
 * per stage, cost version 3 ~20%: session 20). */
struct bs_span {
    const uint8_t *src; /* the block's first row */
    float         *y;   /* its output */
    uint32_t       rows, row_bytes, stages;
};

__device__ static inline bs_span bs_span_of(const bs_phase &ph)
{
    const size_t r0 = (size_t)blockIdx.x * ph.w.rows / gridDim.x;
    const size_t r1 = (size_t)(blockIdx.x + 1) * ph.w.rows / gridDim.x;
    const uint32_t rows = (uint32_t)(r1 - r0), row_bytes = ph.w.cols * 2;
    return bs_span{(const uint8_t *)ph.w.data + r0 * row_bytes, ph.y + r0, rows, row_bytes,
                   (rows + BS_WARPS - 1) / BS_WARPS};
}

/* Stage j of span sp: its source, and its bytes (the last stage short). */
__device__ static inline const uint8_t *bs_stage(const bs_span &sp, uint32_t j, uint32_t *bytes)
{
    const uint32_t left = sp.rows - j * BS_WARPS;
    *bytes = (left < BS_WARPS ? left : BS_WARPS) * sp.row_bytes;
    return sp.src + (size_t)j * BS_WARPS * sp.row_bytes;
}

/* The grid barrier's counter, one a device, zero when the module loads; it only grows. */
__device__ static unsigned long long bs_barrier;

/* Every block of the grid here before any goes on (all of them resident: one an SM), the
 * writes before it visible after.  The counter only grows: a barrier's target is the next
 * multiple of the grid's size, so launches of one grid size share it one at a time (one
 * stream a device: the engine chains no products when ranks share a device). */
__device__ static void bs_grid_sync(void)
{
    unsigned long long *ctr = &bs_barrier;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned long long old = atomicAdd(ctr, 1ull);
        const unsigned long long target = (old / gridDim.x + 1) * gridDim.x;
        while (*(volatile unsigned long long *)ctr < target) {
        }
        __threadfence();
    }
    __syncthreads();
}

/* x of phase ph into shared memory (x as it is, or its norm), by the block. */
__device__ static void bs_stage_x(const bs_phase &ph, float4 *sh, float *red)
{
    if (ph.nm.x)
        bf_stage_norm<BS_THREADS>(ph.nm, sh, ph.w.cols / 4, blockIdx.x == 0, red);
    for (uint32_t f = threadIdx.x; !ph.nm.x && f < ph.w.cols / 4; f += BS_THREADS)
        sh[f ^ ((f >> 3) & 1u)] = ((const float4 *)ph.x)[f];
    __syncthreads();
}

/* Products a, then b (b.w.rows 0: none) whose input reads a's output (its norm's r), with a
 * grid-wide barrier (bs_grid_sync) between; the ring streams a's stages then b's, so b's
 * first stages are in flight while a finishes. */
__global__ static void __launch_bounds__(BS_THREADS, 1)
    matmul_bf16_stream_kernel(bs_phase a, bs_phase b, uint32_t slots, uint32_t slot_bytes,
                              uint32_t x_floats)
{
    KL_GPU_GRID_WAIT_LATER();
    extern __shared__ float4 bs_sh[]; /* x (x_floats), then the ring's slots */
    __shared__ uint64_t bar[BS_MAX_SLOTS];
    __shared__ float red[BS_WARPS];
    uint8_t *ring = (uint8_t *)(bs_sh + x_floats / 4);
    const bs_span sa = bs_span_of(a), sb = bs_span_of(b); /* b.w.rows 0: no stages */
    const uint32_t n = sa.stages + sb.stages;
    auto issue = [&](uint32_t k) { /* thread 0: stage k into its slot */
        uint32_t bytes;
        const uint8_t *src = k < sa.stages ? bs_stage(sa, k, &bytes)
                                           : bs_stage(sb, k - sa.stages, &bytes);
        bulk_load(ring + (k % slots) * slot_bytes, src, bytes, &bar[k % slots]);
    };
    if (threadIdx.x == 0) {
        bulk_init(bar, slots);
        for (uint32_t k = 0; k < slots && k < n; k++) /* weights: before the wait */
            issue(k);
    }
    KL_GPU_GRID_WAIT();
    bs_stage_x(a, bs_sh, red); /* and the barriers initialised */
    const unsigned wi = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    for (uint32_t k = 0; k < n; k++) {
        if (k == sa.stages) { /* b's input is made of a's output, every block's */
            bs_grid_sync();
            bs_stage_x(b, bs_sh, red);
        }
        const bs_span sp = k < sa.stages ? sa : sb; /* a copy: no local memory */
        const uint32_t j = k < sa.stages ? k : k - sa.stages, s = k % slots;
        uint32_t bytes;
        const uint8_t *src = bs_stage(sp, j, &bytes);
        uint8_t *slot = ring + s * slot_bytes;
        bulk_wait(&bar[s], k / slots, slot, src, bytes);
        const uint32_t row = j * BS_WARPS + wi; /* within the span */
        if (row < sp.rows) {
            const uint32_t np = sp.row_bytes / 16;
            const uint4 *p = (const uint4 *)(slot + wi * sp.row_bytes);
            float acc = 0.0f;
#pragma unroll 4
            for (uint32_t c = lane; c < np; c += KL_GPU_GROUP)
                acc = bf_piece_dot(p[c], bs_sh, c, acc);
            acc = kl_gpu_group_sum(acc);
            if (lane == 0)
                sp.y[row] = acc;
        }
        __syncthreads(); /* every read of slot s done */
        if (threadIdx.x == 0 && k + slots < n)
            issue(k + slots);
    }
}

/* Whether version 3 takes w (16-byte aligned x: vec). */
static int bs_takes(const kl_gpu_mat *w, int vec)
{
    return kl_gpu_version(KL_GPU_K_BF16) == 3 && w->kind == KL_GPU_W_BF16 && vec &&
           w->cols <= BS_MAX_COLS && w->cols % 8 == 0 && w->rows >= 512 && w->rows <= 65536;
}

/* The launch of version 3 for products a and b (b.w.rows 0: a alone): 1 when it took them, 0
 * when the device's shared memory holds fewer than BS_MIN_SLOTS stages of the wider. */
static int bs_launch(const bs_phase &a, const bs_phase &b, hipStream_t st)
{
    static size_t opted; /* the shared memory the kernel may ask for, set once it grows */
    const uint32_t cols = b.w.rows && b.w.cols > a.w.cols ? b.w.cols : a.w.cols;
    const size_t x_bytes = (size_t)cols * sizeof(float), slot = (size_t)BS_WARPS * cols * 2;
    const size_t room = kl_gpu_shared_optin() - 1024; /* the static barriers and sums */
    uint32_t slots = room > x_bytes ? (uint32_t)((room - x_bytes) / slot) : 0;
    slots = slots > BS_MAX_SLOTS ? BS_MAX_SLOTS : slots;
    const size_t shared = x_bytes + slots * slot;
    if (slots < BS_MIN_SLOTS)
        return 0;
    if (shared > opted) { /* a setting of the function, not a stream operation */
        if (hipFuncSetAttribute((const void *)matmul_bf16_stream_kernel,
                                hipFuncAttributeMaxDynamicSharedMemorySize,
                                (int)shared) != hipSuccess)
            return 0;
        opted = shared;
    }
    const uint32_t rows = b.w.rows && b.w.rows < a.w.rows ? b.w.rows : a.w.rows;
    const unsigned blocks = rows < kl_gpu_sm_count() ? rows : kl_gpu_sm_count();
    matmul_bf16_stream_kernel<<<blocks, BS_THREADS, shared, st>>>(a, b, slots, (uint32_t)slot,
                                                                  cols);
    return 1;
}

/* 1 when version 3 took the product (launched with the norm nm, or x as it is). */
static int matmul_bf16_stream(const kl_gpu_mat *w, const float *x, float *y, int vec,
                              hipStream_t st, const bf_norm &nm)
{
    return bs_takes(w, vec) && bs_launch(bs_phase{*w, nm.x ? NULL : x, y, nm}, bs_phase{}, st);
}

/* The warps per row for the one-token BF16 kernel (version 2, 16-byte aligned, the shapes
 * above), or 0 when it does not apply. */
static unsigned bf16_n1_groups(const kl_gpu_mat *w, int vec)
{
    if (kl_gpu_version(KL_GPU_K_BF16) < 2 || w->kind != KL_GPU_W_BF16 || !vec ||
        w->cols > BF_MAX_COLS || w->rows < 512 || w->rows > 65536)
        return 0;
    /* at least 256 blocks: 2 an SM (measured at decode, the full geometry: 2304-row matrices
     * with G = 1 (144 blocks) as fast as G = 2 (288), G = 4 (576) 10% slower overall).  At 2304
     * columns a lane with G = 1 has 9 pieces of a row, one more than a round (BF_PIECES), yet
     * G = 2 forced everywhere measured 386 against 400 tok/s (session 19). */
    unsigned G = 1;
    while (G < 8 && (size_t)w->rows * G / BF_WARPS < 256)
        G *= 2;
    return G;
}

static unsigned bf16_n1_blocks(const kl_gpu_mat *w, unsigned G)
{
    const unsigned per_block = BF_WARPS / G;
    return (w->rows + per_block - 1) / per_block;
}

/* 1 when version 2 took the product (bf16_n1_groups); with gb (16-byte aligned too), of
 * SiLU(x) ⊙ gb; the rider's job and the norm nm in the same launch. */
static int matmul_bf16_n1(const kl_gpu_mat *w, const float *x, const float *gb, float *y,
                          int vec, hipStream_t st, const bf_rider &rider = bf_rider{},
                          const bf_norm &nm = bf_norm{})
{
    if (!gb && rider.kind == bf_rider::NONE && matmul_bf16_stream(w, x, y, vec, st, nm))
        return 1;
    const unsigned G = bf16_n1_groups(w, vec);
    if (!G)
        return 0;
    const bf_job j = {*w, x, gb, y};
    const unsigned nb = bf16_n1_blocks(w, G);
    matmul_bf16_n1_kernel<<<rider.blocks + nb, BF_THREADS, w->cols * sizeof(float), st>>>(
        j, j, nb, G, rider, nm);
    return 1;
}

/* The rider of route's n tokens (E <= 256: route_in_registers_ok). */
static bf_rider route_rider(const kl_gpu_route_args *route)
{
    bf_rider r = {};
    r.kind = bf_rider::ROUTE;
    r.blocks = (route->n + BF_WARPS - 1) / BF_WARPS;
    r.route = *route;
    return r;
}

/* The rider of conv over t's runs (each one token: one segment a run). */
static bf_rider conv_rider(const kl_gpu_kda_conv_args *conv, const kl_gpu_tokens *t)
{
    const uint32_t groups = (conv->D + KL_GPU_GROUP - 1) / KL_GPU_GROUP * 3 * t->n_runs;
    bf_rider r = {};
    r.kind = bf_rider::CONV;
    r.blocks = (groups + BF_WARPS - 1) / BF_WARPS;
    r.conv = *conv;
    r.run_start = t->run_start;
    r.run_slot = t->run_slot;
    r.n_runs = t->n_runs;
    return r;
}

extern "C" int kl_gpu_matmul(const kl_gpu_mat *w, const float *x, uint32_t n, float *y,
                             kl_gpu_stream s, kl_err *err)
{
    int rc = kl_row_mat_check(w, "matmul", err);
    if (rc)
        return rc;
    if (!x || !y || n == 0)
        return kl_fail(err, KL_E_USAGE, "matmul: x or y is NULL, or n is 0");
    const int vec = kl_row_vec_ok(w, x, w->cols);
    if (w->kind == KL_GPU_W_MXFP4 && !vec)
        return kl_fail(err, KL_E_USAGE, "matmul: MXFP4 needs x 16-byte aligned");
    hipStream_t st = (hipStream_t)s;
    if (n >= 2 && n < KL_GPU_GEMM_MIN_N && kl_gpu_skinny_takes(w, x, n))
        return kl_gpu_skinny(w, x, n, y, s, err);
    if (w->kind == KL_GPU_W_MXFP4 && n == 1 && matmul_mx2_ok(w)) {
        matmul_mx2(w, x, y, st);
        return KL_GPU_CHECK(err, hipGetLastError());
    }
    if (w->kind == KL_GPU_W_MXFP4 && n == 1 && kl_xreg_s(w->cols)) {
        matmul_mxfp4_xreg(w, x, y, st);
        return KL_GPU_CHECK(err, hipGetLastError());
    }
    if (n == 1 && matmul_bf16_n1(w, x, NULL, y, vec, st))
        return KL_GPU_CHECK(err, hipGetLastError());
    const uint32_t nt = n == 1 ? 1 : n == 2 ? 2 : n <= 4 ? 4 : 8;
    /* more groups per row while each lane keeps >= 4 pieces and the groups stay few enough */
    const uint32_t pieces = w->kind == KL_GPU_W_MXFP4 ? w->cols / 8 : w->cols / 4;
    unsigned G = 1;
    while (G < KL_ROW_WARPS && 2 * G * KL_GPU_GROUP * 4 <= pieces &&
           (size_t)w->rows * G < 2 * KL_ROW_TARGET)
        G *= 2;
    const unsigned per_block = KL_ROW_WARPS / G;
    const dim3 grid((w->rows + per_block - 1) / per_block, (n + nt - 1) / nt);
    if (grid.y > MAX_GRID_Y)
        return kl_fail(err, KL_E_USAGE, "matmul: %u tokens is too many", n);
    if (nt == 1)
        matmul_kernel<1><<<grid, THREADS, 0, st>>>(*w, x, n, y, vec, G);
    else if (nt == 2)
        matmul_kernel<2><<<grid, THREADS, 0, st>>>(*w, x, n, y, vec, G);
    else if (nt == 4)
        matmul_kernel<4><<<grid, THREADS, 0, st>>>(*w, x, n, y, vec, G);
    else
        matmul_kernel<8><<<grid, THREADS, 0, st>>>(*w, x, n, y, vec, G);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ---- embed ------------------------------------------------------------------------------- */

/* Block t: row ids[t] - row0 of the table as fp32 (an id outside the table: 0 for a part,
 * else NaN: visible). */
__global__ static void embed_kernel(kl_gpu_mat tab, uint32_t row0, float outside,
                                    const uint32_t *ids, float *x)
{
    KL_GPU_GRID_WAIT();
    const uint32_t id = ids[blockIdx.x] - row0;   /* below row0: wraps past the table */
    float *out = x + (size_t)blockIdx.x * tab.cols;
    for (uint32_t c = threadIdx.x; c < tab.cols; c += blockDim.x) {
        float v = outside;
        if (id < tab.rows) {
            const size_t i = (size_t)id * tab.cols + c;
            v = tab.kind == KL_GPU_W_BF16 ? kl_bf16_f32(((const uint16_t *)tab.data)[i])
                                          : ((const float *)tab.data)[i];
        }
        out[c] = v;
    }
}

extern "C" int kl_gpu_embed(const kl_gpu_mat *table, uint32_t row0, int part,
                            const uint32_t *ids, uint32_t n, float *x, kl_gpu_stream s,
                            kl_err *err)
{
    int rc = kl_row_mat_check(table, "embed", err);
    if (rc)
        return rc;
    if (table->kind == KL_GPU_W_MXFP4)
        return kl_fail(err, KL_E_USAGE, "embed: the table must be F32 or BF16");
    if (!ids || !x || n == 0 || n > 0x7fffffffu)
        return kl_fail(err, KL_E_USAGE, "embed: ids or x is NULL, or n is 0 or too large");
    const float outside = part ? 0.0f : __builtin_nanf("");
    embed_kernel<<<n, THREADS, 0, (hipStream_t)s>>>(*table, row0, outside, ids, x);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ---- residual + RMSNorm ------------------------------------------------------------------ */

/* Sum of v over the block (THREADS threads), on every thread; the groups' sums are added in
 * group order by thread 0, so the result does not depend on timing. */
__device__ static float block_sum(float v)
{
    __shared__ float part[THREADS / KL_GPU_GROUP];
    __shared__ float total;
    v = kl_gpu_group_sum(v);
    if (threadIdx.x % KL_GPU_GROUP == 0)
        part[threadIdx.x / KL_GPU_GROUP] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int g = 0; g < THREADS / KL_GPU_GROUP; g++)
            s += part[g];
        total = s;
    }
    __syncthreads();
    return total;
}

/* Block r: row r of x (+= the sum of the ys' rows r, in order), its mean square, then xn.
 * Rows of h <= NORM_MAX4 * 4 floats (vec: h % 4 == 0, 16-byte aligned) are held in registers
 * as float4s: every load of the row (x, the ys, the weights) is issued before the first sum,
 * so the block waits for memory once instead of once per element it owns (at one token the
 * norm is all latency: 2304 floats). */
#define NORM_VEC  3                           /* float4 of a row per thread */
#define NORM_MAX4 (NORM_VEC * THREADS)        /* float4 per row held in registers */

static inline int kl_aligned16(const void *p)
{
    return (uintptr_t)p % 16 == 0;
}

/* The buffers added to x before the norm (n 0: none): ((p[0] + p[1]) + ...) + x's row is
 * what adding their sum, made first by adds in the same order, would give bit for bit. */
typedef struct norm_adds {
    const float *p[KL_GPU_SUM_MAX];
    unsigned     n;
} norm_adds;

__device__ static float4 add4(float4 a, float4 b)
{
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__device__ static void add_rmsnorm_row4(float4 *xr, const norm_adds &ys, size_t off4,
                                        const float4 *w, uint32_t h4, float eps, float4 *out)
{
    float4 v[NORM_VEC], wv[NORM_VEC], d[NORM_VEC];
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int u = 0; u < NORM_VEC; u++) {
        const uint32_t f = threadIdx.x + u * THREADS;
        v[u] = f < h4 ? xr[f] : zero;
        wv[u] = f < h4 ? w[f] : zero;
        d[u] = ys.n && f < h4 ? ((const float4 *)ys.p[0])[off4 + f] : zero;
    }
    for (unsigned k = 1; k < ys.n; k++)
#pragma unroll
        for (int u = 0; u < NORM_VEC; u++) {
            const uint32_t f = threadIdx.x + u * THREADS;
            if (f < h4)
                d[u] = add4(d[u], ((const float4 *)ys.p[k])[off4 + f]);
        }
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < NORM_VEC; u++) {
        const uint32_t f = threadIdx.x + u * THREADS;
        if (ys.n && f < h4) {
            v[u] = add4(v[u], d[u]);
            xr[f] = v[u];
        }
        ss = fmaf(v[u].x, v[u].x, ss);
        ss = fmaf(v[u].y, v[u].y, ss);
        ss = fmaf(v[u].z, v[u].z, ss);
        ss = fmaf(v[u].w, v[u].w, ss);
    }
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)(4 * h4) + eps);
#pragma unroll
    for (int u = 0; u < NORM_VEC; u++) {
        const uint32_t f = threadIdx.x + u * THREADS;
        if (f < h4)
            out[f] = make_float4(wv[u].x * (v[u].x * inv), wv[u].y * (v[u].y * inv),
                                 wv[u].z * (v[u].z * inv), wv[u].w * (v[u].w * inv));
    }
}

__global__ static void __launch_bounds__(THREADS)
    add_rmsnorm_kernel(float *x, norm_adds ys, const float *w, uint32_t h, float eps,
                       float *xn, int vec, int early)
{
    KL_GPU_GRID_WAIT();
    KL_GPU_EARLY_DEPENDENTS(early);
    const size_t off = (size_t)blockIdx.x * h;
    float *xr = x + off;
    float *out = xn + off;
    if (vec) {
        add_rmsnorm_row4((float4 *)xr, ys, off / 4, (const float4 *)w, h / 4, eps,
                         (float4 *)out);
        return;
    }
    float ss = 0.0f;
    for (uint32_t i = threadIdx.x; i < h; i += THREADS) {
        float v = xr[i];
        if (ys.n) {
            float d = ys.p[0][off + i];
            for (unsigned k = 1; k < ys.n; k++)
                d += ys.p[k][off + i];
            v += d;
            xr[i] = v;
        }
        ss = fmaf(v, v, ss);
    }
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)h + eps);
    for (uint32_t i = threadIdx.x; i < h; i += THREADS)
        out[i] = w[i] * (xr[i] * inv);
}

extern "C" int kl_gpu_sum_add_rmsnorm(float *x, const float *const *y, unsigned ny,
                                      const float *w, uint32_t n, uint32_t h, float eps,
                                      float *xn, kl_gpu_stream s, kl_err *err)
{
    if (!x || !w || !xn || n == 0 || h == 0 || n > 0x7fffffffu || ny > KL_GPU_SUM_MAX ||
        (ny && !y))
        return kl_fail(err, KL_E_USAGE, "add_rmsnorm: x, w or xn is NULL, n or h is 0, or "
                       "%u buffers to add (at most %d)", ny, KL_GPU_SUM_MAX);
    if (xn == x)
        return kl_fail(err, KL_E_USAGE, "add_rmsnorm: xn may not alias x");
    norm_adds ys = {{NULL}, ny};
    int vec = h % 4 == 0 && h / 4 <= NORM_MAX4 && kl_aligned16(x) && kl_aligned16(w) &&
              kl_aligned16(xn);
    for (unsigned k = 0; k < ny; k++) {
        if (!y[k])
            return kl_fail(err, KL_E_USAGE, "add_rmsnorm: buffer %u to add is NULL", k);
        ys.p[k] = y[k];
        vec &= kl_aligned16(y[k]);
    }
    const int early = kl_gpu_early_dependents(n, THREADS);
    add_rmsnorm_kernel<<<n, THREADS, 0, (hipStream_t)s>>>(x, ys, w, h, eps, xn, vec, early);
    return KL_GPU_CHECK(err, hipGetLastError());
}

extern "C" int kl_gpu_add_rmsnorm(float *x, const float *y, const float *w, uint32_t n,
                                  uint32_t h, float eps, float *xn, kl_gpu_stream s, kl_err *err)
{
    return kl_gpu_sum_add_rmsnorm(x, &y, y ? 1 : 0, w, n, h, eps, xn, s, err);
}

/* ---- sums and SiLU gating ---------------------------------------------------------------- */

/* Blocks of THREADS for a grid-stride loop over count elements (at most 65536). */
static unsigned stride_blocks(size_t count)
{
    const size_t blocks = (count + THREADS - 1) / THREADS;
    return (unsigned)(blocks > 65536 ? 65536 : blocks);
}

__global__ static void add_kernel(float *x, const float *y, size_t count)
{
    KL_GPU_GRID_WAIT();
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step)
        x[i] = __fadd_rn(x[i], y[i]);
}

extern "C" int kl_gpu_add(float *x, const float *y, size_t count, kl_gpu_stream s, kl_err *err)
{
    if (!x || !y || count == 0)
        return kl_fail(err, KL_E_USAGE, "add: x or y is NULL, or count is 0");
    add_kernel<<<stride_blocks(count), THREADS, 0, (hipStream_t)s>>>(x, y, count);
    return KL_GPU_CHECK(err, hipGetLastError());
}

__global__ static void silu_mul_kernel(float *a, const float *b, size_t count)
{
    KL_GPU_GRID_WAIT();
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) {
        const float z = a[i];
        a[i] = z / (1.0f + expf(-z)) * b[i];
    }
}

extern "C" int kl_gpu_silu_mul(float *a, const float *b, size_t count, kl_gpu_stream s,
                               kl_err *err)
{
    if (!a || !b || count == 0)
        return kl_fail(err, KL_E_USAGE, "silu_mul: a or b is NULL, or count is 0");
    silu_mul_kernel<<<stride_blocks(count), THREADS, 0, (hipStream_t)s>>>(a, b, count);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* kl_gpu_matmul_pair, with conv (or NULL) riding in the one launch when the pair takes one
 * and every run is one token (else its own launch first). */
static int matmul_pair(const kl_gpu_mat *wa, const float *xa, float *ya, const kl_gpu_mat *wb,
                       const float *xb, float *yb, uint32_t n, const kl_gpu_kda_conv_args *conv,
                       const kl_gpu_tokens *t, kl_gpu_stream s, kl_err *err)
{
    int rc = kl_row_mat_check(wa, "matmul_pair", err);
    if (!rc)
        rc = kl_row_mat_check(wb, "matmul_pair", err);
    if (rc)
        return rc;
    if (!xa || !ya || !xb || !yb || n == 0)
        return kl_fail(err, KL_E_USAGE, "matmul_pair: an x or y is NULL, or n is 0");
    const unsigned ga = n == 1 ? bf16_n1_groups(wa, kl_row_vec_ok(wa, xa, wa->cols)) : 0;
    const unsigned gb = n == 1 ? bf16_n1_groups(wb, kl_row_vec_ok(wb, xb, wb->cols)) : 0;
    const int ride = conv && ga && ga == gb && t->max_run == 1;
    if (conv && !ride && (rc = kl_gpu_kda_conv(conv, t, s, err)))
        return rc;
    if (!ga || ga != gb) {
        rc = kl_gpu_matmul(wa, xa, n, ya, s, err);
        return rc ? rc : kl_gpu_matmul(wb, xb, n, yb, s, err);
    }
    const bf_rider r = ride ? conv_rider(conv, t) : bf_rider{};
    const bf_job a = {*wa, xa, NULL, ya}, b = {*wb, xb, NULL, yb};
    const unsigned nb_a = bf16_n1_blocks(wa, ga), nb_b = bf16_n1_blocks(wb, ga);
    const size_t sh = (wa->cols > wb->cols ? wa->cols : wb->cols) * sizeof(float);
    matmul_bf16_n1_kernel<<<r.blocks + nb_a + nb_b, BF_THREADS, sh, (hipStream_t)s>>>(
        a, b, nb_a, ga, r, bf_norm{});
    return KL_GPU_CHECK(err, hipGetLastError());
}

extern "C" int kl_gpu_matmul_pair(const kl_gpu_mat *wa, const float *xa, float *ya,
                                  const kl_gpu_mat *wb, const float *xb, float *yb, uint32_t n,
                                  kl_gpu_stream s, kl_err *err)
{
    return matmul_pair(wa, xa, ya, wb, xb, yb, n, NULL, NULL, s, err);
}

extern "C" int kl_gpu_matmul_pair_conv(const kl_gpu_mat *wa, const float *xa, float *ya,
                                       const kl_gpu_mat *wb, const float *xb, float *yb,
                                       const kl_gpu_kda_conv_args *conv, const kl_gpu_tokens *t,
                                       kl_gpu_stream s, kl_err *err)
{
    if (kda_conv_check(conv, t, err))
        return err->code;
    if (t->n_runs == 0 || t->n == 0)
        return kl_fail(err, KL_E_USAGE, "matmul_pair_conv: no tokens");
    return matmul_pair(wa, xa, ya, wb, xb, yb, t->n, conv, t, s, err);
}

extern "C" int kl_gpu_matmul_norm_takes(const kl_gpu_mat *w, const float *x, const float *r,
                                        const float *nw, float *x_out, float *xn_out)
{
    return x && r && nw && x_out && xn_out && x_out != x && kl_aligned16(x) &&
           kl_aligned16(r) && kl_aligned16(nw) && kl_aligned16(x_out) && kl_aligned16(xn_out) &&
           w->cols % 4 == 0 && bf16_n1_groups(w, kl_row_vec_ok(w, x, w->cols)) != 0;
}

extern "C" int kl_gpu_matmul_norm(const kl_gpu_mat *w, const float *x, const float *r,
                                  const float *nw, float eps, float *x_out, float *xn_out,
                                  float *y, kl_gpu_stream s, kl_err *err)
{
    int rc = kl_row_mat_check(w, "matmul_norm", err);
    if (rc)
        return rc;
    if (!y || !kl_gpu_matmul_norm_takes(w, x, r, nw, x_out, xn_out))
        return kl_fail(err, KL_E_USAGE, "matmul_norm: the one-token BF16 kernel does not take "
                       "this product (kl_gpu_matmul_norm_takes), or y is NULL");
    const bf_norm nm = {x, r, nw, x_out, xn_out, eps};
    matmul_bf16_n1(w, xn_out, NULL, y, 1, (hipStream_t)s, bf_rider{}, nm);
    return KL_GPU_CHECK(err, hipGetLastError());
}

extern "C" int kl_gpu_matmul_chain_takes(const kl_gpu_mat *wa, const float *xa,
                                         const kl_gpu_mat *wb, const float *r, const float *nw,
                                         float *x_out, float *xn_out)
{
    /* the norm's x is r, its r ya (not known here: kl_gpu_matmul_chain checks it) */
    return wa->cols % 4 == 0 && bs_takes(wa, kl_row_vec_ok(wa, xa, wa->cols)) &&
           kl_gpu_matmul_norm_takes(wb, r, r, nw, x_out, xn_out) &&
           bs_takes(wb, 1) && wa->rows == wb->cols;
}

extern "C" int kl_gpu_matmul_chain(const kl_gpu_mat *wa, const float *xa, float *ya,
                                   const float *r, const float *nw, float eps, float *x_out,
                                   float *xn_out, const kl_gpu_mat *wb, float *yb,
                                   kl_gpu_stream s, kl_err *err)
{
    int rc = kl_row_mat_check(wa, "matmul_chain", err);
    if (!rc)
        rc = kl_row_mat_check(wb, "matmul_chain", err);
    if (rc)
        return rc;
    if (!ya || !yb || !kl_aligned16(ya) ||
        !kl_gpu_matmul_chain_takes(wa, xa, wb, r, nw, x_out, xn_out))
        return kl_fail(err, KL_E_USAGE, "matmul_chain: version 3 does not take these products "
                       "(kl_gpu_matmul_chain_takes), or ya (16-byte aligned) or yb is NULL");
    const bs_phase a = {*wa, xa, ya, bf_norm{}};
    const bs_phase b = {*wb, NULL, yb, bf_norm{r, ya, nw, x_out, xn_out, eps}};
    if (!bs_launch(a, b, (hipStream_t)s))
        return kl_fail(err, KL_E_USAGE, "matmul_chain: the device's shared memory holds too few "
                       "stages");
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* kl_gpu_matmul_glu, with rt (or NULL) riding in the one-token launch when it can. */
static int matmul_glu(const kl_gpu_mat *w, float *a, const float *b, uint32_t n, float *y,
                      const kl_gpu_route_args *rt, kl_gpu_stream s, kl_err *err)
{
    int rc = kl_row_mat_check(w, "matmul_glu", err);
    if (rc)
        return rc;
    if (!a || !b || !y || n == 0)
        return kl_fail(err, KL_E_USAGE, "matmul_glu: a, b or y is NULL, or n is 0");
    const int vec = kl_row_vec_ok(w, a, w->cols) && kl_row_vec_ok(w, b, w->cols);
    if (rt && !route_in_registers_ok(rt->n_experts)) {
        if ((rc = kl_gpu_route(rt, s, err)))
            return rc;
        rt = NULL;
    }
    if (n == 1 && matmul_bf16_n1(w, a, b, y, vec, (hipStream_t)s,
                                 rt ? route_rider(rt) : bf_rider{}))
        return KL_GPU_CHECK(err, hipGetLastError());
    if (rt && (rc = kl_gpu_route(rt, s, err)))
        return rc;
    rc = kl_gpu_silu_mul(a, b, (size_t)n * w->cols, s, err);
    return rc ? rc : kl_gpu_matmul(w, a, n, y, s, err);
}

extern "C" int kl_gpu_matmul_glu(const kl_gpu_mat *w, float *a, const float *b, uint32_t n,
                                 float *y, kl_gpu_stream s, kl_err *err)
{
    return matmul_glu(w, a, b, n, y, NULL, s, err);
}

extern "C" int kl_gpu_matmul_glu_route(const kl_gpu_mat *w, float *a, const float *b,
                                       uint32_t n, float *y, const kl_gpu_route_args *route,
                                       kl_gpu_stream s, kl_err *err)
{
    int rc = route_check(route, "matmul_glu_route", err);
    return rc ? rc : matmul_glu(w, a, b, n, y, route, s, err);
}

/* ---- arg-max ----------------------------------------------------------------------------- */

/* b, or c when c ranks above it (NaN never does). */
__device__ static inline kl_best best_of(kl_best b, float v, uint32_t i)
{
    const kl_best c = {v, i, 0.0f};
    return !isnan(v) && kl_best_above(c, b) ? c : b;
}

/* Parts of a row the two-pass arg-max splits it into (version 2; KL_GPU_ARGMAX=v1: one block
 * per row), and the tokens it takes at most: their partial bests live in a buffer of this
 * file, so calls on two streams at once must not both take the two-pass path. */
#define ARGMAX_PARTS     64
#define ARGMAX_MAX_N     64
#define ARGMAX_PART_SIZE 16384 /* logits a part scans at least */

static __device__ kl_best argmax_parts[ARGMAX_MAX_N * ARGMAX_PARTS];

/* Block t * P + p: the best of part p of P of logits[t] (ties: lowest index; NaN
 * skipped), as kl_sample_argmax; with one part its index (all NaN: 0) goes to out[t], else
 * the candidate to argmax_parts.  Each thread scans a strided share (float4 loads,
 * ARGMAX_UNROLL in flight, when the rows are 16-byte aligned), the groups reduce with
 * shuffles, then thread 0 takes the best of the groups' bests. */
__global__ static void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(const float *logits, uint32_t vocab, int vec, uint32_t P, uint32_t *out)
{
    KL_GPU_GRID_WAIT();
    __shared__ kl_best group_best[ARGMAX_THREADS / KL_GPU_GROUP];
    const uint32_t p = blockIdx.x % P, t = blockIdx.x / P;
    const float *l = logits + (size_t)t * vocab;
    kl_best b = {-INFINITY, UINT32_MAX, 0.0f};
    /* the part: float4s [lo, hi) when vec, else elements [i0, i1) */
    const uint32_t units = vec ? vocab / 4 : vocab, per = (units + P - 1) / P;
    const uint32_t lo = (uint32_t)min((uint64_t)p * per, (uint64_t)units);
    const uint32_t hi = (uint32_t)min((uint64_t)lo + per, (uint64_t)units);
    uint32_t i0 = lo, i1 = hi;
    if (vec) {
        const float4 *l4 = (const float4 *)l;
        const uint32_t step = ARGMAX_THREADS * ARGMAX_UNROLL;
        for (uint32_t c0 = lo + threadIdx.x; c0 < hi; c0 += step) {
            float4 q[ARGMAX_UNROLL];
#pragma unroll
            for (int u = 0; u < ARGMAX_UNROLL; u++) {
                const uint32_t c = c0 + u * ARGMAX_THREADS;
                q[u] = c < hi ? l4[c] : make_float4(NAN, NAN, NAN, NAN);
            }
#pragma unroll
            for (int u = 0; u < ARGMAX_UNROLL; u++) {
                const uint32_t c = 4 * (c0 + u * ARGMAX_THREADS);
                b = best_of(best_of(best_of(best_of(b, q[u].x, c), q[u].y, c + 1), q[u].z,
                                    c + 2), q[u].w, c + 3);
            }
        }
        i0 = i1 = 0; /* vec: vocab % 4 == 0 */
    }
    for (uint32_t i = i0 + threadIdx.x; i < i1; i += ARGMAX_THREADS)
        b = best_of(b, l[i], i);
    b = kl_best_group(b);
    if (threadIdx.x % KL_GPU_GROUP == 0)
        group_best[threadIdx.x / KL_GPU_GROUP] = b;
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    for (int g = 1; g < ARGMAX_THREADS / KL_GPU_GROUP; g++)
        if (kl_best_above(group_best[g], b))
            b = group_best[g];
    if (P == 1)
        out[t] = b.i == UINT32_MAX ? 0 : b.i;
    else
        argmax_parts[t * P + p] = b;
}

/* Block t (one group): the best of token t's P <= 64 parts (ties: lowest index). */
__global__ static void argmax_final_kernel(uint32_t P, uint32_t *out)
{
    KL_GPU_GRID_WAIT();
    const unsigned lane = threadIdx.x;
    const kl_best none = {-INFINITY, UINT32_MAX, 0.0f};
    kl_best b = lane < P ? argmax_parts[blockIdx.x * P + lane] : none;
    const kl_best c = lane + KL_GPU_GROUP < P ? argmax_parts[blockIdx.x * P + lane + KL_GPU_GROUP]
                                              : none;
    b = kl_best_above(c, b) ? c : b;
    b = kl_best_group(b);
    if (lane == 0)
        out[blockIdx.x] = b.i == UINT32_MAX ? 0 : b.i;
}

extern "C" int kl_gpu_argmax(const float *logits, uint32_t n, uint32_t vocab, uint32_t *out,
                             kl_gpu_stream s, kl_err *err)
{
    if (!logits || !out || n == 0 || vocab == 0 || n > 0x7fffffffu)
        return kl_fail(err, KL_E_USAGE, "argmax: logits or out is NULL, or n or vocab is 0");
    const int vec = kl_aligned16(logits) && vocab % 4 == 0;
    uint32_t P = vocab / ARGMAX_PART_SIZE;
    P = P > ARGMAX_PARTS ? ARGMAX_PARTS : P < 1 ? 1 : P;
    if (n > ARGMAX_MAX_N || kl_gpu_version(KL_GPU_K_ARGMAX) == 1)
        P = 1;
    hipStream_t st = (hipStream_t)s;
    argmax_kernel<<<n * P, ARGMAX_THREADS, 0, st>>>(logits, vocab, vec, P, out);
    int rc = KL_GPU_CHECK(err, hipGetLastError());
    if (rc || P == 1)
        return rc;
    argmax_final_kernel<<<n, KL_GPU_GROUP, 0, st>>>(P, out);
    return KL_GPU_CHECK(err, hipGetLastError());
}
