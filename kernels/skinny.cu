/*
 * kernels/skinny.cu — products of 2 .. 32 tokens on tensor cores, each weight byte read once
 * (see skinny.h; the operand map: skinny_map.h).
 *
 * Grid: (row tiles, K splits).  A block of W = 4 or 8 warps takes 32 W rows and the columns
 * [k_begin, k_end) of its split; warp w rows 32 w .. + 31 of them (two m16 tiles) against all
 * tokens (NT n8 tiles: 8, 16 or 32 tokens).  K goes in steps of U units (BF16 version 1: 64
 * columns, two 16-byte loads per row a lane; version 2: 128, four; MXFP4 a granule of 128:
 * one 16-byte load of codes and one scale word per row), the next step's loads issued before
 * this step's products.  x is staged per stage
 * of columns (48 KiB: 1024, 512 or 256 columns for 8, 16 or 32 tokens) as three bf16 parts
 * (gemm_split.cuh), tokens past n as zeros; two barriers a stage.  Each step's MMAs (BF16 2
 * units x 2 MMAs x 3 parts = 12 per fragment, MXFP4 24) sum in fresh fragments added to the
 * fp32 sums once a step (gemm.h, form 2).  A block writes its sums to y, or with several
 * splits to its split's slice of sk_part, which skinny_sum_kernel adds in split order.
 *
 * Count (BF16 [4096, 2304], 16 tokens, 2 blocks an SM on the H200's 132): 16 tiles of 256
 * rows x 9 splits of 256 columns = 144 blocks; weights 18.9 MB (4.5 us at 4.2 TB/s); x read
 * from L2 once per block row (16 x 147 KB = 2.4 MB) and the partial sums written and read
 * once (2 x 9 x 16 x 4096 x 4 = 4.7 MB, L2); per warp-step (32 rows x 64 columns, 4 KB of
 * weights) 48 MMAs (2 tiles x 2 n8 tiles x 12; ~82 clocks at 1.7 each per SM, against the
 * ~250 the SM's share of HBM takes for 4 KB) and 12 shared-memory reads of 16 bytes a lane
 * (~48 clocks).  So the products should run near the weights' byte rate, plus the second
 * launch and the L2 traffic; at 32 tokens the MMAs double (~165 clocks) and 4-warp blocks
 * (registers: 3 an SM) hide less.
 */
#include "kernels/skinny.h"
#include "kernels/dense.h"
#include "kernels/gpu.h"

#include "kernels/gemm_split.cuh"
#include "kernels/mma.cuh"
#include "kernels/mx_bf16.h"
#include "kernels/skinny_map.h"

#include <stdlib.h>
#include <string.h>

#define SK_WARPS       8u          /* warps a block at most */
#define SK_STAGE_BYTES 49152u      /* x parts a block stages: 48 KiB (no opt-in needed) */
#define SK_PART_FLOATS (1u << 21)  /* the splits' partial sums: 8 MiB */
#define SK_SMALL_2 (1024u * 2304u)  /* two tokens by at most this many weights: not here */

static int sk_version = -1;   /* 0 (off), 1 or 2; -1: not read from the environment yet */
static unsigned sk_per_sm;    /* blocks aimed at per SM; 0: the kernel's occupancy */

extern "C" int kl_gpu_skinny_version(void)
{
    if (sk_version < 0) {
        const char *v = getenv("KL_GPU_SKINNY");
        /* version 1 by default: on the H200 (session 12) it matches or beats version 2 on
         * every shape of the model and the per-token kernels from 3 tokens up */
        sk_version = v && (!strcmp(v, "v2") || !strcmp(v, "2")) ? 2
                     : v && (!strcmp(v, "0") || !strcmp(v, "off")) ? 0
                                                                    : 1;
    }
    return sk_version;
}

extern "C" void kl_gpu_skinny_version_set(int version)
{
    sk_version = version == 0 || version == 2 ? version : 1;
}

extern "C" void kl_gpu_skinny_blocks_set(unsigned per_sm)
{
    sk_per_sm = per_sm;
}

/* The shape and alignment the kernel needs. */
static int sk_fits(const kl_gpu_mat *w, const float *x, uint32_t n)
{
    if (n < 2 || n > KL_GPU_SKINNY_MAX_N || w->rows == 0 || w->cols == 0 ||
        w->cols % KL_SK_GRAN || (uintptr_t)x % 16)
        return 0;
    if (w->kind == KL_GPU_W_BF16)
        return w->data && (uintptr_t)w->data % 16 == 0;
    return w->kind == KL_GPU_W_MXFP4 && w->packed && w->scale && (uintptr_t)w->packed % 16 == 0 &&
           (uintptr_t)w->scale % 4 == 0;
}

extern "C" int kl_gpu_skinny_takes(const kl_gpu_mat *w, const float *x, uint32_t n)
{
#if defined(__HIP_PLATFORM_AMD__)
    return 0 && w && x && n;
#else
    /* two tokens by a small matrix: the per-token kernels launch and finish sooner (H200:
     * 1024 x 2304 BF16 in 5.0 µs against 6.6 in a graph; from 2304 x 2304 or 3 tokens up,
     * the skinny kernel is as fast or faster) */
    if (w && n == 2 && (uint64_t)w->rows * w->cols <= SK_SMALL_2)
        return 0;
    return w && x && kl_gpu_skinny_version() && sk_fits(w, x, n);
#endif
}

#if !defined(__HIP_PLATFORM_AMD__)

static __device__ float sk_part[SK_PART_FLOATS];

/* NT n8 tiles: TOK tokens staged, STAGE columns a stage (3 bf16 parts each), in UNITS units. */
template <int NT> struct sk {
    enum : unsigned {
        TOK = 8 * NT,
        STAGE = SK_STAGE_BYTES / (6 * TOK),
        UNITS = STAGE / KL_SK_UNIT,
    };
};

/* x [n, cols] columns [k0, k0 + kn) as the three bf16 parts of the map's staged pieces (tokens
 * n .. TOK - 1 as zeros), every thread of the block. */
template <int MX, int NT>
__device__ static void sk_stage(const float *x, uint32_t n, uint32_t cols, uint32_t k0,
                                uint32_t kn, uint4 *xs)
{
    typedef sk<NT> S;
    const uint32_t pieces = kn / KL_SK_UNIT * S::TOK * 4;
    const uint32_t part = 8 * kl_sk_stage_at(1, 0, 0, 0, S::UNITS, S::TOK); /* bf16 a part */
    for (uint32_t u = threadIdx.x; u < pieces; u += blockDim.x) {
        const uint32_t t = u % 4, tok = u / 4 % S::TOK, U = u / (4 * S::TOK);
        float4 v0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v1 = v0;
        if (tok < n) {
            const float *p = x + (size_t)tok * cols + k0 + kl_sk_col(MX, U, t);
            v0 = *(const float4 *)p;
            v1 = *(const float4 *)(p + 4);
        }
        const uint32_t at = 8 * kl_sk_stage_at(0, U, tok, t, S::UNITS, S::TOK);
        kl_gt_stage_x4<1>(v0, (uint16_t *)xs, part, at);
        kl_gt_stage_x4<1>(v1, (uint16_t *)xs, part, at + 4);
    }
}

/* The weights a lane multiplies in one step of U units, as loaded: BF16 [m16 tile][row g,
 * g + 8][unit] 16-byte pieces; MXFP4 (U = 4: a granule) [tile][row] the codes of the lane's
 * scale block and the scale word of the granule's four blocks (byte t: the lane's). */
template <int MX, int U> struct sk_a;
template <int U> struct sk_a<0, U> {
    uint4 q[2][2][U];
};
template <> struct sk_a<1, 4> {
    uint4 q[2][2];
    uint32_t s[2][2];
};

/* Lane t's weights of the step at column k of the stored rows r[tile][half]. */
template <int U>
__device__ static inline void sk_load(sk_a<0, U> &a, const kl_gpu_mat &w,
                                      const size_t (&r)[2][2], uint32_t k, uint32_t t)
{
    const uint16_t *d = (const uint16_t *)w.data;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (uint32_t u = 0; u < U; u++)
                a.q[i][h][u] = *(const uint4 *)(d + r[i][h] * w.cols + k + kl_sk_col(0, u, t));
}

__device__ static inline void sk_load(sk_a<1, 4> &a, const kl_gpu_mat &w,
                                      const size_t (&r)[2][2], uint32_t k, uint32_t t)
{
    const uint32_t c = k + kl_sk_col(1, 0, t); /* the first column of the lane's block */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            a.q[i][h] = *(const uint4 *)(w.packed + r[i][h] * (w.cols / 2) + c / 2);
            a.s[i][h] = *(const uint32_t *)(w.scale + r[i][h] * (w.cols / KL_MXFP4_BLOCK) +
                                            k / KL_MXFP4_BLOCK);
        }
}

__device__ static inline void sk_words(const uint4 &v, uint32_t (&o)[4])
{
    o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
}

__device__ static inline uint32_t sk_word(const uint4 &v, uint32_t i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* MXFP4: the scale bytes of the lane's blocks and their tables (kernels/mx_bf16.h). */
struct sk_tabs {
    uint32_t  s[2][2];
    kl_mx_tab tab[2][2];
};

__device__ static inline void sk_tables(const sk_a<1, 4> &a, uint32_t t, sk_tabs &tb)
{
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            tb.s[i][h] = a.s[i][h] >> (8 * t) & 0xffu;
            tb.tab[i][h] = kl_mx_tab_make((uint8_t)tb.s[i][h]);
        }
}

/* Unit u's words of rows g (lo) and g + 8 (hi) of each m16 tile. */
template <int U>
__device__ static inline void sk_unit(const sk_a<0, U> &a, const sk_tabs *, uint32_t u,
                                      uint32_t (&lo)[2][4], uint32_t (&hi)[2][4])
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        sk_words(a.q[i][0][u], lo[i]);
        sk_words(a.q[i][1][u], hi[i]);
    }
}

__device__ static inline void sk_unit(const sk_a<1, 4> &a, const sk_tabs *tb, uint32_t u,
                                      uint32_t (&lo)[2][4], uint32_t (&hi)[2][4])
{
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t q = sk_word(a.q[i][h], u), s = tb->s[i][h];
            uint32_t *out = h ? hi[i] : lo[i];
            if (kl_mx_tab_ok((uint8_t)s))
                kl_mx_decode8(q, &tb->tab[i][h], out);
            else
                kl_mx_decode8_slow(q, (uint8_t)s, out);
        }
}

/* acc += the step's products: units U0 .. U0 + U - 1 of the stage, each part (hi, lo, lo2) of
 * x against the unit's weights, summed in fresh fragments first. */
template <int MX, int NT, int U>
__device__ static inline void sk_mul(float (&acc)[2][NT][4], const sk_a<MX, U> &a,
                                     const uint4 *xs, uint32_t U0, uint32_t g, uint32_t t)
{
    typedef sk<NT> S;
    float f[2][NT][4] = {};
    sk_tabs tb;
    if constexpr (MX)
        sk_tables(a, t, tb);
#pragma unroll
    for (uint32_t u = 0; u < U; u++) {
        uint32_t lo[2][4], hi[2][4];
        sk_unit(a, &tb, u, lo, hi);
#pragma unroll
        for (uint32_t p = 0; p < 3; p++) {
            uint32_t xw[NT][4];
#pragma unroll
            for (int j = 0; j < NT; j++)
                sk_words(xs[kl_sk_stage_at(p, U0 + u, 8 * j + g, t, S::UNITS, S::TOK)], xw[j]);
#pragma unroll
            for (uint32_t h = 0; h < 2; h++)
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        uint32_t af[4], bf[2];
                        kl_sk_frags(lo[i], hi[i], xw[j], h, af, bf);
                        mma16816(f[i][j], af, bf[0], bf[1]);
                    }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] += f[i][j][e];
}

/* Where element (tok, row) of the product goes in out (rows: the matrix's). */
__device__ static inline float *sk_dst(const kl_gpu_skinny_out &out, uint32_t tok, size_t row)
{
    float *y = out.y[0];
    uint32_t start = 0, len = out.end[0];
#pragma unroll
    for (uint32_t p = 1; p < KL_GPU_SKINNY_MAX_PARTS; p++)
        if (p < out.count && row >= out.end[p - 1]) {
            y = out.y[p];
            start = out.end[p - 1];
            len = out.end[p] - start;
        }
    return y + (size_t)tok * len + (row - start);
}

/* out, or split blockIdx.y's slice of sk_part ([n, rows]), = the block's sums over its
 * columns.
 * The first step's weights are loaded before the grid wait (gpu.h: KL_GPU_GRID_WAIT_LATER),
 * so in a graph with programmatic edges they are in flight while the previous kernel ends. */
template <int MX, int NT, int U>
__global__ static void __launch_bounds__(32 * SK_WARPS)
    skinny_kernel(kl_gpu_mat w, const float *x, uint32_t n, kl_gpu_skinny_out out,
                  uint32_t span)
{
    KL_GPU_GRID_WAIT_LATER();
    __shared__ uint4 xs[SK_STAGE_BYTES / 16];
    constexpr uint32_t STEP = U * KL_SK_UNIT, STAGE = sk<NT>::STAGE;
    const uint32_t lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const size_t row0 = ((size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 32;
    size_t r[2][2]; /* rows past the matrix read its last row; their sums are not stored */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const size_t ri = row0 + 16 * i + 8 * h + g;
            r[i][h] = ri < w.rows ? ri : w.rows - 1;
        }
    const uint32_t k_begin = blockIdx.y * span;
    const uint32_t k_end = w.cols - k_begin < span ? w.cols : k_begin + span;
    float acc[2][NT][4] = {};
    sk_a<MX, U> cur, nxt = {};
    sk_load(cur, w, r, k_begin, t); /* weights: written before the step's first kernel */
    KL_GPU_GRID_WAIT();
    for (uint32_t k = k_begin; k < k_end; k += STEP) {
        const uint32_t ko = (k - k_begin) % STAGE;
        if (ko == 0) { /* the same for the whole block */
            __syncthreads(); /* the last stage's reads are done */
            sk_stage<MX, NT>(x, n, w.cols, k, k_end - k < STAGE ? k_end - k : STAGE, xs);
            __syncthreads();
        }
        if (k + STEP < k_end)
            sk_load(nxt, w, r, k + STEP, t);
        sk_mul<MX, NT, U>(acc, cur, xs, ko / KL_SK_UNIT, g, t);
        cur = nxt;
    }
    float *part = gridDim.y > 1 ? sk_part + (size_t)blockIdx.y * n * w.rows : NULL;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (uint32_t e = 0; e < 4; e++) {
                const size_t row = row0 + 16 * i + kl_sk_c_row(g, e);
                const uint32_t tok = 8 * j + kl_sk_c_tok(t, e);
                if (row < w.rows && tok < n)
                    *(part ? part + (size_t)tok * w.rows + row : sk_dst(out, tok, row)) =
                        acc[i][j][e];
            }
}

/* Element i of the product [n, rows] (count = n x rows) into out: the splits' partial sums
 * added in split order. */
__global__ static void skinny_sum_kernel(uint32_t count, uint32_t splits, uint32_t rows,
                                         kl_gpu_skinny_out out)
{
    KL_GPU_GRID_WAIT();
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count)
        return;
    float s = 0.0f;
    for (uint32_t p = 0; p < splits; p++)
        s += sk_part[(size_t)p * count + i];
    *sk_dst(out, i / rows, i % rows) = s;
}

/* How a product is cut: warps a block, row tiles, K splits of span columns. */
struct sk_plan {
    uint32_t warps, tiles, splits, span;
};

/* Blocks of 8 warps (4 for 32 tokens, whose registers leave room for 8 warps an SM in blocks
 * of 8 but 12 in blocks of 4, and where 8 give fewer blocks than one wave even at one granule
 * a split), then K split into whole granules until the grid fills one wave of resident
 * blocks (res8, res4: blocks of 8 and 4 warps resident at once), the partial sums
 * permitting. */
static sk_plan sk_plan_for(uint32_t rows, uint32_t cols, uint32_t n, int nt4, uint32_t res8,
                           uint32_t res4)
{
    const uint64_t gran = cols / KL_SK_GRAN;
    sk_plan p;
    p.warps = SK_WARPS;
    if (nt4 || (rows + 32u * SK_WARPS - 1) / (32u * SK_WARPS) * gran < res8)
        p.warps = SK_WARPS / 2;
    const uint64_t target = p.warps == SK_WARPS ? res8 : res4;
    p.tiles = (rows + 32 * p.warps - 1) / (32 * p.warps);
    uint64_t want = target / p.tiles; /* at most one wave: a second would double the time */
    const uint64_t room = SK_PART_FLOATS / ((uint64_t)n * rows);
    want = want < gran ? want : gran;
    want = want < room ? want : room;
    want = want < 1 ? 1 : want;
    const uint64_t per = (gran + want - 1) / want; /* granules a split */
    p.splits = (uint32_t)((gran + per - 1) / per);
    p.span = (uint32_t)(per * KL_SK_GRAN);
    return p;
}

/* ---- launchers (tests/gpu/skinny_lanes.sh runs the code above on the CPU) ---------------- */

static int sk_sms; /* multiprocessors of the device; 0: not asked yet */

/* The multiprocessors of the device (asked once). */
static uint32_t sk_multiprocessors(void)
{
    if (!sk_sms) {
        int dev = 0, v = 0;
        const int ok = hipGetDevice(&dev) == hipSuccess &&
                       hipDeviceGetAttribute(&v, hipDeviceAttributeMultiprocessorCount, dev) ==
                           hipSuccess;
        sk_sms = ok && v > 0 ? v : 132;
    }
    return (uint32_t)sk_sms;
}

/* Blocks of skinny_kernel<MX, NT, U> of `warps` warps resident at once on the device: its
 * occupancy (asked once per kernel and size; sk_per_sm overrides it) times the SMs. */
template <int MX, int NT, int U> static uint32_t sk_resident(uint32_t warps)
{
    static int occ[2]; /* by warps 4, 8; 0: not asked yet */
    int &o = occ[warps == SK_WARPS];
    if (!o && (hipOccupancyMaxActiveBlocksPerMultiprocessor(&o, skinny_kernel<MX, NT, U>,
                                                            (int)(32 * warps), 0) != hipSuccess ||
               o < 1))
        o = 1;
    return (sk_per_sm ? sk_per_sm : (uint32_t)o) * sk_multiprocessors();
}

/* The product's kernel launches; its plan in *p. */
template <int MX, int NT, int U>
static void sk_launch(const kl_gpu_mat *w, const float *x, uint32_t n,
                      const kl_gpu_skinny_out &y, sk_plan *p, hipStream_t st)
{
    *p = sk_plan_for(w->rows, w->cols, n, NT == 4, sk_resident<MX, NT, U>(SK_WARPS),
                     sk_resident<MX, NT, U>(SK_WARPS / 2));
    skinny_kernel<MX, NT, U><<<dim3(p->tiles, p->splits), 32 * p->warps, 0, st>>>(*w, x, n, y,
                                                                              p->span);
}

template <int MX, int U>
static void sk_launch(const kl_gpu_mat *w, const float *x, uint32_t n,
                      const kl_gpu_skinny_out &y, sk_plan *p, hipStream_t st)
{
    if (n <= 8)
        sk_launch<MX, 1, U>(w, x, n, y, p, st);
    else if (n <= 16)
        sk_launch<MX, 2, U>(w, x, n, y, p, st);
    else
        sk_launch<MX, 4, U>(w, x, n, y, p, st);
}

#endif

/* Whether out is well formed for a matrix of `rows` rows. */
static int sk_out_ok(const kl_gpu_skinny_out *out, uint32_t rows)
{
    if (!out || out->count < 1 || out->count > KL_GPU_SKINNY_MAX_PARTS ||
        out->end[out->count - 1] != rows)
        return 0;
    for (uint32_t i = 0; i < out->count; i++)
        if (!out->y[i] || out->end[i] <= (i ? out->end[i - 1] : 0))
            return 0;
    return 1;
}

extern "C" int kl_gpu_skinny_parts(const kl_gpu_mat *w, const float *x, uint32_t n,
                                   const kl_gpu_skinny_out *out, kl_gpu_stream s, kl_err *err)
{
    if (!w || !x)
        return kl_fail(err, KL_E_USAGE, "skinny: w or x is NULL");
    if (!sk_out_ok(out, w->rows))
        return kl_fail(err, KL_E_USAGE, "skinny: the outputs must be 1 .. %u parts of rising "
                       "row ends up to the rows (%u), none NULL", KL_GPU_SKINNY_MAX_PARTS,
                       w->rows);
    if (!sk_fits(w, x, n))
        return kl_fail(err, KL_E_USAGE,
                       "skinny: needs 2 <= n <= %u (n is %u), BF16 or MXFP4 weights of whole "
                       "128-column granules (cols %u) and aligned payloads and x",
                       KL_GPU_SKINNY_MAX_N, n, w->cols);
#if defined(__HIP_PLATFORM_AMD__)
    return kl_fail(err, KL_E_USAGE, "skinny: no kernel on HIP (kl_gpu_skinny_takes is 0)");
#else
    hipStream_t st = (hipStream_t)s;
    sk_plan p;
    if (w->kind == KL_GPU_W_MXFP4)
        sk_launch<1, 4>(w, x, n, *out, &p, st);
    else if (kl_gpu_skinny_version() == 2)
        sk_launch<0, 4>(w, x, n, *out, &p, st);
    else
        sk_launch<0, 2>(w, x, n, *out, &p, st);
    int rc = KL_GPU_CHECK(err, hipGetLastError());
    if (rc || p.splits == 1)
        return rc;
    const uint32_t count = n * w->rows;
    skinny_sum_kernel<<<(count + 255) / 256, 256, 0, st>>>(count, p.splits, w->rows, *out);
    return KL_GPU_CHECK(err, hipGetLastError());
#endif
}

extern "C" int kl_gpu_skinny(const kl_gpu_mat *w, const float *x, uint32_t n, float *y,
                             kl_gpu_stream s, kl_err *err)
{
    if (!w || !x || !y)
        return kl_fail(err, KL_E_USAGE, "skinny: w, x or y is NULL");
#if defined(__HIP_PLATFORM_AMD__)
    if (sk_fits(w, x, n))
        return kl_gpu_matmul(w, x, n, y, s, err); /* the SIMT kernels (no skinny path on HIP) */
#endif
    kl_gpu_skinny_out out;
    memset(&out, 0, sizeof out);
    out.count = 1;
    out.end[0] = w->rows;
    out.y[0] = y;
    return kl_gpu_skinny_parts(w, x, n, &out, s, err);
}
