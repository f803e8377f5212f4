/*
 * serve/sched.c — continuous batching over the backend (see sched.h).
 *
 * Requests live in one list in arrival order, queued ones after (or among) running ones; a
 * step admits queued requests into free slots, builds the batch from the list, runs it, then
 * samples each sequence whose last token was in it.
 */
#include "serve/sched.h"

#include "common/mem.h"
#include "engine/backend.h"
#include "engine/forward.h"
#include "serve/prefix.h"

#include <math.h>
#include <string.h>

typedef struct seq {
    uint64_t     handle;
    kl_sched_req req;          /* prompt and stop_ids point at the copies below */
    kl_token    *prompt, *stops;
    size_t       fed;          /* prompt ids fed */
    size_t       generated;    /* ids passed to on_token */
    kl_token     last;         /* the id to feed next while decoding */
    int          decoding;     /* the prompt is fed; last waits to be fed */
    int          whole;        /* started from a cache entry of its whole prompt: its first id
                                  comes from the entry's logits (from), not from a forward */
    int          running;      /* holds a slot (st) and a sampler */
    int          snapped;      /* the end of its prompt went to the prefix cache */
    kl_prefix_entry *from;     /* the pinned cache entry it started from, until snapped */
    kl_token    *heads;        /* the forced choice's sequences (req.head_ids, copied) */
    size_t      *head_off;     /* [n_heads + 1] */
    uint8_t     *alive;        /* [n_heads] 1: sequence k matches every id so far */
    size_t       head_pos;     /* ids of the choice sampled; heading: none complete yet */
    int          heading;
    kl_state     st;
    kl_sampler   samp;
    struct seq  *next;
} seq;

struct kl_sched {
    kl_model  *m;
    uint32_t   max_seqs, n_running;
    size_t     step_tokens;
    uint64_t   next_handle;
    seq       *head;
    kl_prefix *cache;          /* may be NULL */
    /* the batch */
    kl_token  *ids;            /* [step_tokens] */
    uint32_t  *slots;          /* [step_tokens] */
    uint8_t   *want;           /* [step_tokens] */
    seq      **owner;          /* [max_seqs]: the sequence of each wanted row, in order */
    float     *logits;         /* [max_seqs, vocab] */
    kl_token  *best;           /* [max_seqs] each forward row's argmax, from the backend */
    size_t     n_best;         /* rows of this step with one (the cached whole prompts' not) */
    int        rows_copied;    /* the step's rows of logits came back (else its argmax only) */
    kl_token  *pick;           /* [max_seqs] each wanted row's sampled id */
    int       *pick_rc;        /* [max_seqs] its sampler's result */
    kl_err    *pick_err;       /* [max_seqs] */
};

/* ------------------------------------------------------------------------------------------ */
/* Requests                                                                                   */

/* q's copies and q (safe on a half-built one). */
static void seq_free(seq *q)
{
    kl_free(q->prompt);
    kl_free(q->stops);
    kl_free(q->heads);
    kl_free(q->head_off);
    kl_free(q->alive);
    kl_free(q);
}

/* Unlinks q, tells its caller why it ended, releases it. */
static void finish(kl_sched *s, seq *q, kl_sched_end why, const kl_err *err)
{
    seq **pp = &s->head;
    while (*pp && *pp != q)
        pp = &(*pp)->next;
    if (*pp)
        *pp = q->next;
    if (s->cache)
        kl_prefix_unpin(s->cache, q->from);
    if (q->running) {
        kl_state_free(&q->st);
        kl_sampler_free(&q->samp);
        s->n_running--;
    }
    if (q->req.on_done)
        q->req.on_done(q->req.user, why, q->generated, err);
    seq_free(q);
}

/* r's forced choice checked: sequences non-empty, ids in the vocabulary. */
static int check_heads(const kl_sched_req *r, uint32_t V, kl_err *err)
{
    for (size_t k = 0; k < r->n_heads; k++) {
        if (r->head_off[k + 1] <= r->head_off[k])
            return kl_fail(err, KL_E_USAGE, "forced sequence %zu is empty", k);
        for (size_t i = r->head_off[k]; i < r->head_off[k + 1]; i++)
            if (r->head_ids[i] >= V)
                return kl_fail(err, KL_E_USAGE, "forced id %u is outside the vocabulary (%u)",
                               (unsigned)r->head_ids[i], V);
    }
    return 0;
}

/* A request with copies of r's arrays, or NULL. */
static seq *seq_new(const kl_sched_req *r)
{
    seq *q = kl_calloc(1, sizeof *q);
    if (!q)
        return NULL;
    size_t nh = r->n_heads, n_ids = nh ? r->head_off[nh] : 0;
    q->prompt = kl_memdup(r->prompt, r->n_prompt * sizeof *q->prompt);
    q->stops = kl_memdup(r->stop_ids, r->n_stop_ids * sizeof *q->stops);
    q->heads = kl_memdup(r->head_ids, n_ids * sizeof *q->heads);
    q->head_off = kl_memdup(r->head_off, (nh ? nh + 1 : 0) * sizeof *q->head_off);
    q->alive = kl_calloc(nh ? nh : 1, 1);
    if (!q->prompt || !q->stops || !q->heads || !q->head_off || !q->alive) {
        seq_free(q);
        return NULL;
    }
    memset(q->alive, 1, nh);
    q->heading = nh > 0;
    q->req = *r;
    q->req.prompt = q->prompt;
    q->req.stop_ids = q->stops;
    q->req.head_ids = q->heads;
    q->req.head_off = q->head_off;
    return q;
}

int kl_sched_submit(kl_sched *s, const kl_sched_req *r, uint64_t *handle, kl_err *err)
{
    uint32_t V = s->m->cfg.vocab_size;
    if (!r->n_prompt || !r->max_tokens)
        return kl_fail(err, KL_E_USAGE, "a request needs a prompt and max_tokens >= 1");
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] >= V)
            return kl_fail(err, KL_E_USAGE, "prompt id %u at %zu is outside the vocabulary "
                           "(%u)", (unsigned)r->prompt[i], i, V);
    int rc = check_heads(r, V, err);
    if (rc)
        return rc;
    seq *q = seq_new(r);
    if (!q)
        return kl_fail(err, KL_E_NOMEM, "out of memory for a request");
    q->handle = ++s->next_handle;
    seq **pp = &s->head;
    while (*pp)
        pp = &(*pp)->next;
    *pp = q;
    if (handle)
        *handle = q->handle;
    return 0;
}

void kl_sched_cancel(kl_sched *s, uint64_t handle)
{
    for (seq *q = s->head; q; q = q->next)
        if (q->handle == handle) {
            finish(s, q, KL_SCHED_CANCELLED, NULL);
            return;
        }
}

size_t kl_sched_pending(const kl_sched *s)
{
    size_t n = 0;
    for (const seq *q = s->head; q; q = q->next)
        n++;
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* A step                                                                                     */

/* q (just admitted) from the cache's longest entry that leaves an id to feed, if any. */
static void reuse(kl_sched *s, seq *q)
{
    if (!s->cache)
        return;
    size_t n = q->req.n_prompt;
    int whole = kl_prefix_holds_whole(s->cache, q->prompt, n);
    kl_prefix_entry *e = kl_prefix_find(s->cache, q->prompt, n, whole ? n : n - 1);
    kl_err err;
    kl_err_clear(&err);
    if (!e || kl_state_copy(&q->st, kl_prefix_entry_state(e), &err)) {
        kl_prefix_unpin(s->cache, e);   /* a failed copy leaves q's empty state: start cold */
        return;
    }
    q->from = e;
    q->fed = kl_prefix_entry_len(e);
    q->whole = q->decoding = q->snapped = q->fed == n;
    if (q->req.on_cached)
        q->req.on_cached(q->req.user, q->fed);
}

/* Snapshots of the prompts fed in full by the last step, before their first ids. */
static void snapshot(kl_sched *s, size_t n_want)
{
    for (size_t r = 0; r < n_want && s->cache; r++) {
        seq *q = s->owner[r];
        if (q->snapped || !q->decoding)
            continue;
        kl_err err;
        kl_err_clear(&err);
        (void)kl_prefix_put(s->cache, q->prompt, q->req.n_prompt, &q->st,
                            s->logits + r * s->m->cfg.vocab_size, NULL, &err);
        kl_prefix_unpin(s->cache, q->from);   /* a full cache is no error: nothing stored */
        q->from = NULL;
        q->snapped = 1;
    }
}

/* Queued requests into free slots, in arrival order; a request whose sampler options are
 * refused ends with the error. */
static void admit(kl_sched *s)
{
    for (seq *q = s->head, *nx; q && s->n_running < s->max_seqs; q = nx) {
        nx = q->next;
        if (q->running)
            continue;
        kl_err e;
        kl_err_clear(&e);
        if (kl_sampler_init(&q->samp, s->m->cfg.vocab_size, &q->req.samp, &e)) {
            finish(s, q, KL_SCHED_ERROR, &e);
            continue;
        }
        if (kl_state_init(&q->st, s->m, &e)) {
            kl_sampler_free(&q->samp);
            finish(s, q, KL_SCHED_ERROR, &e);
            continue;
        }
        q->running = 1;
        s->n_running++;
        reuse(s, q);
    }
}

/* Appends ids[0..n) of q's slot to the batch; the last wants logits when want_last. */
static void add(kl_sched *s, kl_batch *b, size_t *n_want, seq *q, const kl_token *ids,
                size_t n, int want_last)
{
    for (size_t i = 0; i < n; i++, b->n++) {
        s->ids[b->n] = ids[i];
        s->slots[b->n] = q->st.slot;
        s->want[b->n] = want_last && i + 1 == n;
    }
    if (want_last)
        s->owner[(*n_want)++] = q;
}

/* Decode tokens first, then prompt pieces up to step_tokens; returns the wanted rows. */
static size_t build(kl_sched *s, kl_batch *b)
{
    size_t n_want = 0;
    *b = (kl_batch){0, s->ids, s->slots, s->want};
    for (seq *q = s->head; q; q = q->next)
        if (q->running && q->decoding && !q->whole)
            add(s, b, &n_want, q, &q->last, 1, 1);
    for (seq *q = s->head; q && b->n < s->step_tokens; q = q->next) {
        if (!q->running || q->decoding)
            continue;
        size_t left = q->req.n_prompt - q->fed, room = s->step_tokens - b->n;
        size_t piece = left < room ? left : room;
        add(s, b, &n_want, q, q->prompt + q->fed, piece, piece == left);
        q->fed += piece;
        q->decoding = q->fed == q->req.n_prompt;
    }
    return n_want;
}

static int is_stop(const seq *q, kl_token id)
{
    for (size_t i = 0; i < q->req.n_stop_ids; i++)
        if (q->stops[i] == id)
            return 1;
    return 0;
}

/* The ids that go on a forced sequence still alive, at most max of them (distinct). */
static size_t head_next_ids(const seq *q, kl_token *ids, size_t max)
{
    size_t n = 0;
    for (size_t k = 0; k < q->req.n_heads && n < max; k++) {
        if (!q->alive[k])
            continue;
        kl_token id = q->heads[q->head_off[k] + q->head_pos];
        size_t i = 0;
        while (i < n && ids[i] != id)
            i++;
        if (i == n)
            ids[n++] = id;
    }
    return n;
}

/* While q's forced choice is open: every logit but those of ids going on a live sequence
 * becomes -inf (in place: the row is the scheduler's).  At most MAX_NEXT distinct ids stay
 * (the first live sequences'): more alternatives than that at one position are not offered. */
static void mask_heads(const seq *q, float *logits, size_t V)
{
    enum { MAX_NEXT = 64 };
    kl_token next[MAX_NEXT];
    float keep[MAX_NEXT];
    size_t n = head_next_ids(q, next, MAX_NEXT);
    for (size_t i = 0; i < n; i++)
        keep[i] = logits[next[i]];
    for (size_t v = 0; v < V; v++)
        logits[v] = -INFINITY;
    for (size_t i = 0; i < n; i++)
        logits[next[i]] = keep[i];
}

/* id was sampled while the choice was open: the sequences it does not go on die; the choice
 * closes when a live one is complete. */
static void advance_heads(seq *q, kl_token id)
{
    for (size_t k = 0; k < q->req.n_heads; k++) {
        if (!q->alive[k])
            continue;
        size_t at = q->head_off[k] + q->head_pos;
        q->alive[k] = q->heads[at] == id;
        if (q->alive[k] && at + 1 == q->head_off[k + 1])
            q->heading = 0;
    }
    q->head_pos++;
}

/* Rows after the batch's n_want for the sequences that start from a whole cached prompt: each
 * entry's logits copied in, the entry unpinned; returns the rows. */
static size_t whole_rows(kl_sched *s, size_t n_want)
{
    size_t V = s->m->cfg.vocab_size;
    for (seq *q = s->head; q; q = q->next) {
        if (!q->running || !q->whole)
            continue;
        memcpy(s->logits + n_want * V, kl_prefix_entry_logits(q->from), V * sizeof *s->logits);
        s->owner[n_want++] = q;
        kl_prefix_unpin(s->cache, q->from);
        q->from = NULL;
        q->whole = 0;
    }
    return n_want;
}

/* Pool item r: the id of wanted row r drawn from its logits (masked while a forced choice is
 * open) by its sequence's own sampler; rows are independent, so any thread may take any. */
static void pick_row(void *ctx, size_t r)
{
    kl_sched *s = ctx;
    seq *q = s->owner[r];
    size_t V = s->m->cfg.vocab_size;
    float *logits = s->logits + r * V;
    kl_err_clear(&s->pick_err[r]);
    if (q->heading)
        mask_heads(q, logits, V);
    /* the backend's argmax spares a greedy pick its passes over the row (not once masked) */
    const int best = r < s->n_best && !q->heading;
    s->pick_rc[r] = best ? kl_sampler_sample_best(&q->samp, s->rows_copied ? logits : NULL,
                                                  s->best[r], &s->pick[r], &s->pick_err[r])
                        : kl_sampler_sample(&q->samp, logits, &s->pick[r], &s->pick_err[r]);
}

/* Row r's id (pick_row) to its sequence: stop, callbacks, limit. */
static void sample(kl_sched *s, size_t r)
{
    seq *q = s->owner[r];
    const float *logits = s->logits + r * s->m->cfg.vocab_size;
    kl_err e;
    kl_err_clear(&e);
    kl_token id = s->pick[r];
    if (s->pick_rc[r]) {
        finish(s, q, KL_SCHED_ERROR, &s->pick_err[r]);
        return;
    }
    if (q->heading)
        advance_heads(q, id);
    if (is_stop(q, id)) {
        finish(s, q, KL_SCHED_STOP, NULL);
        return;
    }
    q->generated++;
    if ((q->req.on_logits &&
         q->req.on_logits(q->req.user, logits, s->m->cfg.vocab_size, id, &e)) ||
        (q->req.on_token && q->req.on_token(q->req.user, id, &e))) {
        finish(s, q, KL_SCHED_ERROR, &e);
        return;
    }
    if (q->generated == q->req.max_tokens) {
        finish(s, q, KL_SCHED_LENGTH, NULL);
        return;
    }
    q->last = id;
}

/* Whether a wanted row of this step needs its logits on the host: a sampler that is not
 * greedy, a forced choice's mask, logprobs, or the prefix cache's snapshot of a prompt's end.
 * When none does, the GPU copies back 4 bytes a row (the argmax) instead of 655 KB. */
static int rows_needed(const kl_sched *s, size_t n_want)
{
    for (size_t r = 0; r < n_want; r++) {
        const seq *q = s->owner[r];
        if (!kl_sampler_greedy(&q->samp) || q->heading || q->req.on_logits ||
            (s->cache && !q->snapped))
            return 1;
    }
    return 0;
}

int kl_sched_step(kl_sched *s, size_t *n_tokens, kl_err *err)
{
    if (n_tokens)
        *n_tokens = 0;
    admit(s);
    kl_batch b;
    size_t n_want = build(s, &b);
    s->rows_copied = rows_needed(s, n_want);
    int rc = b.n ? kl_backend_forward(s->m->be, &b, s->rows_copied ? s->logits : NULL, s->best,
                                      err)
                 : 0;
    if (rc) {   /* the slots' states are unspecified now: every running request ends */
        for (seq *q = s->head, *nx; q; q = nx) {
            nx = q->next;
            if (q->running)
                finish(s, q, KL_SCHED_ERROR, err);
        }
        return rc;
    }
    snapshot(s, n_want);
    s->n_best = n_want;
    n_want = whole_rows(s, n_want);
    if (n_want == 1) {   /* one row: its own passes share the pool */
        kl_sampler_set_pool(&s->owner[0]->samp, s->m->pool);
        pick_row(s, 0);
        kl_sampler_set_pool(&s->owner[0]->samp, NULL);
    } else {
        kl_pool_run(s->m->pool, n_want, pick_row, s);   /* vocab-wide passes, one per row */
    }
    for (size_t r = 0; r < n_want; r++)
        sample(s, r);
    if (n_tokens)
        *n_tokens = b.n;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Life                                                                                       */

int kl_sched_create(kl_sched **out, kl_model *m, uint32_t max_seqs, size_t step_tokens,
                    kl_err *err)
{
    *out = NULL;
    if (!max_seqs || step_tokens < max_seqs)
        return kl_fail(err, KL_E_USAGE, "a scheduler needs max_seqs >= 1 and step_tokens >= "
                       "max_seqs (%u, %zu)", max_seqs, step_tokens);
    if (max_seqs > m->be->max_slots)
        return kl_fail(err, KL_E_USAGE, "%u sequences at once: the %s backend has %u slots",
                       max_seqs, m->be->name, m->be->max_slots);
    kl_sched *s = kl_calloc(1, sizeof *s);
    if (s) {
        s->m = m;
        s->max_seqs = max_seqs;
        s->step_tokens = step_tokens;
        s->ids = kl_malloc(step_tokens * sizeof *s->ids);
        s->slots = kl_malloc(step_tokens * sizeof *s->slots);
        s->want = kl_malloc(step_tokens);
        s->owner = kl_calloc(max_seqs, sizeof *s->owner);
        s->logits = kl_malloc((size_t)max_seqs * m->cfg.vocab_size * sizeof *s->logits);
        s->best = kl_calloc(max_seqs, sizeof *s->best);
        s->pick = kl_calloc(max_seqs, sizeof *s->pick);
        s->pick_rc = kl_calloc(max_seqs, sizeof *s->pick_rc);
        s->pick_err = kl_calloc(max_seqs, sizeof *s->pick_err);
    }
    if (!s || !s->ids || !s->slots || !s->want || !s->owner || !s->logits || !s->best ||
        !s->pick || !s->pick_rc || !s->pick_err) {
        kl_sched_free(s);
        return kl_fail(err, KL_E_NOMEM, "out of memory for a scheduler of %u sequences",
                       max_seqs);
    }
    *out = s;
    return 0;
}

void kl_sched_set_prefix(kl_sched *s, kl_prefix *c)
{
    s->cache = c;
}

void kl_sched_free(kl_sched *s)
{
    if (!s)
        return;
    while (s->head)
        finish(s, s->head, KL_SCHED_CANCELLED, NULL);
    kl_free(s->ids);
    kl_free(s->slots);
    kl_free(s->want);
    kl_free(s->owner);
    kl_free(s->logits);
    kl_free(s->best);
    kl_free(s->pick);
    kl_free(s->pick_rc);
    kl_free(s->pick_err);
    kl_free(s);
}
