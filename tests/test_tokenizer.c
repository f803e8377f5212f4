/*
 * tests/test_tokenizer.c — engine/tokenizer: loading, encode/decode, special tokens, Kimi's
 * long-input cuts, byte-pair merging against a plain reference, the streaming detokenizer, and
 * errors for malformed tokenizer files.
 *
 * The vocabulary is the synthetic one `kl synth` writes (kl_synth_write_tokenizer) into a temp
 * directory.  Exact parity with OpenAI's tiktoken on a real vocabulary is tests/tokenizer/.
 */
#include "common/fs.h"
#include "common/mem.h"
#include "common/strmap.h"
#include "synth/synth.h"
#include "engine/tokenizer.h"
#include "tests/testutil.h"

#include <inttypes.h>
#include <stdint.h>

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

#define VOCAB 4096u
#define R (VOCAB - KL_TOK_N_SPECIAL) /* first special id */

static char g_dir[4096];
static kl_tokenizer *g_tok;

static const char *fmt_err(const kl_err *err)
{
    static char buf[1200];
    return kl_err_format(err, buf, sizeof buf);
}

static void setup(void)
{
    kl_err err;
    kl_err_clear(&err);
    t_mkdtemp(g_dir, sizeof g_dir);
    ck_assert_msg(kl_synth_write_tokenizer(g_dir, VOCAB, &err) == 0, "%s", fmt_err(&err));
    ck_assert_msg(kl_tok_open(g_dir, &g_tok, &err) == 0, "%s", fmt_err(&err));
}

static void teardown(void)
{
    kl_tok_close(g_tok);
    g_tok = NULL;
    t_rmrf(g_dir);
}

/* Encodes text (NUL-terminated) and checks success; returns the ids (kl_free). */
static uint32_t *enc(const char *text, size_t n, size_t *n_ids)
{
    kl_err err;
    kl_err_clear(&err);
    uint32_t *ids = NULL;
    ck_assert_msg(kl_tok_encode(g_tok, text, n, &ids, n_ids, &err) == 0,
                  "encode of %zu bytes failed: %s", n, fmt_err(&err));
    return ids;
}

static void check_round_trip(const char *text, size_t n)
{
    size_t n_ids;
    uint32_t *ids = enc(text, n, &n_ids);
    kl_err err;
    kl_err_clear(&err);
    char *back = NULL;
    size_t len = 0;
    ck_assert_msg(kl_tok_decode(g_tok, ids, n_ids, 0, &back, &len, &err) == 0, "%s",
                  fmt_err(&err));
    ck_assert_msg(len == n && !memcmp(back, text, n),
                  "round trip of %zu bytes gave %zu bytes back (text starts '%.40s')", n, len,
                  text);
    kl_free(back);
    kl_free(ids);
}

static int ids_equal(const uint32_t *a, size_t na, const uint32_t *b, size_t nb)
{
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

/* Reference byte-pair merge: tiktoken's algorithm, written as plainly as possible (whole piece
 * first, then repeatedly merge the leftmost lowest-ranked adjacent pair). */
typedef struct ref_bpe {
    kl_strmap map;         /* multi-byte token text -> rank (synthetic tokens have no NUL) */
    char    **keys;        /* [R] owned copies */
    uint32_t  byte_rank[256];
} ref_bpe;

static void ref_init(ref_bpe *r)
{
    memset(r, 0, sizeof *r);
    ck_assert_int_eq(kl_strmap_init(&r->map, R), 0);
    r->keys = kl_calloc(R, sizeof *r->keys);
    for (uint32_t id = 0; id < R; id++) {
        size_t len;
        const uint8_t *b = kl_tok_token_bytes(g_tok, id, &len);
        if (len == 1) {
            r->byte_rank[b[0]] = id;
            continue;
        }
        r->keys[id] = kl_strndup((const char *)b, len);
        ck_assert_int_eq(kl_strmap_put(&r->map, r->keys[id], id, NULL), 0);
    }
}

static void ref_free(ref_bpe *r)
{
    for (uint32_t id = 0; id < R; id++)
        kl_free(r->keys[id]);
    kl_free(r->keys);
    kl_strmap_free(&r->map);
}

static uint32_t ref_rank(const ref_bpe *r, const char *p, size_t n)
{
    if (n == 1)
        return r->byte_rank[(uint8_t)p[0]];
    char buf[64];
    if (n >= sizeof buf)
        return UINT32_MAX;
    memcpy(buf, p, n);
    buf[n] = 0;
    uint32_t v;
    return kl_strmap_get(&r->map, buf, &v) ? v : UINT32_MAX;
}

static size_t ref_encode_piece(const ref_bpe *r, const char *p, size_t n, uint32_t *out)
{
    uint32_t whole = ref_rank(r, p, n);
    if (whole != UINT32_MAX) {
        out[0] = whole;
        return 1;
    }
    size_t *start = kl_malloc((n + 1) * sizeof *start), np = n + 1;
    for (size_t i = 0; i <= n; i++)
        start[i] = i;
    for (;;) {
        uint32_t best = UINT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 2 < np; i++) {
            uint32_t rk = ref_rank(r, p + start[i], start[i + 2] - start[i]);
            if (rk < best) {
                best = rk;
                bi = i;
            }
        }
        if (best == UINT32_MAX)
            break;
        memmove(start + bi + 1, start + bi + 2, (np - bi - 2) * sizeof *start);
        np--;
    }
    for (size_t i = 0; i + 1 < np; i++)
        out[i] = ref_rank(r, p + start[i], start[i + 1] - start[i]);
    kl_free(start);
    return np - 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Loading                                                                                    */

START_TEST(tok_synthetic_vocabulary_loads_with_kimi_special_layout)
{
    ck_assert_uint_eq(kl_tok_n_vocab(g_tok), VOCAB);
    ck_assert_uint_eq(kl_tok_n_ranks(g_tok), R);
    static const struct {
        const char *name;
        uint32_t    offset;
        int         control;
    } want[] = {
        {"[BOS]", 0, 1}, {"[EOS]", 1, 1}, {"<|im_end|>", 2, 1}, {"<|im_user|>", 3, 1},
        {"<|im_assistant|>", 4, 1}, {"<|im_system|>", 10, 1}, {"<|tool_call_begin|>", 13, 0},
        {"<|im_middle|>", 17, 1}, {"[UNK]", 254, 1}, {"[PAD]", 255, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        uint32_t id = 0;
        ck_assert_msg(kl_tok_special_id(g_tok, want[i].name, &id) == 1, "%s missing",
                      want[i].name);
        ck_assert_msg(id == R + want[i].offset, "%s: expected id %u, got %u", want[i].name,
                      R + want[i].offset, id);
        ck_assert_msg(kl_tok_is_control(g_tok, id) == want[i].control,
                      "%s: expected control %d", want[i].name, want[i].control);
        size_t len;
        const uint8_t *b = kl_tok_token_bytes(g_tok, id, &len);
        ck_assert_msg(len == strlen(want[i].name) && !memcmp(b, want[i].name, len),
                      "bytes of id %u are not '%s'", id, want[i].name);
    }
    size_t len;
    ck_assert_ptr_null(kl_tok_token_bytes(g_tok, VOCAB, &len));
    ck_assert_int_eq(kl_tok_is_control(g_tok, 'a'), 0);
}
END_TEST

START_TEST(tok_unnamed_special_ids_are_reserved_tokens)
{
    char name[64];
    snprintf(name, sizeof name, "<|reserved_token_%u|>", R + 5);
    uint32_t id = 0;
    ck_assert_int_eq(kl_tok_special_id(g_tok, name, &id), 1);
    ck_assert_uint_eq(id, R + 5);
    ck_assert_int_eq(kl_tok_special_id(g_tok, "<|im_start|>", &id), 0);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Encode / decode                                                                            */

START_TEST(tok_round_trips_mixed_text)
{
    static const char *const texts[] = {
        "",
        "a",
        "Hello world, this is a test.",
        "世界。你好，世界！中文English混合123测试",
        "getUserName XMLHttpRequest it's IT'S we'RE",
        "  leading and trailing  \n\n\t\r\n",
        "e\xcc\x81t\xc3\xa9 \xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87",
        "\xc2\x85\xef\xbb\xbf\xe3\x80\x80 NEL BOM IDEOGRAPHIC SPACE",
        "\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd emoji",
        "12345678901234567890 3.14159 1,000,000",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        check_round_trip(texts[i], strlen(texts[i]));
}
END_TEST

START_TEST(tok_regular_ids_cover_bytes_and_merges)
{
    /* single bytes are ranks 0..255 in the synthetic vocabulary */
    size_t n;
    uint32_t *ids = enc("a", 1, &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(ids[0], 'a');
    kl_free(ids);
    /* every regular token's own text, if it is a regex piece by itself, encodes to itself */
    int checked = 0;
    for (uint32_t id = 256; id < R; id++) {
        size_t len;
        const uint8_t *b = kl_tok_token_bytes(g_tok, id, &len);
        int lower = 1;
        for (size_t k = 0; k < len; k++)
            lower &= b[k] >= 'a' && b[k] <= 'z';
        if (!lower)
            continue;
        ids = enc((const char *)b, len, &n);
        ck_assert_msg(n == 1 && ids[0] == id, "token %u '%.*s' encoded to %zu ids", id,
                      (int)len, b, n);
        kl_free(ids);
        checked++;
    }
    ck_assert_int_gt(checked, 100);
}
END_TEST

START_TEST(tok_special_token_text_becomes_its_id)
{
    const char *text = "<|im_user|>user<|im_middle|>hi<|im_end|>";
    size_t n;
    uint32_t *ids = enc(text, strlen(text), &n);
    ck_assert_uint_ge(n, 5);
    ck_assert_uint_eq(ids[0], R + 3);
    ck_assert_uint_eq(ids[n - 1], R + 2);
    int middle = 0;
    for (size_t i = 0; i < n; i++)
        middle += ids[i] == R + 17;
    ck_assert_int_eq(middle, 1);
    kl_free(ids);
    check_round_trip(text, strlen(text));
    /* partial names and unknown names stay text */
    static const char *const plain[] = {"<|im_end|", "<|im_start|>", "[BOS", "<<|im_end|"};
    for (size_t k = 0; k < sizeof plain / sizeof plain[0]; k++) {
        ids = enc(plain[k], strlen(plain[k]), &n);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(ids[i] < R, "'%s' produced special id %u", plain[k], ids[i]);
        kl_free(ids);
    }
    /* a reserved name is special too; text around specials is encoded on its own */
    char name[64];
    snprintf(name, sizeof name, "x<|reserved_token_%u|>y", R + 100);
    ids = enc(name, strlen(name), &n);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(ids[0], 'x');
    ck_assert_uint_eq(ids[1], R + 100);
    ck_assert_uint_eq(ids[2], 'y');
    kl_free(ids);
}
END_TEST

START_TEST(tok_long_pieces_merge_like_the_reference_bpe)
{
    ref_bpe ref;
    ref_init(&ref);
    uint64_t x = 88172645463325252ull;
    char buf[600];
    uint32_t want[600];
    for (int iter = 0; iter < 300; iter++) {
        /* a lowercase word (one regex piece) of 2..500 bytes, or a run of spaces before 'x' */
        size_t n = 2 + (size_t)(iter * 7 % 499);
        int spaces = iter % 5 == 0;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[i] = spaces ? ' ' : "etaoinshrdlucmfwyp"[x % (iter % 2 ? 5 : 18)];
        }
        size_t piece = n;
        if (spaces) {
            buf[n - 1] = 'x';   /* pieces: n-2 spaces, then " x" */
            piece = n - 2;
        }
        size_t got_n;
        uint32_t *got = enc(buf, n, &got_n);
        size_t want_n = piece ? ref_encode_piece(&ref, buf, piece, want) : 0;
        if (spaces)
            want_n += ref_encode_piece(&ref, buf + piece, 2, want + want_n);
        ck_assert_msg(ids_equal(got, got_n, want, want_n),
                      "iteration %d (%zu bytes%s): %zu ids, reference %zu", iter, n,
                      spaces ? ", spaces" : "", got_n, want_n);
        kl_free(got);
    }
    ref_free(&ref);
}
END_TEST

START_TEST(tok_invalid_utf8_input_is_rejected_with_offset)
{
    static const struct {
        const char *text;
        uint64_t    off;
    } rows[] = {
        {"ab\xff", 2}, {"\xc0\xaf", 0}, {"x\xed\xa0\x80", 1}, {"abc\xe4\xb8", 3},
        {"\xf4\x90\x80\x80", 0}, {"ok \xe4\xb8\x96 \x80", 7},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        kl_err err;
        kl_err_clear(&err);
        uint32_t *ids = NULL;
        size_t n = 0;
        int rc = kl_tok_encode(g_tok, rows[i].text, strlen(rows[i].text), &ids, &n, &err);
        ck_assert_msg(rc == KL_E_USAGE, "row %zu: expected KL_E_USAGE, got %d", i, rc);
        ck_assert_msg(err.offset == rows[i].off, "row %zu: expected offset %" PRIu64
                      ", got %" PRIu64, i, rows[i].off, err.offset);
        ck_assert_ptr_null(ids);
    }
}
END_TEST

START_TEST(tok_decode_rejects_ids_outside_the_vocabulary)
{
    uint32_t ids[] = {'a', VOCAB};
    kl_err err;
    kl_err_clear(&err);
    char *out = NULL;
    size_t len;
    ck_assert_int_eq(kl_tok_decode(g_tok, ids, 2, 0, &out, &len, &err), KL_E_USAGE);
    ck_assert_ptr_null(out);
    ck_assert_msg(strstr(err.msg, "4096") != NULL, "message: %s", err.msg);
}
END_TEST

START_TEST(tok_decode_can_skip_control_tokens_but_keeps_tool_markers)
{
    uint32_t ids[] = {R + 0, 'h', 'i', R + 13, R + 2};
    char *out = NULL;
    size_t len;
    ck_assert_int_eq(kl_tok_decode(g_tok, ids, 5, KL_TOK_SKIP_CONTROL, &out, &len, NULL), 0);
    ck_assert_str_eq(out, "hi<|tool_call_begin|>");
    kl_free(out);
    ck_assert_int_eq(kl_tok_decode(g_tok, ids, 5, 0, &out, &len, NULL), 0);
    ck_assert_str_eq(out, "[BOS]hi<|tool_call_begin|><|im_end|>");
    kl_free(out);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Kimi's long-input cuts                                                                     */

/* ids(a ++ b) must equal ids(a) ++ ids(b) when Kimi cuts between a and b. */
static void check_cut(const char *text, size_t n, size_t cut)
{
    size_t n_all, n_a, n_b;
    uint32_t *all = enc(text, n, &n_all);
    uint32_t *a = enc(text, cut, &n_a);
    uint32_t *b = enc(text + cut, n - cut, &n_b);
    uint32_t *ab = kl_malloc((n_a + n_b + 1) * sizeof *ab);
    memcpy(ab, a, n_a * sizeof *a);
    memcpy(ab + n_a, b, n_b * sizeof *b);
    ck_assert_msg(ids_equal(all, n_all, ab, n_a + n_b),
                  "cut at %zu of %zu bytes: %zu ids, pieces give %zu", cut, n, n_all, n_a + n_b);
    kl_free(all);
    kl_free(a);
    kl_free(b);
    kl_free(ab);
}

START_TEST(tok_runs_longer_than_25000_characters_are_cut)
{
    static const char tail[] = " and more words after the run";
    size_t n = 25001 + strlen(tail);
    char *text = kl_malloc(n + 1);
    memset(text, 'a', 25001);
    memcpy(text + 25001, tail, strlen(tail));
    check_cut(text, n, 25000);
    /* whitespace runs too: Python's isspace counts U+001C..U+001F, which regex \s does not */
    memset(text, '\x1f', 25001);
    check_cut(text, n, 25000);
    memset(text, ' ', 25001);
    check_cut(text, n, 25000);
    kl_free(text);
}
END_TEST

START_TEST(tok_input_is_cut_every_400000_code_points)
{
    /* "ab " * k with a special name straddling code point 400,000: the cut splits the name */
    size_t pre = 399995, n = pre + 10 + 4;
    char *text = kl_malloc(n + 1);
    for (size_t i = 0; i < pre; i++)
        text[i] = "ab "[i % 3];
    memcpy(text + pre, "<|im_end|>tail", 14);
    check_cut(text, n, 400000);
    size_t n_ids;
    uint32_t *ids = enc(text, n, &n_ids);
    for (size_t i = 0; i < n_ids; i++)
        ck_assert_msg(ids[i] != R + 2, "the cut name still became <|im_end|> at %zu", i);
    kl_free(ids);
    /* cuts count code points, not bytes: 400,000 three-byte characters then "x" */
    kl_free(text);
    n = 400001 * 3;
    text = kl_malloc(n + 1);
    for (size_t i = 0; i < 400001; i++)
        memcpy(text + 3 * i, i % 2 ? "\xe3\x80\x80" : "\xe3\x81\x82", 3); /* U+3000, あ */
    check_cut(text, n, 400000 * 3);
    kl_free(text);
}
END_TEST

START_TEST(tok_long_letter_runs_do_not_exhaust_the_regex_stack)
{
    /* 25,000 Hangul syllables (Lo: in both case classes, so the first backtracks over all) */
    size_t n = 25000 * 3;
    char *text = kl_malloc(n + 1);
    for (size_t i = 0; i < 25000; i++)
        memcpy(text + 3 * i, "\xed\x95\x9c", 3);
    check_round_trip(text, n);
    kl_free(text);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Streaming detokenizer                                                                      */

START_TEST(tok_stream_holds_back_split_utf8_characters)
{
    kl_tok_stream s;
    ck_assert_int_eq(kl_tok_stream_init(&s, g_tok, 0, NULL), 0);
    /* byte tokens of 世 (E4 B8 96), then 😀 (F0 9F 98 80), then 'a' */
    static const struct {
        uint32_t    id;
        const char *out;
    } steps[] = {
        {0xE4, ""}, {0xB8, ""}, {0x96, "\xe4\xb8\x96"}, {0xF0, ""}, {0x9F, ""}, {0x98, ""},
        {0x80, "\xf0\x9f\x98\x80"}, {'a', "a"},
        /* a byte that can never start a character passes through at once */
        {0xFF, "\xff"},
        /* a lead byte followed by something that is not a continuation: both come out */
        {0xE4, ""}, {'b', "\xe4" "b"},
        /* E0 80 can never be valid (overlong): not held */
        {0xE0, ""}, {0x80, "\xe0\x80"},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        const char *text;
        size_t len;
        ck_assert_int_eq(kl_tok_stream_push(&s, steps[i].id, &text, &len, NULL), 0);
        ck_assert_msg(len == strlen(steps[i].out) && !memcmp(text, steps[i].out, len),
                      "step %zu (id %u): expected %zu bytes, got %zu", i, steps[i].id,
                      strlen(steps[i].out), len);
    }
    /* an incomplete character at the end comes out of flush */
    const char *text;
    size_t len;
    ck_assert_int_eq(kl_tok_stream_push(&s, 0xE4, &text, &len, NULL), 0);
    ck_assert_uint_eq(len, 0);
    kl_tok_stream_flush(&s, &text, &len);
    ck_assert_uint_eq(len, 1);
    ck_assert_int_eq((uint8_t)text[0], 0xE4);
    kl_tok_stream_flush(&s, &text, &len);
    ck_assert_uint_eq(len, 0);
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_tok_stream_push(&s, VOCAB, &text, &len, &err), KL_E_USAGE);
    kl_tok_stream_free(&s);
    kl_tok_stream_free(&s);
}
END_TEST

START_TEST(tok_stream_output_concatenates_to_decode)
{
    const char *src = "世界。你好 <|im_end|> 😀👍🏽 नमस्ते e\xcc\x81 [BOS] tail";
    size_t n_ids;
    uint32_t *ids = enc(src, strlen(src), &n_ids);
    /* also a byte-by-byte id sequence, and random ids */
    size_t extra = 400, total = n_ids + extra;
    uint32_t *all = kl_malloc(total * sizeof *all);
    memcpy(all, ids, n_ids * sizeof *ids);
    uint64_t x = 2463534242ull;
    for (size_t i = 0; i < extra; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        all[n_ids + i] = i < 200 ? (uint32_t)(uint8_t)src[i % strlen(src)] : (uint32_t)(x % VOCAB);
    }
    for (unsigned flags = 0; flags <= KL_TOK_SKIP_CONTROL; flags += KL_TOK_SKIP_CONTROL) {
        char *want;
        size_t want_len;
        ck_assert_int_eq(kl_tok_decode(g_tok, all, total, flags, &want, &want_len, NULL), 0);
        kl_tok_stream s;
        ck_assert_int_eq(kl_tok_stream_init(&s, g_tok, flags, NULL), 0);
        char *got = kl_malloc(want_len + 1);
        size_t got_len = 0;
        for (size_t i = 0; i < total; i++) {
            const char *text;
            size_t len;
            ck_assert_int_eq(kl_tok_stream_push(&s, all[i], &text, &len, NULL), 0);
            ck_assert_uint_le(got_len + len, want_len);
            memcpy(got + got_len, text, len);
            got_len += len;
            /* never ends inside a character that could still be completed */
            if (got_len && (uint8_t)got[got_len - 1] >= 0xC2 && (uint8_t)got[got_len - 1] <= 0xF4)
                ck_assert_msg(0, "output %zu ends with a lead byte", i);
        }
        const char *text;
        size_t len;
        kl_tok_stream_flush(&s, &text, &len);
        memcpy(got + got_len, text, len);
        got_len += len;
        ck_assert_msg(got_len == want_len && !memcmp(got, want, want_len),
                      "flags %u: stream gave %zu bytes, decode %zu", flags, got_len, want_len);
        kl_free(got);
        kl_free(want);
        kl_tok_stream_free(&s);
    }
    kl_free(all);
    kl_free(ids);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Malformed files                                                                            */

static const char b64tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* "base64(byte) rank" for the 256 single bytes (ranks 0..255), except byte `skip` (-1: none). */
static size_t byte_lines(char *buf, int skip)
{
    size_t o = 0;
    for (int b = 0, r = 0; b < 256; b++) {
        if (b == skip)
            continue;
        o += (size_t)sprintf(buf + o, "%c%c== %d\n", b64tbl[b >> 2], b64tbl[(b & 3) << 4], r++);
    }
    return o;
}

static const struct model_row {
    const char *name;
    const char *extra;    /* lines appended after the 256 byte lines */
    int         skip;     /* byte left out, -1 none */
    const char *rule;
    const char *msg;      /* expected substring */
} model_rows[] = {
    {"bad base64 character", "YW!i 256\n", -1, "TOK-BASE64", "line 257"},
    {"base64 not a multiple of 4", "YWJj= 256\n", -1, "TOK-BASE64", "line 257"},
    {"data after padding", "YQ=a 256\n", -1, "TOK-BASE64", "line 257"},
    {"stray bits before padding", "YR== 256\n", -1, "TOK-BASE64", "line 257"},
    {"rank missing", "YWI=\n", -1, "TOK-LINE", "line 257"},
    {"rank missing after space", "YWI= \n", -1, "TOK-LINE", "line 257"},
    {"rank not decimal", "YWI= 25x\n", -1, "TOK-RANK", "line 257"},
    {"duplicate rank", "\nYWI= 5\n", -1, "TOK-DUP-RANK", "line 258: duplicate rank 5"},
    {"rank out of range", "YWI= 300\n", -1, "TOK-RANK", "line 257: rank 300 out of range"},
    {"duplicate token", "YQ== 256\n", -1, "TOK-DUP-TOKEN", "line 257"},
    {"single byte missing", "YWI= 255\n", 'q', "TOK-BYTE-MISSING", "0x71"},
    {"no tokens", NULL, 256, "TOK-EMPTY", "no tokens"},
};

START_TEST(tok_malformed_tiktoken_model_is_rejected_with_line)
{
    const struct model_row *row = &model_rows[_i];
    char dir[4096], path[4200];
    t_mkdtemp(dir, sizeof dir);
    ck_assert_int_eq(kl_synth_write_tokenizer(dir, 512, NULL), 0); /* the config */
    char *buf = kl_malloc(8192);
    size_t n = row->skip == 256 ? 0 : byte_lines(buf, row->skip);
    if (row->extra)
        n += (size_t)sprintf(buf + n, "%s", row->extra);
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    t_write(path, buf, n);
    kl_free(buf);
    kl_err err;
    kl_err_clear(&err);
    kl_tokenizer *tok = NULL;
    int rc = kl_tok_open(dir, &tok, &err);
    ck_assert_msg(rc == KL_E_FORMAT, "%s: expected KL_E_FORMAT, got %d (%s)", row->name, rc,
                  fmt_err(&err));
    ck_assert_ptr_null(tok);
    ck_assert_msg(!strcmp(err.rule, row->rule), "%s: expected rule %s, got %s", row->name,
                  row->rule, err.rule);
    ck_assert_msg(strstr(err.msg, row->msg) != NULL, "%s: expected '%s' in '%s'", row->name,
                  row->msg, err.msg);
    ck_assert_msg(strstr(err.file, "tiktoken.model") != NULL, "%s: file '%s'", row->name,
                  err.file);
    t_rmrf(dir);
}
END_TEST

static const struct config_row {
    const char *name;
    const char *json;
    const char *msg;      /* expected substring */
} config_rows[] = {
    {"not JSON", "{\n  \"added_tokens_decoder\": {\n    \"256\": [,]\n  }\n}\n", "line 3"},
    {"not an object", "[1, 2]\n", "not a JSON object"},
    {"decoder not an object", "{\n\"added_tokens_decoder\": 5}\n", "line 2"},
    {"id below the special range",
     "{\"added_tokens_decoder\": {\n\n \"255\": {\"content\": \"<x>\"}}}\n", "line 3"},
    {"id above the special range",
     "{\"added_tokens_decoder\": {\"512\": {\"content\": \"<x>\"}}}\n", "outside the special"},
    {"id not a number", "{\"added_tokens_decoder\": {\"abc\": {\"content\": \"<x>\"}}}\n",
     "not a token id"},
    {"content not a string", "{\"added_tokens_decoder\": {\"256\": {\"content\": 5}}}\n",
     "\"content\""},
    {"content empty", "{\"added_tokens_decoder\": {\"256\": {\"content\": \"\"}}}\n",
     "\"content\""},
    {"special not a boolean",
     "{\"added_tokens_decoder\": {\"256\": {\"content\": \"<x>\", \"special\": 1}}}\n",
     "\"special\""},
    {"duplicate name",
     "{\"added_tokens_decoder\": {\"256\": {\"content\": \"<x>\"},\n"
     "\"257\": {\"content\": \"<x>\"}}}\n", "already used by id 256"},
    {"name of a reserved slot reused",
     "{\"added_tokens_decoder\": {\"256\": {\"content\": \"<|reserved_token_300|>\"}}}\n",
     "already used"},
};

/* kl_tok_open on a synthetic tokenizer whose tokenizer_config.json is json[0..n); the
 * tokenizer is closed again.  Returns kl_tok_open's result. */
static int open_with_config(const char *json, size_t n, kl_err *err)
{
    char dir[4096], path[4200];
    t_mkdtemp(dir, sizeof dir);
    ck_assert_int_eq(kl_synth_write_tokenizer(dir, 512, NULL), 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    t_write(path, json, n);
    kl_err_clear(err);
    kl_tokenizer *tok = NULL;
    int rc = kl_tok_open(dir, &tok, err);
    kl_tok_close(tok);
    t_rmrf(dir);
    return rc;
}

START_TEST(tok_malformed_tokenizer_config_is_rejected)
{
    const struct config_row *row = &config_rows[_i];
    kl_err err;
    int rc = open_with_config(row->json, strlen(row->json), &err);
    ck_assert_msg(rc == KL_E_FORMAT, "%s: expected KL_E_FORMAT, got %d (%s)", row->name, rc,
                  fmt_err(&err));
    ck_assert_msg(strstr(err.msg, row->msg) != NULL, "%s: expected '%s' in '%s'", row->name,
                  row->msg, err.msg);
    ck_assert_msg(strstr(err.file, "tokenizer_config.json") != NULL, "%s: file '%s'", row->name,
                  err.file);
}
END_TEST

/* Exactly one JSON object plus whitespace, UTF-8 without BOM or NUL (issue 9 defect 5). */
static const char STRICT_BASE[] =
    "{\"added_tokens_decoder\": {\"256\": {\"content\": \"<x>\", \"special\": true}}}";
static const t_json_case strict_rows[] = {
    {"garbage after the object", "}}}", "}}}\nx", 0, "TOK-JSON"},
    {"a second object", "}}}", "}}}{}", 0, "TOK-JSON"},
    {"byte-order mark", "{\"added", "\xef\xbb\xbf{\"added", 0, "TOK-JSON"},
    {"NUL after the object", "}}}", "}}}\0", 4, "TOK-JSON"},
    {"NUL in a token name", "<x>", "<x\0>", 4, "TOK-JSON"},
    {"escaped NUL in a token name", "<x>", "<x\\u0000>", 0, "TOK-JSON"},
    {"invalid UTF-8 in a token name", "<x>", "<x\xff>", 0, "TOK-UTF8"},
    {"whitespace after the object", "}}}", "}}}\n \t\r\n", 0, NULL},
};

START_TEST(tok_config_is_one_strict_json_object)
{
    const t_json_case *c = &strict_rows[_i];
    size_t len;
    char *json = t_json_splice(STRICT_BASE, c, &len);
    kl_err err;
    int rc = open_with_config(json, len, &err);
    free(json);
    t_json_case_check(c, rc, &err, NULL);
    ck_assert_msg(!rc || strstr(err.file, "tokenizer_config.json"), "%s: file '%s'", c->what,
                  err.file);
}
END_TEST

START_TEST(tok_missing_files_are_io_errors)
{
    char dir[4096], path[4200];
    t_mkdtemp(dir, sizeof dir);
    kl_err err;
    kl_err_clear(&err);
    kl_tokenizer *tok = NULL;
    ck_assert_int_eq(kl_tok_open(dir, &tok, &err), KL_E_IO);
    ck_assert_msg(strstr(err.file, "tiktoken.model") != NULL, "file '%s'", err.file);
    ck_assert_int_eq(kl_synth_write_tokenizer(dir, 512, NULL), 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    ck_assert_int_eq(unlink(path), 0);
    kl_err_clear(&err);
    ck_assert_int_eq(kl_tok_open(dir, &tok, &err), KL_E_IO);
    ck_assert_msg(strstr(err.file, "tokenizer_config.json") != NULL, "file '%s'", err.file);
    /* a config without added_tokens_decoder: every special is reserved */
    t_write(path, "{}\n", 3);
    ck_assert_int_eq(kl_tok_open(dir, &tok, NULL), 0);
    uint32_t id;
    ck_assert_int_eq(kl_tok_special_id(tok, "<|reserved_token_256|>", &id), 1);
    ck_assert_uint_eq(id, 256);
    kl_tok_close(tok);
    kl_tok_close(NULL);
    t_rmrf(dir);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

int main(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("tokenizer");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, tok_synthetic_vocabulary_loads_with_kimi_special_layout);
    tcase_add_test(tc, tok_unnamed_special_ids_are_reserved_tokens);
    tcase_add_test(tc, tok_round_trips_mixed_text);
    tcase_add_test(tc, tok_regular_ids_cover_bytes_and_merges);
    tcase_add_test(tc, tok_special_token_text_becomes_its_id);
    tcase_add_test(tc, tok_long_pieces_merge_like_the_reference_bpe);
    tcase_add_test(tc, tok_invalid_utf8_input_is_rejected_with_offset);
    tcase_add_test(tc, tok_decode_rejects_ids_outside_the_vocabulary);
    tcase_add_test(tc, tok_decode_can_skip_control_tokens_but_keeps_tool_markers);
    tcase_add_test(tc, tok_runs_longer_than_25000_characters_are_cut);
    tcase_add_test(tc, tok_input_is_cut_every_400000_code_points);
    tcase_add_test(tc, tok_long_letter_runs_do_not_exhaust_the_regex_stack);
    tcase_add_test(tc, tok_stream_holds_back_split_utf8_characters);
    tcase_add_test(tc, tok_stream_output_concatenates_to_decode);
    suite_add_tcase(s, tc);
    TCase *tf = tcase_create("files");
    tcase_add_loop_test(tf, tok_malformed_tiktoken_model_is_rejected_with_line, 0,
                        (int)(sizeof model_rows / sizeof model_rows[0]));
    tcase_add_loop_test(tf, tok_malformed_tokenizer_config_is_rejected, 0,
                        (int)(sizeof config_rows / sizeof config_rows[0]));
    tcase_add_loop_test(tf, tok_config_is_one_strict_json_object, 0,
                        (int)(sizeof strict_rows / sizeof strict_rows[0]));
    tcase_add_test(tf, tok_missing_files_are_io_errors);
    suite_add_tcase(s, tf);
    return t_run_suite(s);
}
