/*
 * tests/test_json.c — common/json: the strict JSON reader and the integer reader.
 *
 * The file kinds (config, index, safetensors header, tokenizer_config) test their own rule ids;
 * here: the text rules with their offsets, each number node keeping its own source text (the
 * tree and the text walked in step), the integer rules on that text, and the plain-subset
 * scanner (what it reads, what it declines).
 */
#include "common/json.h"
#include "tests/testutil.h"

#include <inttypes.h>

/* ---- the text rules ------------------------------------------------------------------------ */

static const struct text_row {
    const char *what;
    const char *text;
    size_t      len;    /* 0: strlen(text) */
    const char *rule;   /* NULL: accepted */
    uint64_t    offset; /* of the error */
} text_rows[] = {
    {"a value and whitespace", "{\"a\": [1, 2]} \t\r\n", 0, NULL, 0},
    {"a bare number", " 7 ", 0, NULL, 0},
    {"empty text", "", 0, "T-JSON", 0},
    {"whitespace only", " \n ", 0, "T-JSON", 3},
    {"bytes after the value", "{} x", 0, "T-JSON", 3},
    {"a second value", "[1][2]", 0, "T-JSON", 3},
    {"byte-order mark", "\xef\xbb\xbf{}", 0, "T-JSON", 0},
    {"NUL after the value", "{}\0", 3, "T-JSON", 2},
    {"NUL in a string", "[\"a\0b\"]", 6, "T-JSON", 3},
    {"escaped NUL in a string", "[\"a\\u0000\"]", 0, "T-JSON", 3},
    {"invalid UTF-8", "[\"ab\xff\"]", 0, "T-UTF8", 4},
    {"overlong UTF-8", "[\"\xc0\xaf\"]", 0, "T-UTF8", 2},
    {"leading zero", "[01]", 0, "T-JSON", 1},
    {"syntax error", "{\"a\" 1}", 0, "T-JSON", 5},
};

START_TEST(json_text_is_one_strict_value)
{
    const struct text_row *r = &text_rows[_i];
    cJSON *root = NULL;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_json_parse(r->text, r->len ? r->len : strlen(r->text), "T", &root, &err);
    if (!r->rule) {
        ck_assert_msg(rc == 0 && root, "%s: expected success, got %s", r->what, t_fmt_err(&err));
        cJSON_Delete(root);
        return;
    }
    ck_assert_msg(rc == KL_E_FORMAT && root == NULL, "%s: expected KL_E_FORMAT, got %d", r->what,
                  rc);
    ck_assert_msg(strcmp(err.rule, r->rule) == 0 && err.offset == r->offset,
                  "%s: expected [%s] @ %" PRIu64 ", got %s", r->what, r->rule, r->offset,
                  t_fmt_err(&err));
}
END_TEST

START_TEST(json_errors_name_the_line_of_a_multi_line_text)
{
    cJSON *root = NULL;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_json_parse("{\n\"a\": 1\n}\n{}", 13, "T", &root, &err), KL_E_FORMAT);
    ck_assert_msg(strstr(err.msg, "line 4") != NULL, "got %s", err.msg);
}
END_TEST

/* ---- number literals ----------------------------------------------------------------------- */

START_TEST(json_each_number_keeps_its_own_source_text)
{
    const char *text = "{\"a\": [1, 2.0, {\"b\": -3e0, \"s\": \"4 5\"}], \"a\": 6.4E1,"
                       " \"t\": true, \"n\": null, \"z\": [[0]]}";
    cJSON *root = NULL;
    kl_err err;
    ck_assert_int_eq(kl_json_parse(text, strlen(text), "T", &root, &err), 0);
    const cJSON *a = root->child, *a2 = a->next;
    ck_assert_str_eq(kl_json_number_text(cJSON_GetArrayItem(a, 0)), "1");
    ck_assert_str_eq(kl_json_number_text(cJSON_GetArrayItem(a, 1)), "2.0");
    ck_assert_str_eq(kl_json_number_text(cJSON_GetArrayItem(a, 2)->child), "-3e0");
    ck_assert_str_eq(kl_json_number_text(a2), "6.4E1"); /* a duplicate key: its own node */
    ck_assert_str_eq(kl_json_number_text(cJSON_GetObjectItem(root, "z")->child->child), "0");
    ck_assert_ptr_null(kl_json_number_text(cJSON_GetObjectItem(root, "t")));
    cJSON_Delete(root);
}
END_TEST

/* ---- integers ------------------------------------------------------------------------------ */

static const struct int_row {
    const char *text;
    uint64_t    max;
    kl_json_int want;
    uint64_t    value;
} int_rows[] = {
    {"0", 10, KL_JSON_INT_OK, 0},
    {"64", 64, KL_JSON_INT_OK, 64},
    {"281474976710655", 281474976710655ull, KL_JSON_INT_OK, 281474976710655ull},
    {"18446744073709551615", UINT64_MAX, KL_JSON_INT_OK, UINT64_MAX},
    {"65", 64, KL_JSON_INT_TOO_LARGE, 0},
    {"18446744073709551616", UINT64_MAX, KL_JSON_INT_TOO_LARGE, 0},
    {"64.0", 100, KL_JSON_INT_NOT_INTEGER, 0},
    {"6.4e1", 100, KL_JSON_INT_NOT_INTEGER, 0},
    {"64E0", 100, KL_JSON_INT_NOT_INTEGER, 0},
    {"-1.5", 100, KL_JSON_INT_NOT_INTEGER, 0},
    {"-1", 100, KL_JSON_INT_NEGATIVE, 0},
    {"-0", 100, KL_JSON_INT_NEGATIVE, 0},
    {"\"64\"", 100, KL_JSON_INT_NOT_NUMBER, 0},
    {"null", 100, KL_JSON_INT_NOT_NUMBER, 0},
};

START_TEST(json_integers_are_read_as_written)
{
    const struct int_row *r = &int_rows[_i];
    cJSON *root = NULL;
    kl_err err;
    ck_assert_int_eq(kl_json_parse(r->text, strlen(r->text), "T", &root, &err), 0);
    uint64_t v = 12345;
    kl_json_int got = kl_json_get_u64(root, r->max, &v);
    ck_assert_msg(got == r->want, "%s: expected %d (%s), got %d (%s)", r->text, r->want,
                  kl_json_int_why(r->want), got, kl_json_int_why(got));
    ck_assert_msg(v == (got ? 12345 : r->value), "%s: value %" PRIu64, r->text, v);
    cJSON_Delete(root);
}
END_TEST

START_TEST(json_built_numbers_read_as_their_shortest_text)
{
    cJSON *n = cJSON_CreateNumber(64), *f = cJSON_CreateNumber(64.5);
    uint64_t v = 0;
    ck_assert_int_eq(kl_json_get_u64(n, 100, &v), KL_JSON_INT_OK);
    ck_assert_uint_eq(v, 64);
    ck_assert_int_eq(kl_json_get_u64(f, 100, &v), KL_JSON_INT_NOT_INTEGER);
    ck_assert_int_eq(kl_json_get_u64(NULL, 100, &v), KL_JSON_INT_NOT_NUMBER);
    cJSON_Delete(n);
    cJSON_Delete(f);
}
END_TEST

/* ---- the plain subset ---------------------------------------------------------------------- */

/* A string or an integer at the start of text: read (ok 1, its bytes or value, rest what
 * follows) or declined (ok 0: the strict reader decides). */
static const struct scan_row {
    const char *what;
    const char *text;
    int         integer;   /* 1: kl_json_scan_u64 with max, 0: kl_json_scan_str */
    uint64_t    max;
    int         ok;
    const char *str;       /* the string read */
    uint64_t    value;     /* the integer read */
    const char *rest;
} scan_rows[] = {
    {"a plain string after whitespace", " \t\n\"model.a-1_b\":", 0, 0, 1, "model.a-1_b", 0, ":"},
    {"an empty string", "\"\"]", 0, 0, 1, "", 0, "]"},
    {"DEL is printable ASCII here", "\"a\x7f\"", 0, 0, 1, "a\x7f", 0, ""},
    {"an escape declines", "\"a\\u002e\"", 0, 0, 0, NULL, 0, NULL},
    {"an escaped quote declines", "\"a\\\"b\"", 0, 0, 0, NULL, 0, NULL},
    {"non-ASCII declines", "\"caf\xc3\xa9\"", 0, 0, 0, NULL, 0, NULL},
    {"a control byte declines", "\"a\tb\"", 0, 0, 0, NULL, 0, NULL},
    {"an unterminated string declines", "\"abc", 0, 0, 0, NULL, 0, NULL},
    {"not a string", "7", 0, 0, 0, NULL, 0, NULL},
    /* long enough for the 8-bytes-a-step loop, the stop at every place of a word */
    {"a long plain string", "\"model.layers.12.self_attn.kv_a_proj_with_mqa.weight\" ", 0, 0, 1,
     "model.layers.12.self_attn.kv_a_proj_with_mqa.weight", 0, " "},
    {"a quote ends a word", "\"abcdefg\"hij", 0, 0, 1, "abcdefg", 0, "hij"},
    {"a quote starts a word", "\"abcdefgh\"ij", 0, 0, 1, "abcdefgh", 0, "ij"},
    {"an escape in the second word", "\"abcdefghij\\u0041\"", 0, 0, 0, NULL, 0, NULL},
    {"non-ASCII in the second word", "\"abcdefghijk\xc3\xa9\"", 0, 0, 0, NULL, 0, NULL},
    {"a control byte in the third word", "\"abcdefghijklmnopq\x01rs\"", 0, 0, 0, NULL, 0,
     NULL},
    {"a space and DEL in full words", "\"a b c d \x7f\x7f\x7f\x7f~~~~!!!!\"", 0, 0, 1,
     "a b c d \x7f\x7f\x7f\x7f~~~~!!!!", 0, ""},
    {"an integer", " 4096,", 1, UINT64_MAX, 1, NULL, 4096, ","},
    {"zero", "0]", 1, UINT64_MAX, 1, NULL, 0, "]"},
    {"2^64-1", "18446744073709551615}", 1, UINT64_MAX, 1, NULL, UINT64_MAX, "}"},
    {"2^64 declines", "18446744073709551616", 1, UINT64_MAX, 0, NULL, 0, NULL},
    {"above max declines", "281474976710656", 1, 281474976710655ull, 0, NULL, 0, NULL},
    {"max itself", "281474976710655", 1, 281474976710655ull, 1, NULL, 281474976710655ull, ""},
    {"a leading zero declines", "01", 1, UINT64_MAX, 0, NULL, 0, NULL},
    {"a fraction declines", "1.0", 1, UINT64_MAX, 0, NULL, 0, NULL},
    {"an exponent declines", "1e3", 1, UINT64_MAX, 0, NULL, 0, NULL},
    {"a minus declines", "-1", 1, UINT64_MAX, 0, NULL, 0, NULL},
    {"minus zero declines", "-0", 1, UINT64_MAX, 0, NULL, 0, NULL},
    {"a string is not an integer", "\"1\"", 1, UINT64_MAX, 0, NULL, 0, NULL},
};

START_TEST(json_scan_reads_only_the_plain_subset)
{
    const struct scan_row *r = &scan_rows[_i];
    kl_json_scan sc = {r->text, r->text + strlen(r->text)};
    const char *at = NULL;
    size_t len = 0;
    uint64_t v = 12345;
    int ok = r->integer ? kl_json_scan_u64(&sc, r->max, &v) : kl_json_scan_str(&sc, &at, &len);
    ck_assert_msg(ok == r->ok, "%s: got %d, expected %d", r->what, ok, r->ok);
    if (!ok) {
        ck_assert_msg(v == 12345, "%s: value written on a decline", r->what);
        return;
    }
    if (r->integer)
        ck_assert_msg(v == r->value, "%s: %" PRIu64 ", expected %" PRIu64, r->what, v, r->value);
    else
        ck_assert_msg(len == strlen(r->str) && !memcmp(at, r->str, len), "%s: got %.*s",
                      r->what, (int)len, at);
    ck_assert_msg(!strcmp(sc.p, r->rest), "%s: rest '%s', expected '%s'", r->what, sc.p,
                  r->rest);
}
END_TEST

/* Members "key": integer <= 9 summed into the context; anything else declines. */
static int sum_member(void *ctx, kl_json_scan *s)
{
    const char *k;
    size_t n;
    uint64_t v;
    if (!kl_json_scan_str(s, &k, &n) || !kl_json_scan_char(s, ':') || !kl_json_scan_u64(s, 9, &v))
        return 0;
    *(uint64_t *)ctx += v;
    return 1;
}

START_TEST(json_scan_lists_read_members_to_the_close)
{
    static const struct {
        const char *text;
        int         ok;
        uint64_t    sum;
        int         at_end;
    } rows[] = {
        {" { \"a\" : 1 , \"b\":2}  \n", 1, 3, 1},
        {"{}", 1, 0, 1},
        {"{ }x", 1, 0, 0},
        {"{\"a\":1,}", 0, 0, 0},         /* a trailing comma */
        {"{\"a\":1 \"b\":2}", 0, 0, 0},  /* no comma */
        {"{\"a\":1", 0, 0, 0},           /* no close */
        {"{\"a\":10}", 0, 0, 0},         /* the item declines */
        {"[\"a\":1]", 0, 0, 0},          /* not the open asked for */
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        kl_json_scan sc = {rows[i].text, rows[i].text + strlen(rows[i].text)};
        uint64_t sum = 0;
        int ok = kl_json_scan_list(&sc, '{', '}', sum_member, &sum);
        ck_assert_msg(ok == rows[i].ok, "%s: %d", rows[i].text, ok);
        if (ok)
            ck_assert_msg(sum == rows[i].sum && kl_json_scan_at_end(&sc) == rows[i].at_end,
                          "%s: sum %" PRIu64, rows[i].text, sum);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("json");
    TCase *tc = tcase_create("text");
    tcase_add_loop_test(tc, json_text_is_one_strict_value, 0,
                        (int)(sizeof text_rows / sizeof text_rows[0]));
    tcase_add_test(tc, json_errors_name_the_line_of_a_multi_line_text);
    tcase_add_test(tc, json_each_number_keeps_its_own_source_text);
    suite_add_tcase(s, tc);
    tc = tcase_create("integers");
    tcase_add_loop_test(tc, json_integers_are_read_as_written, 0,
                        (int)(sizeof int_rows / sizeof int_rows[0]));
    tcase_add_test(tc, json_built_numbers_read_as_their_shortest_text);
    suite_add_tcase(s, tc);
    tc = tcase_create("plain subset");
    tcase_add_loop_test(tc, json_scan_reads_only_the_plain_subset, 0,
                        (int)(sizeof scan_rows / sizeof scan_rows[0]));
    tcase_add_test(tc, json_scan_lists_read_members_to_the_close);
    suite_add_tcase(s, tc);
    return t_run_suite(s);
}
