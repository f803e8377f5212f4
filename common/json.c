/*
 * common/json.c — the one strict JSON reader of kl (see json.h).
 *
 * Divisions, in order: the lexer (one number scanner, UTF-8 and control bytes); error
 * messages; number literals kept on their nodes; integers; the plain subset (kl_json_scan);
 * public API in header order.
 *
 * kl_json_parse runs the lexer over the whole text first (so a bad byte is reported as such,
 * with its offset, rather than as whatever cJSON makes of it), then cJSON, then checks that
 * only whitespace follows the value, then walks the tree and the text together to give each
 * number node its source text: cJSON builds object members and array elements in document
 * order, so the k-th number node in pre-order is the k-th number token of the text.
 */
#include "common/json.h"

#include "common/utf8.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Lexer                                                                                      */

/* A position in the text and whether it is inside a string. */
typedef struct lexer {
    const uint8_t *p;
    size_t         n, i;
    int            in_str;
} lexer;

/* What lex_next stopped at. */
enum { LEX_END, LEX_NUMBER, LEX_BAD_UTF8, LEX_BAD_JSON };

static int is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static int is_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Length of the JSON number at p (RFC 8259 grammar), 0 if malformed.  cJSON hands the run to
 * strtod, which would also take "01", "1." or "-"; serde_json and Python's json refuse them. */
static size_t number_len(const uint8_t *p, size_t n)
{
    size_t i = 0;
    if (p[i] == '-')
        i++;
    if (i >= n || !is_digit(p[i]))
        return 0;
    if (p[i] == '0')
        i++;
    else
        while (i < n && is_digit(p[i]))
            i++;
    if (i < n && p[i] == '.') {
        if (++i >= n || !is_digit(p[i]))
            return 0;
        while (i < n && is_digit(p[i]))
            i++;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        if (++i < n && (p[i] == '+' || p[i] == '-'))
            i++;
        if (i >= n || !is_digit(p[i]))
            return 0;
        while (i < n && is_digit(p[i]))
            i++;
    }
    /* A number must not run on into more number characters ("01", "1.2.3", "1-2"). */
    if (i < n &&
        (is_digit(p[i]) || p[i] == '.' || p[i] == 'e' || p[i] == 'E' || p[i] == '+' || p[i] == '-'))
        return 0;
    return i;
}

/* Inside a string, at a backslash: 1 if the escape is \u0000. */
static int is_escaped_nul(const uint8_t *p, size_t avail)
{
    return avail >= 6 && p[1] == 'u' && memcmp(p + 2, "0000", 4) == 0;
}

/* Bytes to step over at lx->i inside a string, 0 with *why if the byte is not allowed there. */
static size_t string_step(const lexer *lx, const char **why)
{
    const uint8_t *p = lx->p + lx->i;
    size_t avail = lx->n - lx->i;
    if (*p != '\\') {
        *why = *p ? "raw control character in a string" : "NUL byte in a string";
        return *p >= 0x20 ? 1 : 0;
    }
    *why = "escaped NUL (\\u0000) in a string";
    if (is_escaped_nul(p, avail))
        return 0;
    /* Skip the escaped character when it is ASCII (a quote or backslash must not end the
     * string); a non-ASCII one is left to the UTF-8 check (cJSON refuses the escape). */
    return avail > 1 && p[1] < 0x80 ? 2 : 1;
}

/* Advances lx to just after the next number token (its start in *at, length *len), to the end
 * of the text (LEX_END), or to a byte that breaks the lexical rules (lx->i at it, *why set). */
static int lex_next(lexer *lx, size_t *at, size_t *len, const char **why)
{
    while (lx->i < lx->n) {
        uint8_t c = lx->p[lx->i];
        size_t step = 1;
        if (c >= 0x80) {
            step = kl_utf8_seq(lx->p + lx->i, lx->n - lx->i);
            *why = "invalid UTF-8 sequence";
            if (!step)
                return LEX_BAD_UTF8;
        } else if (lx->in_str) {
            if (c == '"')
                lx->in_str = 0;
            else if (c == '\\' || c < 0x20)
                step = string_step(lx, why);
            if (!step)
                return LEX_BAD_JSON;
        } else if (c == '"') {
            lx->in_str = 1;
        } else if (c == '-' || is_digit(c)) {
            *at = lx->i;
            *len = number_len(lx->p + lx->i, lx->n - lx->i);
            *why = "malformed number";
            if (!*len)
                return LEX_BAD_JSON;
            lx->i += *len;
            return LEX_NUMBER;
        } else if (c < 0x20 && !is_space(c)) {
            *why = c ? "control character outside a string" : "NUL byte";
            return LEX_BAD_JSON;
        }
        lx->i += step;
    }
    return LEX_END;
}

/* ------------------------------------------------------------------------------------------ */
/* Error messages                                                                             */

/* Fails with rule "<rules>-<kind>" at byte off; the message gets a "line N: " prefix when the
 * text has more than one line. */
static int json_fail(const char *text, size_t len, const char *rules, const char *kind,
                     size_t off, const char *what, kl_err *err)
{
    char rule[24], where[32] = "";
    snprintf(rule, sizeof rule, "%s-%s", rules, kind);
    if (len && memchr(text, '\n', len)) {
        unsigned line = 1;
        for (size_t i = 0; i < off && i < len; i++)
            line += text[i] == '\n';
        snprintf(where, sizeof where, "line %u: ", line);
    }
    return kl_fail_at(err, KL_E_FORMAT, rule, NULL, off, "%s%s", where, what);
}

/* The whole text through the lexer; the first problem is the error. */
static int check_lexical(const char *text, size_t len, const char *rules, kl_err *err)
{
    lexer lx = {(const uint8_t *)text, len, 0, 0};
    size_t at, n;
    const char *why = NULL;
    int kind;
    while ((kind = lex_next(&lx, &at, &n, &why)) == LEX_NUMBER)
        ;
    if (kind == LEX_END)
        return 0;
    char what[96];
    snprintf(what, sizeof what, "not valid %s: %s", kind == LEX_BAD_UTF8 ? "UTF-8" : "JSON",
             why);
    return json_fail(text, len, rules, kind == LEX_BAD_UTF8 ? "UTF8" : "JSON", lx.i, what, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Number literals on their nodes                                                            */

/* Gives every number node under v (pre-order) the text of the next number token of lx. */
static int keep_literals(cJSON *v, lexer *lx)
{
    for (; v; v = v->next) {
        if (cJSON_IsNumber(v)) {
            size_t at = 0, n = 0;
            const char *why;
            if (lex_next(lx, &at, &n, &why) != LEX_NUMBER)
                return KL_E_BUG;
            v->valuestring = cJSON_malloc(n + 1);
            if (!v->valuestring)
                return KL_E_NOMEM;
            memcpy(v->valuestring, lx->p + at, n);
            v->valuestring[n] = '\0';
        }
        int rc = v->child ? keep_literals(v->child, lx) : 0;
        if (rc)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Integers                                                                                   */

/* The integer rules on a number's source text (a complete, well-formed JSON number). */
static kl_json_int literal_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (strpbrk(s, ".eE"))
        return KL_JSON_INT_NOT_INTEGER;
    if (s[0] == '-')
        return KL_JSON_INT_NEGATIVE;
    uint64_t v = 0;
    for (; *s; s++) {
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return KL_JSON_INT_TOO_LARGE;
        v = v * 10 + d;
    }
    if (v > max)
        return KL_JSON_INT_TOO_LARGE;
    *out = v;
    return KL_JSON_INT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The plain subset                                                                           */

static void scan_space(kl_json_scan *s)
{
    while (s->p < s->end && is_space((uint8_t)*s->p))
        s->p++;
}

int kl_json_scan_char(kl_json_scan *s, char c)
{
    scan_space(s);
    if (s->p == s->end || *s->p != c)
        return 0;
    s->p++;
    return 1;
}

/* Nonzero when one of the 8 bytes of w is below 0x20 or above 0x7f, a quote or a backslash:
 * the usual tests for a byte below n (n <= 0x80) and a zero byte, on all 8 at once. */
static uint64_t word_not_plain(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
    return (w & high) | ((w - ones * 0x20) & ~w & high) | ((q - ones) & ~q & high) |
           ((b - ones) & ~b & high);
}

int kl_json_scan_str(kl_json_scan *s, const char **at, size_t *len)
{
    if (!kl_json_scan_char(s, '"'))
        return 0;
    const char *q = s->p;
    /* printable ASCII (0x20..0x7f) other than the quote and the backslash: 8 bytes a step,
     * then byte by byte from the word that holds the end */
    for (uint64_t w; s->end - q >= 8; q += 8) {
        memcpy(&w, q, 8);
        if (word_not_plain(w))
            break;
    }
    while (q < s->end && (uint8_t)*q >= 0x20 && (uint8_t)*q < 0x80 && *q != '"' && *q != '\\')
        q++;
    if (q == s->end || *q != '"')
        return 0;
    *at = s->p;
    *len = (size_t)(q - s->p);
    s->p = q + 1;
    return 1;
}

int kl_json_scan_u64(kl_json_scan *s, uint64_t max, uint64_t *out)
{
    scan_space(s);
    size_t avail = (size_t)(s->end - s->p), n = avail ? number_len((const uint8_t *)s->p, avail)
                                                        : 0;
    if (!n || !is_digit((uint8_t)s->p[0]))
        return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit((uint8_t)s->p[i]))   /* a fraction or an exponent */
            return 0;
        uint64_t d = (uint64_t)(s->p[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    if (v > max)
        return 0;
    s->p += n;
    *out = v;
    return 1;
}

/* After a member or element: 1 and the ',' consumed when another follows, 0 and close consumed
 * at the end of the object or array, -1 for anything else. */
static int scan_next(kl_json_scan *s, char close)
{
    scan_space(s);
    if (s->p < s->end && (*s->p == ',' || *s->p == close))
        return *s->p++ == ',';
    return -1;
}

int kl_json_scan_list(kl_json_scan *s, char open, char close, kl_json_scan_item_fn item,
                      void *ctx)
{
    if (!kl_json_scan_char(s, open))
        return 0;
    if (kl_json_scan_char(s, close))
        return 1;
    int more;
    do {
        if (!item(ctx, s))
            return 0;
    } while ((more = scan_next(s, close)) == 1);
    return more == 0;
}

int kl_json_scan_at_end(kl_json_scan *s)
{
    scan_space(s);
    return s->p == s->end;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                 */

int kl_json_parse(const char *text, size_t len, const char *rules, cJSON **out, kl_err *err)
{
    const char *end = NULL;
    size_t pos = 0;
    text = text ? text : "";
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
        return json_fail(text, len, rules, "JSON", 0,
                         "starts with a UTF-8 byte-order mark, which JSON does not allow", err);
    int rc = check_lexical(text, len, rules, err);
    if (rc)
        return rc;
    while (pos < len && is_space((uint8_t)text[pos]))
        pos++;
    if (pos == len)
        return json_fail(text, len, rules, "JSON", pos, "no JSON value (empty text)", err);
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    pos = end ? (size_t)(end - text) : 0;
    if (!root)
        return json_fail(text, len, rules, "JSON", pos, "not valid JSON", err);
    while (pos < len && is_space((uint8_t)text[pos]))
        pos++;
    if (pos < len) {
        cJSON_Delete(root);
        return json_fail(text, len, rules, "JSON", pos, "unexpected bytes after the JSON value",
                         err);
    }
    lexer lx = {(const uint8_t *)text, len, 0, 0};
    if ((rc = keep_literals(root, &lx))) {
        cJSON_Delete(root);
        return rc == KL_E_NOMEM ? kl_fail(err, rc, "out of memory for JSON numbers")
                                : kl_fail(err, rc, "JSON numbers and parse tree disagree");
    }
    *out = root;
    return 0;
}

kl_json_int kl_json_get_u64(const cJSON *v, uint64_t max, uint64_t *out)
{
    char buf[40];
    if (!cJSON_IsNumber(v))
        return KL_JSON_INT_NOT_NUMBER;
    const char *s = v->valuestring;
    if (!s) {
        if (!isfinite(v->valuedouble))
            return KL_JSON_INT_NOT_INTEGER;
        snprintf(buf, sizeof buf, "%.17g", v->valuedouble);
        s = buf;
    }
    return literal_u64(s, max, out);
}

const char *kl_json_int_why(kl_json_int r)
{
    switch (r) {
    case KL_JSON_INT_OK:
        return "";
    case KL_JSON_INT_NOT_NUMBER:
        return "is not a number";
    case KL_JSON_INT_NOT_INTEGER:
        return "is not an integer (it is written with a fraction or an exponent)";
    case KL_JSON_INT_NEGATIVE:
        return "is negative";
    case KL_JSON_INT_TOO_LARGE:
        return "is too large";
    }
    return "is not an integer";
}

const char *kl_json_number_text(const cJSON *v)
{
    return cJSON_IsNumber(v) ? v->valuestring : NULL;
}
