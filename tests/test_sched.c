/*
 * tests/test_sched.c — continuous batching (serve/sched.h) on the CPU backend and a tiny
 * synthetic model: six greedy requests of different prompt lengths (one longer than a step),
 * three slots, one submitted while the others run, one with a stop id, one cancelled mid-way;
 * each request's ids equal the same request served alone (kl_forward, token by token), the
 * ends are reported once with the right reason, and bad requests are refused at submit.
 */
#include "common/err.h"
#include "common/mem.h"
#include "engine/forward.h"
#include "engine/model.h"
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

/* Greedy ids of request k served alone. */
static void alone(int k, kl_token *ids, size_t n)
{
    kl_token p[64];
    size_t np = prompt_of(k, p);
    size_t V = g_m->cfg.vocab_size;
    float *logits = kl_malloc(V * sizeof *logits);
    kl_state st;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_state_init(&st, g_m, &err) == 0);
    ck_assert(kl_forward(g_m, &st, p, np, logits, &err) == 0);
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

static Suite *sched_suite(void)
{
    Suite *s = suite_create("sched");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, batched_requests_equal_each_served_alone);
    tcase_add_test(tc, bad_requests_are_refused_and_free_cancels);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(sched_suite());
}
