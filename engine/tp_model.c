/*
 * engine/tp_model.c — a rank's cut of a model (see tp_model.h).
 */
#include "engine/tp_model.h"

#include "common/mem.h"
#include "engine/backend_tp.h"
#include "engine/tp_cut.h"
#include "loader/arena.h"
#include "loader/tp_split.h"

#include <string.h>

/* The cut's owned buffers (column copies), grown as they come. */
typedef struct owned {
    void   **p;
    size_t   n, cap;
    uint64_t bytes;   /* the matrices they hold */
} owned;

static int own(owned *o, void *p)
{
    if (!p)
        return 0;
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        void **np = kl_realloc(o->p, cap * sizeof *np);
        if (!np)
            return -1;
        o->p = np, o->cap = cap;
    }
    o->p[o->n++] = p;
    return 0;
}

static int cut_matrix(const kl_wmat *w, kl_tp_split s, unsigned tp, unsigned r, uint32_t expert,
                      uint32_t E, kl_wmat *out, owned *o, kl_err *err)
{
    void *copy = NULL;
    int rc = kl_tp_cut(w, s, tp, r, expert, E, out, &copy, err);
    if (!rc && own(o, copy)) {
        kl_free(copy);
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    o->bytes += copy && !rc ? kl_wmat_bytes(out) : 0;
    return rc;
}

/* A vector role's slice (its heads' or channels' part: contiguous in the fp32 copy, the cut
 * dimension being the first one, or H of A_log's [1, 1, H, 1]) as a copy of its own. */
static int cut_vector(const kl_wmat *w, const float *v, kl_tp_split s, unsigned tp, unsigned r,
                      kl_wmat *wo, float **vo, kl_err *err)
{
    const uint64_t numel = w->rows * w->cols;
    const int whole = s.kind == KL_TP_WHOLE || tp <= 1;
    const uint64_t D = whole ? 1 : w->rows == 1 ? w->cols : w->rows, inner = numel / D;
    uint64_t start = 0, len = 1;
    if (!whole)
        kl_tp_part(D, tp, r, &start, &len);
    *wo = *w;
    if (!whole) {
        const size_t es = w->kind == KL_W_F32 ? 4 : 2;
        wo->data = w->data ? (const uint8_t *)w->data + start * inner * es : NULL;
        if (w->rows == 1)
            wo->cols = len;
        else
            wo->rows = len;
    }
    const size_t n = (size_t)(len * inner);
    if (!(*vo = kl_malloc((n ? n : 1) * sizeof **vo)))
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    memcpy(*vo, v + start * inner, n * sizeof **vo);
    return 0;
}

static int cut_layer(const kl_layer *L, kl_layer *out, unsigned tp, unsigned r, int ep,
                     uint32_t E, owned *o, kl_err *err)
{
    out->attn = L->attn;
    out->moe = L->moe;
    int rc = 0;
    for (int k = 0; k < KL_ROLE_COUNT && !rc; k++) {
        const kl_tp_split s = kl_tp_split_of((kl_role)k, 0);
        if (L->w[k].kind == KL_W_NONE || kl_role_is_expert((kl_role)k))
            continue;
        rc = L->vec[k] ? cut_vector(&L->w[k], L->vec[k], s, tp, r, &out->w[k], &out->vec[k], err)
                       : cut_matrix(&L->w[k], s, tp, r, 0, E, &out->w[k], o, err);
    }
    for (int k = 0; k < 3 && !rc && L->experts[k]; k++) {
        const kl_tp_split s = kl_tp_split_of((kl_role)(KL_ROLE_EXPERT_W1 + k), ep);
        if (!(out->experts[k] = kl_calloc(E ? E : 1, sizeof *out->experts[k])))
            return kl_fail(err, KL_E_NOMEM, "out of memory");
        for (uint32_t e = 0; e < E && !rc; e++)
            rc = cut_matrix(&L->experts[k][e], s, tp, r, e, E, &out->experts[k][e], o, err);
    }
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Sources: every matrix of the cut as a host piece                                           */

static void add_src(kl_model *m, kl_role role, int32_t layer, int32_t expert, const kl_wmat *w)
{
    if (w->kind == KL_W_NONE)
        return;
    kl_model_src s = {.role = role, .part = KL_PART_WEIGHT, .layer = layer, .expert = expert};
    if (w->kind == KL_W_MXFP4) {
        s.part = KL_PART_PACKED, s.host = w->packed, s.bytes = w->rows * w->cols / 2;
        m->src[m->n_src++] = s;
        s.part = KL_PART_SCALE, s.host = w->scale, s.bytes = w->rows * (w->cols / 32);
    } else {
        s.host = w->data, s.bytes = kl_wmat_bytes(w);
    }
    m->src[m->n_src++] = s;
}

/* Every matrix of cut model m as a host source, and whole's final norm (as it is stored). */
static int make_sources(kl_model *m, const kl_model *whole, kl_err *err)
{
    const uint32_t nl = m->cfg.num_hidden_layers, E = m->cfg.num_experts;
    const size_t cap = 4 + (size_t)nl * (2 * KL_ROLE_COUNT + 6 * (size_t)E);
    if (!(m->src = kl_calloc(cap, sizeof *m->src)))
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < whole->n_src; i++)
        if (whole->src[i].role == KL_ROLE_FINAL_NORM)
            m->src[m->n_src++] = (kl_model_src){.role = KL_ROLE_FINAL_NORM, .layer = -1,
                                                .expert = -1, .bytes = whole->src[i].bytes};
    add_src(m, KL_ROLE_EMBED, -1, -1, &m->embed);
    if (!m->cfg.tie_word_embeddings)
        add_src(m, KL_ROLE_LM_HEAD, -1, -1, &m->lm_head);
    for (uint32_t l = 0; l < nl; l++) {
        const kl_layer *L = &m->layers[l];
        for (int k = 0; k < KL_ROLE_COUNT; k++)
            if (!L->vec[k] && !kl_role_is_expert((kl_role)k))
                add_src(m, (kl_role)k, (int32_t)l, -1, &L->w[k]);
        for (int k = 0; k < 3 && L->experts[k]; k++)
            for (uint32_t e = 0; e < E; e++)
                add_src(m, (kl_role)(KL_ROLE_EXPERT_W1 + k), (int32_t)l, (int32_t)e,
                        &L->experts[k][e]);
    }
    for (size_t i = 0; i < m->n_src; i++)
        m->weight_bytes += m->src[i].bytes;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Sources from the checkpoint's files (the whole model opened vectors_only)                  */

/* The matrix of m that source s binds to (NULL: a vector, the final norm, an absent expert). */
static kl_wmat *bound(kl_model *m, const kl_model_src *s)
{
    if (s->layer < 0)
        return s->role == KL_ROLE_EMBED     ? &m->embed
               : s->role == KL_ROLE_LM_HEAD ? &m->lm_head
                                            : NULL;
    kl_layer *L = &m->layers[s->layer];
    if (kl_role_is_expert(s->role))
        return L->experts[s->role - KL_ROLE_EXPERT_W1] && s->expert >= 0
                   ? &L->experts[s->role - KL_ROLE_EXPERT_W1][s->expert] : NULL;
    return L->vec[s->role] ? NULL : &L->w[s->role];
}

/* Source ws of the whole model (its matrix wm) as the cut needs it, still in m's files: a row
 * cut is its rows' range, a column cut its columns' bytes of every row (pitch: the whole
 * row), a whole tensor unchanged. */
static void file_source(kl_model *c, const kl_wmat *wm, const kl_model_src *ws, kl_tp_split sp,
                        unsigned tp, unsigned r)
{
    kl_model_src cs = *ws;
    const uint64_t rows = wm->rows, rb = ws->bytes / (rows ? rows : 1);
    uint64_t start, len;
    if (sp.kind == KL_TP_OUT) {
        kl_tp_part(rows, tp, r, &start, &len);
        cs.off += start * rb, cs.bytes = len * rb;
    } else if (sp.kind == KL_TP_IN) {   /* its columns [start, start + len) of every row */
        kl_tp_part(wm->cols, tp, r, &start, &len);
        cs.width = len * rb / wm->cols, cs.pitch = rb;
        cs.off += start * rb / wm->cols, cs.bytes = rows * cs.width;
    }
    c->src[c->n_src++] = cs;
}

/* Every matrix of cut model c from m's files (m opened vectors_only), and the final norm. */
static int file_sources(kl_model *c, const kl_model *m, unsigned tp, unsigned r, int ep,
                        kl_err *err)
{
    if (!(c->src = kl_calloc(m->n_src + 1, sizeof *c->src)) ||
        !(c->shard_paths = kl_calloc(m->n_shards ? m->n_shards : 1, sizeof *c->shard_paths)))
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (uint32_t i = 0; i < m->n_shards; i++, c->n_shards++)
        if (!(c->shard_paths[i] = kl_strdup(m->shard_paths[i])))
            return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < m->n_src; i++) {
        const kl_model_src *ws = &m->src[i];
        const kl_wmat *wm = ws->role == KL_ROLE_FINAL_NORM ? NULL : bound((kl_model *)m, ws);
        kl_wmat *cm = wm ? bound(c, ws) : NULL;
        if (ws->role == KL_ROLE_FINAL_NORM)
            c->src[c->n_src++] = *ws;   /* a vector: the plan takes its fp32 copy */
        if (!cm || cm->kind == KL_W_NONE)
            continue;   /* a vector, or an expert this rank does not own */
        kl_tp_split sp = ws->layer < 0 ? (kl_tp_split){KL_TP_OUT, 0}
                                       : kl_tp_split_of(ws->role, ep);
        if (tp <= 1 || sp.kind == KL_TP_OWNER)
            sp.kind = KL_TP_WHOLE;
        file_source(c, wm, ws, sp, tp, r);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                 */

/* The rank's config: heads, widths and vocabulary rows divided by tp (the experts' width
 * whole with expert parallel: the routed experts are; the shared ones' rows say their cut). */
static void cut_config(kl_config *c, unsigned tp, int ep)
{
    uint32_t *div[] = {&c->num_attention_heads, &c->num_key_value_heads, &c->kda_num_heads,
                       &c->intermediate_size, ep ? NULL : &c->moe_intermediate_size};
    for (size_t i = 0; i < sizeof div / sizeof *div; i++)
        if (div[i])
            *div[i] /= tp;
}

static int cut_model(kl_model *c, const kl_model *m, unsigned tp, unsigned r, int ep,
                     kl_err *err)
{
    const uint32_t nl = m->cfg.num_hidden_layers, E = m->cfg.num_experts;
    owned o = {0};
    uint64_t v0, vn;
    c->cfg = m->cfg;
    c->route_weights = m->route_weights;
    c->pool = m->pool;
    c->matrices_read = m->matrices_read;
    kl_tp_part(m->lm_head.rows, tp, r, &v0, &vn);   /* the vocabulary part, tied or not */
    c->embed = kl_wmat_rows(&m->embed, v0, vn);
    c->lm_head = kl_wmat_rows(&m->lm_head, v0, vn);
    c->vocab0 = v0;
    if (tp > 1) {
        cut_config(&c->cfg, tp, ep);
        c->cfg.vocab_size = (uint32_t)vn;
        c->vocab_part = 1;
    }
    c->layers = kl_calloc(nl ? nl : 1, sizeof *c->layers);
    c->final_norm = kl_malloc((size_t)m->cfg.hidden_size * sizeof *c->final_norm);
    int rc = !c->layers || !c->final_norm ? kl_fail(err, KL_E_NOMEM, "out of memory") : 0;
    if (!rc)
        memcpy(c->final_norm, m->final_norm, (size_t)m->cfg.hidden_size * sizeof *c->final_norm);
    for (uint32_t l = 0; l < nl && !rc; l++)
        rc = cut_layer(&m->layers[l], &c->layers[l], tp, r, ep && tp > 1, E, &o, err);
    if (!rc)
        rc = m->matrices_read ? make_sources(c, m, err) : file_sources(c, m, tp, r, ep, err);
    for (size_t i = 0; !rc && !m->matrices_read && i < c->n_src; i++)
        c->weight_bytes += c->src[i].bytes;
    c->bufs = o.p;
    c->n_bufs = o.n;
    c->cut_copied_bytes = o.bytes;
    return rc;
}

int kl_model_tp_cut(kl_model **out, const kl_model *m, unsigned tp, unsigned rank, int ep,
                    kl_err *err)
{
    *out = NULL;
    int rc = kl_backend_tp_check(&m->cfg, tp, ep, err);   /* the one message naming sizes */
    if (rc)
        return rc;
    if (rank >= tp)
        return kl_fail(err, KL_E_USAGE, "rank %u of tensor-parallel size %u", rank, tp);
    kl_model *c = kl_calloc(1, sizeof *c);
    if (!c)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    if ((rc = cut_model(c, m, tp, rank, ep, err))) {
        kl_model_tp_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kl_model_tp_free(kl_model *cut)
{
    if (!cut)
        return;
    cut->pool = NULL;   /* the source model's */
    kl_model_close(cut);
}
