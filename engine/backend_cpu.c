/*
 * engine/backend_cpu.c — the CPU backend (engine/backend.h): the forward pass of
 * kimi-linear.md §3 on host weights, fp32 activations, as block-level operations on one chunk.
 *
 * Sections: dimensions and scratch; the backend's state; passes over the pool; elementwise
 * helpers; KDA; MLA; FFN (dense, MoE); slots; the chunk's operations; the backend object.
 *
 * A chunk holds up to KL_FORWARD_CHUNK tokens of one or more sequences, each sequence's tokens
 * one run (the batch's rule).  Activations of a chunk are row-major [tokens, width] matrices,
 * so every projection is one kl_wmat_matmul (engine/matvec.h) over all of the chunk's tokens,
 * whatever sequence they belong to.  What is sequential in the model stays sequential per token
 * within its run, on its slot's state (conv windows, the delta rule, causal attention over the
 * slot's latent cache); what is independent runs in parallel (KDA and MLA heads over the pool).
 * No value of a token depends on the other tokens of its chunk except through the model's own
 * causal dependencies, and each is computed in the same order whatever the chunk: that is
 * what makes logits bit-identical for any split of a prompt and any mix of sequences.
 *
 * Scratch (chunk buffers, routing ints, attention weights, one row of logits) belongs to the
 * backend; the state of a sequence (conv windows, delta-rule state, MLA latent cache) to its
 * slot.
 */
#include "engine/backend.h"
#include "engine/backend_tp.h"

#include "common/grow.h"
#include "common/mem.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/sampler.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Dimensions and scratch                                                                     */

#define CHUNK    KL_FORWARD_CHUNK
#define MAX_TOPK 64   /* larger configs are refused */
#define KB_ROWS  8    /* rows of W_kb applied to a token's query in one pass */
#define MLA_PARTS 4   /* token parts per head of the MLA query and output passes, at most */
#define PIECE    64   /* cache rows whose scores or weights one pass handles */

typedef struct dims {
    size_t hidden, vocab;
    size_t kh, kd, kD, kw;        /* KDA heads, head dim, heads*dim, conv kernel */
    size_t nh, dn, dr, dv, R;     /* MLA heads, nope, rope, v dims, kv_lora_rank */
    size_t E, topk;               /* routed experts, experts per token */
    size_t wide;                  /* widest attention projection or gate */
    size_t low;                   /* widest low-rank output (KDA gate ranks, MLA kv_a) */
    size_t ffn;                   /* FFN intermediate floats per token: the dense MLP's, or
                                     top_k routed experts' plus the shared experts' */
    size_t head_floats;           /* MLA scratch per head: [CHUNK, R] + [MLA_PARTS, KB_ROWS,
                                     R] + [CHUNK, dv] */
} dims;

typedef struct bufs {
    float *x, *xn, *y;            /* [T, hidden] residual stream, normed input, block output */
    float *q, *k, *v, *f, *g, *o; /* [T, wide] projections, gates, attention output */
    float *lr, *lr2;              /* [T, low] low-rank gate inputs / MLA kv_a output */
    float *beta;                  /* [T, kh] KDA beta */
    float *heads;                 /* [nh, head_floats] MLA per-head scratch */
    float *h1, *h2;               /* [T, ffn] FFN intermediates (MoE: routed rows in list
                                     order, then the shared experts' [T, shared inter]) */
    float *xe;                    /* [T * topk, hidden] routed tokens in list order */
    float *eo;                    /* [T * topk, hidden] routed expert outputs, list order */
    float *ys;                    /* [T, hidden] shared experts' output */
    float *router;                /* [T, E] router logits, then sigmoid scores */
    float *sel;                   /* [E] one token's selection scores */
    float *wt;                    /* [T, topk] routing weights */
    int32_t *idx;                 /* [T, topk] chosen experts */
    int32_t *list;                /* [T * topk] slots (t * topk + k) grouped by expert */
    int32_t *inv;                 /* [T * topk] position of each slot in list */
    int32_t *start;               /* [E + 1] first entry of each expert in list */
} bufs;

static size_t max2(size_t a, size_t b)
{
    return a > b ? a : b;
}

static void get_dims(const kl_model *m, dims *d)
{
    const kl_config *c = &m->cfg;
    d->hidden = c->hidden_size;
    d->vocab = c->vocab_size;
    d->kh = c->kda_num_heads;
    d->kd = c->kda_head_dim;
    d->kD = d->kh * d->kd;
    d->kw = c->kda_conv_kernel;
    d->nh = c->num_attention_heads;
    d->dn = c->qk_nope_head_dim;
    d->dr = c->qk_rope_head_dim;
    d->dv = c->v_head_dim;
    d->R = c->kv_lora_rank;
    d->E = c->num_experts;
    d->topk = c->num_experts_per_token;
    kl_model_widths w;
    kl_model_widths_get(m, &w);
    d->wide = (size_t)w.wide;
    d->low = (size_t)w.low;
    d->ffn = max2((size_t)w.mlp, d->topk * (size_t)w.routed + (size_t)w.shared);
    d->head_floats = CHUNK * d->R + MLA_PARTS * KB_ROWS * d->R + CHUNK * d->dv;
}

/* Carves p into the chunk buffers; returns the floats they take (p NULL: just the count). */
static size_t carve(float *p, const dims *d, bufs *b)
{
    size_t T = CHUNK, H = d->hidden;
    struct { float **buf; size_t n; } t[] = {
        {&b->x, T * H}, {&b->xn, T * H}, {&b->y, T * H},
        {&b->q, T * d->wide}, {&b->k, T * d->wide}, {&b->v, T * d->wide},
        {&b->f, T * d->wide}, {&b->g, T * d->wide}, {&b->o, T * d->wide},
        {&b->lr, T * d->low}, {&b->lr2, T * d->low}, {&b->beta, T * d->kh},
        {&b->heads, d->nh * d->head_floats}, {&b->h1, T * d->ffn}, {&b->h2, T * d->ffn},
        {&b->xe, T * d->topk * H}, {&b->eo, T * d->topk * H}, {&b->ys, T * H},
        {&b->router, T * d->E}, {&b->sel, d->E}, {&b->wt, T * d->topk},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        *t[i].buf = p ? p + total : NULL;
        total += t[i].n;
    }
    return total;
}

static size_t route_ints(const dims *d)
{
    return 3 * CHUNK * d->topk + d->E + 1;
}

static void carve_ints(int32_t *p, const dims *d, bufs *b)
{
    b->idx = p;
    b->list = p + CHUNK * d->topk;
    b->inv = p + 2 * CHUNK * d->topk;
    b->start = p + 3 * CHUNK * d->topk;
}

/* ------------------------------------------------------------------------------------------ */
/* The backend's state: slots, the chunk                                                      */

/* The state of one sequence in one layer. */
typedef struct kda_state {
    float *conv[3];   /* q, k, v: [D, conv_kernel-1] fp32, column 0 = oldest input */
    float *S;         /* [heads, K, V] fp32 delta-rule state, S[h][i][j] (key i, value j) */
} kda_state;

typedef struct mla_cache {
    float  *c;        /* [cap, kv_lora_rank + qk_rope_head_dim] fp32: kv_a_layernorm'd latent,
                         then the un-normalised shared rope key; rows beyond the slot's length
                         (plus the chunk's tokens while one runs) are never read */
    size_t  cap;      /* tokens allocated */
} mla_cache;

typedef struct cpu_slot {
    kda_state *kda;   /* [num_hidden_layers] (zero for MLA layers) */
    mla_cache *mla;   /* [num_hidden_layers] (zero for KDA layers) */
} cpu_slot;

/* The chunk's tokens of one slot: rows start .. start + len of the chunk buffers. */
typedef struct run {
    uint32_t slot;
    size_t   start, len;
} run;

/* The backend: the public part first, so a kl_backend * is also a cpu_be *. */
typedef struct cpu_be {
    kl_backend  be;
    dims        d;
    bufs        b;            /* carved from scratch and route */
    float      *scratch;      /* one block carved into the chunk buffers */
    int32_t    *route;        /* MoE routing scratch [chunk * top_k * 3 + num_experts + 1] */
    float      *scores;       /* MLA attention weights [num_attention_heads, scores_rows,
                                 scores_cap]: one row per token of a group */
    size_t      scores_cap;   /* tokens per row of scores (>= every MLA cache's cap) */
    size_t      scores_rows;  /* tokens of a chunk that attend together (1..KL_FORWARD_CHUNK) */
    float      *row_logits;   /* [rows_cap, vocab] the wanted rows' logits when only their
                                 argmax is wanted (grown to the rows of a step) */
    size_t      rows_cap;
    cpu_slot   *slots;        /* [max_slots] (open ones: be.slot_used) */
    /* the chunk between begin and end */
    kl_batch    chunk;        /* borrowed from the caller */
    run        *runs;         /* [KL_FORWARD_CHUNK] */
    size_t      n_runs, n_want;
} cpu_be;

static cpu_be *cpu(kl_backend *be)
{
    return be->impl;
}

/* The cache rows a slot held before the chunk: its first token of the chunk goes there. */
static size_t run_base(const cpu_be *c, const run *r)
{
    return c->be.slot_len[r->slot];
}

/* ------------------------------------------------------------------------------------------ */
/* Passes over the pool: batched products, per-head loops                                     */

/* Every pass wakes the pool (about 10 us on a 2-vCPU VM), so independent projections are
 * queued and run together, and small per-head loops stay in the caller. */
#define MM_BATCH          64
#define HEADS_SERIAL_MACS (1u << 19)   /* per-head work below which the caller runs it all */

typedef struct mm_list {
    kl_pool  *pool;
    size_t    n;
    kl_matmul mm[MM_BATCH];
} mm_list;

static void mm_flush(mm_list *l)
{
    kl_wmat_matmul_batch(l->mm, l->n, l->pool);
    l->n = 0;
}

/* Queues y [n, w->rows] = x [n, w->cols] Wᵀ; runs the queue first when it is full. */
static void mm_add(mm_list *l, const kl_wmat *w, const float *x, size_t n, float *y)
{
    if (l->n == MM_BATCH)
        mm_flush(l);
    l->mm[l->n++] = (kl_matmul){w, x, n, y};
}

/* fn(ctx, h) for every head h < n_heads, over the pool unless the work is small
 * (which thread runs a head never changes its result). */
static void run_heads(kl_pool *pool, size_t n_heads, void (*fn)(void *, size_t), void *ctx,
                      double macs)
{
    if (macs >= HEADS_SERIAL_MACS) {
        kl_pool_run(pool, n_heads, fn, ctx);
        return;
    }
    for (size_t h = 0; h < n_heads; h++)
        fn(ctx, h);
}

/* ------------------------------------------------------------------------------------------ */
/* Elementwise helpers                                                                        */

/* RMSNorm: y = w ⊙ (x · rsqrt(mean(x²) + eps)); y may alias x */
static void rmsnorm(float *y, const float *x, const float *w, size_t n, float eps)
{
    float ss = 0.0f;
    for (size_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (size_t i = 0; i < n; i++)
        y[i] = w[i] * (x[i] * inv);
}

/* RMSNorm of T rows of width n. */
static void rmsnorm_rows(float *y, const float *x, const float *w, size_t T, size_t n, float eps)
{
    for (size_t t = 0; t < T; t++)
        rmsnorm(y + t * n, x + t * n, w, n, eps);
}

static void add_into(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

/* ------------------------------------------------------------------------------------------ */
/* Tensor parallelism (engine/backend_tp.h): the all-reduce in memory                         */

/* The ranks of engine/backend_tp.h (each a CPU backend of its rank's cut model): a buffer
 * summed in rank order and the sum copied back to every rank. */
static float *sum_buf(kl_backend *be, kl_tp_sum which)
{
    return which == KL_TP_SUM_X ? cpu(be)->b.x : cpu(be)->b.y;
}

static int cpu_all_reduce(kl_backend *const *ranks, unsigned n, kl_tp_sum which, kl_err *err)
{
    (void)err;
    const size_t len = cpu(ranks[0])->chunk.n * cpu(ranks[0])->d.hidden;
    float *b0 = sum_buf(ranks[0], which);
    for (unsigned r = 1; r < n; r++)
        add_into(b0, sum_buf(ranks[r], which), len);
    for (unsigned r = 1; r < n; r++)
        memcpy(sum_buf(ranks[r], which), b0, len * sizeof *b0);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* KDA (§3.2)                                                                                 */

/* Causal depthwise conv of n channels over T tokens (row t of x at x + t * ld), in place,
 * updating their windows: each channel goes through its tokens in order, exactly as one token
 * at a time would (SiLU follows). */
static void short_conv(float *x, size_t ld, const float *w, float *win, size_t n, size_t W,
                       size_t T)
{
    for (size_t c = 0; c < n; c++) {
        const float *wc = w + c * W;
        float *st = win + c * (W - 1);
        for (size_t t = 0; t < T; t++) {
            float in = x[t * ld + c];
            float a = wc[W - 1] * in;                 /* tap W-1: the current token */
            for (size_t j = 0; j + 1 < W; j++)
                a += wc[j] * st[j];
            for (size_t j = 0; j + 2 < W; j++)        /* slide: drop the oldest input */
                st[j] = st[j + 1];
            if (W > 1)
                st[W - 2] = in;
            x[t * ld + c] = a;
        }
    }
}

typedef struct kda_job {
    const cpu_be   *c;
    const kl_layer *L;
    uint32_t        l;
    const dims     *d;
    const bufs     *b;
    float           eps;
    size_t          hn;       /* heads: q, k, v, f, g, o are [T, hn * K], beta [T, hn] */
} kda_job;

/* q̂ = q / sqrt(Σq² + 1e-6) · qscale and k̂ = k / sqrt(Σk² + 1e-6), eps inside the sqrt */
static void l2norm_qk(float *q, float *k, size_t K, float qscale)
{
    float qq = 0.0f, kk = 0.0f;
    for (size_t i = 0; i < K; i++) {
        qq += q[i] * q[i];
        kk += k[i] * k[i];
    }
    float qn = qscale / sqrtf(qq + 1e-6f), kn = 1.0f / sqrtf(kk + 1e-6f);
    for (size_t i = 0; i < K; i++) {
        q[i] *= qn;
        k[i] *= kn;
    }
}

/* Steps 6-7b of one head for one token (offset off into the [T, D] buffers; f holds the
 * decay factors exp(g)).  The row form keeps each row's operations and their order, so the
 * result is that of one row at a time. */
static void kda_head_token(const kda_job *j, float *S, size_t off, float beta)
{
    const bufs *b = j->b;
    size_t K = j->d->kd;
    float *q = b->q + off, *k = b->k + off, *v = b->v + off, *o = b->o + off;
    const float *decay = b->f + off, *onorm = j->L->vec[KL_ROLE_KDA_O_NORM];
    float *gate = b->g + off;
    l2norm_qk(q, k, K, 1.0f / sqrtf((float)K));
    /* decay row i of S by exp(g[i]), then gather Sᵀ k̂ from the decayed row (into o); one row
     * at a time: this pass brings the state into the cache, and one sequential stream is what
     * the prefetchers follow (the row form, four rows side by side, ran it 2.5x slower) */
    memset(o, 0, K * sizeof *o);
    for (size_t i = 0; i < K; i++)
        kl_vec_scale_axpy(S + i * K, decay[i], o, k[i], K);
    /* u = β (v − Sᵀ k̂), kept in v */
    for (size_t c = 0; c < K; c++)
        v[c] = beta * (v[c] - o[c]);
    /* S += k̂ uᵀ, then read out o = Sᵀ q̂ from the updated rows */
    memset(o, 0, K * sizeof *o);
    kl_vec_axpy_axpy_rows(S, K, k, v, o, q, K, K);
    /* 7b. gated RMSNorm per head, sigmoid gate */
    float ss = 0.0f;
    for (size_t c = 0; c < K; c++)
        ss += o[c] * o[c];
    float inv = 1.0f / sqrtf(ss / (float)K + j->eps);
    kl_vec_sigmoid(gate, K);
    for (size_t c = 0; c < K; c++)
        o[c] = o[c] * inv * onorm[c] * gate[c];
}

/* Step 2 for head h's channels of run ru: its rows of q, k, v through its slot's conv windows,
 * then SiLU. */
static void kda_conv_head(const kda_job *j, const run *ru, size_t h)
{
    static const kl_role taps[3] = {KL_ROLE_KDA_Q_CONV, KL_ROLE_KDA_K_CONV, KL_ROLE_KDA_V_CONV};
    float *x[3] = {j->b->q, j->b->k, j->b->v};
    size_t K = j->d->kd, D = j->hn * K, W = j->d->kw;
    kda_state *ks = &j->c->slots[ru->slot].kda[j->l];
    for (int k = 0; k < 3; k++) {
        float *xh = x[k] + ru->start * D + h * K;
        short_conv(xh, D, j->L->vec[taps[k]] + h * K * W, ks->conv[k] + h * K * (W - 1), K, W,
                   ru->len);
        for (size_t t = 0; t < ru->len; t++)
            kl_vec_silu(xh + t * D, K);
    }
}

/* One head of one run (pool item i = run * heads + head): the conv, then the
 * run's tokens in order on its slot's state, each token's forget gate first.  Runs are distinct
 * slots and heads distinct channels, so items share nothing. */
static void kda_run_head(void *ctx, size_t i)
{
    const kda_job *j = ctx;
    size_t K = j->d->kd, h = i % j->hn;
    const run *ru = &j->c->runs[i / j->hn];
    float na = -expf(j->L->vec[KL_ROLE_KDA_A_LOG][h]);
    const float *dt = j->L->vec[KL_ROLE_KDA_DT_BIAS] + h * K;
    float *S = j->c->slots[ru->slot].kda[j->l].S + h * K * K;
    kda_conv_head(j, ru, h);
    for (size_t t = ru->start; t < ru->start + ru->len; t++) {
        size_t off = t * j->hn * K + h * K;
        /* 3c. decay exp(g), g = na · softplus(f + dt_bias) the forget gate in log space */
        kl_vec_exp_softplus(j->b->f + off, dt, na, K);
        kda_head_token(j, S, off, j->b->beta[t * j->hn + h]);
    }
}

/* The KDA block: every head's projections, conv, recurrence and gated norm, then o_proj into
 * y (a tensor-parallel rank: its heads', the o_proj columns of its cut model). */
static void kda_chunk(kl_model *m, cpu_be *c, uint32_t l)
{
    const kl_layer *L = &m->layers[l];
    const dims *d = &c->d;
    bufs *b = &c->b;
    size_t T = c->chunk.n, D = d->kh * d->kd;
    mm_list mm = {.pool = m->pool};

    /* 1, 3a, 4a, 7a. every projection of x for the whole chunk, one pass over the pool */
    mm_add(&mm, &L->w[KL_ROLE_KDA_Q], b->xn, T, b->q);
    mm_add(&mm, &L->w[KL_ROLE_KDA_K], b->xn, T, b->k);
    mm_add(&mm, &L->w[KL_ROLE_KDA_V], b->xn, T, b->v);
    mm_add(&mm, &L->w[KL_ROLE_KDA_F_A], b->xn, T, b->lr);
    mm_add(&mm, &L->w[KL_ROLE_KDA_B], b->xn, T, b->beta);
    mm_add(&mm, &L->w[KL_ROLE_KDA_G_A], b->xn, T, b->lr2);
    mm_flush(&mm);
    /* 3b, 7b. up-projections of the low-rank forget and output gates */
    mm_add(&mm, &L->w[KL_ROLE_KDA_F_B], b->lr, T, b->f);
    mm_add(&mm, &L->w[KL_ROLE_KDA_G_B], b->lr2, T, b->g);
    mm_flush(&mm);
    /* 4b. beta per head */
    kl_vec_sigmoid(b->beta, T * d->kh);
    /* 2, 3c, 5-7b. short conv, forget gate, recurrence and gated norm: every (run, head) in
     * parallel, each one's tokens in order */
    kda_job j = {c, L, l, d, b, (float)m->cfg.rms_norm_eps, d->kh};
    run_heads(m->pool, c->n_runs * d->kh, kda_run_head, &j, 4.0 * (double)T * (double)(D * d->kd));
    /* 8. o_proj */
    kl_wmat_matmul(&L->w[KL_ROLE_KDA_O], b->o, T, b->y, m->pool);
}

/* ------------------------------------------------------------------------------------------ */
/* MLA without RoPE, absorbed form (§3.3)                                                     */

typedef struct mla_job {
    const cpu_be  *c;
    const kl_wmat *kvb;
    uint32_t       l;
    int            split;   /* 1: every token of the chunk has its own row of attention
                               weights, so the attention pass runs one item per (head, run) */
    size_t         parts;   /* token parts per head of the query and output passes (1 ..
                               MLA_PARTS): more items than heads when threads outnumber them */
    size_t         hn;      /* heads: q [T, hn, dn + dr], o [T, hn, dv] and kvb by head */
} mla_job;

/* Cache rows per block of the blocked attention: about 128 KiB, so a block read for the first
 * token of a group is still in the core's cache for the others. */
static size_t mla_block_rows(size_t cw)
{
    size_t r = ((size_t)128 << 10) / (cw * sizeof(float));
    return r < 16 ? 16 : r;
}

/* sc[u] for cache rows u0 .. u1 of query (q [R], qr [dr]): (latent part + shared rope part) ·
 * scale, PIECE rows per pass (each row's dots those of kl_vec_dot). */
static void mla_scores(const float *q, const float *qr, const float *cache, const dims *d,
                       size_t u0, size_t u1, float scale, float *sc)
{
    size_t R = d->R, dr = d->dr, cw = R + dr;
    float rope[PIECE];
    for (size_t u = u0; u < u1; u += PIECE) {
        size_t m = u1 - u < PIECE ? u1 - u : PIECE;
        kl_vec_dot_rows(q, cache + u * cw, cw, m, R, sc + u);
        kl_vec_dot_rows(qr, cache + u * cw + R, cw, m, dr, rope);
        for (size_t k = 0; k < m; k++)
            sc[u + k] = (sc[u + k] + rope[k]) * scale;
    }
}

/* ctx [R] += Σ (p_u / sum) c_u over cache rows u0 .. u1, in order, PIECE rows per pass. */
static void mla_context(float *ctx, const float *p, float sum, const float *cache, const dims *d,
                        size_t u0, size_t u1)
{
    size_t cw = d->R + d->dr;
    float a[PIECE];
    for (size_t u = u0; u < u1; u += PIECE) {
        size_t m = u1 - u < PIECE ? u1 - u : PIECE;
        for (size_t k = 0; k < m; k++)
            a[k] = p[u + k] / sum;
        kl_vec_axpy_rows(ctx, a, cache + u * cw, cw, m, d->R);
    }
}

/* Tokens t0..t0+G of run ru (chunk rows), head h, attend to the run's slot's cache, each up to
 * itself (causal); ql [T, R] holds their absorbed queries on entry and their attention-weighted
 * latents (ctx) on return.  The cache is walked in blocks, each block once for the whole group;
 * every token's softmax and context sums still run over the cache in order, so the result is
 * the one of attending one token at a time. */
static void mla_attend_group(const mla_job *j, size_t h, const run *ru, size_t t0, size_t G,
                             float *ql)
{
    const cpu_be *c = j->c;
    const dims *d = &c->d;
    const float *cache = c->slots[ru->slot].mla[j->l].c;
    size_t R = d->R, dr = d->dr, cw = R + dr, qw = d->dn + dr, blk = mla_block_rows(cw);
    size_t base = run_base(c, ru) + (t0 - ru->start);   /* cache rows before token t0 */
    size_t n_max = base + G;                             /* the last token's span */
    float scale = 1.0f / sqrtf((float)qw);
    float *sc0 = c->scores + (h * c->scores_rows + (j->split ? t0 : 0)) * c->scores_cap;
    float sum[KL_FORWARD_CHUNK];
    /* scores (latent part + shared rope part) */
    for (size_t u0 = 0; u0 < n_max; u0 += blk) {
        for (size_t g = 0; g < G; g++) {
            size_t t = t0 + g, n = base + g + 1, u1 = u0 + blk < n ? u0 + blk : n;
            const float *q = ql + t * R, *qr = c->b.q + t * j->hn * qw + h * qw + d->dn;
            if (u1 > u0)
                mla_scores(q, qr, cache, d, u0, u1, scale, sc0 + g * c->scores_cap);
        }
    }
    /* fp32 softmax per token, over its span in order */
    for (size_t g = 0; g < G; g++) {
        size_t n = base + g + 1;
        float *sc = sc0 + g * c->scores_cap, mx = -INFINITY;
        for (size_t u = 0; u < n; u++)
            if (sc[u] > mx)
                mx = sc[u];
        kl_vec_exp_shift(sc, mx, n);
        sum[g] = 0.0f;
        for (size_t u = 0; u < n; u++)
            sum[g] += sc[u];
        memset(ql + (t0 + g) * R, 0, R * sizeof *ql);
    }
    /* ctx = Σ p_u c_u, over the spent queries */
    for (size_t u0 = 0; u0 < n_max; u0 += blk) {
        for (size_t g = 0; g < G; g++) {
            size_t n = base + g + 1, u1 = u0 + blk < n ? u0 + blk : n;
            if (u1 > u0)
                mla_context(ql + (t0 + g) * R, sc0 + g * c->scores_cap, sum[g], cache, d, u0,
                            u1);
        }
    }
}

/* The MLA scratch of local head h: ql [T, R] absorbed queries, then contexts; kb [MLA_PARTS,
 * KB_ROWS, R] rows of W_kb, one block per token part; yo [T, dv] the head's output. */
static float *mla_head_scratch(const mla_job *j, size_t h, float **kb, float **yo)
{
    const dims *d = &j->c->d;
    float *ql = j->c->b.heads + h * d->head_floats;
    *kb = ql + CHUNK * d->R;
    *yo = *kb + MLA_PARTS * KB_ROWS * d->R;
    return ql;
}

/* Tokens [*t0, *t1) of the chunk in part k of j->parts (even shares, the first ones larger). */
static void mla_part(const mla_job *j, size_t k, size_t *t0, size_t *t1)
{
    size_t T = j->c->chunk.n, q = T / j->parts, r = T % j->parts;
    *t0 = k * q + (k < r ? k : r);
    *t1 = *t0 + q + (k < r);
}

/* Pass 1, pool item i = (head h, token part k): absorbed queries qlat_t = W_kb,hᵀ q_nope,t of
 * the part's tokens, rows i in order; each row of W_kb read once per part, KB_ROWS of them
 * added to a token's query in one pass. */
static void mla_query_item(void *ctx, size_t i)
{
    const mla_job *j = ctx;
    const cpu_be *c = j->c;
    const dims *d = &c->d;
    size_t R = d->R, dn = d->dn, dv = d->dv, qw = dn + d->dr, h = i / j->parts, t0, t1;
    mla_part(j, i % j->parts, &t0, &t1);
    float *kb, *yo, *ql = mla_head_scratch(j, h, &kb, &yo);
    kb += (i % j->parts) * KB_ROWS * R;
    memset(ql + t0 * R, 0, (t1 - t0) * R * sizeof *ql);
    for (size_t i0 = 0; i0 < dn; i0 += KB_ROWS) {
        size_t g = dn - i0 < KB_ROWS ? dn - i0 : KB_ROWS;
        for (size_t r = 0; r < g; r++)
            kl_wmat_row_f32(j->kvb, h * (dn + dv) + i0 + r, kb + r * R);
        for (size_t t = t0; t < t1; t++)
            kl_vec_axpy_rows(ql + t * R, c->b.q + t * j->hn * qw + h * qw + i0, kb, R, g, R);
    }
}

/* Pass 2 (pool item i): attention of head i / runs over run i % runs (split), or of head i over
 * every run, each run's tokens in groups of scores_rows. */
static void mla_attend_item(void *ctx, size_t i)
{
    const mla_job *j = ctx;
    const cpu_be *c = j->c;
    size_t per = j->split ? c->n_runs : 1, h = i / per;
    size_t r0 = j->split ? i % per : 0, r1 = j->split ? r0 + 1 : c->n_runs;
    float *kb, *yo, *ql = mla_head_scratch(j, h, &kb, &yo);
    for (size_t r = r0; r < r1; r++) {
        const run *ru = &c->runs[r];
        size_t end = ru->start + ru->len;
        for (size_t t0 = ru->start; t0 < end; t0 += c->scores_rows)
            mla_attend_group(j, h, ru, t0, end - t0 < c->scores_rows ? end - t0 : c->scores_rows,
                             ql);
    }
}

/* Pass 3, pool item i = (head h, token part k): out_h = W_vb,h ctx for the part's tokens, into
 * o (serial: this is already one pool item). */
static void mla_out_item(void *ctx, size_t i)
{
    const mla_job *j = ctx;
    const cpu_be *c = j->c;
    const dims *d = &c->d;
    size_t dn = d->dn, dv = d->dv, h = i / j->parts, t0, t1;
    mla_part(j, i % j->parts, &t0, &t1);
    float *kb, *yo, *ql = mla_head_scratch(j, h, &kb, &yo);
    kl_wmat vb = kl_wmat_rows(j->kvb, h * (dn + dv) + dn, dv);
    kl_wmat_matmul(&vb, ql + t0 * d->R, t1 - t0, yo + t0 * dv, NULL);
    for (size_t t = t0; t < t1; t++)
        memcpy(c->b.o + t * j->hn * dv + h * dv, yo + t * dv, dv * sizeof *yo);
}

/* Token parts per head for the query and output passes: enough items for the pool's threads,
 * at most MLA_PARTS and one token each. */
static size_t mla_parts(const kl_pool *pool, size_t heads, size_t T)
{
    size_t threads = pool ? kl_pool_threads(pool) : 1;
    size_t k = (threads + heads - 1) / heads;
    k = k > MLA_PARTS ? MLA_PARTS : k;
    return k > T ? T : k ? k : 1;
}

/* Step 3: latent c (normed, eps 1e-6) and shared k_r (not normed) of kv_a's output (lr)
 * appended to each run's cache; returns the work estimate of the attention pass per head. */
static double mla_append(const kl_layer *L, cpu_be *c, uint32_t l)
{
    const dims *d = &c->d;
    size_t R = d->R, dr = d->dr, cw = R + dr;
    double attend = 0.0;
    for (size_t r = 0; r < c->n_runs; r++) {
        const run *ru = &c->runs[r];
        float *cache = c->slots[ru->slot].mla[l].c + run_base(c, ru) * cw;
        for (size_t i = 0; i < ru->len; i++) {
            const float *src = c->b.lr + (ru->start + i) * cw;
            rmsnorm(cache + i * cw, src, L->vec[KL_ROLE_MLA_KV_A_NORM], R, 1e-6f);
            memcpy(cache + i * cw + R, src + R, dr * sizeof *cache);
        }
        double span = (double)(run_base(c, ru) + ru->len);
        attend += (double)ru->len * 2.0 * span * (double)cw;
    }
    return attend;
}

/* The MLA block: the queries and the latent (appended to the cache), attention and W_vb per
 * head, then o_proj into y (a tensor-parallel rank: its heads', the o_proj columns of its cut
 * model; every rank's cache holds the same latent rows). */
static void mla_chunk(kl_model *m, cpu_be *c, uint32_t l)
{
    const kl_layer *L = &m->layers[l];
    size_t T = c->chunk.n, R = c->d.R, hn = c->d.nh;

    /* 1-2. q = W_q x [T, hn, dn+dr] and ckv = W_kva x [T, R+dr], one pass over the pool */
    mm_list mm = {.pool = m->pool};
    mm_add(&mm, &L->w[KL_ROLE_MLA_Q], c->b.xn, T, c->b.q);
    mm_add(&mm, &L->w[KL_ROLE_MLA_KV_A], c->b.xn, T, c->b.lr);
    mm_flush(&mm);
    const double attend = mla_append(L, c, l);
    /* 4-7. absorbed queries, attention, W_vb: three passes, heads (and runs) in parallel, each
     * sequence's tokens in order */
    mla_job j = {c, &L->w[KL_ROLE_MLA_KV_B], l, c->scores_rows == CHUNK,
                 mla_parts(m->pool, hn, T), hn};
    double proj = (double)hn * (double)T * (double)R;
    run_heads(m->pool, hn * j.parts, mla_query_item, &j, proj * (double)c->d.dn);
    run_heads(m->pool, hn * (j.split ? c->n_runs : 1), mla_attend_item, &j,
              (double)hn * attend);
    run_heads(m->pool, hn * j.parts, mla_out_item, &j, proj * (double)c->d.dv);
    /* 8. o_proj */
    kl_wmat_matmul(&L->w[KL_ROLE_MLA_O], c->b.o, T, c->b.y, m->pool);
}

/* ------------------------------------------------------------------------------------------ */
/* FFN: SiLU-gated MLP, dense (§3.5) and MoE (§3.4)                                           */

/* out[T] = down(SiLU(gate x) ⊙ (up x)) for T tokens x [T, cols] */
static void glu(kl_model *m, const kl_wmat *gate, const kl_wmat *up, const kl_wmat *down,
                const float *x, size_t T, float *out, bufs *b)
{
    mm_list mm = {.pool = m->pool};
    mm_add(&mm, gate, x, T, b->h1);
    mm_add(&mm, up, x, T, b->h2);
    mm_flush(&mm);
    kl_vec_silu_mul(b->h1, b->h2, T * gate->rows);
    kl_wmat_matmul(down, b->h1, T, out, m->pool);
}

/* Steps 1-4 for one token: s [E] router logits (sigmoid scores on return) -> idx/wt [topk]. */
static void route_token(const kl_model *m, const float *bias, float *s, float *sel, int32_t *idx,
                        float *wt)
{
    const kl_config *c = &m->cfg;
    size_t E = c->num_experts, topk = c->num_experts_per_token;
    /* 1. sigmoid; selection score = score + correction bias */
    kl_vec_sigmoid(s, E);
    for (size_t e = 0; e < E; e++)
        sel[e] = s[e] + (bias ? bias[e] : 0.0f);
    /* 2. top-k of the biased score (ties: lowest index) */
    float wsum = 0.0f;
    for (size_t k = 0; k < topk; k++) {
        size_t best = 0;
        float bv = -INFINITY;
        for (size_t e = 0; e < E; e++) {
            if (sel[e] > bv) {
                bv = sel[e];
                best = e;
            }
        }
        idx[k] = (int32_t)best;
        /* 3. weights: unbiased s, or biased s + bias as HF remote code */
        wt[k] = m->route_weights == KL_ROUTE_BIASED ? bv : s[best];
        wsum += wt[k];
        sel[best] = -INFINITY;
    }
    /* 4. renormalise (+1e-20 as HF), then the routed scaling factor */
    for (size_t k = 0; k < topk; k++) {
        if (c->moe_renormalize)
            wt[k] /= wsum + 1e-20f;
        wt[k] *= (float)c->routed_scaling_factor;
    }
}

/* Slots 0..n-1 grouped by expert (a stable counting sort): list[start[e] .. start[e+1]) holds
 * expert e's slots in increasing order; inv[slot] is the slot's position in list. */
static void group_by_expert(const int32_t *idx, size_t n, size_t E, bufs *b)
{
    int32_t *start = b->start, *list = b->list;
    memset(start, 0, (E + 1) * sizeof *start);
    for (size_t i = 0; i < n; i++)
        start[idx[i] + 1]++;
    for (size_t e = 0; e < E; e++)
        start[e + 1] += start[e];
    for (size_t i = 0; i < n; i++)                 /* start[e] advances to expert e's end */
        list[start[idx[i]]++] = (int32_t)i;
    for (size_t e = E; e > 0; e--)                 /* shift back to the starts */
        start[e] = start[e - 1];
    start[0] = 0;
    for (size_t p = 0; p < n; p++)
        b->inv[list[p]] = (int32_t)p;
}

/* Rows of L's routed experts' gate (their intermediate width, or the rank's cut of it); 0
 * when the rank holds none (expert parallel). */
static size_t expert_rows(const kl_layer *L, const dims *d)
{
    for (size_t e = 0; e < d->E; e++)
        if (L->experts[0][e].kind != KL_W_NONE)
            return (size_t)L->experts[0][e].rows;
    return 0;
}

/* Step 5: every chosen expert the model holds once for the chunk (its weights read once, on
 * all the tokens that chose it), and the shared experts, as two passes over the pool: gate and
 * up, then down.  Routed outputs land in b->eo in list order (rows of experts a rank of expert
 * parallelism does not hold are left alone), the shared experts' in b->ys. */
static void run_experts(kl_model *m, const kl_layer *L, const dims *d, bufs *b, size_t T)
{
    size_t H = d->hidden, n = T * d->topk, I = expert_rows(L, d);
    const kl_wmat *sg = &L->w[KL_ROLE_SHARED_GATE];
    int shared = sg->kind != KL_W_NONE;
    float *hs1 = b->h1 + n * I, *hs2 = b->h2 + n * I;   /* the shared experts' rows */
    /* each slot's token, in list order: expert e's tokens are rows start[e].. of xe */
    for (size_t p = 0; p < n; p++)
        memcpy(b->xe + p * H, b->xn + (size_t)b->list[p] / d->topk * H, H * sizeof *b->xe);
    mm_list mm = {.pool = m->pool};
    for (size_t e = 0; e < d->E; e++) {
        size_t s0 = (size_t)b->start[e], ne = (size_t)b->start[e + 1] - s0;
        if (!ne || L->experts[0][e].kind == KL_W_NONE)
            continue;
        mm_add(&mm, &L->experts[0][e], b->xe + s0 * H, ne, b->h1 + s0 * I);
        mm_add(&mm, &L->experts[2][e], b->xe + s0 * H, ne, b->h2 + s0 * I);
    }
    if (shared) {
        mm_add(&mm, sg, b->xn, T, hs1);
        mm_add(&mm, &L->w[KL_ROLE_SHARED_UP], b->xn, T, hs2);
    }
    mm_flush(&mm);
    kl_vec_silu_mul(b->h1, b->h2, n * I + (shared ? T * (size_t)sg->rows : 0));
    for (size_t e = 0; e < d->E; e++) {
        size_t s0 = (size_t)b->start[e], ne = (size_t)b->start[e + 1] - s0;
        if (ne && L->experts[1][e].kind != KL_W_NONE)
            mm_add(&mm, &L->experts[1][e], b->h1 + s0 * I, ne, b->eo + s0 * H);
    }
    if (shared)
        mm_add(&mm, &L->w[KL_ROLE_SHARED_DOWN], hs1, T, b->ys);
    mm_flush(&mm);
}

static void moe_chunk(kl_model *m, cpu_be *c, uint32_t l)
{
    const kl_layer *L = &m->layers[l];
    const dims *d = &c->d;
    bufs *b = &c->b;
    size_t E = d->E, topk = d->topk, T = c->chunk.n, H = d->hidden;

    /* 1-4. fp32 router for the chunk, then each token's top-k and weights */
    kl_wmat_matmul(&L->w[KL_ROLE_ROUTER], b->xn, T, b->router, m->pool);
    for (size_t t = 0; t < T; t++)
        route_token(m, L->vec[KL_ROLE_ROUTER_BIAS], b->router + t * E, b->sel, b->idx + t * topk,
                    b->wt + t * topk);
    group_by_expert(b->idx, T * topk, E, b);
    /* 5, 7. routed and shared experts */
    run_experts(m, L, d, b, T);
    /* 6. routed = Σ_k w_k E_k(x), summed in fp32 in the token's top-k order (the experts the
     * model holds: a rank of expert parallelism, its own) */
    for (size_t t = 0; t < T; t++) {
        float *y = b->y + t * H;
        memset(y, 0, H * sizeof *y);
        for (size_t k = 0; k < topk; k++) {
            if (L->experts[0][b->idx[t * topk + k]].kind == KL_W_NONE)
                continue;
            const float *ek = b->eo + (size_t)b->inv[t * topk + k] * H;
            float w = b->wt[t * topk + k];
            for (size_t i = 0; i < H; i++)
                y[i] += w * ek[i];
        }
    }
    /* 8. plus the shared experts, unscaled */
    if (L->w[KL_ROLE_SHARED_GATE].kind != KL_W_NONE)
        add_into(b->y, b->ys, T * H);
}

/* ------------------------------------------------------------------------------------------ */
/* Slots                                                                                      */

#define CPU_SLOTS 256   /* sequences open at once */

static size_t conv_floats(const dims *d)
{
    return d->kD * (d->kw > 1 ? d->kw - 1 : 1);
}

static size_t kda_state_floats(const dims *d)
{
    return d->kh * d->kd * d->kd;
}

/* Releases a slot's state (safe on a zeroed or half-built one). */
static void slot_free(const kl_model *m, cpu_slot *s)
{
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        if (s->kda) {
            for (int k = 0; k < 3; k++)
                kl_free(s->kda[l].conv[k]);
            kl_free(s->kda[l].S);
        }
        if (s->mla)
            kl_free(s->mla[l].c);
    }
    kl_free(s->kda);
    kl_free(s->mla);
    memset(s, 0, sizeof *s);
}

/* An empty sequence: zero conv windows and delta-rule states, MLA caches not yet allocated. */
static int slot_alloc(const kl_model *m, const dims *d, cpu_slot *s)
{
    uint32_t nl = m->cfg.num_hidden_layers;
    s->kda = kl_calloc(nl ? nl : 1, sizeof *s->kda);
    s->mla = kl_calloc(nl ? nl : 1, sizeof *s->mla);
    if (!s->kda || !s->mla)
        return KL_E_NOMEM;
    for (uint32_t l = 0; l < nl; l++) {
        if (m->layers[l].attn != KL_ATTN_KDA)
            continue;
        for (int k = 0; k < 3; k++)
            if (!(s->kda[l].conv[k] = kl_calloc(conv_floats(d), sizeof(float))))
                return KL_E_NOMEM;
        if (!(s->kda[l].S = kl_calloc(kda_state_floats(d), sizeof(float))))
            return KL_E_NOMEM;
    }
    return 0;
}

/* Tokens that attend as one group (rows of attention weights per head): as many of a chunk as
 * fit in KL_SCORES_BUDGET bytes, at least one (long contexts fall back to one at a time). */
#define KL_SCORES_BUDGET ((size_t)64 << 20)

static size_t scores_rows(const dims *d, size_t cap)
{
    size_t per_row = d->nh * cap * sizeof(float);
    size_t rows = per_row ? KL_SCORES_BUDGET / per_row : CHUNK;
    return rows < 1 ? 1 : rows > CHUNK ? CHUNK : rows;
}

/* Grows the attention-weight scratch to rows of cap tokens: nothing to keep, so the old block
 * is freed first (halving the peak). */
static int reserve_scores(cpu_be *c, size_t cap, kl_err *err)
{
    if (c->scores_cap >= cap)
        return 0;
    kl_free(c->scores);
    c->scores_cap = 0;
    size_t rows = scores_rows(&c->d, cap);
    if (!(c->scores = kl_malloc(c->d.nh * rows * cap * sizeof *c->scores)))
        return kl_fail(err, KL_E_NOMEM, "out of memory for attention weights of %zu tokens", cap);
    c->scores_cap = cap;
    c->scores_rows = rows;
    return 0;
}

/* Grows every MLA cache of a slot, and the attention-weight scratch, to hold at least need
 * tokens (doubling). */
static int reserve_mla(cpu_be *c, uint32_t slot, size_t need, kl_err *err)
{
    const kl_model *m = c->be.m;
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        mla_cache *mc = &c->slots[slot].mla[l];
        if (m->layers[l].attn != KL_ATTN_MLA || mc->cap >= need)
            continue;
        if (kl_grow(&mc->c, &mc->cap, need, kl_config_mla_token_bytes(&m->cfg, sizeof *mc->c)))
            return kl_fail(err, KL_E_NOMEM, "out of memory for an MLA cache of %zu tokens", need);
        int rc = reserve_scores(c, mc->cap, err);
        if (rc)
            return rc;
    }
    return 0;
}

static int cpu_slot_open(kl_backend *be, uint32_t *slot, kl_err *err)
{
    cpu_be *c = cpu(be);
    uint32_t i = 0;
    while (i < be->max_slots && be->slot_used[i])
        i++;
    if (i == be->max_slots)
        return kl_fail(err, KL_E_USAGE, "all %u sequence slots of the cpu backend are open",
                       be->max_slots);
    if (slot_alloc(be->m, &c->d, &c->slots[i])) {
        slot_free(be->m, &c->slots[i]);
        return kl_fail(err, KL_E_NOMEM, "out of memory for the sequence state");
    }
    be->slot_used[i] = 1;
    be->slot_len[i] = 0;
    *slot = i;
    return 0;
}

static void cpu_slot_close(kl_backend *be, uint32_t slot)
{
    if (slot >= be->max_slots || !be->slot_used[slot])
        return;
    slot_free(be->m, &cpu(be)->slots[slot]);
    be->slot_used[slot] = 0;
    be->slot_len[slot] = 0;
}

static void cpu_slot_reset(kl_backend *be, uint32_t slot)
{
    if (slot >= be->max_slots || !be->slot_used[slot])
        return;
    const dims *d = &cpu(be)->d;
    cpu_slot *s = &cpu(be)->slots[slot];
    for (uint32_t l = 0; l < be->m->cfg.num_hidden_layers; l++) {
        if (!s->kda[l].S)
            continue;
        for (int k = 0; k < 3; k++)
            memset(s->kda[l].conv[k], 0, conv_floats(d) * sizeof(float));
        memset(s->kda[l].S, 0, kda_state_floats(d) * sizeof(float));
    }
    be->slot_len[slot] = 0;   /* MLA rows beyond the length are never read */
}

/* dst's caches grow first (KL_E_NOMEM leaves dst as it was); then the state is copied, MLA
 * caches only up to src's length. */
static int cpu_slot_copy(kl_backend *be, uint32_t dst, uint32_t src, kl_err *err)
{
    if (dst == src)
        return 0;
    cpu_be *c = cpu(be);
    const kl_model *m = be->m;
    size_t n = be->slot_len[src];
    int rc = reserve_mla(c, dst, n, err);
    if (rc)
        return rc;
    const cpu_slot *s = &c->slots[src];
    cpu_slot *t = &c->slots[dst];
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        if (s->kda[l].S) {
            for (int k = 0; k < 3; k++)
                memcpy(t->kda[l].conv[k], s->kda[l].conv[k], conv_floats(&c->d) * sizeof(float));
            memcpy(t->kda[l].S, s->kda[l].S, kda_state_floats(&c->d) * sizeof(float));
        }
        if (m->layers[l].attn == KL_ATTN_MLA && n)
            memcpy(t->mla[l].c, s->mla[l].c, n * kl_config_mla_token_bytes(&m->cfg, sizeof(float)));
    }
    be->slot_len[dst] = n;
    return 0;
}

static int cpu_slot_fill(kl_backend *be, uint32_t slot, size_t n, kl_err *err)
{
    cpu_be *c = cpu(be);
    const kl_model *m = be->m;
    int rc = reserve_mla(c, slot, n, err);
    if (rc)
        return rc;
    cpu_slot_reset(be, slot);
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++)
        if (m->layers[l].attn == KL_ATTN_MLA && n)
            memset(c->slots[slot].mla[l].c, 0, n * kl_config_mla_token_bytes(&m->cfg,
                                                                            sizeof(float)));
    be->slot_len[slot] = n;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The chunk's operations                                                                     */

/* Token t of the chunk wants logits (want NULL: only the last). */
static int wanted(const kl_batch *b, size_t t)
{
    return b->want ? b->want[t] != 0 : t + 1 == b->n;
}

/* The embedding row of id (a tensor-parallel rank's vocabulary part: zeros for an id outside
 * it; the ranks' rows are summed after begin, engine/backend_tp.h). */
static void embed_row(const cpu_be *c, kl_token id, float *x)
{
    const kl_model *m = c->be.m;
    const kl_wmat *e = &m->embed;
    if (m->vocab_part) {   /* a rank's part: ids outside it embed as zeros */
        const uint64_t r = (uint64_t)id - m->vocab0;
        if (id < m->vocab0 || r >= e->rows)
            memset(x, 0, (size_t)e->cols * sizeof *x);
        else
            kl_wmat_row_f32(e, r, x);
        return;
    }
    kl_wmat_row_f32(e, id, x);
}

static int cpu_begin(kl_backend *be, const kl_batch *chunk, kl_err *err)
{
    cpu_be *c = cpu(be);
    const kl_model *m = be->m;
    const kl_config *cfg = &m->cfg;
    if (cfg->num_experts_per_token > MAX_TOPK || cfg->num_experts_per_token > cfg->num_experts)
        return kl_fail(err, KL_E_UNSUPPORTED, "%u experts per token of %u (at most %d)",
                       cfg->num_experts_per_token, cfg->num_experts, MAX_TOPK);
    if (!chunk->n || chunk->n > be->max_tokens)
        return kl_fail(err, KL_E_USAGE, "a chunk of %zu tokens (1 to %zu)", chunk->n,
                       be->max_tokens);
    /* the runs, and room for them in their slots' caches before anything changes */
    c->n_runs = 0;
    for (size_t t = 0; t < chunk->n; t++) {
        if (t && chunk->slot[t] == chunk->slot[t - 1])
            c->runs[c->n_runs - 1].len++;
        else
            c->runs[c->n_runs++] = (run){chunk->slot[t], t, 1};
    }
    for (size_t r = 0; r < c->n_runs; r++) {
        const run *ru = &c->runs[r];
        int rc = reserve_mla(c, ru->slot, run_base(c, ru) + ru->len, err);
        if (rc)
            return rc;
    }
    c->chunk = *chunk;
    c->n_want = 0;
    for (size_t t = 0; t < chunk->n; t++)
        c->n_want += (size_t)wanted(chunk, t);
    /* embedding: no scaling, no positions */
    for (size_t t = 0; t < chunk->n; t++)
        embed_row(c, chunk->ids[t], c->b.x + t * c->d.hidden);
    return 0;
}

/* The weights of a norm, NULL for a layer out of range. */
static const float *norm_weights(const kl_model *m, kl_norm_which which, uint32_t layer)
{
    if (which == KL_NORM_FINAL)
        return m->final_norm;
    if (layer >= m->cfg.num_hidden_layers)
        return NULL;
    kl_role r = which == KL_NORM_INPUT ? KL_ROLE_INPUT_NORM : KL_ROLE_POST_ATTN_NORM;
    return m->layers[layer].vec[r];
}

/* xn = RMSNorm(x) for every row; the final norm only for the wanted rows, packed in chunk
 * order (what head reads). */
static int cpu_norm(kl_backend *be, kl_norm_which which, uint32_t layer, kl_err *err)
{
    cpu_be *c = cpu(be);
    const kl_model *m = be->m;
    const float *w = norm_weights(m, which, layer);
    if (!w)
        return kl_fail(err, KL_E_USAGE, "norm of layer %u of %u", layer,
                       m->cfg.num_hidden_layers);
    size_t T = c->chunk.n, H = c->d.hidden, k = 0;
    float eps = (float)m->cfg.rms_norm_eps;
    if (which != KL_NORM_FINAL) {
        rmsnorm_rows(c->b.xn, c->b.x, w, T, H, eps);
        return 0;
    }
    for (size_t t = 0; t < T; t++)
        if (wanted(&c->chunk, t))
            rmsnorm(c->b.xn + k++ * H, c->b.x + t * H, w, H, eps);
    return 0;
}

/* x += y (the block's output into the residual stream), then the norm. */
static int cpu_add_norm(kl_backend *be, kl_norm_which which, uint32_t layer, kl_err *err)
{
    cpu_be *c = cpu(be);
    add_into(c->b.x, c->b.y, c->chunk.n * c->d.hidden);
    return cpu_norm(be, which, layer, err);
}

static int wrong_layer(const kl_model *m, uint32_t l, const char *kind, kl_err *err)
{
    return kl_fail(err, KL_E_USAGE, "layer %u of %u is not a %s layer", l,
                   m->cfg.num_hidden_layers, kind);
}

static int cpu_kda(kl_backend *be, uint32_t l, kl_err *err)
{
    if (l >= be->m->cfg.num_hidden_layers || be->m->layers[l].attn != KL_ATTN_KDA)
        return wrong_layer(be->m, l, "KDA", err);
    kda_chunk(be->m, cpu(be), l);
    return 0;
}

static int cpu_mla(kl_backend *be, uint32_t l, kl_err *err)
{
    if (l >= be->m->cfg.num_hidden_layers || be->m->layers[l].attn != KL_ATTN_MLA)
        return wrong_layer(be->m, l, "MLA", err);
    mla_chunk(be->m, cpu(be), l);
    return 0;
}

static int cpu_moe(kl_backend *be, uint32_t l, kl_err *err)
{
    if (l >= be->m->cfg.num_hidden_layers || !be->m->layers[l].moe)
        return wrong_layer(be->m, l, "MoE", err);
    moe_chunk(be->m, cpu(be), l);
    return 0;
}

static int cpu_mlp(kl_backend *be, uint32_t l, kl_err *err)
{
    if (l >= be->m->cfg.num_hidden_layers || be->m->layers[l].moe)
        return wrong_layer(be->m, l, "dense MLP", err);
    cpu_be *c = cpu(be);
    const kl_layer *L = &be->m->layers[l];
    glu(be->m, &L->w[KL_ROLE_MLP_GATE], &L->w[KL_ROLE_MLP_UP], &L->w[KL_ROLE_MLP_DOWN], c->b.xn,
        c->chunk.n, c->b.y, &c->b);
    return 0;
}

static int cpu_head(kl_backend *be, float *logits, kl_token *argmax, kl_err *err)
{
    cpu_be *c = cpu(be);
    kl_model *m = be->m;
    size_t nw = c->n_want;
    uint32_t V = m->cfg.vocab_size;
    if (!logits && argmax && nw > c->rows_cap) {   /* the rows in one product: lm_head read once */
        float *p = kl_realloc(c->row_logits, nw * V * sizeof *p);
        if (!p)
            return kl_fail(err, KL_E_NOMEM, "out of memory for %zu rows of logits", nw);
        c->row_logits = p;
        c->rows_cap = nw;
    }
    float *rows = logits ? logits : c->row_logits;
    if (logits || argmax)
        kl_wmat_matmul(&m->lm_head, c->b.xn, nw, rows, m->pool);
    for (size_t k = 0; argmax && k < nw; k++)
        argmax[k] = kl_sample_argmax(rows + k * V, V);
    return 0;
}

static int cpu_end(kl_backend *be, kl_err *err)
{
    (void)err;
    cpu_be *c = cpu(be);
    for (size_t r = 0; r < c->n_runs; r++)
        be->slot_len[c->runs[r].slot] += c->runs[r].len;
    c->n_runs = 0;
    c->n_want = 0;
    memset(&c->chunk, 0, sizeof c->chunk);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The backend object                                                                         */

static void cpu_destroy(kl_backend *be)
{
    cpu_be *c = cpu(be);
    for (uint32_t i = 0; c->slots && i < be->max_slots; i++)
        slot_free(be->m, &c->slots[i]);
    kl_free(c->slots);
    kl_free(be->slot_len);
    kl_free(be->slot_used);
    kl_free(c->scratch);
    kl_free(c->route);
    kl_free(c->scores);
    kl_free(c->row_logits);
    kl_free(c->runs);
    kl_free(c);
}

static const kl_backend_ops cpu_ops = {
    .slot_open = cpu_slot_open,
    .slot_close = cpu_slot_close,
    .slot_reset = cpu_slot_reset,
    .slot_copy = cpu_slot_copy,
    .slot_fill = cpu_slot_fill,
    .begin = cpu_begin,
    .norm = cpu_norm,
    .add_norm = cpu_add_norm,
    .kda = cpu_kda,
    .mla = cpu_mla,
    .moe = cpu_moe,
    .mlp = cpu_mlp,
    .head = cpu_head,
    .end = cpu_end,
    .destroy = cpu_destroy,
    .all_reduce = cpu_all_reduce,
};

/* What a rank holds (backend.h): its CPU backend's model, the cut model of a tensor-parallel
 * rank (engine/tp_model.h) or the whole model */

static void count_matrix(kl_cpu_rank_bytes *o, const kl_wmat *w)
{
    uint64_t b = kl_wmat_bytes(w);
    o->matrix_bytes[w->kind] += b;
    o->matrix_total += b;
}

static void count_model(const kl_model *m, kl_cpu_rank_bytes *o)
{
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        const kl_layer *L = &m->layers[l];
        for (int k = 0; k < KL_ROLE_COUNT; k++) {
            if (L->vec[k]) {
                o->vector_bytes += kl_wmat_bytes(&L->w[k]);
                o->vector_f32_bytes += L->w[k].rows * L->w[k].cols * sizeof(float);
            } else {
                count_matrix(o, &L->w[k]);
            }
        }
        for (int k = 0; k < 3 && L->moe && L->experts[k]; k++)
            for (uint32_t e = 0; e < m->cfg.num_experts; e++)
                count_matrix(o, &L->experts[k][e]);
    }
    count_matrix(o, &m->embed);
    if (!m->cfg.tie_word_embeddings)
        count_matrix(o, &m->lm_head);
    for (size_t i = 0; i < m->n_src; i++)
        if (m->src[i].role == KL_ROLE_FINAL_NORM)
            o->vector_bytes += m->src[i].bytes;
    o->vector_f32_bytes += (uint64_t)m->cfg.hidden_size * sizeof(float);
    o->copied_bytes = m->cut_copied_bytes;
}

/* An open slot's state in a CPU backend (all of its model's heads). */
static void count_slot(const cpu_be *c, uint32_t slot, kl_cpu_rank_bytes *o)
{
    const kl_model *m = c->be.m;
    const cpu_slot *s = &c->slots[slot];
    const uint64_t row = kl_config_mla_token_bytes(&m->cfg, sizeof(float));
    const size_t kda_floats = 3 * conv_floats(&c->d) + kda_state_floats(&c->d);
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        if (s->kda[l].S)
            o->kda_state_bytes += kda_floats * sizeof(float);
        if (s->mla[l].c) {
            o->mla_cache_bytes += c->be.slot_len[slot] * row;
            o->mla_cache_cap_bytes += s->mla[l].cap * row;
        }
    }
}

int kl_backend_cpu_rank_bytes(const kl_backend *be, unsigned rank, uint32_t slot,
                              kl_cpu_rank_bytes *out, kl_err *err)
{
    const unsigned tp = be && be->ops != &cpu_ops ? kl_backend_tp_size(be) : 1;
    const kl_backend *rb = !be || rank >= tp ? NULL : tp > 1 ? kl_backend_tp_rank(be, rank) : be;
    if (!be || !tp || (rb && rb->ops != &cpu_ops))
        return kl_fail(err, KL_E_USAGE, "rank bytes of a backend that is not the CPU's");
    if (!rb)
        return kl_fail(err, KL_E_USAGE, "rank %u of %u", rank, tp);
    if (slot != UINT32_MAX && (slot >= be->max_slots || !be->slot_used[slot]))
        return kl_fail(err, KL_E_USAGE, "slot %u is not open", slot);
    kl_cpu_rank_bytes o;
    memset(&o, 0, sizeof o);
    count_model(rb->m, &o);
    if (slot != UINT32_MAX)
        count_slot(rb->impl, slot, &o);
    *out = o;
    return 0;
}

int kl_backend_cpu_create_tp(kl_backend **out, kl_model *m, unsigned tp, int ep, kl_err *err)
{
    return tp > 1 ? kl_backend_tp_create_on(out, m, tp, ep, 0, err)
                  : kl_backend_cpu_create(out, m, err);
}

int kl_backend_cpu_create(kl_backend **out, kl_model *m, kl_err *err)
{
    cpu_be *c = kl_calloc(1, sizeof *c);
    if (!c)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the cpu backend");
    kl_backend *be = &c->be;
    *be = (kl_backend){.ops = &cpu_ops, .name = "cpu", .m = m, .max_tokens = CHUNK,
                       .max_slots = CPU_SLOTS, .impl = c};
    get_dims(m, &c->d);
    c->scratch = kl_calloc(carve(NULL, &c->d, &c->b), sizeof(float));
    c->route = kl_calloc(route_ints(&c->d), sizeof *c->route);
    c->row_logits = kl_calloc(m->cfg.vocab_size ? m->cfg.vocab_size : 1, sizeof(float));
    c->rows_cap = 1;
    c->runs = kl_calloc(CHUNK, sizeof *c->runs);
    c->slots = kl_calloc(CPU_SLOTS, sizeof *c->slots);
    be->slot_len = kl_calloc(CPU_SLOTS, sizeof *be->slot_len);
    be->slot_used = kl_calloc(CPU_SLOTS, sizeof *be->slot_used);
    if (!c->scratch || !c->route || !c->row_logits || !c->runs || !c->slots || !be->slot_len ||
        !be->slot_used) {
        cpu_destroy(be);
        return kl_fail(err, KL_E_NOMEM, "out of memory for the cpu backend's scratch");
    }
    carve(c->scratch, &c->d, &c->b);
    carve_ints(c->route, &c->d, &c->b);
    *out = be;
    return 0;
}
