/*
 * engine/forward.c — CPU forward pass (see forward.h and kimi-linear.md §3).
 *
 * Sections: dimensions and scratch; elementwise helpers; KDA; MLA; FFN (dense, MoE);
 * state API; kl_forward.
 */
#include "engine/forward.h"

#include "common/mem.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Dimensions and scratch                                                                     */

typedef struct dims {
    size_t hidden, vocab;
    size_t kh, kd, kD, kw;        /* KDA heads, head dim, heads*dim, conv kernel */
    size_t nh, dn, dr, dv, R;     /* MLA heads, nope, rope, v dims, kv_lora_rank */
    size_t big;                   /* size of every non-hidden scratch buffer */
} dims;

typedef struct bufs {
    float *x, *xn, *y, *acc;      /* [hidden] residual, normed input, block output, MoE sum */
    float *q, *k, *v, *f, *g, *o; /* [big] projections, gates, attention output */
    float *lr;                    /* [big] low-rank / latent scratch */
    float *qlat;                  /* [big] MLA absorbed queries [nh, R] */
    float *ctx;                   /* [big] MLA attention-weighted latent [R] */
    float *row;                   /* [big] one weight row */
    float *h1, *h2;               /* [big] FFN intermediates */
    float *router;                /* [big] router scores */
} bufs;

#define N_BIG 13
#define MAX_TOPK 64   /* experts per token held on the stack; larger configs are refused */

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
    size_t b = max2(d->kD, d->nh * (d->dn + d->dr));
    b = max2(b, d->nh * d->dv);
    b = max2(b, d->nh * d->R);
    b = max2(b, d->R + d->dr);
    b = max2(b, d->hidden);
    b = max2(b, c->intermediate_size);
    b = max2(b, c->num_experts);
    /* low-rank gate projections and shared experts: take the bound tensors' sizes */
    for (uint32_t l = 0; l < c->num_hidden_layers; l++) {
        const kl_layer *L = &m->layers[l];
        for (int r = 0; r < KL_ROLE_COUNT; r++)
            b = max2(b, (size_t)L->w[r].rows);
        if (L->moe && L->experts[0])
            b = max2(b, (size_t)L->experts[0][0].rows);
    }
    d->big = b;
}

static void carve(const kl_state *s, const dims *d, bufs *b)
{
    float *p = s->scratch;
    b->x = p; p += d->hidden;
    b->xn = p; p += d->hidden;
    b->y = p; p += d->hidden;
    b->acc = p; p += d->hidden;
    float **big[N_BIG] = {&b->q, &b->k, &b->v, &b->f, &b->g, &b->o, &b->lr,
                          &b->qlat, &b->ctx, &b->row, &b->h1, &b->h2, &b->router};
    for (int i = 0; i < N_BIG; i++) {
        *big[i] = p;
        p += d->big;
    }
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

/* ------------------------------------------------------------------------------------------ */
/* KDA (§3.2)                                                                                 */

/* Causal depthwise conv with SiLU over one token, updating the window; x in, y out [D]. */
static void short_conv(float *y, const float *x, const float *w, float *win, size_t D, size_t W)
{
    for (size_t c = 0; c < D; c++) {
        const float *wc = w + c * W;
        float *st = win + c * (W - 1);
        float a = wc[W - 1] * x[c];               /* tap W-1: the current token */
        for (size_t j = 0; j + 1 < W; j++)
            a += wc[j] * st[j];
        for (size_t j = 0; j + 2 < W; j++)        /* slide: drop the oldest input */
            st[j] = st[j + 1];
        if (W > 1)
            st[W - 2] = x[c];
        y[c] = silu(a);
    }
}

static void kda_step(kl_model *m, kl_state *s, uint32_t l, const dims *d, bufs *b)
{
    const kl_layer *L = &m->layers[l];
    kl_kda_state *ks = &s->kda[l];
    size_t H = d->kh, K = d->kd, D = d->kD, W = d->kw;
    float eps = (float)m->cfg.rms_norm_eps;

    /* 1. projections (pre-conv values into f/g/o as scratch) */
    kl_wmat_matvec(&L->w[KL_ROLE_KDA_Q], b->xn, b->f, m->pool);
    kl_wmat_matvec(&L->w[KL_ROLE_KDA_K], b->xn, b->g, m->pool);
    kl_wmat_matvec(&L->w[KL_ROLE_KDA_V], b->xn, b->o, m->pool);
    /* 2. short causal conv + SiLU */
    short_conv(b->q, b->f, L->vec[KL_ROLE_KDA_Q_CONV], ks->conv[0], D, W);
    short_conv(b->k, b->g, L->vec[KL_ROLE_KDA_K_CONV], ks->conv[1], D, W);
    short_conv(b->v, b->o, L->vec[KL_ROLE_KDA_V_CONV], ks->conv[2], D, W);
    /* 3. forget gate g = -exp(A_log[h]) · softplus(f_b(f_a x) + dt_bias), log space */
    kl_wmat_matvec(&L->w[KL_ROLE_KDA_F_A], b->xn, b->lr, m->pool);
    kl_wmat_matvec(&L->w[KL_ROLE_KDA_F_B], b->lr, b->f, m->pool);
    const float *a_log = L->vec[KL_ROLE_KDA_A_LOG], *dt = L->vec[KL_ROLE_KDA_DT_BIAS];
    for (size_t c = 0; c < D; c++)
        b->f[c] = -expf(a_log[c / K]) * softplus(b->f[c] + dt[c]);
    /* 4. beta per head (into router scratch) */
    float *beta = b->router;
    kl_wmat_matvec(&L->w[KL_ROLE_KDA_B], b->xn, beta, m->pool);
    for (size_t h = 0; h < H; h++)
        beta[h] = sigmoid(beta[h]);
    /* 7a. output gate (low rank), computed before the recurrence reuses lr */
    kl_wmat_matvec(&L->w[KL_ROLE_KDA_G_A], b->xn, b->lr, m->pool);
    kl_wmat_matvec(&L->w[KL_ROLE_KDA_G_B], b->lr, b->g, m->pool);

    const float *onorm = L->vec[KL_ROLE_KDA_O_NORM];
    float qscale = 1.0f / sqrtf((float)K);
    for (size_t h = 0; h < H; h++) {
        float *q = b->q + h * K, *k = b->k + h * K, *v = b->v + h * K, *o = b->o + h * K;
        const float *gh = b->f + h * K, *gate = b->g + h * K;
        float *S = ks->S + h * K * K;
        /* 6. L2 norm with eps inside the sqrt; q scaled by 1/sqrt(K) */
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
        /* decay: row i of S times exp(g[i]) */
        for (size_t i = 0; i < K; i++) {
            float e = expf(gh[i]);
            for (size_t j = 0; j < K; j++)
                S[i * K + j] *= e;
        }
        /* delta update: u = β (v − Sᵀ k̂); S += k̂ uᵀ  (u kept in o) */
        for (size_t j = 0; j < K; j++)
            o[j] = 0.0f;
        for (size_t i = 0; i < K; i++)
            for (size_t j = 0; j < K; j++)
                o[j] += S[i * K + j] * k[i];
        for (size_t j = 0; j < K; j++)
            o[j] = beta[h] * (v[j] - o[j]);
        for (size_t i = 0; i < K; i++)
            for (size_t j = 0; j < K; j++)
                S[i * K + j] += k[i] * o[j];
        /* read-out with the updated state: o = Sᵀ q̂ */
        for (size_t j = 0; j < K; j++)
            o[j] = 0.0f;
        for (size_t i = 0; i < K; i++)
            for (size_t j = 0; j < K; j++)
                o[j] += S[i * K + j] * q[i];
        /* 7b. gated RMSNorm per head, sigmoid gate */
        float ss = 0.0f;
        for (size_t j = 0; j < K; j++)
            ss += o[j] * o[j];
        float inv = 1.0f / sqrtf(ss / (float)K + eps);
        for (size_t j = 0; j < K; j++)
            o[j] = o[j] * inv * onorm[j] * sigmoid(gate[j]);
    }
    /* 8. o_proj */
    kl_wmat_matvec(&L->w[KL_ROLE_KDA_O], b->o, b->y, m->pool);
}

/* ------------------------------------------------------------------------------------------ */
/* MLA without RoPE, absorbed form (§3.3)                                                     */

static void mla_step(kl_model *m, kl_state *s, uint32_t l, const dims *d, bufs *b)
{
    const kl_layer *L = &m->layers[l];
    kl_mla_cache *mc = &s->mla[l];
    size_t nh = d->nh, dn = d->dn, dr = d->dr, dv = d->dv, R = d->R, cw = R + dr;
    const kl_wmat *kvb = &L->w[KL_ROLE_MLA_KV_B];

    /* 1. q = W_q x  [nh, dn+dr] */
    kl_wmat_matvec(&L->w[KL_ROLE_MLA_Q], b->xn, b->q, m->pool);
    /* 2-3. latent c (normed, eps 1e-6) and shared k_r (not normed) into the cache */
    kl_wmat_matvec(&L->w[KL_ROLE_MLA_KV_A], b->xn, b->lr, m->pool);
    float *cn = mc->c + mc->n * cw;
    rmsnorm(cn, b->lr, L->vec[KL_ROLE_MLA_KV_A_NORM], R, 1e-6f);
    memcpy(cn + R, b->lr + R, dr * sizeof *cn);
    mc->n++;
    /* absorbed query: qlat_h = W_kb,hᵀ q_nope,h  [nh, R] */
    for (size_t h = 0; h < nh; h++) {
        float *ql = b->qlat + h * R;
        const float *qh = b->q + h * (dn + dr);
        for (size_t r = 0; r < R; r++)
            ql[r] = 0.0f;
        for (size_t i = 0; i < dn; i++) {
            kl_wmat_row_f32(kvb, h * (dn + dv) + i, b->row);
            for (size_t r = 0; r < R; r++)
                ql[r] += qh[i] * b->row[r];
        }
    }
    float scale = 1.0f / sqrtf((float)(dn + dr));
    for (size_t h = 0; h < nh; h++) {
        const float *ql = b->qlat + h * R, *qr = b->q + h * (dn + dr) + dn;
        /* scores over every cached token (causal: the cache holds tokens 0..t), fp32 softmax */
        float mx = -INFINITY;
        for (size_t t = 0; t < mc->n; t++) {
            const float *ct = mc->c + t * cw;
            float sc = 0.0f;
            for (size_t r = 0; r < R; r++)
                sc += ql[r] * ct[r];
            for (size_t r = 0; r < dr; r++)
                sc += qr[r] * ct[R + r];
            mc->scores[t] = sc * scale;
            if (mc->scores[t] > mx)
                mx = mc->scores[t];
        }
        float sum = 0.0f;
        for (size_t t = 0; t < mc->n; t++) {
            mc->scores[t] = expf(mc->scores[t] - mx);
            sum += mc->scores[t];
        }
        /* ctx = Σ p_t c_t; out_h = W_vb,h ctx */
        for (size_t r = 0; r < R; r++)
            b->ctx[r] = 0.0f;
        for (size_t t = 0; t < mc->n; t++) {
            float p = mc->scores[t] / sum;
            const float *ct = mc->c + t * cw;
            for (size_t r = 0; r < R; r++)
                b->ctx[r] += p * ct[r];
        }
        for (size_t j = 0; j < dv; j++)
            b->o[h * dv + j] = kl_wmat_dot(kvb, h * (dn + dv) + dn + j, b->ctx);
    }
    kl_wmat_matvec(&L->w[KL_ROLE_MLA_O], b->o, b->y, m->pool);
}

/* ------------------------------------------------------------------------------------------ */
/* FFN: SiLU-gated MLP, dense (§3.5) and MoE (§3.4)                                           */

/* out = down(SiLU(gate x) ⊙ (up x)) */
static void glu(kl_model *m, const kl_wmat *gate, const kl_wmat *up, const kl_wmat *down,
                const float *x, float *out, bufs *b)
{
    kl_wmat_matvec(gate, x, b->h1, m->pool);
    kl_wmat_matvec(up, x, b->h2, m->pool);
    for (uint64_t i = 0; i < gate->rows; i++)
        b->h1[i] = silu(b->h1[i]) * b->h2[i];
    kl_wmat_matvec(down, b->h1, out, m->pool);
}

static void moe_step(kl_model *m, uint32_t l, const dims *d, bufs *b)
{
    const kl_layer *L = &m->layers[l];
    const kl_config *c = &m->cfg;
    size_t E = c->num_experts, topk = c->num_experts_per_token;
    const float *bias = L->vec[KL_ROLE_ROUTER_BIAS];
    float *s = b->router;              /* sigmoid scores [E] */
    float *sel = b->lr;                /* selection scores [E] (may be -inf once taken) */
    int32_t idx[MAX_TOPK];
    float wt[MAX_TOPK];

    /* 1. fp32 router, sigmoid */
    kl_wmat_matvec(&L->w[KL_ROLE_ROUTER], b->xn, s, m->pool);
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
    /* 5-6. routed experts, summed in fp32 */
    for (size_t i = 0; i < d->hidden; i++)
        b->acc[i] = 0.0f;
    for (size_t k = 0; k < topk; k++) {
        size_t e = (size_t)idx[k];
        glu(m, &L->experts[0][e], &L->experts[2][e], &L->experts[1][e], b->xn, b->y, b);
        for (size_t i = 0; i < d->hidden; i++)
            b->acc[i] += wt[k] * b->y[i];
    }
    /* 7-8. shared experts, unscaled */
    if (L->w[KL_ROLE_SHARED_GATE].kind != KL_W_NONE) {
        glu(m, &L->w[KL_ROLE_SHARED_GATE], &L->w[KL_ROLE_SHARED_UP], &L->w[KL_ROLE_SHARED_DOWN],
            b->xn, b->y, b);
        for (size_t i = 0; i < d->hidden; i++)
            b->acc[i] += b->y[i];
    }
    memcpy(b->y, b->acc, d->hidden * sizeof *b->y);
}

/* ------------------------------------------------------------------------------------------ */
/* State API                                                                                  */

int kl_state_init(kl_state *s, const kl_model *m, kl_err *err)
{
    memset(s, 0, sizeof *s);
    dims d;
    get_dims(m, &d);
    uint32_t nl = m->cfg.num_hidden_layers;
    s->m = m;
    s->kda = kl_calloc(nl ? nl : 1, sizeof *s->kda);
    s->mla = kl_calloc(nl ? nl : 1, sizeof *s->mla);
    s->scratch_floats = 4 * d.hidden + N_BIG * d.big;
    s->scratch = kl_calloc(s->scratch_floats, sizeof(float));
    if (!s->kda || !s->mla || !s->scratch)
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
            if (s->mla) {
                kl_free(s->mla[l].c);
                kl_free(s->mla[l].scores);
            }
        }
    }
    kl_free(s->kda);
    kl_free(s->mla);
    kl_free(s->scratch);
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

/* Grows every MLA cache to hold at least need tokens (doubling). */
static int reserve_mla(kl_state *s, const dims *d, size_t need, kl_err *err)
{
    for (uint32_t l = 0; l < s->m->cfg.num_hidden_layers; l++) {
        kl_mla_cache *mc = &s->mla[l];
        if (s->m->layers[l].attn != KL_ATTN_MLA || mc->cap >= need)
            continue;
        size_t cap = mc->cap ? mc->cap : 64;
        while (cap < need)
            cap *= 2;
        float *c = kl_realloc(mc->c, cap * (d->R + d->dr) * sizeof *c);
        if (!c)
            return kl_fail(err, KL_E_NOMEM, "out of memory for an MLA cache of %zu tokens", cap);
        mc->c = c;
        float *sc = kl_realloc(mc->scores, cap * sizeof *sc);
        if (!sc)
            return kl_fail(err, KL_E_NOMEM, "out of memory for an MLA cache of %zu tokens", cap);
        mc->scores = sc;
        mc->cap = cap;
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
            memcpy(dst->mla[l].c, src->mla[l].c, n * (d.R + d.dr) * sizeof(float));
        dst->mla[l].n = n;
    }
    dst->pos = src->pos;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Forward                                                                                    */

int kl_forward(kl_model *m, kl_state *s, const int32_t *ids, size_t n, float *logits_last,
               kl_err *err)
{
    if (n == 0)
        return kl_fail(err, KL_E_USAGE, "no tokens to process");
    if (s->m != m)
        return kl_fail(err, KL_E_USAGE, "state was initialised for another model");
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= m->cfg.vocab_size)
            return kl_fail(err, KL_E_USAGE, "token id %d at %zu is outside the vocabulary (%u)",
                           (int)ids[i], i, m->cfg.vocab_size);
    if (m->cfg.num_experts_per_token > MAX_TOPK)
        return kl_fail(err, KL_E_UNSUPPORTED, "%u experts per token (at most %d)",
                       m->cfg.num_experts_per_token, MAX_TOPK);
    dims d;
    bufs b;
    get_dims(m, &d);
    carve(s, &d, &b);
    int rc = reserve_mla(s, &d, s->pos + n, err);
    if (rc)
        return rc;
    float eps = (float)m->cfg.rms_norm_eps;

    for (size_t t = 0; t < n; t++) {
        /* embedding: no scaling, no positions */
        kl_wmat_row_f32(&m->embed, (uint64_t)ids[t], b.x);
        for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
            const kl_layer *L = &m->layers[l];
            /* h += Attn(RMSNorm_in(h)) */
            rmsnorm(b.xn, b.x, L->vec[KL_ROLE_INPUT_NORM], d.hidden, eps);
            if (L->attn == KL_ATTN_KDA)
                kda_step(m, s, l, &d, &b);
            else
                mla_step(m, s, l, &d, &b);
            for (size_t i = 0; i < d.hidden; i++)
                b.x[i] += b.y[i];
            /* h += FFN(RMSNorm_post(h)) */
            rmsnorm(b.xn, b.x, L->vec[KL_ROLE_POST_ATTN_NORM], d.hidden, eps);
            if (L->moe)
                moe_step(m, l, &d, &b);
            else
                glu(m, &L->w[KL_ROLE_MLP_GATE], &L->w[KL_ROLE_MLP_UP], &L->w[KL_ROLE_MLP_DOWN],
                    b.xn, b.y, &b);
            for (size_t i = 0; i < d.hidden; i++)
                b.x[i] += b.y[i];
        }
        s->pos++;
    }
    /* final norm and lm_head for the last position only */
    if (logits_last) {
        rmsnorm(b.xn, b.x, m->final_norm, d.hidden, eps);
        kl_wmat_matvec(&m->lm_head, b.xn, logits_last, m->pool);
    }
    return 0;
}
