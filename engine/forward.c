/*
 * engine/forward.c — CPU forward pass (see forward.h and kimi-linear.md §3).
 *
 * Sections: dimensions and scratch; elementwise helpers; KDA; MLA; FFN (dense, MoE);
 * state API; kl_forward.
 *
 * Tokens travel in chunks of up to KL_FORWARD_CHUNK.  Activations of a chunk are row-major
 * [tokens, width] matrices, so every projection is one kl_wmat_matmul (engine/matvec.h).
 * What is sequential in the model stays sequential per token (conv windows, the delta rule,
 * causal attention); what is independent runs in parallel (KDA and MLA heads over the pool).
 * No value of a token depends on the other tokens of its chunk except through the model's own
 * causal dependencies, and each is computed in the same order whatever the chunk: that is
 * what makes logits bit-identical for any split of a prompt.
 */
#include "engine/forward.h"

#include "common/grow.h"
#include "common/mem.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Dimensions and scratch                                                                     */

#define CHUNK    KL_FORWARD_CHUNK
#define MAX_TOPK 64   /* larger configs are refused */

typedef struct dims {
    size_t hidden, vocab;
    size_t kh, kd, kD, kw;        /* KDA heads, head dim, heads*dim, conv kernel */
    size_t nh, dn, dr, dv, R;     /* MLA heads, nope, rope, v dims, kv_lora_rank */
    size_t E, topk;               /* routed experts, experts per token */
    size_t wide;                  /* widest attention projection or gate */
    size_t low;                   /* widest low-rank output (KDA gate ranks, MLA kv_a) */
    size_t ffn;                   /* FFN intermediate floats per token: the dense MLP's, or
                                     top_k routed experts' plus the shared experts' */
    size_t head_floats;           /* MLA scratch per head: [CHUNK, R] + [R] + [CHUNK, dv] */
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

/* The largest row count of role r over all layers. */
static size_t max_rows(const kl_model *m, kl_role r)
{
    size_t n = 0;
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++)
        n = max2(n, (size_t)m->layers[l].w[r].rows);
    return n;
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
    /* sizes from the bound tensors too (the low-rank gates have no config key) */
    static const kl_role wide_roles[] = {KL_ROLE_KDA_Q, KL_ROLE_KDA_K, KL_ROLE_KDA_V,
                                         KL_ROLE_KDA_F_B, KL_ROLE_KDA_G_B, KL_ROLE_MLA_Q};
    d->wide = max2(d->kD, max2(d->nh * (d->dn + d->dr), d->nh * d->dv));
    for (size_t i = 0; i < sizeof wide_roles / sizeof *wide_roles; i++)
        d->wide = max2(d->wide, max_rows(m, wide_roles[i]));
    d->low = max2(d->R + d->dr, max2(max_rows(m, KL_ROLE_KDA_F_A), max_rows(m, KL_ROLE_KDA_G_A)));
    size_t routed = 0;
    for (uint32_t l = 0; l < c->num_hidden_layers; l++)
        if (m->layers[l].moe && m->layers[l].experts[0])
            routed = max2(routed, (size_t)m->layers[l].experts[0][0].rows);
    d->ffn = max2(max_rows(m, KL_ROLE_MLP_GATE),
                  d->topk * routed + max_rows(m, KL_ROLE_SHARED_GATE));
    d->head_floats = CHUNK * d->R + d->R + CHUNK * d->dv;
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

static float silu(float z)
{
    return z / (1.0f + expf(-z));
}

static float sigmoid(float z)
{
    return 1.0f / (1.0f + expf(-z));
}

/* softplus with fla's threshold: z above 20 returns z */
static float softplus(float z)
{
    return z > 20.0f ? z : log1pf(expf(z));
}

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
/* KDA (§3.2)                                                                                 */

/* Causal depthwise conv with SiLU over T tokens x [T, D], in place, updating the window: each
 * channel goes through its tokens in order, exactly as one token at a time would. */
static void short_conv(float *x, const float *w, float *win, size_t D, size_t W, size_t T)
{
    for (size_t c = 0; c < D; c++) {
        const float *wc = w + c * W;
        float *st = win + c * (W - 1);
        for (size_t t = 0; t < T; t++) {
            float in = x[t * D + c];
            float a = wc[W - 1] * in;                 /* tap W-1: the current token */
            for (size_t j = 0; j + 1 < W; j++)
                a += wc[j] * st[j];
            for (size_t j = 0; j + 2 < W; j++)        /* slide: drop the oldest input */
                st[j] = st[j + 1];
            if (W > 1)
                st[W - 2] = in;
            x[t * D + c] = silu(a);
        }
    }
}

/* g = -exp(A_log[h]) · softplus(f + dt_bias) per channel, log space, for T tokens in place */
static void forget_gate(float *f, const float *a_log, const float *dt, const dims *d, size_t T)
{
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < d->kD; c++)
            f[t * d->kD + c] = -expf(a_log[c / d->kd]) * softplus(f[t * d->kD + c] + dt[c]);
}

typedef struct kda_job {
    const kl_layer *L;
    kl_kda_state   *ks;
    const dims     *d;
    const bufs     *b;
    size_t          T;
    float           eps;
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

/* Steps 6-7b of one head for one token (offset off into the [T, D] buffers). */
static void kda_head_token(const kda_job *j, float *S, size_t off, float beta)
{
    const bufs *b = j->b;
    size_t K = j->d->kd;
    float *q = b->q + off, *k = b->k + off, *v = b->v + off, *o = b->o + off;
    const float *gh = b->f + off, *gate = b->g + off, *onorm = j->L->vec[KL_ROLE_KDA_O_NORM];
    l2norm_qk(q, k, K, 1.0f / sqrtf((float)K));
    /* decay row i of S by exp(g[i]), then gather Sᵀ k̂ from the decayed row (into o) */
    memset(o, 0, K * sizeof *o);
    for (size_t i = 0; i < K; i++)
        kl_vec_scale_axpy(S + i * K, expf(gh[i]), o, k[i], K);
    /* u = β (v − Sᵀ k̂), kept in v */
    for (size_t c = 0; c < K; c++)
        v[c] = beta * (v[c] - o[c]);
    /* S += k̂ uᵀ, then read out o = Sᵀ q̂ from the updated row */
    memset(o, 0, K * sizeof *o);
    for (size_t i = 0; i < K; i++)
        kl_vec_axpy_axpy(S + i * K, k[i], v, o, q[i], K);
    /* 7b. gated RMSNorm per head, sigmoid gate */
    float ss = 0.0f;
    for (size_t c = 0; c < K; c++)
        ss += o[c] * o[c];
    float inv = 1.0f / sqrtf(ss / (float)K + j->eps);
    for (size_t c = 0; c < K; c++)
        o[c] = o[c] * inv * onorm[c] * sigmoid(gate[c]);
}

/* One head over the chunk's tokens, in order (pool item h). */
static void kda_head(void *ctx, size_t h)
{
    const kda_job *j = ctx;
    size_t K = j->d->kd;
    float *S = j->ks->S + h * K * K;
    for (size_t t = 0; t < j->T; t++)
        kda_head_token(j, S, t * j->d->kD + h * K, j->b->beta[t * j->d->kh + h]);
}

static void kda_chunk(kl_model *m, kl_state *s, uint32_t l, const dims *d, bufs *b, size_t T)
{
    const kl_layer *L = &m->layers[l];
    kl_kda_state *ks = &s->kda[l];
    size_t D = d->kD, W = d->kw;

    const kl_wmat *wb = &L->w[KL_ROLE_KDA_B];
    mm_list mm = {.pool = m->pool};

    /* 1, 3a, 4a, 7a. every projection of x for the whole chunk, one pass over the pool */
    mm_add(&mm, &L->w[KL_ROLE_KDA_Q], b->xn, T, b->q);
    mm_add(&mm, &L->w[KL_ROLE_KDA_K], b->xn, T, b->k);
    mm_add(&mm, &L->w[KL_ROLE_KDA_V], b->xn, T, b->v);
    mm_add(&mm, &L->w[KL_ROLE_KDA_F_A], b->xn, T, b->lr);
    mm_add(&mm, wb, b->xn, T, b->beta);
    mm_add(&mm, &L->w[KL_ROLE_KDA_G_A], b->xn, T, b->lr2);
    mm_flush(&mm);
    /* 2. short causal conv + SiLU */
    short_conv(b->q, L->vec[KL_ROLE_KDA_Q_CONV], ks->conv[0], D, W, T);
    short_conv(b->k, L->vec[KL_ROLE_KDA_K_CONV], ks->conv[1], D, W, T);
    short_conv(b->v, L->vec[KL_ROLE_KDA_V_CONV], ks->conv[2], D, W, T);
    /* 3b, 7b. up-projections of the low-rank forget and output gates */
    mm_add(&mm, &L->w[KL_ROLE_KDA_F_B], b->lr, T, b->f);
    mm_add(&mm, &L->w[KL_ROLE_KDA_G_B], b->lr2, T, b->g);
    mm_flush(&mm);
    /* 3c. forget gate in log space */
    forget_gate(b->f, L->vec[KL_ROLE_KDA_A_LOG], L->vec[KL_ROLE_KDA_DT_BIAS], d, T);
    /* 4b. beta per head */
    for (size_t i = 0; i < T * wb->rows; i++)
        b->beta[i] = sigmoid(b->beta[i]);
    /* 5-7b. recurrence and gated norm: heads in parallel, each head's tokens in order */
    kda_job j = {L, ks, d, b, T, (float)m->cfg.rms_norm_eps};
    run_heads(m->pool, d->kh, kda_head, &j, 4.0 * (double)T * (double)(D * d->kd));
    /* 8. o_proj */
    kl_wmat_matmul(&L->w[KL_ROLE_KDA_O], b->o, T, b->y, m->pool);
}

/* ------------------------------------------------------------------------------------------ */
/* MLA without RoPE, absorbed form (§3.3)                                                     */

typedef struct mla_job {
    const kl_wmat      *kvb;
    const kl_mla_cache *mc;
    float              *scores;   /* [nh, rows, scores_cap] */
    size_t              scores_cap, rows;
    const dims         *d;
    const bufs         *b;
    size_t              T, base;  /* chunk tokens; cache entries before the chunk */
} mla_job;

/* Cache rows per block of the blocked attention: about 128 KiB, so a block read for the first
 * token of a group is still in the core's cache for the others. */
static size_t mla_block_rows(size_t cw)
{
    size_t r = ((size_t)128 << 10) / (cw * sizeof(float));
    return r < 16 ? 16 : r;
}

/* Tokens t0..t0+G of head h attend to the cache, each up to itself (causal); ql [T, R] holds
 * their absorbed queries on entry and their attention-weighted latents (ctx) on return.  The
 * cache is walked in blocks, each block once for the whole group; every token's softmax and
 * context sums still run over the cache in order, so the result is the one of attending one
 * token at a time. */
static void mla_attend_group(const mla_job *j, size_t h, size_t t0, size_t G, float *ql)
{
    const dims *d = j->d;
    size_t R = d->R, dr = d->dr, cw = R + dr, qw = d->dn + dr, blk = mla_block_rows(cw);
    size_t n_max = j->base + t0 + G;   /* the last token's span */
    float scale = 1.0f / sqrtf((float)qw);
    float *sc0 = j->scores + h * j->rows * j->scores_cap, sum[KL_FORWARD_CHUNK];
    /* scores (latent part + shared rope part) */
    for (size_t u0 = 0; u0 < n_max; u0 += blk) {
        for (size_t g = 0; g < G; g++) {
            size_t t = t0 + g, n = j->base + t + 1, u1 = u0 + blk < n ? u0 + blk : n;
            const float *q = ql + t * R, *qr = j->b->q + t * d->nh * qw + h * qw + d->dn;
            float *sc = sc0 + g * j->scores_cap;
            for (size_t u = u0; u < u1; u++) {
                const float *cu = j->mc->c + u * cw;
                sc[u] = (kl_vec_dot(q, cu, R) + kl_vec_dot(qr, cu + R, dr)) * scale;
            }
        }
    }
    /* fp32 softmax per token, over its span in order */
    for (size_t g = 0; g < G; g++) {
        size_t n = j->base + t0 + g + 1;
        float *sc = sc0 + g * j->scores_cap, mx = -INFINITY;
        for (size_t u = 0; u < n; u++)
            if (sc[u] > mx)
                mx = sc[u];
        sum[g] = 0.0f;
        for (size_t u = 0; u < n; u++) {
            sc[u] = expf(sc[u] - mx);
            sum[g] += sc[u];
        }
        memset(ql + (t0 + g) * R, 0, R * sizeof *ql);
    }
    /* ctx = Σ p_u c_u, over the spent queries */
    for (size_t u0 = 0; u0 < n_max; u0 += blk) {
        for (size_t g = 0; g < G; g++) {
            size_t n = j->base + t0 + g + 1, u1 = u0 + blk < n ? u0 + blk : n;
            const float *sc = sc0 + g * j->scores_cap;
            for (size_t u = u0; u < u1; u++)
                kl_vec_axpy(ql + (t0 + g) * R, sc[u] / sum[g], j->mc->c + u * cw, R);
        }
    }
}

/* One head for the whole chunk (pool item h): absorbed queries, attention, W_vb. */
static void mla_head(void *ctx, size_t h)
{
    const mla_job *j = ctx;
    const dims *d = j->d;
    size_t R = d->R, dn = d->dn, dv = d->dv, qw = dn + d->dr, T = j->T;
    float *ql = j->b->heads + h * d->head_floats;   /* [T, R] queries, then contexts */
    float *row = ql + CHUNK * R;                    /* [R] one row of W_kb */
    float *yo = row + R;                            /* [T, dv] this head's output */
    /* absorbed query: qlat_t = W_kb,hᵀ q_nope,t; each row of W_kb read once per chunk */
    memset(ql, 0, T * R * sizeof *ql);
    for (size_t i = 0; i < dn; i++) {
        kl_wmat_row_f32(j->kvb, h * (dn + dv) + i, row);
        for (size_t t = 0; t < T; t++)
            kl_vec_axpy(ql + t * R, j->b->q[t * d->nh * qw + h * qw + i], row, R);
    }
    for (size_t t0 = 0; t0 < T; t0 += j->rows)
        mla_attend_group(j, h, t0, T - t0 < j->rows ? T - t0 : j->rows, ql);
    /* out_h = W_vb,h ctx for every token (serial: this is already one pool item) */
    kl_wmat vb = kl_wmat_rows(j->kvb, h * (dn + dv) + dn, dv);
    kl_wmat_matmul(&vb, ql, T, yo, NULL);
    for (size_t t = 0; t < T; t++)
        memcpy(j->b->o + t * d->nh * dv + h * dv, yo + t * dv, dv * sizeof *yo);
}

static void mla_chunk(kl_model *m, kl_state *s, uint32_t l, const dims *d, bufs *b, size_t T)
{
    const kl_layer *L = &m->layers[l];
    kl_mla_cache *mc = &s->mla[l];
    size_t R = d->R, dr = d->dr, cw = R + dr;

    /* 1-2. q = W_q x [T, nh, dn+dr] and ckv = W_kva x [T, R+dr], one pass over the pool */
    mm_list mm = {.pool = m->pool};
    mm_add(&mm, &L->w[KL_ROLE_MLA_Q], b->xn, T, b->q);
    mm_add(&mm, &L->w[KL_ROLE_MLA_KV_A], b->xn, T, b->lr);
    mm_flush(&mm);
    /* 3. latent c (normed, eps 1e-6) and shared k_r (not normed) appended to the cache */
    for (size_t t = 0; t < T; t++) {
        float *cn = mc->c + (mc->n + t) * cw;
        rmsnorm(cn, b->lr + t * cw, L->vec[KL_ROLE_MLA_KV_A_NORM], R, 1e-6f);
        memcpy(cn + R, b->lr + t * cw + R, dr * sizeof *cn);
    }
    mla_job j = {&L->w[KL_ROLE_MLA_KV_B], mc, s->scores, s->scores_cap, s->scores_rows, d, b, T,
                 mc->n};
    mc->n += T;
    /* 4-7. heads in parallel, each head's tokens in order */
    double per_head = (double)(d->dn + d->dv) * (double)R + 2.0 * (double)mc->n * (double)cw;
    run_heads(m->pool, d->nh, mla_head, &j, (double)T * (double)d->nh * per_head);
    /* 8. o_proj */
    kl_wmat_matmul(&L->w[KL_ROLE_MLA_O], b->o, T, b->y, m->pool);
}

/* ------------------------------------------------------------------------------------------ */
/* FFN: SiLU-gated MLP, dense (§3.5) and MoE (§3.4)                                           */

/* h1 = SiLU(h1) ⊙ h2 over n values */
static void silu_mul(float *h1, const float *h2, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h1[i] = silu(h1[i]) * h2[i];
}

/* out[T] = down(SiLU(gate x) ⊙ (up x)) for T tokens x [T, cols] */
static void glu(kl_model *m, const kl_wmat *gate, const kl_wmat *up, const kl_wmat *down,
                const float *x, size_t T, float *out, bufs *b)
{
    mm_list mm = {.pool = m->pool};
    mm_add(&mm, gate, x, T, b->h1);
    mm_add(&mm, up, x, T, b->h2);
    mm_flush(&mm);
    silu_mul(b->h1, b->h2, T * gate->rows);
    kl_wmat_matmul(down, b->h1, T, out, m->pool);
}

/* Steps 1-4 for one token: s [E] router logits (sigmoid scores on return) -> idx/wt [topk]. */
static void route_token(const kl_model *m, const float *bias, float *s, float *sel, int32_t *idx,
                        float *wt)
{
    const kl_config *c = &m->cfg;
    size_t E = c->num_experts, topk = c->num_experts_per_token;
    /* 1. sigmoid; selection score = score + correction bias */
    for (size_t e = 0; e < E; e++) {
        s[e] = sigmoid(s[e]);
        sel[e] = s[e] + (bias ? bias[e] : 0.0f);
    }
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

/* Step 5: every chosen expert once for the chunk (its weights read once, on all the tokens that
 * chose it), and the shared experts, as two passes over the pool: gate and up, then down.
 * Routed outputs land in b->eo in list order, the shared experts' in b->ys. */
static void run_experts(kl_model *m, const kl_layer *L, const dims *d, bufs *b, size_t T)
{
    size_t H = d->hidden, n = T * d->topk, I = (size_t)L->experts[0][0].rows;
    const kl_wmat *sg = &L->w[KL_ROLE_SHARED_GATE];
    int shared = sg->kind != KL_W_NONE;
    float *hs1 = b->h1 + n * I, *hs2 = b->h2 + n * I;   /* the shared experts' rows */
    /* each slot's token, in list order: expert e's tokens are rows start[e].. of xe */
    for (size_t p = 0; p < n; p++)
        memcpy(b->xe + p * H, b->xn + (size_t)b->list[p] / d->topk * H, H * sizeof *b->xe);
    mm_list mm = {.pool = m->pool};
    for (size_t e = 0; e < d->E; e++) {
        size_t s0 = (size_t)b->start[e], ne = (size_t)b->start[e + 1] - s0;
        if (!ne)
            continue;
        mm_add(&mm, &L->experts[0][e], b->xe + s0 * H, ne, b->h1 + s0 * I);
        mm_add(&mm, &L->experts[2][e], b->xe + s0 * H, ne, b->h2 + s0 * I);
    }
    if (shared) {
        mm_add(&mm, sg, b->xn, T, hs1);
        mm_add(&mm, &L->w[KL_ROLE_SHARED_UP], b->xn, T, hs2);
    }
    mm_flush(&mm);
    silu_mul(b->h1, b->h2, n * I + (shared ? T * (size_t)sg->rows : 0));
    for (size_t e = 0; e < d->E; e++) {
        size_t s0 = (size_t)b->start[e], ne = (size_t)b->start[e + 1] - s0;
        if (ne)
            mm_add(&mm, &L->experts[1][e], b->h1 + s0 * I, ne, b->eo + s0 * H);
    }
    if (shared)
        mm_add(&mm, &L->w[KL_ROLE_SHARED_DOWN], hs1, T, b->ys);
    mm_flush(&mm);
}

static void moe_chunk(kl_model *m, uint32_t l, const dims *d, bufs *b, size_t T)
{
    const kl_layer *L = &m->layers[l];
    size_t E = d->E, topk = d->topk, H = d->hidden;

    /* 1-4. fp32 router for the chunk, then each token's top-k and weights */
    kl_wmat_matmul(&L->w[KL_ROLE_ROUTER], b->xn, T, b->router, m->pool);
    for (size_t t = 0; t < T; t++)
        route_token(m, L->vec[KL_ROLE_ROUTER_BIAS], b->router + t * E, b->sel, b->idx + t * topk,
                    b->wt + t * topk);
    /* 5, 7. routed and shared experts */
    group_by_expert(b->idx, T * topk, E, b);
    run_experts(m, L, d, b, T);
    /* 6. routed = Σ_k w_k E_k(x), summed in fp32 in the token's top-k order */
    for (size_t t = 0; t < T; t++) {
        float *y = b->y + t * H;
        memset(y, 0, H * sizeof *y);
        for (size_t k = 0; k < topk; k++) {
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
/* State API                                                                                  */

int kl_state_init(kl_state *s, const kl_model *m, kl_err *err)
{
    memset(s, 0, sizeof *s);
    dims d;
    bufs b;
    get_dims(m, &d);
    uint32_t nl = m->cfg.num_hidden_layers;
    s->m = m;
    s->kda = kl_calloc(nl ? nl : 1, sizeof *s->kda);
    s->mla = kl_calloc(nl ? nl : 1, sizeof *s->mla);
    s->scratch_floats = carve(NULL, &d, &b);
    s->scratch = kl_calloc(s->scratch_floats, sizeof(float));
    s->route = kl_calloc(route_ints(&d), sizeof *s->route);
    if (!s->kda || !s->mla || !s->scratch || !s->route)
        goto nomem;
    for (uint32_t l = 0; l < nl; l++) {
        if (m->layers[l].attn != KL_ATTN_KDA)
            continue;
        for (int k = 0; k < 3; k++) {
            size_t n = d.kD * (d.kw > 1 ? d.kw - 1 : 1);
            if (!(s->kda[l].conv[k] = kl_calloc(n, sizeof(float))))
                goto nomem;
        }
        if (!(s->kda[l].S = kl_calloc(d.kh * d.kd * d.kd, sizeof(float))))
            goto nomem;
    }
    return 0;
nomem:
    kl_state_free(s);
    return kl_fail(err, KL_E_NOMEM, "out of memory for the sequence state");
}

void kl_state_free(kl_state *s)
{
    if (!s)
        return;
    if (s->kda || s->mla) {
        uint32_t nl = s->m ? s->m->cfg.num_hidden_layers : 0;
        for (uint32_t l = 0; l < nl; l++) {
            if (s->kda) {
                for (int k = 0; k < 3; k++)
                    kl_free(s->kda[l].conv[k]);
                kl_free(s->kda[l].S);
            }
            if (s->mla)
                kl_free(s->mla[l].c);
        }
    }
    kl_free(s->kda);
    kl_free(s->mla);
    kl_free(s->scratch);
    kl_free(s->route);
    kl_free(s->scores);
    memset(s, 0, sizeof *s);
}

void kl_state_reset(kl_state *s)
{
    dims d;
    get_dims(s->m, &d);
    for (uint32_t l = 0; l < s->m->cfg.num_hidden_layers; l++) {
        if (s->kda[l].S) {
            for (int k = 0; k < 3; k++)
                memset(s->kda[l].conv[k], 0, d.kD * (d.kw > 1 ? d.kw - 1 : 1) * sizeof(float));
            memset(s->kda[l].S, 0, d.kh * d.kd * d.kd * sizeof(float));
        }
        s->mla[l].n = 0;
    }
    s->pos = 0;
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

/* Grows every MLA cache, and the attention-weight scratch, to hold at least need tokens
 * (doubling). */
static int reserve_mla(kl_state *s, const dims *d, size_t need, kl_err *err)
{
    for (uint32_t l = 0; l < s->m->cfg.num_hidden_layers; l++) {
        kl_mla_cache *mc = &s->mla[l];
        if (s->m->layers[l].attn != KL_ATTN_MLA || mc->cap >= need)
            continue;
        if (kl_grow(&mc->c, &mc->cap, need, kl_config_mla_token_bytes(&s->m->cfg, sizeof *mc->c)))
            return kl_fail(err, KL_E_NOMEM, "out of memory for an MLA cache of %zu tokens", need);
        size_t cap = mc->cap;
        if (s->scores_cap < cap) {
            /* scratch: nothing to keep, so free first and halve the peak */
            kl_free(s->scores);
            s->scores_cap = 0;
            size_t rows = scores_rows(d, cap);
            if (!(s->scores = kl_malloc(d->nh * rows * cap * sizeof *s->scores)))
                return kl_fail(err, KL_E_NOMEM, "out of memory for attention weights of %zu "
                               "tokens", cap);
            s->scores_cap = cap;
            s->scores_rows = rows;
        }
    }
    return 0;
}

int kl_state_copy(kl_state *dst, const kl_state *src, kl_err *err)
{
    if (dst == src)
        return 0;
    if (!dst->m || dst->m != src->m)
        return kl_fail(err, KL_E_USAGE, "state copy between states of different models");
    dims d;
    get_dims(src->m, &d);
    int rc = reserve_mla(dst, &d, src->pos, err);
    if (rc)
        return rc;
    size_t conv_n = d.kD * (d.kw > 1 ? d.kw - 1 : 1);
    for (uint32_t l = 0; l < src->m->cfg.num_hidden_layers; l++) {
        if (src->kda[l].S) {
            for (int k = 0; k < 3; k++)
                memcpy(dst->kda[l].conv[k], src->kda[l].conv[k], conv_n * sizeof(float));
            memcpy(dst->kda[l].S, src->kda[l].S, d.kh * d.kd * d.kd * sizeof(float));
        }
        /* MLA rows beyond n are never read, so only the held tokens travel */
        size_t n = src->mla[l].n;
        if (n)
            memcpy(dst->mla[l].c, src->mla[l].c,
                   n * kl_config_mla_token_bytes(&src->m->cfg, sizeof(float)));
        dst->mla[l].n = n;
    }
    dst->pos = src->pos;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Forward                                                                                    */

/* T <= CHUNK tokens through every layer; leaves their final hidden states in b->x. */
static void forward_chunk(kl_model *m, kl_state *s, const kl_token *ids, size_t T, const dims *d,
                          bufs *b)
{
    size_t H = d->hidden;
    float eps = (float)m->cfg.rms_norm_eps;
    /* embedding: no scaling, no positions */
    for (size_t t = 0; t < T; t++)
        kl_wmat_row_f32(&m->embed, (uint64_t)ids[t], b->x + t * H);
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        const kl_layer *L = &m->layers[l];
        /* h += Attn(RMSNorm_in(h)) */
        rmsnorm_rows(b->xn, b->x, L->vec[KL_ROLE_INPUT_NORM], T, H, eps);
        if (L->attn == KL_ATTN_KDA)
            kda_chunk(m, s, l, d, b, T);
        else
            mla_chunk(m, s, l, d, b, T);
        add_into(b->x, b->y, T * H);
        /* h += FFN(RMSNorm_post(h)) */
        rmsnorm_rows(b->xn, b->x, L->vec[KL_ROLE_POST_ATTN_NORM], T, H, eps);
        if (L->moe)
            moe_chunk(m, l, d, b, T);
        else
            glu(m, &L->w[KL_ROLE_MLP_GATE], &L->w[KL_ROLE_MLP_UP], &L->w[KL_ROLE_MLP_DOWN],
                b->xn, T, b->y, b);
        add_into(b->x, b->y, T * H);
    }
    s->pos += T;
}

int kl_forward(kl_model *m, kl_state *s, const kl_token *ids, size_t n, float *logits_last,
               kl_err *err)
{
    if (n == 0)
        return kl_fail(err, KL_E_USAGE, "no tokens to process");
    if (s->m != m)
        return kl_fail(err, KL_E_USAGE, "state was initialised for another model");
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= m->cfg.vocab_size)
            return kl_fail(err, KL_E_USAGE, "token id %u at %zu is outside the vocabulary (%u)",
                           (unsigned)ids[i], i, m->cfg.vocab_size);
    if (m->cfg.num_experts_per_token > MAX_TOPK ||
        m->cfg.num_experts_per_token > m->cfg.num_experts)
        return kl_fail(err, KL_E_UNSUPPORTED, "%u experts per token of %u (at most %d)",
                       m->cfg.num_experts_per_token, m->cfg.num_experts, MAX_TOPK);
    dims d;
    bufs b;
    get_dims(m, &d);
    carve(s->scratch, &d, &b);
    carve_ints(s->route, &d, &b);
    int rc = reserve_mla(s, &d, s->pos + n, err);
    if (rc)
        return rc;

    size_t last = 0;   /* tokens in the last chunk: its final row is the last token's */
    for (size_t i = 0; i < n; i += last) {
        last = n - i < CHUNK ? n - i : CHUNK;
        forward_chunk(m, s, ids + i, last, &d, &b);
    }
    /* final norm and lm_head for the last position only */
    if (logits_last) {
        rmsnorm(b.xn, b.x + (last - 1) * d.hidden, m->final_norm, d.hidden,
                (float)m->cfg.rms_norm_eps);
        kl_wmat_matvec(&m->lm_head, b.xn, logits_last, m->pool);
    }
    return 0;
}
