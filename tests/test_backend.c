/*
 * tests/test_backend.c — engine/backend.h on the CPU backend: batches of several sequences
 * through kl_backend_forward (engine/forward.c), slots, and kl_model_use_backend.
 *
 * Every sequence's reference is itself fed alone, one token per kl_forward, on a tiny synthetic
 * checkpoint (tests/test_forward.c shows that equals any other split).  Checked: a batch mixing
 * three slots (a multi-token prompt piece on an empty slot, two single decode tokens, different
 * lengths) gives bit-identical logits and argmax to the references, and so does the next batch
 * and a kl_forward after it; a batch longer than the backend's chunk with wanted tokens on both
 * sides of the chunk boundary, with argmax only, and with want NULL (only the last token);
 * refused batches (no tokens, an id outside the vocabulary even in a later chunk, a slot not
 * open or out of range, a slot's tokens in two runs) are KL_E_USAGE and leave every slot's
 * length and state as they were (the next batch still matches the references); a copied slot
 * fed the same ids as its source gives identical logits; kl_model_use_backend refuses while a
 * slot is open and for a backend of another model, then installs the new backend; the slots
 * run out with KL_E_USAGE.  The tensor-parallel wrapper over 2 and 4 CPU ranks takes the same
 * mixed batches (and a copied slot) within relative L2 1e-5 of the references, same argmax.
 */
#include "common/err.h"
#include "common/mem.h"
#include "synth/synth.h"
#include "engine/backend.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdint.h>

/* ------------------------------------------------------------------------------------------ */
/* Fixture: the tiny preset, opened in each test's process; references per sequence          */

#define NSEQ 3
#define NREF 112              /* tokens of each sequence with a reference */
#define NTOK (NSEQ * NREF)    /* the longest batch */

static char g_root[512], g_model[600];
static kl_model *g_m;
static float *g_ref[NSEQ];    /* [NREF, vocab] logits after each token of sequence k, fed alone */

static void setup_model(void)
{
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_model, sizeof g_model, "%s/tiny", g_root);
    t_synth_tiny(g_model, 5);
}

static void teardown_model(void)
{
    if (g_root[0])
        t_rmrf(g_root);
}

static kl_model *open_model(void)
{
    kl_err err;
    kl_err_clear(&err);
    kl_model *m = NULL;
    kl_model_opts mo = {.threads = 2};
    int rc = kl_model_open(&m, g_model, &mo, &err);
    ck_assert_msg(rc == 0, "kl_model_open: %s", t_fmt_err(&err));
    return m;
}

/* Token i of sequence k. */
static kl_token seq_id(int k, size_t i)
{
    return (kl_token)((uint32_t)(i * 37 + 11 + (size_t)k * 101) % (g_m->cfg.vocab_size - 256));
}

/* Feeds ids i0 .. i0+n of sequence k to s with kl_forward; logits after the last into out. */
static void feed(kl_state *s, int k, size_t i0, size_t n, float *out)
{
    kl_err err;
    kl_err_clear(&err);
    kl_token ids[NREF];
    for (size_t i = 0; i < n; i++)
        ids[i] = seq_id(k, i0 + i);
    int rc = kl_forward(g_m, s, ids, n, out, &err);
    ck_assert_msg(rc == 0, "kl_forward(sequence %d, %zu tokens at %zu): %s", k, n, i0,
                  t_fmt_err(&err));
}

static void open_refs(void)
{
    g_m = open_model();
    size_t V = g_m->cfg.vocab_size;
    kl_state s;
    ck_assert(kl_state_init(&s, g_m, NULL) == 0);
    for (int k = 0; k < NSEQ; k++) {
        g_ref[k] = kl_malloc(NREF * V * sizeof *g_ref[k]);
        ck_assert(g_ref[k]);
        kl_state_reset(&s);
        for (size_t i = 0; i < NREF; i++)
            feed(&s, k, i, 1, g_ref[k] + i * V);
    }
    kl_state_free(&s);
}

static void close_refs(void)
{
    for (int k = 0; k < NSEQ; k++) {
        kl_free(g_ref[k]);
        g_ref[k] = NULL;
    }
    kl_model_close(g_m);
    g_m = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Batches                                                                                    */

typedef struct tbatch {
    size_t   n, nw;
    kl_token ids[NTOK];
    uint32_t slot[NTOK];
    uint8_t  want[NTOK];
    int      wk[NTOK];        /* wanted tokens in order: their sequence */
    size_t   wi[NTOK];        /* and position in it */
} tbatch;

/* Appends positions from .. from+len of sequence k in slot; wants the run's last token and
 * every token whose batch index is a multiple of `every` (0: none) or is listed in `also`. */
static void add_run(tbatch *b, int k, const kl_state *s, size_t from, size_t len, size_t every,
                    const size_t *also, size_t n_also)
{
    for (size_t i = 0; i < len; i++) {
        size_t t = b->n++;
        int w = i + 1 == len || (every && t % every == 0);
        for (size_t a = 0; a < n_also; a++)
            w |= also[a] == t;
        b->ids[t] = seq_id(k, from + i);
        b->slot[t] = s->slot;
        b->want[t] = (uint8_t)w;
        if (w) {
            b->wk[b->nw] = k;
            b->wi[b->nw++] = from + i;
        }
    }
}

static int forward(const tbatch *b, int use_want, float *logits, kl_token *argmax, kl_err *err)
{
    kl_batch kb = {b->n, b->ids, b->slot, use_want ? b->want : NULL};
    return kl_backend_forward(g_m->be, &kb, logits, argmax, err);
}

/* Relative L2 a wanted row may have against its reference: 0 (bit for bit), or TP_TOL for
 * tensor-parallel ranks (their sums in another order: issue 12's CPU bound). */
static double g_tol;
#define TP_TOL 1e-5

/* Row w of logits (may be NULL) and argmax[w] against the reference of wanted token w. */
static void check_row(const tbatch *b, size_t w, const float *logits, const kl_token *argmax,
                      const char *what)
{
    size_t V = g_m->cfg.vocab_size;
    const float *ref = g_ref[b->wk[w]] + b->wi[w] * V;
    if (logits && g_tol > 0)
        ck_assert_msg(t_rel_l2(logits + w * V, ref, V) <= g_tol, "%s: wanted token %zu "
                      "(sequence %d, position %zu): rel L2 %g against the sequence fed alone",
                      what, w, b->wk[w], b->wi[w], t_rel_l2(logits + w * V, ref, V));
    else if (logits)
        ck_assert_msg(memcmp(logits + w * V, ref, V * sizeof *ref) == 0,
                      "%s: wanted token %zu (sequence %d, position %zu): logits differ from the "
                      "sequence fed alone (rel L2 %g)", what, w, b->wk[w], b->wi[w],
                      t_rel_l2(logits + w * V, ref, V));
    kl_token want = kl_sample_argmax(ref, (uint32_t)V);
    if (argmax)
        ck_assert_msg(argmax[w] == want, "%s: wanted token %zu (sequence %d, position %zu): "
                      "argmax %u, alone %u", what, w, b->wk[w], b->wi[w], argmax[w], want);
}

/* Runs b with its want flags and checks every wanted row (logits and argmax). */
static void run_and_check(const tbatch *b, const char *what)
{
    size_t V = g_m->cfg.vocab_size;
    float *logits = kl_malloc((b->nw ? b->nw : 1) * V * sizeof *logits);
    kl_token *argmax = kl_malloc((b->nw ? b->nw : 1) * sizeof *argmax);
    kl_err err;
    kl_err_clear(&err);
    int rc = forward(b, 1, logits, argmax, &err);
    ck_assert_msg(rc == 0, "%s: kl_backend_forward: expected 0, got %d (%s)", what, rc,
                  t_fmt_err(&err));
    for (size_t w = 0; w < b->nw; w++)
        check_row(b, w, logits, argmax, what);
    kl_free(logits);
    kl_free(argmax);
}

static void states_open(kl_state *s, size_t n)
{
    kl_err err;
    kl_err_clear(&err);
    for (size_t i = 0; i < n; i++) {
        int rc = kl_state_init(&s[i], g_m, &err);
        ck_assert_msg(rc == 0, "kl_state_init %zu: %s", i, t_fmt_err(&err));
    }
}

static void states_free(kl_state *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kl_state_free(&s[i]);
}

/* Resets s[k] and feeds it the first pre[k] tokens of sequence k. */
static void prefeed(kl_state *s, const size_t *pre)
{
    for (int k = 0; k < NSEQ; k++) {
        kl_state_reset(&s[k]);
        if (pre[k])
            feed(&s[k], k, 0, pre[k], NULL);
    }
}

static void check_lengths(const kl_state *s, const size_t *len, const char *what)
{
    for (int k = 0; k < NSEQ; k++)
        ck_assert_msg(g_m->be->slot_len[s[k].slot] == len[k], "%s: slot of sequence %d holds "
                      "%zu tokens, expected %zu", what, k, g_m->be->slot_len[s[k].slot], len[k]);
}

/* ------------------------------------------------------------------------------------------ */
/* Tests                                                                                      */

START_TEST(mixed_batch_of_three_sequences_matches_each_fed_alone)
{
    kl_state s[NSEQ];
    states_open(s, NSEQ);
    static const size_t pre[NSEQ] = {10, 3, 0};   /* sequence 2: empty caches */
    prefeed(s, pre);
    /* a decode token, a 7-token prompt piece, a decode token */
    tbatch *b = kl_calloc(1, sizeof *b);
    add_run(b, 0, &s[0], 10, 1, 0, NULL, 0);
    add_run(b, 2, &s[2], 0, 7, 0, NULL, 0);
    add_run(b, 1, &s[1], 3, 1, 0, NULL, 0);
    run_and_check(b, "first batch");
    check_lengths(s, (const size_t[NSEQ]){11, 4, 7}, "after the first batch");
    /* the next step, in another order, every token wanted */
    memset(b, 0, sizeof *b);
    add_run(b, 1, &s[1], 4, 1, 1, NULL, 0);
    add_run(b, 0, &s[0], 11, 1, 1, NULL, 0);
    add_run(b, 2, &s[2], 7, 2, 1, NULL, 0);
    run_and_check(b, "second batch");
    check_lengths(s, (const size_t[NSEQ]){12, 5, 9}, "after the second batch");
    /* kl_forward carries on from the batches (its position follows the slot) */
    size_t V = g_m->cfg.vocab_size;
    float *l = kl_malloc(V * sizeof *l);
    feed(&s[0], 0, 12, 1, l);
    ck_assert_msg(s[0].pos == 13, "kl_forward after batches: position %zu, expected 13",
                  s[0].pos);
    ck_assert_msg(memcmp(l, g_ref[0] + 12 * V, V * sizeof *l) == 0,
                  "kl_forward after batches: logits differ from the sequence fed alone");
    kl_free(l);
    kl_free(b);
    states_free(s, NSEQ);
}
END_TEST

START_TEST(batch_longer_than_a_chunk_gives_every_wanted_row)
{
    ck_assert_msg(g_m->be->max_tokens == KL_FORWARD_CHUNK, "cpu backend chunk %zu, expected %d",
                  g_m->be->max_tokens, KL_FORWARD_CHUNK);
    kl_state s[NSEQ];
    states_open(s, NSEQ);
    static const size_t pre[NSEQ] = {5, 0, 1};
    /* 70 + 30 + 1 tokens: the first chunk ends inside sequence 1's run; wanted: every 9th
     * token, both sides of the chunk boundary, each run's last */
    static const size_t edge[2] = {KL_FORWARD_CHUNK - 1, KL_FORWARD_CHUNK};
    tbatch *b = kl_calloc(1, sizeof *b);
    add_run(b, 1, &s[1], 0, 70, 9, edge, 2);
    add_run(b, 0, &s[0], 5, 30, 9, edge, 2);
    add_run(b, 2, &s[2], 1, 1, 9, edge, 2);
    ck_assert(b->n > g_m->be->max_tokens && b->nw > 10);

    prefeed(s, pre);
    run_and_check(b, "101 tokens, logits and argmax");
    check_lengths(s, (const size_t[NSEQ]){35, 70, 2}, "after 101 tokens");

    /* argmax only: the rows computed one at a time */
    prefeed(s, pre);
    kl_token *argmax = kl_malloc(b->nw * sizeof *argmax);
    kl_err err;
    kl_err_clear(&err);
    ck_assert(forward(b, 1, NULL, argmax, &err) == 0);
    for (size_t w = 0; w < b->nw; w++)
        check_row(b, w, NULL, argmax, "101 tokens, argmax only");

    /* want NULL: only the batch's last token, although it spans two chunks */
    prefeed(s, pre);
    size_t V = g_m->cfg.vocab_size;
    float *l = kl_malloc(V * sizeof *l);
    ck_assert(forward(b, 0, l, argmax, &err) == 0);
    ck_assert_msg(memcmp(l, g_ref[2] + 1 * V, V * sizeof *l) == 0,
                  "want NULL: the one row is not the last token's");
    ck_assert(argmax[0] == kl_sample_argmax(l, (uint32_t)V));
    kl_free(l);
    kl_free(argmax);
    kl_free(b);
    states_free(s, NSEQ);
}
END_TEST

START_TEST(refused_batches_are_usage_errors_and_change_no_state)
{
    kl_state s[NSEQ];
    states_open(s, NSEQ);
    static const size_t pre[NSEQ] = {4, 2, 0};
    prefeed(s, pre);
    kl_state closed;
    ck_assert(kl_state_init(&closed, g_m, NULL) == 0);
    uint32_t closed_slot = closed.slot;
    kl_state_free(&closed);

    tbatch *b = kl_calloc(1, sizeof *b);
    kl_err err;
    struct { const char *what; size_t bad; } cases[] = {
        {"no tokens", 0}, {"an id outside the vocabulary in the second chunk", 1},
        {"a closed slot", 2}, {"a slot past max_slots", 3}, {"slot 0's tokens in two runs", 4},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        memset(b, 0, sizeof *b);
        if (c == 1 || c == 4) {
            add_run(b, 0, &s[0], 4, c == 1 ? 70 : 2, 0, NULL, 0);
            add_run(b, 1, &s[1], 2, 1, 0, NULL, 0);
        }
        if (c == 1)
            b->ids[68] = (kl_token)g_m->cfg.vocab_size;
        if (c == 2 || c == 3) {
            add_run(b, 1, &s[1], 2, 3, 0, NULL, 0);
            b->slot[1] = c == 2 ? closed_slot : g_m->be->max_slots;
        }
        if (c == 4)
            add_run(b, 0, &s[0], 6, 1, 0, NULL, 0);
        kl_err_clear(&err);
        int rc = forward(b, 1, NULL, NULL, &err);
        ck_assert_msg(rc == KL_E_USAGE, "%s: expected KL_E_USAGE, got %d (%s)", cases[c].what,
                      rc, t_fmt_err(&err));
        check_lengths(s, pre, cases[c].what);
    }
    /* the slots still hold exactly what they held: the next batch matches the references */
    memset(b, 0, sizeof *b);
    add_run(b, 0, &s[0], 4, 3, 1, NULL, 0);
    add_run(b, 1, &s[1], 2, 1, 1, NULL, 0);
    add_run(b, 2, &s[2], 0, 2, 1, NULL, 0);
    run_and_check(b, "after the refused batches");
    kl_free(b);
    states_free(s, NSEQ);
}
END_TEST

START_TEST(copied_slot_fed_the_same_ids_gives_identical_logits)
{
    kl_state s[2];
    states_open(s, 2);
    feed(&s[0], 0, 0, 20, NULL);
    feed(&s[1], 1, 0, 7, NULL);   /* overwritten by the copy */
    kl_err err;
    kl_err_clear(&err);
    kl_backend *be = g_m->be;
    int rc = be->ops->slot_copy(be, s[1].slot, s[0].slot, &err);
    ck_assert_msg(rc == 0, "slot_copy: %s", t_fmt_err(&err));
    ck_assert_msg(be->slot_len[s[1].slot] == 20, "copy holds %zu tokens, expected 20",
                  be->slot_len[s[1].slot]);
    /* both fed sequence 0's next 3 tokens in one batch */
    tbatch *b = kl_calloc(1, sizeof *b);
    add_run(b, 0, &s[0], 20, 3, 1, NULL, 0);
    add_run(b, 0, &s[1], 20, 3, 1, NULL, 0);
    run_and_check(b, "source and copy");
    kl_free(b);
    states_free(s, 2);
}
END_TEST

START_TEST(model_takes_a_new_backend_only_with_no_slot_open)
{
    kl_err err;
    kl_err_clear(&err);
    kl_backend *old = g_m->be, *be2 = NULL, *other = NULL;
    ck_assert(kl_backend_cpu_create(&be2, g_m, &err) == 0);
    kl_state s;
    ck_assert(kl_state_init(&s, g_m, NULL) == 0);
    int rc = kl_model_use_backend(g_m, be2, &err);
    ck_assert_msg(rc == KL_E_USAGE && g_m->be == old,
                  "a slot open: expected KL_E_USAGE and the old backend kept, got %d", rc);
    kl_state_free(&s);
    ck_assert(kl_model_use_backend(g_m, NULL, &err) == KL_E_USAGE);
    kl_model *m2 = open_model();
    ck_assert(kl_backend_cpu_create(&other, m2, &err) == 0);
    ck_assert_msg(kl_model_use_backend(g_m, other, &err) == KL_E_USAGE && g_m->be == old,
                  "a backend of another model was installed");
    kl_backend_free(other);
    kl_model_close(m2);

    kl_err_clear(&err);
    rc = kl_model_use_backend(g_m, be2, &err);
    ck_assert_msg(rc == 0 && g_m->be == be2, "no slot open: expected 0, got %d (%s)", rc,
                  t_fmt_err(&err));
    /* the new backend serves kl_state and kl_forward as the old one did */
    size_t V = g_m->cfg.vocab_size;
    float *l = kl_malloc(V * sizeof *l);
    ck_assert(kl_state_init(&s, g_m, NULL) == 0);
    feed(&s, 1, 0, 9, l);
    ck_assert_msg(memcmp(l, g_ref[1] + 8 * V, V * sizeof *l) == 0,
                  "the new backend's logits differ");
    kl_state_free(&s);
    kl_free(l);
}
END_TEST

START_TEST(opening_more_slots_than_the_backend_has_is_refused)
{
    uint32_t n = g_m->be->max_slots;
    kl_state *s = kl_calloc(n + 1, sizeof *s);
    states_open(s, n);
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_state_init(&s[n], g_m, &err);
    ck_assert_msg(rc == KL_E_USAGE, "slot %u of %u: expected KL_E_USAGE, got %d", n + 1, n, rc);
    kl_state_free(&s[n]);   /* zeroed by the refused init: a no-op */
    kl_state_free(&s[0]);
    ck_assert_msg(kl_state_init(&s[0], g_m, &err) == 0, "a closed slot is not reused: %s",
                  t_fmt_err(&err));
    states_free(s, n);
    kl_free(s);
}
END_TEST

/* The benchmark's synthetic context: a used slot filled with n positions holds exactly n (its
 * old sequence gone: fill 0 then the reference sequence gives the reference logits bit for
 * bit), and a token fed after n synthetic positions goes at position n with finite logits. */
START_TEST(synthetic_fill_resets_then_holds_n_positions)
{
    size_t V = g_m->cfg.vocab_size;
    float *out = kl_malloc(V * sizeof *out);
    kl_state s;
    states_open(&s, 1);
    kl_err err;
    kl_err_clear(&err);
    feed(&s, 1, 0, 9, NULL);
    ck_assert_msg(kl_state_fill_synthetic(&s, 0, &err) == 0, "%s", t_fmt_err(&err));
    for (size_t i = 0; i < 6; i++) {
        feed(&s, 0, i, 1, out);
        ck_assert_msg(!memcmp(out, g_ref[0] + i * V, V * sizeof *out),
                      "token %zu after a fill of 0 differs from the reference", i);
    }
    ck_assert_msg(kl_state_fill_synthetic(&s, 300, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(s.pos, 300);
    ck_assert_uint_eq(g_m->be->slot_len[s.slot], 300);
    feed(&s, 2, 0, 1, out);
    ck_assert_uint_eq(s.pos, 301);
    for (size_t v = 0; v < V; v++)
        ck_assert_msg(isfinite(out[v]), "logit %zu after the synthetic context is %g", v,
                      (double)out[v]);
    states_free(&s, 1);
    kl_free(out);
}
END_TEST

/* The tensor-parallel wrapper over 2 and 4 CPU ranks (engine/backend_tp.h) takes the mixed
 * batches of the first test: every wanted row within TP_TOL of the sequence fed alone at TP 1,
 * the same argmax, the slots' lengths as at TP 1; a copied slot carries on as its source. */
START_TEST(tensor_parallel_ranks_take_mixed_batches)
{
    kl_model *whole = g_m;
    for (unsigned tp = 2; tp <= 4; tp *= 2) {
        kl_err err;
        kl_err_clear(&err);
        kl_model_opts mo = {.threads = 2, .tp = tp};
        int rc = kl_model_open(&g_m, g_model, &mo, &err);
        ck_assert_msg(rc == 0, "TP %u: %s", tp, t_fmt_err(&err));
        g_tol = TP_TOL;
        kl_state s[NSEQ + 1];
        states_open(s, NSEQ + 1);
        prefeed(s, (const size_t[NSEQ]){10, 3, 0});
        tbatch *b = kl_calloc(1, sizeof *b);
        add_run(b, 0, &s[0], 10, 1, 0, NULL, 0);
        add_run(b, 2, &s[2], 0, 7, 0, NULL, 0);
        add_run(b, 1, &s[1], 3, 1, 0, NULL, 0);
        run_and_check(b, tp == 2 ? "TP 2, first batch" : "TP 4, first batch");
        check_lengths(s, (const size_t[NSEQ]){11, 4, 7}, "TP, after the first batch");
        /* sequence 2's slot copied: the copy fed sequence 2's next tokens as its source */
        ck_assert_int_eq(kl_state_copy(&s[NSEQ], &s[2], &err), 0);
        memset(b, 0, sizeof *b);
        add_run(b, 1, &s[1], 4, 1, 1, NULL, 0);
        add_run(b, 2, &s[NSEQ], 7, 2, 1, NULL, 0);
        add_run(b, 0, &s[0], 11, 1, 1, NULL, 0);
        run_and_check(b, tp == 2 ? "TP 2, second batch" : "TP 4, second batch");
        kl_free(b);
        states_free(s, NSEQ + 1);
        g_tol = 0;
        kl_model_close(g_m);
    }
    g_m = whole;
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *backend_suite(void)
{
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_unchecked_fixture(tc, setup_model, teardown_model);
    tcase_add_checked_fixture(tc, open_refs, close_refs);
    tcase_add_test(tc, mixed_batch_of_three_sequences_matches_each_fed_alone);
    tcase_add_test(tc, batch_longer_than_a_chunk_gives_every_wanted_row);
    tcase_add_test(tc, refused_batches_are_usage_errors_and_change_no_state);
    tcase_add_test(tc, copied_slot_fed_the_same_ids_gives_identical_logits);
    tcase_add_test(tc, model_takes_a_new_backend_only_with_no_slot_open);
    tcase_add_test(tc, opening_more_slots_than_the_backend_has_is_refused);
    tcase_add_test(tc, synthetic_fill_resets_then_holds_n_positions);
    tcase_add_test(tc, tensor_parallel_ranks_take_mixed_batches);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(backend_suite());
}
