/*
 * engine/tokenizer.c — Kimi's tiktoken tokenizer (see tokenizer.h).
 *
 * Divisions: constants and the pattern; UTF-8 helpers; the rank table (hash of token bytes);
 * loading tiktoken.model; loading tokenizer_config.json; byte-pair merging; the encoder
 * (Kimi's long-input cuts, special tokens, the regex split); public API in header order.
 */
#include "engine/tokenizer.h"

#include "common/fs.h"
#include "common/grow.h"
#include "common/json.h"
#include "common/mem.h"
#include "common/strmap.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---- constants ------------------------------------------------------------------------------ */

#define NO_RANK UINT32_MAX
#define MAX_MODEL_BYTES ((size_t)256 << 20)   /* Kimi's tiktoken.model is about 2.5 MB */
#define MAX_CONFIG_BYTES ((size_t)64 << 20)
#define BPE_SMALL 64u          /* pieces up to this many bytes: tiktoken's linear scan */
#define JIT_STACK_MAX ((size_t)64 << 20) /* backtracking over a 25k-character run, see encode */

/*
 * Kimi's pat_str rewritten for PCRE2 10.42 (tokenizer-and-api.md A6):
 *  - `\p{Han}` is written `\p{sc=Han}`: PCRE2 reads a bare script name as Script_Extensions,
 *    while the Rust regex crate behind tiktoken reads it as Script;
 *  - each class `[X&&[^\p{Han}]]` becomes `(?:(?!\p{sc=Han})[X])` (PCRE2 10.42 has no `&&`
 *    and silently compiles it as something else); exact, since each class matches one
 *    code point.
 *  - `\s` is spelled out as Unicode White_Space, which is what `\s` means in the Rust regex
 *    crate: PCRE2's `\s` in UCP mode also matches U+180E MONGOLIAN VOWEL SEPARATOR (a space in
 *    Unicode < 6.3, format character since), and tiktoken does not.
 * The eight alternatives and their order are otherwise Kimi's, verbatim.
 */
#define WS "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
           "\\x{202F}\\x{205F}\\x{3000}"
#define HAN "\\p{sc=Han}"
#define NOHAN "(?!" HAN ")"
#define UPPERISH NOHAN "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define LOWERISH NOHAN "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define CONTRACTION "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
static const char kimi_pattern[] =
    "[" HAN "]+"
    "|[^\\r\\n\\p{L}\\p{N}]?(?:" UPPERISH ")*(?:" LOWERISH ")+" CONTRACTION
    "|[^\\r\\n\\p{L}\\p{N}]?(?:" UPPERISH ")+(?:" LOWERISH ")*" CONTRACTION
    "|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";

struct kl_tokenizer {
    uint32_t    n_ranks;       /* regular tokens, ids 0..n_ranks-1 */
    uint32_t    n_vocab;       /* n_ranks + KL_TOK_N_SPECIAL */
    uint8_t    *bytes;         /* [off[n_vocab]] bytes of every id in id order (specials: name) */
    uint32_t   *off;           /* [n_vocab + 1] offsets into bytes */
    uint32_t   *slots;         /* [slot_mask + 1] rank of a regular token, NO_RANK = empty */
    uint32_t    slot_mask;
    uint32_t    max_rank_len;  /* longest regular token in bytes */
    uint32_t    max_id_len;    /* longest id of all (special names included) */
    uint8_t     control[KL_TOK_N_SPECIAL]; /* 1 if special i has "special": true */
    uint8_t     spec_pair[65536 / 8];     /* bit b0 << 8 | b1: a name starts with bytes b0 b1 */
    uint8_t     spec_single[256];         /* 1 if the one-byte name b exists */
    uint32_t    spec_lens[KL_TOK_N_SPECIAL]; /* distinct name lengths, longest first */
    uint32_t    n_spec_lens;
    uint32_t    spec_slots[4 * KL_TOK_N_SPECIAL]; /* special id by name bytes, NO_RANK = empty */
    kl_strmap   spec_names;    /* name -> id; keys point into bytes */
    char       *name_text;     /* [KL_TOK_N_SPECIAL] NUL-terminated names (the strmap's keys) */
    pcre2_code *re;            /* Kimi's pattern, JIT-compiled when the platform allows */
};

/* ---- UTF-8 helpers -------------------------------------------------------------------------- */

/* Length of the valid UTF-8 prefix of s (n when all of it is valid).  Strict like Python's
 * decoder: no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_valid_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            need = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 3;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 4;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else
            return i;
        if (n - i < need || s[i + 1] < lo || s[i + 1] > hi)
            return i;
        for (size_t k = 2; k < need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return i;
        i += need;
    }
    return n;
}

/* Decodes the (valid) code point at s[*i] and advances *i. */
static uint32_t utf8_next(const uint8_t *s, size_t *i)
{
    uint8_t c = s[*i];
    if (c < 0x80) {
        (*i)++;
        return c;
    }
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    uint32_t cp = c & (0x7F >> need);
    for (size_t k = 1; k < need; k++)
        cp = cp << 6 | (s[*i + k] & 0x3F);
    *i += need;
    return cp;
}

/* Python's str.isspace(): bidirectional class WS, B or S, or category Zs (Unicode 14/15). */
static int py_isspace(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Bytes at the end of b[0..n) that begin a valid UTF-8 sequence but do not finish it (0..3). */
static size_t utf8_incomplete_tail(const uint8_t *b, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        uint8_t c = b[n - k];
        if ((c & 0xC0) == 0x80)
            continue;                              /* continuation byte: look further back */
        size_t need = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                    : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (need <= k)
            return 0;                              /* complete, ASCII, or never valid */
        if (k >= 2) {
            uint8_t c1 = b[n - k + 1];
            uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
            uint8_t hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
            if (c1 < lo || c1 > hi)
                return 0;
        }
        return k;
    }
    return 0;
}

/* ---- rank table ----------------------------------------------------------------------------- */

static inline uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 29);
}

static inline uint32_t tok_len(const kl_tokenizer *t, uint32_t id)
{
    return t->off[id + 1] - t->off[id];
}

/* Rank of the regular token with bytes p[0..n), or NO_RANK. */
static inline uint32_t rank_of(const kl_tokenizer *t, const uint8_t *p, size_t n)
{
    if (n > t->max_rank_len)
        return NO_RANK;
    for (uint64_t i = hash_bytes(p, n) & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        uint32_t r = t->slots[i];
        if (r == NO_RANK)
            return NO_RANK;
        if (tok_len(t, r) == n && !memcmp(t->bytes + t->off[r], p, n))
            return r;
    }
}

/* Inserts rank r (its bytes already in t->bytes); returns the rank already holding the same
 * bytes, or NO_RANK if r was inserted. */
static uint32_t rank_insert(kl_tokenizer *t, uint32_t r)
{
    const uint8_t *p = t->bytes + t->off[r];
    size_t n = tok_len(t, r);
    for (uint64_t i = hash_bytes(p, n) & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        uint32_t q = t->slots[i];
        if (q == NO_RANK) {
            t->slots[i] = r;
            return NO_RANK;
        }
        if (tok_len(t, q) == n && !memcmp(t->bytes + t->off[q], p, n))
            return q;
    }
}

/* ---- loading tiktoken.model ----------------------------------------------------------------- */

typedef struct line_entry {
    uint32_t rank;
    uint32_t line;       /* 1-based line number */
    uint64_t line_off;   /* byte offset of the line */
    uint32_t data_off;   /* decoded bytes in the scratch blob */
    uint32_t len;
} line_entry;

static int b64_value(uint8_t c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Strict base64 (standard alphabet, '=' padding to a multiple of 4).  Writes the bytes to dst
 * (room for n / 4 * 3) and returns their count, or -1. */
static long b64_decode(const uint8_t *s, size_t n, uint8_t *dst)
{
    if (n == 0 || n % 4)
        return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int pad = 0, v[4];
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad || (v[k] = b64_value(s[i + k])) < 0) {
                return -1;                 /* bad character, or data after '=' */
            }
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        dst[o++] = (uint8_t)(x >> 16);
        if (pad < 2)
            dst[o++] = (uint8_t)(x >> 8);
        if (pad < 1)
            dst[o++] = (uint8_t)x;
        if ((pad == 1 && (x & 0xFF)) || (pad == 2 && (x & 0xFFFF)))
            return -1;                     /* non-canonical: stray bits before the padding */
    }
    return (long)o;
}

static int model_fail(kl_err *err, const char *rule, uint64_t off, uint32_t line,
                      const char *what)
{
    return kl_fail_at(err, KL_E_FORMAT, rule, NULL, off, "line %" PRIu32 ": %s", line, what);
}

/* Parses the lines of tiktoken.model into entries (decoded bytes in *blob). */
static int parse_model_lines(const char *text, size_t n, line_entry **out, uint32_t *n_out,
                             uint8_t **blob, kl_err *err)
{
    size_t cap_lines = 1;
    for (size_t i = 0; i < n; i++)
        cap_lines += text[i] == '\n';
    line_entry *e = kl_calloc(cap_lines, sizeof *e);
    uint8_t *b = kl_malloc(n / 4 * 3 + 4);   /* decoded bytes never exceed 3/4 of the text */
    if (!e || !b) {
        kl_free(e);
        kl_free(b);
        return kl_fail(err, KL_E_NOMEM, "out of memory for %zu lines", cap_lines);
    }
    uint32_t cnt = 0, line = 0;
    size_t boff = 0;
    int rc = 0;
    for (size_t pos = 0; pos < n;) {
        const char *nl = memchr(text + pos, '\n', n - pos);
        size_t end = nl ? (size_t)(nl - text) : n, start = pos;
        pos = end + 1;
        line++;
        while (end > start && (text[end - 1] == '\r' || text[end - 1] == ' '))
            end--;
        if (end == start)
            continue;                                    /* empty line: skipped, like Kimi */
        const char *sp = memchr(text + start, ' ', end - start);
        if (!sp || sp == text + start) {
            rc = model_fail(err, "TOK-LINE", start, line, "expected 'BASE64 RANK'");
            goto fail;
        }
        size_t b64_len = (size_t)(sp - (text + start)), r = (size_t)(sp - text) + 1;
        if (r == end || end - r > 10) {
            rc = model_fail(err, "TOK-RANK", start, line, "rank missing or too long");
            goto fail;
        }
        uint64_t rank = 0;
        for (size_t k = r; k < end; k++) {
            if (text[k] < '0' || text[k] > '9') {
                rc = model_fail(err, "TOK-RANK", start, line, "rank is not a decimal number");
                goto fail;
            }
            rank = rank * 10 + (uint64_t)(text[k] - '0');
        }
        long len = b64_decode((const uint8_t *)text + start, b64_len, b + boff);
        if (len <= 0) {
            rc = model_fail(err, "TOK-BASE64", start, line, "token is not valid base64");
            goto fail;
        }
        if (rank >= UINT32_MAX - KL_TOK_N_SPECIAL) {
            rc = model_fail(err, "TOK-RANK", start, line, "rank too large");
            goto fail;
        }
        e[cnt] = (line_entry){(uint32_t)rank, line, start, (uint32_t)boff, (uint32_t)len};
        cnt++;
        boff += (size_t)len;
    }
    *out = e;
    *n_out = cnt;
    *blob = b;
    return 0;
fail:
    kl_free(e);
    kl_free(b);
    return rc;
}

/* Orders the entries by rank into t->bytes/t->off (leaving room for the special names) and
 * builds the rank table; rejects ranks outside 0..n-1, duplicate ranks and duplicate tokens. */
static int build_ranks(kl_tokenizer *t, const line_entry *e, uint32_t n, const uint8_t *blob,
                       size_t blob_len, kl_err *err)
{
    char msg[160];
    uint32_t *by_rank = kl_malloc((size_t)n * sizeof *by_rank);
    if (!by_rank)
        return kl_fail(err, KL_E_NOMEM, "out of memory for %" PRIu32 " ranks", n);
    memset(by_rank, 0xFF, (size_t)n * sizeof *by_rank);
    int rc = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (e[i].rank >= n) {
            snprintf(msg, sizeof msg, "rank %" PRIu32 " out of range: %" PRIu32
                     " tokens need ranks 0..%" PRIu32, e[i].rank, n, n - 1);
            rc = model_fail(err, "TOK-RANK", e[i].line_off, e[i].line, msg);
            goto done;
        }
        if (by_rank[e[i].rank] != UINT32_MAX) {
            snprintf(msg, sizeof msg, "duplicate rank %" PRIu32 " (first on line %" PRIu32 ")",
                     e[i].rank, e[by_rank[e[i].rank]].line);
            rc = model_fail(err, "TOK-DUP-RANK", e[i].line_off, e[i].line, msg);
            goto done;
        }
        by_rank[e[i].rank] = i;
    }
    t->n_ranks = n;
    t->n_vocab = n + KL_TOK_N_SPECIAL;
    t->off = kl_malloc(((size_t)t->n_vocab + 1) * sizeof *t->off);
    t->bytes = kl_malloc(blob_len + 1);
    uint32_t cap = 1;
    while (cap < 2 * n)
        cap <<= 1;
    t->slots = kl_malloc((size_t)cap * sizeof *t->slots);
    if (!t->off || !t->bytes || !t->slots) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for %" PRIu32 " tokens", n);
        goto done;
    }
    t->slot_mask = cap - 1;
    memset(t->slots, 0xFF, (size_t)cap * sizeof *t->slots);
    uint32_t o = 0;
    for (uint32_t r = 0; r < n; r++) {
        const line_entry *x = &e[by_rank[r]];
        t->off[r] = o;
        memcpy(t->bytes + o, blob + x->data_off, x->len);
        o += x->len;
        t->off[r + 1] = o;
        if (x->len > t->max_rank_len)
            t->max_rank_len = x->len;
        uint32_t q = rank_insert(t, r);
        if (q != NO_RANK) {
            const line_entry *first = &e[by_rank[q]];
            const line_entry *dup = first->line < x->line ? x : first;
            snprintf(msg, sizeof msg, "duplicate token (same bytes as line %" PRIu32 ")",
                     (first->line < x->line ? first : x)->line);
            rc = model_fail(err, "TOK-DUP-TOKEN", dup->line_off, dup->line, msg);
            goto done;
        }
    }
    for (unsigned c = 0; c < 256; c++) {
        uint8_t byte = (uint8_t)c;
        if (rank_of(t, &byte, 1) == NO_RANK) {
            rc = kl_fail_rule(err, KL_E_FORMAT, "TOK-BYTE-MISSING",
                              "byte 0x%02X has no rank: every single byte must be a token", c);
            goto done;
        }
    }
done:
    kl_free(by_rank);
    return rc;
}

static int load_model(kl_tokenizer *t, const char *path, kl_err *err)
{
    char *text = NULL;
    size_t n = 0;
    line_entry *e = NULL;
    uint8_t *blob = NULL;
    uint32_t cnt = 0;
    int rc = kl_read_file(path, MAX_MODEL_BYTES, &text, &n, err);
    if (!rc)
        rc = parse_model_lines(text, n, &e, &cnt, &blob, err);
    if (!rc && cnt == 0)
        rc = kl_fail_rule(err, KL_E_FORMAT, "TOK-EMPTY", "no tokens");
    if (!rc)
        rc = build_ranks(t, e, cnt, blob, n, err);
    kl_free(text);
    kl_free(e);
    kl_free(blob);
    if (rc)
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
    return rc;
}

/* ---- loading tokenizer_config.json ---------------------------------------------------------- */

/* 1-based line of text[off]. */
static uint32_t line_at(const char *text, size_t off)
{
    uint32_t line = 1;
    for (size_t i = 0; i < off; i++)
        line += text[i] == '\n';
    return line;
}

/* Line of the first occurrence of "key" in the JSON text (a good enough pointer for errors about
 * an added_tokens_decoder entry); 0 if not found. */
static uint32_t key_line(const char *text, const char *key, size_t *off)
{
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *p = strstr(text, quoted);
    *off = p ? (size_t)(p - text) : 0;
    return p ? line_at(text, *off) : 0;
}

static int config_fail(kl_err *err, const char *text, const char *key, const char *fmt,
                       const char *a, uint32_t b)
{
    size_t off;
    uint32_t line = key_line(text, key, &off);
    char what[256];
    snprintf(what, sizeof what, fmt, a, b);
    if (!line)   /* an id only implied (a reserved slot), not written in the file */
        return kl_fail_rule(err, KL_E_FORMAT, "TOK-CONFIG", "added_tokens_decoder id %s: %s",
                            key, what);
    return kl_fail_at(err, KL_E_FORMAT, "TOK-CONFIG", NULL, off,
                      "line %" PRIu32 ": added_tokens_decoder \"%s\": %s", line, key, what);
}

/* Fills names[k] (id n_ranks + k) and control[k] from added_tokens_decoder. */
static int parse_added_tokens(kl_tokenizer *t, const char *text, const cJSON *dec,
                              const char **names, kl_err *err)
{
    for (const cJSON *it = dec ? dec->child : NULL; it; it = it->next) {
        const char *key = it->string;
        char *end;
        unsigned long long id = strtoull(key, &end, 10);
        if (!*key || *end || key[0] < '0' || key[0] > '9')
            return config_fail(err, text, key, "key is not a token id%s", "", 0);
        if (id < t->n_ranks || id >= t->n_vocab)
            return config_fail(err, text, key,
                               "id outside the special range%s (first special id %" PRIu32 ")",
                               "", t->n_ranks);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsString(content) || !content->valuestring[0])
            return config_fail(err, text, key, "\"content\" is not a non-empty string%s", "",
                               0);
        const cJSON *special = cJSON_GetObjectItemCaseSensitive(it, "special");
        if (special && !cJSON_IsBool(special))
            return config_fail(err, text, key, "\"special\" is not a boolean%s", "", 0);
        uint32_t k = (uint32_t)id - t->n_ranks;
        names[k] = content->valuestring;
        t->control[k] = special ? cJSON_IsTrue(special) : 1;
    }
    return 0;
}

/* Adds special id (its name already in t->bytes) to the matcher's tables.  Lengths are kept
 * longest first, so that of two names starting at one place the longer wins (tiktoken's
 * alternation has no defined order; Kimi's names are never prefixes of one another). */
static void index_special(kl_tokenizer *t, uint32_t id)
{
    const uint8_t *p = t->bytes + t->off[id];
    uint32_t len = tok_len(t, id), mask = 4 * KL_TOK_N_SPECIAL - 1;
    if (len == 1)
        t->spec_single[p[0]] = 1;
    else
        t->spec_pair[(p[0] << 8 | p[1]) >> 3] |= (uint8_t)(1u << (p[1] & 7));
    uint64_t i = hash_bytes(p, len) & mask;
    while (t->spec_slots[i] != NO_RANK)
        i = (i + 1) & mask;
    t->spec_slots[i] = id;
    uint32_t k = 0;
    while (k < t->n_spec_lens && t->spec_lens[k] > len)
        k++;
    if (k == t->n_spec_lens || t->spec_lens[k] != len) {
        memmove(t->spec_lens + k + 1, t->spec_lens + k, (t->n_spec_lens - k) * sizeof(uint32_t));
        t->spec_lens[k] = len;
        t->n_spec_lens++;
    }
}

/* Special id whose name is exactly p[0..n), or NO_RANK. */
static uint32_t special_of(const kl_tokenizer *t, const uint8_t *p, size_t n)
{
    uint32_t mask = 4 * KL_TOK_N_SPECIAL - 1;
    for (uint64_t i = hash_bytes(p, n) & mask;; i = (i + 1) & mask) {
        uint32_t id = t->spec_slots[i];
        if (id == NO_RANK)
            return NO_RANK;
        if (tok_len(t, id) == n && !memcmp(t->bytes + t->off[id], p, n))
            return id;
    }
}

/* Appends the special names after the regular tokens in t->bytes and indexes them. */
static int store_specials(kl_tokenizer *t, const char *text, const char **names, kl_err *err)
{
    size_t total = 0;
    char reserved[KL_TOK_N_SPECIAL][40];
    for (uint32_t k = 0; k < KL_TOK_N_SPECIAL; k++) {
        if (!names[k]) {
            snprintf(reserved[k], sizeof reserved[k], "<|reserved_token_%" PRIu32 "|>",
                     t->n_ranks + k);
            names[k] = reserved[k];
            t->control[k] = 1;
        }
        total += strlen(names[k]) + 1;
    }
    uint32_t base = t->off[t->n_ranks];
    memset(t->spec_slots, 0xFF, sizeof t->spec_slots);
    if (total > UINT32_MAX - base)
        return kl_fail(err, KL_E_FORMAT, "special token names too long");
    uint8_t *bytes = kl_realloc(t->bytes, base + total);
    t->name_text = kl_malloc(total);
    if (bytes)
        t->bytes = bytes;
    if (!bytes || !t->name_text ||
        kl_strmap_init(&t->spec_names, KL_TOK_N_SPECIAL))
        return kl_fail(err, KL_E_NOMEM, "out of memory for special tokens");
    uint32_t o = base;
    size_t no = 0;
    t->max_id_len = t->max_rank_len;
    for (uint32_t k = 0; k < KL_TOK_N_SPECIAL; k++) {
        size_t len = strlen(names[k]);
        uint32_t id = t->n_ranks + k;
        memcpy(t->bytes + o, names[k], len);
        memcpy(t->name_text + no, names[k], len + 1);
        t->off[id] = o;
        o += (uint32_t)len;
        t->off[id + 1] = o;
        if (len > t->max_id_len)
            t->max_id_len = (uint32_t)len;
        uint32_t prev;
        int r = kl_strmap_put(&t->spec_names, t->name_text + no, id, &prev);
        if (r < 0)
            return kl_fail(err, KL_E_NOMEM, "out of memory for special tokens");
        if (r == 1) {
            char key[16];
            snprintf(key, sizeof key, "%" PRIu32, id);
            return config_fail(err, text, key, "name %s already used by id %" PRIu32,
                               names[k], prev);
        }
        no += len + 1;
        index_special(t, id);
    }
    return 0;
}

static int load_config(kl_tokenizer *t, const char *path, kl_err *err)
{
    char *text = NULL;
    size_t n = 0;
    int rc = kl_read_file(path, MAX_CONFIG_BYTES, &text, &n, err);
    if (rc)
        return rc;
    cJSON *root = NULL;
    const char *names[KL_TOK_N_SPECIAL] = {0};
    rc = kl_json_parse(text, n, "TOK", &root, err); /* TOK-JSON / TOK-UTF8, with the line */
    if (!rc && !cJSON_IsObject(root)) {
        rc = kl_fail_rule(err, KL_E_FORMAT, "TOK-CONFIG", "top level is not a JSON object");
    } else if (!rc) {
        const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "added_tokens_decoder");
        if (dec && !cJSON_IsObject(dec)) {
            size_t off;
            uint32_t line = key_line(text, "added_tokens_decoder", &off);
            rc = kl_fail_at(err, KL_E_FORMAT, "TOK-CONFIG", NULL, off,
                            "line %" PRIu32 ": added_tokens_decoder is not an object", line);
        }
        if (!rc)
            rc = parse_added_tokens(t, text, dec, names, err);
        if (!rc)
            rc = store_specials(t, text, names, err);   /* copies the names out of root */
    }
    cJSON_Delete(root);
    kl_free(text);
    if (rc)
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
    return rc;
}

static int compile_pattern(kl_tokenizer *t, kl_err *err)
{
    int code;
    PCRE2_SIZE at;
    t->re = pcre2_compile((PCRE2_SPTR)kimi_pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                          &code, &at, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return kl_fail(err, KL_E_BUG, "pre-tokenizer pattern does not compile at %zu: %s",
                       (size_t)at, (const char *)msg);
    }
    /* Without JIT PCRE2 interprets the same pattern, only slower: not an error. */
    (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);
    return 0;
}

/* ---- byte-pair merging ---------------------------------------------------------------------- */

typedef struct idvec {
    uint32_t *v;
    size_t    n, cap;
} idvec;

static int idvec_push(idvec *a, uint32_t id)
{
    if (kl_grow(&a->v, &a->cap, a->n + 1, sizeof *a->v))
        return KL_E_NOMEM;
    a->v[a->n++] = id;
    return 0;
}

/* tiktoken's _byte_pair_merge for short pieces: part boundaries start[0..np), rank[i] = rank of
 * the bytes of parts i and i+1 together; merge the lowest rank (leftmost on ties) until no
 * adjacent pair is a token.  O(n^2), fastest for the short pieces the regex produces. */
static int bpe_small(const kl_tokenizer *t, const uint8_t *p, size_t n, idvec *out)
{
    uint32_t start[BPE_SMALL + 1], rank[BPE_SMALL + 1];
    size_t np = n + 1;
    for (size_t i = 0; i + 1 < n; i++) {
        start[i] = (uint32_t)i;
        rank[i] = rank_of(t, p + i, 2);
    }
    start[n - 1] = (uint32_t)(n - 1);
    rank[n - 1] = NO_RANK;
    start[n] = (uint32_t)n;
    rank[n] = NO_RANK;
    for (;;) {
        uint32_t best = NO_RANK;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < np; i++)
            if (rank[i] < best) {
                best = rank[i];
                bi = i;
            }
        if (best == NO_RANK)
            break;
        /* parts bi and bi+1 become one: the pairs starting at bi-1 and bi change */
        if (bi > 0)
            rank[bi - 1] = bi + 2 < np ? rank_of(t, p + start[bi - 1], start[bi + 2] -
                                                 start[bi - 1]) : NO_RANK;
        rank[bi] = bi + 3 < np ? rank_of(t, p + start[bi], start[bi + 3] - start[bi]) : NO_RANK;
        memmove(start + bi + 1, start + bi + 2, (np - bi - 2) * sizeof *start);
        memmove(rank + bi + 1, rank + bi + 2, (np - bi - 2) * sizeof *rank);
        np--;
    }
    for (size_t i = 0; i + 1 < np; i++)
        if (idvec_push(out, rank_of(t, p + start[i], start[i + 1] - start[i])))
            return KL_E_NOMEM;
    return 0;
}

/* The same merge order for long pieces (whitespace runs, long words) in O(n log n): parts form a
 * linked list, candidate pairs sit in a min-heap keyed by (rank, start).  An entry is stale when
 * its part has died or its pair rank changed; a live part's pair only ever grows, and distinct
 * byte strings have distinct ranks, so "same rank" means "same pair". */
typedef struct heap_ent {
    uint32_t rank, pos;
} heap_ent;

static inline int ent_less(heap_ent a, heap_ent b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(heap_ent *h, size_t *n, heap_ent e)
{
    size_t i = (*n)++;
    while (i > 0 && ent_less(e, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n)
{
    heap_ent top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && ent_less(h[c + 1], h[c]))
            c++;
        if (!ent_less(h[c], last))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static int bpe_large(const kl_tokenizer *t, const uint8_t *p, size_t n, idvec *out)
{
    /* node i = the part starting at byte i; next[i] = start of the following part (n = end) */
    uint32_t *next = kl_malloc((n + 1) * sizeof *next);
    uint32_t *prev = kl_malloc((n + 1) * sizeof *prev);
    uint32_t *rank = kl_malloc((n + 1) * sizeof *rank);  /* pair rank, NO_RANK if dead/none */
    heap_ent *heap = kl_malloc(3 * n * sizeof *heap);   /* n initial + 2 per merge (< n) */
    int rc = 0;
    if (!next || !prev || !rank || !heap) {
        rc = KL_E_NOMEM;
        goto done;
    }
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        next[i] = (uint32_t)i + 1;
        prev[i] = (uint32_t)i - 1;   /* wraps for i = 0; never read there */
        rank[i] = i + 1 < n ? rank_of(t, p + i, 2) : NO_RANK;
        if (rank[i] != NO_RANK)
            heap_push(heap, &hn, (heap_ent){rank[i], (uint32_t)i});
    }
    while (hn) {
        heap_ent e = heap_pop(heap, &hn);
        uint32_t i = e.pos;
        if (rank[i] != e.rank)
            continue;                                  /* stale */
        uint32_t j = next[i];                          /* merge part j into part i */
        next[i] = next[j];
        if (next[j] < n)
            prev[next[j]] = i;
        rank[j] = NO_RANK;
        uint32_t nn = next[i];
        rank[i] = nn < n ? rank_of(t, p + i, next[nn] - i) : NO_RANK;
        if (rank[i] != NO_RANK)
            heap_push(heap, &hn, (heap_ent){rank[i], i});
        if (i > 0) {
            uint32_t q = prev[i];
            rank[q] = rank_of(t, p + q, next[i] - q);
            if (rank[q] != NO_RANK)
                heap_push(heap, &hn, (heap_ent){rank[q], q});
        }
    }
    for (uint32_t i = 0; i < n; i = next[i])
        if (idvec_push(out, rank_of(t, p + i, next[i] - i))) {
            rc = KL_E_NOMEM;
            break;
        }
done:
    kl_free(next);
    kl_free(prev);
    kl_free(rank);
    kl_free(heap);
    return rc;
}

/* One regex piece: a whole token if it is one (tiktoken checks this first), else merged. */
static int encode_piece(const kl_tokenizer *t, const uint8_t *p, size_t n, idvec *out)
{
    uint32_t r = rank_of(t, p, n);
    if (r != NO_RANK)
        return idvec_push(out, r);
    return n <= BPE_SMALL ? bpe_small(t, p, n, out) : bpe_large(t, p, n, out);
}

/* ---- encoder -------------------------------------------------------------------------------- */

typedef struct encoder {
    const kl_tokenizer  *t;
    pcre2_match_data    *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack     *jit;
    idvec                ids;
    const uint8_t       *text;   /* the whole input (offsets in errors are relative to it) */
} encoder;

/* Kimi's pattern over s[start..end): each match is encoded as a piece.  The subject ends at
 * end, so lookaheads there see the end of the string, as in tiktoken's find_iter over the text
 * between two specials. */
static int split_regex(encoder *e, const uint8_t *s, size_t start, size_t end, kl_err *err)
{
    size_t off = start;
    while (off < end) {
        /* The input was validated once; without NO_UTF_CHECK every call re-validates the whole
         * subject and the split becomes quadratic (293 s instead of 0.06 s on 4 MB). */
        int rc = pcre2_match(e->t->re, s, end, off, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kl_fail_at(err, KL_E_UNSUPPORTED, NULL, NULL, (uint64_t)(s + off - e->text),
                              "pre-tokenizer regex failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        if (ov[1] <= ov[0]) {  /* no alternative matches empty; guard against a loop anyway */
            off = ov[0] + 1;
            while (off < end && (s[off] & 0xC0) == 0x80)
                off++;
            continue;
        }
        if (encode_piece(e->t, s + ov[0], ov[1] - ov[0], &e->ids))
            return kl_fail(err, KL_E_NOMEM, "out of memory encoding");
        off = ov[1];
    }
    return 0;
}

/* Leftmost special-token name in s[from..n): 1 with *at and *id set, or 0. */
static int find_special(const kl_tokenizer *t, const uint8_t *s, size_t from, size_t n,
                        size_t *at, uint32_t *id)
{
    for (size_t i = from; i < n; i++) {
        int pair = i + 1 < n && (t->spec_pair[(s[i] << 8 | s[i + 1]) >> 3] >> (s[i + 1] & 7)) & 1;
        if (!pair && !t->spec_single[s[i]])
            continue;
        for (uint32_t k = 0; k < t->n_spec_lens; k++) {
            size_t len = t->spec_lens[k];
            uint32_t sid = len <= n - i ? special_of(t, s + i, len) : NO_RANK;
            if (sid != NO_RANK) {
                *at = i;
                *id = sid;
                return 1;
            }
        }
    }
    return 0;
}

/* tiktoken's encode(s, allowed_special="all") of one piece of Kimi's cut. */
static int encode_with_specials(encoder *e, const uint8_t *s, size_t n, kl_err *err)
{
    size_t pos = 0;
    for (;;) {
        size_t at = n;
        uint32_t sid = 0;
        int found = find_special(e->t, s, pos, n, &at, &sid);
        int rc = split_regex(e, s, pos, at, err);
        if (rc)
            return rc;
        if (!found)
            return 0;
        if (idvec_push(&e->ids, sid))
            return kl_fail(err, KL_E_NOMEM, "out of memory encoding");
        pos = at + tok_len(e->t, sid);
    }
}

/* Kimi's _split_whitespaces_or_nonwhitespaces over one 400k-code-point chunk: cut wherever a run
 * of whitespace or of non-whitespace would exceed KL_TOK_MAX_RUN_CHARS code points. */
static int encode_chunk(encoder *e, const uint8_t *s, size_t n, kl_err *err)
{
    size_t i = 0, slice_start = 0, run = 0;
    int run_space = -1;
    while (i < n) {
        size_t here = i;
        int space = py_isspace(utf8_next(s, &i));
        if (space != run_space && run_space >= 0) {
            run = 1;
        } else if (++run > KL_TOK_MAX_RUN_CHARS) {
            int rc = encode_with_specials(e, s + slice_start, here - slice_start, err);
            if (rc)
                return rc;
            slice_start = here;
            run = 1;
        }
        run_space = space;
    }
    return encode_with_specials(e, s + slice_start, n - slice_start, err);
}

/* ---- public API ----------------------------------------------------------------------------- */

int kl_tok_open(const char *dir, kl_tokenizer **out, kl_err *err)
{
    char path[4096];
    kl_tokenizer *t = kl_calloc(1, sizeof *t);
    if (!t)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the tokenizer");
    int rc = kl_path_join(path, sizeof path, dir, "tiktoken.model", err);
    if (!rc)
        rc = load_model(t, path, err);
    if (!rc)
        rc = kl_path_join(path, sizeof path, dir, "tokenizer_config.json", err);
    if (!rc)
        rc = load_config(t, path, err);
    if (!rc)
        rc = compile_pattern(t, err);
    if (rc) {
        kl_tok_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

void kl_tok_close(kl_tokenizer *t)
{
    if (!t)
        return;
    kl_free(t->bytes);
    kl_free(t->off);
    kl_free(t->slots);
    kl_strmap_free(&t->spec_names);
    kl_free(t->name_text);
    pcre2_code_free(t->re);
    kl_free(t);
}

uint32_t kl_tok_n_vocab(const kl_tokenizer *t)
{
    return t->n_vocab;
}

uint32_t kl_tok_n_ranks(const kl_tokenizer *t)
{
    return t->n_ranks;
}

const uint8_t *kl_tok_token_bytes(const kl_tokenizer *t, kl_token id, size_t *len)
{
    if (id >= t->n_vocab)
        return NULL;
    *len = tok_len(t, id);
    return t->bytes + t->off[id];
}

int kl_tok_special_id(const kl_tokenizer *t, const char *name, kl_token *id)
{
    return kl_strmap_get(&t->spec_names, name, id);
}

int kl_tok_is_control(const kl_tokenizer *t, kl_token id)
{
    return id >= t->n_ranks && id < t->n_vocab && t->control[id - t->n_ranks];
}

int kl_tok_encode(const kl_tokenizer *t, const char *text, size_t n, kl_token **ids,
                  size_t *n_ids, kl_err *err)
{
    const uint8_t *s = (const uint8_t *)text;
    size_t valid = utf8_valid_prefix(s, n);
    if (valid < n)
        return kl_fail_at(err, KL_E_USAGE, NULL, NULL, valid,
                          "input is not valid UTF-8 at byte %zu", valid);
    encoder e = {.t = t, .text = s};
    int rc = 0;
    e.md = pcre2_match_data_create_from_pattern(t->re, NULL);
    e.mctx = pcre2_match_context_create(NULL);
    /* The JIT's default 32 KiB stack is too small for backtracking over long runs (Kimi lets a
     * letter run reach 25,000 characters); it grows on demand up to JIT_STACK_MAX. */
    e.jit = pcre2_jit_stack_create(32 * 1024, JIT_STACK_MAX, NULL);
    if (!e.md || !e.mctx || !e.jit) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for the regex matcher");
        goto done;
    }
    pcre2_jit_stack_assign(e.mctx, NULL, e.jit);
    /* Kimi's first cut: 400,000-code-point chunks */
    size_t i = 0;
    while (!rc && i < n) {
        size_t start = i;
        for (uint32_t k = 0; k < KL_TOK_MAX_ENCODE_CHARS && i < n; k++)
            utf8_next(s, &i);
        rc = encode_chunk(&e, s + start, i - start, err);
    }
    if (rc) {
        kl_free(e.ids.v);
        goto done;
    }
    *ids = e.ids.v;
    *n_ids = e.ids.n;
done:
    pcre2_jit_stack_free(e.jit);
    pcre2_match_context_free(e.mctx);
    pcre2_match_data_free(e.md);
    return rc;
}

int kl_tok_decode(const kl_tokenizer *t, const kl_token *ids, size_t n_ids, unsigned flags,
                  char **out, size_t *len, kl_err *err)
{
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] >= t->n_vocab)
            return kl_fail(err, KL_E_USAGE, "token id %" PRIu32 " (position %zu) is outside the "
                           "vocabulary of %" PRIu32, ids[i], i, t->n_vocab);
        total += tok_len(t, ids[i]);
    }
    char *buf = kl_malloc(total + 1);
    if (!buf)
        return kl_fail(err, KL_E_NOMEM, "out of memory decoding %zu bytes", total);
    size_t o = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if ((flags & KL_TOK_SKIP_CONTROL) && kl_tok_is_control(t, ids[i]))
            continue;
        memcpy(buf + o, t->bytes + t->off[ids[i]], tok_len(t, ids[i]));
        o += tok_len(t, ids[i]);
    }
    buf[o] = 0;
    *out = buf;
    *len = o;
    return 0;
}

int kl_tok_stream_init(kl_tok_stream *s, const kl_tokenizer *t, unsigned flags, kl_err *err)
{
    memset(s, 0, sizeof *s);
    s->cap = (size_t)t->max_id_len + 4;
    s->buf = kl_malloc(s->cap);
    if (!s->buf)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the detokenizer");
    s->tok = t;
    s->flags = flags;
    return 0;
}

int kl_tok_stream_push(kl_tok_stream *s, kl_token id, const char **text, size_t *len,
                       kl_err *err)
{
    const kl_tokenizer *t = s->tok;
    if (id >= t->n_vocab)
        return kl_fail(err, KL_E_USAGE, "token id %" PRIu32 " is outside the vocabulary of %"
                       PRIu32, id, t->n_vocab);
    /* the bytes held back by the previous call move to the front */
    memmove(s->buf, s->buf + s->held_off, s->held);
    size_t n = s->held;
    if (!((s->flags & KL_TOK_SKIP_CONTROL) && kl_tok_is_control(t, id))) {
        memcpy(s->buf + n, t->bytes + t->off[id], tok_len(t, id));
        n += tok_len(t, id);
    }
    s->held = utf8_incomplete_tail(s->buf, n);
    s->held_off = n - s->held;
    *text = (const char *)s->buf;
    *len = n - s->held;
    return 0;
}

void kl_tok_stream_flush(kl_tok_stream *s, const char **text, size_t *len)
{
    *text = (const char *)s->buf + s->held_off;
    *len = s->held;
    s->held = 0;
    s->held_off = 0;
}

void kl_tok_stream_free(kl_tok_stream *s)
{
    kl_free(s->buf);
    memset(s, 0, sizeof *s);
}
