/*
 * tests/test_ckcheck.c — the shared metadata check (loader/ckcheck.h): the engine refuses what
 * audit refuses, with audit's first finding; a truncated shard is one root-cause error.
 *
 * Each case copies a tiny synthetic checkpoint (4 shards), breaks it one way, and checks that
 * kl_audit_run reports an error of the expected rule and that kl_model_open fails with
 * KL_E_FORMAT naming the same first finding and pointing at `kl audit DIR`.  The 600,000
 * unexpected tensors case also runs through `kl run` ($KL_BIN): exit 1, a short stderr.
 */
#include "audit/audit.h"
#include "audit/report.h"
#include "common/err.h"
#include "common/mem.h"
#include "synth/synth.h"
#include "engine/model.h"
#include "loader/checkpoint.h"
#include "loader/ckcheck.h"
#include "tests/testutil.h"

#include <cJSON.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define N_UNEXPECTED 600000

static char g_root[512], g_base[600];

static void setup(void)
{
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_base, sizeof g_base, "%s/base", g_root);
    t_synth_tiny(g_base, 7);
}

static void teardown(void)
{
    if (g_root[0])
        t_rmrf(g_root);
}

/* ---- helpers ------------------------------------------------------------------------------- */

/* A fresh copy of the base checkpoint at g_root/name. */
static void copy_base(const char *name, char *dir, size_t n)
{
    char cmd[4200];
    snprintf(dir, n, "%s/%s", g_root, name);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, g_base, dir);
    ck_assert(system(cmd) == 0);
}

/* The index of dir as JSON (caller deletes) and writes it back. */
static cJSON *index_load(const char *dir)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    char *t = t_slurp(p, NULL);
    cJSON *j = cJSON_Parse(t);
    free(t);
    ck_assert(j != NULL);
    return j;
}

static void index_store(const char *dir, cJSON *j)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    char *t = cJSON_PrintUnformatted(j);
    t_write(p, t, strlen(t));
    free(t);
}

/* The audit's first error finding (the test fails when there is none). */
static kl_finding audit_first_error(const char *dir, kl_audit_report *r)
{
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_audit_run(r, dir, NULL, &err);
    ck_assert_msg(rc == 0, "kl_audit_run(%s): %s", dir, t_fmt_err(&err));
    for (size_t i = 0; i < r->n_findings; i++)
        if (r->findings[i].severity == KL_SEV_ERROR)
            return r->findings[i];
    ck_abort_msg("audit of %s found no error", dir);
    return r->findings[0];
}

/* Audit reports rule first; the engine refuses with that same finding.  The audit report is
 * left in *r (kl_audit_report_free). */
static void expect_refused(const char *dir, const char *rule, kl_audit_report *r)
{
    kl_finding first = audit_first_error(dir, r);
    ck_assert_msg(!strcmp(first.rule, rule), "audit's first error: expected %s, got [%s] %s",
                  rule, first.rule, first.message);
    kl_model *m = NULL;
    kl_model_opts mo = {.threads = 1};
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_model_open(&m, dir, &mo, &err);
    ck_assert_msg(rc == KL_E_FORMAT && m == NULL,
                  "kl_model_open on a checkpoint audit refuses (%s): expected %d, got %d (%s)",
                  rule, KL_E_FORMAT, rc, t_fmt_err(&err));
    ck_assert_msg(!strcmp(err.rule, rule) && !strcmp(err.tensor, first.tensor),
                  "engine refusal [%s] %s differs from audit's first finding [%s] %s", err.rule,
                  err.tensor, first.rule, first.tensor);
    ck_assert_msg(strstr(err.msg, first.message), "engine message '%s' lacks audit's '%s'",
                  err.msg, first.message);
    ck_assert_msg(strstr(err.msg, "kl audit"), "no pointer to kl audit: %s", err.msg);
}

/* expect_refused, the report dropped. */
static void expect_refused_only(const char *dir, const char *rule)
{
    kl_audit_report r;
    expect_refused(dir, rule, &r);
    kl_audit_report_free(&r);
}

/* ---- defect 11: the engine refuses what audit refuses -------------------------------------- */

START_TEST(engine_refuses_an_index_naming_the_wrong_shard)
{
    char dir[700];
    copy_base("wrong", dir, sizeof dir);
    cJSON *j = index_load(dir);
    cJSON *wm = cJSON_GetObjectItem(j, "weight_map"), *first = wm->child, *other = wm->child;
    while (other && !strcmp(other->valuestring, first->valuestring))
        other = other->next;
    ck_assert(other != NULL);
    cJSON_SetValuestring(first, other->valuestring);
    index_store(dir, j);
    cJSON_Delete(j);
    expect_refused_only(dir, "IDX-WRONG-SHARD");
}
END_TEST

START_TEST(engine_refuses_a_tensor_the_index_does_not_list)
{
    char dir[700];
    copy_base("unlisted", dir, sizeof dir);
    cJSON *j = index_load(dir);
    cJSON *wm = cJSON_GetObjectItem(j, "weight_map");
    cJSON_DeleteItemFromObject(wm, wm->child->string);
    index_store(dir, j);
    cJSON_Delete(j);
    expect_refused_only(dir, "IDX-UNLISTED");
}
END_TEST

START_TEST(engine_refuses_several_shards_without_an_index)
{
    char dir[700], p[1200];
    copy_base("noindex", dir, sizeof dir);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    ck_assert(unlink(p) == 0);
    expect_refused_only(dir, "IDX-MISSING");
}
END_TEST

/* Adds a shard of n empty tensors the schema does not know, listed in the index. */
static void add_unexpected(const char *dir, size_t n)
{
    const char *shard = "model-extra.safetensors";
    size_t cap = n * 96 + 256, used = 0;
    char *h = malloc(cap), *w = malloc(n * 64 + 16);
    size_t wused = 0;
    used += (size_t)snprintf(h + used, cap - used, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n; i++) {
        used += (size_t)snprintf(h + used, cap - used, ",\"extra.%zu\":{\"dtype\":\"BF16\","
                                 "\"shape\":[0],\"data_offsets\":[0,0]}", i);
        wused += (size_t)snprintf(w + wused, n * 64 + 16 - wused, "\"extra.%zu\":\"%s\",", i,
                                  shard);
    }
    h[used++] = '}';
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, shard);
    FILE *f = fopen(p, "wb");
    ck_assert(f != NULL);
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)used >> (8 * i));
    ck_assert(fwrite(len, 1, 8, f) == 8 && fwrite(h, 1, used, f) == used);
    fclose(f);
    /* splice the entries into the index's weight_map */
    cJSON *j = index_load(dir);
    char *t = cJSON_PrintUnformatted(j), *at = strstr(t, "\"weight_map\":{");
    cJSON_Delete(j);
    ck_assert(at != NULL);
    at += strlen("\"weight_map\":{");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    f = fopen(p, "wb");
    ck_assert(f != NULL);
    fwrite(t, 1, (size_t)(at - t), f);
    fwrite(w, 1, wused, f);
    fputs(at, f);
    fclose(f);
    free(t);
    free(h);
    free(w);
}

START_TEST(engine_refuses_600k_unexpected_tensors_and_audit_lists_only_the_first)
{
    char dir[700];
    copy_base("unexpected", dir, sizeof dir);
    add_unexpected(dir, N_UNEXPECTED);
    kl_audit_report r;
    expect_refused(dir, "SCHEMA-UNEXPECTED", &r);
    size_t listed = 0, tally = 0;
    for (size_t i = 0; i < r.n_findings; i++) {
        const kl_finding *f = &r.findings[i];
        listed += !strcmp(f->rule, "SCHEMA-UNEXPECTED") && f->tensor[0];
        tally += !strcmp(f->rule, "SCHEMA-UNEXPECTED") && strstr(f->message, "599900 more");
    }
    ck_assert_msg(listed == KL_CKCHECK_LIST_MAX && tally == 1 && r.n_errors == listed + 1,
                  "expected %d listed + 1 count of the rest, got %zu listed, %zu counts, %zu "
                  "errors", KL_CKCHECK_LIST_MAX, listed, tally, r.n_errors);
    kl_audit_report_free(&r);
    /* through the CLI: exit 1, one line of stderr (no flood) */
    const char *kl = getenv("KL_BIN");
    ck_assert_msg(kl && *kl, "KL_BIN must name the kl binary under test");
    char cmd[4200], errf[1200];
    snprintf(errf, sizeof errf, "%s/run.err", g_root);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --ids 1,2 -n 1 > /dev/null 2> '%s'", kl, dir, errf);
    int st = system(cmd);
    char *e = t_slurp(errf, NULL);
    size_t lines = 0;
    for (const char *c = e; *c; c++)
        lines += *c == '\n';
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1 && lines == 1 &&
                  strstr(e, "SCHEMA-UNEXPECTED") && strstr(e, "kl audit"),
                  "kl run: expected exit 1 and one line naming SCHEMA-UNEXPECTED and kl audit, "
                  "got status %d, %zu lines: %.600s", st, lines, e);
    free(e);
}
END_TEST

/* ---- defect 12: a truncated shard is one root cause ---------------------------------------- */

START_TEST(truncated_shard_is_one_error_and_one_grouped_warning)
{
    char dir[700], shard[1200];
    copy_base("truncated", dir, sizeof dir);
    snprintf(shard, sizeof shard, "%s/model-00002-of-00004.safetensors", dir);
    kl_st_file st;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_st_open(&st, shard, &err) == 0, "%s", t_fmt_err(&err));
    size_t n_in_shard = st.n_tensors;
    kl_st_close(&st);
    struct stat sb;
    ck_assert(stat(shard, &sb) == 0 && sb.st_size > 1000);
    ck_assert(truncate(shard, sb.st_size - 1000) == 0);

    kl_audit_report r;
    kl_finding first = audit_first_error(dir, &r);
    ck_assert_msg(r.n_errors == 1 && r.n_warnings == 1 && r.n_bad_shards == 1,
                  "expected 1 error, 1 warning, 1 unreadable shard; got %zu, %zu, %zu",
                  r.n_errors, r.n_warnings, r.n_bad_shards);
    ck_assert_msg(!strcmp(first.rule, "ST-FILE-LENGTH") &&
                  strstr(first.message, "shard 2 of 4: file is 1000 bytes shorter than its "
                         "header says"), "root cause: [%s] %s", first.rule, first.message);
    char want[128];
    snprintf(want, sizeof want, "%zu tensors in this shard not checked", n_in_shard);
    size_t grouped = 0;
    for (size_t i = 0; i < r.n_findings; i++)
        grouped += !strcmp(r.findings[i].rule, "CK-NOT-CHECKED") &&
                   strstr(r.findings[i].message, want) && !strcmp(r.findings[i].file, shard);
    ck_assert_msg(grouped == 1, "no CK-NOT-CHECKED warning saying '%s'", want);

    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    kl_audit_print_text(&r, out, 0);
    fclose(out);
    ck_assert_msg(strstr(text, "result: 1 problem(s), 1 warning(s)") &&
                  strstr(text, "(not compared: 1 shard(s) unreadable)") &&
                  !strstr(text, "see warnings") && !strstr(text, "SCHEMA-MISSING"),
                  "text summary:\n%s", text);
    free(text);
    kl_audit_report_free(&r);
}
END_TEST

/* ---- the shared table ---------------------------------------------------------------------- */

START_TEST(clean_checkpoints_bind_every_entry_and_find_nothing)
{
    const char *dirs[] = {g_base, "tests/fixtures/ref_tiny", "tests/fixtures/golden/small4",
                          "tests/fixtures/golden/multi"};
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        kl_checkpoint ck;
        kl_ckcheck c;
        kl_err err;
        kl_err_clear(&err);
        ck_assert_msg(kl_ckpt_open(&ck, dirs[d], &err) == 0, "%s", t_fmt_err(&err));
        int rc = kl_ckcheck_require(&c, &ck, &err);
        ck_assert_msg(rc == 0 && c.has_schema && c.n_errors == 0 && c.n_warnings == 0,
                      "%s: rc %d, %zu errors, %zu warnings (%s)", dirs[d], rc, c.n_errors,
                      c.n_warnings, t_fmt_err(&err));
        for (size_t i = 0; i < c.schema.n; i++) {
            const kl_schema_entry *e = &c.schema.entries[i];
            ck_assert_msg(c.bound[i] != NULL, "%s: %s unbound", dirs[d], e->name);
            ck_assert_ptr_eq(kl_ckcheck_tensor(&c, e->name), c.bound[i]);
            if (e->alias)
                ck_assert_ptr_eq(kl_ckcheck_tensor(&c, e->alias), c.bound[i]);
        }
        ck_assert_ptr_null(kl_ckcheck_tensor(&c, "no.such.tensor"));
        kl_ckcheck_free(&c);
        kl_ckcheck_free(&c); /* idempotent */
        kl_ckpt_close(&ck);
    }
}
END_TEST

/* ---- the schema built while the headers are parsed ----------------------------------------- */

/* kl_ckcheck_open_require(dir) gives what kl_ckpt_open + kl_ckcheck_require give: the same code
 * and error (every field), and on success the same counts and bound tensors. */
static void expect_same_as_two_calls(const char *dir)
{
    kl_checkpoint ck1, ck2;
    kl_ckcheck c1, c2;
    kl_err e1, e2;
    kl_err_clear(&e1);
    kl_err_clear(&e2);
    memset(&c1, 0, sizeof c1);
    int rc1 = kl_ckpt_open(&ck1, dir, &e1);
    int opened = rc1 == 0;
    if (opened)
        rc1 = kl_ckcheck_require(&c1, &ck1, &e1);
    int rc2 = kl_ckcheck_open_require(&c2, &ck2, dir, &e2);
    ck_assert_msg(rc1 == rc2, "%s: two calls %d (%s), one call %d (%s)", dir, rc1,
                  t_fmt_err(&e1), rc2, t_fmt_err(&e2));
    ck_assert_msg(!memcmp(&e1, &e2, sizeof e1), "%s: errors differ: '%s' and '%s'", dir,
                  t_fmt_err(&e1), t_fmt_err(&e2));
    if (!rc2) {
        ck_assert(c1.has_schema == c2.has_schema && c1.schema.n == c2.schema.n &&
                  c1.n_warnings == c2.n_warnings && c1.n_infos == c2.n_infos);
        for (size_t i = 0; i < c1.schema.n; i++)
            ck_assert_msg(!strcmp(c1.schema.entries[i].name, c2.schema.entries[i].name) &&
                          !strcmp(c1.bound[i]->name, c2.bound[i]->name),
                          "%s: entry %zu bound differently", dir, i);
        kl_ckcheck_free(&c2);
        kl_ckpt_close(&ck2);
    }
    kl_ckcheck_free(&c1);
    if (opened)
        kl_ckpt_close(&ck1);
}

START_TEST(open_require_gives_what_open_then_require_give)
{
    char dir[700], p[1200];
    expect_same_as_two_calls(g_base);
    expect_same_as_two_calls("tests/fixtures/golden/multi");
    /* no config: no schema to build ahead */
    copy_base("noconfig", dir, sizeof dir);
    snprintf(p, sizeof p, "%s/config.json", dir);
    ck_assert(unlink(p) == 0);
    expect_same_as_two_calls(dir);
    /* a shard gone: parsed after the index named it */
    copy_base("noshard", dir, sizeof dir);
    snprintf(p, sizeof p, "%s/model-00002-of-00004.safetensors", dir);
    ck_assert(unlink(p) == 0);
    expect_same_as_two_calls(dir);
    /* a wider hidden size: the schema built ahead refuses every shape */
    copy_base("wider", dir, sizeof dir);
    snprintf(p, sizeof p, "%s/config.json", dir);
    char *t = t_slurp(p, NULL);
    cJSON *j = cJSON_Parse(t);
    free(t);
    ck_assert(j != NULL);
    cJSON *h = cJSON_GetObjectItem(j, "hidden_size");
    ck_assert(h != NULL);
    cJSON_SetNumberValue(h, h->valuedouble * 2);
    t = cJSON_Print(j);
    t_write(p, t, strlen(t));
    free(t);
    cJSON_Delete(j);
    expect_same_as_two_calls(dir);
    /* not a directory */
    snprintf(p, sizeof p, "%s/missing", g_root);
    expect_same_as_two_calls(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ckcheck");
    TCase *tc = tcase_create("engine and audit agree");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, engine_refuses_an_index_naming_the_wrong_shard);
    tcase_add_test(tc, engine_refuses_a_tensor_the_index_does_not_list);
    tcase_add_test(tc, engine_refuses_several_shards_without_an_index);
    tcase_add_test(tc, engine_refuses_600k_unexpected_tensors_and_audit_lists_only_the_first);
    tcase_add_test(tc, truncated_shard_is_one_error_and_one_grouped_warning);
    tcase_add_test(tc, clean_checkpoints_bind_every_entry_and_find_nothing);
    tcase_add_test(tc, open_require_gives_what_open_then_require_give);
    suite_add_tcase(s, tc);
    return t_run_suite(s);
}
