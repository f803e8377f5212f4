/*
 * tests/test_safetensors.c — loader/safetensors and loader/dtype.
 *
 * Headers are built in memory for kl_st_parse; kl_st_open gets tiny files in a temp directory.
 * Rule tests are loop tests over one table, one row per violation, asserting the rule id, the
 * tensor named by the error and that nothing leaks (kl_mem_in_use back to where it started).
 */
#include "common/mem.h"
#include "common/numfmt.h"
#include "loader/dtype.h"
#include "loader/safetensors.h"
#include "tests/testutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

/* One tensor entry: T("a", "F32", "[2]", "0,8"). */
#define T(name, dt, shape, offs)                                                              \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" offs "]}"
#define META_PT "\"__metadata__\":{\"format\":\"pt\"}"

/* Parses json as the header of a file whose data section is data_bytes long (negative: the
 * file is that much shorter than 8 + N). */
static int parse_mem(kl_st_file *f, const char *json, size_t n, int64_t data_bytes, kl_err *err)
{
    kl_err_clear(err);
    uint64_t file_bytes = (uint64_t)((int64_t)(8 + n) + data_bytes);
    return kl_st_parse(f, "mem.safetensors", (const uint8_t *)json, n, file_bytes, err);
}

static int parse_str(kl_st_file *f, const char *json, int64_t data_bytes, kl_err *err)
{
    return parse_mem(f, json, strlen(json), data_bytes, err);
}


/* Writes an 8-byte length, the header, then data_bytes zero bytes. */
static void write_st(const char *path, const char *json, uint64_t n, uint64_t data_bytes)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_msg(fp != NULL, "cannot create %s", path);
    uint8_t prefix[8];
    kl_store_le64(prefix, n);
    ck_assert(fwrite(prefix, 1, 8, fp) == 8);
    ck_assert(fwrite(json, 1, strlen(json), fp) == strlen(json));
    for (uint64_t i = 0; i < data_bytes; i++)
        ck_assert(fputc(0, fp) == 0);
    fclose(fp);
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

static void tmp_path(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tmpdir, name);
}

/* ------------------------------------------------------------------------------------------ */
/* dtype                                                                                      */

static const struct {
    const char *name;
    unsigned    bits;
    int         is_float;
} dtype_rows[KL_DT_COUNT] = {
    {"BOOL", 8, 0},        {"F4", 4, 0},           {"F6_E2M3", 6, 0},     {"F6_E3M2", 6, 0},
    {"U8", 8, 0},          {"I8", 8, 0},           {"F8_E5M2", 8, 1},     {"F8_E4M3", 8, 1},
    {"F8_E8M0", 8, 0},     {"F8_E4M3FNUZ", 8, 1},  {"F8_E5M2FNUZ", 8, 1}, {"I16", 16, 0},
    {"U16", 16, 0},        {"F16", 16, 1},         {"BF16", 16, 1},       {"I32", 32, 0},
    {"U32", 32, 0},        {"F32", 32, 1},         {"C64", 64, 0},        {"F64", 64, 1},
    {"I64", 64, 0},        {"U64", 64, 0},
};

START_TEST(dtype_strings_parse_to_their_enum_with_the_right_bits)
{
    int d = _i;
    const char *s = dtype_rows[d].name;
    kl_dtype got = kl_dtype_parse(s, strlen(s));
    ck_assert_msg(got == (kl_dtype)d, "parse(%s): expected %d, got %d", s, d, (int)got);
    ck_assert_msg(strcmp(kl_dtype_name(got), s) == 0, "name(%d): expected %s, got %s", d, s,
                  kl_dtype_name(got));
    ck_assert_msg(kl_dtype_bits(got) == dtype_rows[d].bits, "bits(%s): expected %u, got %u", s,
                  dtype_rows[d].bits, kl_dtype_bits(got));
    ck_assert_msg(kl_dtype_is_float(got) == dtype_rows[d].is_float,
                  "is_float(%s): expected %d, got %d", s, dtype_rows[d].is_float,
                  kl_dtype_is_float(got));
}
END_TEST

START_TEST(dtype_unknown_strings_and_values_are_invalid)
{
    const char *bad[] = {"", "bf16", "F32 ", "F3", "F322", "FLOAT", "F8_E4M3FN", "BF16\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(kl_dtype_parse(bad[i], strlen(bad[i])) == KL_DT_INVALID,
                      "parse(\"%s\") should be invalid", bad[i]);
    /* len limits the bytes used: "BF16x" with len 4 is BF16. */
    ck_assert(kl_dtype_parse("BF16x", 4) == KL_DT_BF16);
    ck_assert(kl_dtype_parse(NULL, 0) == KL_DT_INVALID);
    ck_assert_str_eq(kl_dtype_name(KL_DT_INVALID), "?");
    ck_assert_str_eq(kl_dtype_name(KL_DT_COUNT), "?");
    ck_assert_uint_eq(kl_dtype_bits(KL_DT_INVALID), 0);
    ck_assert_int_eq(kl_dtype_is_float(KL_DT_INVALID), 0);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Rule table                                                                                 */

typedef struct rule_row {
    const char *what;       /* the case, as a sentence fragment */
    const char *json;       /* header text (NUL-terminated; no embedded NUL) */
    int64_t     data_bytes; /* data section length; negative = file shorter than 8 + N */
    const char *rule;       /* expected kl_err.rule */
    const char *tensor;     /* expected kl_err.tensor, "" for none */
} rule_row;

static const rule_row rule_rows[] = {
    {"8 + N past the file end", "{}", -1, "ST-HEADER-LENGTH", ""},
    /* UTF-8 */
    {"invalid byte 0xff", "{\"\xff\":{}}", 0, "ST-UTF8", ""},
    {"overlong NUL", "{\"\xc0\x80\":{}}", 0, "ST-UTF8", ""},
    {"UTF-8-encoded surrogate", "{\"\xed\xa0\x80\":{}}", 0, "ST-UTF8", ""},
    {"code point above U+10FFFF", "{\"\xf4\x90\x80\x80\":{}}", 0, "ST-UTF8", ""},
    {"truncated sequence", "{\"a\xe2\x82\":{}}", 0, "ST-UTF8", ""},
    {"lone continuation byte", "{\"\x80\":{}}", 0, "ST-UTF8", ""},
    /* JSON */
    {"empty header", "", 0, "ST-JSON", ""},
    {"whitespace-only header", "   ", 0, "ST-JSON", ""},
    {"array at top level", "[]", 0, "ST-JSON", ""},
    {"not JSON", "not json", 0, "ST-JSON", ""},
    {"byte-order mark", "\xef\xbb\xbf{}", 0, "ST-JSON", ""},
    {"unterminated object", "{\"a\":1", 0, "ST-JSON", ""},
    {"garbage after the object", "{} x", 0, "ST-JSON", ""},
    {"two objects", "{}{}", 0, "ST-JSON", ""},
    {"control byte after the object", "{}\x01", 0, "ST-JSON", ""},
    {"leading zero in a number", "{" T("a", "F32", "[01]", "0,4") "}", 4, "ST-JSON", ""},
    {"number ending in a dot", "{" T("a", "F32", "[1.]", "0,4") "}", 4, "ST-JSON", ""},
    {"NaN literal", "{\"a\":NaN}", 0, "ST-JSON", ""},
    {"raw control character in a name", "{\"a\x01\":{}}", 0, "ST-JSON", ""},
    {"raw tab in a string", "{\"a\tb\":{}}", 0, "ST-JSON", ""},
    {"control character between tokens", "{\x01}", 0, "ST-JSON", ""},
    {"escaped NUL in a name", "{\"a\\u0000b\":{}}", 0, "ST-JSON", ""},
    {"lone surrogate escape", "{\"\\ud800\":{}}", 0, "ST-JSON", ""},
    {"tensor entry is a number", "{\"a\":5}", 0, "ST-JSON", "a"},
    {"tensor entry is an array", "{\"a\":[0,4]}", 0, "ST-JSON", "a"},
    /* dtype */
    {"unknown dtype", "{" T("a", "F33", "[1]", "0,4") "}", 4, "ST-DTYPE", "a"},
    {"lowercase dtype", "{" T("a", "bf16", "[1]", "0,2") "}", 2, "ST-DTYPE", "a"},
    {"missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "ST-DTYPE", "a"},
    {"numeric dtype", "{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "ST-DTYPE", "a"},
    /* shape */
    {"missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "ST-SHAPE", "a"},
    {"shape is a string", "{" T("a", "F32", "\"1\"", "0,4") "}", 4, "ST-SHAPE", "a"},
    {"negative dimension", "{" T("a", "F32", "[-1]", "0,4") "}", 4, "ST-SHAPE", "a"},
    {"fractional dimension", "{" T("a", "F32", "[1.5]", "0,4") "}", 4, "ST-SHAPE", "a"},
    {"dimension 2^48", "{" T("a", "F32", "[281474976710656]", "0,4") "}", 4, "ST-SHAPE", "a"},
    {"dimension 1e300", "{" T("a", "F32", "[1e300]", "0,4") "}", 4, "ST-SHAPE", "a"},
    {"rank 9", "{" T("a", "U8", "[1,1,1,1,1,1,1,1,1]", "0,1") "}", 1, "ST-SHAPE", "a"},
    {"string dimension", "{" T("a", "F32", "[\"1\"]", "0,4") "}", 4, "ST-SHAPE", "a"},
    {"null dimension", "{" T("a", "F32", "[null]", "0,4") "}", 4, "ST-SHAPE", "a"},
    /* data_offsets */
    {"missing data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "ST-OFFSETS", "a"},
    {"one offset", "{" T("a", "F32", "[1]", "0") "}", 4, "ST-OFFSETS", "a"},
    {"three offsets", "{" T("a", "F32", "[1]", "0,4,8") "}", 8, "ST-OFFSETS", "a"},
    {"end before begin", "{" T("a", "F32", "[1]", "8,4") "}", 8, "ST-OFFSETS", "a"},
    {"negative offset", "{" T("a", "F32", "[1]", "-4,0") "}", 4, "ST-OFFSETS", "a"},
    {"fractional offset", "{" T("a", "F32", "[1]", "0,4.5") "}", 4, "ST-OFFSETS", "a"},
    {"offset 2^48", "{" T("a", "F32", "[1]", "0,281474976710656") "}", 4, "ST-OFFSETS", "a"},
    {"string offset", "{" T("a", "F32", "[1]", "0,\"4\"") "}", 4, "ST-OFFSETS", "a"},
    {"offsets as a string", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0,4\"}}",
     4, "ST-OFFSETS", "a"},
    /* fields */
    {"unknown field", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}",
     4, "ST-FIELD", "a"},
    {"field twice", "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],"
                    "\"data_offsets\":[0,4]}}",
     4, "ST-FIELD", "a"},
    {"unknown field with an escaped newline and ESC in its name",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\\n\\u001b[2J\":1}}", 4,
     "ST-FIELD", "a"},
    /* __metadata__ */
    {"number metadata value", "{\"__metadata__\":{\"n\":1}}", 0, "ST-METADATA", ""},
    {"object metadata value", "{\"__metadata__\":{\"n\":{}}}", 0, "ST-METADATA", ""},
    {"null metadata value", "{\"__metadata__\":{\"n\":null}}", 0, "ST-METADATA",
     ""},
    {"metadata key twice", "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "ST-METADATA",
     ""},
    {"metadata is a string", "{\"__metadata__\":\"pt\"}", 0, "ST-NAME", "__metadata__"},
    {"metadata is an array", "{\"__metadata__\":[]}", 0, "ST-NAME", "__metadata__"},
    {"tensor named __metadata__", "{" T("__metadata__", "F32", "[1]", "0,4") "}", 4, "ST-NAME",
     "__metadata__"},
    {"empty tensor name", "{" T("", "F32", "[1]", "0,4") "}", 4, "ST-NAME", ""},
    /* duplicates */
    {"tensor name twice", "{" T("a", "F32", "[1]", "0,4") "," T("a", "F32", "[1]", "4,8") "}", 8,
     "ST-DUPLICATE", "a"},
    {"identical zero-size entries", "{" T("z", "F32", "[0]", "0,0") "," T("z", "F32", "[0]",
                                                                           "0,0") "}",
     0, "ST-DUPLICATE", "z"},
    {"__metadata__ twice", "{" META_PT "," META_PT "}", 0, "ST-DUPLICATE", ""},
    /* sizes */
    {"shape product overflow",
     "{" T("a", "U8", "[281474976710655,281474976710655]", "0,1") "}", 1, "ST-OVERFLOW", "a"},
    {"bit size overflow", "{" T("a", "F64", "[4294967296,1073741824]", "0,8") "}", 8,
     "ST-OVERFLOW", "a"},
    {"F4 with an odd element count", "{" T("a", "F4", "[3]", "0,2") "}", 2, "ST-MISALIGNED",
     "a"},
    {"F6 single element", "{" T("a", "F6_E2M3", "[1]", "0,1") "}", 1, "ST-MISALIGNED", "a"},
    {"span shorter than shape", "{" T("a", "F32", "[2]", "0,4") "}", 4, "ST-SIZE", "a"},
    {"scalar with two elements' bytes", "{" T("a", "BF16", "[]", "0,4") "}", 4, "ST-SIZE", "a"},
    {"zero-size tensor with bytes", "{" T("a", "F32", "[0,4]", "0,4") "}", 4, "ST-SIZE", "a"},
    /* layout */
    {"data section starts with a hole", "{" T("a", "F32", "[2]", "4,12") "}", 12,
     "ST-OFFSET-GAP", "a"},
    {"hole between tensors", "{" T("a", "F32", "[2]", "0,8") "," T("b", "F32", "[1]", "12,16") "}",
     16, "ST-OFFSET-GAP", "b"},
    {"overlapping tensors", "{" T("b", "F32", "[2]", "4,12") "," T("a", "F32", "[2]", "0,8") "}",
     12, "ST-OFFSET-GAP", "b"},
    {"trailing bytes after the data", "{" T("a", "F32", "[2]", "0,8") "}", 16, "ST-FILE-LENGTH",
     ""},
    {"truncated data section", "{" T("a", "F32", "[2]", "0,8") "}", 4, "ST-FILE-LENGTH", "a"},
    {"data section without tensors", "{}", 1, "ST-FILE-LENGTH", ""},
};
#define N_RULE_ROWS ((int)(sizeof rule_rows / sizeof rule_rows[0]))

START_TEST(st_header_rule_violations_are_rejected_with_their_rule)
{
    const rule_row *r = &rule_rows[_i];
    kl_st_file f;
    kl_err err;
    size_t mem0 = kl_mem_in_use();
    int rc = parse_str(&f, r->json, r->data_bytes, &err);
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
    ck_assert_msg(strcmp(err.file, "mem.safetensors") == 0, "%s: expected file context, got %s",
                  r->what, err.file);
    ck_assert_msg(err.msg[0] && !t_has_control(err.msg) && !t_has_control(t_fmt_err(&err)),
                  "%s: message must be one printable line: %s", r->what, err.msg);
    ck_assert_msg(f.tensors == NULL && f.n_tensors == 0 && f.strings == NULL && f.path == NULL,
                  "%s: kl_st_file must be zeroed on failure", r->what);
    ck_assert_msg(kl_mem_in_use() == mem0, "%s: %zu bytes leaked", r->what,
                  kl_mem_in_use() - mem0);
}
END_TEST

START_TEST(st_error_text_escapes_control_characters_of_names)
{
    /* The tensor name is kept raw in kl_err.tensor; the rendered line escapes it. */
    const char *json = "{\"a\\nb\":{\"dtype\":\"F32\"}}";
    kl_st_file f;
    kl_err err;
    ck_assert_int_eq(parse_str(&f, json, 0, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.tensor, "a\nb");
    ck_assert_msg(strstr(t_fmt_err(&err), "tensor a\\nb") != NULL, "got: %s", t_fmt_err(&err));
}
END_TEST

START_TEST(st_offset_rules_report_the_file_offset_of_the_tensor)
{
    /* b begins at data offset 12 with a hole before it: file offset = 8 + N + 12. */
    const char *json = "{" T("a", "F32", "[2]", "0,8") "," T("b", "F32", "[1]", "12,16") "}";
    kl_st_file f;
    kl_err err;
    ck_assert_int_eq(parse_str(&f, json, 16, &err), KL_E_FORMAT);
    uint64_t want = 8 + strlen(json) + 12;
    ck_assert_msg(err.offset == want, "expected offset %" PRIu64 ", got %" PRIu64, want,
                  err.offset);
}
END_TEST

START_TEST(st_utf8_errors_report_the_byte_offset_in_the_file)
{
    const char *json = "{\"ab\xff\":{}}";
    kl_st_file f;
    kl_err err;
    ck_assert_int_eq(parse_str(&f, json, 0, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "ST-UTF8");
    ck_assert_msg(err.offset == 8 + 4, "expected offset 12, got %" PRIu64, err.offset);
}
END_TEST

START_TEST(st_embedded_nul_byte_in_header_is_rejected)
{
    const char json[] = "{\"a\0\":{}}";
    kl_st_file f;
    kl_err err;
    ck_assert_int_eq(parse_mem(&f, json, sizeof json - 1, 0, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "ST-JSON");
}
END_TEST

/* Exactly one JSON object plus whitespace, UTF-8 without BOM or NUL, shapes and offsets written
 * as integers (issue 9 defect 5).  Base: one F32 tensor of shape [2] at data offsets 0..8. */
static const char STRICT_BASE[] = "{" META_PT "," T("a", "F32", "[2]", "0,8") "}";
static const struct strict_row {
    t_json_case c;
    int64_t     data_bytes;
    const char *tensor; /* expected kl_err.tensor */
} strict_rows[] = {
    {{"garbage after the object", "]}}", "]}} x", 0, "ST-JSON"}, 8, ""},
    {{"a second object", "]}}", "]}}{}", 0, "ST-JSON"}, 8, ""},
    {{"byte-order mark", "{\"__meta", "\xef\xbb\xbf{\"__meta", 0, "ST-JSON"}, 8, ""},
    {{"NUL after the object", "]}}", "]}}\0", 4, "ST-JSON"}, 8, ""},
    {{"NUL in a metadata value", "\"pt\"", "\"p\0t\"", 5, "ST-JSON"}, 8, ""},
    {{"invalid UTF-8 in a metadata value", "\"pt\"", "\"p\xc3t\"", 0, "ST-UTF8"}, 8, ""},
    {{"dimension written 2.0", "[2]", "[2.0]", 0, "ST-SHAPE"}, 8, "a"},
    {{"dimension written 2e0", "[2]", "[2e0]", 0, "ST-SHAPE"}, 8, "a"},
    {{"dimension written 0.2E1", "[2]", "[0.2E1]", 0, "ST-SHAPE"}, 8, "a"},
    {{"offset written 8.0", "[0,8]", "[0,8.0]", 0, "ST-OFFSETS"}, 8, "a"},
    {{"offset written 6.4e1 / 8", "[0,8]", "[0,0.8e1]", 0, "ST-OFFSETS"}, 8, "a"},
    {{"offset written -0", "[0,8]", "[-0,8]", 0, "ST-OFFSETS"}, 8, "a"},
    {{"whitespace after the object", "]}}", "]}} \n\t\r", 0, NULL}, 8, ""},
    {{"dimensions 0 and 2^48-1", "[2],\"data_offsets\":[0,8]",
      "[0,281474976710655],\"data_offsets\":[0,0]", 0, NULL}, 0, ""},
    {{"offsets 0 and 2^48-1 (a U8 file that large, in memory)",
      "\"F32\",\"shape\":[2],\"data_offsets\":[0,8]",
      "\"U8\",\"shape\":[281474976710655],\"data_offsets\":[0,281474976710655]", 0, NULL},
     281474976710655, ""},
};

START_TEST(st_header_is_one_strict_json_object_with_integers_as_written)
{
    const struct strict_row *r = &strict_rows[_i];
    size_t len;
    char *json = t_json_splice(STRICT_BASE, &r->c, &len);
    kl_st_file f;
    kl_err err;
    int rc = parse_mem(&f, json, len, r->data_bytes, &err);
    free(json);
    t_json_case_check(&r->c, rc, &err, r->tensor);
    kl_st_close(&f);
}
END_TEST

START_TEST(st_file_shorter_than_8_bytes_is_rejected_in_memory)
{
    kl_st_file f;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_st_parse(&f, "x", (const uint8_t *)"{}", 0, 7, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "ST-HEADER-SMALL");
}
END_TEST

START_TEST(st_header_above_100_mb_is_rejected_before_reading_it)
{
    /* The length check comes first: the 1-byte buffer is never read past. */
    kl_st_file f;
    kl_err err;
    kl_err_clear(&err);
    uint64_t n = KL_ST_MAX_HEADER + 1;
    ck_assert_int_eq(kl_st_parse(&f, "x", (const uint8_t *)"{", n, n + 8, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "ST-HEADER-LARGE");
}
END_TEST

START_TEST(st_null_err_is_accepted)
{
    kl_st_file f;
    const char *json = "{\"a\":5}";
    ck_assert_int_eq(kl_st_parse(&f, NULL, (const uint8_t *)json, strlen(json),
                                 8 + strlen(json), NULL),
                     KL_E_FORMAT);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Valid headers                                                                              */

START_TEST(st_valid_header_is_parsed_sorted_and_indexed)
{
    /* Listed out of offset order on purpose: the table comes back sorted by begin. */
    const char *json = "{" META_PT "," T("b.weight", "BF16", "[2,3]", "16,28") ","
                       T("a.bias", "F32", "[4]", "0,16") "}";
    kl_st_file f;
    kl_err err;
    size_t n = strlen(json);
    int rc = parse_str(&f, json, 28, &err);
    ck_assert_msg(rc == 0, "expected success, got %d (%s)", rc, t_fmt_err(&err));
    ck_assert_uint_eq(f.n_tensors, 2);
    ck_assert_uint_eq(f.header_bytes, n);
    ck_assert_uint_eq(f.data_off, 8 + n);
    ck_assert_uint_eq(f.file_bytes, 8 + n + 28);
    ck_assert_str_eq(f.path, "mem.safetensors");
    ck_assert_str_eq(f.tensors[0].name, "a.bias");
    ck_assert_str_eq(f.tensors[1].name, "b.weight");
    const kl_st_tensor *t = kl_st_find(&f, "b.weight");
    ck_assert_ptr_eq(t, &f.tensors[1]);
    ck_assert_int_eq(t->dtype, KL_DT_BF16);
    ck_assert_int_eq(t->rank, 2);
    ck_assert_uint_eq(t->shape[0], 2);
    ck_assert_uint_eq(t->shape[1], 3);
    ck_assert_uint_eq(t->numel, 6);
    ck_assert_uint_eq(t->begin, 16);
    ck_assert_uint_eq(t->end, 28);
    ck_assert_uint_eq(t->n_bytes, 12);
    ck_assert_uint_eq(t->file_off, 8 + n + 16);
    ck_assert_ptr_eq(kl_st_find(&f, "a.bias"), &f.tensors[0]);
    ck_assert_ptr_null(kl_st_find(&f, "missing"));
    ck_assert_ptr_null(kl_st_find(&f, NULL));
    ck_assert_int_eq(f.has_metadata, 1);
    ck_assert_uint_eq(f.n_meta, 1);
    ck_assert_str_eq(kl_st_meta_get(&f, "format"), "pt");
    ck_assert_ptr_null(kl_st_meta_get(&f, "other"));
    ck_assert_uint_eq(f.warnings, 0);
    kl_st_close(&f);
    ck_assert_ptr_null(f.tensors);
    kl_st_close(&f); /* idempotent */
}
END_TEST

START_TEST(st_empty_metadata_object_is_accepted)
{
    const char *json = "{\"__metadata__\":{}," T("w", "F16", "[2]", "0,4") "}";
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, json, 4, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_int_eq(f.has_metadata, 1);
    ck_assert_uint_eq(f.n_meta, 0);
    ck_assert_uint_eq(f.warnings & KL_ST_WARN_NO_METADATA, 0);
    ck_assert_ptr_null(kl_st_meta_get(&f, "format"));
    kl_st_close(&f);
}
END_TEST

START_TEST(st_missing_metadata_gives_a_warning_only)
{
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, "{" T("w", "U8", "[3]", "0,3") "}", 3, &err) == 0, "%s",
                  t_fmt_err(&err));
    ck_assert_int_eq(f.has_metadata, 0);
    ck_assert_uint_eq(f.warnings, KL_ST_WARN_NO_METADATA);
    kl_st_close(&f);
}
END_TEST

START_TEST(st_metadata_entries_keep_file_order)
{
    const char *json = "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"caf\\u00e9\",\"\":\"\"}}";
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, json, 0, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(f.n_meta, 3);
    ck_assert_str_eq(f.meta[0].key, "format");
    ck_assert_str_eq(f.meta[1].key, "note");
    ck_assert_str_eq(f.meta[1].value, "caf\xc3\xa9");
    ck_assert_str_eq(kl_st_meta_get(&f, ""), "");
    kl_st_close(&f);
}
END_TEST

START_TEST(st_header_without_tensors_is_valid)
{
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, "{}", 0, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(f.n_tensors, 0);
    ck_assert_ptr_null(kl_st_find(&f, "a"));
    kl_st_close(&f);
}
END_TEST

START_TEST(st_zero_size_tensors_are_accepted_anywhere)
{
    /* Zero-size tensors occupy no bytes: they may sit at 0, between tensors and at the end. */
    const char *json = "{" T("z0", "F32", "[0]", "0,0") "," T("a", "F32", "[1]", "0,4") ","
                       T("z1", "BF16", "[3,0,2]", "4,4") "," T("z2", "U8", "[0]", "4,4") ","
                       T("b", "U8", "[2]", "4,6") "," T("z3", "F4", "[0]", "6,6") "}";
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, json, 6, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(f.n_tensors, 6);
    const char *order[] = {"z0", "a", "z1", "z2", "b", "z3"};
    for (int i = 0; i < 6; i++)
        ck_assert_msg(strcmp(f.tensors[i].name, order[i]) == 0, "slot %d: expected %s, got %s",
                      i, order[i], f.tensors[i].name);
    const kl_st_tensor *z1 = kl_st_find(&f, "z1");
    ck_assert_uint_eq(z1->numel, 0);
    ck_assert_uint_eq(z1->n_bytes, 0);
    kl_st_close(&f);
}
END_TEST

START_TEST(st_rank0_scalar_has_one_element)
{
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, "{" T("s", "F32", "[]", "0,4") "}", 4, &err) == 0, "%s",
                  t_fmt_err(&err));
    ck_assert_int_eq(f.tensors[0].rank, 0);
    ck_assert_uint_eq(f.tensors[0].numel, 1);
    ck_assert_uint_eq(f.tensors[0].n_bytes, 4);
    kl_st_close(&f);
}
END_TEST

START_TEST(st_rank8_and_largest_dimension_are_accepted)
{
    const char *json = "{" T("r8", "U8", "[1,1,1,1,1,1,1,2]", "0,2") ","
                       T("big", "U8", "[281474976710655,0]", "2,2") "}";
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, json, 2, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_int_eq(kl_st_find(&f, "r8")->rank, 8);
    ck_assert_uint_eq(kl_st_find(&f, "big")->shape[0], KL_ST_MAX_DIM);
    kl_st_close(&f);
}
END_TEST

START_TEST(st_all_22_dtypes_are_accepted)
{
    /* One tensor of 8 elements per dtype, back to back. */
    char json[4096];
    size_t used = 0;
    uint64_t off = 0;
    used += (size_t)snprintf(json + used, sizeof json - used, "{");
    for (int d = 0; d < KL_DT_COUNT; d++) {
        uint64_t bytes = 8 * kl_dtype_bits((kl_dtype)d) / 8;
        used += (size_t)snprintf(json + used, sizeof json - used,
                                 "%s\"t%d\":{\"dtype\":\"%s\",\"shape\":[8],"
                                 "\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                                 d ? "," : "", d, kl_dtype_name((kl_dtype)d), off, off + bytes);
        off += bytes;
    }
    snprintf(json + used, sizeof json - used, "}");
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, json, (int64_t)off, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(f.n_tensors, KL_DT_COUNT);
    for (int d = 0; d < KL_DT_COUNT; d++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", d);
        const kl_st_tensor *t = kl_st_find(&f, name);
        ck_assert_msg(t && t->dtype == (kl_dtype)d, "%s: expected dtype %s", name,
                      kl_dtype_name((kl_dtype)d));
        ck_assert_uint_eq(t->n_bytes, kl_dtype_bits((kl_dtype)d));
    }
    kl_st_close(&f);
}
END_TEST

START_TEST(st_f4_with_even_element_count_is_accepted)
{
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, "{" T("q", "F4", "[3,2]", "0,3") "}", 3, &err) == 0, "%s",
                  t_fmt_err(&err));
    ck_assert_uint_eq(f.tensors[0].numel, 6);
    ck_assert_uint_eq(f.tensors[0].n_bytes, 3);
    kl_st_close(&f);
}
END_TEST

START_TEST(st_leading_whitespace_is_accepted_with_a_warning)
{
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, " \t\r\n{" META_PT "}", 0, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(f.warnings, KL_ST_WARN_LEADING_SPACE);
    kl_st_close(&f);
}
END_TEST

START_TEST(st_trailing_space_padding_is_accepted_silently)
{
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, "{" META_PT "}      \n", 0, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(f.warnings, 0);
    kl_st_close(&f);
}
END_TEST

START_TEST(st_utf8_and_escaped_names_are_decoded)
{
    const char *json = "{" T("caf\xc3\xa9.\xf0\x9f\x98\x80", "U8", "[1]", "0,1") ","
                       T("q\\\"\\u00e9\\ud83d\\ude00", "U8", "[1]", "1,2") "}";
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_str(&f, json, 2, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_ptr_nonnull(kl_st_find(&f, "caf\xc3\xa9.\xf0\x9f\x98\x80"));
    ck_assert_ptr_nonnull(kl_st_find(&f, "q\"\xc3\xa9\xf0\x9f\x98\x80"));
    kl_st_close(&f);
}
END_TEST

START_TEST(st_header_above_hub_limit_gives_a_warning)
{
    size_t n = (size_t)KL_ST_HUB_MAX_HEADER + 1;
    char *json = malloc(n);
    ck_assert_ptr_nonnull(json);
    memset(json, ' ', n);
    memcpy(json, "{}", 2);
    kl_st_file f;
    kl_err err;
    ck_assert_msg(parse_mem(&f, json, n, 0, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(f.warnings & KL_ST_WARN_HUB_LIMIT, KL_ST_WARN_HUB_LIMIT);
    kl_st_close(&f);
    free(json);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* kl_st_open                                                                                 */

START_TEST(st_open_reads_a_valid_file)
{
    char path[2048];
    const char *json = "{" META_PT "," T("w", "F32", "[2,2]", "0,16") "}";
    tmp_path(path, sizeof path, "model.safetensors");
    write_st(path, json, strlen(json), 16);
    kl_st_file f;
    kl_err err;
    kl_err_clear(&err);
    size_t mem0 = kl_mem_in_use();
    ck_assert_msg(kl_st_open(&f, path, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_str_eq(f.path, path);
    ck_assert_uint_eq(f.n_tensors, 1);
    ck_assert_uint_eq(f.file_bytes, 8 + strlen(json) + 16);
    ck_assert_uint_eq(f.tensors[0].file_off, 8 + strlen(json));
    kl_st_close(&f);
    ck_assert_uint_eq(kl_mem_in_use(), mem0);
}
END_TEST

typedef struct file_row {
    const char *what;
    const char *json;       /* header text written after the prefix */
    uint64_t    n;          /* length prefix written (may lie); JSON_LEN = the true length */
    uint64_t    data_bytes; /* zero bytes written after the header */
    const char *rule;
    const char *tensor;
} file_row;

#define GOOD_HDR "{" T("w", "F32", "[2]", "0,8") "}"
#define JSON_LEN UINT64_MAX
static const file_row file_rows[] = {
    {"empty file", NULL, 0, 0, "ST-HEADER-SMALL", ""},
    {"5-byte file", "", 0, 0, "ST-HEADER-SMALL", ""},
    {"header length above 100 MB", "{}", KL_ST_MAX_HEADER + 1, 0, "ST-HEADER-LARGE", ""},
    {"header length past the end", "{}", 100, 0, "ST-HEADER-LENGTH", ""},
    {"truncated data", GOOD_HDR, JSON_LEN, 4, "ST-FILE-LENGTH", "w"},
    {"trailing bytes", GOOD_HDR, JSON_LEN, 12, "ST-FILE-LENGTH", ""},
    {"hole in the data", "{" T("w", "F32", "[2]", "4,12") "}", JSON_LEN, 12,
     "ST-OFFSET-GAP", "w"},
};

START_TEST(st_open_rejects_broken_files_with_their_rule)
{
    const file_row *r = &file_rows[_i];
    char path[2048];
    tmp_path(path, sizeof path, "bad.safetensors");
    if (!r->json)
        t_write(path, "", 0);
    else if (!r->json[0])
        t_write(path, "\x05\0\0\0\0", 5);
    else
        write_st(path, r->json, r->n == JSON_LEN ? strlen(r->json) : r->n, r->data_bytes);
    kl_st_file f;
    kl_err err;
    kl_err_clear(&err);
    size_t mem0 = kl_mem_in_use();
    int rc = kl_st_open(&f, path, &err);
    ck_assert_msg(rc == KL_E_FORMAT, "%s: expected KL_E_FORMAT, got %d (%s)", r->what, rc,
                  t_fmt_err(&err));
    ck_assert_msg(strcmp(err.rule, r->rule) == 0, "%s: expected %s, got %s (%s)", r->what,
                  r->rule, err.rule, t_fmt_err(&err));
    ck_assert_msg(strcmp(err.tensor, r->tensor) == 0, "%s: expected tensor \"%s\", got \"%s\"",
                  r->what, r->tensor, err.tensor);
    ck_assert_msg(strcmp(err.file, path) == 0, "%s: expected file %s, got %s", r->what, path,
                  err.file);
    ck_assert_ptr_null(f.tensors);
    ck_assert_uint_eq(kl_mem_in_use(), mem0);
}
END_TEST

START_TEST(st_open_rejects_a_directory_clearly)
{
    kl_st_file f;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_st_open(&f, tmpdir, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "FILE-NOT-REGULAR");
    ck_assert_msg(strstr(err.msg, "directory") != NULL, "message should say directory: %s",
                  err.msg);
    ck_assert_str_eq(err.file, tmpdir);
}
END_TEST

START_TEST(st_open_rejects_a_fifo_without_blocking)
{
    char path[2048];
    tmp_path(path, sizeof path, "pipe.safetensors");
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    kl_st_file f;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_st_open(&f, path, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "FILE-NOT-REGULAR");
}
END_TEST

START_TEST(st_open_reports_a_missing_file_as_io_error)
{
    char path[2048];
    tmp_path(path, sizeof path, "nope.safetensors");
    kl_st_file f;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_st_open(&f, path, &err), KL_E_IO);
    ck_assert_int_eq(err.sys_errno, ENOENT);
    ck_assert_str_eq(err.file, path);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Suite                                                                                      */

/* ------------------------------------------------------------------------------------------ */
/* The plain path and the strict path agree                                                   */

/* Headers as writers make them (the plain path reads them without a tree) beside a spelling of
 * the same header, of the same length, that only the strict path takes (NULL: the plain text
 * with a space moved from its end to its front).  data: the data section's bytes. */
static const struct paths_row {
    const char *what;
    const char *plain;
    const char *strict;
    int64_t     data;
} paths_rows[] = {
    {"metadata and three tensors out of order",
     "{" META_PT "," T("c", "BF16", "[2,2]", "16,24") "," T("a", "F32", "[2]", "0,8") ","
     T("b", "U8", "[8]", "8,16") "}  ", NULL, 24},
    {"no metadata, a scalar and an empty tensor",
     "{" T("s", "F64", "[]", "0,8") "," T("z", "BF16", "[0,4]", "8,8") "} ", NULL, 8},
    {"whitespace between every token",
     "{ \n\t\"a\" : { \"shape\" : [ 2 , 3 ] , \"dtype\" : \"BF16\" , \"data_offsets\" : "
     "[ 0 , 12 ] } \r\n} ", NULL, 12},
    {"two metadata entries and rank 8",
     "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x y\"}," T("r", "U8", "[1,1,1,1,1,1,1,2]",
     "0,2") "} ", NULL, 2},
    {"an escaped name equals the plain one",
     "{" T("a.b", "F32", "[1]", "0,4") "}        ",
     "{" T("a\\u002eb", "F32", "[1]", "0,4") "}   ", 4},
    {"an escaped metadata value equals the plain one",
     "{\"__metadata__\":{\"format\":\"pt\"}," T("a", "F32", "[1]", "0,4") "}     ",
     "{\"__metadata__\":{\"format\":\"\\u0070t\"}," T("a", "F32", "[1]", "0,4") "}", 4},
    {"no tensors", "{" META_PT "} ", NULL, 0},
};

/* The strict spelling of row r: its own, or the plain text's last space moved to the front. */
static const char *strict_text(const struct paths_row *r, char *buf, size_t n)
{
    if (r->strict)
        return r->strict;
    size_t len = strlen(r->plain);
    ck_assert(len + 1 < n && r->plain[len - 1] == ' ');
    buf[0] = ' ';
    memcpy(buf + 1, r->plain, len - 1);
    buf[len] = '\0';
    return buf;
}

static void expect_same_tensor(const kl_st_tensor *a, const kl_st_tensor *b, const char *what)
{
    ck_assert_msg(!strcmp(a->name, b->name) && a->dtype == b->dtype && a->rank == b->rank &&
                  a->numel == b->numel && a->begin == b->begin && a->end == b->end &&
                  a->file_off == b->file_off && a->n_bytes == b->n_bytes &&
                  a->name_hash == b->name_hash,
                  "%s: tensor %s differs between the paths", what, a->name);
    for (int d = 0; d < a->rank; d++)
        ck_assert_msg(a->shape[d] == b->shape[d], "%s: %s shape[%d] differs", what, a->name, d);
}

START_TEST(st_plain_and_strict_paths_give_the_same_table)
{
    const struct paths_row *r = &paths_rows[_i];
    char buf[1024];
    const char *strict = strict_text(r, buf, sizeof buf);
    ck_assert_uint_eq(strlen(strict), strlen(r->plain));
    kl_st_file a, b;
    kl_err ea, eb;
    int ra = parse_str(&a, r->plain, r->data, &ea);
    int rb = parse_str(&b, strict, r->data, &eb);
    ck_assert_msg(ra == 0 && rb == 0, "%s: plain %d (%s), strict %d (%s)", r->what, ra,
                  t_fmt_err(&ea), rb, t_fmt_err(&eb));
    ck_assert_msg(a.n_tensors == b.n_tensors && a.n_meta == b.n_meta &&
                  a.has_metadata == b.has_metadata && a.data_off == b.data_off,
                  "%s: %zu/%zu tensors, %zu/%zu metadata entries", r->what, a.n_tensors,
                  b.n_tensors, a.n_meta, b.n_meta);
    ck_assert_msg((a.warnings | KL_ST_WARN_LEADING_SPACE) ==
                  (b.warnings | KL_ST_WARN_LEADING_SPACE), "%s: warnings %u and %u", r->what,
                  a.warnings, b.warnings);
    for (size_t i = 0; i < a.n_tensors; i++) {
        expect_same_tensor(&a.tensors[i], &b.tensors[i], r->what);
        ck_assert(kl_st_find(&a, b.tensors[i].name) == &a.tensors[i]);
    }
    for (size_t i = 0; i < a.n_meta; i++)
        ck_assert_msg(!strcmp(a.meta[i].key, b.meta[i].key) &&
                      !strcmp(a.meta[i].value, b.meta[i].value),
                      "%s: metadata entry %zu differs", r->what, i);
    kl_st_close(&a);
    kl_st_close(&b);
}
END_TEST

static Suite *safetensors_suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("dtype");
    tcase_add_loop_test(tc, dtype_strings_parse_to_their_enum_with_the_right_bits, 0,
                        KL_DT_COUNT);
    tcase_add_test(tc, dtype_unknown_strings_and_values_are_invalid);
    suite_add_tcase(s, tc);

    tc = tcase_create("rules");
    tcase_add_loop_test(tc, st_header_rule_violations_are_rejected_with_their_rule, 0,
                        N_RULE_ROWS);
    tcase_add_test(tc, st_error_text_escapes_control_characters_of_names);
    tcase_add_test(tc, st_offset_rules_report_the_file_offset_of_the_tensor);
    tcase_add_test(tc, st_utf8_errors_report_the_byte_offset_in_the_file);
    tcase_add_test(tc, st_embedded_nul_byte_in_header_is_rejected);
    tcase_add_loop_test(tc, st_header_is_one_strict_json_object_with_integers_as_written, 0,
                        (int)(sizeof strict_rows / sizeof strict_rows[0]));
    tcase_add_test(tc, st_file_shorter_than_8_bytes_is_rejected_in_memory);
    tcase_add_test(tc, st_header_above_100_mb_is_rejected_before_reading_it);
    tcase_add_test(tc, st_null_err_is_accepted);
    suite_add_tcase(s, tc);

    tc = tcase_create("valid");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, st_valid_header_is_parsed_sorted_and_indexed);
    tcase_add_test(tc, st_empty_metadata_object_is_accepted);
    tcase_add_test(tc, st_missing_metadata_gives_a_warning_only);
    tcase_add_test(tc, st_metadata_entries_keep_file_order);
    tcase_add_test(tc, st_header_without_tensors_is_valid);
    tcase_add_test(tc, st_zero_size_tensors_are_accepted_anywhere);
    tcase_add_test(tc, st_rank0_scalar_has_one_element);
    tcase_add_test(tc, st_rank8_and_largest_dimension_are_accepted);
    tcase_add_test(tc, st_all_22_dtypes_are_accepted);
    tcase_add_test(tc, st_f4_with_even_element_count_is_accepted);
    tcase_add_test(tc, st_leading_whitespace_is_accepted_with_a_warning);
    tcase_add_test(tc, st_trailing_space_padding_is_accepted_silently);
    tcase_add_test(tc, st_utf8_and_escaped_names_are_decoded);
    tcase_add_test(tc, st_header_above_hub_limit_gives_a_warning);
    tcase_add_loop_test(tc, st_plain_and_strict_paths_give_the_same_table, 0,
                        (int)(sizeof paths_rows / sizeof paths_rows[0]));
    suite_add_tcase(s, tc);

    tc = tcase_create("open");
    tcase_add_checked_fixture(tc, setup_tmp, teardown_tmp);
    tcase_add_test(tc, st_open_reads_a_valid_file);
    tcase_add_loop_test(tc, st_open_rejects_broken_files_with_their_rule, 0,
                        (int)(sizeof file_rows / sizeof file_rows[0]));
    tcase_add_test(tc, st_open_rejects_a_directory_clearly);
    tcase_add_test(tc, st_open_rejects_a_fifo_without_blocking);
    tcase_add_test(tc, st_open_reports_a_missing_file_as_io_error);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(safetensors_suite());
}
