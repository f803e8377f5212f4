/*
 * kernels/mla.cu — MLA between the projections: cache append, and attention in latent space
 * (see mla.h; the CPU reference: engine/forward.c, mla_chunk / mla_attend_group).
 *
 * kl_gpu_mla_attend runs four kernels, fp32 throughout:
 *   absorb   ql[t][h] = W_kb,hᵀ q_nope[t][h]                 thread per (h, latent column)
 *   attend   flash-decoding: token t's span is cut into splits of whole tiles of TILE rows;
 *            one block per (split, token) reads each cache row once for all heads (the
 *            queries of every head [nh][R+dr] sit in shared memory), keeps per head a
 *            running max, sum and unnormalised context, and writes them as the split's
 *            partial result
 *   combine  ctx[t][h] = Σ_s e^(m_s − M) ctx_s / Σ_s e^(m_s − M) l_s   block per (h, t)
 *   vb       o[t][h] = W_vb,h ctx[t][h]                       a lane group per output row
 * Scratch (floats): ql [n][nh][R+dr] (v1 uses [n][nh][R] of it), ctx [n][nh][R], then per
 * (token, split, head) the max, the sum and the context [R].
 *
 * v2 (KL_GPU_MLA=v2; KL_GPU_MLA=v1 or kl_gpu_mla_select(1) runs the round-1 kernels above; v2
 * needs nh <= 32 and R <= 512, else v1 runs) keeps the four steps and changes how each works:
 *   absorb2  a block per (64 columns, head, 4 tokens), each thread 4 rows x 16 bytes of W_kb,h
 *            loaded before the first product (the whole block's 16 KiB in flight); writes the
 *            full queries [latent, rope] so attend2 copies them in float4
 *   attend2  (head groups for launches of few blocks: attend2_groups) splits cut from the
 *            token's real span (split_rows2: tiles per split from
 *            tok_pos, at least 2), so a launch sized for a cache's capacity still spreads a
 *            short span; scores and contexts tiled in registers: a thread holds 4 heads x 4
 *            rows of scores over a slice of the columns (8 float4 loads for 64 FMA, slices
 *            summed by shuffles) and 4 heads x 16 columns of context (5 float4 loads for 64
 *            FMA), against 3 loads for 8 FMA and 2 for 4 in v1; rows strided 8 mod 32 words;
 *            the softmax by 8 threads per head
 *   combine2 a block per (head, 128 columns, token), 8 groups of splits with float4 loads
 *   vb2      a block per (16 rows of W_vb,h, head, 4 tokens), every row load in flight first,
 *            the contexts staged in shared memory
 *
 * v3 (the default where it fits; KL_GPU_MLA=v3fast, v2 or v1 selects the others) runs
 * absorb2, combine2 and vb2 around attend3s: the scores and contexts on tensor cores (fp32
 * accumulate), a block per (split, run, 32 / nh tokens of the run): 32 query rows (token,
 * head) against tiles of 32 cache rows, causal, online softmax in fp32 (see attend3_body).
 * Its operands (queries, cache rows, weights) are split into hi = bf16(x), lo = bf16(x - hi),
 * each product hi hi + hi lo + lo hi (exact to ~1e-5), and the next tile is loaded while the
 * current one is computed.  v3fast (attend3_kernel) multiplies the bf16 values once (~1e-2).
 * Runs of one token over spans < V3_MIN_SPAN run v2 (v3's fixed costs outweigh its gain).
 *
 * v4 (the default for decode: every run one token; KL_GPU_MLA=v3 selects v3 for it too;
 * chunks of a prompt run v3) keeps absorb2, combine2 and vb2 around attend4: a block per
 * (split, token), 1 per SM (191 KiB of shared memory, ~230 registers), its 32 query rows (the
 * token's heads) against tiles of 32 cache rows, exact as v3 (hi + lo operands, three
 * products) on mma.sync.m16n8k16 with known fragment layouts:
 *   - the queries stay in registers, split once: group w holds 16-column steps [s0, s0 + ns)
 *     (<= 5 of the 36) of all 32 rows, so each key element is read from shared memory once
 *     per tile, by one group, for both 16-row blocks;
 *   - the tiles are streamed by cp.async into two fp32 stages (the next in flight while the
 *     current is computed; rows past the span zero-filled), and split into bf16 hi + lo in
 *     registers as fragments are loaded (no bf16 staging pass);
 *   - scores: each group's steps summed in fresh fragments (Hopper's MMA accumulation
 *     truncates), the 8 groups' partials added in fp32 in fixed order by the softmax (fp32,
 *     online, as v3); context: each tile's P V in fresh fragments, then o = alpha o + P V in
 *     fp32 registers (group w: columns 8 (w + 8 i), all 32 rows: 64 registers);
 *   - conflict-free shared loads: row stride 8 mod 32 words; P V's 16-key steps take the keys
 *     in the order pv_key, so a lane's 4 keys of a value column lie 8 banks apart.
 * Work per tile at the full shape: 864 + 768 MMAs of 16x8x16 (6.7 MFLOP; 13.7 GFLOP at span
 * 65536: ~21 us at ~660 TFLOP/s over 132 SMs), shared memory ~313 KB (cp.async 74 KB, key
 * and value fragment loads 74 + 66 KB, score partials 2 x 32 KB, weights 36 KB: ~20 us at 16
 * tiles per SM), against 36 us for the 151 MB of cache at 4.2 TB/s: each below the bytes.
 * Splits: one wave of blocks (1 per multiprocessor over the tokens), >= 2 tiles each, cut on
 * the device from the token's real span (a graph's launch is sized for the capacity).
 *
 * MHA form (the default for the prefill of one prompt, see mla.h; KL_GPU_MLA_PREFILL=latent
 * keeps v3): the run's latent rows copied out [span][R] (mha_rows_kernel), expanded by
 * kl_gpu_gemm_p into keys and values [span][nh (dn + dv)] fp32, then mha_kernel: a block of 4
 * groups per (64 query tokens, head), the longest tiles first and a head's tiles together (its
 * keys and values, 8 MB at 8K, stay in L2); each group's 16 queries (dn + dr = 192 columns)
 * split once into hi + lo A fragments in registers (96); key tiles of 32 rows ([k_nope from
 * the expansion, k_rope from the cache row], [32][200] fp32) and value tiles ([32][132]) stream
 * by cp.async into two stages (85 KiB: 2 blocks per SM, 250 registers, no spills) and are
 * split as fragments are loaded; scores: each 16-column step's hi hi + hi lo + lo hi in a fresh
 * fragment, added in fp32 (Hopper's MMA accumulation truncates); online softmax per group in
 * fp32 (rows: 4 lanes, shuffles), its weights P kept in registers as P V's A fragments (the
 * C layout of the scores is the A layout of P); P V per 16-key step in fresh fragments, added
 * to o = alpha o in fp32 registers (64).  Conflict-free shared loads: key rows 8 mod 32
 * words, value rows 4 mod 32.
 * Prediction (H200, 8K prompt in one chunk, a layer): per (block, tile) 960 MMAs of 16x8x16
 * (3.9 MFLOP: ~1,450 clocks at ~2/3 of the 4,096 bf16 FLOP per clock per SM of wgmma) and
 * ~1,600 shared wavefronts (fragment loads 1,280, cp.async 320); 528K (block, tile) pairs
 * (32 heads x 128 query tiles x 64 key tiles on average + the diagonal): 1,600-2,500 clocks
 * each over 132 SMs = 3.6-5.7 ms, L2 reads 21.6 GB (~2.5 ms, overlapped); the expansion
 * (206 GFLOP with the three-part split, ~280 TFLOP/s as kl_gpu_gemm_p reaches) ~0.75 ms:
 * ~4.5-6.5 ms against attend3s's ~40 ms.  To be measured on the H200 (tests/gpu/test_mla.cu).
 * Measured: 5.2 ms at a 4K prompt (32 useful TFLOPS; ALU-bound: every group split each K and
 * V operand from fp32).  v2 (the default; KL_GPU_MLA_MHA=v1 keeps mha_kernel): the keys and
 * values split once into bf16 hi + lo planes (mha_planes_kernel), mha2_kernel stages bf16
 * tiles and loads fragments by ldmatrix, 128 query tokens a block; see its section.
 * Prediction at a 4K prompt: 127M MMAs (519 GFLOP issued), 21.6 GB of ldmatrix reads, 2.9 GB
 * staged from L2: ~1.5 ms at ~55% of mma.sync's peak, ~2.0 ms with the expansion.
 */
#include "kernels/gpu.h"
#include "kernels/bulk.cuh"
#include "kernels/gemm.h"
#include "kernels/mla.h"
#include "kernels/mma.cuh"
#include "kernels/runtime.h" /* kl_gpu_sm_count */
#include "kernels/tokens.h"

#include <stdlib.h>
#include <string.h>

#define VEC           8      /* kv_b columns per 16-byte load (BF16; F32: two loads) */
#define ABS_COLS      16     /* absorb: threads across the columns, VEC each */
#define ABS_ROWS      16     /* absorb: threads across the rows of W_kb,h */
#define ABS_TOKENS    4      /* tokens per absorb block */
#define ATT_THREADS   256
#define TILE          16     /* cache rows staged in shared memory at a time */
#define ROW_PAIRS     (TILE / 2) /* a score item: 2 rows x 1 head */
#define CTX_ITEMS     16     /* float4 context accumulators per attend thread */
#define MAX_SPLITS    256    /* splits of one token's span at most (2 blocks per SM fill 128) */
#define SPLIT_TILES   4      /* tiles per split at least (each block loads all the queries) */
#define VB_GROUPS     8      /* output rows per vb block */
#define VB_TOKENS     4      /* tokens per vb group */
#define MAX_SHARED    (200u << 10)  /* attend's shared memory at most (bytes) */
/* v2 (KL_GPU_MLA=v2; KL_GPU_MLA=v1 selects round 1's kernels above) */
#define SPLIT_TILES2  2      /* tiles per split at least */
#define A2_COLS       64     /* absorb2: columns per block (8 column groups of VEC) */
#define A2_RG         32     /* absorb2: row groups */
#define A2_LD         4      /* absorb2: rows (16-byte loads) per thread in flight */
#define A2_TOK        4      /* absorb2: tokens per block */
#define V2_ROWS       16     /* vb2: output rows per block (2 per group of 32 lanes) */
#define V2_LD         2      /* vb2: 16-byte loads per lane and row (R <= 2 * 32 * VEC) */
#define V2_TOK        4      /* vb2: tokens per block */
#define H2_MAX        32     /* v2: heads at most (4 per thread: group w has heads w + 8 i) */
#define R2_MAX        512    /* v2: latent width at most (4 float4 per lane) */
#define C2_THREADS    256    /* combine2: 8 split groups x 32 float4 columns */
#define C2_COLS       128    /* combine2: context columns per block */

/* Elements idx .. idx+VEC of kv_b as fp32 into w (F32 or BF16, the kind checked by the
 * launcher; idx a multiple of VEC, so the loads are 16-byte aligned).  The descriptor travels
 * by value: a.kv_b points at host memory. */
__device__ static inline void weights8(const kl_gpu_mat &m, size_t idx, float w[VEC])
{
    if (m.kind == KL_GPU_W_BF16) {
        const uint4 u = *(const uint4 *)((const uint16_t *)m.data + idx);
        const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[2 * k] = __uint_as_float(p[k] << 16);
            w[2 * k + 1] = __uint_as_float(p[k] & 0xffff0000u);
        }
        return;
    }
    const float4 a = *(const float4 *)((const float *)m.data + idx);
    const float4 b = *(const float4 *)((const float *)m.data + idx + 4);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

/* ------------------------------------------------------------------------------------------ */
/* Append                                                                                     */

/* grid n, a block of APPEND_THREADS per token: row tok_pos of the slot's cache =
 * [RMSNorm(c), k_r].  Each thread loads its (at most APPEND_ITEMS) elements of c and their
 * norm weights at once (one wait for memory), the groups' sums added in shared memory in
 * order.  (Round 1 was one lane group walking the row: 8.8 us a decode step's append in
 * session 16's trace, a wait for memory per element.) */
#define APPEND_THREADS 128
#define APPEND_ITEMS   8   /* R <= APPEND_THREADS * APPEND_ITEMS (kl_gpu_mla_append checks) */
__global__ static void __launch_bounds__(APPEND_THREADS)
    append_kernel(kl_gpu_mla_append_args a, const uint32_t *tok_slot, const uint32_t *tok_pos)
{
    KL_GPU_GRID_WAIT();
    __shared__ float red[APPEND_THREADS / KL_GPU_GROUP];
    const uint32_t t = blockIdx.x, R = a.d.R, cw = a.d.R + a.d.dr;
    const float *x = a.kva + (size_t)t * cw;
    float *row = a.cache[tok_slot[t]] + (size_t)tok_pos[t] * cw;
    float v[APPEND_ITEMS], g[APPEND_ITEMS], ss = 0.0f;
#pragma unroll
    for (int i = 0; i < APPEND_ITEMS; i++) {
        const uint32_t k = threadIdx.x + i * APPEND_THREADS;
        v[i] = k < R ? x[k] : 0.0f;
        g[i] = k < R ? a.kv_norm[k] : 0.0f;
    }
    for (uint32_t k = R + threadIdx.x; k < cw; k += APPEND_THREADS)
        row[k] = x[k];
#pragma unroll
    for (int i = 0; i < APPEND_ITEMS; i++)
        ss += v[i] * v[i];
    ss = kl_gpu_group_sum(ss);
    if (threadIdx.x % KL_GPU_GROUP == 0)
        red[threadIdx.x / KL_GPU_GROUP] = ss;
    __syncthreads();
    ss = 0.0f;
    for (int w = 0; w < APPEND_THREADS / KL_GPU_GROUP; w++)
        ss += red[w];
    const float inv = 1.0f / sqrtf(ss / (float)R + 1e-6f);
#pragma unroll
    for (int i = 0; i < APPEND_ITEMS; i++) {
        const uint32_t k = threadIdx.x + i * APPEND_THREADS;
        if (k < R)
            row[k] = g[i] * (v[i] * inv);
    }
}

static int check_dims(const char *who, const kl_gpu_mla_dims *d, kl_err *err)
{
    if (d->nh == 0 || d->dn == 0 || d->dv == 0 || d->R == 0 || d->R % VEC || d->dr % 4 ||
        (size_t)d->nh * d->R > (size_t)4 * ATT_THREADS * CTX_ITEMS || d->nh > 65535)
        return kl_fail(err, KL_E_USAGE, "%s: nh %u, dn %u, dr %u, dv %u, R %u (need R a multiple "
                       "of %d, dr of 4, nh * R <= %d)", who, d->nh, d->dn, d->dr, d->dv, d->R,
                       VEC, 4 * ATT_THREADS * CTX_ITEMS);
    return 0;
}

extern "C" int kl_gpu_mla_append(const kl_gpu_mla_append_args *a, const kl_gpu_tokens *t,
                                 kl_gpu_stream s, kl_err *err)
{
    if (!a || !a->kva || !a->kv_norm || !a->cache)
        return kl_fail(err, KL_E_USAGE, "mla append: a pointer is NULL");
    if (check_dims("mla append", &a->d, err) || kl_gpu_tokens_check("mla append", t, 1, err))
        return err->code;
    if (a->d.R > APPEND_THREADS * APPEND_ITEMS)
        return kl_fail(err, KL_E_USAGE, "mla append: R %u > %d", a->d.R,
                       APPEND_THREADS * APPEND_ITEMS);
    if (t->n == 0)
        return 0;
    append_kernel<<<t->n, APPEND_THREADS, 0, (hipStream_t)s>>>(*a, t->tok_slot, t->tok_pos);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ------------------------------------------------------------------------------------------ */
/* Attend                                                                                     */

/* How a launch cuts spans: splits of `rows` rows (whole tiles), at most `n` per token. */
typedef struct split_plan {
    uint32_t n, rows;
} split_plan;

/* Splits of a span of max_span rows at most: one per `tiles` tiles, 1 .. MAX_SPLITS. */
static uint32_t splits_bound(uint32_t max_span, uint32_t tiles)
{
    uint64_t n = ((uint64_t)max_span + TILE * tiles - 1) / (TILE * tiles);
    return n == 0 ? 1 : n < MAX_SPLITS ? (uint32_t)n : MAX_SPLITS;
}

/* max_span >= 1: splits of whole tiles, as few tiles each as keeps them within the bound. */
static split_plan plan_splits(uint32_t max_span)
{
    const uint64_t tiles = ((uint64_t)max_span + TILE - 1) / TILE;
    const uint64_t b = splits_bound(max_span, SPLIT_TILES);
    split_plan p;
    p.rows = (uint32_t)(TILE * ((tiles + b - 1) / b));
    p.n = (uint32_t)(((uint64_t)max_span + p.rows - 1) / p.rows); /* <= b: the scratch holds them */
    return p;
}

/* Where each part of the scratch lies for n tokens and a split plan. */
typedef struct mla_scratch {
    float *ql, *ctx;   /* ql: v1 [n][nh][R], v2 [n][nh][R+dr] (room for the larger); ctx
                          [n][nh][R] */
    float *pc;         /* [n][splits][nh][R] partial context (16-byte aligned: R % 4 == 0) */
    float *pm, *pl;    /* [n][splits][nh] partial max, sum */
    uint32_t *rp;      /* v3: [n] rows per split of each token's block (combine2 reads it) */
} mla_scratch;

static mla_scratch carve(float *p, const kl_gpu_mla_dims *d, uint32_t n, uint32_t splits)
{
    const size_t q = (size_t)n * d->nh * (d->R + d->dr), c = (size_t)n * d->nh * d->R;
    const size_t part = (size_t)n * splits * d->nh, o = q + c;
    mla_scratch s = {p, p + q, p + o, p + o + part * d->R, p + o + part * (d->R + 1),
                     (uint32_t *)(p + o + part * (d->R + 2))};
    return s;
}

/* Splits of each of `blocks` query blocks: one per `tiles` tiles of the longest span, at most
 * MAX_SPLITS, and fewer when the blocks already give 2 * MAX_SPLITS (less scratch). */
static uint32_t splits_for(uint32_t blocks, uint32_t max_span, uint32_t tiles)
{
    const uint32_t b = splits_bound(max_span, tiles);
    const uint32_t cap = blocks >= 2 * MAX_SPLITS ? 1 : 2 * MAX_SPLITS / blocks;
    return b < cap ? b : cap;
}

/* v2's splits per token (a block per token) */
static uint32_t splits2(uint32_t n, uint32_t max_span)
{
    return splits_for(n, max_span, SPLIT_TILES2);
}

static int version_for(const kl_gpu_mla_dims *d);
static bool mha_applies(const kl_gpu_mla_dims *d, uint32_t n, uint32_t max_span);
static size_t mha_floats(const kl_gpu_mla_dims *d, uint32_t span, struct mha_scratch *s,
                         float *p);

/* The partial contexts take most of it: v1 splits every token's span by its length alone, the
 * later versions by the launch's blocks (splits2 bounds v2, v3 and v4: one split per token at
 * n >= 2 MAX_SPLITS), so only a v1 run pays for n x v1's splits (34 GB at 4,096 tokens over
 * 8K spans). */
extern "C" size_t kl_gpu_mla_scratch(const kl_gpu_mla_dims *d, uint32_t n, uint32_t max_span)
{
    const size_t v1 = splits_bound(max_span, SPLIT_TILES), v2 = n ? splits2(n, max_span) : 1;
    const size_t splits = version_for(d) == 1 && v1 > v2 ? v1 : v2;
    const size_t latent = (size_t)n * d->nh * (2 * (size_t)d->R + d->dr + splits * (d->R + 2)) + n;
    const size_t mha = mha_applies(d, n, max_span) ? mha_floats(d, max_span, NULL, NULL) : 0;
    return latent > mha ? latent : mha;
}

/* grid (R / (ABS_COLS * VEC), nh, token groups): columns of head h's absorbed queries.  Thread
 * (row group rg, column group cg) sums rows i = rg, rg + ABS_ROWS, .. of W_kb,h over its VEC
 * columns; the row groups' sums are added in shared memory in order. */
__global__ static void __launch_bounds__(ABS_COLS * ABS_ROWS)
absorb_kernel(kl_gpu_mla_attend_args a, kl_gpu_mat kv_b, uint32_t n, float *ql)
{
    KL_GPU_GRID_WAIT();
    __shared__ float part[ABS_ROWS][ABS_TOKENS][ABS_COLS * VEC];
    const kl_gpu_mla_dims d = a.d;
    const uint32_t cg = threadIdx.x % ABS_COLS, rg = threadIdx.x / ABS_COLS, h = blockIdx.y;
    const uint32_t c0 = blockIdx.x * ABS_COLS * VEC, c = c0 + cg * VEC;
    const uint32_t t0 = blockIdx.z * ABS_TOKENS, qw = d.dn + d.dr;
    float acc[ABS_TOKENS][VEC];
#pragma unroll
    for (int k = 0; k < ABS_TOKENS; k++)
#pragma unroll
        for (int e = 0; e < VEC; e++)
            acc[k][e] = 0.0f;
    for (uint32_t i = rg; c < d.R && i < d.dn; i += ABS_ROWS) {
        float w[VEC];
        weights8(kv_b, ((size_t)h * (d.dn + d.dv) + i) * d.R + c, w);
#pragma unroll
        for (int k = 0; k < ABS_TOKENS; k++) {
            const float q = t0 + k < n ? a.q[((size_t)(t0 + k) * d.nh + h) * qw + i] : 0.0f;
#pragma unroll
            for (int e = 0; e < VEC; e++)
                acc[k][e] += q * w[e];
        }
    }
#pragma unroll
    for (int k = 0; k < ABS_TOKENS; k++)
#pragma unroll
        for (int e = 0; e < VEC; e++)
            part[rg][k][cg * VEC + e] = acc[k][e];
    __syncthreads();
    for (uint32_t x = threadIdx.x; x < ABS_TOKENS * ABS_COLS * VEC; x += blockDim.x) {
        const uint32_t k = x / (ABS_COLS * VEC), col = x % (ABS_COLS * VEC);
        if (t0 + k >= n || c0 + col >= d.R)
            continue;
        float v = 0.0f;
        for (int g = 0; g < ABS_ROWS; g++)
            v += part[g][k][col];
        ql[((size_t)(t0 + k) * d.nh + h) * d.R + c0 + col] = v;
    }
}

/* Shared memory of attend: row stride of the queries, padded to 4 mod 32 words so that the
 * float4 loads of 8 consecutive heads fall in distinct banks. */
__host__ __device__ static inline uint32_t query_stride(uint32_t cw)
{
    return (cw + 31) / 32 * 32 + 4;
}

static size_t attend_shared(const kl_gpu_mla_dims *d)
{
    const size_t cw = d->R + d->dr;
    return ((size_t)d->nh * query_stride((uint32_t)cw) + TILE * cw + TILE * d->nh + 3 * d->nh) *
           sizeof(float);
}

/* Arguments of attend beyond the launcher's. */
typedef struct attend_ctx {
    const uint32_t *tok_slot, *tok_pos;
    mla_scratch     sc;
    uint32_t        split_rows;
    float           scale;   /* 1 / sqrt(dn + dr) */
} attend_ctx;

/* Block: the token's queries of every head into qs [nh][query_stride], latent then rope. */
__device__ static void load_queries(const kl_gpu_mla_attend_args &a, const attend_ctx &x,
                                    uint32_t t, float *qs)
{
    const kl_gpu_mla_dims d = a.d;
    const uint32_t cw = d.R + d.dr, qp = query_stride(cw), qw = d.dn + d.dr;
    for (uint32_t e = threadIdx.x; e < d.nh * cw; e += blockDim.x) {
        const uint32_t h = e / cw, k = e % cw;
        qs[h * qp + k] = k < d.R ? x.sc.ql[((size_t)t * d.nh + h) * d.R + k]
                                 : a.q[((size_t)t * d.nh + h) * qw + d.dn + (k - d.R)];
    }
}

/* Block: scores of rows [0, nr) of the tile against every head into ps [TILE][nh] (rows past
 * nr: -inf).  Item e: head e % nh, rows 2 (e / nh) and the next. */
__device__ static void tile_scores(const kl_gpu_mla_dims &d, const attend_ctx &x,
                                   const float *qs, const float *rows, uint32_t nr, float *ps)
{
    const uint32_t cw = d.R + d.dr, qp = query_stride(cw);
    for (uint32_t e = threadIdx.x; e < ROW_PAIRS * d.nh; e += blockDim.x) {
        const uint32_t h = e % d.nh, r = 2 * (e / d.nh);
        const float4 *q4 = (const float4 *)(qs + h * qp);
        const float4 *c0 = (const float4 *)(rows + r * cw);
        const float4 *c1 = (const float4 *)(rows + (r + 1) * cw);
        float s0 = 0.0f, s1 = 0.0f;
        for (uint32_t k = 0; k < cw / 4; k++) {
            const float4 q = q4[k], u = c0[k], v = c1[k];
            s0 += q.x * u.x + q.y * u.y + q.z * u.z + q.w * u.w;
            s1 += q.x * v.x + q.y * v.y + q.z * v.z + q.w * v.w;
        }
        ps[r * d.nh + h] = r < nr ? s0 * x.scale : -INFINITY;
        ps[(r + 1) * d.nh + h] = r + 1 < nr ? s1 * x.scale : -INFINITY;
    }
}

/* Block: per head, the running max mx and sum sm take in the tile's scores; ps becomes the
 * tile's weights e^(s − max) (0 past nr), alpha the factor the old context is scaled by. */
__device__ static void tile_softmax(uint32_t nh, uint32_t nr, float *ps, float *mx, float *sm,
                                    float *alpha)
{
    for (uint32_t h = threadIdx.x; h < nh; h += blockDim.x) {
        float m = mx[h];
        for (uint32_t r = 0; r < nr; r++)
            m = fmaxf(m, ps[r * nh + h]);
        const float al = expf(mx[h] - m); /* 0 on the first tile (mx = -inf, m finite) */
        float l = sm[h] * al;
        for (uint32_t r = 0; r < TILE; r++) {
            const float p = r < nr ? expf(ps[r * nh + h] - m) : 0.0f;
            ps[r * nh + h] = p;
            l += p;
        }
        mx[h] = m;
        sm[h] = l;
        alpha[h] = al;
    }
}

/* grid (splits, n): split blockIdx.x of token blockIdx.y's span, every head.  Two blocks per
 * SM (at the full shape: 111 KiB of shared memory and at most 128 registers each), so one
 * block's loads overlap the other's arithmetic. */
__global__ static void __launch_bounds__(ATT_THREADS, 2)
attend_kernel(kl_gpu_mla_attend_args a, attend_ctx x)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ float4 shared4[];
    const kl_gpu_mla_dims d = a.d;
    const uint32_t t = blockIdx.y, split = blockIdx.x, nh = d.nh, cw = d.R + d.dr;
    const uint32_t span = x.tok_pos[t] + 1, u_begin = split * x.split_rows;
    const uint32_t u_end = span < u_begin + x.split_rows ? span : u_begin + x.split_rows;
    const size_t part = (size_t)t * gridDim.x + split; /* this block's partial result */
    if (u_begin >= span) { /* an empty split of a shorter span: combine skips it */
        for (uint32_t h = threadIdx.x; h < nh; h += blockDim.x) {
            x.sc.pm[part * nh + h] = -INFINITY;
            x.sc.pl[part * nh + h] = 0.0f;
        }
        return;
    }
    float *qs = (float *)shared4, *rows = qs + (size_t)nh * query_stride(cw);
    float *ps = rows + TILE * cw, *mx = ps + TILE * nh, *sm = mx + nh, *alpha = sm + nh;
    load_queries(a, x, t, qs);
    for (uint32_t h = threadIdx.x; h < nh; h += blockDim.x) {
        mx[h] = -INFINITY;
        sm[h] = 0.0f;
    }
    const uint32_t rq = d.R / 4, items = nh * rq;
    float4 acc[CTX_ITEMS];
#pragma unroll
    for (int k = 0; k < CTX_ITEMS; k++)
        acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 *cache = (const float4 *)a.cache[x.tok_slot[t]]; /* rows of cw / 4 float4 */
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (uint32_t u0 = u_begin; u0 < u_end; u0 += TILE) {
        const uint32_t nr = u_end - u0 < TILE ? u_end - u0 : TILE;
#pragma unroll 3
        for (uint32_t e = threadIdx.x; e < TILE * cw / 4; e += blockDim.x) /* past nr: 0 */
            ((float4 *)rows)[e] = e < nr * cw / 4 ? cache[(size_t)u0 * (cw / 4) + e] : zero;
        __syncthreads();
        tile_scores(d, x, qs, rows, nr, ps);
        __syncthreads();
        tile_softmax(nh, nr, ps, mx, sm, alpha);
        __syncthreads();
        const float4 *rows4 = (const float4 *)rows;
#pragma unroll
        for (int k = 0; k < CTX_ITEMS; k++) {
            const uint32_t i = threadIdx.x + k * ATT_THREADS, h = i / rq, j4 = i % rq;
            if (i >= items)
                continue;
            float4 c = acc[k];
            const float al = alpha[h];
            c.x *= al, c.y *= al, c.z *= al, c.w *= al;
            for (uint32_t r = 0; r < nr; r++) {
                const float p = ps[r * nh + h];
                const float4 v = rows4[r * (cw / 4) + j4];
                c.x += p * v.x, c.y += p * v.y, c.z += p * v.z, c.w += p * v.w;
            }
            acc[k] = c;
        }
        __syncthreads(); /* rows and ps are rewritten by the next tile */
    }
    for (uint32_t h = threadIdx.x; h < nh; h += blockDim.x) {
        x.sc.pm[part * nh + h] = mx[h];
        x.sc.pl[part * nh + h] = sm[h];
    }
#pragma unroll
    for (int k = 0; k < CTX_ITEMS; k++) {
        const uint32_t i = threadIdx.x + k * ATT_THREADS;
        if (i < items)
            ((float4 *)(x.sc.pc + (part * nh + i / rq) * d.R))[i % rq] = acc[k];
    }
}

/* grid (nh, n): head blockIdx.x of token blockIdx.y, its splits' partial results combined */
__global__ static void combine_kernel(kl_gpu_mla_dims d, attend_ctx x, uint32_t splits)
{
    KL_GPU_GRID_WAIT();
    __shared__ float w[MAX_SPLITS];
    const uint32_t h = blockIdx.x, t = blockIdx.y, span = x.tok_pos[t] + 1;
    uint32_t ns = (span + x.split_rows - 1) / x.split_rows;
    ns = ns < splits ? ns : splits;
    const size_t p0 = (size_t)t * splits;
    float m = -INFINITY;
    for (uint32_t s = 0; s < ns; s++)
        m = fmaxf(m, x.sc.pm[(p0 + s) * d.nh + h]);
    for (uint32_t s = threadIdx.x; s < ns; s += blockDim.x)
        w[s] = expf(x.sc.pm[(p0 + s) * d.nh + h] - m);
    __syncthreads();
    float den = 0.0f;
    for (uint32_t s = 0; s < ns; s++)
        den += w[s] * x.sc.pl[(p0 + s) * d.nh + h];
    for (uint32_t j = threadIdx.x; j < d.R; j += blockDim.x) {
        float v = 0.0f;
        for (uint32_t s = 0; s < ns; s++)
            v += w[s] * x.sc.pc[((p0 + s) * d.nh + h) * d.R + j];
        x.sc.ctx[((size_t)t * d.nh + h) * d.R + j] = v / den;
    }
}

/* grid (nh * dv / VB_GROUPS, token groups): o[t][h*dv + i] = W_vb,h row i · ctx[t][h], a lane
 * group per row, VEC columns per lane and step */
__global__ static void vb_kernel(kl_gpu_mla_attend_args a, kl_gpu_mat kv_b, uint32_t n,
                                 const float *ctx)
{
    KL_GPU_GRID_WAIT();
    const kl_gpu_mla_dims d = a.d;
    const uint32_t row = blockIdx.x * VB_GROUPS + threadIdx.x / KL_GPU_GROUP;
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, t0 = blockIdx.y * VB_TOKENS;
    if (row >= d.nh * d.dv) /* the whole group leaves together */
        return;
    const uint32_t h = row / d.dv, i = row % d.dv;
    const size_t w0 = ((size_t)h * (d.dn + d.dv) + d.dn + i) * d.R;
    float acc[VB_TOKENS];
#pragma unroll
    for (int k = 0; k < VB_TOKENS; k++)
        acc[k] = 0.0f;
    for (uint32_t j = lane * VEC; j < d.R; j += KL_GPU_GROUP * VEC) {
        float w[VEC];
        weights8(kv_b, w0 + j, w);
#pragma unroll
        for (int k = 0; k < VB_TOKENS; k++) {
            if (t0 + k >= n)
                continue;
            const float4 *c = (const float4 *)(ctx + ((size_t)(t0 + k) * d.nh + h) * d.R + j);
            const float4 u = c[0], v = c[1];
            acc[k] += w[0] * u.x + w[1] * u.y + w[2] * u.z + w[3] * u.w +
                      w[4] * v.x + w[5] * v.y + w[6] * v.z + w[7] * v.w;
        }
    }
#pragma unroll
    for (int k = 0; k < VB_TOKENS; k++) {
        const float v = kl_gpu_group_sum(acc[k]);
        if (lane == 0 && t0 + k < n)
            a.o[(size_t)(t0 + k) * d.nh * d.dv + row] = v;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Attend, v2: the same four steps with every product's loads in flight at once and the      */
/* attention tiled in registers (see the header of this file)                                 */

/* grid (R / A2_COLS, nh, token groups): head h's queries qf[t][h] = [W_kb,hᵀ q_nope, q_rope].
 * Thread (row group rg, column group cg) holds A2_LD rows of VEC columns in registers, all
 * loaded before the first product; the row groups' sums are added in shared memory in order. */
__global__ static void __launch_bounds__(A2_RG * A2_COLS / VEC)
absorb2_kernel(kl_gpu_mla_attend_args a, kl_gpu_mat kv_b, uint32_t n, float *qf)
{
    KL_GPU_GRID_WAIT();
    __shared__ float qs[A2_TOK][A2_RG * A2_LD];
    __shared__ float part[A2_RG][A2_TOK][A2_COLS];
    const kl_gpu_mla_dims d = a.d;
    const uint32_t cg = threadIdx.x % (A2_COLS / VEC), rg = threadIdx.x / (A2_COLS / VEC);
    const uint32_t h = blockIdx.y, c0 = blockIdx.x * A2_COLS, c = c0 + cg * VEC;
    const uint32_t t0 = blockIdx.z * A2_TOK, qw = d.dn + d.dr, cw = d.R + d.dr;
    float acc[A2_TOK][VEC] = {};
    for (uint32_t i0 = 0; i0 < d.dn; i0 += A2_RG * A2_LD) {
        float w[A2_LD][VEC];
#pragma unroll
        for (int l = 0; l < A2_LD; l++) {
            const uint32_t i = i0 + rg + A2_RG * l;
            if (c < d.R && i < d.dn)
                weights8(kv_b, ((size_t)h * (d.dn + d.dv) + i) * d.R + c, w[l]);
            else
                for (int e = 0; e < VEC; e++)
                    w[l][e] = 0.0f;
        }
        __syncthreads(); /* the last rows' queries are used */
        for (uint32_t e = threadIdx.x; e < A2_TOK * A2_RG * A2_LD; e += blockDim.x) {
            const uint32_t k = e / (A2_RG * A2_LD), i = e % (A2_RG * A2_LD);
            qs[k][i] = t0 + k < n && i0 + i < d.dn
                           ? a.q[((size_t)(t0 + k) * d.nh + h) * qw + i0 + i] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int l = 0; l < A2_LD; l++)
#pragma unroll
            for (int k = 0; k < A2_TOK; k++)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    acc[k][e] += qs[k][rg + A2_RG * l] * w[l][e];
    }
#pragma unroll
    for (int k = 0; k < A2_TOK; k++)
#pragma unroll
        for (int e = 0; e < VEC; e++)
            part[rg][k][cg * VEC + e] = acc[k][e];
    __syncthreads();
    for (uint32_t x = threadIdx.x; x < A2_TOK * A2_COLS; x += blockDim.x) {
        const uint32_t k = x / A2_COLS, col = x % A2_COLS;
        if (t0 + k >= n || c0 + col >= d.R)
            continue;
        float v = 0.0f;
        for (int g = 0; g < A2_RG; g++)
            v += part[g][k][col];
        qf[((size_t)(t0 + k) * d.nh + h) * cw + c0 + col] = v;
    }
    for (uint32_t x = threadIdx.x; blockIdx.x == 0 && x < A2_TOK * d.dr; x += blockDim.x) {
        const uint32_t k = x / d.dr, j = x % d.dr;
        if (t0 + k < n)
            qf[((size_t)(t0 + k) * d.nh + h) * cw + d.R + j] =
                a.q[((size_t)(t0 + k) * d.nh + h) * qw + d.dn + j];
    }
}

/* Row stride (floats) of attend2's queries and cache rows in shared memory: 8 mod 32 words,
 * so that the 8 lanes of a 16-byte load phase (4 rows x 2 adjacent float4) hit distinct
 * banks. */
__host__ __device__ static inline uint32_t stride2(uint32_t cw)
{
    return (cw + 31) / 32 * 32 + 8;
}

static size_t attend2_shared(const kl_gpu_mla_dims *d)
{
    const size_t st = stride2(d->R + d->dr);
    return ((size_t)d->nh * st + TILE * st + TILE * H2_MAX + 3 * H2_MAX) * sizeof(float);
}

/* Rows of each split when a span of `span` rows is cut into `splits` at most: whole tiles,
 * at least SPLIT_TILES2, as few as keep within the bound (the token's real span sets it, so
 * a launch sized for a cache's capacity still spreads a short span over the splits). */
__device__ static inline uint32_t split_rows(uint32_t span, uint32_t splits, uint32_t tile,
                                             uint32_t min_tiles)
{
    const uint32_t tiles = (span + tile - 1) / tile, per = (tiles + splits - 1) / splits;
    return tile * (per > min_tiles ? per : min_tiles);
}

__device__ static inline uint32_t split_rows2(uint32_t span, uint32_t splits)
{
    return split_rows(span, splits, TILE, SPLIT_TILES2);
}

/* Block: scores of the tile's rows (TILE = 16) against every head into ps [TILE][H2_MAX]
 * (head h in column h % 8 * 4 + h / 8; rows past nr -inf).  Group w (of 32 lanes), lane l:
 * heads w + 8 i, rows l % 4 + 4 j (i, j < 4), float4 columns l / 4 + 8 k: 8 loads of 16 bytes
 * for 64 multiply-adds; the 8 column slices are summed by shuffles. */
__device__ static inline void scores2(const kl_gpu_mla_dims &d, float scale, const float *qs,
                                      const float *rows, uint32_t nr, float *ps)
{
    const uint32_t c4 = (d.R + d.dr) / 4, s4 = stride2(d.R + d.dr) / 4;
    const uint32_t w = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    const uint32_t rl = lane % 4, ks = lane / 4;
    const float4 *q4 = (const float4 *)qs, *c = (const float4 *)rows;
    float s[4][4] = {}; /* [head i][row j] */
    for (uint32_t k = ks; k < c4; k += 8) {
        float4 cv[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            cv[j] = c[(rl + 4 * j) * s4 + k];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (w + 8 * i >= d.nh) /* the same for the whole group */
                continue;
            const float4 q = q4[(w + 8 * i) * s4 + k];
#pragma unroll
            for (int j = 0; j < 4; j++)
                s[i][j] += q.x * cv[j].x + q.y * cv[j].y + q.z * cv[j].z + q.w * cv[j].w;
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            for (int o = 4; o < KL_GPU_GROUP; o *= 2)
                s[i][j] += kl_gpu_shfl_xor(s[i][j], o);
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t r = rl + 4 * j;
            if (ks == 0 && w + 8 * i < d.nh)
                ps[r * H2_MAX + w * 4 + i] = r < nr ? s[i][j] * scale : -INFINITY;
        }
}

/* Block: as tile_softmax, for ps [TILE][H2_MAX] in scores2's head order: 8 threads per head
 * (2 rows each), max and sum over them by shuffles. */
__device__ static inline void softmax2(uint32_t nh, uint32_t nr, float *ps, float *mx, float *sm,
                                       float *alpha)
{
    static_assert(ATT_THREADS == 8 * H2_MAX && TILE == 16, "8 threads per head, 2 rows each");
    const uint32_t h = threadIdx.x / 8, q = threadIdx.x % 8;
    const bool on = h < nh; /* the lanes of absent heads still take part in the shuffles */
    float *p0 = ps + h % 8 * 4 + h / 8;
    const float m_old = on ? mx[h] : 0.0f;
    const float s0 = on && q < nr ? p0[q * H2_MAX] : -INFINITY;
    const float s1 = on && q + 8 < nr ? p0[(q + 8) * H2_MAX] : -INFINITY;
    float m = fmaxf(m_old, fmaxf(s0, s1));
    for (int o = 4; o > 0; o /= 2)
        m = fmaxf(m, kl_gpu_shfl_xor(m, o));
    const float e0 = q < nr ? expf(s0 - m) : 0.0f, e1 = q + 8 < nr ? expf(s1 - m) : 0.0f;
    float l = e0 + e1;
    for (int o = 4; o > 0; o /= 2)
        l += kl_gpu_shfl_xor(l, o);
    if (!on)
        return;
    p0[q * H2_MAX] = e0;
    p0[(q + 8) * H2_MAX] = e1;
    if (q == 0) { /* every lane of the head read mx[h] before the shuffles */
        const float al = expf(m_old - m); /* 0 on the first tile (m_old = -inf, m finite) */
        mx[h] = m;
        sm[h] = sm[h] * al + l;
        alpha[h] = al;
    }
}

/* Block: the context accumulators take in the tile's nr rows.  Group w, lane l: heads w + 8 i,
 * float4 columns l + 32 m (i, m < 4): per row one 16-byte load of the 4 heads' weights and 4
 * of the row for 64 multiply-adds. */
__device__ static inline void context2(const kl_gpu_mla_dims &d, uint32_t nr, const float *rows,
                                       const float *ps, const float *alpha, float4 (&acc)[4][4])
{
    const uint32_t s4 = stride2(d.R + d.dr) / 4, r4 = d.R / 4;
    const uint32_t w = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    const float4 *c = (const float4 *)rows, *p4 = (const float4 *)ps;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float al = w + 8 * i < d.nh ? alpha[w + 8 * i] : 0.0f;
#pragma unroll
        for (int m = 0; m < 4; m++)
            acc[i][m].x *= al, acc[i][m].y *= al, acc[i][m].z *= al, acc[i][m].w *= al;
    }
    for (uint32_t r = 0; r < nr; r++) {
        const float4 p = p4[r * (H2_MAX / 4) + w];
        const float pv[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (int m = 0; m < 4; m++) {
            if (lane + 32 * m >= r4)
                continue;
            const float4 v = c[r * s4 + lane + 32 * m];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float4 &a = acc[i][m];
                a.x += pv[i] * v.x, a.y += pv[i] * v.y, a.z += pv[i] * v.z, a.w += pv[i] * v.w;
            }
        }
    }
}

/* grid (splits, n, head groups): split blockIdx.x of token blockIdx.y's span (split_rows2),
 * heads [h0, h0 + nh) of group blockIdx.z, from the queries qf [n][nh][R+dr]; an empty split
 * writes nothing (combine2 counts the splits the same way).  Two blocks per SM (112 KiB of
 * shared memory at the full shape).  Head groups spread a short span's few splits over more
 * blocks (attend2_groups); each group reads the span's rows itself. */
__global__ static void __launch_bounds__(ATT_THREADS, 2)
attend2_kernel(kl_gpu_mla_attend_args a, attend_ctx x)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ float4 shared4[];
    const uint32_t all_nh = a.d.nh, per_group = (all_nh + gridDim.z - 1) / gridDim.z;
    const uint32_t h0 = blockIdx.z * per_group;
    if (h0 >= all_nh)
        return;
    kl_gpu_mla_dims d = a.d; /* this group's heads */
    d.nh = all_nh - h0 < per_group ? all_nh - h0 : per_group;
    const uint32_t t = blockIdx.y, split = blockIdx.x, nh = d.nh, cw = d.R + d.dr;
    const uint32_t span = x.tok_pos[t] + 1, rows_per = split_rows2(span, gridDim.x);
    const uint32_t u_begin = split * rows_per;
    if (u_begin >= span)
        return;
    const uint32_t u_end = span - u_begin < rows_per ? span : u_begin + rows_per;
    const uint32_t c4 = cw / 4, s4 = stride2(cw) / 4;
    const uint32_t w = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    float4 *qs = shared4, *rows = qs + (size_t)nh * s4;
    float *ps = (float *)(rows + TILE * s4), *mx = ps + TILE * H2_MAX, *sm = mx + H2_MAX;
    float *alpha = sm + H2_MAX;
    const float4 *qf = (const float4 *)(x.sc.ql + ((size_t)t * all_nh + h0) * cw);
#pragma unroll 4
    for (uint32_t e = threadIdx.x; e < nh * c4; e += blockDim.x)
        qs[e / c4 * s4 + e % c4] = qf[e];
    for (uint32_t h = threadIdx.x; h < nh; h += blockDim.x) {
        mx[h] = -INFINITY;
        sm[h] = 0.0f;
    }
    float4 acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int m = 0; m < 4; m++)
            acc[i][m] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 *cache = (const float4 *)a.cache[x.tok_slot[t]]; /* rows of c4 float4 */
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (uint32_t u0 = u_begin; u0 < u_end; u0 += TILE) {
        const uint32_t nr = u_end - u0 < TILE ? u_end - u0 : TILE;
#pragma unroll 3
        for (uint32_t e = threadIdx.x; e < TILE * c4; e += blockDim.x) /* past nr: 0 */
            rows[e / c4 * s4 + e % c4] = e < nr * c4 ? cache[(size_t)u0 * c4 + e] : zero;
        __syncthreads();
        scores2(d, x.scale, (const float *)qs, (const float *)rows, nr, ps);
        __syncthreads();
        softmax2(nh, nr, ps, mx, sm, alpha);
        __syncthreads();
        context2(d, nr, (const float *)rows, ps, alpha, acc);
        __syncthreads(); /* rows and ps are rewritten by the next tile */
    }
    const size_t part = (size_t)t * gridDim.x + split; /* this block's partial result */
    for (uint32_t h = threadIdx.x; h < nh; h += blockDim.x) {
        x.sc.pm[part * all_nh + h0 + h] = mx[h];
        x.sc.pl[part * all_nh + h0 + h] = sm[h];
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int m = 0; m < 4; m++)
            if (w + 8 * i < nh && lane + 32 * m < d.R / 4)
                ((float4 *)(x.sc.pc + (part * all_nh + h0 + w + 8 * i) * d.R))[lane + 32 * m] =
                    acc[i][m];
}

/* Head groups of attend2: 4 (a quarter of the heads a block) when the launch's blocks are few
 * enough that 4x as many still fit in one wave (decode over a short span: a block per split,
 * each doing every head's work in turn, 31 us at spans of 1-96 in session 16's trace), else 1.
 * Environment KL_GPU_MLA_HEAD_GROUPS=1 keeps one (to compare). */
static uint32_t attend2_groups(uint32_t blocks)
{
    static int groups; /* 0: not read yet */
    if (!groups) {
        const char *e = getenv("KL_GPU_MLA_HEAD_GROUPS");
        groups = e && atoi(e) >= 1 && atoi(e) <= 32 ? atoi(e) : 4;
    }
    return blocks * groups <= 128 ? (uint32_t)groups : 1;
}

/* v over the block (max or sum), returned to every thread; red: a float per group of 32. */
__device__ static float block_reduce(float v, bool max, float *red)
{
    for (int o = KL_GPU_GROUP / 2; o > 0; o /= 2) {
        const float u = kl_gpu_shfl_xor(v, o);
        v = max ? fmaxf(v, u) : v + u;
    }
    __syncthreads(); /* red's last readers are done */
    if (threadIdx.x % KL_GPU_GROUP == 0)
        red[threadIdx.x / KL_GPU_GROUP] = v;
    __syncthreads();
    v = red[0];
    for (uint32_t g = 1; g < blockDim.x / KL_GPU_GROUP; g++)
        v = max ? fmaxf(v, red[g]) : v + red[g];
    return v;
}

/* grid (nh, R / C2_COLS, n): head blockIdx.x, context columns blockIdx.y of token blockIdx.z,
 * its non-empty splits combined (v3: rows per split as attend3 wrote them in rp, else
 * split_rows2).  Thread (split group g, float4 column f) sums splits g, g + 8, ..; the 8
 * groups' sums are added in shared memory in order. */
__global__ static void __launch_bounds__(C2_THREADS)
combine2_kernel(kl_gpu_mla_dims d, attend_ctx x, uint32_t splits, bool v3)
{
    KL_GPU_GRID_WAIT();
    __shared__ float wt[MAX_SPLITS], red[C2_THREADS / KL_GPU_GROUP];
    __shared__ float4 part[C2_THREADS * 4 / C2_COLS][C2_COLS / 4];
    const uint32_t h = blockIdx.x, t = blockIdx.z, span = x.tok_pos[t] + 1;
    const uint32_t rows_per = v3 ? x.sc.rp[t] : split_rows2(span, splits);
    const uint32_t ns = (span + rows_per - 1) / rows_per;
    const size_t p0 = (size_t)t * splits;
    float m = -INFINITY, den = 0.0f;
    for (uint32_t s = threadIdx.x; s < ns; s += blockDim.x)
        m = fmaxf(m, x.sc.pm[(p0 + s) * d.nh + h]);
    m = block_reduce(m, true, red);
    for (uint32_t s = threadIdx.x; s < ns; s += blockDim.x) {
        wt[s] = expf(x.sc.pm[(p0 + s) * d.nh + h] - m);
        den += wt[s] * x.sc.pl[(p0 + s) * d.nh + h];
    }
    den = block_reduce(den, false, red); /* its barriers also publish wt */
    const uint32_t f = threadIdx.x % (C2_COLS / 4), g = threadIdx.x / (C2_COLS / 4);
    const uint32_t j = blockIdx.y * C2_COLS + 4 * f;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (uint32_t s = g; j < d.R && s < ns; s += C2_THREADS * 4 / C2_COLS) {
        const float4 c = *(const float4 *)(x.sc.pc + ((p0 + s) * d.nh + h) * d.R + j);
        v.x += wt[s] * c.x, v.y += wt[s] * c.y, v.z += wt[s] * c.z, v.w += wt[s] * c.w;
    }
    part[g][f] = v;
    __syncthreads();
    if (g || j >= d.R)
        return;
    for (uint32_t k = 1; k < C2_THREADS * 4 / C2_COLS; k++)
        v.x += part[k][f].x, v.y += part[k][f].y, v.z += part[k][f].z, v.w += part[k][f].w;
    v.x /= den, v.y /= den, v.z /= den, v.w /= den;
    *(float4 *)(x.sc.ctx + ((size_t)t * d.nh + h) * d.R + j) = v;
}

/* grid (dv / V2_ROWS, nh, token groups): o[t][h*dv + i] = W_vb,h row i · ctx[t][h]; a group of
 * 32 lanes per 2 rows, every load of the rows in flight before the first use, the tokens'
 * contexts staged in shared memory. */
__global__ static void __launch_bounds__(V2_ROWS / 2 * KL_GPU_GROUP)
vb2_kernel(kl_gpu_mla_attend_args a, kl_gpu_mat kv_b, uint32_t n, const float *ctx)
{
    KL_GPU_GRID_WAIT();
    __shared__ float4 cs[V2_TOK][R2_MAX / 4];
    const kl_gpu_mla_dims d = a.d;
    const uint32_t h = blockIdx.y, t0 = blockIdx.z * V2_TOK, lane = threadIdx.x % KL_GPU_GROUP;
    const uint32_t i0 = blockIdx.x * V2_ROWS + threadIdx.x / KL_GPU_GROUP * 2, r4 = d.R / 4;
    float w[2][V2_LD][VEC];
#pragma unroll
    for (int rr = 0; rr < 2; rr++)
#pragma unroll
        for (int l = 0; l < V2_LD; l++) {
            const uint32_t j = (lane + KL_GPU_GROUP * l) * VEC;
            if (i0 + rr < d.dv && j < d.R)
                weights8(kv_b, ((size_t)h * (d.dn + d.dv) + d.dn + i0 + rr) * d.R + j, w[rr][l]);
            else
                for (int e = 0; e < VEC; e++)
                    w[rr][l][e] = 0.0f;
        }
    for (uint32_t e = threadIdx.x; e < V2_TOK * r4; e += blockDim.x) {
        const uint32_t k = e / r4, j4 = e % r4;
        cs[k][j4] = t0 + k < n ? ((const float4 *)(ctx + ((size_t)(t0 + k) * d.nh + h) * d.R))[j4]
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    __syncthreads();
    for (uint32_t k = 0; k < V2_TOK && t0 + k < n; k++) { /* the same for the whole block */
        float acc[2] = {0.0f, 0.0f};
#pragma unroll
        for (int l = 0; l < V2_LD; l++) {
            const uint32_t j4 = (lane + KL_GPU_GROUP * l) * (VEC / 4);
            if (j4 >= r4)
                continue;
            const float4 u = cs[k][j4], v = cs[k][j4 + 1];
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const float *x = w[rr][l];
                acc[rr] += x[0] * u.x + x[1] * u.y + x[2] * u.z + x[3] * u.w +
                           x[4] * v.x + x[5] * v.y + x[6] * v.z + x[7] * v.w;
            }
        }
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const float v = kl_gpu_group_sum(acc[rr]);
            if (lane == 0 && i0 + rr < d.dv)
                a.o[(size_t)(t0 + k) * d.nh * d.dv + (size_t)h * d.dv + i0 + rr] = v;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Attend, v3: the scores and the context on tensor cores (bf16 in, fp32 accumulate)          */

#define T3_ROWS      32     /* query rows (token, head) per block */
#define T3_KEYS      32     /* cache rows per tile */
#define T3_THREADS   256    /* 8 groups of 32 lanes */
#define T3_FRAGS     8      /* context fragments of 16 x 16 per group: R / 16 / 4 at most */
#define T3_SLD       (T3_KEYS + 4)  /* row stride of the scores (floats) */
#define T3_PLD       (T3_KEYS + 8)  /* row stride of the weights (bf16) */
#define T3_LOADS     6      /* 16-byte loads in flight per thread while a tile is staged */
#define T3_MIN_TILES 2      /* tiles per split at least */
#define V3_MIN_SPAN  512    /* decode (runs of 1 token) over shorter spans runs v2 */
#define T3_PF        20     /* split form: float4 of the next tile per thread in registers */

#if !defined(__HIPCC__)
#include <cuda_bf16.h>
#include <mma.h>
/* A 16 x 16 fp32 accumulator tile of a group of 32 lanes; which element lies where is read
 * from tables (frag_map), so the code after the products does not depend on the layout. */
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc16;
#else
/* The SIMT stand-in: lane l holds row l / 2, columns (l % 2) * 8 + e. */
struct acc16 {
    enum { num_elements = 8 };
    float x[8];
};
#endif

/* bf16 bits of f, rounded to nearest even (finite inputs), and back */
__device__ static inline uint32_t bf16_bits(float f)
{
    const uint32_t u = __float_as_uint(f);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

__device__ static inline float bf16_val(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

/* 4 bf16 at dst (8-byte aligned) */
__device__ static inline void put_bf16x4(uint16_t *dst, float4 v)
{
    *(uint2 *)dst = make_uint2(bf16_bits(v.x) | bf16_bits(v.y) << 16,
                               bf16_bits(v.z) | bf16_bits(v.w) << 16);
}

/* Row stride (bf16) of the queries and the cache rows in shared memory: the width rounded up
 * to 16 (zeros past cw), plus 8 (rows 4 words apart mod 32). */
__host__ __device__ static inline uint32_t ld3(uint32_t cw)
{
    return (cw + 15) / 16 * 16 + 8;
}

/* 4 values split as hi = bf16(v), lo = bf16(v - hi) at hi and lo (8-byte aligned) */
__device__ static inline void put_split4(uint16_t *hi, uint16_t *lo, float4 v)
{
    const uint32_t h[4] = {bf16_bits(v.x), bf16_bits(v.y), bf16_bits(v.z), bf16_bits(v.w)};
    const float4 r = make_float4(v.x - bf16_val((uint16_t)h[0]), v.y - bf16_val((uint16_t)h[1]),
                                 v.z - bf16_val((uint16_t)h[2]), v.w - bf16_val((uint16_t)h[3]));
    *(uint2 *)hi = make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
    put_bf16x4(lo, r);
}

/* v3's operands in shared memory: split (S) keeps a lo copy of each (queries, cache rows,
 * weights) right after its hi one: lo = hi + 32 ld (T3_ROWS = T3_KEYS = 32) or + 32 T3_PLD. */
static_assert(T3_ROWS == 32 && T3_KEYS == 32, "the lo copies lie 32 rows after the hi ones");

static size_t attend3_shared(const kl_gpu_mla_dims *d, bool split)
{
    const size_t copies = split ? 2 : 1;
    return copies * (T3_ROWS + T3_KEYS) * ld3(d->R + d->dr) * 2 + 2 * T3_ROWS * T3_SLD * 4 +
           copies * T3_ROWS * T3_PLD * 2 + 4 * T3_ROWS * 4;
}

/* Row and column of element e of an accumulator tile: bits 4 e .. 4 e + 3 of r and c. */
struct fmap {
    uint32_t r, c;
};
static_assert(acc16::num_elements <= 8, "8 elements of 4 bits in a word");

__device__ static inline uint32_t frow(const fmap &m, int e)
{
    return m.r >> 4 * e & 15u;
}

__device__ static inline uint32_t fcol(const fmap &m, int e)
{
    return m.c >> 4 * e & 15u;
}

__device__ static inline void acc_zero(acc16 &c)
{
#pragma unroll
    for (int e = 0; e < acc16::num_elements; e++)
        c.x[e] = 0.0f;
}

#if !defined(__HIPCC__)
namespace wm = nvcuda::wmma;
typedef wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> a16;

/* Block: tables of the row and of the column of each element of a 16 x 16 tile in tab (rows
 * 0..15 and 16..31 of stride T3_SLD), for frag_map after a barrier. */
__device__ static inline void frag_tables(float *tab)
{
    for (uint32_t e = threadIdx.x; e < 256; e += blockDim.x) {
        tab[e / 16 * T3_SLD + e % 16] = (float)(e / 16);
        tab[(16 + e / 16) * T3_SLD + e % 16] = (float)(e % 16);
    }
}

/* Group: the row and the column of each element of an accumulator tile, read from tab. */
__device__ static inline fmap frag_map(const float *tab)
{
    acc16 rid, cid;
    wm::load_matrix_sync(rid, tab, T3_SLD, wm::mem_row_major);
    wm::load_matrix_sync(cid, tab + 16 * T3_SLD, T3_SLD, wm::mem_row_major);
    fmap m = {0, 0};
#pragma unroll
    for (int e = 0; e < acc16::num_elements; e++) {
        m.r |= (uint32_t)rid.x[e] << 4 * e;
        m.c |= (uint32_t)cid.x[e] << 4 * e;
    }
    return m;
}

/* Group: c += Q K^T over 16 * steps columns; q: 16 query rows, k: 16 cache rows, stride ld;
 * S: also the lo copies 32 ld further, c += Qhi Khi + Qhi Klo + Qlo Khi. */
template <bool S>
__device__ static inline void mma_qk(acc16 &c, const uint16_t *q, const uint16_t *k, uint32_t ld,
                                     uint32_t steps)
{
    const __nv_bfloat16 *qb = (const __nv_bfloat16 *)q, *kb = (const __nv_bfloat16 *)k;
    acc16 x; /* S: the lo products apart (two chains of dependent products, not one) */
    acc_zero(x);
    for (uint32_t s = 0; s < steps; s++) {
        a16 A;
        wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major> B;
        wm::load_matrix_sync(A, qb + 16 * s, ld);
        wm::load_matrix_sync(B, kb + 16 * s, ld);
        wm::mma_sync(c, A, B, c);
        if (S) {
            a16 Al;
            wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major> Bl;
            wm::load_matrix_sync(Al, qb + 32 * ld + 16 * s, ld);
            wm::load_matrix_sync(Bl, kb + 32 * ld + 16 * s, ld);
            wm::mma_sync(x, A, Bl, x);
            wm::mma_sync(x, Al, B, x);
        }
    }
#pragma unroll
    for (int e = 0; S && e < acc16::num_elements; e++)
        c.x[e] += x.x[e];
}

/* Group: o[i] += P V for the context columns 16 f, f = cg + 4 i < nf; p: 16 rows of weights
 * [T3_KEYS] (stride T3_PLD), v: the tile's rows (stride ld); S: also the lo copies (32 T3_PLD
 * and 32 ld further), o[i] += Phi Vhi + Phi Vlo + Plo Vhi. */
template <bool S>
__device__ static inline void mma_pv(acc16 (&o)[T3_FRAGS], const uint16_t *p, const uint16_t *v,
                                     uint32_t ld, uint32_t cg, uint32_t nf)
{
    typedef wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::row_major> b16;
    const __nv_bfloat16 *pb = (const __nv_bfloat16 *)p, *vb = (const __nv_bfloat16 *)v;
#pragma unroll 1 /* fewer registers: 2 steps, the B tiles of one in flight */
    for (int kk = 0; kk < T3_KEYS / 16; kk++) {
        a16 A, Al;
        wm::load_matrix_sync(A, pb + 16 * kk, T3_PLD);
        if (S)
            wm::load_matrix_sync(Al, pb + 32 * T3_PLD + 16 * kk, T3_PLD);
#pragma unroll
        for (int i = 0; i < T3_FRAGS; i++) {
            const uint32_t f = cg + 4 * i;
            if (f >= nf) /* the same for the whole group */
                continue;
            const __nv_bfloat16 *src = vb + (size_t)16 * kk * ld + 16 * f;
            b16 B;
            wm::load_matrix_sync(B, src, ld);
            wm::mma_sync(o[i], A, B, o[i]);
            if (S) {
                b16 Bl;
                wm::load_matrix_sync(Bl, src + (size_t)32 * ld, ld);
                wm::mma_sync(o[i], A, Bl, o[i]);
                wm::mma_sync(o[i], Al, B, o[i]);
            }
        }
    }
}
#else
__device__ static inline void frag_tables(float *) {}

__device__ static inline fmap frag_map(const float *)
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP;
    fmap m = {0, 0};
    for (int e = 0; e < 8; e++) {
        m.r |= lane / 2 << 4 * e;
        m.c |= (lane % 2 * 8 + e) << 4 * e;
    }
    return m;
}

/* a b of the operands at a and b; S: ahi bhi + ahi blo + alo bhi, the lo copies la and lb
 * elements further */
template <bool S>
__device__ static inline float prod3(const uint16_t *a, const uint16_t *b, size_t la, size_t lb)
{
    const float ah = bf16_val(*a), bh = bf16_val(*b);
    return S ? ah * bh + ah * bf16_val(b[lb]) + bf16_val(a[la]) * bh : ah * bh;
}

template <bool S>
__device__ static inline void mma_qk(acc16 &c, const uint16_t *q, const uint16_t *k, uint32_t ld,
                                     uint32_t steps)
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, r = lane / 2, c0 = lane % 2 * 8;
    for (int e = 0; e < 8; e++) {
        float v = 0.0f;
        for (uint32_t j = 0; j < 16 * steps; j++)
            v += prod3<S>(q + r * ld + j, k + (c0 + e) * ld + j, 32 * ld, 32 * ld);
        c.x[e] += v;
    }
}

template <bool S>
__device__ static inline void mma_pv(acc16 (&o)[T3_FRAGS], const uint16_t *p, const uint16_t *v,
                                     uint32_t ld, uint32_t cg, uint32_t nf)
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, r = lane / 2, c0 = lane % 2 * 8;
    for (int i = 0; i < T3_FRAGS; i++) {
        const uint32_t f = cg + 4 * i;
        for (int e = 0; f < nf && e < 8; e++)
            for (uint32_t j = 0; j < T3_KEYS; j++)
                o[i].x[e] += prod3<S>(p + r * T3_PLD + j, v + j * ld + 16 * f + c0 + e,
                                      32 * T3_PLD, (size_t)32 * ld);
    }
}
#endif

/* Block: rows [0, nk) of a tile from src (rows of c4 float4) into ks as bf16 [T3_KEYS][ld];
 * rows past nk and columns past 4 c4 zero.  T3_LOADS loads per thread in flight at a time. */
__device__ static inline void load_tile3(const float4 *src, uint32_t nk, uint32_t c4, uint32_t ld,
                                         uint16_t *ks)
{
    const uint32_t l4 = ld / 4, total = T3_KEYS * l4;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (uint32_t b = threadIdx.x; b < total; b += T3_LOADS * T3_THREADS) {
        float4 v[T3_LOADS];
#pragma unroll
        for (int i = 0; i < T3_LOADS; i++) {
            const uint32_t e = b + i * T3_THREADS, r = e / l4, k4 = e % l4;
            v[i] = e < total && r < nk && k4 < c4 ? src[(size_t)r * c4 + k4] : zero;
        }
#pragma unroll
        for (int i = 0; i < T3_LOADS; i++) {
            const uint32_t e = b + i * T3_THREADS;
            if (e < total)
                put_bf16x4(ks + e / l4 * ld + e % l4 * 4, v[i]);
        }
    }
}

/* Split form's double buffer: thread's elements e = threadIdx.x + T3_THREADS i (float4 k4 = e %
 * l4 of row e / l4) of a tile's rows [0, nk) from src into registers pf (rows past nk and
 * columns past 4 c4 zero), loaded while the current tile is computed ... */
__device__ static inline void fetch_tile3(const float4 *src, uint32_t nk, uint32_t c4,
                                          uint32_t ld, float4 (&pf)[T3_PF])
{
    const uint32_t l4 = ld / 4, total = T3_KEYS * l4;
#pragma unroll
    for (int i = 0; i < T3_PF; i++) {
        const uint32_t e = threadIdx.x + i * T3_THREADS, r = e / l4, k4 = e % l4;
        pf[i] = e < total && r < nk && k4 < c4 ? src[(size_t)r * c4 + k4]
                                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* ... then split into hi (ks [T3_KEYS][ld]) and lo (32 ld further) once the tile is done. */
__device__ static inline void stash_tile3(const float4 (&pf)[T3_PF], uint32_t ld, uint16_t *ks)
{
    const uint32_t l4 = ld / 4, total = T3_KEYS * l4;
#pragma unroll
    for (int i = 0; i < T3_PF; i++) {
        const uint32_t e = threadIdx.x + i * T3_THREADS, at = e / l4 * ld + e % l4 * 4;
        if (e < total)
            put_split4(ks + at, ks + (size_t)32 * ld + at, pf[i]);
    }
}

/* The 8 threads of a row, 4 scores each in s (-inf where a key does not count): the row's
 * max with m_old, by shuffles. */
__device__ static inline float row_max8(const float (&s)[4], float m_old)
{
    float m = m_old;
#pragma unroll
    for (int j = 0; j < 4; j++)
        m = fmaxf(m, s[j]);
    for (int o = 4; o > 0; o /= 2)
        m = fmaxf(m, kl_gpu_shfl_xor(m, o));
    return m;
}

/* Thread q of row r's 8, l the sum of its weights: the row's sum by shuffles; thread 0 updates
 * the row's max, sum and alpha (e^(m_old - m), 0 when m_old = -inf; 1 while the row has no key:
 * none).  Every thread of the row read mx[r] before the shuffles. */
__device__ static inline void row_update8(uint32_t r, uint32_t q, float m_old, float m, float l,
                                          bool none, float *mx, float *sm, float *alpha)
{
    for (int o = 4; o > 0; o /= 2)
        l += kl_gpu_shfl_xor(l, o);
    if (q == 0) {
        const float al = none ? 1.0f : expf(m_old - m);
        mx[r] = m;
        sm[r] = sm[r] * al + l;
        alpha[r] = al;
    }
}

/* Block: the tile's raw scores ss [2][T3_ROWS][T3_SLD] (two halves of the columns, added)
 * become weights ps (bf16) for the rows'
 * online softmax: key c of row r counts when c < nk and u0 + c <= rpos[r] (causal; rpos -1: an
 * empty row).  8 threads per row, 4 keys each; mx, sm take in the tile, alpha the factor the
 * old context is scaled by.  The sum adds the weights as rounded to bf16 (as P V uses them;
 * S: hi + lo, the lo copy 32 T3_PLD after ps). */
template <bool S>
__device__ static inline void softmax3(const float *ss, uint32_t nk, uint32_t u0, float scale,
                                       const int *rpos, uint16_t *ps, float *mx, float *sm,
                                       float *alpha)
{
    static_assert(T3_THREADS == 8 * T3_ROWS && T3_KEYS == 32, "8 threads per row, 4 keys each");
    const uint32_t r = threadIdx.x / 8, q = threadIdx.x % 8;
    const float m_old = mx[r];
    float s[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint32_t c = q + 8 * j;
        const float v = ss[r * T3_SLD + c] + ss[(T3_ROWS + r) * T3_SLD + c];
        s[j] = c < nk && (int)(u0 + c) <= rpos[r] ? v * scale : -INFINITY;
    }
    const float m = row_max8(s, m_old);
    const bool none = m == -INFINITY; /* no key of the row yet */
    float l = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float p = none ? 0.0f : expf(s[j] - m);
        const uint32_t b = bf16_bits(p), at = r * T3_PLD + q + 8 * j;
        ps[at] = (uint16_t)b;
        l += bf16_val((uint16_t)b);
        if (S) { /* lo = bf16(p - hi), after hi in ps */
            const uint32_t lo = bf16_bits(p - bf16_val((uint16_t)b));
            ps[32 * T3_PLD + at] = (uint16_t)lo;
            l += bf16_val((uint16_t)lo);
        }
    }
    row_update8(r, q, m_old, m, l, none, mx, sm, alpha);
}

/* Where attend3's block lies: run blockIdx.y, its tokens t0 .. t0 + nt (row r: token t0 +
 * r / nh, head r % nh; rows past nt * nh empty), the cache rows [u_begin, u_end) of split
 * blockIdx.x. */
struct block3 {
    uint32_t t0, nt, u_begin, u_end;
};

/* false when the block has nothing to do; split 0 records the rows per split for combine2. */
__device__ static inline bool place3(const kl_gpu_tokens &tk, uint32_t nh, uint32_t *rp,
                                     block3 &b)
{
    const uint32_t r0 = tk.run_start[blockIdx.y], len = tk.run_start[blockIdx.y + 1] - r0;
    const uint32_t tb = T3_ROWS / nh, j0 = blockIdx.z * tb;
    if (j0 >= len)
        return false;
    b.t0 = r0 + j0;
    b.nt = len - j0 < tb ? len - j0 : tb;
    uint32_t span = 0;
    for (uint32_t k = 0; k < b.nt; k++)
        span = tk.tok_pos[b.t0 + k] + 1 > span ? tk.tok_pos[b.t0 + k] + 1 : span;
    const uint32_t rows_per = split_rows(span, gridDim.x, T3_KEYS, T3_MIN_TILES);
    b.u_begin = blockIdx.x * rows_per;
    b.u_end = span - b.u_begin < rows_per ? span : b.u_begin + rows_per;
    if (blockIdx.x == 0 && threadIdx.x < b.nt)
        rp[b.t0 + threadIdx.x] = rows_per;
    return b.u_begin < span;
}

/* Block: the rows' queries qf [n][nh][cw] as bf16 into qs [T3_ROWS][ld] (empty rows and
 * columns past cw zero; S: split, lo 32 rows after), their positions into rpos (-1: empty), the
 * running max and sum. */
template <bool S>
__device__ static inline void load_queries3(const float *qf, const kl_gpu_tokens &tk,
                                            const block3 &b, uint32_t nh, uint32_t cw,
                                            uint16_t *qs, int *rpos, float *mx, float *sm)
{
    const uint32_t ld = ld3(cw), l4 = ld / 4, c4 = cw / 4;
    for (uint32_t e = threadIdx.x; e < T3_ROWS * l4; e += blockDim.x) {
        const uint32_t r = e / l4, k4 = e % l4, tok = r / nh;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (tok < b.nt && k4 < c4)
            v = ((const float4 *)(qf + ((size_t)(b.t0 + tok) * nh + r % nh) * cw))[k4];
        if (S)
            put_split4(qs + r * ld + 4 * k4, qs + (r + 32) * ld + 4 * k4, v);
        else
            put_bf16x4(qs + r * ld + 4 * k4, v);
    }
    for (uint32_t r = threadIdx.x; r < T3_ROWS; r += blockDim.x) {
        rpos[r] = r / nh < b.nt ? (int)tk.tok_pos[b.t0 + r / nh] : -1;
        mx[r] = -INFINITY;
        sm[r] = 0.0f;
    }
}

/* Block: the tile's scores [T3_ROWS][T3_KEYS] before scaling into ss [2][T3_ROWS][T3_SLD]:
 * group g the rows 16 (g % 4 / 2) x keys 16 (g % 2) over the first (g < 4) or the second half
 * of the 16-column steps. */
template <bool S>
__device__ static inline void scores3(const uint16_t *qs, const uint16_t *ks, uint32_t ld,
                                      const fmap &fm, float *ss)
{
    const uint32_t g = threadIdx.x / KL_GPU_GROUP, tr = g % 4 / 2, tc = g % 2;
    const uint32_t steps = (ld - 8) / 16, s0 = g < 4 ? 0 : steps / 2;
    const uint32_t ns = g < 4 ? steps / 2 : steps - steps / 2;
    acc16 c;
    acc_zero(c);
    mma_qk<S>(c, qs + 16 * tr * ld + 16 * s0, ks + 16 * tc * ld + 16 * s0, ld, ns);
    float *dst = ss + (g < 4 ? 0 : T3_ROWS * T3_SLD);
#pragma unroll
    for (int e = 0; e < acc16::num_elements; e++)
        dst[(16 * tr + frow(fm, e)) * T3_SLD + 16 * tc + fcol(fm, e)] = c.x[e];
}

/* grid (splits, runs, token groups of the longest run): the rows (token, head) of T3_ROWS / nh
 * tokens of run blockIdx.y against the cache rows of split blockIdx.x (split_rows of the
 * group's longest span); partial results as attend2's, for the tokens of the block.  Group g
 * computes half of the scores of a 16 x 16 tile (scores3) and the context of rows 16 (g / 4),
 * columns 16 (g % 4 + 4 i).  S (the split form, exact to ~1e-5): every operand as hi + lo,
 * three products each; the next tile is loaded into registers while the current one is
 * computed and split into shared memory after it.  Without S each tile is staged in turn. */
template <bool S>
__device__ static inline void attend3_body(const kl_gpu_mla_attend_args &a, const attend_ctx &x,
                                           const kl_gpu_tokens &tk, unsigned char *shared)
{
    const kl_gpu_mla_dims d = a.d;
    const uint32_t nh = d.nh, cw = d.R + d.dr, ld = ld3(cw), nf = d.R / 16, cp = S ? 2 : 1;
    block3 b;
    if (!place3(tk, nh, x.sc.rp, b))
        return;
    uint16_t *qs = (uint16_t *)shared, *ks = qs + cp * T3_ROWS * ld;
    float *ss = (float *)(ks + cp * T3_KEYS * ld);
    uint16_t *ps = (uint16_t *)(ss + 2 * T3_ROWS * T3_SLD);
    float *mx = (float *)(ps + cp * T3_ROWS * T3_PLD), *sm = mx + T3_ROWS, *alpha = sm + T3_ROWS;
    int *rpos = (int *)(alpha + T3_ROWS);
    const uint32_t g = threadIdx.x / KL_GPU_GROUP, rg = g / 4, cg = g % 4;
    frag_tables(ss);
    load_queries3<S>(x.sc.ql, tk, b, nh, cw, qs, rpos, mx, sm);
    const float4 *cache = (const float4 *)a.cache[tk.run_slot[blockIdx.y]];
    float4 pf[T3_PF]; /* S only (unused without) */
    if (S) { /* the first tile */
        fetch_tile3(cache + (size_t)b.u_begin * (cw / 4), b.u_end - b.u_begin, cw / 4, ld, pf);
        stash_tile3(pf, ld, ks);
    }
    __syncthreads();
    const fmap fm = frag_map(ss);
    acc16 o[T3_FRAGS];
#pragma unroll
    for (int i = 0; i < T3_FRAGS; i++)
        acc_zero(o[i]);
    for (uint32_t u0 = b.u_begin; u0 < b.u_end; u0 += T3_KEYS) {
        const uint32_t nk = b.u_end - u0 < T3_KEYS ? b.u_end - u0 : T3_KEYS;
        const bool more = b.u_end - u0 > T3_KEYS;
        if (!S)
            load_tile3(cache + (size_t)u0 * (cw / 4), nk, cw / 4, ld, ks);
        else if (more) /* in flight until stash_tile3 below */
            fetch_tile3(cache + (size_t)(u0 + T3_KEYS) * (cw / 4), b.u_end - u0 - T3_KEYS,
                        cw / 4, ld, pf);
        __syncthreads(); /* also: every group has read the tables in ss */
        scores3<S>(qs, ks, ld, fm, ss);
        __syncthreads();
        softmax3<S>(ss, nk, u0, x.scale, rpos, ps, mx, sm, alpha);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < T3_FRAGS; i++)
#pragma unroll
            for (int e = 0; cg + 4 * i < nf && e < acc16::num_elements; e++)
                o[i].x[e] *= alpha[16 * rg + frow(fm, e)];
        mma_pv<S>(o, ps + 16 * rg * T3_PLD, ks, ld, cg, nf);
        __syncthreads(); /* ks and ps are rewritten by the next tile */
        if (S && more)
            stash_tile3(pf, ld, ks);
    }
    const size_t splits = gridDim.x;
    for (uint32_t r = threadIdx.x; r < T3_ROWS; r += blockDim.x) {
        if (r / nh >= b.nt)
            continue;
        const size_t part = (size_t)(b.t0 + r / nh) * splits + blockIdx.x;
        x.sc.pm[part * nh + r % nh] = mx[r];
        x.sc.pl[part * nh + r % nh] = sm[r];
    }
#pragma unroll
    for (int i = 0; i < T3_FRAGS; i++)
#pragma unroll
        for (int e = 0; cg + 4 * i < nf && e < acc16::num_elements; e++) {
            const uint32_t r = 16 * rg + frow(fm, e);
            if (r / nh >= b.nt)
                continue;
            const size_t part = (size_t)(b.t0 + r / nh) * splits + blockIdx.x;
            x.sc.pc[(part * nh + r % nh) * d.R + 16 * (cg + 4 * i) + fcol(fm, e)] = o[i].x[e];
        }
}

/* v3fast: bf16 operands, 2 blocks per SM */
__global__ static void __launch_bounds__(T3_THREADS, 2)
attend3_kernel(kl_gpu_mla_attend_args a, attend_ctx x, kl_gpu_tokens tk)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ __align__(128) unsigned char shared3[]; /* wmma: 32-byte aligned tiles */
    attend3_body<false>(a, x, tk, shared3);
}

/* v3: the split form, 1 block per SM (its shared memory), registers for the prefetch */
__global__ static void __launch_bounds__(T3_THREADS, 1)
attend3s_kernel(kl_gpu_mla_attend_args a, attend_ctx x, kl_gpu_tokens tk)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ __align__(128) unsigned char shared3[];
    attend3_body<true>(a, x, tk, shared3);
}

/* ------------------------------------------------------------------------------------------ */
/* Attend, v4: decode (runs of one token) on mma.sync, the split form, the queries held in    */
/* registers and the cache tiles streamed into shared memory by cp.async (see the header)     */

#define T4_ROWS      32     /* query rows (heads) per block */
#define T4_KEYS      32     /* cache rows per tile */
#define T4_WARPS     8      /* groups of 32 lanes */
#define T4_THREADS   (T4_WARPS * KL_GPU_GROUP)
#define T4_QSTEPS    5      /* 16-column steps of the queries per group at most: cw <= 640 */
#define T4_NB        8      /* 8-column blocks of the context per group at most: R <= 512 */
#define T4_SLD       40     /* row stride (floats) of the score partials: 8 mod 32 */
#define T4_PLD       36     /* row stride (words) of the weights' bf16 pairs: 4 mod 32 */
#define T4_MIN_TILES 2      /* tiles per split at least */

static_assert(T4_ROWS == 32 && T4_KEYS == 32 && T4_THREADS == 8 * T4_ROWS,
              "2 x 16 query rows, 4 x 8 keys per tile, 8 threads per row in the softmax");

/* Row stride (floats) of a staged cache tile: 8 mod 32 words, so that the 8-byte key loads of
 * a half group (4 keys x 4 column pairs) and the 4-byte value loads (4 keys x 8 columns, keys
 * permuted by pv_key) fall in distinct banks; at least the width rounded up to 16. */
__host__ __device__ static inline uint32_t ld4(uint32_t cw)
{
    return (cw + 31) / 32 * 32 + 8;
}

/* Bytes of attend4's shared memory: two stages of a tile [T4_KEYS][ld4] fp32, the groups'
 * score partials [T4_WARPS][T4_ROWS][T4_SLD], the weights' pairs [T4_ROWS][T4_PLD], max, sum,
 * alpha. */
static size_t attend4_shared(const kl_gpu_mla_dims *d)
{
    return (2 * (size_t)T4_KEYS * ld4(d->R + d->dr) + T4_WARPS * T4_ROWS * T4_SLD +
            T4_ROWS * T4_PLD + 3 * T4_ROWS) * sizeof(float);
}

/* x, y as bf16 pairs (x in the low half): hi = bf16(x) bf16(y), lo = bf16(x - hi_x) bf16(y -
 * hi_y), both rounded to nearest even. */
__device__ static inline void split2(float x, float y, uint32_t &hi, uint32_t &lo)
{
#if !defined(__HIPCC__)
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
    memcpy(&hi, &h, 4);
    memcpy(&lo, &l, 4);
#else
    const uint32_t hx = bf16_bits(x), hy = bf16_bits(y);
    hi = hx | hy << 16;
    lo = bf16_bits(x - bf16_val((uint16_t)hx)) | bf16_bits(y - bf16_val((uint16_t)hy)) << 16;
#endif
}

/* P V's key order: mma's k (0..15) of a 16-key step is key pv_key(k), for P (A) and V (B)
 * alike, so that the 4 keys a lane reads of one value column (k = 2t, 2t+1, 2t+8, 2t+9: keys
 * t, t+4, t+8, t+12) are 8 banks apart for t = 0..3 (row stride 8 mod 32). */
__host__ __device__ static inline uint32_t pv_key(uint32_t k)
{
    return k % 8 / 2 + 4 * (k % 2) + 8 * (k / 8);
}

/* The queries of a group's steps [s0, s0 + ns) as A fragments: [step][16-row block][register] */
struct q4regs {
    uint32_t hi[T4_QSTEPS][2][4], lo[T4_QSTEPS][2][4];
};

/* Group: its steps of the token's queries qf [nh][cw] (rows >= nh and columns >= cw zero),
 * split into hi and lo. */
__device__ static inline void load_q4(const float *qf, uint32_t nh, uint32_t cw, uint32_t s0,
                                      uint32_t ns, q4regs &q)
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, g = lane / 4, t = lane % 4;
#pragma unroll
    for (uint32_t i = 0; i < T4_QSTEPS; i++)
#pragma unroll
        for (uint32_t m = 0; m < 2; m++)
#pragma unroll
            for (uint32_t j = 0; j < 4; j++) {
                const uint32_t row = 16 * m + g + 8 * (j % 2);
                const uint32_t col = 16 * (s0 + i) + 2 * t + 8 * (j / 2);
                float2 v = make_float2(0.0f, 0.0f);
                if (i < ns && row < nh && col < cw) /* col even, cw % 4 == 0: col + 1 too */
                    v = *(const float2 *)(qf + (size_t)row * cw + col);
                split2(v.x, v.y, q.hi[i][m][j], q.lo[i][m][j]);
            }
}

/* Block: rows [u0, u_end) (T4_KEYS at most) of the cache (rows of cw floats) into the stage
 * dst [T4_KEYS][ld] by cp.async, one committed group; rows past u_end zero. */
__device__ static inline void fetch_tile4(const float *cache, uint32_t u0, uint32_t u_end,
                                          uint32_t cw, uint32_t ld, float *dst)
{
    const uint32_t nk = u_end - u0 < T4_KEYS ? u_end - u0 : T4_KEYS, c4 = cw / 4;
    for (uint32_t e = threadIdx.x; e < T4_KEYS * c4; e += T4_THREADS) {
        const uint32_t r = e / c4, c = e % c4;
        copy16(dst + r * ld + 4 * c, cache + (size_t)(u0 + (r < nk ? r : 0)) * cw + 4 * c,
               r < nk ? 16 : 0);
    }
    copy_commit();
}

/* Group: the scores of the tile kv [T4_KEYS][ld] over the group's steps into its partials red
 * [T4_ROWS][T4_SLD]: per 8 keys, both 16-row blocks, hi hi + hi lo + lo hi summed in fresh
 * fragments (the MMA's accumulation truncates: its sums span this group's steps only; the
 * groups' partials are added in fp32 by softmax4). */
__device__ static inline void scores4(const q4regs &q, const float *kv, uint32_t ld, uint32_t s0,
                                      uint32_t ns, float *red)
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, g = lane / 4, t = lane % 4;
#pragma unroll
    for (uint32_t nb = 0; nb < T4_KEYS / 8; nb++) {
        float c[2][2][4] = {}; /* [row block][hi hi, hi lo + lo hi]: 4 independent chains */
        const float *krow = kv + (size_t)(8 * nb + g) * ld + 16 * s0 + 2 * t; /* B: key 8 nb + g */
#pragma unroll
        for (uint32_t i = 0; i < T4_QSTEPS; i++) {
            if (i >= ns) /* the same for the whole group */
                continue;
            const float2 k0 = *(const float2 *)(krow + 16 * i);
            const float2 k1 = *(const float2 *)(krow + 16 * i + 8);
            uint32_t bh0, bl0, bh1, bl1;
            split2(k0.x, k0.y, bh0, bl0);
            split2(k1.x, k1.y, bh1, bl1);
#pragma unroll
            for (uint32_t m = 0; m < 2; m++) {
                mma16816(c[m][0], q.hi[i][m], bh0, bh1);
                mma16816(c[m][1], q.hi[i][m], bl0, bl1);
                mma16816(c[m][1], q.lo[i][m], bh0, bh1);
            }
        }
#pragma unroll
        for (uint32_t m = 0; m < 2; m++) {
            float *r0 = red + (size_t)(16 * m + g) * T4_SLD + 8 * nb + 2 * t;
            const float(&h)[4] = c[m][0], (&l)[4] = c[m][1];
            *(float2 *)r0 = make_float2(h[0] + l[0], h[1] + l[1]);
            *(float2 *)(r0 + 8 * T4_SLD) = make_float2(h[2] + l[2], h[3] + l[3]);
        }
    }
}

/* Block: the groups' partials red [T4_WARPS][T4_ROWS][T4_SLD] added in order and scaled, keys
 * c < nk counted (nk >= 1), the online softmax as softmax3 (8 threads per row, 4 keys each);
 * the weights split into bf16 pairs of keys (c, c + 4), c % 8 < 4, as context4's A fragments
 * take them (pv_key's order): pw [T4_ROWS][T4_PLD] words, hi of pair 4 (c / 8) + c % 8 at that
 * word, lo 16 words further; the sum adds the weights as split (hi + lo); mx, sm take in the
 * tile, alpha the factor the old context is scaled by. */
__device__ static inline void softmax4(const float *red, uint32_t nk, float scale, uint32_t *pw,
                                       float *mx, float *sm, float *alpha)
{
    const uint32_t r = threadIdx.x / 8, q = threadIdx.x % 8;
    const float m_old = mx[r];
    float s[4];
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) {
        const uint32_t c = q + 8 * j;
        float v = 0.0f;
#pragma unroll
        for (uint32_t w = 0; w < T4_WARPS; w++)
            v += red[((size_t)w * T4_ROWS + r) * T4_SLD + c];
        s[j] = c < nk ? v * scale : -INFINITY;
    }
    const float m = row_max8(s, m_old); /* finite: key 0 counts */
    float l = 0.0f;
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) {
        const uint32_t c = q + 8 * j;
        const float p = c < nk ? expf(s[j] - m) : 0.0f;
        const float p4 = kl_gpu_shfl_xor(p, 4); /* q < 4: key c + 4's, thread q + 4's */
        if (q < 4) {
            uint32_t hi, lo;
            split2(p, p4, hi, lo);
            pw[r * T4_PLD + 4 * j + q] = hi;
            pw[r * T4_PLD + 16 + 4 * j + q] = lo;
            l += bf16_val((uint16_t)hi) + bf16_val((uint16_t)(hi >> 16)) +
                 bf16_val((uint16_t)lo) + bf16_val((uint16_t)(lo >> 16));
        }
    }
    row_update8(r, q, m_old, m, l, false, mx, sm, alpha);
}

/* Group w: o[m][i] (rows 16 m .. +16, columns 8 (w + 8 i) .. +8, i while w + 8 i < nb) =
 * alpha o + P V over the tile kv [T4_KEYS][ld] (V: its first R columns), P V's hi hi + hi lo
 * + lo hi in fresh fragments, added in fp32; keys in pv_key's order for P (softmax4's pairs
 * pw) and V. */
__device__ static inline void context4(const float *kv, uint32_t ld, const uint32_t *pw,
                                       const float *alpha, uint32_t nb,
                                       float (&o)[2][T4_NB][4])
{
    const uint32_t w = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    const uint32_t g = lane / 4, t = lane % 4;
    uint32_t ph[2][2][4], pl[2][2][4]; /* [row block][16-key step][register] */
#pragma unroll
    for (uint32_t m = 0; m < 2; m++)
#pragma unroll
        for (uint32_t kk = 0; kk < 2; kk++)
#pragma unroll
            for (uint32_t j = 0; j < 4; j++) { /* k 2t + 8 (j / 2), +1: keys c, c + 4 */
                const uint32_t c = 16 * kk + pv_key(2 * t + 8 * (j / 2));
                const uint32_t *p = pw + (16 * m + g + 8 * (j % 2)) * T4_PLD + 4 * (c / 8) + c % 8;
                ph[m][kk][j] = p[0];
                pl[m][kk][j] = p[16];
            }
    float al[2][2]; /* [row block][row g, g + 8] */
#pragma unroll
    for (uint32_t m = 0; m < 2; m++)
        al[m][0] = alpha[16 * m + g], al[m][1] = alpha[16 * m + g + 8];
#pragma unroll
    for (uint32_t i = 0; i < T4_NB; i++) {
        if (w + 8 * i >= nb) /* the same for the whole group */
            continue;
        const float *v = kv + 8 * (w + 8 * i) + g; /* B: value column 8 (w + 8 i) + g */
        uint32_t bh[2][2], bl[2][2];                /* [16-key step][register] */
#pragma unroll
        for (uint32_t kk = 0; kk < 2; kk++)
#pragma unroll
            for (uint32_t j = 0; j < 2; j++) {
                const uint32_t k = 2 * t + 8 * j;
                split2(v[(size_t)(16 * kk + pv_key(k)) * ld],
                       v[(size_t)(16 * kk + pv_key(k + 1)) * ld], bh[kk][j], bl[kk][j]);
            }
#pragma unroll
        for (uint32_t m = 0; m < 2; m++) {
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (uint32_t kk = 0; kk < 2; kk++) {
                mma16816(c, ph[m][kk], bh[kk][0], bh[kk][1]);
                mma16816(c, ph[m][kk], bl[kk][0], bl[kk][1]);
                mma16816(c, pl[m][kk], bh[kk][0], bh[kk][1]);
            }
#pragma unroll
            for (uint32_t e = 0; e < 4; e++)
                o[m][i][e] = o[m][i][e] * al[m][e / 2] + c[e];
        }
    }
}

/* Block: the split's partial result (max, sum, context of the rows < nh) into the scratch. */
__device__ static inline void store4(const attend_ctx &x, size_t part, uint32_t nh, uint32_t R,
                                     const float *mx, const float *sm,
                                     const float (&o)[2][T4_NB][4])
{
    const uint32_t w = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    const uint32_t g = lane / 4, t = lane % 4;
    for (uint32_t r = threadIdx.x; r < nh; r += T4_THREADS) {
        x.sc.pm[part * nh + r] = mx[r];
        x.sc.pl[part * nh + r] = sm[r];
    }
#pragma unroll
    for (uint32_t i = 0; i < T4_NB; i++) {
        if (w + 8 * i >= R / 8)
            continue;
#pragma unroll
        for (uint32_t m = 0; m < 2; m++)
#pragma unroll
            for (uint32_t h = 0; h < 2; h++) { /* rows 16 m + g and + 8 */
                const uint32_t row = 16 * m + g + 8 * h, col = 8 * (w + 8 * i) + 2 * t;
                if (row < nh)
                    *(float2 *)(x.sc.pc + (part * nh + row) * R + col) =
                        make_float2(o[m][i][2 * h], o[m][i][2 * h + 1]);
            }
    }
}

/* grid (splits, n): decode, token blockIdx.y alone in its run; its heads (rows, nh <= 32)
 * against the cache rows of split blockIdx.x (split_rows of the token's span, >= T4_MIN_TILES
 * tiles; split 0 records the rows per split in rp for combine2).  Group w holds the queries of
 * the 16-column steps [s0, s0 + ns) of its share in registers (hi and lo) and the context of
 * columns 8 (w + 8 i) .. +8 of all 32 rows; each tile is in flight (cp.async) while the one
 * before is computed: scores (scores4), softmax (softmax4), context (context4). */
__global__ static void __launch_bounds__(T4_THREADS, 1)
attend4_kernel(kl_gpu_mla_attend_args a, attend_ctx x)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ float4 shared4[];
    const kl_gpu_mla_dims d = a.d;
    const uint32_t t = blockIdx.y, nh = d.nh, cw = d.R + d.dr, ld = ld4(cw);
    const uint32_t span = x.tok_pos[t] + 1;
    const uint32_t rows_per = split_rows(span, gridDim.x, T4_KEYS, T4_MIN_TILES);
    const uint32_t u_begin = blockIdx.x * rows_per;
    if (blockIdx.x == 0 && threadIdx.x == 0)
        x.sc.rp[t] = rows_per;
    if (u_begin >= span) /* the whole block leaves */
        return;
    const uint32_t u_end = span - u_begin < rows_per ? span : u_begin + rows_per;
    float *kv = (float *)shared4, *red = kv + 2 * T4_KEYS * ld;
    uint32_t *pw = (uint32_t *)(red + T4_WARPS * T4_ROWS * T4_SLD);
    float *mx = (float *)(pw + T4_ROWS * T4_PLD), *sm = mx + T4_ROWS, *alpha = sm + T4_ROWS;
    const float *cache = a.cache[x.tok_slot[t]];
    fetch_tile4(cache, u_begin, u_end, cw, ld, kv);
    for (uint32_t e = threadIdx.x; e < 2 * T4_KEYS * (ld - cw); e += T4_THREADS)
        kv[e / (ld - cw) * ld + cw + e % (ld - cw)] = 0.0f; /* the padding: never copied */
    for (uint32_t r = threadIdx.x; r < T4_ROWS; r += T4_THREADS) {
        mx[r] = -INFINITY;
        sm[r] = 0.0f;
    }
    /* group w takes share p of the steps: groups w and w + 4 (one scheduler) shares 2w and
     * 2w + 1, so that each scheduler's pair has 9 of the 36 steps at the full shape */
    const uint32_t w = threadIdx.x / KL_GPU_GROUP, steps = (cw + 15) / 16;
    const uint32_t p = w < T4_WARPS / 2 ? 2 * w : 2 * (w - T4_WARPS / 2) + 1;
    const uint32_t s0 = p * steps / T4_WARPS, ns = (p + 1) * steps / T4_WARPS - s0;
    q4regs q;
    load_q4(x.sc.ql + (size_t)t * nh * cw, nh, cw, s0, ns, q);
    float o[2][T4_NB][4] = {};
    for (uint32_t u0 = u_begin, k = 0; u0 < u_end; u0 += T4_KEYS, k++) {
        const float *cur = kv + (k % 2) * T4_KEYS * ld;
        if (u_end - u0 > T4_KEYS) { /* the next tile into the other stage, free since the
                                       barrier that ended the last tile */
            fetch_tile4(cache, u0 + T4_KEYS, u_end, cw, ld, kv + (k + 1) % 2 * T4_KEYS * ld);
            copy_wait<1>();
        } else {
            copy_wait<0>();
        }
        __syncthreads(); /* every thread's copies of this tile have landed */
        scores4(q, cur, ld, s0, ns, red + (size_t)w * T4_ROWS * T4_SLD);
        __syncthreads();
        softmax4(red, u_end - u0 < T4_KEYS ? u_end - u0 : T4_KEYS, x.scale, pw, mx, sm, alpha);
        __syncthreads();
        context4(cur, ld, pw, alpha, d.R / 8, o);
        __syncthreads(); /* the stage, red and pw are rewritten next */
    }
    store4(x, (size_t)t * gridDim.x + blockIdx.x, nh, d.R, mx, sm, o);
}

/* ------------------------------------------------------------------------------------------ */
/* MHA form for the prefill of one prompt (KL_GPU_MLA_PREFILL=mha, the default where it fits)  */

#define MHA_ROWS     64     /* query tokens per block: 16 per group */
#define MHA_WARPS    4
#define MHA_THREADS  (MHA_WARPS * KL_GPU_GROUP)
#define MHA_KEYS     32     /* keys per tile */
#define MHA_QSTEPS   12     /* 16-column steps of a query at most: dn + dr <= 192 */
#define MHA_VNB      16     /* 8-column blocks of a value at most: dv <= 128 */
#define MHA_MAX_SPAN 65536u /* spans in MHA form at most by default (kl_gpu_mla_mha_span):
                               64K prefill 1,618 -> 6,323 tok/s over 16,384 (session 11) */
#define MHA_SPAN_CAP 65536u /* ... and at most when set (the scratch at the model's shape:
                               ~5.2 GB at 65,536, mostly the expanded keys and values and
                               their bf16 planes) */
/* Tokens of a chunk at least: the expansion costs span nh (dn + dv) R products (x3) however
 * few tokens attend, the latent form ~3.4x the MHA form's attention per (token, key); below
 * ~64 tokens over a long span (a short follow-up prompt) the expansion outweighs the gain. */
#define MHA_MIN_N    64u

static_assert(MHA_ROWS == 16 * MHA_WARPS && MHA_KEYS % 16 == 0, "16 query rows per group");

/* Row strides (floats) of a staged tile: keys 8 mod 32 words (the score B fragments' 8-byte
 * loads of a half group, 8 keys x 4 column pairs, fall in distinct banks), values 4 mod 32
 * (the P V B fragments' loads, 4 keys 2 apart x 8 columns, likewise). */
__host__ __device__ static inline uint32_t mha_ldk(const kl_gpu_mla_dims &d)
{
    return (d.dn + d.dr + 31) / 32 * 32 + 8;
}

__host__ __device__ static inline uint32_t mha_ldv(const kl_gpu_mla_dims &d)
{
    return (d.dv + 31) / 32 * 32 + 4;
}

/* Bytes of mha_kernel's shared memory: two stages of a key tile and a value tile, and the
 * block's key count. */
static size_t mha_shared(const kl_gpu_mla_dims *d)
{
    return (2 * (size_t)MHA_KEYS * (mha_ldk(*d) + mha_ldv(*d)) + 4) * sizeof(float);
}

/* Floats from 16-byte boundary to 16-byte boundary */
static size_t round4(size_t floats)
{
    return (floats + 3) / 4 * 4;
}

/* bf16 elements of a plane: keys [nh][span][dn + dr], values [nh][span][dv] */
__host__ __device__ static inline size_t mha_kplane(const kl_gpu_mla_dims *d, uint32_t span)
{
    return (size_t)d->nh * span * (d->dn + d->dr);
}

__host__ __device__ static inline size_t mha_vplane(const kl_gpu_mla_dims *d, uint32_t span)
{
    return (size_t)d->nh * span * d->dv;
}

/* The MHA scratch for a span: the latent rows [span][R], the expanded [span][nh (dn + dv)]
 * (row u: head h's key at h (dn + dv), its value dn further, as kv_b's rows), the rows' bf16
 * parts for kl_gpu_gemm_p, and v2's bf16 planes (key hi, key lo, value hi, value lo). */
typedef struct mha_scratch {
    float *rows, *kv;
    uint16_t *parts, *planes;
} mha_scratch;

static size_t mha_floats(const kl_gpu_mla_dims *d, uint32_t span, mha_scratch *s, float *p)
{
    const size_t rows = round4((size_t)span * d->R);
    const size_t kv = round4((size_t)span * d->nh * (d->dn + d->dv));
    const size_t parts = (kl_gpu_gemm_parts_bytes(span, d->R) + 15) / 16 * 4;
    const size_t planes = round4(mha_kplane(d, span) + mha_vplane(d, span)); /* 2 x 2 bytes */
    if (s) {
        const mha_scratch r = {p, p + rows, (uint16_t *)(p + rows + kv),
                               (uint16_t *)(p + rows + kv + parts)};
        *s = r;
    }
    return rows + kv + parts + planes;
}

/* grid (span, 1): rows[u] = the first R floats of cache row u of the run's slot (a lane group
 * per row, float4) */
__global__ static void mha_rows_kernel(const float *const *cache, const uint32_t *run_slot,
                                       uint32_t R, uint32_t cw, float *rows)
{
    KL_GPU_GRID_WAIT();
    const size_t u = blockIdx.x;
    const float4 *src = (const float4 *)(cache[run_slot[0]] + u * cw);
    float4 *dst = (float4 *)(rows + u * R);
    for (uint32_t k = threadIdx.x; k < R / 4; k += KL_GPU_GROUP)
        dst[k] = src[k];
}

/* Block: keys [u0, u0 + MHA_KEYS) of head h into a stage by cp.async, one committed group:
 * kt [MHA_KEYS][ldk] = [k_nope (kv), k_rope (the cache row's last dr)], vt [MHA_KEYS][ldv]
 * (kv, dn further); keys >= u_end zero. */
__device__ static inline void mha_fetch(const kl_gpu_mla_dims &d, const float *kv,
                                        const float *cache, uint32_t h, uint32_t u0,
                                        uint32_t u_end, float *kt, float *vt)
{
    const uint32_t n4 = d.dn / 4, r4 = d.dr / 4, v4 = d.dv / 4, per = n4 + r4 + v4;
    const uint32_t ldk = mha_ldk(d), ldv = mha_ldv(d), kvw = d.nh * (d.dn + d.dv);
    const uint32_t cw = d.R + d.dr;
    for (uint32_t e = threadIdx.x; e < MHA_KEYS * per; e += MHA_THREADS) {
        const uint32_t r = e / per, c = e % per, u = u0 + r < u_end ? u0 + r : 0;
        const float *kr = kv + (size_t)u * kvw + h * (d.dn + d.dv);
        const float *src = c < n4        ? kr + 4 * c
                           : c < n4 + r4 ? cache + (size_t)u * cw + d.R + 4 * (c - n4)
                                         : kr + d.dn + 4 * (c - n4 - r4);
        float *dst = c < n4 + r4 ? kt + r * ldk + 4 * c : vt + r * ldv + 4 * (c - n4 - r4);
        copy16(dst, src, u0 + r < u_end ? 16 : 0);
    }
    copy_commit();
}

/* Group: its 16 query rows (tokens t0 + g and t0 + g + 8, clamped to n - 1) of head h as A
 * fragments, split: [step][register], steps < qw / 16 (the rest zero). */
__device__ static inline void mha_load_q(const float *q, const kl_gpu_mla_dims &d, uint32_t n,
                                         uint32_t t0, uint32_t h, uint32_t (&qh)[MHA_QSTEPS][4],
                                         uint32_t (&ql)[MHA_QSTEPS][4])
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, g = lane / 4, t = lane % 4;
    const uint32_t qw = d.dn + d.dr;
#pragma unroll
    for (uint32_t i = 0; i < MHA_QSTEPS; i++)
#pragma unroll
        for (uint32_t j = 0; j < 4; j++) {
            const uint32_t row = t0 + g + 8 * (j % 2), col = 16 * i + 2 * t + 8 * (j / 2);
            float2 v = make_float2(0.0f, 0.0f);
            if (16 * i < qw)
                v = *(const float2 *)(q + ((size_t)(row < n ? row : n - 1) * d.nh + h) * qw + col);
            split2(v.x, v.y, qh[i][j], ql[i][j]);
        }
}

/* Group: acc += A B, A = ah + al, B = (bh0, bh1) + (bl0, bl1): hi hi + hi lo + lo hi in a
 * fresh fragment (the MMA's accumulation truncates), added in fp32. */
__device__ static inline void mma3b_add(float (&acc)[4], const uint32_t (&ah)[4],
                                        const uint32_t (&al)[4], uint32_t bh0, uint32_t bh1,
                                        uint32_t bl0, uint32_t bl1)
{
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma16816(c, ah, bh0, bh1);
    mma16816(c, ah, bl0, bl1);
    mma16816(c, al, bh0, bh1);
#pragma unroll
    for (uint32_t e = 0; e < 4; e++)
        acc[e] += c[e];
}

/* mma3b_add with B's registers (x0, x1) and (x2, x3) split into hi + lo here */
__device__ static inline void mma3_add(float (&acc)[4], const uint32_t (&ah)[4],
                                       const uint32_t (&al)[4], float x0, float x1, float x2,
                                       float x3)
{
    uint32_t bh0, bl0, bh1, bl1;
    split2(x0, x1, bh0, bl0);
    split2(x2, x3, bh1, bl1);
    mma3b_add(acc, ah, al, bh0, bh1, bl0, bl1);
}

/* s = 0 (a group's score fragments) */
__device__ static inline void mha_zero(float (&s)[MHA_KEYS / 8][4])
{
#pragma unroll
    for (uint32_t nb = 0; nb < MHA_KEYS / 8; nb++)
#pragma unroll
        for (uint32_t e = 0; e < 4; e++)
            s[nb][e] = 0.0f;
}

/* Group: s[nb] (keys 8 nb .. +8 of the tile kt) = Q Kᵀ over the steps < ns, each step's
 * hi hi + hi lo + lo hi in a fresh fragment, added in fp32. */
__device__ static inline void mha_scores(const uint32_t (&qh)[MHA_QSTEPS][4],
                                         const uint32_t (&ql)[MHA_QSTEPS][4], const float *kt,
                                         uint32_t ldk, uint32_t ns, float (&s)[MHA_KEYS / 8][4])
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, g = lane / 4, t = lane % 4;
    mha_zero(s);
#pragma unroll
    for (uint32_t i = 0; i < MHA_QSTEPS; i++) {
        if (i >= ns)
            continue;
#pragma unroll
        for (uint32_t nb = 0; nb < MHA_KEYS / 8; nb++) {
            const float *krow = kt + (size_t)(8 * nb + g) * ldk + 16 * i + 2 * t; /* key 8nb+g */
            const float2 k0 = *(const float2 *)krow, k1 = *(const float2 *)(krow + 8);
            mma3_add(s[nb], qh[i], ql[i], k0.x, k0.y, k1.x, k1.y);
        }
    }
}

/* e^x (E2: 2^x, the scores then scaled by log2(e) / sqrt(dn + dr)) */
template <bool E2> __device__ static inline float mha_exp(float x)
{
    return E2 ? exp2f(x) : expf(x);
}

/* Group: the online softmax of its rows (g: e < 2, g + 8: e >= 2; positions pos[0], pos[1])
 * over the tile's keys u0 + 8 nb + 2 t + e % 2 (mask: those past a row's position dropped;
 * without, the caller knows none is): m, l (this lane's share of the sum, the weights counted
 * as split) take in the tile, alpha the factor of the old context; the weights as P V's A
 * fragments, split: [16-key step][reg]. */
template <bool E2>
__device__ static inline void mha_softmax(const float (&s)[MHA_KEYS / 8][4], uint32_t u0,
                                          const uint32_t (&pos)[2], float scale, bool mask,
                                          float (&m)[2], float (&l)[2], float (&alpha)[2],
                                          uint32_t (&ph)[MHA_KEYS / 16][4],
                                          uint32_t (&pl)[MHA_KEYS / 16][4])
{
    const uint32_t t = threadIdx.x % 4;
    float v[MHA_KEYS / 8][4], mn[2] = {m[0], m[1]};
#pragma unroll
    for (uint32_t nb = 0; nb < MHA_KEYS / 8; nb++)
#pragma unroll
        for (uint32_t e = 0; e < 4; e++) {
            const uint32_t u = u0 + 8 * nb + 2 * t + e % 2;
            v[nb][e] = !mask || u <= pos[e / 2] ? s[nb][e] * scale : -INFINITY;
            mn[e / 2] = fmaxf(mn[e / 2], v[nb][e]);
        }
#pragma unroll
    for (uint32_t r = 0; r < 2; r++) { /* the 4 lanes of a row: t = lane % 4 */
        mn[r] = fmaxf(mn[r], kl_gpu_shfl_xor(mn[r], 1));
        mn[r] = fmaxf(mn[r], kl_gpu_shfl_xor(mn[r], 2));
        alpha[r] = mha_exp<E2>(m[r] - mn[r]); /* finite mn: key 0 lies in the first tile */
        l[r] *= alpha[r];
        m[r] = mn[r];
    }
#pragma unroll
    for (uint32_t kk = 0; kk < MHA_KEYS / 16; kk++)
#pragma unroll
        for (uint32_t j = 0; j < 4; j++) { /* a[j]: row g + 8 (j % 2), keys 2t + 8 (j / 2), +1 */
            const float(&c)[4] = v[2 * kk + j / 2];
            const uint32_t r = j % 2;
            const float p0 = c[2 * r] == -INFINITY ? 0.0f : mha_exp<E2>(c[2 * r] - mn[r]);
            const float p1 =
                c[2 * r + 1] == -INFINITY ? 0.0f : mha_exp<E2>(c[2 * r + 1] - mn[r]);
            split2(p0, p1, ph[kk][j], pl[kk][j]);
            l[r] += bf16_val((uint16_t)ph[kk][j]) + bf16_val((uint16_t)(ph[kk][j] >> 16)) +
                    bf16_val((uint16_t)pl[kk][j]) + bf16_val((uint16_t)(pl[kk][j] >> 16));
        }
}

/* Group: o = alpha o + P V over the tile vt [MHA_KEYS][ldv], 8-column blocks nb < vnb; each
 * 16-key step's hi hi + hi lo + lo hi in a fresh fragment, added in fp32. */
__device__ static inline void mha_context(const uint32_t (&ph)[MHA_KEYS / 16][4],
                                          const uint32_t (&pl)[MHA_KEYS / 16][4],
                                          const float (&alpha)[2], const float *vt, uint32_t ldv,
                                          uint32_t vnb, float (&o)[MHA_VNB][4])
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, g = lane / 4, t = lane % 4;
#pragma unroll
    for (uint32_t nb = 0; nb < MHA_VNB; nb++) {
        if (nb >= vnb)
            continue;
#pragma unroll
        for (uint32_t e = 0; e < 4; e++)
            o[nb][e] *= alpha[e / 2];
#pragma unroll
        for (uint32_t kk = 0; kk < MHA_KEYS / 16; kk++) {
            /* B: column 8 nb + g, its registers keys 2t, 2t + 1 and 2t + 8, 2t + 9 */
            const float *v = vt + (size_t)(16 * kk + 2 * t) * ldv + 8 * nb + g;
            mma3_add(o[nb], ph[kk], pl[kk], v[0], v[ldv], v[8 * ldv], v[9 * ldv]);
        }
    }
}

/* Group: its rows < n of o [n][nh dv], head h: the context over the row's sum (l summed over
 * the row's 4 lanes). */
__device__ static inline void mha_store(const kl_gpu_mla_dims &d, uint32_t n, uint32_t t0,
                                        uint32_t h, float (&l)[2], const float (&o)[MHA_VNB][4],
                                        float *out)
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, g = lane / 4, t = lane % 4;
#pragma unroll
    for (uint32_t r = 0; r < 2; r++) {
        l[r] += kl_gpu_shfl_xor(l[r], 1);
        l[r] += kl_gpu_shfl_xor(l[r], 2);
    }
#pragma unroll
    for (uint32_t r = 0; r < 2; r++) {
        const uint32_t row = t0 + g + 8 * r;
        if (row >= n)
            continue;
        float *dst = out + ((size_t)row * d.nh + h) * d.dv + 2 * t;
#pragma unroll
        for (uint32_t nb = 0; nb < MHA_VNB; nb++)
            if (8 * nb < d.dv)
                *(float2 *)(dst + 8 * nb) =
                    make_float2(o[nb][2 * r] / l[r], o[nb][2 * r + 1] / l[r]);
    }
}

/* Block: the largest position + 1 of the query tokens tile0 .. tile0 + rows (< n), through
 * the shared word kend. */
__device__ static inline uint32_t mha_key_end(uint32_t *kend, const kl_gpu_tokens &tk,
                                              uint32_t tile0, uint32_t rows)
{
    if (threadIdx.x == 0)
        *kend = 0;
    __syncthreads();
    if (threadIdx.x < rows && tile0 + threadIdx.x < tk.n)
        atomicMax(kend, tk.tok_pos[tile0 + threadIdx.x] + 1);
    __syncthreads();
    return *kend;
}

/* grid (query tiles of MHA_ROWS tokens, the last first; nh): the prefill of one run (slot
 * run_slot[0]), head blockIdx.y (a head's tiles run together: its keys and values stay in L2);
 * group w: tokens t0 = MHA_ROWS tile + 16 w .. +16, queries in
 * registers (split once), against key tiles 0 .. the block's largest position, each in flight
 * (cp.async, two stages) while the one before is computed: scores (mha_scores), online softmax
 * (mha_softmax, the weights kept in registers as P V's A fragments), context (mha_context). */
__global__ static void __launch_bounds__(MHA_THREADS, 2)
mha_kernel(kl_gpu_mla_attend_args a, const float *kv, kl_gpu_tokens tk)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ float4 shared4[];
    const kl_gpu_mla_dims d = a.d;
    const uint32_t h = blockIdx.y, n = tk.n, tile0 = (gridDim.x - 1 - blockIdx.x) * MHA_ROWS;
    const uint32_t w = threadIdx.x / KL_GPU_GROUP, g = threadIdx.x % KL_GPU_GROUP / 4;
    const uint32_t ldk = mha_ldk(d), ldv = mha_ldv(d), stage = MHA_KEYS * (ldk + ldv);
    float *st = (float *)shared4;
    const uint32_t u_end = mha_key_end((uint32_t *)(st + 2 * stage), tk, tile0, MHA_ROWS);
    const uint32_t t0 = tile0 + 16 * w;
    const float *cache = a.cache[tk.run_slot[0]];
    mha_fetch(d, kv, cache, h, 0, u_end, st, st + MHA_KEYS * ldk);
    uint32_t qh[MHA_QSTEPS][4], ql[MHA_QSTEPS][4];
    mha_load_q(a.q, d, n, t0, h, qh, ql);
    const uint32_t pos[2] = {tk.tok_pos[t0 + g < n ? t0 + g : n - 1],
                             tk.tok_pos[t0 + g + 8 < n ? t0 + g + 8 : n - 1]};
    const float scale = 1.0f / sqrtf((float)(d.dn + d.dr));
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[MHA_VNB][4] = {};
    for (uint32_t u0 = 0, k = 0; u0 < u_end; u0 += MHA_KEYS, k++) {
        const float *kt = st + (k % 2) * stage, *vt = kt + MHA_KEYS * ldk;
        if (u_end - u0 > MHA_KEYS) { /* the other stage is free since the last barrier */
            float *nx = st + (k + 1) % 2 * stage;
            mha_fetch(d, kv, cache, h, u0 + MHA_KEYS, u_end, nx, nx + MHA_KEYS * ldk);
            copy_wait<1>();
        } else {
            copy_wait<0>();
        }
        __syncthreads(); /* every thread's copies of this tile have landed */
        float s[MHA_KEYS / 8][4], alpha[2];
        uint32_t ph[MHA_KEYS / 16][4], pl[MHA_KEYS / 16][4];
        mha_scores(qh, ql, kt, ldk, (d.dn + d.dr) / 16, s);
        mha_softmax<false>(s, u0, pos, scale, true, m, l, alpha, ph, pl);
        mha_context(ph, pl, alpha, vt, ldv, d.dv / 8, o);
        __syncthreads(); /* the stage is rewritten next */
    }
    mha_store(d, n, t0, h, l, o, a.o);
}

/* MHA form v2 (KL_GPU_MLA_MHA=v2, the default; v1: mha_kernel above).  The keys and values
 * are split into bf16 hi + lo once, per head, by mha_planes_kernel, so the attention stages
 * bf16 tiles (cp.async, MHA2_STAGES stages) and loads B fragments by ldmatrix, no splitting
 * in its inner loop; a block of 8 groups holds 128 query tokens (each staged tile serves
 * twice v1's queries); scores scaled by log2(e) / sqrt(dn + dr) for exp2f; the causal mask
 * only on a group's diagonal tiles, tiles past a group's last position skipped. */
#define MHA2_WARPS   8
#define MHA2_ROWS    (16 * MHA2_WARPS) /* query tokens per block: 16 per group */
#define MHA2_THREADS (MHA2_WARPS * KL_GPU_GROUP)
#define MHA2_STAGES  3

/* bf16 elements of a stage: [MHA_KEYS][ldk] key hi, key lo, [MHA_KEYS][ldv] value hi, lo; row
 * strides width + 8 (16 bytes mod 128 when width / 8 is even: ldmatrix's 8 rows of a matrix
 * fall in distinct banks) */
__host__ __device__ static inline uint32_t mha2_stage(const kl_gpu_mla_dims &d)
{
    return 2 * MHA_KEYS * (d.dn + d.dr + 8 + d.dv + 8);
}

/* Bytes of mha2_kernel's shared memory: the stages and the block's key count. */
static size_t mha2_shared(const kl_gpu_mla_dims *d)
{
    return (size_t)MHA2_STAGES * mha2_stage(*d) * 2 + 16;
}

/* grid (span, 1): key u = blockIdx.x of every head, split into the planes at pl: key hi, key
 * lo, value hi, value lo (mha_kplane, mha_kplane, mha_vplane, mha_vplane elements); the key
 * [k_nope from kv, k_rope from the cache row's last dr], the value from kv, 4 floats a thread. */
__global__ static void mha_planes_kernel(kl_gpu_mla_dims d, const float *kv,
                                         const float *const *cache, const uint32_t *run_slot,
                                         uint32_t span, uint16_t *pl)
{
    KL_GPU_GRID_WAIT();
    const uint32_t u = blockIdx.x, qw = d.dn + d.dr, per = (qw + d.dv) / 4;
    const size_t kp = mha_kplane(&d, span), vp = mha_vplane(&d, span);
    const float *rope = cache[run_slot[0]] + (size_t)u * (d.R + d.dr) + d.R;
    for (uint32_t e = threadIdx.x; e < d.nh * per; e += blockDim.x) {
        const uint32_t h = e / per, c = 4 * (e % per);
        const float *x = kv + ((size_t)u * d.nh + h) * (d.dn + d.dv);
        if (c < qw) {
            uint16_t *k = pl + ((size_t)h * span + u) * qw + c;
            put_split4(k, k + kp, *(const float4 *)(c < d.dn ? x + c : rope + c - d.dn));
        } else {
            uint16_t *v = pl + 2 * kp + ((size_t)h * span + u) * d.dv + (c - qw);
            put_split4(v, v + vp, *(const float4 *)(x + d.dn + (c - qw)));
        }
    }
}

/* Block: keys [u0, u0 + MHA_KEYS) of head h from the planes into stage st by cp.async, one
 * committed group (empty when u0 >= u_end); keys >= u_end zero. */
__device__ static inline void mha2_fetch(const kl_gpu_mla_dims &d, const uint16_t *pl,
                                         uint32_t span, uint32_t h, uint32_t u0, uint32_t u_end,
                                         uint16_t *st)
{
    const uint32_t qw = d.dn + d.dr;
    const size_t kp = mha_kplane(&d, span), vp = mha_vplane(&d, span);
    for (uint32_t p = 0; p < 4 && u0 < u_end; p++) { /* key hi, key lo, value hi, value lo */
        const uint32_t w = p < 2 ? qw : d.dv, ld = w + 8, per = w / 8;
        const uint16_t *src = pl + (p < 2 ? p * kp : 2 * kp + (p - 2) * vp) + (size_t)h * span * w;
        uint16_t *dst = st + (p < 2 ? p : 2) * MHA_KEYS * (qw + 8) + (p == 3) * MHA_KEYS * ld;
        for (uint32_t e = threadIdx.x; e < MHA_KEYS * per; e += MHA2_THREADS) {
            const uint32_t r = e / per, c = 8 * (e % per), u = u0 + r;
            copy16(dst + r * ld + c, src + (size_t)(u < u_end ? u : 0) * w + c,
                   u < u_end ? 16 : 0);
        }
    }
    copy_commit();
}

/* Group: s[nb] (keys 8 nb .. +8 of the tile) = Q Kᵀ over the steps < ns, K from the staged
 * bf16 planes kh, kl [MHA_KEYS][ldk] by ldmatrix (matrix m of lane 8 m + r: key
 * 8 (2 np + m / 2) + r, columns 16 i + 8 (m % 2) .. +8: B's registers of key blocks 2 np,
 * 2 np + 1), each step's three products in a fresh fragment, added in fp32. */
__device__ static inline void mha2_scores(const uint32_t (&qh)[MHA_QSTEPS][4],
                                          const uint32_t (&ql)[MHA_QSTEPS][4],
                                          const uint16_t *kh, const uint16_t *kl, uint32_t ldk,
                                          uint32_t ns, float (&s)[MHA_KEYS / 8][4])
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, m = lane / 8, r = lane % 8;
    mha_zero(s);
#pragma unroll
    for (uint32_t np = 0; np < MHA_KEYS / 16; np++) {
        const uint32_t row = (16 * np + 8 * (m / 2) + r) * ldk + 8 * (m % 2);
#pragma unroll
        for (uint32_t i = 0; i < MHA_QSTEPS; i++) {
            if (i >= ns)
                continue;
            const uint32_t at = row + 16 * i;
            uint32_t bh[4], bl[4];
            ldsm4(bh, kh + at);
            ldsm4(bl, kl + at);
            mma3b_add(s[2 * np], qh[i], ql[i], bh[0], bh[1], bl[0], bl[1]);
            mma3b_add(s[2 * np + 1], qh[i], ql[i], bh[2], bh[3], bl[2], bl[3]);
        }
    }
}

/* Group: o = alpha o + P V over the staged value planes vh, vl [MHA_KEYS][ldv], 8-column
 * blocks nb < vnb (even), B by ldmatrix .trans (matrix m of lane 8 m + r: key
 * 16 kk + 8 (m % 2) + r, columns 8 (2 np + m / 2) .. +8); each 16-key step's three products
 * in a fresh fragment, added in fp32. */
__device__ static inline void mha2_context(const uint32_t (&ph)[MHA_KEYS / 16][4],
                                           const uint32_t (&pl)[MHA_KEYS / 16][4],
                                           const float (&alpha)[2], const uint16_t *vh,
                                           const uint16_t *vl, uint32_t ldv, uint32_t vnb,
                                           float (&o)[MHA_VNB][4])
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, m = lane / 8, r = lane % 8;
#pragma unroll
    for (uint32_t nb = 0; nb < MHA_VNB; nb++)
#pragma unroll
        for (uint32_t e = 0; e < 4; e++)
            o[nb][e] *= alpha[e / 2];
#pragma unroll
    for (uint32_t np = 0; np < MHA_VNB / 2; np++) {
        if (2 * np >= vnb)
            continue;
#pragma unroll
        for (uint32_t kk = 0; kk < MHA_KEYS / 16; kk++) {
            const uint32_t at = (16 * kk + 8 * (m % 2) + r) * ldv + 8 * (2 * np + m / 2);
            uint32_t bh[4], bl[4];
            ldsm4_t(bh, vh + at);
            ldsm4_t(bl, vl + at);
            mma3b_add(o[2 * np], ph[kk], pl[kk], bh[0], bh[1], bl[0], bl[1]);
            mma3b_add(o[2 * np + 1], ph[kk], pl[kk], bh[2], bh[3], bl[2], bl[3]);
        }
    }
}

/* The smallest and the largest of a and b over the group's lanes */
__device__ static inline void group_min_max(uint32_t a, uint32_t b, uint32_t &lo, uint32_t &hi)
{
    lo = a < b ? a : b;
    hi = a < b ? b : a;
#pragma unroll
    for (int o = KL_GPU_GROUP / 2; o > 0; o /= 2) {
        const uint32_t a = kl_gpu_shfl_xor(lo, o), b = kl_gpu_shfl_xor(hi, o);
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
    }
}

/* grid (query tiles of MHA2_ROWS tokens, the last first; nh), as mha_kernel with the planes
 * pl of a span of `span` keys: group w, tokens t0 = MHA2_ROWS tile + 16 w .. +16, against the
 * block's key tiles, MHA2_STAGES - 1 in flight while one is computed (one barrier a tile:
 * tile k's stage is refilled after the barrier of tile k + 1).  A group computes the tiles up
 * to its largest position (its later ones would add nothing: weights 0, alpha 1), the causal
 * mask only where the tile passes its smallest. */
__global__ static void __launch_bounds__(MHA2_THREADS, 1)
mha2_kernel(kl_gpu_mla_attend_args a, const uint16_t *pl, uint32_t span, kl_gpu_tokens tk)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ float4 shared4[];
    const kl_gpu_mla_dims d = a.d;
    const uint32_t h = blockIdx.y, n = tk.n, tile0 = (gridDim.x - 1 - blockIdx.x) * MHA2_ROWS;
    const uint32_t w = threadIdx.x / KL_GPU_GROUP, g = threadIdx.x % KL_GPU_GROUP / 4;
    const uint32_t ldk = d.dn + d.dr + 8, ldv = d.dv + 8, stage = mha2_stage(d);
    uint16_t *st = (uint16_t *)shared4;
    const uint32_t u_end =
        mha_key_end((uint32_t *)(st + MHA2_STAGES * stage), tk, tile0, MHA2_ROWS);
    const uint32_t t0 = tile0 + 16 * w;
    for (uint32_t k = 0; k + 1 < MHA2_STAGES; k++)
        mha2_fetch(d, pl, span, h, k * MHA_KEYS, u_end, st + k * stage);
    uint32_t qh[MHA_QSTEPS][4], ql[MHA_QSTEPS][4], lo, hi;
    mha_load_q(a.q, d, n, t0, h, qh, ql);
    const uint32_t pos[2] = {tk.tok_pos[t0 + g < n ? t0 + g : n - 1],
                             tk.tok_pos[t0 + g + 8 < n ? t0 + g + 8 : n - 1]};
    group_min_max(pos[0], pos[1], lo, hi);
    const float scale = 1.4426950408889634f / sqrtf((float)(d.dn + d.dr));
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[MHA_VNB][4] = {};
    for (uint32_t u0 = 0, k = 0; u0 < u_end; u0 += MHA_KEYS, k++) {
        copy_wait<MHA2_STAGES - 2>();
        __syncthreads(); /* tile k has landed; tile k - 1's stage is free */
        const uint32_t nk = k + MHA2_STAGES - 1;
        mha2_fetch(d, pl, span, h, nk * MHA_KEYS, u_end, st + nk % MHA2_STAGES * stage);
        if (t0 >= n || u0 > hi)
            continue;
        const uint16_t *kh = st + k % MHA2_STAGES * stage, *kl = kh + MHA_KEYS * ldk;
        const uint16_t *vh = kl + MHA_KEYS * ldk, *vl = vh + MHA_KEYS * ldv;
        float s[MHA_KEYS / 8][4], alpha[2];
        uint32_t ph[MHA_KEYS / 16][4], pw[MHA_KEYS / 16][4];
        mha2_scores(qh, ql, kh, kl, ldk, (d.dn + d.dr) / 16, s);
        mha_softmax<true>(s, u0, pos, scale, u0 + MHA_KEYS - 1 > lo, m, l, alpha, ph, pw);
        mha2_context(ph, pw, alpha, vh, vl, ldv, d.dv / 8, o);
    }
    mha_store(d, n, t0, h, l, o, a.o);
}

static int check_attend(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t, kl_err *err)
{
    if (!a || !a->q || !a->kv_b || !a->kv_b->data || !a->cache || !a->scratch || !a->o)
        return kl_fail(err, KL_E_USAGE, "mla attend: a pointer is NULL");
    if (check_dims("mla attend", &a->d, err) || kl_gpu_tokens_check("mla attend", t, 1, err))
        return err->code;
    const kl_gpu_mla_dims *d = &a->d;
    const kl_gpu_mat *w = a->kv_b;
    if ((w->kind != KL_GPU_W_F32 && w->kind != KL_GPU_W_BF16) ||
        w->rows != d->nh * (d->dn + d->dv) || w->cols != d->R)
        return kl_fail(err, KL_E_USAGE, "mla attend: kv_b must be F32 or BF16 [nh*(dn+dv), R] "
                       "= [%u, %u], is kind %d [%u, %u]", d->nh * (d->dn + d->dv), d->R,
                       (int)w->kind, w->rows, w->cols);
    if (attend_shared(d) > MAX_SHARED)
        return kl_fail(err, KL_E_USAGE, "mla attend: nh %u x (R + dr) %u needs %zu bytes of "
                       "shared memory (at most %u)", d->nh, d->R + d->dr, attend_shared(d),
                       MAX_SHARED);
    if ((uintptr_t)a->scratch % 16 || (uintptr_t)w->data % 16)
        return kl_fail(err, KL_E_USAGE, "mla attend: scratch and kv_b must be 16-byte aligned");
    if (t->n && t->max_span == 0)
        return kl_fail(err, KL_E_USAGE, "mla attend: max_span 0 for %u tokens", t->n);
    return 0;
}

/* v5: decode (runs of one token) where n x max_span <= W5_MAX_SPAN, on the CUDA cores, a warp a
 * row.
 * Why: at short spans attend2 and attend4 are chains of block-wide phases (rows staged, then
 * scores, softmax, context, four barriers a tile) with little work in each; session 18's
 * trace: attend2 21 us a layer at spans 1-64.  Here a block takes W5_HEADS heads of one split;
 * its split's rows (contiguous in the cache) stream through a ring of W5_SLOTS stages of
 * W5_ROWS rows in shared memory, one copy a stage (kernels/bulk.cuh), and each warp takes two
 * rows of every stage with its own online softmax, its queries in registers (lane l: float4
 * columns l, l + 32, ..): a block barrier a stage, and the warps' partial results meet once
 * at the end.  Per row and warp: W5_HEADS dot products of R + dr (sums by shuffles),
 * W5_HEADS x R multiply-adds into the contexts.  The block writes its split's partial (max,
 * sum, context) as attend4 does (rows per split in rp), so combine2 and vb2 follow
 * unchanged. */
#define W5_HEADS     4      /* heads a block (and each of its warps) */
#define W5_WARPS     8
#define W5_ROWS      (2 * W5_WARPS) /* rows a stage */
#define W5_SLOTS     4      /* stages in flight */
#define W5_F4        5      /* float4 of a cache row a lane at most: R + dr <= 640 */
#define W5_RF4       4      /* float4 of the latent a lane at most: R <= 512 */
#define W5_MAX_SPAN  1536   /* n x max_span at most (longer: v4; session 20: v5 ~27 us at
                               1,000 rows against v4's ~33, ~41.5 at 3,000 against ~34.5) */

__device__ static inline float4 w5_axpby(float4 a, float al, float p, float4 v)
{
    return make_float4(a.x * al + p * v.x, a.y * al + p * v.y, a.z * al + p * v.z,
                       a.w * al + p * v.w);
}

/* A row of c4 float4 in shared memory into v (the lane's float4 columns; past the row 0). */
__device__ static inline void w5_row(const float4 *row, uint32_t c4, float4 (&v)[W5_F4])
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP;
#pragma unroll
    for (int f = 0; f < W5_F4; f++)
        v[f] = lane + 32 * f < c4 ? row[lane + 32 * f] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/* The warp's online softmax and contexts take in row v (its scores against heads < nh). */
__device__ static inline void w5_take(const float4 (&q)[W5_HEADS][W5_F4], const float4 (&v)[W5_F4],
                                      uint32_t nh, uint32_t r4, float scale, float (&m)[W5_HEADS],
                                      float (&l)[W5_HEADS], float4 (&acc)[W5_HEADS][W5_RF4])
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP;
#pragma unroll
    for (int i = 0; i < W5_HEADS; i++) {
        float s = 0.0f;
#pragma unroll
        for (int f = 0; f < W5_F4; f++)
            s += q[i][f].x * v[f].x + q[i][f].y * v[f].y + q[i][f].z * v[f].z +
                 q[i][f].w * v[f].w;
        s = kl_gpu_group_sum(s) * scale;
        if ((uint32_t)i >= nh)
            continue;
        const float mn = fmaxf(m[i], s), al = expf(m[i] - mn), p = expf(s - mn);
        m[i] = mn;
        l[i] = l[i] * al + p;
#pragma unroll
        for (int f = 0; f < W5_RF4; f++)
            if (lane + 32 * f < r4)
                acc[i][f] = w5_axpby(acc[i][f], al, p, v[f]);
    }
}

/* The warps' partial results [W5_WARPS] (in shared memory: contexts cs [warp][head][r4], then
 * maxima ms and sums ls [warp][head]) met into the split's: max, sum and context per head. */
__device__ static void w5_meet(const attend_ctx &x, const kl_gpu_mla_dims &d, size_t part,
                               uint32_t h0, uint32_t nh, const float4 *cs, const float *ms,
                               const float *ls)
{
    const uint32_t r4 = d.R / 4;
    for (uint32_t e = threadIdx.x; e < nh * r4; e += blockDim.x) {
        const uint32_t i = e / r4, c = e % r4;
        float mx = -INFINITY;
        for (uint32_t k = 0; k < W5_WARPS; k++)
            mx = fmaxf(mx, ms[k * W5_HEADS + i]);
        float sum = 0.0f; /* a warp without rows: max -inf, weight 0 (mx is finite) */
        float4 ctx = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (uint32_t k = 0; k < W5_WARPS; k++) {
            const float wt = expf(ms[k * W5_HEADS + i] - mx);
            sum += wt * ls[k * W5_HEADS + i];
            ctx = w5_axpby(ctx, 1.0f, wt, cs[(k * W5_HEADS + i) * r4 + c]);
        }
        if (c == 0) {
            x.sc.pm[part * d.nh + h0 + i] = mx;
            x.sc.pl[part * d.nh + h0 + i] = sum;
        }
        ((float4 *)(x.sc.pc + (part * d.nh + h0 + i) * d.R))[c] = ctx;
    }
}

/* grid (splits, n, head groups of W5_HEADS): split blockIdx.x of token blockIdx.y's span (whole
 * multiples of W5_WARPS rows, written to rp), heads W5_HEADS blockIdx.z ..; shared memory
 * w5_shared: the ring, then (the same bytes) the warps' partial results for w5_meet. */
__global__ static void __launch_bounds__(W5_WARPS * KL_GPU_GROUP, 1)
attend5_kernel(kl_gpu_mla_attend_args a, attend_ctx x)
{
    KL_GPU_GRID_WAIT(); /* the span's last row is the append's */
    extern __shared__ float4 shared4[];
    __shared__ uint64_t bar[W5_SLOTS];
    const kl_gpu_mla_dims d = a.d;
    const uint32_t t = blockIdx.y, c4 = (d.R + d.dr) / 4, r4 = d.R / 4;
    const uint32_t h0 = blockIdx.z * W5_HEADS, nh = d.nh - h0 < W5_HEADS ? d.nh - h0 : W5_HEADS;
    const uint32_t span = x.tok_pos[t] + 1;
    const uint32_t rows_per = split_rows(span, gridDim.x, W5_WARPS, 1);
    const uint32_t u_begin = blockIdx.x * rows_per;
    if (blockIdx.x == 0 && blockIdx.z == 0 && threadIdx.x == 0)
        x.sc.rp[t] = rows_per;
    if (u_begin >= span)
        return;
    const uint32_t rows = (span - u_begin < rows_per ? span : u_begin + rows_per) - u_begin;
    const uint32_t row_bytes = c4 * 16, slot_bytes = W5_ROWS * row_bytes;
    const uint32_t stages = (rows + W5_ROWS - 1) / W5_ROWS;
    const uint8_t *src = (const uint8_t *)a.cache[x.tok_slot[t]] + (size_t)u_begin * row_bytes;
    uint8_t *ring = (uint8_t *)shared4;
    auto bytes_of = [&](uint32_t k) { /* stage k's rows, the last one short */
        const uint32_t left = rows - k * W5_ROWS;
        return (left < W5_ROWS ? left : W5_ROWS) * row_bytes;
    };
    if (threadIdx.x == 0) {
        bulk_init(bar, W5_SLOTS);
        for (uint32_t k = 0; k < W5_SLOTS && k < stages; k++)
            bulk_load(ring + k * slot_bytes, src + (size_t)k * slot_bytes, bytes_of(k), &bar[k]);
    }
    const uint32_t w = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    const float4 *qf = (const float4 *)(x.sc.ql + ((size_t)t * d.nh + h0) * (d.R + d.dr));
    float4 q[W5_HEADS][W5_F4], acc[W5_HEADS][W5_RF4];
    float m[W5_HEADS], l[W5_HEADS];
#pragma unroll
    for (int i = 0; i < W5_HEADS; i++) {
#pragma unroll
        for (int f = 0; f < W5_F4; f++)
            q[i][f] = (uint32_t)i < nh && lane + 32 * f < c4
                          ? qf[i * c4 + lane + 32 * f]
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int f = 0; f < W5_RF4; f++)
            acc[i][f] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        m[i] = -INFINITY, l[i] = 0.0f;
    }
    __syncthreads(); /* the barriers initialised */
    for (uint32_t k = 0; k < stages; k++) {
        const uint32_t s = k % W5_SLOTS, r0 = k * W5_ROWS + w;
        uint8_t *slot = ring + s * slot_bytes;
        bulk_wait(&bar[s], k / W5_SLOTS, slot, src + (size_t)k * slot_bytes, bytes_of(k));
        float4 v0[W5_F4], v1[W5_F4];
        w5_row((const float4 *)(slot + w * row_bytes), c4, v0);
        w5_row((const float4 *)(slot + (w + W5_WARPS) * row_bytes), c4, v1);
        if (r0 < rows)
            w5_take(q, v0, nh, r4, x.scale, m, l, acc);
        if (r0 + W5_WARPS < rows)
            w5_take(q, v1, nh, r4, x.scale, m, l, acc);
        __syncthreads(); /* every read of slot s done */
        if (threadIdx.x == 0 && k + W5_SLOTS < stages)
            bulk_load(slot, src + (size_t)(k + W5_SLOTS) * slot_bytes, bytes_of(k + W5_SLOTS),
                      &bar[s]);
    }
    /* the ring's bytes (every copy waited for, every read done) take the partial results */
    float4 *cs = shared4;
    float *ms = (float *)(cs + (size_t)W5_WARPS * W5_HEADS * r4), *ls = ms + W5_WARPS * W5_HEADS;
#pragma unroll
    for (int i = 0; i < W5_HEADS; i++) {
        if (lane == 0)
            ms[w * W5_HEADS + i] = m[i], ls[w * W5_HEADS + i] = l[i];
#pragma unroll
        for (int f = 0; f < W5_RF4; f++)
            if (lane + 32 * f < r4)
                cs[(w * W5_HEADS + i) * r4 + lane + 32 * f] = acc[i][f];
    }
    __syncthreads();
    w5_meet(x, d, (size_t)t * gridDim.x + blockIdx.x, h0, nh, cs, ms, ls);
}

static size_t w5_shared(const kl_gpu_mla_dims *d)
{
    const size_t ring = (size_t)W5_SLOTS * W5_ROWS * (d->R + d->dr) * sizeof(float);
    const size_t meet = (size_t)W5_WARPS * W5_HEADS * (d->R + 2) * sizeof(float);
    return ring > meet ? ring : meet;
}

static bool v5_fits(const kl_gpu_mla_dims *d)
{
    return d->nh <= H2_MAX && d->R % 4 == 0 && d->dr % 4 == 0 && d->R <= 128 * W5_RF4 &&
           d->R + d->dr <= 128 * W5_F4 && w5_shared(d) <= MAX_SHARED;
}

/* Raises kernel fn's dynamic shared memory limit to `need` bytes when *set is below it.  The
 * opt-in is a setting of the function, not a stream operation: made when a launch first needs
 * more than before, so a captured decode step makes none. */
static int allow_shared(const void *fn, size_t *set, size_t need, kl_err *err)
{
    if (need <= *set)
        return 0;
    if (KL_GPU_CHECK(err, hipFuncSetAttribute(fn, hipFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)need)))
        return err->code;
    *set = need;
    return 0;
}

/* The attention's context for `splits` splits per token (v1: of split_rows rows each). */
static attend_ctx make_ctx(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t,
                           uint32_t splits, uint32_t split_rows)
{
    const kl_gpu_mla_dims *d = &a->d;
    const attend_ctx x = {t->tok_slot, t->tok_pos, carve(a->scratch, d, t->n, splits),
                          split_rows, 1.0f / sqrtf((float)(d->dn + d->dr))};
    return x;
}

static int attend_v1(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t, hipStream_t st,
                     kl_err *err)
{
    const kl_gpu_mla_dims *d = &a->d;
    const split_plan sp = plan_splits(t->max_span);
    const attend_ctx x = make_ctx(a, t, sp.n, sp.rows);
    static size_t shared_set;
    const size_t shared = attend_shared(d);
    if (allow_shared((const void *)attend_kernel, &shared_set, shared, err))
        return err->code;
    dim3 g_abs((d->R + ABS_COLS * VEC - 1) / (ABS_COLS * VEC), d->nh,
               (t->n + ABS_TOKENS - 1) / ABS_TOKENS);
    absorb_kernel<<<g_abs, ABS_COLS * ABS_ROWS, 0, st>>>(*a, *a->kv_b, t->n, x.sc.ql);
    attend_kernel<<<dim3(sp.n, t->n), ATT_THREADS, shared, st>>>(*a, x);
    combine_kernel<<<dim3(d->nh, t->n), 128, 0, st>>>(*d, x, sp.n);
    dim3 g_vb((d->nh * d->dv + VB_GROUPS - 1) / VB_GROUPS, (t->n + VB_TOKENS - 1) / VB_TOKENS);
    vb_kernel<<<g_vb, VB_GROUPS * KL_GPU_GROUP, 0, st>>>(*a, *a->kv_b, t->n, x.sc.ctx);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* v2 and v3: absorb2 into x->sc.ql, then (between) the attention, then combine2 and vb2 */
static void absorb2(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t, const attend_ctx *x,
                    hipStream_t st)
{
    const kl_gpu_mla_dims *d = &a->d;
    dim3 g_abs((d->R + A2_COLS - 1) / A2_COLS, d->nh, (t->n + A2_TOK - 1) / A2_TOK);
    absorb2_kernel<<<g_abs, A2_RG * A2_COLS / VEC, 0, st>>>(*a, *a->kv_b, t->n, x->sc.ql);
}

static int combine_vb2(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t,
                       const attend_ctx *x, uint32_t splits, bool v3, hipStream_t st,
                       kl_err *err)
{
    const kl_gpu_mla_dims *d = &a->d;
    dim3 g_comb(d->nh, (d->R + C2_COLS - 1) / C2_COLS, t->n);
    combine2_kernel<<<g_comb, C2_THREADS, 0, st>>>(*d, *x, splits, v3);
    dim3 g_vb((d->dv + V2_ROWS - 1) / V2_ROWS, d->nh, (t->n + V2_TOK - 1) / V2_TOK);
    vb2_kernel<<<g_vb, V2_ROWS / 2 * KL_GPU_GROUP, 0, st>>>(*a, *a->kv_b, t->n, x->sc.ctx);
    return KL_GPU_CHECK(err, hipGetLastError());
}

static int attend_v2(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t, hipStream_t st,
                     kl_err *err)
{
    const kl_gpu_mla_dims *d = &a->d;
    const uint32_t splits = splits2(t->n, t->max_span);
    const attend_ctx x = make_ctx(a, t, splits, 0);
    static size_t shared_set;
    const size_t shared = attend2_shared(d);
    if (allow_shared((const void *)attend2_kernel, &shared_set, shared, err))
        return err->code;
    absorb2(a, t, &x, st);
    const dim3 grid(splits, t->n, attend2_groups(splits * t->n));
    attend2_kernel<<<grid, ATT_THREADS, shared, st>>>(*a, x);
    return combine_vb2(a, t, &x, splits, false, st, err);
}

/* v3: blocks of T3_ROWS / nh tokens of a run; splits from the blocks' count (T3_MIN_TILES
 * tiles of T3_KEYS rows each at least, in TILE units for splits_for); split: the exact form
 * (attend3s), else v3fast. */
static int attend_v3(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t, bool split,
                     hipStream_t st, kl_err *err)
{
    const kl_gpu_mla_dims *d = &a->d;
    const uint32_t tb = T3_ROWS / d->nh, groups = (t->max_run + tb - 1) / tb;
    const uint32_t splits = splits_for(t->n_runs * groups, t->max_span,
                                       T3_MIN_TILES * T3_KEYS / TILE);
    const attend_ctx x = make_ctx(a, t, splits, 0);
    static size_t shared_set[2];
    const size_t shared = attend3_shared(d, split);
    const void *fn = split ? (const void *)attend3s_kernel : (const void *)attend3_kernel;
    if (allow_shared(fn, &shared_set[split], shared, err))
        return err->code;
    absorb2(a, t, &x, st);
    const dim3 grid(splits, t->n_runs, groups);
    if (split)
        attend3s_kernel<<<grid, T3_THREADS, shared, st>>>(*a, x, *t);
    else
        attend3_kernel<<<grid, T3_THREADS, shared, st>>>(*a, x, *t);
    return combine_vb2(a, t, &x, splits, true, st, err);
}


/* v4's splits per token: one wave of blocks (1 per multiprocessor) over the n tokens, at most
 * one per T4_MIN_TILES tiles of the longest span, and never more than the scratch holds (v2's
 * count). */
static uint32_t splits4(uint32_t n, uint32_t max_span)
{
    const uint32_t sms = kl_gpu_sm_count(), wave = n < sms ? sms / n : 1;
    const uint32_t b = splits_bound(max_span, T4_MIN_TILES * T4_KEYS / TILE);
    const uint32_t s = wave < b ? wave : b, s2 = splits2(n, max_span);
    return s < s2 ? s : s2;
}

/* v4: decode, every run one token: absorb2, attend4, combine2 and vb2. */
static int attend_v4(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t, hipStream_t st,
                     kl_err *err)
{
    const uint32_t splits = splits4(t->n, t->max_span);
    const attend_ctx x = make_ctx(a, t, splits, 0);
    static size_t shared_set;
    const size_t shared = attend4_shared(&a->d);
    if (allow_shared((const void *)attend4_kernel, &shared_set, shared, err))
        return err->code;
    absorb2(a, t, &x, st);
    attend4_kernel<<<dim3(splits, t->n), T4_THREADS, shared, st>>>(*a, x);
    return combine_vb2(a, t, &x, splits, true, st, err);
}

/* v5's splits a token: a wave of blocks (n x groups of heads each), W5_WARPS rows each at
 * least, within v2's scratch (splits2). */
static uint32_t splits5(uint32_t n, uint32_t groups, uint32_t max_span)
{
    const uint32_t blocks = n * groups, sms = kl_gpu_sm_count();
    const uint32_t wave = blocks < sms ? sms / blocks : 1;
    const uint32_t by_rows = (max_span + W5_WARPS - 1) / W5_WARPS, s2 = splits2(n, max_span);
    const uint32_t s = wave < by_rows ? wave : by_rows;
    return s < s2 ? s : s2;
}

/* v5: decode, every run one token, n x max_span <= W5_MAX_SPAN: absorb2, attend5 (splits5),
 * combine2, vb2. */
static int attend_v5(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t, hipStream_t st,
                     kl_err *err)
{
    const uint32_t groups = (a->d.nh + W5_HEADS - 1) / W5_HEADS;
    const uint32_t splits = splits5(t->n, groups, t->max_span);
    const attend_ctx x = make_ctx(a, t, splits, 0);
    const size_t shared = w5_shared(&a->d);
    static size_t shared_set;
    if (allow_shared((const void *)attend5_kernel, &shared_set, shared, err))
        return err->code;
    absorb2(a, t, &x, st);
    attend5_kernel<<<dim3(splits, t->n, groups), W5_WARPS * KL_GPU_GROUP, shared, st>>>(*a, x);
    return combine_vb2(a, t, &x, splits, true, st, err);
}

static int mha_version; /* 0: not chosen yet; 1 mha_kernel, 2 mha2_kernel */

extern "C" void kl_gpu_mla_mha_set(int version)
{
    mha_version = version == 1 || version == 2 ? version : 0;
}

/* Whether the MHA form runs v2: KL_GPU_MLA_MHA=v1 in the environment (read at the first call)
 * or the setter's 1 keep v1; v2 needs dv a multiple of 16 (pairs of 8-column blocks). */
static bool mha2_fits(const kl_gpu_mla_dims *d)
{
    if (!mha_version) {
        const char *e = getenv("KL_GPU_MLA_MHA");
        mha_version = e && !strcmp(e, "v1") ? 1 : 2;
    }
    return mha_version == 2 && d->dv % 16 == 0 && mha2_shared(d) <= MAX_SHARED;
}

/* The MHA form: the run's latent rows copied out, expanded to keys and values by
 * kl_gpu_gemm_p (exact to ~5e-7), attended by mha2_kernel (the keys and values split into
 * bf16 planes first by mha_planes_kernel) or v1's mha_kernel. */
static int attend_mha(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t, hipStream_t st,
                      kl_err *err)
{
    const kl_gpu_mla_dims *d = &a->d;
    const uint32_t span = t->max_span;
    mha_scratch sc;
    mha_floats(d, span, &sc, a->scratch);
    static size_t shared_set[2];
    const bool v2 = mha2_fits(d);
    const size_t shared = v2 ? mha2_shared(d) : mha_shared(d);
    if (allow_shared(v2 ? (const void *)mha2_kernel : (const void *)mha_kernel, &shared_set[v2],
                     shared, err))
        return err->code;
    mha_rows_kernel<<<span, KL_GPU_GROUP, 0, st>>>(a->cache, t->run_slot, d->R, d->R + d->dr,
                                                   sc.rows);
    if (KL_GPU_CHECK(err, hipGetLastError()) ||
        kl_gpu_gemm_p(a->kv_b, sc.rows, span, sc.kv, sc.parts, 0, (kl_gpu_stream)st, err))
        return err->code;
    if (mha2_fits(d)) {
        mha_planes_kernel<<<span, 4 * KL_GPU_GROUP, 0, st>>>(*d, sc.kv, a->cache, t->run_slot,
                                                              span, sc.planes);
        const dim3 grid((t->n + MHA2_ROWS - 1) / MHA2_ROWS, d->nh);
        mha2_kernel<<<grid, MHA2_THREADS, shared, st>>>(*a, sc.planes, span, *t);
    } else {
        const dim3 grid((t->n + MHA_ROWS - 1) / MHA_ROWS, d->nh);
        mha_kernel<<<grid, MHA_THREADS, shared, st>>>(*a, sc.kv, *t);
    }
    return KL_GPU_CHECK(err, hipGetLastError());
}

static int mla_prefill; /* 0: not chosen yet; 1 MHA form, 2 latent (v3) */

extern "C" void kl_gpu_mla_prefill_set(int mode)
{
    mla_prefill = mode == 1 || mode == 2 ? mode : 0;
}

/* KL_GPU_MLA_PREFILL=latent in the environment (read at the first call) or the setter's 2:
 * prompts stay in latent space; else the MHA form where it fits. */
static bool prefill_mha(void)
{
    if (!mla_prefill) {
        const char *e = getenv("KL_GPU_MLA_PREFILL");
        mla_prefill = e && !strcmp(e, "latent") ? 2 : 1;
    }
    return mla_prefill == 1;
}

/* The MHA form's limits on the shape (CUDA only: HIP keeps the latent kernels). */
static bool mha_fits(const kl_gpu_mla_dims *d)
{
#if defined(__HIPCC__)
    (void)d;
    return false;
#else
    const uint32_t qw = d->dn + d->dr;
    return qw % 16 == 0 && qw <= 16 * MHA_QSTEPS && d->dv % 8 == 0 && d->dv <= 8 * MHA_VNB &&
           d->dn % 4 == 0 && d->R % 32 == 0 && mha_shared(d) <= MAX_SHARED;
#endif
}

static uint32_t mha_span; /* 0: not read yet; else the longest span in MHA form */

extern "C" void kl_gpu_mla_mha_span_set(uint32_t span)
{
    mha_span = span ? (span < MHA_MIN_N ? MHA_MIN_N : span > MHA_SPAN_CAP ? MHA_SPAN_CAP : span)
                    : 0;
}

/* The longest span a chunk runs in MHA form over: KL_GPU_MLA_MHA_SPAN (read at the first
 * call) or the setter's, within [MHA_MIN_N, MHA_SPAN_CAP]; MHA_MAX_SPAN by default. */
static uint32_t mha_span_max(void)
{
    if (!mha_span) {
        const char *e = getenv("KL_GPU_MLA_MHA_SPAN");
        const unsigned long v = e ? strtoul(e, NULL, 10) : 0;
        kl_gpu_mla_mha_span_set(v ? (uint32_t)(v < MHA_SPAN_CAP ? v : MHA_SPAN_CAP)
                                  : MHA_MAX_SPAN);
    }
    return mha_span;
}

/* Whether a chunk runs in MHA form: the prefill of one prompt (one run of MHA_MIN_N tokens at
 * least) over a span of mha_span_max() at most, kv_b BF16, under v4 with the MHA form chosen
 * and the shape within its limits; n and max_span as kl_gpu_mla_scratch sees them. */
static bool mha_applies(const kl_gpu_mla_dims *d, uint32_t n, uint32_t max_span)
{
    return n >= MHA_MIN_N && max_span <= mha_span_max() && version_for(d) == 5 &&
           prefill_mha() && mha_fits(d);
}

static int mla_version; /* 0: not chosen yet; else 1, 2, 3, 4 (v3fast), 5 (v4) or 6 (v5) */

extern "C" void kl_gpu_mla_select(int version)
{
    mla_version = version >= 1 && version <= 6 ? version : 0;
}

static bool v2_fits(const kl_gpu_mla_dims *d)
{
    return d->nh <= H2_MAX && d->R <= R2_MAX && attend2_shared(d) <= MAX_SHARED;
}

/* split: the exact form, whose next tile (T3_PF float4 per thread) sits in registers */
static bool v3_fits(const kl_gpu_mla_dims *d, bool split)
{
    const size_t tile4 = (size_t)T3_KEYS * ld3(d->R + d->dr) / 4;
    return v2_fits(d) && d->nh <= T3_ROWS && d->R % 16 == 0 && d->R <= 64 * T3_FRAGS &&
           attend3_shared(d, split) <= MAX_SHARED && (!split || tile4 <= T3_PF * T3_THREADS);
}

static bool v4_fits(const kl_gpu_mla_dims *d)
{
    return v2_fits(d) && d->nh <= T4_ROWS && d->R <= 64 * T4_NB &&
           (d->R + d->dr + 15) / 16 <= T4_WARPS * T4_QSTEPS && attend4_shared(d) <= MAX_SHARED;
}

/* The kernels to run: KL_GPU_MLA=v1|v2|v3|v3fast|v4|v5 in the environment (read at the first
 * call; v5 otherwise) or kl_gpu_mla_select's (4: v3fast, 5: v4, 6: v5); a version whose limits
 * d passes falls back to the next lower one that fits (v4: v3, v3 and v3fast: v2).  v5 is v4
 * but for decode where n x max_span <= W5_MAX_SPAN (kl_gpu_mla_attend): this returns 5 for it. */
static int version_for(const kl_gpu_mla_dims *d)
{
    if (!mla_version) {
        const char *e = getenv("KL_GPU_MLA");
        mla_version = e && !strcmp(e, "v1")       ? 1
                      : e && !strcmp(e, "v2")     ? 2
                      : e && !strcmp(e, "v3")     ? 3
                      : e && !strcmp(e, "v3fast") ? 4
                      : e && !strcmp(e, "v4")     ? 5
                                                  : 6;
    }
    const int top = mla_version == 6 ? 5 : mla_version;
    if (top == 5 && v4_fits(d))
        return 5;
    const int v = top == 5 ? 3 : top;
    if (v >= 3 && v3_fits(d, v == 3))
        return v;
    return v >= 2 && v2_fits(d) ? 2 : 1;
}

/* Whether v5 runs n tokens of runs of one over spans up to max_span (a block's rows: ~ n
 * max_span W5_HEADS / (nh sms)). */
static bool v5_takes(const kl_gpu_mla_dims *d, uint32_t n, uint32_t max_span)
{
    version_for(d); /* mla_version chosen */
    return mla_version == 6 && (uint64_t)n * max_span <= W5_MAX_SPAN && v5_fits(d);
}

extern "C" uint32_t kl_gpu_mla_graph_span(const kl_gpu_mla_dims *d, uint32_t span, uint32_t cap)
{
    return v5_takes(d, 1, span) && cap > W5_MAX_SPAN ? W5_MAX_SPAN : cap;
}

extern "C" int kl_gpu_mla_attend(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t,
                                 kl_gpu_stream s, kl_err *err)
{
    if (check_attend(a, t, err))
        return err->code;
    if (t->n == 0)
        return 0;
    int v = version_for(&a->d);
    if (t->max_run == 1 && v5_takes(&a->d, t->n, t->max_span))
        return attend_v5(a, t, (hipStream_t)s, err);
    if (v == 5 && t->max_run > 1) { /* chunks of a prompt: the MHA form, else v3, else v2 */
        if (t->n_runs == 1 && a->kv_b->kind == KL_GPU_W_BF16 &&
            mha_applies(&a->d, t->n, t->max_span))
            return attend_mha(a, t, (hipStream_t)s, err);
        v = v3_fits(&a->d, true) ? 3 : 2;
    }
    if (v >= 3 && t->max_run == 1 && t->max_span < V3_MIN_SPAN)
        v = 2; /* one token per run over a short span: v3's fixed costs outweigh its gain */
    return v == 5 ? attend_v4(a, t, (hipStream_t)s, err)
           : v >= 3 ? attend_v3(a, t, v == 3, (hipStream_t)s, err)
           : v == 2 ? attend_v2(a, t, (hipStream_t)s, err)
                    : attend_v1(a, t, (hipStream_t)s, err);
}
