/*
 * tests/test_forward.c — engine/model + engine/forward: binding of synthetic tiny checkpoints
 * (BF16 and MXFP4) and the CPU forward pass.
 *
 * Agreement with transformers is tests/test_golden.c's; these tests check self-consistency:
 * a prompt longer than two prefill chunks fed token by token, in one call, in calls of 5, 63,
 * 64 and 65 tokens, and resumed from a copied state gives bit-identical last-position logits;
 * the scalar kernels agree with the AVX2 ones (relative L2 <= 1e-5); logits are finite and not
 * constant; a reset state reproduces them and the thread count changes no bit; both
 * route-weight modes run and differ; the MXFP4 checkpoint runs; bad token ids are refused.
 */
#include "common/err.h"
#include "common/mem.h"
#include "synth/synth.h"
#include "engine/forward.h"
#include "engine/matvec.h"
#include "engine/model.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdint.h>

/* ------------------------------------------------------------------------------------------ */
/* Fixture: tiny BF16 and tiny MXFP4 written once into a temp dir                             */

static char g_root[512], g_bf16[600], g_mxfp4[600];

#define N_PROMPT 24
#define N_LONG   (2 * KL_FORWARD_CHUNK + 22)   /* three prefill chunks in one call */
#define REL_TOL 1e-5

static void synth(const char *dir, kl_synth_format fmt)
{
    kl_err err;
    kl_err_clear(&err);
    kl_synth_opts o = {0};
    o.out_dir = dir;
    o.preset = "tiny";
    o.format = fmt;
    o.seed = 7;
    o.buffered = 1;
    o.threads = 2;
    int rc = kl_synth_write(&o, &err);
    ck_assert_msg(rc == 0, "kl_synth_write(%s): expected 0, got %d (%s)", dir, rc,
                  t_fmt_err(&err));
}

static void setup_ckpts(void)
{
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_bf16, sizeof g_bf16, "%s/tiny-bf16", g_root);
    snprintf(g_mxfp4, sizeof g_mxfp4, "%s/tiny-mxfp4", g_root);
    synth(g_bf16, KL_SYNTH_BF16);
    synth(g_mxfp4, KL_SYNTH_MXFP4);
}

static void teardown_ckpts(void)
{
    if (g_root[0])
        t_rmrf(g_root);
}

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

static void prompt_n(kl_token *ids, size_t n, uint32_t vocab)
{
    for (size_t i = 0; i < n; i++)
        ids[i] = (kl_token)((uint32_t)(i * 37 + 11) % (vocab - 256));
}

static void prompt(kl_token *ids, uint32_t vocab)
{
    prompt_n(ids, N_PROMPT, vocab);
}

static kl_model *open_model(const char *dir, unsigned threads)
{
    kl_err err;
    kl_err_clear(&err);
    kl_model *m = NULL;
    kl_model_opts o = {.threads = threads, .route_weights = KL_ROUTE_UNBIASED};
    int rc = kl_model_open(&m, dir, &o, &err);
    ck_assert_msg(rc == 0 && m, "kl_model_open(%s): expected 0, got %d (%s)", dir, rc,
                  t_fmt_err(&err));
    return m;
}

/* Feeds ids in chunks of `chunk` tokens (0 = one call) into a fresh state; logits of the last. */
static void run_chunks(kl_model *m, kl_state *s, const kl_token *ids, size_t n, size_t chunk,
                       float *logits)
{
    kl_err err;
    kl_err_clear(&err);
    kl_state_reset(s);
    if (!chunk)
        chunk = n;
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        int rc = kl_forward(m, s, ids + i, k, i + k == n ? logits : NULL, &err);
        ck_assert_msg(rc == 0, "kl_forward(chunk %zu at %zu): expected 0, got %d (%s)", chunk, i,
                      rc, t_fmt_err(&err));
    }
    ck_assert_msg(s->pos == n, "state position: expected %zu, got %zu", n, s->pos);
}


static void check_sane(const float *l, size_t n, const char *what)
{
    float lo = l[0], hi = l[0];
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(isfinite(l[i]), "%s: logit %zu is not finite (%g)", what, i, (double)l[i]);
        lo = l[i] < lo ? l[i] : lo;
        hi = l[i] > hi ? l[i] : hi;
    }
    ck_assert_msg(hi - lo > 1e-3f, "%s: logits are constant (min %g, max %g)", what, (double)lo,
                  (double)hi);
}

static void assert_same_logits(const float *got, const float *want, size_t V, const char *what,
                               const char *how)
{
    ck_assert_msg(memcmp(got, want, V * sizeof *got) == 0,
                  "%s: %s vs token by token: logits differ (rel L2 %g)", what, how,
                  t_rel_l2(got, want, V));
}

/* Token by token vs one call vs calls of 5, 63, 64, 65 tokens: all bit-identical. */
static void check_split_invariance(const char *dir, const char *what)
{
    static const size_t splits[] = {0, 5, KL_FORWARD_CHUNK - 1, KL_FORWARD_CHUNK,
                                    KL_FORWARD_CHUNK + 1};
    kl_model *m = open_model(dir, 4);
    size_t V = m->cfg.vocab_size;
    kl_token ids[N_LONG];
    prompt_n(ids, N_LONG, m->cfg.vocab_size);
    float *a = kl_malloc(V * sizeof *a), *b = kl_malloc(V * sizeof *b);
    kl_state s;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_state_init(&s, m, &err);
    ck_assert_msg(rc == 0, "kl_state_init: expected 0, got %d (%s)", rc, t_fmt_err(&err));

    run_chunks(m, &s, ids, N_LONG, 1, a);
    check_sane(a, V, what);
    for (size_t i = 0; i < sizeof splits / sizeof *splits; i++) {
        char how[48];
        snprintf(how, sizeof how, "calls of %zu tokens", splits[i] ? splits[i] : (size_t)N_LONG);
        run_chunks(m, &s, ids, N_LONG, splits[i], b);
        assert_same_logits(b, a, V, what, how);
    }

    kl_state_free(&s);
    kl_free(a);
    kl_free(b);
    kl_model_close(m);
}

/* A state copied after 70 tokens and fed the rest in one call matches the original, which a
 * copy must not disturb. */
static void check_resumed_state(const char *dir, const char *what)
{
    size_t cut = KL_FORWARD_CHUNK + 6;
    kl_model *m = open_model(dir, 2);
    size_t V = m->cfg.vocab_size;
    kl_token ids[N_LONG];
    prompt_n(ids, N_LONG, m->cfg.vocab_size);
    float *a = kl_malloc(V * sizeof *a), *b = kl_malloc(V * sizeof *b), *c = kl_malloc(V * 4);
    kl_state s, s2;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_state_init(&s, m, NULL) == 0 && kl_state_init(&s2, m, NULL) == 0);
    run_chunks(m, &s, ids, N_LONG, 1, a);

    kl_state_reset(&s);
    ck_assert(kl_forward(m, &s, ids, cut, NULL, &err) == 0);
    int rc = kl_state_copy(&s2, &s, &err);
    ck_assert_msg(rc == 0, "kl_state_copy: expected 0, got %d (%s)", rc, t_fmt_err(&err));
    ck_assert(kl_forward(m, &s2, ids + cut, N_LONG - cut, b, &err) == 0);
    assert_same_logits(b, a, V, what, "resumed copy");
    ck_assert(kl_forward(m, &s, ids + cut, N_LONG - cut, c, &err) == 0);
    assert_same_logits(c, a, V, what, "original after the copy");

    kl_state_free(&s);
    kl_state_free(&s2);
    kl_free(a);
    kl_free(b);
    kl_free(c);
    kl_model_close(m);
}

/* Scalar kernels against the AVX2 ones: the prompt's logits and a few decode steps. */
static void check_scalar_kernels(const char *dir, const char *what)
{
    kl_model *m = open_model(dir, 2);
    size_t V = m->cfg.vocab_size;
    kl_token ids[N_LONG];
    prompt_n(ids, N_LONG, m->cfg.vocab_size);
    float *l[2];
    kl_state s;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_state_init(&s, m, NULL) == 0);
    if (kl_matvec_set_kernels(KL_KERNELS_AVX2) != KL_KERNELS_AVX2)
        fprintf(stderr, "note: no AVX2/FMA on this CPU: scalar checked against itself\n");
    for (int k = 0; k < 2; k++) {
        l[k] = kl_malloc(4 * V * sizeof *l[k]);
        kl_matvec_set_kernels(k ? KL_KERNELS_SCALAR : KL_KERNELS_AVX2);
        run_chunks(m, &s, ids, N_LONG, 0, l[k]);
        for (int step = 1; step < 4; step++)
            ck_assert(kl_forward(m, &s, &ids[step], 1, l[k] + step * V, &err) == 0);
    }
    for (int step = 0; step < 4; step++) {
        double e = t_rel_l2(l[1] + step * V, l[0] + step * V, V);
        ck_assert_msg(e <= REL_TOL, "%s: step %d: scalar vs avx2 rel L2 %g > %g", what, step, e,
                      REL_TOL);
    }
    kl_matvec_set_kernels(KL_KERNELS_AUTO);
    kl_state_free(&s);
    kl_free(l[0]);
    kl_free(l[1]);
    kl_model_close(m);
}

/* ------------------------------------------------------------------------------------------ */
/* Tests                                                                                      */

START_TEST(bf16_any_prompt_split_gives_identical_logits)
{
    check_split_invariance(g_bf16, "tiny bf16");
}
END_TEST

/* MLA attention walks the latent cache in blocks for a group of a chunk's tokens: with a
 * prompt longer than one block (1,365 rows of the tiny preset's 24 floats) the logits of one
 * call still equal those of one token at a time. */
START_TEST(attention_over_several_cache_blocks_matches_token_by_token)
{
    enum { N = 1500 };
    kl_model *m = open_model(g_bf16, 2);
    size_t V = m->cfg.vocab_size;
    kl_token *ids = kl_malloc(N * sizeof *ids);
    prompt_n(ids, N, m->cfg.vocab_size);
    float *a = kl_malloc(V * sizeof *a), *b = kl_malloc(V * sizeof *b);
    kl_state s;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_state_init(&s, m, &err) == 0);
    run_chunks(m, &s, ids, N, 1, a);
    run_chunks(m, &s, ids, N, 0, b);
    assert_same_logits(b, a, V, "tiny bf16, 1500 tokens", "one call");
    kl_state_free(&s);
    kl_free(ids);
    kl_free(a);
    kl_free(b);
    kl_model_close(m);
}
END_TEST

START_TEST(mxfp4_any_prompt_split_gives_identical_logits)
{
    check_split_invariance(g_mxfp4, "tiny mxfp4");
}
END_TEST

START_TEST(resumed_state_gives_identical_logits)
{
    check_resumed_state(g_bf16, "tiny bf16");
    check_resumed_state(g_mxfp4, "tiny mxfp4");
}
END_TEST

START_TEST(scalar_kernels_agree_with_avx2)
{
    check_scalar_kernels(g_bf16, "tiny bf16");
    check_scalar_kernels(g_mxfp4, "tiny mxfp4");
}
END_TEST

START_TEST(state_reset_reproduces_logits_and_thread_count_does_not_matter)
{
    kl_model *m = open_model(g_bf16, 1);
    kl_model *m4 = open_model(g_bf16, 4);
    size_t V = m->cfg.vocab_size;
    kl_token ids[N_PROMPT];
    prompt(ids, m->cfg.vocab_size);
    float *a = kl_malloc(V * sizeof *a), *b = kl_malloc(V * sizeof *b), *c = kl_malloc(V * 4);
    kl_state s, s4;
    ck_assert(kl_state_init(&s, m, NULL) == 0);
    ck_assert(kl_state_init(&s4, m4, NULL) == 0);
    run_chunks(m, &s, ids, N_PROMPT, 7, a);
    /* a different prompt in between, then reset and the first one again */
    kl_token other[3] = {1, 2, 3};
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_forward(m, &s, other, 3, NULL, &err) == 0);
    run_chunks(m, &s, ids, N_PROMPT, 7, b);
    ck_assert_msg(memcmp(a, b, V * sizeof *a) == 0, "logits after reset differ (rel L2 %g)",
                  t_rel_l2(b, a, V));
    run_chunks(m4, &s4, ids, N_PROMPT, 7, c);
    ck_assert_msg(memcmp(a, c, V * sizeof *a) == 0, "1 vs 4 threads differ (rel L2 %g)",
                  t_rel_l2(c, a, V));
    /* whole chunks: big enough batches for the pool to take part */
    kl_token lids[N_LONG];
    prompt_n(lids, N_LONG, m->cfg.vocab_size);
    run_chunks(m, &s, lids, N_LONG, 0, a);
    run_chunks(m4, &s4, lids, N_LONG, 0, c);
    ck_assert_msg(memcmp(a, c, V * sizeof *a) == 0, "%d tokens: 1 vs 4 threads differ (rel L2 %g)",
                  N_LONG, t_rel_l2(c, a, V));
    kl_state_free(&s);
    kl_state_free(&s4);
    kl_free(a);
    kl_free(b);
    kl_free(c);
    kl_model_close(m);
    kl_model_close(m4);
}
END_TEST

START_TEST(both_route_weight_modes_run_and_differ)
{
    const char *dirs[2] = {g_bf16, g_mxfp4};
    for (int k = 0; k < 2; k++) {
        kl_model *m = open_model(dirs[k], 2);
        size_t V = m->cfg.vocab_size;
        kl_token ids[N_PROMPT];
        prompt(ids, m->cfg.vocab_size);
        float *u = kl_malloc(V * sizeof *u), *b = kl_malloc(V * sizeof *b);
        kl_state s;
        ck_assert(kl_state_init(&s, m, NULL) == 0);
        m->route_weights = KL_ROUTE_UNBIASED;
        run_chunks(m, &s, ids, N_PROMPT, 0, u);
        m->route_weights = KL_ROUTE_BIASED;
        run_chunks(m, &s, ids, N_PROMPT, 0, b);
        check_sane(u, V, dirs[k]);
        check_sane(b, V, dirs[k]);
        double e = t_rel_l2(b, u, V);
        ck_assert_msg(e > 0.0, "%s: biased and unbiased routing give identical logits", dirs[k]);
        kl_state_free(&s);
        kl_free(u);
        kl_free(b);
        kl_model_close(m);
    }
}
END_TEST

START_TEST(mxfp4_model_binds_experts_packed)
{
    kl_model *m = open_model(g_mxfp4, 2);
    ck_assert_msg(m->cfg.family == KL_FAMILY_KIMI_LINEAR_MXFP4, "family: expected mxfp4, got %s",
                  kl_family_name(m->cfg.family));
    int seen = 0;
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        const kl_layer *L = &m->layers[l];
        if (!L->moe)
            continue;
        for (uint32_t e = 0; e < m->cfg.num_experts; e++)
            for (int k = 0; k < 3; k++) {
                const kl_wmat *w = &L->experts[k][e];
                ck_assert_msg(w->kind == KL_W_MXFP4 && w->packed && w->scale,
                              "layer %u expert %u w%d: not bound as MXFP4", l, e, k + 1);
                seen++;
            }
    }
    ck_assert_msg(seen > 0, "no MoE layer in the tiny preset");
    kl_model_close(m);
}
END_TEST

START_TEST(token_id_outside_vocabulary_is_refused)
{
    kl_model *m = open_model(g_bf16, 1);
    kl_state s;
    ck_assert(kl_state_init(&s, m, NULL) == 0);
    kl_token bad[2] = {5, (kl_token)m->cfg.vocab_size};
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_forward(m, &s, bad, 2, NULL, &err);
    ck_assert_msg(rc == KL_E_USAGE, "expected KL_E_USAGE, got %d", rc);
    ck_assert_msg(s.pos == 0, "state advanced on a refused call: pos %zu", s.pos);
    kl_state_free(&s);
    kl_model_close(m);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *forward_suite(void)
{
    Suite *s = suite_create("forward");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_unchecked_fixture(tc, setup_ckpts, teardown_ckpts);
    tcase_add_test(tc, bf16_any_prompt_split_gives_identical_logits);
    tcase_add_test(tc, mxfp4_any_prompt_split_gives_identical_logits);
    tcase_add_test(tc, attention_over_several_cache_blocks_matches_token_by_token);
    tcase_add_test(tc, resumed_state_gives_identical_logits);
    tcase_add_test(tc, scalar_kernels_agree_with_avx2);
    tcase_add_test(tc, state_reset_reproduces_logits_and_thread_count_does_not_matter);
    tcase_add_test(tc, both_route_weight_modes_run_and_differ);
    tcase_add_test(tc, mxfp4_model_binds_experts_packed);
    tcase_add_test(tc, token_id_outside_vocabulary_is_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(forward_suite());
}
