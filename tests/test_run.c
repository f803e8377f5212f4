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
#include "cli/cli.h"
#include "common/err.h"
#include "common/mem.h"
#include "synth/synth.h"
#include "engine/sampler.h"
#include "tests/testutil.h"

#include <cJSON.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* kl_sampler_sample_best with the argmax given equals kl_sampler_sample: the same ids and the
 * same stream after (greedy, top_k 1, and sampling, which takes the full path), and the same
 * refusal of a row that is all NaN. */
START_TEST(sampler_sample_best_equals_sample)
{
    float l[VOCAB];
    kl_sampler_opts opts[] = {{0}, {.temperature = 1.5f, .top_k = 1, .seed = 3},
                              {.temperature = 1.0f, .top_p = 0.9f, .seed = 7}};
    for (size_t c = 0; c < sizeof opts / sizeof opts[0]; c++) {
        kl_sampler a, b;
        ck_assert_int_eq(kl_sampler_init(&a, VOCAB, &opts[c], NULL), 0);
        ck_assert_int_eq(kl_sampler_init(&b, VOCAB, &opts[c], NULL), 0);
        for (uint64_t t = 0; t < 20; t++) {
            fill_logits(l, VOCAB, t);
            if (t % 5 == 1)
                l[t % VOCAB] = NAN;
            uint32_t x = 99, y = 98;
            ck_assert_int_eq(kl_sampler_sample(&a, l, &x, NULL), 0);
            ck_assert_int_eq(kl_sampler_sample_best(&b, l, kl_sample_argmax(l, VOCAB), &y, NULL),
                             0);
            ck_assert_msg(x == y, "options %zu, logits %u: %u against %u", c, (unsigned)t,
                          (unsigned)x, (unsigned)y);
        }
        for (uint32_t i = 0; i < VOCAB; i++)
            l[i] = NAN;
        uint32_t id;
        kl_err err;
        ck_assert_int_eq(kl_sampler_sample_best(&b, l, 0, &id, &err), KL_E_USAGE);
        kl_sampler_free(&a);
        kl_sampler_free(&b);
    }
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

/* The sampler's steps written plainly (sampler.h), libm's exp and a whole qsort: the sampler
 * (own exp, a histogram to sort only what top-k or top-p needs) must pick the same ids. */
typedef struct ref_cand {
    float    z;
    uint32_t id;
    double   p;
} ref_cand;

static int ref_cmp(const void *a, const void *b)
{
    const ref_cand *x = a, *y = b;
    if (x->z != y->z)
        return x->z > y->z ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Without top-k and top-p: p per id, the sums by chunks of 4,096 ids (sampler.h, step 6). */
static uint32_t ref_pick_plain(const float *l, uint32_t V, const kl_sampler_opts *o, double u,
                               float z_max)
{
    enum { CH = 4096 };
    double *p = malloc(V * sizeof *p), sums[64] = {0}, total = 0, before = 0;
    for (uint32_t i = 0; i < V; i++) {
        p[i] = isnan(l[i]) ? 0 : exp((double)(l[i] / o->temperature) - (double)z_max);
        p[i] = p[i] >= (double)o->min_p ? p[i] : 0;
        sums[i / CH] += p[i];
    }
    const uint32_t chunks = (V + CH - 1) / CH;
    for (uint32_t c = 0; c < chunks; c++)
        total += sums[c];
    uint32_t id = V;
    for (uint32_t c = 0; c < chunks && id == V; c++) {
        const double t = u * total - before;
        double acc = 0;
        for (uint32_t i = c * CH; t < sums[c] && i < V && i < (c + 1) * CH; i++) {
            acc += p[i];
            if (t < acc) {
                id = i;
                break;
            }
        }
        before += sums[c];
    }
    if (id == V) { /* rounding left u past every chunk: the last id with p > 0 */
        id = 0;
        for (uint32_t i = 0; i < V; i++)
            if (p[i] > 0)
                id = i;
    }
    free(p);
    return id;
}

static uint32_t ref_pick(const float *l, uint32_t V, const kl_sampler_opts *o, double u)
{
    if (o->top_p >= 1 && (o->top_k == 0 || o->top_k >= V))
        return ref_pick_plain(l, V, o, u, l[kl_sample_argmax(l, V)] / o->temperature);
    ref_cand *c = malloc(V * sizeof *c);
    size_t n = 0;
    uint32_t best = kl_sample_argmax(l, V);
    for (uint32_t i = 0; i < V; i++)
        if (!isnan(l[i]))
            c[n++] = (ref_cand){l[i] / o->temperature, i, 0};
    const float z_max = l[best] / o->temperature;
    const int sorted = o->top_k > 0 && o->top_k < n, need_sort = sorted || o->top_p < 1;
    if (need_sort)   /* the sums below stay in the order the sampler sums them */
        qsort(c, n, sizeof *c, ref_cmp);
    if (sorted)
        n = o->top_k;
    double total = 0, acc = 0;
    for (size_t i = 0; i < n; i++)
        c[i].p = exp((double)c[i].z - (double)z_max);
    if (sorted || o->top_p >= 1) {
        for (size_t i = 0; i < n; i++)
            total += c[i].p;
    } else {   /* the mass of every candidate, summed in id order */
        for (uint32_t i = 0; i < V; i++)
            if (!isnan(l[i]))
                total += exp((double)(l[i] / o->temperature) - (double)z_max);
    }
    if (o->top_p < 1) {
        size_t keep = 0;
        while (keep < n) {
            acc += c[keep++].p;
            if (acc >= (double)o->top_p * total)
                break;
        }
        n = keep;
        total = acc;
    }
    if (o->min_p > 0) {
        size_t k = 0;
        total = 0;
        for (size_t i = 0; i < n; i++)
            if (c[i].p >= (double)o->min_p) {
                c[k++] = c[i];
                total += c[i].p;
            }
        n = k;
    }
    uint32_t id = c[n - 1].id;
    acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += c[i].p;
        if (u * total < acc) {
            id = c[i].id;
            break;
        }
    }
    free(c);
    return id;
}

START_TEST(sampler_equals_its_steps_written_plainly)
{
    enum { V = 2000 };
    static float l[V];
    fill_logits(l, V, 11);
    for (uint32_t i = 0; i < V; i++)   /* a wider spread, some NaN and -inf */
        l[i] = i % 97 == 5 ? NAN : i % 89 == 7 ? -INFINITY : 4.0f * l[i] * l[i] * l[i];
    for (uint32_t i = 100; i < 160; i++)   /* ties: the sorted order puts them in id order */
        l[i] = i % 3 ? 1.5f : i % 2 ? -0.0f : 0.0f;
    const float temps[] = {0.7f, 1.3f}, top_ps[] = {1.0f, 0.9f, 0.5f, 0.05f};
    const uint32_t top_ks[] = {0, 2, 7, 300, 1900, 2500};
    const float min_ps[] = {0.0f, 0.05f};
    size_t cases = 0;
    for (size_t a = 0; a < 2; a++)
        for (size_t b = 0; b < 4; b++)
            for (size_t k = 0; k < 6; k++)
                for (size_t m = 0; m < 2; m++) {
                    kl_sampler_opts o = {.temperature = temps[a], .top_p = top_ps[b],
                                         .top_k = top_ks[k], .min_p = min_ps[m]};
                    kl_sampler s;
                    ck_assert_int_eq(kl_sampler_init(&s, V, &o, NULL), 0);
                    for (int d = 0; d < 16; d++) {
                        const double u = (d + 0.37) / 16.0;
                        uint32_t id, want = ref_pick(l, V, &o, u);
                        ck_assert_int_eq(kl_sampler_pick(&s, l, u, &id, NULL), 0);
                        ck_assert_msg(id == want, "T %g top-p %g top-k %u min-p %g u %g: id %u, "
                                      "the plain steps give %u", (double)o.temperature,
                                      (double)o.top_p, (unsigned)o.top_k, (double)o.min_p, u,
                                      (unsigned)id, (unsigned)want);
                        cases++;
                    }
                    kl_sampler_free(&s);
                }
    ck_assert_uint_eq(cases, 2 * 4 * 6 * 2 * 16);
}
END_TEST

/* draws picks of o from l[V] at u = (d + shift) / draws: the same id alone, on the pool and
 * by the plain steps; returns the largest id picked. */
static uint32_t picks_agree(const float *l, uint32_t V, const kl_sampler_opts *o, kl_pool *pool,
                            int draws, double shift)
{
    kl_sampler a, b;
    ck_assert_int_eq(kl_sampler_init(&a, V, o, NULL), 0);
    ck_assert_int_eq(kl_sampler_init(&b, V, o, NULL), 0);
    kl_sampler_set_pool(&b, pool);
    uint32_t most = 0;
    for (int d = 0; d < draws; d++) {
        const double u = (d + shift) / draws;
        uint32_t x, y, want = ref_pick(l, V, o, u);
        ck_assert_int_eq(kl_sampler_pick(&a, l, u, &x, NULL), 0);
        ck_assert_int_eq(kl_sampler_pick(&b, l, u, &y, NULL), 0);
        ck_assert_msg(x == want && y == want, "T %g top-p %g top-k %u min-p %g u %g: %u alone, "
                      "%u on the pool, the plain steps give %u", (double)o->temperature,
                      (double)o->top_p, (unsigned)o->top_k, (double)o->min_p, u, (unsigned)x,
                      (unsigned)y, (unsigned)want);
        most = x > most ? x : most;
    }
    kl_sampler_free(&a);
    kl_sampler_free(&b);
    return most;
}

/* The plain distribution over several chunks of 4,096 ids: the same ids as the plain steps,
 * with a pool of 3 threads and without. */
START_TEST(sampler_plain_chunks_with_and_without_a_pool)
{
    enum { V = 10000 };
    static float l[V];
    fill_logits(l, V, 13);
    for (uint32_t i = 0; i < V; i++)
        l[i] = i % 101 == 3 ? NAN : i % 103 == 9 ? -INFINITY : 3.0f * l[i];
    kl_pool *pool;
    ck_assert_int_eq(kl_pool_create(&pool, 3, NULL), 0);
    const kl_sampler_opts opts[] = {{.temperature = 0.8f, .top_p = 1},
                                    {.temperature = 1.5f, .top_p = 1, .min_p = 0.02f},
                                    {.temperature = 1.0f, .top_p = 1, .top_k = V}};
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
        ck_assert_msg(picks_agree(l, V, &opts[k], pool, 48, 0.41) >= 2 * 4096,
                      "options %zu: no pick in the third chunk", k);
    kl_pool_destroy(pool);
}
END_TEST

/* Top-p and top-k over a large nucleus (past the size at which the sort runs in parts, the
 * candidates made by chunks of 4,096 ids with NaN left out and moved together): the same ids
 * alone, on a pool of 3 threads and by the plain steps. */
START_TEST(sampler_large_nucleus_with_and_without_a_pool)
{
    enum { V = 40000 };
    static float l[V];
    fill_logits(l, V, 17);
    for (uint32_t i = 0; i < V; i++)   /* flat: most ids in the nucleus; ties; NaN; -inf */
        l[i] = i % 97 == 5 ? NAN : i % 89 == 7 ? -INFINITY : i % 7 == 0 ? 0.25f : 0.5f * l[i];
    kl_pool *pool;
    ck_assert_int_eq(kl_pool_create(&pool, 3, NULL), 0);
    const kl_sampler_opts opts[] = {{.temperature = 1.0f, .top_p = 0.95f},
                                    {.temperature = 0.7f, .top_p = 0.5f, .min_p = 0.5f},
                                    {.temperature = 1.2f, .top_p = 0.9f, .top_k = 30000}};
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
        picks_agree(l, V, &opts[k], pool, 24, 0.29);
    kl_pool_destroy(pool);
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
    ck_assert_msg(strstr(err, "without GPU support") != NULL, "stderr: %s", err);
    free(err);
}
END_TEST

/* --tp 2 --device cpu, and with --expert-parallel: the forced rows within relative L2 1e-5 of
 * --tp 1's; --tp 3 (not a size the model splits into) and --tp 2 without a --device exit 2
 * saying why. */
START_TEST(run_tp_matches_tp1_and_bad_sizes_exit_2)
{
    char args[1024], p1[700], p2[700], path[700];
    snprintf(p1, sizeof p1, "%s/tp1.bin", g_root);
    snprintf(p2, sizeof p2, "%s/tp2.bin", g_root);
    snprintf(args, sizeof args, "--ids 1,2,3 --force-ids 4,5,6 --logits-out '%s'", p1);
    ck_assert_int_eq(kl_run(args), 0);
    for (int ep = 0; ep < 2; ep++) {
        snprintf(args, sizeof args, "--ids 1,2,3 --force-ids 4,5,6 --logits-out '%s' --tp 2 "
                 "--device cpu%s", p2, ep ? " --expert-parallel" : "");
        ck_assert_int_eq(kl_run(args), 0);
        size_t n1, n2;
        float *a = read_logits(p1, &n1), *b = read_logits(p2, &n2);
        ck_assert_uint_eq(n1, 4 * VOCAB);
        ck_assert_uint_eq(n2, n1);
        for (size_t r = 0; r < 4; r++) {
            double e = t_rel_l2(b + r * VOCAB, a + r * VOCAB, VOCAB);
            ck_assert_msg(e <= 1e-5, "row %zu: --tp 2 (ep %d) vs --tp 1 relative L2 %.3g", r,
                          ep, e);
        }
        free(a);
        free(b);
    }
    snprintf(path, sizeof path, "%s/err", g_root);
    const char *bad[2][2] = {
        {"--ids 1,2 --force-ids 5 --logits-out '%s' --tp 3 --device cpu", "valid sizes: 1, 2"},
        {"--ids 1,2 --force-ids 5 --logits-out '%s' --tp 2", "--device cpu"},
    };
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, bad[i][0], p2);
        ck_assert_int_eq(kl_run(args), 2);
        char *err = t_slurp(path, NULL);
        ck_assert_msg(strstr(err, bad[i][1]) != NULL, "%s: stderr %s", args, err);
        free(err);
    }
}
END_TEST

/* Runs a shell command line (stdout/stderr into g_root/out, g_root/err); exit status. */
static int sh(const char *cmdline)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s > '%s/out' 2> '%s/err'", cmdline, g_root, g_root);
    int st = system(cmd);
    ck_assert_msg(st != -1 && WIFEXITED(st), "`%s` did not exit normally", cmd);
    return WEXITSTATUS(st);
}

static char *slurp_err(void)
{
    char path[700];
    snprintf(path, sizeof path, "%s/err", g_root);
    return t_slurp(path, NULL);
}

/* Number of entries of dir whose name contains part. */
static int count_named(const char *dir, const char *part)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c -F -e '%s'", dir, part);
    FILE *p = popen(cmd, "r");
    ck_assert(p != NULL);
    int n = -1;
    ck_assert(fscanf(p, "%d", &n) == 1);
    pclose(p);
    return n;
}

START_TEST(run_logits_out_inside_the_model_is_refused_and_the_file_kept)
{
    char cfg[700], args[2048], alias[700];
    snprintf(cfg, sizeof cfg, "%s/config.json", g_model);
    size_t n0;
    char *before = t_slurp(cfg, &n0);
    /* the case, then the same directory through a symlink and through ".." */
    snprintf(alias, sizeof alias, "%s/alias", g_root);
    ck_assert(symlink(g_model, alias) == 0);
    const char *targets[] = {"%s/config.json", "%s/../tiny/new.bin", "%s/../alias/new.bin"};
    for (size_t i = 0; i < 3; i++) {
        char target[800];
        snprintf(target, sizeof target, targets[i], g_model);
        snprintf(args, sizeof args, "--ids 1,2 --force-ids 5 --logits-out '%s'", target);
        int rc = kl_run(args);
        char *err = slurp_err();
        ck_assert_msg(rc == 2 && strstr(err, "inside the model directory"),
                      "--logits-out %s: expected exit 2 and a refusal, got %d: %s", target, rc,
                      err);
        free(err);
    }
    size_t n1;
    char *after = t_slurp(cfg, &n1);
    ck_assert_msg(n0 == n1 && !memcmp(before, after, n0), "config.json changed (%zu -> %zu bytes)",
                  n0, n1);
    ck_assert_msg(count_named(g_model, "new.bin") == 0 && count_named(g_model, ".config") == 0,
                  "something was created in the model directory");
    /* a symlink outside the model that points into it is refused too */
    char link[700];
    snprintf(link, sizeof link, "%s/link.bin", g_root);
    ck_assert(symlink(cfg, link) == 0);
    snprintf(args, sizeof args, "--ids 1,2 --force-ids 5 --logits-out '%s'", link);
    ck_assert_int_eq(kl_run(args), 2);
    free(before);
    free(after);
    after = t_slurp(cfg, &n1);
    ck_assert_msg(n0 == n1, "config.json changed through a symlink");
    free(after);
    unlink(link);
    unlink(alias);
}
END_TEST

START_TEST(run_logits_out_failed_write_leaves_no_file)
{
    char dir[700], target[800], cmd[4096];
    snprintf(dir, sizeof dir, "%s/outdir", g_root);
    ck_assert(mkdir(dir, 0755) == 0);
    snprintf(target, sizeof target, "%s/logits.bin", dir);
    /* a file limit of 1 KiB (with SIGXFSZ ignored, writes fail with EFBIG): no file at all */
    snprintf(cmd, sizeof cmd, "trap '' XFSZ; ulimit -f 2; exec '%s' run '%s' --ids 1,2 "
             "--force-ids 5,6 --logits-out '%s'", g_kl, g_model, target);
    int rc = sh(cmd);
    char *err = slurp_err();
    ck_assert_msg(rc == 2, "write past the file limit: expected exit 2, got %d: %s", rc, err);
    free(err);
    ck_assert_msg(count_named(dir, "logits") == 0, "a logits file (or its temporary) was left");
    /* an older file at the path is left as it was */
    t_write(target, "old", 3);
    rc = sh(cmd);
    ck_assert_int_eq(rc, 2);
    size_t n;
    char *kept = t_slurp(target, &n);
    ck_assert_msg(n == 3 && !memcmp(kept, "old", 3), "the old file was changed (%zu bytes)", n);
    free(kept);
    ck_assert_msg(count_named(dir, "logits") == 1, "a temporary file was left");
    /* not a regular file: refused before anything */
    ck_assert_int_eq(kl_run("--ids 1,2 --force-ids 5 --logits-out /dev/full"), 2);
    snprintf(cmd, sizeof cmd, "--ids 1 --force-ids 5 --logits-out '%s'", dir);
    ck_assert_int_eq(kl_run(cmd), 2);
    /* and a good run replaces it whole */
    snprintf(cmd, sizeof cmd, "--ids 1,2 --force-ids 5 --logits-out '%s'", target);
    ck_assert_int_eq(kl_run(cmd), 0);
    float *l = read_logits(target, &n);
    ck_assert_msg(n == 2 * VOCAB, "expected 2 rows, got %zu floats", n);
    free(l);
}
END_TEST

START_TEST(run_and_detokenize_id_lists_are_strict)
{
    const char *bad[] = {"1,,2", "1,2,", ",1", "", " ", "1 2", "1;2", "+1", "-1", "1,a", ","};
    char args[1024], cmd[2048];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "--ids '%s' -n 1", bad[i]);
        int rc = kl_run(args);
        ck_assert_msg(rc == 2, "run --ids '%s': expected exit 2, got %d", bad[i], rc);
        snprintf(args, sizeof args, "--ids 1 --force-ids '%s' --logits-out '%s/x.bin'", bad[i],
                 g_root);
        rc = kl_run(args);
        ck_assert_msg(rc == 2, "run --force-ids '%s': expected exit 2, got %d", bad[i], rc);
        snprintf(cmd, sizeof cmd, "'%s' detokenize '%s' --ids '%s'", g_kl, g_model, bad[i]);
        rc = sh(cmd);
        ck_assert_msg(rc == 2, "detokenize --ids '%s': expected exit 2, got %d", bad[i], rc);
    }
    ck_assert_int_eq(kl_run("--ids ' 1, 2 ,3 ' -n 1"), 0);
    snprintf(cmd, sizeof cmd, "'%s' detokenize '%s' --ids '72, 101'", g_kl, g_model);
    ck_assert_int_eq(sh(cmd), 0);
    /* the parser itself */
    uint32_t *ids = NULL;
    size_t n = 0;
    ck_assert_int_eq(kl_cli_parse_ids("7, 8,9", 100, &ids, &n), 0);
    ck_assert_msg(n == 3 && ids[0] == 7 && ids[1] == 8 && ids[2] == 9, "7, 8,9 -> %zu ids", n);
    kl_free(ids);
    ck_assert_int_eq(kl_cli_parse_ids("101", 100, &ids, &n), -1);
    ck_assert_int_eq(kl_cli_parse_ids("4294967296", UINT64_MAX, &ids, &n), -1);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(kl_cli_parse_ids(bad[i], 100, &ids, &n) == -1, "'%s' was accepted", bad[i]);
}
END_TEST

/* A copy of the model whose config says its context is 8 tokens; its path into out. */
static void short_context_model(char *out, size_t n)
{
    snprintf(out, n, "%s/short", g_root);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s' && sed -i "
             "'s/\"model_max_length\": *[0-9]*/\"model_max_length\": 8/' '%s/config.json' && "
             "grep -q '\"model_max_length\": 8' '%s/config.json'", out, g_model, out, out, out);
    ck_assert_msg(system(cmd) == 0, "cannot make %s", out);
}

START_TEST(run_over_the_context_is_refused_before_loading)
{
    char model[700], cmd[2048];
    short_context_model(model, sizeof model);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --ids 1,2,3 -n 6", g_kl, model);
    int rc = sh(cmd);
    char *err = slurp_err();
    ck_assert_msg(rc == 2 && strstr(err, "3 tokens") && strstr(err, "6 to generate") &&
                      strstr(err, "8 tokens") && !strstr(err, "loaded"),
                  "3 + 6 > 8: expected exit 2 naming 3, 6 and 8 before loading, got %d: %s", rc,
                  err);
    free(err);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --ids 1,2,3 --force-ids 1,2,3,4,5,6 "
             "--logits-out '%s/l.bin'", g_kl, model, g_root);
    ck_assert_int_eq(sh(cmd), 2);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --ids 1,2,3 -n 5", g_kl, model);
    ck_assert_int_eq(sh(cmd), 0);
}
END_TEST

START_TEST(run_memory_check_refuses_with_the_numbers_and_the_flag_overrides)
{
    char mi[700], cmd[2048];
    snprintf(mi, sizeof mi, "%s/meminfo", g_root);
    const char *text = "MemTotal: 4 kB\nMemAvailable: 1 kB\n";
    t_write(mi, text, strlen(text));
    snprintf(cmd, sizeof cmd, "KL_MEMINFO='%s' '%s' run '%s' --ids 1,2 -n 1", mi, g_kl, g_model);
    int rc = sh(cmd);
    char *err = slurp_err();
    ck_assert_msg(rc == 2 && strstr(err, "available") && strstr(err, "1024 bytes") &&
                      !strstr(err, "loaded"),
                  "1 kB available: expected exit 2 with the figures before loading, got %d: %s",
                  rc, err);
    free(err);
    snprintf(cmd, sizeof cmd, "KL_MEMINFO='%s' '%s' run '%s' --ids 1,2 -n 1 --json "
             "--ignore-memory-check", mi, g_kl, g_model);
    ck_assert_int_eq(sh(cmd), 0);
    char path[700];
    snprintf(path, sizeof path, "%s/out", g_root);
    char *out = t_slurp(path, NULL);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j && cJSON_IsNumber(cJSON_GetObjectItem(j, "load_s")) &&
                      cJSON_IsNumber(cJSON_GetObjectItem(j, "load_gbps")),
                  "JSON without load_s / load_gbps: %s", out);
    cJSON_Delete(j);
    free(out);
    err = slurp_err();
    ck_assert_msg(strstr(err, "loaded") && strstr(err, "GB/s"), "no load line: %s", err);
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
    tcase_add_test(tc, sampler_sample_best_equals_sample);
    tcase_add_test(tc, sampler_equal_seeds_give_equal_sequences);
    tcase_add_test(tc, sampler_min_p_never_returns_a_filtered_id);
    tcase_add_test(tc, sampler_top_p_keeps_the_smallest_nucleus);
    tcase_add_test(tc, sampler_bad_options_are_refused);
    tcase_add_test(tc, sampler_equals_its_steps_written_plainly);
    tcase_add_test(tc, sampler_plain_chunks_with_and_without_a_pool);
    tcase_add_test(tc, sampler_large_nucleus_with_and_without_a_pool);
    suite_add_tcase(s, tc);
    tc = tcase_create("cli");
    tcase_add_unchecked_fixture(tc, setup_model, teardown_model);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, run_ids_greedy_gives_n_ids_and_is_deterministic);
    tcase_add_test(tc, run_prompt_and_chat_generate_text);
    tcase_add_test(tc, run_force_ids_rows_match_direct_prefix_runs);
    tcase_add_test(tc, run_bad_flags_exit_2);
    tcase_add_test(tc, run_tp_matches_tp1_and_bad_sizes_exit_2);
    tcase_add_test(tc, run_logits_out_inside_the_model_is_refused_and_the_file_kept);
    tcase_add_test(tc, run_logits_out_failed_write_leaves_no_file);
    tcase_add_test(tc, run_and_detokenize_id_lists_are_strict);
    tcase_add_test(tc, run_over_the_context_is_refused_before_loading);
    tcase_add_test(tc, run_memory_check_refuses_with_the_numbers_and_the_flag_overrides);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(run_suite());
}
