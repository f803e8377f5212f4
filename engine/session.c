/*
 * engine/session.c — one conversation's model state (see session.h).
 *
 * Sections: id sequences; lifecycle; context; feeding; generation.
 */
#include "engine/session.h"

#include "common/grow.h"
#include "common/mem.h"

#include <inttypes.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Id sequences                                                                               */

static int seq_set(kl_id_seq *q, const kl_token *ids, size_t n, kl_err *err)
{
    if (kl_grow(&q->ids, &q->cap, n ? n : 1, sizeof *q->ids))
        return kl_fail(err, KL_E_NOMEM, "out of memory for a sequence of %zu ids", n);
    if (n && q->ids != ids)
        memmove(q->ids, ids, n * sizeof *ids);
    q->n = n;
    return 0;
}

static int seq_append(kl_id_seq *q, const kl_token *ids, size_t n, kl_err *err)
{
    if (kl_grow(&q->ids, &q->cap, q->n + n, sizeof *q->ids))
        return kl_fail(err, KL_E_NOMEM, "out of memory for a sequence of %zu ids", q->n + n);
    if (n)
        memcpy(q->ids + q->n, ids, n * sizeof *ids);
    q->n += n;
    return 0;
}

/* 1 if q is a strict prefix of ids[0..n): feeding the rest leaves at least one id. */
static int seq_extends(const kl_id_seq *q, const kl_token *ids, size_t n)
{
    return q->n > 0 && q->n < n && !memcmp(q->ids, ids, q->n * sizeof *ids);
}

/* ------------------------------------------------------------------------------------------ */
/* Lifecycle                                                                                  */

int kl_session_init(kl_session *s, kl_model *m, int snapshots, kl_err *err)
{
    memset(s, 0, sizeof *s);
    s->m = m;
    s->snapshots = snapshots;
    int rc = kl_state_init(&s->live, m, err);
    if (!rc && snapshots)
        rc = kl_state_init(&s->snap, m, err);
    if (!rc && !(s->logits = kl_calloc(m->cfg.vocab_size ? m->cfg.vocab_size : 1,
                                       sizeof *s->logits)))
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for logits of %u", m->cfg.vocab_size);
    if (rc)
        kl_session_free(s);
    return rc;
}

void kl_session_free(kl_session *s)
{
    if (!s)
        return;
    kl_state_free(&s->live);
    kl_state_free(&s->snap);
    kl_free(s->live_ids.ids);
    kl_free(s->snap_ids.ids);
    kl_free(s->logits);
    memset(s, 0, sizeof *s);
}

void kl_session_reset(kl_session *s)
{
    kl_state_reset(&s->live);
    s->live_ids.n = 0;
    s->snap_ids.n = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Context                                                                                    */

int kl_session_check_context(uint64_t max_position, size_t n_prompt, uint64_t n_generate,
                             kl_err *err)
{
    if (!max_position || (n_prompt <= max_position && n_generate <= max_position - n_prompt))
        return 0;
    return kl_fail(err, KL_E_USAGE, "the prompt's %zu tokens plus %" PRIu64 " to generate exceed "
                   "the model's context of %" PRIu64 " tokens (model_max_length)", n_prompt,
                   n_generate, max_position);
}

/* ------------------------------------------------------------------------------------------ */
/* Feeding                                                                                    */

static int check_ids(const kl_model *m, const kl_token *ids, size_t n, kl_err *err)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= m->cfg.vocab_size)
            return kl_fail(err, KL_E_USAGE, "token id %u at %zu is outside the model's "
                           "vocabulary (%u)", (unsigned)ids[i], i, (unsigned)m->cfg.vocab_size);
    return 0;
}

/* Feeds ids[0..n) to the live state in pieces, recording each piece in live_ids; *fed = ids
 * fed (less than n only when cancelled).  On error the live state is forgotten. */
static int feed_pieces(kl_session *s, const kl_token *ids, size_t n, const kl_session_feed *f,
                       size_t *fed, kl_err *err)
{
    int rc = 0;
    *fed = 0;
    while (*fed < n) {
        if (f && f->cancel && *f->cancel)
            return 0;
        size_t k = n - *fed < KL_SESSION_PIECE ? n - *fed : KL_SESSION_PIECE;
        if ((rc = kl_forward(s->m, &s->live, ids + *fed, k, s->logits, err)) ||
            (rc = seq_append(&s->live_ids, ids + *fed, k, err))) {
            s->live_ids.n = 0;
            kl_state_reset(&s->live);
            return rc;
        }
        *fed += k;
        if (f && f->progress)
            f->progress(f->user, *fed, n);
    }
    return 0;
}

/* Puts the live state at the longest held prefix of ids[0..n); returns its length. */
static int choose_base(kl_session *s, const kl_token *ids, size_t n, size_t *reused,
                       kl_err *err)
{
    if (seq_extends(&s->live_ids, ids, n)) {
        *reused = s->live_ids.n;
        return 0;
    }
    if (s->snapshots && seq_extends(&s->snap_ids, ids, n)) {
        /* the reply was re-encoded differently (or not fed): back to the end of the prompt */
        int rc = kl_state_copy(&s->live, &s->snap, err);
        if (rc || (rc = seq_set(&s->live_ids, s->snap_ids.ids, s->snap_ids.n, err))) {
            s->live_ids.n = 0;
            kl_state_reset(&s->live);
            return rc;
        }
        *reused = s->snap_ids.n;
        return 0;
    }
    kl_state_reset(&s->live);
    s->live_ids.n = 0;
    *reused = 0;
    return 0;
}

int kl_session_prompt(kl_session *s, const kl_token *ids, size_t n, const kl_session_feed *f,
                      kl_session_stats *stats, kl_err *err)
{
    kl_session_stats st = {0};
    if (n == 0)
        return kl_fail(err, KL_E_USAGE, "the prompt is empty: nothing to feed the model");
    int rc = check_ids(s->m, ids, n, err);
    if (rc || (rc = choose_base(s, ids, n, &st.reused, err)) ||
        (rc = feed_pieces(s, ids + st.reused, n - st.reused, f, &st.fed, err)))
        return rc;
    st.cancelled = st.reused + st.fed < n;
    if (stats)
        *stats = st;
    if (st.cancelled || !s->snapshots)
        return 0;
    /* snapshot at the end of the prompt: recurrent state cannot be rewound */
    if ((rc = kl_state_copy(&s->snap, &s->live, err)) ||
        (rc = seq_set(&s->snap_ids, ids, n, err)))
        s->snap_ids.n = 0;
    return rc;
}

int kl_session_append(kl_session *s, const kl_token *ids, size_t n, kl_err *err)
{
    if (n == 0)
        return 0;
    size_t fed;
    int rc = check_ids(s->m, ids, n, err);
    return rc ? rc : feed_pieces(s, ids, n, NULL, &fed, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Generation                                                                                 */

int kl_session_generate(kl_session *s, kl_gen *g, kl_err *err)
{
    g->m = s->m;
    g->st = &s->live;
    g->logits = s->logits;
    int rc = kl_generate(g, err);
    if (!rc)
        rc = seq_append(&s->live_ids, g->ids, g->n_fed, err);
    if (rc) {
        /* the live state may be past its ids: the next prompt resumes from the snapshot */
        s->live_ids.n = 0;
        kl_state_reset(&s->live);
    }
    return rc;
}
