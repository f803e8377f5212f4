/*
 * tests/test_audit.c — `kl audit`'s options: --expect with sha256sum -c semantics (issue 9
 * defect 4), the TP sizes and context the memory plan accepts (defect 13), token-count
 * suffixes, the cache sizes shared with the engine (structure 3), and hash progress.
 *
 * One tiny checkpoint is synthesized with the kl binary under test ($KL_BIN); the library is
 * called directly where findings are checked, the binary where exit statuses are.
 */
#include "audit/audit.h"
#include "loader/tp_split.h"
#include "cli/cli.h"
#include "tests/testutil.h"

#include <cJSON.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char g_root[512];   /* scratch root */
static char g_base[1024];  /* clean synthesized checkpoint */
static char g_sums[8192];  /* `sha256sum *.safetensors` of g_base, text mode */
static const char *g_kl;

/* ---- helpers ------------------------------------------------------------------------------- */

static void setup(void)
{
    g_kl = t_kl_bin();
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_base, sizeof g_base, "%s/base", g_root);
    t_kl_synth_tiny(g_base, 3);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && sha256sum *.safetensors", g_base);
    FILE *p = popen(cmd, "r");
    ck_assert(p != NULL);
    size_t n = fread(g_sums, 1, sizeof g_sums - 1, p);
    g_sums[n] = 0;
    ck_assert_msg(pclose(p) == 0 && n > 4 * 66, "sha256sum failed: %s", g_sums);
}

static void teardown(void)
{
    t_rmrf(g_root);
}

/* Runs `kl ARGS` (a shell fragment); stdout (and stderr unless quiet_stderr) in *out
 * (malloc'd); returns the exit status. */
static int run_kl_to(const char *args, int quiet_stderr, char **out)
{
    char cmd[8192], outf[1100];
    snprintf(outf, sizeof outf, "%s/run.out", g_root);
    snprintf(cmd, sizeof cmd, "'%s' %s > '%s' %s", g_kl, args, outf,
             quiet_stderr ? "2>/dev/null" : "2>&1");
    int st = system(cmd);
    FILE *f = fopen(outf, "rb");
    ck_assert(f != NULL);
    *out = calloc(1, 1 << 16);
    size_t n = fread(*out, 1, (1 << 16) - 1, f);
    (*out)[n] = 0;
    fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int run_kl(const char *args, char **out)
{
    return run_kl_to(args, 0, out);
}

/* ---- --expect: sha256sum -c semantics -------------------------------------------------------- */

/* The good sums text, line by line: the first line's hash and name. */
static void first_line(char hash[65], char *name, size_t cap)
{
    memcpy(hash, g_sums, 64);
    hash[64] = 0;
    const char *nl = strchr(g_sums, '\n');
    snprintf(name, cap, "%.*s", (int)(nl - (g_sums + 66)), g_sums + 66);
}

/* Each case writes the --expect file (or directory) at path. */
typedef struct expect_case {
    const char *name;
    void (*make)(const char *path);
    const char *rule;      /* an error finding with this rule, or NULL: clean */
    const char *warning;   /* a warning finding with this rule (clean otherwise), or NULL */
} expect_case;

static void put(const char *path, const char *text)
{
    t_write(path, text, strlen(text));
}

static void e_good(const char *path) { put(path, g_sums); }

static void e_binary_marker(const char *path)
{
    char buf[8192];
    snprintf(buf, sizeof buf, "%s", g_sums);
    for (char *line = buf; *line; line = strchr(line, '\n') + 1) /* "HEX  name" -> "HEX *name" */
        line[65] = '*';
    put(path, buf);
}

static void e_crlf(const char *path)
{
    char buf[8192];
    size_t k = 0;
    for (const char *p = g_sums; *p; p++) {
        if (*p == '\n')
            buf[k++] = '\r';
        buf[k++] = *p;
    }
    buf[k] = 0;
    put(path, buf);
}

static void e_empty(const char *path) { put(path, ""); }
static void e_junk(const char *path) { put(path, "this is not a checksum file\nat all\n"); }

static void e_binary_junk(const char *path)
{
    static const char junk[] = "\x7f" "ELF\x02\x01\x01\x00\x00\x00\n\x00\x01\x02";
    t_write(path, junk, sizeof junk - 1);
}

static void e_directory(const char *path) { ck_assert(mkdir(path, 0755) == 0); }

/* The good text with the first line's hash replaced by `hash`. */
static void with_first_hash(const char *path, const char *hash)
{
    char h[65], name[512], buf[16384];
    first_line(h, name, sizeof name);
    snprintf(buf, sizeof buf, "%s  %s%s", hash, name, strchr(g_sums, '\n'));
    put(path, buf);
}

/* The first line's hash made len digits long (cut, or padded with 'a'), with a 'g' at bad_at
 * (if < len). */
static void first_hash_as(const char *path, size_t len, size_t bad_at)
{
    char h[80], name[512];
    first_line(h, name, sizeof name);
    for (size_t i = 64; i < len; i++)
        h[i] = 'a';
    h[len] = 0;
    if (bad_at < len)
        h[bad_at] = 'g';
    with_first_hash(path, h);
}

static void e_short_hash(const char *path) { first_hash_as(path, 63, 99); }
static void e_long_hash(const char *path) { first_hash_as(path, 65, 99); }
static void e_non_hex(const char *path) { first_hash_as(path, 64, 10); }

static void e_one_space(const char *path)
{
    char h[65], name[512], buf[16384];
    first_line(h, name, sizeof name);
    snprintf(buf, sizeof buf, "%s %s%s", h, name, strchr(g_sums, '\n'));
    put(path, buf);
}

static void e_missing_shard(const char *path) { put(path, strchr(g_sums, '\n') + 1); }

static void e_conflict(const char *path)
{
    char h[65], name[512], buf[16384];
    first_line(h, name, sizeof name);
    h[0] = h[0] == '0' ? '1' : '0';
    snprintf(buf, sizeof buf, "%s%s  sub/%s\n", g_sums, h, name);
    put(path, buf);
}

static void e_same_twice(const char *path)
{
    char buf[16384];
    snprintf(buf, sizeof buf, "%s%s", g_sums, g_sums);
    put(path, buf);
}

static void e_extra_shard(const char *path)
{
    char h[65], name[512], buf[16384];
    first_line(h, name, sizeof name);
    snprintf(buf, sizeof buf, "%s%s  model-00009-of-00009.safetensors\n", g_sums, h);
    put(path, buf);
}

static void e_extra_readme(const char *path)
{
    char h[65], name[512], buf[16384];
    first_line(h, name, sizeof name);
    snprintf(buf, sizeof buf, "%s  README.md\n%s", h, g_sums);
    put(path, buf);
}

static const expect_case expect_cases[] = {
    {"well-formed text-mode file", e_good, NULL, NULL},
    {"binary-mode '*' markers", e_binary_marker, NULL, NULL},
    {"CRLF line ends", e_crlf, NULL, NULL},
    {"the same line twice", e_same_twice, NULL, NULL},
    {"empty file", e_empty, "EXPECT-MISSING", NULL},
    {"text junk", e_junk, "EXPECT-LINE", NULL},
    {"binary junk with NUL bytes", e_binary_junk, "EXPECT-LINE", NULL},
    {"a directory that is no snapshot", e_directory, "EXPECT-MISSING", NULL},
    {"63-digit hash", e_short_hash, "EXPECT-LINE", NULL},
    {"65-digit hash", e_long_hash, "EXPECT-LINE", NULL},
    {"non-hex hash", e_non_hex, "EXPECT-LINE", NULL},
    {"one space between hash and name", e_one_space, "EXPECT-LINE", NULL},
    {"a shard left out", e_missing_shard, "EXPECT-MISSING", NULL},
    {"one file twice with different hashes", e_conflict, "EXPECT-CONFLICT", NULL},
    {"a shard that is not in the checkpoint", e_extra_shard, "EXPECT-EXTRA", NULL},
    {"a non-shard file (warning only)", e_extra_readme, NULL, "EXPECT-EXTRA"},
};
#define N_EXPECT (sizeof expect_cases / sizeof *expect_cases)

/* 1 if the JSON report holds a finding with this severity and rule. */
static int has_finding(const cJSON *j, const char *severity, const char *rule)
{
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(j, "findings"))
        if (!strcmp(cJSON_GetObjectItem(f, "severity")->valuestring, severity) &&
            !strcmp(cJSON_GetObjectItem(f, "rule")->valuestring, rule))
            return 1;
    return 0;
}

START_TEST(expect_file_is_checked_like_sha256sum_c)
{
    const expect_case *c = &expect_cases[_i];
    char path[1100], args[4096], *out;
    snprintf(path, sizeof path, "%s/expect%02d", g_root, _i);
    c->make(path);
    snprintf(args, sizeof args, "audit '%s' --expect '%s' --json", g_base, path);
    int code = run_kl_to(args, 1, &out);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j != NULL, "case '%s': not JSON (exit %d): %.2000s", c->name, code, out);
    ck_assert_msg(code == (c->rule ? 1 : 0), "case '%s': exit %d, expected %d: %.3000s",
                  c->name, code, c->rule ? 1 : 0, out);
    if (c->rule)
        ck_assert_msg(has_finding(j, "error", c->rule), "case '%s': no error [%s]: %.3000s",
                      c->name, c->rule, out);
    else
        for (const cJSON *h = cJSON_GetObjectItem(j, "hashes")->child; h; h = h->next)
            ck_assert_msg(cJSON_IsTrue(cJSON_GetObjectItem(h, "match")), "case '%s': %.3000s",
                          c->name, out);
    if (c->warning)
        ck_assert_msg(has_finding(j, "warning", c->warning), "case '%s': no warning [%s]: %.3000s",
                      c->name, c->warning, out);
    cJSON_Delete(j);
    free(out);
}
END_TEST

/* ---- memory plan: TP sizes, context, cache sizes ----------------------------------------- */

START_TEST(tp_sizes_of_the_48b_model_divide_every_split)
{
    kl_config c;
    kl_config_default_48b(&c);
    unsigned sizes[64];
    size_t n = kl_tp_sizes(&c, 0, sizes, 64);
    static const unsigned want[] = {1, 2, 4, 8, 16, 32};
    ck_assert_msg(n == 6, "expected 6 valid sizes, got %zu", n);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(sizes[i] == want[i], "size %zu: expected %u, got %u", i, want[i],
                      sizes[i]);
}
END_TEST

START_TEST(tp_that_splits_no_head_evenly_is_a_usage_error)
{
    kl_config c;
    kl_config_default_48b(&c);
    static const unsigned bad[] = {3, 5, 6, 64, 4096};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kl_memplan m;
        kl_memplan_opts o = {.tp = bad[i], .context = 1024, .cache_elem_bytes = 2,
                             .state_elem_bytes = 4};
        kl_err err;
        kl_err_clear(&err);
        int rc = kl_memplan_compute(&m, &c, &o, &err);
        ck_assert_msg(rc == KL_E_USAGE && !strcmp(err.rule, "MEM-TP") &&
                          strstr(err.msg, "valid sizes: 1, 2, 4, 8, 16, 32"),
                      "tp %u: expected KL_E_USAGE [MEM-TP] listing the sizes, got %d %s", bad[i],
                      rc, t_fmt_err(&err));
    }
}
END_TEST

START_TEST(context_above_the_model_maximum_is_a_usage_error)
{
    kl_config c;
    kl_config_default_48b(&c);
    kl_memplan m;
    kl_memplan_opts o = {.tp = 2, .context = c.max_position + 1, .cache_elem_bytes = 2,
                         .state_elem_bytes = 4};
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_memplan_compute(&m, &c, &o, &err);
    ck_assert_msg(rc == KL_E_USAGE && !strcmp(err.rule, "MEM-CONTEXT"),
                  "expected KL_E_USAGE [MEM-CONTEXT], got %d %s", rc, t_fmt_err(&err));
    o.context = c.max_position;
    rc = kl_memplan_compute(&m, &c, &o, &err);
    ck_assert_msg(rc == 0, "context = maximum: %d %s", rc, t_fmt_err(&err));
}
END_TEST

START_TEST(mla_cache_of_the_plan_uses_the_shared_size_at_the_asked_element)
{
    kl_config c;
    kl_config_default_48b(&c);
    ck_assert_uint_eq(kl_config_mla_token_bytes(&c, 4), (512 + 64) * 4); /* the engine: fp32 */
    for (size_t elem = 1; elem <= 4; elem *= 2) {
        kl_memplan m;
        kl_memplan_opts o = {.tp = 4, .context = 1000, .cache_elem_bytes = elem,
                             .state_elem_bytes = 4};
        kl_err err;
        kl_err_clear(&err);
        ck_assert_int_eq(kl_memplan_compute(&m, &c, &o, &err), 0);
        uint64_t want = (uint64_t)kl_config_count_attn(&c, KL_ATTN_MLA) * 1000 *
                        kl_config_mla_token_bytes(&c, elem);
        ck_assert_msg(m.mla_cache_bytes == want && m.cache_elem_bytes == elem,
                      "elem %zu: MLA cache %llu, expected %llu", elem,
                      (unsigned long long)m.mla_cache_bytes, (unsigned long long)want);
        uint64_t kda;
        ck_assert_int_eq(kl_config_kda_state_bytes(&c, 32 / 4, 4, &kda), 0);
        ck_assert_uint_eq(m.kda_state_bytes, kda * kl_config_count_attn(&c, KL_ATTN_KDA));
        ck_assert_uint_eq(kda, (8 * 128 * 128 + 3 * 8 * 128 * 3) * 4);
    }
}
END_TEST

/* Expert parallel: the 48B model's plan holds the same bytes per GPU (every rank owns as many
 * whole experts as it held cuts of all), and a checkpoint whose experts are one MXFP4 block
 * wide splits only that way. */
START_TEST(expert_parallel_plan_owns_whole_experts)
{
    kl_config c;
    kl_config_default_48b(&c);
    for (unsigned tp = 2; tp <= 8; tp *= 2) {
        kl_memplan cut, ep;
        kl_memplan_opts o = {.tp = tp, .context = 1024, .cache_elem_bytes = 2,
                             .state_elem_bytes = 4};
        kl_err err;
        kl_err_clear(&err);
        ck_assert_int_eq(kl_memplan_compute(&cut, &c, &o, &err), 0);
        o.expert_parallel = true;
        ck_assert_int_eq(kl_memplan_compute(&ep, &c, &o, &err), 0);
        ck_assert(ep.expert_parallel && !cut.expert_parallel);
        ck_assert_uint_eq(ep.weights_bytes, cut.weights_bytes);
        ck_assert_uint_eq(ep.total_bytes, cut.total_bytes);
    }
    c.moe_intermediate_size = 32; /* MXFP4 experts one scale block wide */
    c.num_shared_experts = 2;
    snprintf(c.quant_format, sizeof c.quant_format, "mxfp4-pack-quantized");
    kl_memplan m;
    kl_memplan_opts o = {.tp = 2, .context = 1024, .cache_elem_bytes = 2, .state_elem_bytes = 4};
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_memplan_compute(&m, &c, &o, &err), KL_E_USAGE);
    ck_assert_str_eq(err.rule, "MEM-TP");
    o.expert_parallel = true;
    kl_err_clear(&err);
    ck_assert_msg(kl_memplan_compute(&m, &c, &o, &err) == 0, "%s", t_fmt_err(&err));
    o.tp = 64; /* the shared experts' width (64) divides, the 32 heads do not */
    kl_err_clear(&err);
    ck_assert_int_eq(kl_memplan_compute(&m, &c, &o, &err), KL_E_USAGE);
    ck_assert_msg(strstr(err.msg, "valid sizes (expert parallel)"), "%s", err.msg);
}
END_TEST

START_TEST(token_counts_take_binary_suffixes)
{
    static const struct { const char *s; unsigned long long v; } ok[] = {
        {"131072", 131072}, {"128K", 131072}, {"128k", 131072}, {"1M", 1048576},
        {"2G", 2147483648ull}, {"0", 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        unsigned long long v = 7;
        ck_assert_msg(kl_cli_parse_tokens(ok[i].s, &v) == 0 && v == ok[i].v,
                      "'%s': expected %llu, got %llu", ok[i].s, ok[i].v, v);
    }
    static const char *bad[] = {"", "M", "1MB", "1T", "1.5M", "-1", "1 M", "1Mx",
                                "99999999999999999999", "17179869184G"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        unsigned long long v;
        ck_assert_msg(kl_cli_parse_tokens(bad[i], &v) != 0, "'%s' accepted", bad[i]);
    }
}
END_TEST

/* `kl audit BASE EXTRA` exits with code and prints want (stdout or stderr). */
static void expect_audit(const char *extra, int code, const char *want)
{
    char args[4096], *out;
    snprintf(args, sizeof args, "audit '%s' %s", g_base, extra);
    int got = run_kl(args, &out);
    ck_assert_msg(got == code && strstr(out, want), "audit %s: exit %d, expected %d and '%s': %s",
                  extra, got, code, want, out);
    free(out);
}

START_TEST(cli_tp_that_splits_no_head_evenly_exits_2_with_the_valid_sizes)
{
    expect_audit("--tp 3", 2, "valid sizes: 1, 2, 4");
}
END_TEST

START_TEST(cli_context_above_the_model_maximum_exits_2)
{
    expect_audit("--context 1048577", 2, "MEM-CONTEXT");
}
END_TEST

START_TEST(cli_exits_1_for_an_empty_expect_file)
{
    char path[1100], extra[1200];
    snprintf(path, sizeof path, "%s/empty.sums", g_root);
    put(path, "");
    snprintf(extra, sizeof extra, "--expect '%s' -q", path);
    expect_audit(extra, 1, "problems");
}
END_TEST

START_TEST(cli_context_takes_a_1M_suffix)
{
    char args[4096], *out;
    snprintf(args, sizeof args, "audit '%s' --tp 2 --context 1M --json", g_base);
    int code = run_kl(args, &out);
    ck_assert_msg(code == 0, "--context 1M: exit %d: %s", code, out);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j != NULL, "not JSON: %s", out);
    cJSON *m = cJSON_GetObjectItem(j, "memory_plan");
    ck_assert_msg(cJSON_GetObjectItem(m, "context_tokens")->valuedouble == 1048576.0 &&
                      cJSON_GetObjectItem(m, "mla_cache_element_bytes")->valuedouble == 2.0,
                  "memory_plan: %s", out);
    cJSON_Delete(j);
    free(out);
}
END_TEST

/* The plan's new figures, text and JSON: the GPU arena per rank (at TP 2 a rank's, smaller;
 * with expert parallel too: tp 3 in this loop is TP 2 with --expert-parallel). */
START_TEST(cli_reports_matrices_vectors_and_the_gpu_arena)
{
    char args[4096], *out;
    double arena1 = 0;
    for (unsigned tp = 1; tp <= 3; tp++) {
        snprintf(args, sizeof args, "audit '%s' --tp %u --json%s", g_base, tp < 3 ? tp : 2,
                 tp < 3 ? "" : " --expert-parallel");
        int code = run_kl(args, &out);
        ck_assert_msg(code == 0, "--tp %u: exit %d: %s", tp, code, out);
        cJSON *j = cJSON_Parse(out);
        ck_assert_msg(j != NULL, "not JSON: %s", out);
        cJSON *m = cJSON_GetObjectItem(j, "memory_plan");
        double w = cJSON_GetObjectItem(m, "weights_bytes_per_gpu")->valuedouble;
        double mat = cJSON_GetObjectItem(m, "matrix_bytes_per_gpu")->valuedouble;
        double vec = cJSON_GetObjectItem(m, "vector_bytes_per_gpu")->valuedouble;
        double v32 = cJSON_GetObjectItem(m, "vector_f32_bytes_per_gpu")->valuedouble;
        cJSON *arena = cJSON_GetObjectItem(m, "gpu_arena_bytes");
        ck_assert_msg(mat > 0 && vec > 0 && mat + vec == w && v32 > vec, "tp %u: %s", tp, out);
        if (tp == 1)
            arena1 = arena->valuedouble;
        ck_assert_msg(cJSON_IsNumber(arena) && arena->valuedouble >= mat + v32 &&
                          (tp == 1 || arena->valuedouble < arena1), "tp %u: %s", tp, out);
        cJSON_Delete(j);
        free(out);
    }
    snprintf(args, sizeof args, "audit '%s'", g_base);
    ck_assert_int_eq(run_kl(args, &out), 0);
    ck_assert_msg(strstr(out, "weights: matrices ") && strstr(out, "GPU engine weight arena "),
                  "%s", out);
    free(out);
}
END_TEST

/* ---- hash progress ------------------------------------------------------------------------- */

typedef struct seen {
    unsigned calls;
    uint64_t last_done, total;
} seen;

static void record(void *ctx, uint64_t done, uint64_t total)
{
    seen *s = ctx;
    s->calls++;
    s->last_done = done;
    s->total = total;
}

START_TEST(hash_progress_reports_bytes_of_all_shards)
{
    seen s = {0};
    kl_audit_opts o = {.hash = true, .tp = 1, .threads = 1, .progress = record,
                       .progress_ctx = &s};
    kl_audit_report r;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_audit_run(&r, g_base, &o, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_msg(s.calls > 0, "progress never called");
    ck_assert_msg(s.total == r.file_bytes && s.last_done <= s.total,
                  "progress total %llu (file bytes %llu), last %llu",
                  (unsigned long long)s.total, (unsigned long long)r.file_bytes,
                  (unsigned long long)s.last_done);
    ck_assert(r.hashed_bytes == r.file_bytes);
    kl_audit_report_free(&r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("audit");
    TCase *tc = tcase_create("expect");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, expect_file_is_checked_like_sha256sum_c, 0, (int)N_EXPECT);
    tcase_add_test(tc, cli_exits_1_for_an_empty_expect_file);
    tcase_add_test(tc, hash_progress_reports_bytes_of_all_shards);
    tcase_add_test(tc, cli_tp_that_splits_no_head_evenly_exits_2_with_the_valid_sizes);
    tcase_add_test(tc, cli_context_above_the_model_maximum_exits_2);
    tcase_add_test(tc, cli_context_takes_a_1M_suffix);
    tcase_add_test(tc, cli_reports_matrices_vectors_and_the_gpu_arena);
    suite_add_tcase(s, tc);
    TCase *mp = tcase_create("memory plan");
    tcase_add_test(mp, tp_sizes_of_the_48b_model_divide_every_split);
    tcase_add_test(mp, tp_that_splits_no_head_evenly_is_a_usage_error);
    tcase_add_test(mp, context_above_the_model_maximum_is_a_usage_error);
    tcase_add_test(mp, mla_cache_of_the_plan_uses_the_shared_size_at_the_asked_element);
    tcase_add_test(mp, token_counts_take_binary_suffixes);
    tcase_add_test(mp, expert_parallel_plan_owns_whole_experts);
    suite_add_tcase(s, mp);
    return t_run_suite(s);
}
