/*
 * tests/test_sched.c — continuous batching (serve/sched.h) on the CPU backend and a tiny
 * synthetic model: six greedy requests of different prompt lengths (one longer than a step),
 * three slots, one submitted while the others run, one with a stop id, one cancelled mid-way;
 * each request's ids equal the same request served alone (kl_forward, token by token), the
 * ends are reported once with the right reason, and bad requests are refused at submit.  A
 * forced choice among id sequences gets the model's likelier sequence, then goes on freely.
 *
 * The prefix cache (serve/prefix.h): the longest prefix wins, an entry as long as the prompt is
 * used only within max_len, LRU eviction under a byte budget and a slot limit, pinned entries
 * kept; and through the scheduler: a conversation's second turn (the first prompt, the reply,
 * new ids) reuses the first turn's state and gets bit-identical logits to a cold run, a
 * repeated prompt starts from its whole entry (no forward for its first id) with the same
 * logits, and requests sharing a prefix at once get what each gets alone.
 */
#include "common/err.h"
#include "common/mem.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "serve/prefix.h"
#include "serve/sched.h"
#include "synth/synth.h"
#include "tests/testutil.h"

#include <string.h>

#define NREQ 6
#define MAXT 12

static char g_root[512], g_model[600];
static kl_model *g_m;

typedef struct out {
    kl_token     ids[MAXT + 4];
    size_t       n;
    int          ended;
    kl_sched_end why;
} out;

static int on_token(void *user, kl_token id, kl_err *err)
{
    out *o = user;
    ck_assert(!o->ended && o->n < MAXT + 4);
    o->ids[o->n++] = id;
    return 0;
}

static void on_done(void *user, kl_sched_end why, size_t n, const kl_err *err)
{
    out *o = user;
    ck_assert_msg(!o->ended, "a request ended twice");
    ck_assert_uint_eq(n, o->n);
    o->ended = 1;
    o->why = why;
}

static void setup(void)
{
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_model, sizeof g_model, "%s/tiny", g_root);
    t_synth_tiny(g_model, 5);
    kl_err err;
    kl_err_clear(&err);
    kl_model_opts mo = {.threads = 2};
    ck_assert_msg(kl_model_open(&g_m, g_model, &mo, &err) == 0, "%s", t_fmt_err(&err));
}

static void teardown(void)
{
    kl_model_close(g_m);
    g_m = NULL;
    if (g_root[0])
        t_rmrf(g_root);
}

static size_t prompt_of(int k, kl_token *p)
{
    static const size_t len[NREQ] = {1, 5, 40, 9, 3, 17};
    for (size_t i = 0; i < len[k]; i++)
        p[i] = (kl_token)((i * 53 + 7 + (size_t)k * 131) % (g_m->cfg.vocab_size - 300));
    return len[k];
}

/* A state holding request k's prompt; logits [vocab] of its last id. */
static void prompt_fed(int k, kl_state *st, float *logits)
{
    kl_token p[64];
    size_t np = prompt_of(k, p);
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_state_init(st, g_m, &err) == 0);
    ck_assert(kl_forward(g_m, st, p, np, logits, &err) == 0);
}

/* Greedy ids of request k served alone. */
static void alone(int k, kl_token *ids, size_t n)
{
    size_t V = g_m->cfg.vocab_size;
    float *logits = kl_malloc(V * sizeof *logits);
    kl_state st;
    kl_err err;
    kl_err_clear(&err);
    prompt_fed(k, &st, logits);
    for (size_t i = 0; i < n; i++) {
        ids[i] = kl_sample_argmax(logits, (uint32_t)V);
        ck_assert(kl_forward(g_m, &st, &ids[i], 1, logits, &err) == 0);
    }
    kl_state_free(&st);
    kl_free(logits);
}

static void submit(kl_sched *s, int k, out *o, const kl_token *stop, size_t n_stop,
                   uint64_t *h)
{
    kl_token p[64];
    size_t np = prompt_of(k, p);
    kl_sched_req r = {.prompt = p, .n_prompt = np, .max_tokens = MAXT, .stop_ids = stop,
                      .n_stop_ids = n_stop, .on_token = on_token, .on_done = on_done,
                      .user = o};
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_sched_submit(s, &r, h, &err) == 0, "%s", t_fmt_err(&err));
}

START_TEST(batched_requests_equal_each_served_alone)
{
    kl_token ref[NREQ][MAXT];
    for (int k = 0; k < NREQ; k++)
        alone(k, ref[k], MAXT);
    kl_sched *s;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_sched_create(&s, g_m, 3, 16, &err) == 0);
    out o[NREQ];
    memset(o, 0, sizeof o);
    uint64_t h[NREQ];
    kl_token stop = ref[3][2];   /* request 3 stops at its third id */
    for (int k = 0; k < 5; k++)
        submit(s, k, &o[k], k == 3 ? &stop : NULL, k == 3, &h[k]);
    size_t steps = 0, n = 0;
    do {
        ck_assert_msg(kl_sched_step(s, &n, &err) == 0, "%s", t_fmt_err(&err));
        ck_assert(n <= 16);
        if (++steps == 4)
            submit(s, 5, &o[5], NULL, 0, &h[5]);
        if (steps == 6)
            kl_sched_cancel(s, h[4]);
    } while (kl_sched_pending(s) && steps < 1000);
    ck_assert_uint_eq(kl_sched_pending(s), 0);
    for (int k = 0; k < NREQ; k++) {
        ck_assert_msg(o[k].ended, "request %d never ended", k);
        size_t want = k == 3 ? 2 : MAXT;
        if (k == 4) {
            ck_assert_int_eq(o[k].why, KL_SCHED_CANCELLED);
            want = o[k].n;
        } else {
            ck_assert_int_eq(o[k].why, k == 3 ? KL_SCHED_STOP : KL_SCHED_LENGTH);
        }
        ck_assert_uint_eq(o[k].n, want);
        for (size_t i = 0; i < want; i++)
            ck_assert_msg(o[k].ids[i] == ref[k][i], "request %d id %zu: %u served with others, "
                          "%u alone", k, i, (unsigned)o[k].ids[i], (unsigned)ref[k][i]);
    }
    ck_assert_msg(kl_sched_step(s, &n, &err) == 0 && n == 0, "an idle step did work");
    kl_sched_free(s);
}
END_TEST

START_TEST(bad_requests_are_refused_and_free_cancels)
{
    kl_sched *s;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_sched_create(&s, g_m, 4, 2, &err), KL_E_USAGE);
    ck_assert_int_eq(kl_sched_create(&s, g_m, 100000, 100000, &err), KL_E_USAGE);
    ck_assert(kl_sched_create(&s, g_m, 2, 8, &err) == 0);
    kl_token bad = g_m->cfg.vocab_size;
    kl_sched_req r = {.prompt = &bad, .n_prompt = 1, .max_tokens = 1};
    ck_assert_int_eq(kl_sched_submit(s, &r, NULL, &err), KL_E_USAGE);
    r.n_prompt = 0;
    ck_assert_int_eq(kl_sched_submit(s, &r, NULL, &err), KL_E_USAGE);
    out o;
    memset(&o, 0, sizeof o);
    submit(s, 1, &o, NULL, 0, NULL);
    ck_assert_uint_eq(kl_sched_pending(s), 1);
    kl_sched_free(s);   /* ends what is left */
    ck_assert(o.ended && o.why == KL_SCHED_CANCELLED);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* A forced choice (kl_sched_req.head_ids)                                                      */

/* The lowest-logit id of logits[0..V) and the one just above it (neither the argmax). */
static void two_unlikely(const float *logits, size_t V, kl_token *lo, kl_token *next)
{
    *lo = 0;
    for (size_t v = 1; v < V; v++)
        if (logits[v] < logits[*lo])
            *lo = (kl_token)v;
    *next = *lo ? 0 : 1;
    for (size_t v = 0; v < V; v++)
        if (v != *lo && logits[v] < logits[*next])
            *next = (kl_token)v;
}

/* Three sequences {x y1 y2}, {x z}, {w} where x and w are the least likely first ids (x the
 * likelier) and y1, z the least likely after x: greedy must take x (w's logit is lower), then
 * the likelier of y1 and z, then go on freely; served with another request, its ids equal
 * that path computed alone.  An empty sequence or an id outside the vocabulary is refused. */
START_TEST(forced_choice_follows_the_model_among_the_sequences)
{
    size_t V = g_m->cfg.vocab_size;
    kl_token p[64], ids[MAXT];
    size_t np = prompt_of(2, p);
    float *lg = kl_malloc(V * sizeof *lg);
    kl_state st;
    kl_err err;
    kl_err_clear(&err);
    prompt_fed(2, &st, lg);
    kl_token w, x, y1, z;
    two_unlikely(lg, V, &w, &x);
    ck_assert(kl_forward(g_m, &st, &x, 1, lg, &err) == 0);
    two_unlikely(lg, V, &y1, &z);
    int long_one = lg[y1] > lg[z];   /* {x y1 y2} wins */
    kl_token y2 = 3;
    kl_token heads[] = {x, y1, y2, x, z, w};
    size_t off[] = {0, 3, 5, 6};
    /* the expected path: x, the winner's rest, then greedy */
    size_t n = 0;
    ids[n++] = x;
    if (long_one) {
        ids[n++] = y1;
        ids[n++] = y2;
    } else {
        ids[n++] = z;
    }
    ck_assert(kl_forward(g_m, &st, ids + 1, n - 1, lg, &err) == 0);
    for (; n < MAXT; n++) {
        ids[n] = kl_sample_argmax(lg, (uint32_t)V);
        ck_assert(kl_forward(g_m, &st, &ids[n], 1, lg, &err) == 0);
    }
    kl_state_free(&st);
    kl_free(lg);
    kl_sched *s;
    ck_assert(kl_sched_create(&s, g_m, 2, 16, &err) == 0);
    out o[2];
    memset(o, 0, sizeof o);
    submit(s, 0, &o[0], NULL, 0, NULL);
    kl_sched_req r = {.prompt = p, .n_prompt = np, .max_tokens = MAXT, .on_token = on_token,
                      .on_done = on_done, .user = &o[1], .head_ids = heads, .head_off = off,
                      .n_heads = 3};
    ck_assert_msg(kl_sched_submit(s, &r, NULL, &err) == 0, "%s", t_fmt_err(&err));
    size_t steps = 0, nt;
    while (kl_sched_pending(s) && steps++ < 1000)
        ck_assert_msg(kl_sched_step(s, &nt, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(o[1].n, MAXT);
    for (size_t i = 0; i < MAXT; i++)
        ck_assert_msg(o[1].ids[i] == ids[i], "id %zu: %u, wanted %u (the %s sequence)", i,
                      (unsigned)o[1].ids[i], (unsigned)ids[i], long_one ? "long" : "short");
    size_t empty[] = {0, 3, 3};
    r.head_off = empty;
    r.n_heads = 2;
    ck_assert_int_eq(kl_sched_submit(s, &r, NULL, &err), KL_E_USAGE);
    heads[1] = (kl_token)V;
    r.head_off = off;
    r.n_heads = 3;
    ck_assert_int_eq(kl_sched_submit(s, &r, NULL, &err), KL_E_USAGE);
    kl_sched_free(s);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* The prefix cache (serve/prefix.h)                                                           */

#define PMAXT 6

static void ids_of(kl_token *p, size_t n, size_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (kl_token)((i * 37 + 11 + seed * 101) % (g_m->cfg.vocab_size - 300));
}

/* A state holding p[0..n). */
static void fed_state(kl_state *st, const kl_token *p, size_t n)
{
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_state_init(st, g_m, &err) == 0);
    ck_assert_msg(kl_forward(g_m, st, p, n, NULL, &err) == 0, "%s", t_fmt_err(&err));
}

static void put(kl_prefix *c, const kl_token *p, size_t n, int want_stored)
{
    kl_state st;
    fed_state(&st, p, n);
    kl_err err;
    kl_err_clear(&err);
    int stored = -1;
    ck_assert_msg(kl_prefix_put(c, p, n, &st, NULL, &stored, &err) == 0, "%s",
                  t_fmt_err(&err));
    ck_assert_int_eq(stored, want_stored);
    kl_state_free(&st);
}

static size_t found(kl_prefix *c, const kl_token *p, size_t n, size_t max_len)
{
    kl_prefix_entry *e = kl_prefix_find(c, p, n, max_len);
    size_t len = e ? kl_prefix_entry_len(e) : 0;
    kl_prefix_unpin(c, e);
    return len;
}

START_TEST(longest_prefix_and_exact_length)
{
    kl_token p[32];
    ids_of(p, 32, 1);
    kl_prefix *c;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_prefix_create(&c, g_m, (size_t)1 << 30, 8, &err) == 0);
    put(c, p, 4, 1);
    put(c, p, 12, 1);
    put(c, p, 12, 1);               /* the same ids: one entry */
    kl_token q[32];
    memcpy(q, p, sizeof q);
    q[8] ^= 1;                      /* differs inside the 12-id entry */
    put(c, q, 20, 1);
    kl_prefix_stats st;
    kl_prefix_get_stats(c, &st);
    ck_assert_uint_eq(st.entries, 3);
    ck_assert_uint_eq(found(c, p, 32, 31), 12);
    ck_assert_uint_eq(found(c, q, 32, 31), 20);
    ck_assert_uint_eq(found(c, q, 16, 15), 4);     /* 20 is longer than the prompt */
    ck_assert_uint_eq(found(c, p, 12, 12), 12);    /* an exact-length match, when allowed */
    ck_assert_uint_eq(found(c, p, 12, 11), 4);     /* and not when an id must be left */
    ck_assert_uint_eq(found(c, p, 3, 3), 0);
    kl_token other[8];
    ids_of(other, 8, 9);
    ck_assert_uint_eq(found(c, other, 8, 7), 0);
    kl_prefix_get_stats(c, &st);
    ck_assert_uint_eq(st.hits, 5);
    ck_assert_uint_eq(st.tokens_reused, 12 + 20 + 4 + 12 + 4);
    /* an entry's state is the prompt's: the next id gives a cold run's logits */
    kl_prefix_entry *e = kl_prefix_find(c, p, 13, 12);
    ck_assert_ptr_nonnull(e);
    size_t V = g_m->cfg.vocab_size;
    float *a = kl_malloc(V * sizeof *a), *b = kl_malloc(V * sizeof *b);
    kl_state warm, cold;
    ck_assert(kl_state_init(&warm, g_m, &err) == 0);
    ck_assert(kl_state_copy(&warm, kl_prefix_entry_state(e), &err) == 0);
    kl_prefix_unpin(c, e);
    ck_assert(kl_forward(g_m, &warm, p + 12, 1, a, &err) == 0);
    fed_state(&cold, p, 12);
    ck_assert(kl_forward(g_m, &cold, p + 12, 1, b, &err) == 0);
    ck_assert(memcmp(a, b, V * sizeof *a) == 0);
    kl_state_free(&warm);
    kl_state_free(&cold);
    kl_free(a);
    kl_free(b);
    kl_prefix_free(c);
}
END_TEST

START_TEST(lru_eviction_keeps_pinned_entries)
{
    kl_token p[4][16];
    for (size_t k = 0; k < 4; k++)
        ids_of(p[k], 16, 20 + k);
    size_t one = kl_prefix_state_bytes(g_m, 16);
    ck_assert(one > 0);
    kl_prefix *c;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_prefix_create(&c, g_m, 2 * one + one / 2, 8, &err) == 0);  /* room for 2 */
    put(c, p[0], 16, 1);
    put(c, p[1], 16, 1);
    ck_assert_uint_eq(found(c, p[0], 16, 16), 16);   /* 0 used last: 1 is the LRU */
    put(c, p[2], 16, 1);
    ck_assert_uint_eq(found(c, p[1], 16, 16), 0);
    ck_assert_uint_eq(found(c, p[0], 16, 16), 16);
    ck_assert_uint_eq(found(c, p[2], 16, 16), 16);
    kl_prefix_stats st;
    kl_prefix_get_stats(c, &st);
    ck_assert_uint_eq(st.entries, 2);
    ck_assert_uint_eq(st.bytes, 2 * one);
    /* both pinned: a new entry does not fit and nothing goes */
    kl_prefix_entry *e0 = kl_prefix_find(c, p[0], 16, 16);
    kl_prefix_entry *e2 = kl_prefix_find(c, p[2], 16, 16);
    put(c, p[3], 16, 0);
    ck_assert_uint_eq(found(c, p[0], 16, 16), 16);
    ck_assert_uint_eq(found(c, p[2], 16, 16), 16);
    /* 2 pinned (though used last), 0 not: 0 goes */
    kl_prefix_unpin(c, e0);
    put(c, p[3], 16, 1);
    ck_assert_uint_eq(found(c, p[0], 16, 16), 0);
    ck_assert_uint_eq(found(c, p[2], 16, 16), 16);
    kl_prefix_unpin(c, e2);
    kl_prefix_free(c);
    /* a slot limit, and a budget too small for any entry */
    ck_assert(kl_prefix_create(&c, g_m, (size_t)1 << 30, 1, &err) == 0);
    put(c, p[0], 16, 1);
    put(c, p[1], 16, 1);
    ck_assert_uint_eq(found(c, p[0], 16, 16), 0);
    kl_prefix_free(c);
    ck_assert(kl_prefix_create(&c, g_m, one - 1, 8, &err) == 0);
    put(c, p[0], 16, 0);
    kl_prefix_free(c);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Through the scheduler                                                                      */

typedef struct pout {
    kl_token ids[PMAXT];
    float   *logits;           /* [PMAXT, vocab] */
    size_t   n, cached;
    int      ended;
} pout;

static int p_on_token(void *user, kl_token id, kl_err *err)
{
    pout *o = user;
    ck_assert(o->n < PMAXT);
    o->ids[o->n++] = id;
    return 0;
}

static int p_on_logits(void *user, const float *logits, size_t V, kl_token id, kl_err *err)
{
    pout *o = user;
    ck_assert(o->n < PMAXT);
    memcpy(o->logits + o->n * V, logits, V * sizeof *logits);
    return 0;
}

static void p_on_cached(void *user, size_t n)
{
    ((pout *)user)->cached = n;
}

static void p_on_done(void *user, kl_sched_end why, size_t n, const kl_err *err)
{
    pout *o = user;
    ck_assert(!o->ended && why == KL_SCHED_LENGTH);
    o->ended = 1;
}

static void out_init(pout *o)
{
    memset(o, 0, sizeof *o);
    o->logits = kl_calloc((size_t)PMAXT * g_m->cfg.vocab_size, sizeof *o->logits);
    ck_assert_ptr_nonnull(o->logits);
}

static void psubmit(kl_sched *s, const kl_token *p, size_t n, pout *o)
{
    kl_sched_req r = {.prompt = p, .n_prompt = n, .max_tokens = PMAXT, .on_token = p_on_token,
                      .on_logits = p_on_logits, .on_cached = p_on_cached, .on_done = p_on_done,
                      .user = o};
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_sched_submit(s, &r, NULL, &err) == 0, "%s", t_fmt_err(&err));
}

static void drain(kl_sched *s)
{
    kl_err err;
    kl_err_clear(&err);
    for (size_t steps = 0; kl_sched_pending(s) && steps < 1000; steps++)
        ck_assert_msg(kl_sched_step(s, NULL, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(kl_sched_pending(s), 0);
}

/* p served alone by a scheduler without a cache. */
static void cold(const kl_token *p, size_t n, pout *o)
{
    kl_sched *s;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_sched_create(&s, g_m, 1, 8, &err) == 0);
    out_init(o);
    psubmit(s, p, n, o);
    drain(s);
    kl_sched_free(s);
    ck_assert(o->ended && o->cached == 0);
}

static void same_as(const pout *a, const pout *b, const char *what)
{
    ck_assert_uint_eq(a->n, b->n);
    ck_assert_msg(!memcmp(a->ids, b->ids, a->n * sizeof *a->ids), "%s: other ids", what);
    ck_assert_msg(!memcmp(a->logits, b->logits, a->n * g_m->cfg.vocab_size * sizeof(float)),
                  "%s: other logits", what);
}

START_TEST(second_turn_reuses_the_first_with_cold_logits)
{
    kl_token t1[24], t2[24 + PMAXT + 9];
    ids_of(t1, 24, 3);
    kl_sched *s;
    kl_prefix *c;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_prefix_create(&c, g_m, (size_t)1 << 30, 4, &err) == 0);
    ck_assert(kl_sched_create(&s, g_m, 2, 8, &err) == 0);   /* prompts fed over steps */
    kl_sched_set_prefix(s, c);
    pout a;
    out_init(&a);
    psubmit(s, t1, 24, &a);
    drain(s);
    ck_assert(a.ended && a.cached == 0 && a.n == PMAXT);
    /* the second turn: the first prompt, its reply, new ids */
    memcpy(t2, t1, sizeof t1);
    memcpy(t2 + 24, a.ids, PMAXT * sizeof *t2);
    ids_of(t2 + 24 + PMAXT, 9, 4);
    size_t n2 = 24 + PMAXT + 9;
    pout b, ref;
    out_init(&b);
    psubmit(s, t2, n2, &b);
    drain(s);
    ck_assert_uint_eq(b.cached, 24);
    cold(t2, n2, &ref);
    same_as(&b, &ref, "second turn");
    /* the same prompt again: its whole entry, kept with the logits of its last id, so its
     * first id needs no forward (a step of no tokens) */
    pout again;
    out_init(&again);
    psubmit(s, t2, n2, &again);
    size_t n_step = 99;
    ck_assert_msg(kl_sched_step(s, &n_step, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(n_step, 0);
    ck_assert_uint_eq(again.n, 1);
    drain(s);
    ck_assert_uint_eq(again.cached, n2);
    same_as(&again, &ref, "repeated turn");
    kl_prefix_stats st;
    kl_prefix_get_stats(c, &st);
    ck_assert_uint_eq(st.entries, 2);
    ck_assert_uint_eq(st.hits, 2);
    kl_sched_free(s);
    kl_prefix_free(c);
    kl_free(a.logits);
    kl_free(b.logits);
    kl_free(again.logits);
    kl_free(ref.logits);
}
END_TEST

START_TEST(requests_sharing_a_prefix_at_once_equal_each_alone)
{
    enum { N = 4, BASE = 20, TAIL = 5 };
    kl_token p[N][BASE + TAIL];
    for (int k = 0; k < N; k++) {
        ids_of(p[k], BASE, 5);
        ids_of(p[k] + BASE, TAIL, 40 + (size_t)k);
    }
    kl_sched *s;
    kl_prefix *c;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_prefix_create(&c, g_m, (size_t)1 << 30, 6, &err) == 0);
    ck_assert(kl_sched_create(&s, g_m, 3, 8, &err) == 0);
    kl_sched_set_prefix(s, c);
    pout warm;                       /* the shared prefix first, so the others may start from it */
    out_init(&warm);
    psubmit(s, p[0], BASE, &warm);
    drain(s);
    pout o[N], ref[N];
    for (int k = 0; k < N; k++) {
        out_init(&o[k]);
        psubmit(s, p[k], BASE + TAIL, &o[k]);
    }
    drain(s);
    for (int k = 0; k < N; k++) {
        ck_assert_uint_eq(o[k].cached, BASE);
        cold(p[k], BASE + TAIL, &ref[k]);
        same_as(&o[k], &ref[k], "shared prefix");
        kl_free(o[k].logits);
        kl_free(ref[k].logits);
    }
    kl_free(warm.logits);
    kl_sched_free(s);
    kl_prefix_free(c);
}
END_TEST

static Suite *sched_suite(void)
{
    Suite *s = suite_create("sched");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, batched_requests_equal_each_served_alone);
    tcase_add_test(tc, bad_requests_are_refused_and_free_cancels);
    tcase_add_test(tc, forced_choice_follows_the_model_among_the_sequences);
    tcase_add_test(tc, longest_prefix_and_exact_length);
    tcase_add_test(tc, lru_eviction_keeps_pinned_entries);
    tcase_add_test(tc, second_turn_reuses_the_first_with_cold_logits);
    tcase_add_test(tc, requests_sharing_a_prefix_at_once_equal_each_alone);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(sched_suite());
}
