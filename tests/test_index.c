/*
 * tests/test_index.c — loader/index (model.safetensors.index.json).
 *
 * Rule tests are loop tests over one table, one row per violation, asserting the rule id, the
 * tensor named by the error and that nothing leaks.  kl_index_open gets small files in a temp
 * directory.
 */
#include "common/mem.h"
#include "loader/index.h"
#include "tests/testutil.h"

#include <errno.h>

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"
/* {"metadata":{"total_size":T},"weight_map":{ENTRIES}} */
#define INDEX(total, entries)                                                                 \
    "{\"metadata\":{\"total_size\":" total "},\"weight_map\":{" entries "}}"
#define E(t, f) "\"" t "\":\"" f "\""

static int parse(kl_index *idx, const char *json, kl_err *err)
{
    kl_err_clear(err);
    return kl_index_parse(idx, "model.safetensors.index.json", json, strlen(json), err);
}


static char tmpdir[1024];

static void setup_tmp(void)
{
    t_mkdtemp(tmpdir, sizeof tmpdir);
}

static void teardown_tmp(void)
{
    t_rmrf(tmpdir);
}

/* ------------------------------------------------------------------------------------------ */
/* Rule table                                                                                 */

typedef struct rule_row {
    const char *what;
    const char *json;
    const char *rule;
    const char *tensor; /* "" for none */
} rule_row;

static const rule_row rule_rows[] = {
    /* IDX-UTF8 */
    {"invalid byte in a tensor name", INDEX("0", E("a\xff", SHARD1)), "IDX-UTF8", ""},
    {"overlong sequence", INDEX("0", E("\xc1\xbf", SHARD1)), "IDX-UTF8", ""},
    /* IDX-JSON */
    {"empty text", "", "IDX-JSON", ""},
    {"array at top level", "[]", "IDX-JSON", ""},
    {"unterminated object", "{\"weight_map\":{}", "IDX-JSON", ""},
    {"garbage after the object", "{\"weight_map\":{}} x", "IDX-JSON", ""},
    {"byte-order mark", "\xef\xbb\xbf{\"weight_map\":{}}", "IDX-JSON", ""},
    {"raw control character", "{\"weight_map\":{\"a\x02\":\"" SHARD1 "\"}}", "IDX-JSON", ""},
    {"escaped NUL in a name", "{\"weight_map\":{\"a\\u0000\":\"" SHARD1 "\"}}", "IDX-JSON", ""},
    {"leading zero in total_size", INDEX("01", ""), "IDX-JSON", ""},
    {"weight_map missing", "{\"metadata\":{}}", "IDX-JSON", ""},
    {"weight_map is an array", "{\"weight_map\":[]}", "IDX-JSON", ""},
    {"weight_map is a string", "{\"weight_map\":\"x\"}", "IDX-JSON", ""},
    {"weight_map twice", "{\"weight_map\":{},\"weight_map\":{}}", "IDX-JSON", ""},
    {"metadata is a number", "{\"metadata\":5,\"weight_map\":{}}", "IDX-JSON", ""},
    {"metadata twice", "{\"metadata\":{},\"metadata\":{},\"weight_map\":{}}", "IDX-JSON", ""},
    /* IDX-ENTRY */
    {"shard is a number", "{\"weight_map\":{\"a\":5}}", "IDX-ENTRY", "a"},
    {"shard is null", "{\"weight_map\":{\"a\":null}}", "IDX-ENTRY", "a"},
    {"shard is an empty string", "{\"weight_map\":{\"a\":\"\"}}", "IDX-ENTRY", "a"},
    {"empty tensor name", INDEX("0", E("", SHARD1)), "IDX-ENTRY", ""},
    /* IDX-DUPLICATE */
    {"tensor twice, same shard", INDEX("0", E("a", SHARD1) "," E("a", SHARD1)), "IDX-DUPLICATE",
     "a"},
    {"tensor twice, two shards", INDEX("0", E("b", SHARD1) "," E("a", SHARD1) "," E("b", SHARD2)),
     "IDX-DUPLICATE", "b"},
    /* IDX-SHARD-NAME */
    {"absolute shard path", INDEX("0", E("a", "/tmp/" SHARD1)), "IDX-SHARD-NAME", "a"},
    {"shard in a subdirectory", INDEX("0", E("a", "sub/" SHARD1)), "IDX-SHARD-NAME", "a"},
    {"shard with ..", INDEX("0", E("a", "../" SHARD1)), "IDX-SHARD-NAME", "a"},
    {"shard name is ..", INDEX("0", E("a", "..")), "IDX-SHARD-NAME", "a"},
    {"shard not .safetensors", INDEX("0", E("a", "pytorch_model.bin")), "IDX-SHARD-NAME", "a"},
    {"shard name is only the suffix", INDEX("0", E("a", ".safetensors")), "IDX-SHARD-NAME", "a"},
    {"shard suffix in the wrong case", INDEX("0", E("a", "model.SAFETENSORS")), "IDX-SHARD-NAME",
     "a"},
    {"shard name with an escaped newline", INDEX("0", E("a", "m\\n.bin")), "IDX-SHARD-NAME", "a"},
    /* IDX-TOTAL-SIZE */
    {"negative total_size", INDEX("-1", ""), "IDX-TOTAL-SIZE", ""},
    {"fractional total_size", INDEX("1.5", ""), "IDX-TOTAL-SIZE", ""},
    {"string total_size", INDEX("\"123\"", ""), "IDX-TOTAL-SIZE", ""},
    {"null total_size", INDEX("null", ""), "IDX-TOTAL-SIZE", ""},
    {"total_size above 2^53", INDEX("1e300", ""), "IDX-TOTAL-SIZE", ""},
    {"total_size twice", "{\"metadata\":{\"total_size\":1,\"total_size\":2},\"weight_map\":{}}",
     "IDX-TOTAL-SIZE", ""},
};
#define N_RULE_ROWS ((int)(sizeof rule_rows / sizeof rule_rows[0]))

START_TEST(index_rule_violations_are_rejected_with_their_rule)
{
    const rule_row *r = &rule_rows[_i];
    kl_index idx;
    kl_err err;
    size_t mem0 = kl_mem_in_use();
    int rc = parse(&idx, r->json, &err);
    ck_assert_msg(rc == KL_E_FORMAT, "%s: expected KL_E_FORMAT, got %d (%s)", r->what, rc,
                  t_fmt_err(&err));
    ck_assert_msg(strcmp(err.rule, r->rule) == 0, "%s: expected rule %s, got %s (%s)", r->what,
                  r->rule, err.rule, t_fmt_err(&err));
    ck_assert_msg(strcmp(err.tensor, r->tensor) == 0, "%s [%s]: expected tensor \"%s\", got \"%s\"",
                  r->what, r->rule, r->tensor, err.tensor);
    if (r->tensor[0])
        ck_assert_msg(strstr(t_fmt_err(&err), r->tensor) != NULL,
                      "%s [%s]: message does not name tensor %s: %s", r->what, r->rule,
                      r->tensor, t_fmt_err(&err));
    ck_assert_msg(strcmp(err.file, "model.safetensors.index.json") == 0,
                  "%s: expected file context, got %s", r->what, err.file);
    ck_assert_msg(err.msg[0] && !t_has_control(err.msg) && !t_has_control(t_fmt_err(&err)),
                  "%s: message must be one printable line: %s", r->what, err.msg);
    ck_assert_msg(idx.entries == NULL && idx.n_entries == 0 && idx.strings == NULL,
                  "%s: kl_index must be zeroed on failure", r->what);
    ck_assert_msg(kl_mem_in_use() == mem0, "%s: %zu bytes leaked", r->what,
                  kl_mem_in_use() - mem0);
}
END_TEST

START_TEST(index_utf8_error_reports_its_byte_offset)
{
    kl_index idx;
    kl_err err;
    ck_assert_int_eq(parse(&idx, "{\"weight_map\":{\"ab\xfe\":\"x\"}}", &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "IDX-UTF8");
    ck_assert_uint_eq(err.offset, 18);
}
END_TEST

/* Exactly one JSON object plus whitespace, UTF-8 without BOM or NUL, total_size written as an
 * integer (issue 9 defect 5). */
static const char STRICT_BASE[] = INDEX("1234", E("a.weight", SHARD1));
static const t_json_case strict_rows[] = {
    {"garbage after the object", "\"}}", "\"}}x", 0, "IDX-JSON"},
    {"a second object", "\"}}", "\"}}{}", 0, "IDX-JSON"},
    {"byte-order mark", "{\"metadata", "\xef\xbb\xbf{\"metadata", 0, "IDX-JSON"},
    {"NUL after the object", "\"}}", "\"}}\0", 4, "IDX-JSON"},
    {"NUL in a tensor name", "a.weight", "a.\0weight", 9, "IDX-JSON"},
    {"invalid UTF-8 in a shard name", "00001-of", "00001\xe2\x82-of", 0, "IDX-UTF8"},
    {"total_size written 1234.0", "1234", "1234.0", 0, "IDX-TOTAL-SIZE"},
    {"total_size written 1.234e3", "1234", "1.234e3", 0, "IDX-TOTAL-SIZE"},
    {"total_size written -0", "1234", "-0", 0, "IDX-TOTAL-SIZE"},
    {"total_size above 2^64-1", "1234", "18446744073709551616", 0, "IDX-TOTAL-SIZE"},
    {"whitespace after the object", "\"}}", "\"}}\r\n \t", 0, NULL},
    {"total_size 0", "1234", "0", 0, NULL},
    {"total_size 2^64-1", "1234", "18446744073709551615", 0, NULL},
};

START_TEST(index_text_is_one_strict_json_object_with_integers_as_written)
{
    const t_json_case *c = &strict_rows[_i];
    size_t len;
    char *json = t_json_splice(STRICT_BASE, c, &len);
    kl_index idx;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_index_parse(&idx, "model.safetensors.index.json", json, len, &err);
    free(json);
    t_json_case_check(c, rc, &err, NULL);
    kl_index_free(&idx);
}
END_TEST

START_TEST(index_total_size_is_read_exactly_above_2_pow_53)
{
    kl_index idx;
    kl_err err;
    ck_assert_int_eq(parse(&idx, INDEX("9007199254740993", ""), &err), 0);
    ck_assert_uint_eq(idx.total_size, 9007199254740993ull);
    kl_index_free(&idx);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Valid indexes                                                                              */

START_TEST(index_valid_file_maps_tensors_to_shards)
{
    const char *json = INDEX("1234", E("b.weight", SHARD2) "," E("a.weight", SHARD1) ","
                                     E("c.bias", SHARD2));
    kl_index idx;
    kl_err err;
    size_t mem0 = kl_mem_in_use();
    ck_assert_msg(parse(&idx, json, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_int_eq(idx.has_total_size, 1);
    ck_assert_uint_eq(idx.total_size, 1234);
    ck_assert_uint_eq(idx.n_entries, 3);
    ck_assert_uint_eq(idx.n_shards, 2);
    /* Shards in first-seen order, entries in file order. */
    ck_assert_str_eq(idx.shards[0], SHARD2);
    ck_assert_str_eq(idx.shards[1], SHARD1);
    ck_assert_str_eq(idx.entries[0].tensor, "b.weight");
    ck_assert_str_eq(idx.entries[1].tensor, "a.weight");
    ck_assert_int_eq(kl_index_shard_of(&idx, "b.weight"), 0);
    ck_assert_int_eq(kl_index_shard_of(&idx, "a.weight"), 1);
    ck_assert_int_eq(kl_index_shard_of(&idx, "c.bias"), 0);
    ck_assert_int_eq(kl_index_shard_of(&idx, "missing"), -1);
    ck_assert_int_eq(kl_index_shard_of(&idx, NULL), -1);
    kl_index_free(&idx);
    ck_assert_ptr_null(idx.entries);
    kl_index_free(&idx); /* idempotent */
    ck_assert_uint_eq(kl_mem_in_use(), mem0);
}
END_TEST

START_TEST(index_without_metadata_has_no_total_size)
{
    kl_index idx;
    kl_err err;
    ck_assert_msg(parse(&idx, "{\"weight_map\":{" E("a", SHARD1) "}}", &err) == 0, "%s",
                  t_fmt_err(&err));
    ck_assert_int_eq(idx.has_total_size, 0);
    ck_assert_uint_eq(idx.n_entries, 1);
    kl_index_free(&idx);
}
END_TEST

START_TEST(index_empty_weight_map_is_valid)
{
    kl_index idx;
    kl_err err;
    ck_assert_msg(parse(&idx, INDEX("0", ""), &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(idx.n_entries, 0);
    ck_assert_uint_eq(idx.n_shards, 0);
    ck_assert_int_eq(kl_index_shard_of(&idx, "a"), -1);
    kl_index_free(&idx);
}
END_TEST

START_TEST(index_extra_keys_and_whitespace_are_accepted)
{
    const char *json = " \n{\"metadata\":{\"total_size\":281474976710656,\"total_parameters\":"
                       "\"7\",\"note\":[1]},\"extra\":{\"x\":1},\"weight_map\":{"
                       E("caf\xc3\xa9", "a.b-00001.safetensors") "}}\t\r\n ";
    kl_index idx;
    kl_err err;
    ck_assert_msg(parse(&idx, json, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(idx.total_size, 281474976710656ull);
    ck_assert_int_eq(kl_index_shard_of(&idx, "caf\xc3\xa9"), 0);
    kl_index_free(&idx);
}
END_TEST

START_TEST(index_total_size_zero_and_2_pow_53_are_accepted)
{
    kl_index idx;
    kl_err err;
    ck_assert_msg(parse(&idx, INDEX("0", ""), &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(idx.total_size, 0);
    kl_index_free(&idx);
    ck_assert_msg(parse(&idx, INDEX("9007199254740992", ""), &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(idx.total_size, 9007199254740992ull);
    kl_index_free(&idx);
}
END_TEST

START_TEST(index_many_entries_are_all_found)
{
    /* Enough entries to make both maps grow several times. */
    enum { N = 5000 };
    size_t cap = (size_t)N * 96 + 64, used = 0;
    char *json = malloc(cap);
    ck_assert_ptr_nonnull(json);
    used += (size_t)snprintf(json, cap, "{\"weight_map\":{");
    for (int i = 0; i < N; i++)
        used += (size_t)snprintf(json + used, cap - used,
                                 "%s\"model.layers.%d.w\":\"model-%05d.safetensors\"",
                                 i ? "," : "", i, i % 37);
    snprintf(json + used, cap - used, "}}");
    kl_index idx;
    kl_err err;
    ck_assert_msg(parse(&idx, json, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(idx.n_entries, N);
    ck_assert_uint_eq(idx.n_shards, 37);
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.w", i);
        int s = kl_index_shard_of(&idx, name);
        ck_assert_msg(s == i % 37, "%s: expected shard %d, got %d", name, i % 37, s);
    }
    kl_index_free(&idx);
    free(json);
}
END_TEST

/* Indexes as writers make them (the plain path reads them without a tree), each beside the
 * same index with one more root member, which only the strict path takes (it ignores it). */
static const struct paths_row {
    const char *what;
    const char *entries;       /* weight_map members */
    const char *metadata;      /* metadata members, NULL: no metadata */
} paths_rows[] = {
    {"three entries over two shards", E("b", SHARD2) "," E("a", SHARD1) "," E("c", SHARD1),
     "\"total_size\":123"},
    {"no metadata", E("x.y", SHARD1), NULL},
    {"metadata with other members", E("a", SHARD1), "\"total_parameters\":7,\"note\":\"n\","
     "\"total_size\":18446744073709551615"},
    {"whitespace between every token", " " E("a", SHARD1) " , \n\t" E("b", SHARD2) "\r\n",
     " \"total_size\" : 0 "},
    {"an empty weight_map", "", "\"total_size\":0"},
};

START_TEST(index_plain_and_strict_paths_give_the_same_index)
{
    const struct paths_row *r = &paths_rows[_i];
    char plain[1024], strict[1024], meta[512] = "";
    if (r->metadata)
        snprintf(meta, sizeof meta, "\"metadata\":{%s},", r->metadata);
    snprintf(plain, sizeof plain, "{%s\"weight_map\":{%s}}", meta, r->entries);
    snprintf(strict, sizeof strict, "{%s\"weight_map\":{%s},\"x\":[null]}", meta, r->entries);
    kl_index a, b;
    kl_err ea, eb;
    int ra = parse(&a, plain, &ea), rb = parse(&b, strict, &eb);
    ck_assert_msg(ra == 0 && rb == 0, "%s: plain %d (%s), strict %d (%s)", r->what, ra,
                  t_fmt_err(&ea), rb, t_fmt_err(&eb));
    ck_assert_msg(a.has_total_size == b.has_total_size && a.total_size == b.total_size &&
                  a.n_entries == b.n_entries && a.n_shards == b.n_shards,
                  "%s: the paths differ in size, entries or shards", r->what);
    for (size_t i = 0; i < a.n_entries; i++) {
        ck_assert_msg(!strcmp(a.entries[i].tensor, b.entries[i].tensor) &&
                      a.entries[i].shard == b.entries[i].shard, "%s: entry %zu differs",
                      r->what, i);
        ck_assert_int_eq(kl_index_shard_of(&a, b.entries[i].tensor), (int)a.entries[i].shard);
    }
    for (size_t i = 0; i < a.n_shards; i++)
        ck_assert_str_eq(a.shards[i], b.shards[i]);
    kl_index_free(&a);
    kl_index_free(&b);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* kl_index_open                                                                              */

START_TEST(index_open_reads_a_file)
{
    char path[2048];
    const char *json = INDEX("8", E("a", SHARD1));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmpdir);
    t_write(path, json, strlen(json));
    kl_index idx;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_index_open(&idx, path, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_int_eq(kl_index_shard_of(&idx, "a"), 0);
    kl_index_free(&idx);
}
END_TEST

START_TEST(index_open_names_the_file_in_parse_errors)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmpdir);
    t_write(path, "{}", 2);
    kl_index idx;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_index_open(&idx, path, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "IDX-JSON");
    ck_assert_str_eq(err.file, path);
}
END_TEST

START_TEST(index_open_reports_a_missing_file_as_io_error)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/nope.json", tmpdir);
    kl_index idx;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_index_open(&idx, path, &err), KL_E_IO);
    ck_assert_int_eq(err.sys_errno, ENOENT);
    ck_assert_str_eq(err.file, path);
    ck_assert_ptr_null(idx.entries);
}
END_TEST

START_TEST(index_open_rejects_a_directory)
{
    kl_index idx;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_index_open(&idx, tmpdir, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "FILE-NOT-REGULAR");
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Suite                                                                                      */

static Suite *index_suite(void)
{
    Suite *s = suite_create("index");
    TCase *tc = tcase_create("rules");
    tcase_add_loop_test(tc, index_rule_violations_are_rejected_with_their_rule, 0, N_RULE_ROWS);
    tcase_add_test(tc, index_utf8_error_reports_its_byte_offset);
    tcase_add_loop_test(tc, index_text_is_one_strict_json_object_with_integers_as_written, 0,
                        (int)(sizeof strict_rows / sizeof strict_rows[0]));
    tcase_add_test(tc, index_total_size_is_read_exactly_above_2_pow_53);
    suite_add_tcase(s, tc);

    tc = tcase_create("valid");
    tcase_add_test(tc, index_valid_file_maps_tensors_to_shards);
    tcase_add_test(tc, index_without_metadata_has_no_total_size);
    tcase_add_test(tc, index_empty_weight_map_is_valid);
    tcase_add_test(tc, index_extra_keys_and_whitespace_are_accepted);
    tcase_add_test(tc, index_total_size_zero_and_2_pow_53_are_accepted);
    tcase_add_test(tc, index_many_entries_are_all_found);
    tcase_add_loop_test(tc, index_plain_and_strict_paths_give_the_same_index, 0,
                        (int)(sizeof paths_rows / sizeof paths_rows[0]));
    suite_add_tcase(s, tc);

    tc = tcase_create("open");
    tcase_add_checked_fixture(tc, setup_tmp, teardown_tmp);
    tcase_add_test(tc, index_open_reads_a_file);
    tcase_add_test(tc, index_open_names_the_file_in_parse_errors);
    tcase_add_test(tc, index_open_reports_a_missing_file_as_io_error);
    tcase_add_test(tc, index_open_rejects_a_directory);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(index_suite());
}
