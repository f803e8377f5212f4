/*
 * tests/test_session.c — engine/session (one conversation's state) and engine/cost.
 *
 * Session (on a tiny synthetic checkpoint): a second prompt that extends the first plus the
 * generated reply reuses the live state, one that extends only the first prompt reuses the
 * snapshot, and one that shares nothing starts over — each gives bit-identical logits to a
 * fresh session fed the whole prompt; a long prompt goes in pieces (progress per piece) and a
 * cancel flag stops it between pieces, after which the next prompt resumes from what was fed;
 * reset forgets everything; an id outside the vocabulary is refused before anything is fed;
 * the context check names the prompt, the generation and the limit.
 * Cost: the plan's weight bytes equal what the model holds; MemAvailable is read from a
 * meminfo file; the memory check refuses a model larger than what is available.
 */
#include "common/err.h"
#include "common/mem.h"
#include "synth/synth.h"
#include "engine/chat.h"
#include "engine/cost.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/tokenizer.h"
#include "tests/testutil.h"

#include <stdint.h>

static char g_root[512], g_model[600];
static kl_model *g_m;

static void setup_model(void)
{
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_model, sizeof g_model, "%s/tiny", g_root);
    t_synth_tiny(g_model, 3);
}

/* The model is opened in each test's process: its thread pool does not survive a fork. */
static void open_model(void)
{
    kl_err err;
    kl_err_clear(&err);
    kl_model_opts mo = {.threads = 2};
    int rc = kl_model_open(&g_m, g_model, &mo, &err);
    ck_assert_msg(rc == 0, "kl_model_open: %s", t_fmt_err(&err));
}

static void close_model(void)
{
    kl_model_close(g_m);
    g_m = NULL;
}

static void teardown_model(void)
{
    if (g_root[0])
        t_rmrf(g_root);
}

static void session_init(kl_session *s, int snapshots)
{
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_session_init(s, g_m, snapshots, &err);
    ck_assert_msg(rc == 0, "kl_session_init: %s", t_fmt_err(&err));
}

/* Prompts s with ids[0..n); returns the stats. */
static kl_session_stats prompt(kl_session *s, const uint32_t *ids, size_t n,
                               const kl_session_feed *f)
{
    kl_err err;
    kl_err_clear(&err);
    kl_session_stats st;
    int rc = kl_session_prompt(s, ids, n, f, &st, &err);
    ck_assert_msg(rc == 0, "kl_session_prompt of %zu ids: %s", n, t_fmt_err(&err));
    return st;
}

/* Logits of a fresh session fed ids[0..n) into out [vocab]. */
static void fresh_logits(const uint32_t *ids, size_t n, float *out)
{
    kl_session f;
    session_init(&f, 0);
    kl_session_stats st = prompt(&f, ids, n, NULL);
    ck_assert_msg(st.reused == 0 && st.fed == n, "fresh: expected 0 + %zu, got %zu + %zu", n,
                  st.reused, st.fed);
    memcpy(out, f.logits, g_m->cfg.vocab_size * sizeof *out);
    kl_session_free(&f);
}

static void expect_same_as_fresh(const kl_session *s, const uint32_t *ids, size_t n,
                                 const char *what)
{
    uint32_t V = g_m->cfg.vocab_size;
    float *ref = malloc(V * sizeof *ref);
    fresh_logits(ids, n, ref);
    ck_assert_msg(!memcmp(s->logits, ref, V * sizeof *ref),
                  "%s: logits differ from a fresh feed of %zu ids (rel L2 %g)", what, n,
                  t_rel_l2(s->logits, ref, V));
    free(ref);
}

/* ids[i] = a deterministic pattern inside the vocabulary. */
static uint32_t *pattern(size_t n, uint32_t salt)
{
    uint32_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = (uint32_t)((i * 37 + salt) % 700 + 1);
    return ids;
}

/* ------------------------------------------------------------------------------------------ */
/* Session                                                                                     */

START_TEST(session_reuse_of_live_state_and_snapshot_is_bit_identical_to_a_fresh_feed)
{
    kl_err err;
    kl_err_clear(&err);
    kl_session s;
    session_init(&s, 1);
    size_t n1 = 40;
    uint32_t *all = pattern(200, 5);
    prompt(&s, all, n1, NULL);
    /* a reply of 6 greedy ids: 5 of them fed (the last sampled one is not) */
    kl_sampler samp;
    kl_sampler_opts so = {.top_p = 1};
    ck_assert(kl_sampler_init(&samp, g_m->cfg.vocab_size, &so, &err) == 0);
    uint32_t gen[6];
    kl_tokenizer *tok;
    ck_assert_msg(kl_tok_open(g_model, &tok, &err) == 0, "kl_tok_open: %s", t_fmt_err(&err));
    kl_gen g = {.samp = &samp, .tok = tok, .n_predict = 6, .ids = gen};
    int rc = kl_session_generate(&s, &g, &err);
    ck_assert_msg(rc == 0, "kl_session_generate: %s", t_fmt_err(&err));
    ck_assert_msg(s.live_ids.n == n1 + g.n_fed, "live ids: expected %zu, got %zu", n1 + g.n_fed,
                  s.live_ids.n);

    /* 1. extends prompt + fed reply: the live state is reused */
    size_t n2 = n1 + g.n_fed + 7;
    memcpy(all + n1, gen, g.n_fed * sizeof *gen);
    kl_session_stats st = prompt(&s, all, n2, NULL);
    ck_assert_msg(st.reused == n1 + g.n_fed && st.fed == 7, "live reuse: expected %zu + 7, got "
                  "%zu + %zu", n1 + g.n_fed, st.reused, st.fed);
    expect_same_as_fresh(&s, all, n2, "live reuse");

    /* 2. the live state moves on (another reply); a prompt that extends only the last prompt
     * restores the snapshot */
    rc = kl_session_generate(&s, &g, &err);
    ck_assert_msg(rc == 0, "kl_session_generate: %s", t_fmt_err(&err));
    size_t n3 = n2 + 4;
    uint32_t *other = pattern(n3, 11);
    memcpy(other, all, n2 * sizeof *other);
    other[n2] = gen[0] == 5 ? 6 : 5;   /* not the reply's first id */
    st = prompt(&s, other, n3, NULL);
    ck_assert_msg(st.reused == n2 && st.fed == 4, "snapshot reuse: expected %zu + 4, got %zu + "
                  "%zu", n2, st.reused, st.fed);
    expect_same_as_fresh(&s, other, n3, "snapshot reuse");

    /* 3. shares no prefix: starts over */
    uint32_t *unrelated = pattern(30, 77);
    st = prompt(&s, unrelated, 30, NULL);
    ck_assert_msg(st.reused == 0 && st.fed == 30, "no prefix: expected 0 + 30, got %zu + %zu",
                  st.reused, st.fed);
    expect_same_as_fresh(&s, unrelated, 30, "no prefix");

    /* 4. reset forgets the held prefix */
    kl_session_reset(&s);
    uint32_t *longer = pattern(35, 77);
    st = prompt(&s, longer, 35, NULL);
    ck_assert_msg(st.reused == 0 && st.fed == 35, "after reset: expected 0 + 35, got %zu + %zu",
                  st.reused, st.fed);
    expect_same_as_fresh(&s, longer, 35, "after reset");

    free(unrelated);
    free(longer);
    free(other);
    free(all);
    kl_tok_close(tok);
    kl_sampler_free(&samp);
    kl_session_free(&s);
}
END_TEST

typedef struct feed_probe {
    size_t calls, last_done, last_total;
    volatile sig_atomic_t *cancel_after_first;
} feed_probe;

static void on_progress(void *user, size_t done, size_t total)
{
    feed_probe *p = user;
    p->calls++;
    p->last_done = done;
    p->last_total = total;
    if (p->cancel_after_first)
        *p->cancel_after_first = 1;
}

START_TEST(session_long_prompt_goes_in_pieces_and_cancel_stops_between_them)
{
    size_t n = 2 * KL_SESSION_PIECE + 10;
    uint32_t *ids = pattern(n, 1);
    kl_session s;
    session_init(&s, 1);
    feed_probe p = {0};
    kl_session_feed f = {.progress = on_progress, .user = &p};
    kl_session_stats st = prompt(&s, ids, n, &f);
    ck_assert_msg(p.calls == 3 && p.last_done == n && p.last_total == n && !st.cancelled,
                  "progress: expected 3 calls ending at %zu/%zu, got %zu calls, %zu/%zu", n, n,
                  p.calls, p.last_done, p.last_total);

    /* cancelled after the first piece: that piece is held, the rest is fed next time */
    kl_session_reset(&s);
    volatile sig_atomic_t cancel = 0;
    feed_probe q = {.cancel_after_first = &cancel};
    kl_session_feed fc = {.progress = on_progress, .user = &q, .cancel = &cancel};
    st = prompt(&s, ids, n, &fc);
    ck_assert_msg(st.cancelled && st.fed == KL_SESSION_PIECE && q.calls == 1,
                  "cancel: expected %d ids fed and cancelled, got %zu (cancelled %d, %zu calls)",
                  KL_SESSION_PIECE, st.fed, st.cancelled, q.calls);
    ck_assert_msg(s.snap_ids.n == 0, "a cancelled prompt must not be snapshotted (%zu ids)",
                  s.snap_ids.n);
    st = prompt(&s, ids, n, NULL);
    ck_assert_msg(st.reused == KL_SESSION_PIECE && st.fed == n - KL_SESSION_PIECE,
                  "after cancel: expected %d + %zu, got %zu + %zu", KL_SESSION_PIECE,
                  n - KL_SESSION_PIECE, st.reused, st.fed);
    expect_same_as_fresh(&s, ids, n, "resumed after cancel");
    free(ids);
    kl_session_free(&s);
}
END_TEST

START_TEST(session_refuses_ids_outside_the_vocabulary_before_feeding)
{
    kl_err err;
    kl_err_clear(&err);
    kl_session s;
    session_init(&s, 1);
    uint32_t ids[3] = {1, g_m->cfg.vocab_size, 2};
    int rc = kl_session_prompt(&s, ids, 3, NULL, NULL, &err);
    ck_assert_msg(rc == KL_E_USAGE && s.live.pos == 0, "expected KL_E_USAGE and nothing fed, got "
                  "%d, position %zu", rc, s.live.pos);
    ck_assert_msg(strstr(err.msg, "vocabulary") != NULL, "message: %s", err.msg);
    rc = kl_session_prompt(&s, ids, 0, NULL, NULL, &err);
    ck_assert_msg(rc == KL_E_USAGE, "empty prompt: expected KL_E_USAGE, got %d", rc);
    kl_session_free(&s);
}
END_TEST

START_TEST(session_context_check_names_prompt_generation_and_limit)
{
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_session_check_context(8, 3, 5, &err), 0);
    ck_assert_int_eq(kl_session_check_context(0, 1000000, 1000000, &err), 0);
    ck_assert_int_eq(kl_session_check_context(8, 8, 0, &err), 0);
    int rc = kl_session_check_context(8, 3, 6, &err);
    ck_assert_msg(rc == KL_E_USAGE, "3 + 6 > 8: expected KL_E_USAGE, got %d", rc);
    ck_assert_msg(strstr(err.msg, "3 tokens") && strstr(err.msg, "6 to generate") &&
                      strstr(err.msg, "8 tokens"),
                  "message must name 3, 6 and 8: %s", err.msg);
    kl_err_clear(&err);
    rc = kl_session_check_context(8, 9, 0, &err);
    ck_assert_msg(rc == KL_E_USAGE, "9 > 8: expected KL_E_USAGE, got %d", rc);
    kl_err_clear(&err);
    rc = kl_session_check_context(100, 50, UINT64_MAX, &err);
    ck_assert_msg(rc == KL_E_USAGE, "huge -n: expected KL_E_USAGE, got %d", rc);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Cost                                                                                        */

START_TEST(cost_plan_weight_bytes_equal_the_loaded_model)
{
    kl_err err;
    kl_err_clear(&err);
    kl_cost_plan p;
    int rc = kl_cost_plan_read(g_model, &p, &err);
    ck_assert_msg(rc == 0, "kl_cost_plan_read: %s", t_fmt_err(&err));
    ck_assert_msg(p.weight_bytes == g_m->weight_bytes && p.vocab_size == g_m->cfg.vocab_size &&
                      p.max_position == g_m->cfg.max_position,
                  "plan: %llu bytes, vocab %u, context %llu; model: %llu bytes, vocab %u, "
                  "context %llu", (unsigned long long)p.weight_bytes, p.vocab_size,
                  (unsigned long long)p.max_position, (unsigned long long)g_m->weight_bytes,
                  g_m->cfg.vocab_size, (unsigned long long)g_m->cfg.max_position);
    kl_token_bytes tb;
    kl_cost_token_bytes(g_m, &tb);
    ck_assert_msg(tb.total > 0 && tb.total < (double)g_m->weight_bytes,
                  "bytes per token %g must be in (0, %llu)", tb.total,
                  (unsigned long long)g_m->weight_bytes);
}
END_TEST

START_TEST(cost_mem_available_reads_meminfo_and_the_check_names_both_figures)
{
    kl_err err;
    kl_err_clear(&err);
    char path[700];
    snprintf(path, sizeof path, "%s/meminfo", g_root);
    const char *text = "MemTotal:       1000 kB\nMemFree:         10 kB\nMemAvailable:    2048 kB\n";
    t_write(path, text, strlen(text));
    uint64_t avail = 0;
    int rc = kl_cost_mem_available(path, &avail, &err);
    ck_assert_msg(rc == 0 && avail == 2048 * 1024, "MemAvailable: expected %d, got %llu (%s)",
                  2048 * 1024, (unsigned long long)avail, t_fmt_err(&err));
    t_write(path, "MemTotal: 1 kB\n", 15);
    rc = kl_cost_mem_available(path, &avail, &err);
    ck_assert_msg(rc == KL_E_FORMAT, "no MemAvailable: expected KL_E_FORMAT, got %d", rc);
    ck_assert_int_eq(kl_cost_check_memory(1000, 1000, &err), 0);
    kl_err_clear(&err);
    rc = kl_cost_check_memory(3000000000ull, 1000000000ull, &err);
    ck_assert_msg(rc == KL_E_NOMEM && strstr(err.msg, "3.000 GB") && strstr(err.msg, "1.000 GB"),
                  "expected KL_E_NOMEM naming 3.000 GB and 1.000 GB, got %d: %s", rc, err.msg);
    /* the real /proc/meminfo has the line */
    ck_assert_int_eq(kl_cost_mem_available(NULL, &avail, &err), 0);
}
END_TEST

static Suite *session_suite(void)
{
    Suite *s = suite_create("session");
    TCase *tc = tcase_create("session");
    tcase_add_unchecked_fixture(tc, setup_model, teardown_model);
    tcase_add_checked_fixture(tc, open_model, close_model);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, session_reuse_of_live_state_and_snapshot_is_bit_identical_to_a_fresh_feed);
    tcase_add_test(tc, session_long_prompt_goes_in_pieces_and_cancel_stops_between_them);
    tcase_add_test(tc, session_refuses_ids_outside_the_vocabulary_before_feeding);
    tcase_add_test(tc, session_context_check_names_prompt_generation_and_limit);
    tcase_add_test(tc, cost_plan_weight_bytes_equal_the_loaded_model);
    tcase_add_test(tc, cost_mem_available_reads_meminfo_and_the_check_names_both_figures);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(session_suite());
}
