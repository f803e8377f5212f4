/*
 * engine/chat.c — Kimi chat format (see chat.h).
 *
 * Sections: string builder; tools JSON (read, sort, write); rendering; tool-call parsing;
 * stop ids.
 */
#include "engine/chat.h"

#include "common/grow.h"
#include "common/json.h"
#include "common/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* String builder                                                                             */

typedef struct sbuf {
    char  *p;
    size_t len, cap;
    int    oom;   /* sticky: set on the first failed allocation */
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (kl_grow(&b->p, &b->cap, b->len + n + 1, 1)) {
        b->oom = 1;
        return;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* ------------------------------------------------------------------------------------------ */
/* Tools JSON: read by the strict reader (common/json.h), then written back the way Python's
 * json.dumps writes it: keys sorted (unless asked not to), the caller's separators, numbers as
 * their source text, and a repeated key in its first place with its last value, as a dict.   */

/* json.dumps(ensure_ascii=False) string: escapes ", \, and control characters only. */
static void jwrite_string(sbuf *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = strlen(s);
    sb_add(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                memcpy(u, "\\u00", 4);
                u[4] = hex[c >> 4];
                u[5] = hex[c & 15];
                u[6] = '\0';
                esc = u;
            }
        }
        if (!esc) {
            run++;
            continue;
        }
        sb_add(b, s + i - run, run);
        run = 0;
        sb_str(b, esc);
    }
    sb_add(b, s + n - run, run);
    sb_add(b, "\"", 1);
}

/* Python sorts str keys by code point, which is UTF-8 byte order. */
static int cmp_key(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* The members of object o as a dict sees them: each key once, in the place it first appeared
 * (or sorted), with the value it was last given.  Returns a kl_malloc'd array and its length
 * in *n, or NULL on no memory (an empty object gives a non-NULL array of 0). */
static const cJSON **dict_members(const cJSON *o, int sorted, size_t *n)
{
    size_t count = 0;
    for (const cJSON *m = o->child; m; m = m->next)
        count++;
    const cJSON **v = kl_malloc((count ? count : 1) * sizeof *v);
    if (!v)
        return NULL;
    size_t k = 0;
    for (const cJSON *m = o->child; m; m = m->next) {
        size_t j = 0;
        while (j < k && strcmp(v[j]->string, m->string) != 0)
            j++;
        v[j] = m; /* a repeated key: its first place, this (later) value */
        k += j == k;
    }
    if (sorted)
        qsort(v, k, sizeof *v, cmp_key);
    *n = k;
    return v;
}

static int jwrite(sbuf *b, const cJSON *n, const kl_chat_opts *o)
{
    const char *item_sep = o->tools_json == KL_CHAT_JSON_PYTHON ? ", " : ",";
    const char *key_sep = o->tools_json == KL_CHAT_JSON_PYTHON ? ": " : ":";
    if (cJSON_IsString(n)) {
        jwrite_string(b, n->valuestring);
    } else if (cJSON_IsNumber(n)) {
        sb_str(b, kl_json_number_text(n));
    } else if (cJSON_IsBool(n) || cJSON_IsNull(n)) {
        sb_str(b, cJSON_IsTrue(n) ? "true" : cJSON_IsFalse(n) ? "false" : "null");
    } else if (cJSON_IsArray(n)) {
        sb_add(b, "[", 1);
        for (const cJSON *e = n->child; e; e = e->next) {
            if (e != n->child)
                sb_str(b, item_sep);
            if (jwrite(b, e, o))
                return KL_E_NOMEM;
        }
        sb_add(b, "]", 1);
    } else { /* object */
        size_t k;
        const cJSON **m = dict_members(n, !o->no_sort_keys, &k);
        if (!m)
            return KL_E_NOMEM;
        sb_add(b, "{", 1);
        int rc = 0;
        for (size_t i = 0; i < k && !rc; i++) {
            if (i)
                sb_str(b, item_sep);
            jwrite_string(b, m[i]->string);
            sb_str(b, key_sep);
            rc = jwrite(b, m[i], o);
        }
        kl_free(m);
        if (rc)
            return rc;
        sb_add(b, "}", 1);
    }
    return 0;
}

/* Appends the tools turn for tools_json (nothing for NULL, "" or an empty array). */
static int render_tools(sbuf *b, const char *tools_json, const kl_chat_opts *o, kl_err *err)
{
    if (!tools_json || !*tools_json)
        return 0;
    cJSON *root = NULL;
    int rc = kl_json_parse(tools_json, strlen(tools_json), "TOOLS", &root, err);
    if (rc == KL_E_FORMAT) { /* the caller's request is malformed, not a file kl reads */
        if (err) {
            char msg[sizeof err->msg];
            memcpy(msg, err->msg, sizeof msg);
            err->code = KL_E_USAGE;
            snprintf(err->msg, sizeof err->msg, "tools JSON: %.*s at byte %llu",
                     (int)(sizeof err->msg - 64), msg, (unsigned long long)err->offset);
        }
        return KL_E_USAGE;
    }
    if (rc)
        return rc;
    if (!cJSON_IsArray(root))
        rc = kl_fail(err, KL_E_USAGE, "tools JSON must be an array of tool declarations");
    if (rc == 0 && root->child) {
        sb_str(b, "<|im_system|>tool_declare<|im_middle|>");
        if (o->tools_json == KL_CHAT_JSON_VERBATIM)
            sb_str(b, tools_json);
        else if (jwrite(b, root, o))
            rc = kl_fail(err, KL_E_NOMEM, "out of memory writing the tools JSON");
        sb_str(b, "<|im_end|>");
    }
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Rendering                                                                                  */

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL };

static int check_msgs(const kl_chat_msg *msgs, size_t n, int *roles, kl_err *err)
{
    static const char *const names[] = {"system", "user", "assistant", "tool"};
    for (size_t i = 0; i < n; i++) {
        const kl_chat_msg *m = &msgs[i];
        int r = -1;
        for (int k = 0; k < 4 && m->role; k++)
            if (!strcmp(m->role, names[k]))
                r = k;
        if (r < 0) {
            char shown[64];
            kl_escape_controls(shown, sizeof shown, m->role ? m->role : "(null)");
            return kl_fail(err, KL_E_USAGE,
                           "message %zu: unknown role '%s' (expected system, user, assistant "
                           "or tool)", i, shown);
        }
        if (r == ROLE_TOOL && !m->tool_call_id)
            return kl_fail(err, KL_E_USAGE, "message %zu: tool message without tool_call_id", i);
        if (m->n_tool_calls && r != ROLE_ASSISTANT)
            return kl_fail(err, KL_E_USAGE, "message %zu: only assistant messages carry tool "
                           "calls (role is %s)", i, names[r]);
        if (m->n_tool_calls && !m->tool_calls)
            return kl_fail(err, KL_E_USAGE, "message %zu: %zu tool calls but no array", i,
                           m->n_tool_calls);
        for (size_t c = 0; c < m->n_tool_calls; c++)
            if (!m->tool_calls[c].name || !m->tool_calls[c].arguments)
                return kl_fail(err, KL_E_USAGE, "message %zu: tool call %zu has no %s", i, c,
                               !m->tool_calls[c].name ? "name" : "arguments");
        roles[i] = r;
    }
    return 0;
}

static void render_calls(sbuf *b, const kl_chat_msg *m, size_t *call_idx)
{
    sb_str(b, "<|tool_calls_section_begin|>");
    for (size_t c = 0; c < m->n_tool_calls; c++, (*call_idx)++) {
        const kl_chat_tool_call *tc = &m->tool_calls[c];
        sb_str(b, "<|tool_call_begin|>");
        if (tc->id) {
            sb_str(b, tc->id);
        } else {
            char idx[32];
            snprintf(idx, sizeof idx, ":%zu", *call_idx);
            sb_str(b, "functions.");
            sb_str(b, tc->name);
            sb_str(b, idx);
        }
        sb_str(b, "<|tool_call_argument_begin|>");
        sb_str(b, tc->arguments);
        sb_str(b, "<|tool_call_end|>");
    }
    sb_str(b, "<|tool_calls_section_end|>");
}

int kl_chat_render(const kl_chat_msg *msgs, size_t n, const char *tools_json,
                   int add_generation_prompt, char **out, kl_err *err)
{
    return kl_chat_render_opts(msgs, n, tools_json, add_generation_prompt, NULL, out, err);
}

int kl_chat_render_opts(const kl_chat_msg *msgs, size_t n, const char *tools_json,
                        int add_generation_prompt, const kl_chat_opts *opts, char **out,
                        kl_err *err)
{
    static const char *const markers[] = {"<|im_system|>", "<|im_user|>", "<|im_assistant|>",
                                          "<|im_system|>"};
    static const char *const names[] = {"system", "user", "assistant", "tool"};
    kl_chat_opts defaults = {KL_CHAT_JSON_COMPACT, 0};
    const kl_chat_opts *o = opts ? opts : &defaults;
    if (!out || (n && !msgs))
        return kl_fail(err, KL_E_USAGE, "kl_chat_render: NULL messages or output");
    if (o->tools_json < KL_CHAT_JSON_COMPACT || o->tools_json > KL_CHAT_JSON_VERBATIM)
        return kl_fail(err, KL_E_USAGE, "kl_chat_render: unknown tools JSON style %d",
                       o->tools_json);
    int *roles = kl_malloc((n ? n : 1) * sizeof *roles);
    if (!roles)
        return kl_fail(err, KL_E_NOMEM, "out of memory rendering the chat");
    int rc = check_msgs(msgs, n, roles, err);
    sbuf b = {0};
    size_t call_idx = 0;
    if (rc == 0)
        rc = render_tools(&b, tools_json, o, err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const kl_chat_msg *m = &msgs[i];
        int r = roles[i];
        sb_str(&b, markers[r]);
        sb_str(&b, m->name ? m->name : names[r]);
        sb_str(&b, "<|im_middle|>");
        if (r == ROLE_TOOL) {
            sb_str(&b, "## Return of ");
            sb_str(&b, m->tool_call_id);
            sb_str(&b, "\n");
        }
        sb_str(&b, m->content ? m->content : "");
        if (m->n_tool_calls)
            render_calls(&b, m, &call_idx);
        sb_str(&b, "<|im_end|>");
    }
    if (rc == 0 && add_generation_prompt)
        sb_str(&b, "<|im_assistant|>assistant<|im_middle|>");
    if (rc == 0 && !b.p)
        sb_str(&b, "");
    if (rc == 0 && b.oom)
        rc = kl_fail(err, KL_E_NOMEM, "out of memory rendering the chat");
    kl_free(roles);
    if (rc < 0) {
        kl_free(b.p);
        return rc;
    }
    *out = b.p;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Tool-call parsing (vLLM kimi_k2_tool_parser.py semantics)                                  */

static const char SECTION_BEGIN[] = "<|tool_calls_section_begin|>";
static const char SECTION_BEGIN_1[] = "<|tool_call_section_begin|>"; /* singular variant */
static const char CALL_BEGIN[] = "<|tool_call_begin|>";
static const char ARG_BEGIN[] = "<|tool_call_argument_begin|>";
static const char CALL_END[] = "<|tool_call_end|>";

static const char *find(const char *p, const char *end, const char *needle)
{
    size_t n = strlen(needle);
    if ((size_t)(end - p) < n)
        return NULL;
    return memmem(p, (size_t)(end - p), needle, n);
}

/* Length of the Python-str whitespace character at p (str.isspace, which is what re's \s
 * matches on str patterns), 0 if none. */
static size_t py_space(const char *p, const char *end)
{
    unsigned char c = (unsigned char)*p;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F))
        return 1;
    size_t avail = (size_t)(end - p);
    const unsigned char *u = (const unsigned char *)p;
    if (c == 0xC2 && avail >= 2 && (u[1] == 0x85 || u[1] == 0xA0))
        return 2;
    if (avail >= 3) {
        unsigned cp = 0;
        if ((c & 0xF0) == 0xE0 && (u[1] & 0xC0) == 0x80 && (u[2] & 0xC0) == 0x80)
            cp = ((c & 0x0Fu) << 12) | ((u[1] & 0x3Fu) << 6) | (u[2] & 0x3Fu);
        if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
            cp == 0x202F || cp == 0x205F || cp == 0x3000)
            return 3;
    }
    return 0;
}

static const char *skip_space(const char *p, const char *end)
{
    size_t k;
    while (p < end && (k = py_space(p, end)) > 0)
        p += k;
    return p;
}

/* Start of the trailing whitespace of [p, end). */
static const char *rtrim_space(const char *p, const char *end)
{
    for (;;) {
        if (end == p)
            return end;
        const char *q = end - 1; /* step back one UTF-8 character */
        while (q > p && ((unsigned char)*q & 0xC0) == 0x80 && end - q < 4)
            q--;
        if (py_space(q, end) != (size_t)(end - q))
            return end;
        end = q;
    }
}

typedef struct span {
    const char *p;
    size_t      n;
} span;

/* Tries the call regex at c (which points at <|tool_call_begin|>); on a match fills id/args and
 * returns the end of the match, else NULL. */
static const char *match_call(const char *c, const char *end, span *id, span *args)
{
    const char *s = c + strlen(CALL_BEGIN);
    const char *lt = memchr(s, '<', (size_t)(end - s));
    size_t arg_n = strlen(ARG_BEGIN);
    if (!lt || (size_t)(end - lt) < arg_n || memcmp(lt, ARG_BEGIN, arg_n))
        return NULL;
    /* ID = [^<]+:\d+ between optional whitespace; it cannot contain '<'. */
    const char *idend = rtrim_space(s, lt);
    const char *d = idend;
    while (d > s && d[-1] >= '0' && d[-1] <= '9')
        d--;
    if (d == idend || d == s || d[-1] != ':')
        return NULL;
    const char *colon = d - 1;
    const char *idstart = skip_space(s, colon);
    if (idstart == colon) {
        /* \s* gives back its last character so [^<]+ matches at least one */
        if (colon == s)
            return NULL;
        idstart = colon - 1;
        while (idstart > s && ((unsigned char)*idstart & 0xC0) == 0x80)
            idstart--;
    }
    /* \s* ARGS \s* <|tool_call_end|>, ARGS not containing <|tool_call_begin|> */
    const char *a = skip_space(lt + strlen(ARG_BEGIN), end);
    const char *e = find(a, end, CALL_END);
    if (!e)
        return NULL;
    const char *nb = find(a, e, CALL_BEGIN);
    if (nb)
        return NULL;
    const char *aend = rtrim_space(a, e);
    id->p = idstart;
    id->n = (size_t)(idend - idstart);
    args->p = a;
    args->n = (size_t)(aend - a);
    return e + strlen(CALL_END);
}

int kl_chat_parse_tool_calls(const char *text, size_t len, kl_chat_parsed *out, kl_err *err)
{
    memset(out, 0, sizeof *out);
    if (!text) {
        text = "";
        len = 0;
    }
    const char *end = text + len;
    const char *sec = len ? find(text, end, SECTION_BEGIN) : NULL;
    const char *sec1 = len ? find(text, end, SECTION_BEGIN_1) : NULL;
    if (!sec || (sec1 && sec1 < sec))
        sec = sec1;
    size_t content_n = sec ? (size_t)(sec - text) : len;

    /* First pass: count matches and bytes needed. */
    size_t n_calls = 0, bytes = content_n + 1;
    if (sec) {
        for (const char *p = text; (p = find(p, end, CALL_BEGIN)) != NULL;) {
            span id, args;
            const char *m = match_call(p, end, &id, &args);
            if (!m) {
                p++;
                continue;
            }
            n_calls++;
            bytes += 2 * id.n + args.n + 3;
            p = m;
        }
    }
    out->buf = kl_malloc(bytes);
    out->calls = n_calls ? kl_calloc(n_calls, sizeof *out->calls) : NULL;
    if (!out->buf || (n_calls && !out->calls)) {
        kl_chat_parsed_free(out);
        return kl_fail(err, KL_E_NOMEM, "out of memory parsing tool calls");
    }
    char *w = out->buf;
    memcpy(w, text, content_n);
    w[content_n] = '\0';
    out->content = content_n ? w : NULL;
    w += content_n + 1;
    out->tools_called = sec != NULL;
    if (!sec)
        return 0;
    for (const char *p = text; (p = find(p, end, CALL_BEGIN)) != NULL;) {
        span id, args;
        const char *m = match_call(p, end, &id, &args);
        if (!m) {
            p++;
            continue;
        }
        kl_chat_tool_call *tc = &out->calls[out->n_calls++];
        /* name = id.split(":")[0].split(".")[-1] */
        const char *nend = memchr(id.p, ':', id.n);
        const char *nbeg = nend;
        while (nbeg > id.p && nbeg[-1] != '.')
            nbeg--;
        memcpy(w, id.p, id.n);
        w[id.n] = '\0';
        tc->id = w;
        w += id.n + 1;
        memcpy(w, nbeg, (size_t)(nend - nbeg));
        w[nend - nbeg] = '\0';
        tc->name = w;
        w += (nend - nbeg) + 1;
        memcpy(w, args.p, args.n);
        w[args.n] = '\0';
        tc->arguments = w;
        w += args.n + 1;
        p = m;
    }
    return 0;
}

void kl_chat_parsed_free(kl_chat_parsed *p)
{
    if (!p)
        return;
    kl_free(p->calls);
    kl_free(p->buf);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------------------------------------ */
/* Stop ids                                                                                   */

int kl_chat_stop_ids(const kl_tokenizer *tok, kl_token ids[KL_CHAT_MAX_STOP], size_t *n,
                     kl_err *err)
{
    kl_token id;
    size_t k = 0;
    if (!tok || !ids || !n)
        return kl_fail(err, KL_E_USAGE, "kl_chat_stop_ids: NULL argument");
    if (!kl_tok_special_id(tok, "<|im_end|>", &id))
        return kl_fail(err, KL_E_FORMAT, "tokenizer has no <|im_end|> token to stop at");
    ids[k++] = id;
    if (kl_tok_special_id(tok, "[EOS]", &id))
        ids[k++] = id;
    if (kl_tok_special_id(tok, "[EOT]", &id))
        ids[k++] = id;
    *n = k;
    return 0;
}
