/*
 * engine/backend_tp.c — N rank backends driven as one (see backend_tp.h).
 */
#include "engine/backend_tp.h"

#include "common/mem.h"
#include "engine/tp_model.h"
#include "loader/tp_split.h"

#include <math.h>
#include <string.h>

typedef struct tp_be {
    kl_backend   be;
    unsigned     n;
    kl_model   **cut;       /* [n] the ranks' cut models (owned, each owning its backend) */
    kl_backend **rank;      /* [n] cut[r]->be */
    size_t       n_want;    /* the chunk's wanted tokens */
} tp_be;

static tp_be *tp(kl_backend *be)
{
    return be->impl;
}

/* After a change of slot s on the ranks: the wrapper's view of it is rank 0's. */
static void sync_slot(kl_backend *be, uint32_t s)
{
    be->slot_used[s] = tp(be)->rank[0]->slot_used[s];
    be->slot_len[s] = tp(be)->rank[0]->slot_len[s];
}

/* ------------------------------------------------------------------------------------------ */
/* Slots: the same on every rank                                                              */

static void tp_slot_close(kl_backend *be, uint32_t slot)
{
    tp_be *t = tp(be);
    if (slot >= be->max_slots)
        return;
    for (unsigned r = 0; r < t->n; r++)
        t->rank[r]->ops->slot_close(t->rank[r], slot);
    sync_slot(be, slot);
}

static int tp_slot_open(kl_backend *be, uint32_t *slot, kl_err *err)
{
    tp_be *t = tp(be);
    int rc = t->rank[0]->ops->slot_open(t->rank[0], slot, err);
    for (unsigned r = 1; r < t->n && !rc; r++) {
        uint32_t s;
        rc = t->rank[r]->ops->slot_open(t->rank[r], &s, err);
        if (!rc && s != *slot) {
            t->rank[r]->ops->slot_close(t->rank[r], s);
            rc = kl_fail(err, KL_E_BUG, "rank %u opened slot %u where rank 0 opened %u", r, s,
                         *slot);
        }
        if (rc) {   /* close what the earlier ranks opened */
            for (unsigned q = 0; q < r; q++)
                t->rank[q]->ops->slot_close(t->rank[q], *slot);
            return rc;
        }
    }
    if (!rc)
        sync_slot(be, *slot);
    return rc;
}

static void tp_slot_reset(kl_backend *be, uint32_t slot)
{
    tp_be *t = tp(be);
    for (unsigned r = 0; r < t->n; r++)
        t->rank[r]->ops->slot_reset(t->rank[r], slot);
    sync_slot(be, slot);
}

static int tp_slot_copy(kl_backend *be, uint32_t dst, uint32_t src, kl_err *err)
{
    tp_be *t = tp(be);
    int rc = 0;
    for (unsigned r = 0; r < t->n && !rc; r++)
        rc = t->rank[r]->ops->slot_copy(t->rank[r], dst, src, err);
    sync_slot(be, dst);
    return rc;
}

static int tp_slot_fill(kl_backend *be, uint32_t slot, size_t n, kl_err *err)
{
    tp_be *t = tp(be);
    int rc = 0;
    for (unsigned r = 0; r < t->n && !rc; r++)
        rc = t->rank[r]->ops->slot_fill(t->rank[r], slot, n, err);
    sync_slot(be, slot);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* One chunk                                                                                  */

static int tp_begin(kl_backend *be, const kl_batch *chunk, kl_err *err)
{
    tp_be *t = tp(be);
    t->n_want = 0;
    for (size_t i = 0; i < chunk->n; i++)
        t->n_want += chunk->want ? chunk->want[i] != 0 : i + 1 == chunk->n;
    int rc = 0;
    for (unsigned r = 0; r < t->n && !rc; r++)
        rc = t->rank[r]->ops->begin(t->rank[r], chunk, err);
    if (!rc && t->n > 1 && t->cut[0]->vocab_part)   /* each rank embedded its ids only */
        rc = t->rank[0]->ops->all_reduce(t->rank, t->n, KL_TP_SUM_X, err);
    return rc;
}

static int tp_norm(kl_backend *be, kl_norm_which which, uint32_t layer, kl_err *err)
{
    tp_be *t = tp(be);
    int rc = 0;
    for (unsigned r = 0; r < t->n && !rc; r++)
        rc = t->rank[r]->ops->norm(t->rank[r], which, layer, err);
    return rc;
}

static int tp_add_norm(kl_backend *be, kl_norm_which which, uint32_t layer, kl_err *err)
{
    tp_be *t = tp(be);
    int rc = 0;
    for (unsigned r = 0; r < t->n && !rc; r++)
        rc = t->rank[r]->ops->add_norm(t->rank[r], which, layer, err);
    return rc;
}

typedef enum block_kind { BLOCK_KDA, BLOCK_MLA, BLOCK_MOE, BLOCK_MLP } block_kind;

/* A block on every rank, then their partial outputs summed. */
static int block(kl_backend *be, block_kind k, uint32_t l, kl_err *err)
{
    tp_be *t = tp(be);
    int rc = 0;
    for (unsigned r = 0; r < t->n && !rc; r++) {
        kl_backend *b = t->rank[r];
        rc = k == BLOCK_KDA   ? b->ops->kda(b, l, err)
             : k == BLOCK_MLA ? b->ops->mla(b, l, err)
             : k == BLOCK_MOE ? b->ops->moe(b, l, err)
                              : b->ops->mlp(b, l, err);
    }
    return rc ? rc : t->n > 1 ? t->rank[0]->ops->all_reduce(t->rank, t->n, KL_TP_SUM_Y, err) : 0;
}

static int tp_kda(kl_backend *be, uint32_t l, kl_err *err)
{
    return block(be, BLOCK_KDA, l, err);
}

static int tp_mla(kl_backend *be, uint32_t l, kl_err *err)
{
    return block(be, BLOCK_MLA, l, err);
}

static int tp_moe(kl_backend *be, uint32_t l, kl_err *err)
{
    return block(be, BLOCK_MOE, l, err);
}

static int tp_mlp(kl_backend *be, uint32_t l, kl_err *err)
{
    return block(be, BLOCK_MLP, l, err);
}

/* Row k's argmax offered rank by rank in vocabulary order: a rank's own (its first largest,
 * NaN skipped, as kl_sample_argmax) replaces the best so far only when larger, so the whole
 * row's first largest wins without a pass over the row. */
static void offer_argmax(kl_token *best, float *best_v, kl_token id, float v)
{
    if (!isnan(v) && (isnan(*best_v) || v > *best_v)) {
        *best = id;
        *best_v = v;
    }
}

/* Each rank's vocabulary part of the wanted rows, side by side in rows of the whole
 * vocabulary; the argmax from the ranks' own (on the device for GPU ranks). */
static int tp_head(kl_backend *be, float *logits, kl_token *argmax, kl_err *err)
{
    tp_be *t = tp(be);
    const size_t nw = t->n_want, V = be->m->cfg.vocab_size, rows = nw ? nw : 1;
    size_t vmax = 0;
    for (unsigned r = 0; r < t->n; r++)
        vmax = t->cut[r]->cfg.vocab_size > vmax ? t->cut[r]->cfg.vocab_size : vmax;
    float *part = kl_malloc(rows * vmax * sizeof *part), *best_v = kl_malloc(rows * sizeof(float));
    kl_token *own = kl_malloc(rows * sizeof *own);
    int rc = part && best_v && own ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory for %zu rows "
                                                 "of logits", nw);
    for (size_t k = 0; !rc && argmax && k < nw; k++) {
        argmax[k] = 0;
        best_v[k] = NAN;
    }
    size_t v0 = 0;
    for (unsigned r = 0; r < t->n && !rc; r++) {
        const size_t vn = t->cut[r]->cfg.vocab_size;
        rc = t->rank[r]->ops->head(t->rank[r], part, argmax ? own : NULL, err);
        for (size_t k = 0; !rc && k < nw; k++) {
            if (logits)
                memcpy(logits + k * V + v0, part + k * vn, vn * sizeof *part);
            if (argmax)
                offer_argmax(&argmax[k], &best_v[k], (kl_token)(v0 + own[k]),
                             part[k * vn + own[k]]);
        }
        v0 += vn;
    }
    kl_free(own);
    kl_free(best_v);
    kl_free(part);
    return rc;
}

static int tp_end(kl_backend *be, kl_err *err)
{
    tp_be *t = tp(be);
    int rc = 0;
    for (unsigned r = 0; r < t->n; r++) {   /* every rank, even after an error */
        int e = t->rank[r]->ops->end(t->rank[r], err);
        rc = rc ? rc : e;
    }
    for (uint32_t s = 0; s < be->max_slots; s++)
        sync_slot(be, s);
    return rc;
}

static void tp_destroy(kl_backend *be)
{
    tp_be *t = tp(be);
    for (unsigned r = t->n; r-- > 0;)   /* last first: a later rank may use rank 0's stream */
        kl_model_tp_free(t->cut[r]);
    kl_free(t->cut);
    kl_free(t->rank);
    kl_free(be->slot_len);
    kl_free(be->slot_used);
    kl_free(t);
}

static const kl_backend_ops tp_ops = {
    .slot_open = tp_slot_open, .slot_close = tp_slot_close, .slot_reset = tp_slot_reset,
    .slot_copy = tp_slot_copy, .slot_fill = tp_slot_fill, .begin = tp_begin, .norm = tp_norm,
    .add_norm = tp_add_norm, .kda = tp_kda, .mla = tp_mla, .moe = tp_moe, .mlp = tp_mlp,
    .head = tp_head, .end = tp_end, .destroy = tp_destroy,
    /* all_reduce NULL: a wrapper is not itself a rank */
};

kl_backend *kl_backend_tp_rank(const kl_backend *be, unsigned r)
{
    return r < kl_backend_tp_size(be) ? ((const tp_be *)be->impl)->rank[r] : NULL;
}

unsigned kl_backend_tp_size(const kl_backend *be)
{
    return be && be->ops == &tp_ops ? ((const tp_be *)be->impl)->n : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Creation                                                                                   */

static int check_ranks(kl_model **ranks, unsigned n, kl_err *err)
{
    if (!n)
        return kl_fail(err, KL_E_USAGE, "tensor parallel over no ranks");
    for (unsigned r = 0; r < n; r++) {
        const kl_backend *b = ranks[r] ? ranks[r]->be : NULL;
        if (!b || !b->ops->all_reduce || b->ops != ranks[0]->be->ops ||
            b->max_slots != ranks[0]->be->max_slots)
            return kl_fail(err, KL_E_USAGE, "rank %u has no backend that can be a "
                           "tensor-parallel rank alongside rank 0's", r);
    }
    return 0;
}

int kl_backend_tp_create(kl_backend **out, kl_model *m, kl_model **ranks, unsigned n,
                         kl_err *err)
{
    *out = NULL;
    int rc = check_ranks(ranks, n, err);
    tp_be *t = rc ? NULL : kl_calloc(1, sizeof *t);
    const uint32_t slots = rc ? 0 : ranks[0]->be->max_slots;
    if (t) {
        t->be.impl = t;
        t->cut = kl_calloc(n, sizeof *t->cut);
        t->rank = kl_calloc(n, sizeof *t->rank);
        t->be.slot_len = kl_calloc(slots ? slots : 1, sizeof *t->be.slot_len);
        t->be.slot_used = kl_calloc(slots ? slots : 1, sizeof *t->be.slot_used);
    }
    if (!rc && (!t || !t->cut || !t->rank || !t->be.slot_len || !t->be.slot_used))
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    if (rc) {
        for (unsigned r = 0; r < n; r++)
            kl_model_tp_free(ranks[r]);
        if (t)
            tp_destroy(&t->be);
        return rc;
    }
    kl_backend *be = &t->be;
    be->ops = &tp_ops;
    be->name = ranks[0]->be->name;
    be->m = m;
    be->max_tokens = ranks[0]->be->max_tokens;
    be->max_slots = slots;   /* the ranks allocate slots alike: the same count */
    t->n = n;
    for (unsigned r = 0; r < n; r++) {
        t->cut[r] = ranks[r];
        t->rank[r] = ranks[r]->be;
        if (t->rank[r]->max_tokens < be->max_tokens)
            be->max_tokens = t->rank[r]->max_tokens;
    }
    *out = be;
    return 0;
}

int kl_backend_tp_check(const kl_config *cfg, unsigned tp, int ep, kl_err *err)
{
    if (kl_tp_size_ok(cfg, ep, tp))
        return 0;
    char list[256];
    kl_tp_sizes_text(cfg, ep, list, sizeof list);
    return kl_fail(err, KL_E_USAGE, "tensor-parallel size %u does not split this model into "
                   "whole heads, experts, rows and MXFP4 blocks; valid sizes%s: %s", tp,
                   ep ? " (expert parallel)" : "", list);
}

int kl_backend_tp_create_on(kl_backend **out, kl_model *m, unsigned tp, int ep, int gpu,
                            kl_err *err)
{
    *out = NULL;
    if (!gpu && !m->matrices_read)
        return kl_fail(err, KL_E_USAGE, "CPU ranks need the model's matrices in memory (it was "
                       "opened for its vectors only)");
    kl_model **cut = kl_calloc(tp ? tp : 1, sizeof *cut);
    kl_backend **be = kl_calloc(tp ? tp : 1, sizeof *be);
    int rc = cut && be ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    for (unsigned r = 0; r < tp && !rc; r++)
        if (!(rc = kl_model_tp_cut(&cut[r], m, tp, r, ep, err)) && !gpu)
            rc = kl_backend_cpu_create(&be[r], cut[r], err);
    if (!rc && gpu)   /* together: their weights in one pass over the files */
        rc = kl_backend_gpu_create_ranks(be, cut, tp, err);
    for (unsigned r = 0; !rc && r < tp; r++)
        cut[r]->be = be[r];
    if (rc) {
        for (unsigned r = 0; cut && be && r < tp; r++) {
            kl_backend_free(be[r]);   /* not installed on its cut yet */
            kl_model_tp_free(cut[r]);
        }
    } else {
        rc = kl_backend_tp_create(out, m, cut, tp, err);
    }
    kl_free(be);
    kl_free(cut);
    return rc;
}
