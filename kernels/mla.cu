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
 * Scratch (floats): ql [n][nh][R], ctx [n][nh][R], then per (token, split, head) the max,
 * the sum and the context [R].
 */
#include "kernels/gpu.h"
#include "kernels/mla.h"
#include "kernels/tokens.h"

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

/* grid n, one lane group per token: row tok_pos of the slot's cache = [RMSNorm(c), k_r] */
__global__ static void append_kernel(kl_gpu_mla_append_args a, const uint32_t *tok_slot,
                                     const uint32_t *tok_pos)
{
    const uint32_t t = blockIdx.x, R = a.d.R, cw = a.d.R + a.d.dr;
    const float *x = a.kva + (size_t)t * cw;
    float *row = a.cache[tok_slot[t]] + (size_t)tok_pos[t] * cw;
    float ss = 0.0f;
    for (uint32_t k = threadIdx.x; k < R; k += KL_GPU_GROUP)
        ss += x[k] * x[k];
    ss = kl_gpu_group_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)R + 1e-6f);
    for (uint32_t k = threadIdx.x; k < R; k += KL_GPU_GROUP)
        row[k] = a.kv_norm[k] * (x[k] * inv);
    for (uint32_t k = R + threadIdx.x; k < cw; k += KL_GPU_GROUP)
        row[k] = x[k];
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
    if (t->n == 0)
        return 0;
    append_kernel<<<t->n, KL_GPU_GROUP, 0, (hipStream_t)s>>>(*a, t->tok_slot, t->tok_pos);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ------------------------------------------------------------------------------------------ */
/* Attend                                                                                     */

/* How a launch cuts spans: splits of `rows` rows (whole tiles), at most `n` per token. */
typedef struct split_plan {
    uint32_t n, rows;
} split_plan;

/* Splits of a span of max_span rows at most: one per SPLIT_TILES tiles, 1 .. MAX_SPLITS. */
static uint32_t splits_bound(uint32_t max_span)
{
    uint64_t n = ((uint64_t)max_span + TILE * SPLIT_TILES - 1) / (TILE * SPLIT_TILES);
    return n == 0 ? 1 : n < MAX_SPLITS ? (uint32_t)n : MAX_SPLITS;
}

/* max_span >= 1: splits of whole tiles, as few tiles each as keeps them within the bound. */
static split_plan plan_splits(uint32_t max_span)
{
    const uint64_t tiles = ((uint64_t)max_span + TILE - 1) / TILE, b = splits_bound(max_span);
    split_plan p;
    p.rows = (uint32_t)(TILE * ((tiles + b - 1) / b));
    p.n = (uint32_t)(((uint64_t)max_span + p.rows - 1) / p.rows); /* <= b: the scratch holds them */
    return p;
}

/* Where each part of the scratch lies for n tokens and a split plan. */
typedef struct mla_scratch {
    float *ql, *ctx;   /* [n][nh][R] each */
    float *pc;         /* [n][splits][nh][R] partial context (16-byte aligned: R % 4 == 0) */
    float *pm, *pl;    /* [n][splits][nh] partial max, sum */
} mla_scratch;

static mla_scratch carve(float *p, const kl_gpu_mla_dims *d, uint32_t n, uint32_t splits)
{
    const size_t q = (size_t)n * d->nh * d->R, part = (size_t)n * splits * d->nh;
    mla_scratch s = {p, p + q, p + 2 * q, p + 2 * q + part * d->R, p + 2 * q + part * (d->R + 1)};
    return s;
}

extern "C" size_t kl_gpu_mla_scratch(const kl_gpu_mla_dims *d, uint32_t n, uint32_t max_span)
{
    return (size_t)n * d->nh * (2 * (size_t)d->R + (size_t)splits_bound(max_span) * (d->R + 2));
}

/* grid (R / (ABS_COLS * VEC), nh, token groups): columns of head h's absorbed queries.  Thread
 * (row group rg, column group cg) sums rows i = rg, rg + ABS_ROWS, .. of W_kb,h over its VEC
 * columns; the row groups' sums are added in shared memory in order. */
__global__ static void __launch_bounds__(ABS_COLS * ABS_ROWS)
absorb_kernel(kl_gpu_mla_attend_args a, kl_gpu_mat kv_b, uint32_t n, float *ql)
{
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

extern "C" int kl_gpu_mla_attend(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t,
                                 kl_gpu_stream s, kl_err *err)
{
    if (check_attend(a, t, err))
        return err->code;
    if (t->n == 0)
        return 0;
    const kl_gpu_mla_dims *d = &a->d;
    const hipStream_t st = (hipStream_t)s;
    const split_plan sp = plan_splits(t->max_span);
    attend_ctx x = {t->tok_slot, t->tok_pos, carve(a->scratch, d, t->n, sp.n), sp.rows,
                    1.0f / sqrtf((float)(d->dn + d->dr))};
    /* The shared-memory opt-in is a setting of the function, not a stream operation: made
     * when a launch first needs more than before, so a captured decode step makes none. */
    static size_t shared_set;
    const size_t shared = attend_shared(d);
    if (shared > shared_set) {
        if (KL_GPU_CHECK(err, hipFuncSetAttribute((const void *)attend_kernel,
                                                  hipFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)shared)))
            return err->code;
        shared_set = shared;
    }
    dim3 g_abs((d->R + ABS_COLS * VEC - 1) / (ABS_COLS * VEC), d->nh,
               (t->n + ABS_TOKENS - 1) / ABS_TOKENS);
    absorb_kernel<<<g_abs, ABS_COLS * ABS_ROWS, 0, st>>>(*a, *a->kv_b, t->n, x.sc.ql);
    attend_kernel<<<dim3(sp.n, t->n), ATT_THREADS, shared, st>>>(*a, x);
    combine_kernel<<<dim3(d->nh, t->n), 128, 0, st>>>(*d, x, sp.n);
    dim3 g_vb((d->nh * d->dv + VB_GROUPS - 1) / VB_GROUPS, (t->n + VB_TOKENS - 1) / VB_TOKENS);
    vb_kernel<<<g_vb, VB_GROUPS * KL_GPU_GROUP, 0, st>>>(*a, *a->kv_b, t->n, x.sc.ctx);
    return KL_GPU_CHECK(err, hipGetLastError());
}
