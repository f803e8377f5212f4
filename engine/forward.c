/*
 * engine/forward.c — the one orchestration of the forward pass (backend.h) and the kl_state
 * handle on a backend slot (forward.h).  The operations themselves live in the backends
 * (engine/backend_cpu.c, engine/backend_gpu.c).
 *
 * Sections: batch validation; kl_backend_forward; state API; kl_forward.
 */
#include "engine/forward.h"

#include "common/mem.h"

#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Batch validation                                                                           */

/* Token i starts a run whose slot already had one: the scan only looks back at earlier tokens,
 * and stops at the first repeat, so it costs at most n times (open slots + 1). */
static int slot_seen_before(const kl_batch *b, size_t i)
{
    for (size_t k = 0; k < i; k++)
        if (b->slot[k] == b->slot[i])
            return 1;
    return 0;
}

/* Everything kl_backend_forward refuses, checked before any state changes. */
static int validate(const kl_backend *be, const kl_batch *b, kl_err *err)
{
    uint32_t V = be->m->cfg.vocab_size;
    if (!b->n)
        return kl_fail(err, KL_E_USAGE, "no tokens to process");
    for (size_t i = 0; i < b->n; i++) {
        uint32_t s = b->slot[i];
        if (b->ids[i] >= V)
            return kl_fail(err, KL_E_USAGE, "token id %u at %zu is outside the vocabulary (%u)",
                           (unsigned)b->ids[i], i, V);
        if (s >= be->max_slots || !be->slot_used[s])
            return kl_fail(err, KL_E_USAGE, "slot %u of token %zu is not open on the %s backend",
                           s, i, be->name);
        if (i && s != b->slot[i - 1] && slot_seen_before(b, i))
            return kl_fail(err, KL_E_USAGE, "the tokens of slot %u are not one run (again at "
                           "token %zu)", s, i);
    }
    return 0;
}

/* Tokens of want[0..n) that want logits. */
static size_t count_wanted(const uint8_t *want, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += want[i] != 0;
    return k;
}

/* ------------------------------------------------------------------------------------------ */
/* kl_backend_forward                                                                         */

/* One chunk through every layer (the sequence of backend.h); head only when the chunk has
 * wanted tokens and the caller wants logits or argmax (logits and argmax NULL otherwise). */
static int run_chunk(kl_backend *be, const kl_batch *c, float *logits, kl_token *argmax,
                     kl_err *err)
{
    const kl_backend_ops *o = be->ops;
    const kl_model *m = be->m;
    uint32_t nl = m->cfg.num_hidden_layers;
    int rc = o->begin(be, c, err);
    if (!rc)
        rc = o->norm(be, KL_NORM_INPUT, 0, err);
    for (uint32_t l = 0; l < nl && !rc; l++) {
        const kl_layer *L = &m->layers[l];
        /* h += Attn(RMSNorm_in(h)); h += FFN(RMSNorm_post(h)) */
        rc = L->attn == KL_ATTN_KDA ? o->kda(be, l, err) : o->mla(be, l, err);
        if (!rc)
            rc = o->add_norm(be, KL_NORM_POST, l, err);
        if (!rc)
            rc = L->moe ? o->moe(be, l, err) : o->mlp(be, l, err);
        if (!rc)
            rc = l + 1 < nl ? o->add_norm(be, KL_NORM_INPUT, l + 1, err)
                            : o->add_norm(be, KL_NORM_FINAL, 0, err);
    }
    if (!rc && (logits || argmax))
        rc = o->head(be, logits, argmax, err);
    if (!rc)
        rc = o->end(be, err);
    return rc;
}

int kl_backend_forward(kl_backend *be, const kl_batch *b, float *logits, kl_token *argmax,
                       kl_err *err)
{
    int rc = validate(be, b, err);
    if (rc)
        return rc;
    /* want NULL means the batch's last token: spelt out when the batch spans several chunks */
    uint8_t *last_only = NULL;
    const uint8_t *want = b->want;
    if (!want && b->n > be->max_tokens) {
        if (!(last_only = kl_calloc(b->n, 1)))
            return kl_fail(err, KL_E_NOMEM, "out of memory for a batch of %zu tokens", b->n);
        last_only[b->n - 1] = 1;
        want = last_only;
    }
    size_t V = be->m->cfg.vocab_size, T;
    for (size_t i = 0; i < b->n && !rc; i += T) {
        T = b->n - i < be->max_tokens ? b->n - i : be->max_tokens;
        kl_batch c = {T, b->ids + i, b->slot + i, want ? want + i : NULL};
        size_t nw = want ? count_wanted(want + i, T) : 1;
        rc = run_chunk(be, &c, nw ? logits : NULL, nw ? argmax : NULL, err);
        logits = logits ? logits + nw * V : NULL;
        argmax = argmax ? argmax + nw : NULL;
    }
    kl_free(last_only);
    return rc;
}

void kl_backend_free(kl_backend *be)
{
    if (be)
        be->ops->destroy(be);
}

/* ------------------------------------------------------------------------------------------ */
/* State API                                                                                  */

int kl_state_init(kl_state *s, const kl_model *m, kl_err *err)
{
    memset(s, 0, sizeof *s);
    uint32_t slot;
    if (!m->be)   /* opened vectors_only, no backend installed */
        return kl_fail(err, KL_E_USAGE, "the model has no backend (its matrices were not read)");
    int rc = m->be->ops->slot_open(m->be, &slot, err);
    if (rc)
        return rc;
    s->m = m;
    s->slot = slot;
    return 0;
}

void kl_state_free(kl_state *s)
{
    if (!s)
        return;
    if (s->m)
        s->m->be->ops->slot_close(s->m->be, s->slot);
    memset(s, 0, sizeof *s);
}

void kl_state_reset(kl_state *s)
{
    if (!s->m)
        return;
    s->m->be->ops->slot_reset(s->m->be, s->slot);
    s->pos = 0;
}

int kl_state_copy(kl_state *dst, const kl_state *src, kl_err *err)
{
    if (dst == src)
        return 0;
    if (!dst->m || dst->m != src->m)
        return kl_fail(err, KL_E_USAGE, "state copy between states of different models");
    kl_backend *be = src->m->be;
    int rc = be->ops->slot_copy(be, dst->slot, src->slot, err);
    dst->pos = be->slot_len[dst->slot];
    return rc;
}

int kl_state_fill_synthetic(kl_state *s, size_t n, kl_err *err)
{
    if (!s->m)
        return kl_fail(err, KL_E_USAGE, "state is not initialised");
    kl_backend *be = s->m->be;
    int rc = be->ops->slot_fill(be, s->slot, n, err);
    if (!rc)
        s->pos = n;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* kl_forward                                                                                 */

int kl_forward(kl_model *m, kl_state *s, const kl_token *ids, size_t n, float *logits_last,
               kl_err *err)
{
    return kl_forward_argmax(m, s, ids, n, logits_last, NULL, err);
}

int kl_forward_argmax(kl_model *m, kl_state *s, const kl_token *ids, size_t n,
                      float *logits_last, kl_token *argmax_last, kl_err *err)
{
    if (n == 0)
        return kl_fail(err, KL_E_USAGE, "no tokens to process");
    if (s->m != m)
        return kl_fail(err, KL_E_USAGE, "state was initialised for another model");
    /* every token in the state's slot; a decode step needs no allocation */
    uint32_t local[KL_FORWARD_CHUNK];
    uint32_t *slot = n <= KL_FORWARD_CHUNK ? local : kl_malloc(n * sizeof *slot);
    if (!slot)
        return kl_fail(err, KL_E_NOMEM, "out of memory for a batch of %zu tokens", n);
    for (size_t i = 0; i < n; i++)
        slot[i] = s->slot;
    kl_batch b = {n, ids, slot, NULL};
    int rc = kl_backend_forward(m->be, &b, logits_last, argmax_last, err);
    s->pos = m->be->slot_len[s->slot];
    if (slot != local)
        kl_free(slot);
    return rc;
}
