/*
 * tests/test_run.c — engine/sampler and `kl run`.
 *
 * Sampler: greedy is the argmax, top-k 1 is greedy, equal seeds give equal sequences, min-p and
 * top-p never return a filtered id, bad options are refused.
 * CLI (through the binary in $KL_BIN, the ASan/UBSan build, on a tiny synthetic checkpoint):
 * greedy --ids generation gives -n ids and is deterministic; --force-ids writes exactly
 * (len+1) * vocab floats whose first row is the prompt-only run's logits and whose row i equals
 * a direct run of the prompt plus the first i forced ids; bad flags exit 2.
 */
#include "common/err.h"
#include "common/mem.h"
#include "synth/synth.h"
#include "engine/sampler.h"
#include "tests/testutil.h"

#include <cJSON.h>
#include <math.h>
#include <stdint.h>
#include <sys/wait.h>

#define VOCAB 1024u /* tiny preset */

static char g_root[512], g_model[600];
static const char *g_kl;

/* ------------------------------------------------------------------------------------------ */
/* Fixture and helpers                                                                         */

static void setup_model(void)
{
    g_kl = getenv("KL_BIN");
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_model, sizeof g_model, "%s/tiny", g_root);
    t_synth_tiny(g_model, 11);
}

static void teardown_model(void)
{
    if (g_root[0])
        t_rmrf(g_root);
}

/* Runs `$KL_BIN run MODEL args`, stdout into g_root/out, stderr into g_root/err; exit status. */
static int kl_run(const char *args)
{
    ck_assert_msg(g_kl && *g_kl, "KL_BIN must name the kl binary under test");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' run '%s' %s > '%s/out' 2> '%s/err'", g_kl, g_model, args,
             g_root, g_root);
    int st = system(cmd);
    ck_assert_msg(st != -1 && WIFEXITED(st), "`%s` did not exit normally", cmd);
    return WEXITSTATUS(st);
}

/* Logits file as floats (little-endian on disk, decoded explicitly); *n floats. */
static float *read_logits(const char *path, size_t *n)
{
    size_t len;
    unsigned char *b = (unsigned char *)t_slurp(path, &len);
    ck_assert_msg(len % 4 == 0, "%s: %zu bytes is not a whole number of floats", path, len);
    float *f = malloc(len + 4);
    for (size_t i = 0; i < len / 4; i++) {
        uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
                     (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
        memcpy(&f[i], &u, 4);
    }
    free(b);
    *n = len / 4;
    return f;
}

/* generated_ids of the JSON on g_root/out into ids (at most cap); returns the count. */
static size_t json_ids(uint32_t *ids, size_t cap)
{
    char path[700];
    snprintf(path, sizeof path, "%s/out", g_root);
    char *s = t_slurp(path, NULL);
    cJSON *j = cJSON_Parse(s);
    ck_assert_msg(j != NULL, "stdout is not JSON: %s", s);
    ck_assert_msg(cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")), "ok is not true: %s", s);
    const char *keys[] = {"kl_version", "command", "prompt_tokens", "text",
                          "prefill_s",  "decode_s", "decode_tok_s"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        ck_assert_msg(cJSON_GetObjectItem(j, keys[k]) != NULL, "key %s missing: %s", keys[k], s);
    cJSON *arr = cJSON_GetObjectItem(j, "generated_ids");
    ck_assert_msg(cJSON_IsArray(arr), "generated_ids missing: %s", s);
    size_t n = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        ck_assert(n < cap);
        ids[n++] = (uint32_t)it->valuedouble;
    }
    cJSON_Delete(j);
    free(s);
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* Sampler                                                                                     */

static void fill_logits(float *l, uint32_t n, uint64_t seed)
{
    kl_rng r;
    kl_rng_seed(&r, seed, 1);
    for (uint32_t i = 0; i < n; i++)
        l[i] = (float)(4.0 * kl_rng_uniform(&r) - 2.0);
}

START_TEST(sampler_greedy_is_the_argmax_lowest_id_on_ties)
{
    float l[8] = {0.5f, 3.0f, NAN, 3.0f, -1.0f, 2.0f, -INFINITY, 0.0f};
    kl_sampler s;
    kl_sampler_opts o = {0};
    ck_assert_int_eq(kl_sampler_init(&s, 8, &o, NULL), 0);
    for (int k = 0; k < 10; k++) {
        uint32_t id = 99;
        ck_assert_int_eq(kl_sampler_sample(&s, l, &id, NULL), 0);
        ck_assert_msg(id == 1, "greedy: expected id 1, got %u", (unsigned)id);
    }
    ck_assert_uint_eq(kl_sample_argmax(l, 8), 1);
    kl_sampler_free(&s);
}
END_TEST

START_TEST(sampler_top_k_1_equals_greedy_at_any_temperature)
{
    float l[VOCAB];
    kl_sampler s;
    kl_sampler_opts o = {.temperature = 1.5f, .top_k = 1, .seed = 3};
    ck_assert_int_eq(kl_sampler_init(&s, VOCAB, &o, NULL), 0);
    for (uint64_t t = 0; t < 20; t++) {
        fill_logits(l, VOCAB, t);
        uint32_t id, want = kl_sample_argmax(l, VOCAB);
        ck_assert_int_eq(kl_sampler_sample(&s, l, &id, NULL), 0);
        ck_assert_msg(id == want, "logits %u: expected argmax %u, got %u", (unsigned)t,
                      (unsigned)want, (unsigned)id);
    }
    kl_sampler_free(&s);
}
END_TEST

START_TEST(sampler_equal_seeds_give_equal_sequences)
{
    float l[VOCAB];
    fill_logits(l, VOCAB, 5);
    kl_sampler a, b, c;
    kl_sampler_opts o = {.temperature = 1.0f, .top_k = 50, .top_p = 0.95f, .seed = 42};
    ck_assert_int_eq(kl_sampler_init(&a, VOCAB, &o, NULL), 0);
    ck_assert_int_eq(kl_sampler_init(&b, VOCAB, &o, NULL), 0);
    o.seed = 43;
    ck_assert_int_eq(kl_sampler_init(&c, VOCAB, &o, NULL), 0);
    int differ = 0;
    for (int k = 0; k < 64; k++) {
        uint32_t x, y, z;
        ck_assert_int_eq(kl_sampler_sample(&a, l, &x, NULL), 0);
        ck_assert_int_eq(kl_sampler_sample(&b, l, &y, NULL), 0);
        ck_assert_int_eq(kl_sampler_sample(&c, l, &z, NULL), 0);
        ck_assert_msg(x == y, "draw %d: seed 42 gave %u and %u", k, (unsigned)x, (unsigned)y);
        differ |= x != z;
    }
    ck_assert_msg(differ, "seeds 42 and 43 gave the same 64 ids");
    kl_sampler_free(&a);
    kl_sampler_free(&b);
    kl_sampler_free(&c);
}
END_TEST

START_TEST(sampler_min_p_never_returns_a_filtered_id)
{
    /* p ∝ e^l at T = 1: ids 0..2 have p / p_max = 1, e^-0.5, e^-1; the rest e^-5 and below */
    float l[6] = {5.0f, 4.5f, 4.0f, 0.0f, -1.0f, -3.0f};
    kl_sampler s;
    kl_sampler_opts o = {.temperature = 1.0f, .min_p = 0.3f};
    ck_assert_int_eq(kl_sampler_init(&s, 6, &o, NULL), 0);
    int seen[6] = {0};
    for (int k = 0; k < 1000; k++) {
        uint32_t id;
        double u = (k + 0.5) / 1000.0;
        ck_assert_int_eq(kl_sampler_pick(&s, l, u, &id, NULL), 0);
        ck_assert_msg(id <= 2, "min-p 0.3, u %g: id %u has p/p_max < 0.3", u, (unsigned)id);
        seen[id]++;
    }
    ck_assert_msg(seen[0] && seen[1] && seen[2], "kept ids not all drawn: %d %d %d", seen[0],
                  seen[1], seen[2]);
    kl_sampler_free(&s);
}
END_TEST

START_TEST(sampler_top_p_keeps_the_smallest_nucleus)
{
    /* probabilities about 0.64, 0.24, 0.09, 0.03: top-p 0.8 keeps ids 0 and 1 only */
    float l[4] = {3.0f, 2.0f, 1.0f, 0.0f};
    kl_sampler s;
    kl_sampler_opts o = {.temperature = 1.0f, .top_p = 0.8f};
    ck_assert_int_eq(kl_sampler_init(&s, 4, &o, NULL), 0);
    for (int k = 0; k < 1000; k++) {
        uint32_t id;
        double u = (k + 0.5) / 1000.0;
        ck_assert_int_eq(kl_sampler_pick(&s, l, u, &id, NULL), 0);
        ck_assert_msg(id <= 1, "top-p 0.8, u %g: got id %u outside the nucleus", u,
                      (unsigned)id);
    }
    kl_sampler_free(&s);
}
END_TEST

START_TEST(sampler_bad_options_are_refused)
{
    kl_sampler s;
    kl_sampler_opts bad[] = {
        {.temperature = -1.0f}, {.temperature = INFINITY}, {.top_p = 1.5f},
        {.top_p = -0.1f},       {.min_p = 1.1f},           {.min_p = -0.5f},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kl_err err;
        kl_err_clear(&err);
        int rc = kl_sampler_init(&s, 16, &bad[i], &err);
        ck_assert_msg(rc == KL_E_USAGE, "case %zu: expected KL_E_USAGE, got %d", i, rc);
        kl_sampler_free(&s);
    }
    ck_assert_int_eq(kl_sampler_init(&s, 0, NULL, NULL), KL_E_USAGE);
    kl_sampler_free(&s);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* kl run                                                                                      */

START_TEST(run_ids_greedy_gives_n_ids_and_is_deterministic)
{
    uint32_t a[16], b[16];
    ck_assert_int_eq(kl_run("--ids 1,2,3 -n 5 --json --threads 2"), 0);
    size_t na = json_ids(a, 16);
    ck_assert_int_eq(kl_run("--ids 1,2,3 -n 5 --json --threads 1"), 0);
    size_t nb = json_ids(b, 16);
    ck_assert_msg(na == 5 && nb == 5, "expected 5 ids, got %zu and %zu", na, nb);
    for (size_t i = 0; i < 5; i++)
        ck_assert_msg(a[i] == b[i] && a[i] < VOCAB, "id %zu: %u vs %u", i, (unsigned)a[i],
                      (unsigned)b[i]);
}
END_TEST

START_TEST(run_prompt_and_chat_generate_text)
{
    ck_assert_int_eq(kl_run("-p 'hello world' -n 3"), 0);
    ck_assert_int_eq(kl_run("--chat 'hi there' -n 3 --temp 0.7 --top-k 40 --top-p 0.9 "
                            "--min-p 0.05 --seed 9 --route-weights biased --device auto"),
                     0);
}
END_TEST

START_TEST(run_force_ids_rows_match_direct_prefix_runs)
{
    char args[1024], path[700], path0[700];
    snprintf(path, sizeof path, "%s/forced.bin", g_root);
    snprintf(path0, sizeof path0, "%s/direct.bin", g_root);
    snprintf(args, sizeof args, "--ids 1,2,3 --force-ids 4,5,6 --logits-out '%s' --json", path);
    ck_assert_int_eq(kl_run(args), 0);
    size_t n;
    float *forced = read_logits(path, &n);
    ck_assert_msg(n == 4 * VOCAB, "expected (3+1)*%u floats, got %zu", VOCAB, n);
    const char *prefixes[] = {"1,2,3", "1,2,3,4", "1,2,3,4,5", "1,2,3,4,5,6"};
    for (size_t r = 0; r < 4; r++) {
        snprintf(args, sizeof args, "--ids %s -n 0 --logits-out '%s'", prefixes[r], path0);
        ck_assert_int_eq(kl_run(args), 0);
        size_t m;
        float *direct = read_logits(path0, &m);
        ck_assert_msg(m == VOCAB, "prompt-only run: expected %u floats, got %zu", VOCAB, m);
        for (size_t i = 0; i < VOCAB; i++)
            ck_assert_msg(forced[r * VOCAB + i] == direct[i] && isfinite(direct[i]),
                          "row %zu (prefix %s), logit %zu: forced %.9g, direct %.9g", r,
                          prefixes[r], i, (double)forced[r * VOCAB + i], (double)direct[i]);
        free(direct);
    }
    free(forced);
}
END_TEST

START_TEST(run_bad_flags_exit_2)
{
    const char *cases[] = {
        "--ids 1 --bogus",
        "",
        "--ids 1 -p x",
        "--ids 1 --temp -1",
        "--ids 1 --top-p 0",
        "--ids 1 --top-p 1.5",
        "--ids 1 --min-p 2",
        "--ids 1 -n x",
        "--ids 1 --top-k -3",
        "--ids 1 --device gpu",
        "--ids 1 --device tpu",
        "--ids 1 --route-weights sideways",
        "--ids 1 --force-ids 2",
        "--ids a,b",
        "--ids 99999 -n 1",
        "--ids 1 --threads 0",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = kl_run(cases[i]);
        ck_assert_msg(rc == 2, "`kl run MODEL %s`: expected exit 2, got %d", cases[i], rc);
    }
    char path[700];
    snprintf(path, sizeof path, "%s/err", g_root);
    kl_run("--ids 1 --device gpu");
    char *err = t_slurp(path, NULL);
    ck_assert_msg(strstr(err, "GPU engine not built yet") != NULL, "stderr: %s", err);
    free(err);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *run_suite(void)
{
    Suite *s = suite_create("run");
    TCase *tc = tcase_create("sampler");
    tcase_add_test(tc, sampler_greedy_is_the_argmax_lowest_id_on_ties);
    tcase_add_test(tc, sampler_top_k_1_equals_greedy_at_any_temperature);
    tcase_add_test(tc, sampler_equal_seeds_give_equal_sequences);
    tcase_add_test(tc, sampler_min_p_never_returns_a_filtered_id);
    tcase_add_test(tc, sampler_top_p_keeps_the_smallest_nucleus);
    tcase_add_test(tc, sampler_bad_options_are_refused);
    suite_add_tcase(s, tc);
    tc = tcase_create("cli");
    tcase_add_unchecked_fixture(tc, setup_model, teardown_model);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, run_ids_greedy_gives_n_ids_and_is_deterministic);
    tcase_add_test(tc, run_prompt_and_chat_generate_text);
    tcase_add_test(tc, run_force_ids_rows_match_direct_prefix_runs);
    tcase_add_test(tc, run_bad_flags_exit_2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(run_suite());
}
