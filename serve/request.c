/*
 * serve/request.c — chat-completions request bodies (see request.h).
 *
 * Sections: errors and owned strings; messages; tools; sampling and limits; the request.
 */
#include "serve/request.h"

#include "common/grow.h"
#include "common/json.h"
#include "common/mem.h"
#include "serve/engine.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Errors and owned strings                                                                   */

int kl_api_fail(kl_api_error *e, int status, const char *type, const char *param,
                const char *fmt, ...)
{
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status >= 500 ? KL_E_NOMEM : KL_E_USAGE;
}

/* A 400 invalid_request_error about param. */
#define BAD(e, param, ...) kl_api_fail((e), 400, "invalid_request_error", (param), __VA_ARGS__)

static int nomem(kl_api_error *e)
{
    return kl_api_fail(e, 500, "server_error", NULL, "out of memory reading the request");
}

/* s (kl_malloc'd) now owned by r; NULL (and s freed) on allocation failure. */
static char *keep(kl_req_chat *r, char *s)
{
    if (s && kl_grow(&r->strings, &r->cap_strings, r->n_strings + 1, sizeof *r->strings)) {
        kl_free(s);
        return NULL;
    }
    if (s)
        r->strings[r->n_strings++] = s;
    return s;
}

/* A copy of s[0..n) owned by r (NULL on allocation failure). */
static char *own(kl_req_chat *r, const char *s, size_t n)
{
    char *c = kl_malloc(n + 1);
    if (c) {
        memcpy(c, s, n);
        c[n] = '\0';
    }
    return keep(r, c);
}

static char *own_str(kl_req_chat *r, const char *s)
{
    return own(r, s, strlen(s));
}

/* ------------------------------------------------------------------------------------------ */
/* Messages                                                                                   */

/* content: a string, null, or an array of {"type": "text", "text": S} parts (joined). */
static int message_content(kl_req_chat *r, const cJSON *c, const char *param, const char **out,
                           kl_api_error *e)
{
    *out = NULL;
    if (!c || cJSON_IsNull(c))
        return 0;
    if (cJSON_IsString(c))
        return (*out = own_str(r, c->valuestring)) ? 0 : nomem(e);
    if (!cJSON_IsArray(c))
        return BAD(e, param, "%s must be a string, null or an array of text parts", param);
    size_t n = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return BAD(e, param, "%s: only parts {\"type\": \"text\", \"text\": ...} are "
                       "supported (the model reads text only)", param);
        n += strlen(text->valuestring);
    }
    char *s = kl_malloc(n + 1);
    if (!s)
        return nomem(e);
    size_t at = 0;
    cJSON_ArrayForEach(part, c) {   /* the parts joined */
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t k = strlen(t);
        memcpy(s + at, t, k);
        at += k;
    }
    s[at] = '\0';
    return (*out = keep(r, s)) ? 0 : nomem(e);
}

/* An optional string member into *out (owned); absent or null leaves NULL. */
static int opt_string(kl_req_chat *r, const cJSON *obj, const char *key, const char *param,
                      const char **out, kl_api_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsString(v))
        return BAD(e, param, "%s must be a string", param);
    return (*out = own_str(r, v->valuestring)) ? 0 : nomem(e);
}

/* One assistant tool call: {id, type "function", function {name, arguments string}}. */
static int tool_call(kl_req_chat *r, const cJSON *c, const char *param, kl_chat_tool_call *tc,
                     kl_api_error *e)
{
    char p[160];
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
    if (!cJSON_IsObject(c) || (type && (!cJSON_IsString(type) ||
                                        strcmp(type->valuestring, "function"))) ||
        !cJSON_IsObject(fn))
        return BAD(e, param, "%s must be {\"id\", \"type\": \"function\", \"function\": "
                   "{\"name\", \"arguments\"}}", param);
    snprintf(p, sizeof p, "%s.id", param);
    int rc = opt_string(r, c, "id", p, &tc->id, e);
    snprintf(p, sizeof p, "%s.function.name", param);
    if (!rc && !(rc = opt_string(r, fn, "name", p, &tc->name, e)) && !tc->name)
        rc = BAD(e, p, "%s is required", p);
    snprintf(p, sizeof p, "%s.function.arguments", param);
    if (!rc && !(rc = opt_string(r, fn, "arguments", p, &tc->arguments, e)) && !tc->arguments)
        rc = BAD(e, p, "%s is required (a JSON text in a string)", p);
    return rc;
}

static int message_role(const cJSON *m, const char *param, const char **role, kl_api_error *e)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (!cJSON_IsString(v))
        return BAD(e, param, "%s.role is required: system, developer, user, assistant or tool",
                   param);
    for (size_t i = 0; i < sizeof roles / sizeof *roles; i++)
        if (!strcmp(v->valuestring, roles[i])) {
            *role = i == 1 ? "system" : roles[i];   /* developer messages are system ones */
            return 0;
        }
    return BAD(e, param, "%s.role '%s' is not one of system, developer, user, assistant, tool",
               param, v->valuestring);
}

/* messages[i] into r->msgs[i]; calls are the next free entries of r->calls. */
static int message(kl_req_chat *r, const cJSON *m, size_t i, size_t *next_call, kl_api_error *e)
{
    char param[64], p[96];
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!cJSON_IsObject(m))
        return BAD(e, param, "%s must be an object", param);
    kl_chat_msg *msg = &r->msgs[i];
    snprintf(p, sizeof p, "%s.content", param);
    int rc = message_role(m, param, &msg->role, e);
    if (!rc)
        rc = message_content(r, cJSON_GetObjectItemCaseSensitive(m, "content"), p,
                             &msg->content, e);
    snprintf(p, sizeof p, "%s.name", param);
    if (!rc)
        rc = opt_string(r, m, "name", p, &msg->name, e);
    snprintf(p, sizeof p, "%s.tool_call_id", param);
    if (!rc && !strcmp(msg->role, "tool") &&
        !(rc = opt_string(r, m, "tool_call_id", p, &msg->tool_call_id, e)) && !msg->tool_call_id)
        rc = BAD(e, p, "%s is required: the id of the call this message answers", p);
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (rc || !calls || cJSON_IsNull(calls))
        return rc;
    snprintf(p, sizeof p, "%s.tool_calls", param);
    if (strcmp(msg->role, "assistant") || !cJSON_IsArray(calls))
        return BAD(e, p, "%s: only assistant messages have tool_calls, as an array", p);
    msg->tool_calls = r->calls + *next_call;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        char cp[128];
        snprintf(cp, sizeof cp, "%s[%zu]", p, msg->n_tool_calls);
        if ((rc = tool_call(r, c, cp, &r->calls[(*next_call)++], e)))
            return rc;
        msg->n_tool_calls++;
    }
    return 0;
}

static int messages(kl_req_chat *r, const cJSON *ms, kl_api_error *e)
{
    if (!cJSON_IsArray(ms) || !cJSON_GetArraySize(ms))
        return BAD(e, "messages", "messages is required: a non-empty array of messages");
    size_t n = (size_t)cJSON_GetArraySize(ms), n_calls = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        n_calls += cJSON_IsArray(c) ? (size_t)cJSON_GetArraySize(c) : 0;
    }
    r->msgs = kl_calloc(n, sizeof *r->msgs);
    r->calls = n_calls ? kl_calloc(n_calls, sizeof *r->calls) : NULL;
    if (!r->msgs || (n_calls && !r->calls))
        return nomem(e);
    size_t i = 0, next = 0;
    cJSON_ArrayForEach(m, ms) {
        int rc = message(r, m, i++, &next, e);
        if (rc)
            return rc;
    }
    r->n_msgs = n;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Tools                                                                                      */

/* The declared tool named name, or NULL. */
static const cJSON *find_tool(const cJSON *tools, const char *name)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(nm) && !strcmp(nm->valuestring, name))
            return t;
    }
    return NULL;
}

static int tools(kl_req_chat *r, const cJSON *ts, kl_api_error *e)
{
    if (!ts || cJSON_IsNull(ts))
        return 0;
    if (!cJSON_IsArray(ts))
        return BAD(e, "tools", "tools must be an array of {\"type\": \"function\", \"function\": "
                   "{\"name\", \"description\", \"parameters\"}}");
    size_t i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, ts) {
        char p[64];
        snprintf(p, sizeof p, "tools[%zu]", i++);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
            !cJSON_IsObject(fn) || !cJSON_IsString(nm) || !*nm->valuestring)
            return BAD(e, p, "%s must be {\"type\": \"function\", \"function\": {\"name\": a "
                       "non-empty string, ...}}", p);
        if (find_tool(ts, nm->valuestring) != t)
            return BAD(e, p, "%s: the tool name '%s' is declared twice", p, nm->valuestring);
    }
    r->n_tools = i;
    if (!i)
        return 0;
    if (!(r->tool_names = kl_calloc(i, sizeof *r->tool_names)))
        return nomem(e);
    i = 0;
    cJSON_ArrayForEach(t, ts) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (!(r->tool_names[i++] = own_str(r, nm->valuestring)))
            return nomem(e);
    }
    char *text = cJSON_PrintUnformatted(ts);
    r->tools_json = text ? own_str(r, text) : NULL;
    cJSON_free(text);
    return r->tools_json ? 0 : nomem(e);
}

static int tool_choice(kl_req_chat *r, const cJSON *tc, const cJSON *ts, kl_api_error *e)
{
    r->tool_choice = r->n_tools ? KL_TOOL_AUTO : KL_TOOL_NONE;
    if (!tc || cJSON_IsNull(tc))
        return 0;
    static const char *const names[] = {"auto", "none", "required"};
    if (cJSON_IsString(tc)) {
        for (int i = 0; i < 3; i++)
            if (!strcmp(tc->valuestring, names[i])) {
                r->tool_choice = (kl_tool_choice)i;
                return i != KL_TOOL_REQUIRED || r->n_tools ? 0 :
                    BAD(e, "tool_choice", "tool_choice \"required\" needs tools");
            }
    }
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(nm))
        return BAD(e, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or "
                   "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (!find_tool(ts, nm->valuestring))
        return BAD(e, "tool_choice", "tool_choice names '%s', which is not among the tools",
                   nm->valuestring);
    r->tool_choice = KL_TOOL_NAMED;
    return (r->tool_choice_name = own_str(r, nm->valuestring)) ? 0 : nomem(e);
}

/* ------------------------------------------------------------------------------------------ */
/* Sampling and limits                                                                        */

/* An optional number in [lo, hi] (lo excluded when open_lo) into *out. */
static int opt_number(const cJSON *o, const char *key, double lo, double hi, int open_lo,
                      float *out, kl_api_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= lo && d <= hi) || (open_lo && d == lo))
        return BAD(e, key, "%s must be a number in %s%g, %g]", key, open_lo ? "(" : "[", lo, hi);
    *out = (float)d;
    return 0;
}

/* An optional integer in lo..hi into *out; *given set when present. */
static int opt_count(const cJSON *o, const char *key, uint64_t lo, uint64_t hi, uint64_t *out,
                     int *given, kl_api_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (given)
        *given = 0;
    if (!v || cJSON_IsNull(v))
        return 0;
    uint64_t u;
    kl_json_int why = kl_json_get_u64(v, hi, &u);
    if (why != KL_JSON_INT_OK || u < lo)
        return BAD(e, key, "%s must be an integer in %llu..%llu (%s)", key,
                   (unsigned long long)lo, (unsigned long long)hi,
                   why != KL_JSON_INT_OK ? kl_json_int_why(why) : "it is too small");
    *out = u;
    if (given)
        *given = 1;
    return 0;
}

static int opt_bool(const cJSON *o, const char *key, int *out, kl_api_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v))
        return BAD(e, key, "%s must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* seed: any integer (a negative one is taken modulo 2^64). */
static int seed(kl_req_chat *r, const cJSON *o, kl_api_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "seed");
    if (!v || cJSON_IsNull(v))
        return 0;
    const char *t = kl_json_number_text(v);
    char *end = NULL;
    errno = 0;
    long long s = t && *t == '-' ? strtoll(t, &end, 10) : 0;
    uint64_t u;
    if (t && *t == '-' && !errno && end && !*end && s != 0)
        r->samp.seed = (uint64_t)s;
    else if (kl_json_get_u64(v, UINT64_MAX, &u) == KL_JSON_INT_OK)
        r->samp.seed = u;
    else
        return BAD(e, "seed", "seed must be an integer");
    r->has_seed = 1;
    return 0;
}

static int stops(kl_req_chat *r, const cJSON *o, kl_api_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (!v || cJSON_IsNull(v))
        return 0;
    const cJSON *one = cJSON_IsString(v) ? v : NULL, *s;
    if (!one && (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > KL_REQ_MAX_STOP))
        return BAD(e, "stop", "stop must be a string or an array of up to %d strings",
                   KL_REQ_MAX_STOP);
    for (s = one ? one : v->child; s; s = one ? NULL : s->next) {
        if (!cJSON_IsString(s) || !*s->valuestring)
            return BAD(e, "stop", "stop sequences must be non-empty strings");
        if (!(r->stop[r->n_stop++] = own_str(r, s->valuestring)))
            return nomem(e);
    }
    return 0;
}

/* max_tokens and max_completion_tokens (the newer name): the same limit when both are given. */
static int limits(kl_req_chat *r, const cJSON *o, kl_api_error *e)
{
    uint64_t a = 0, b = 0;
    int ga = 0, gb = 0;
    int rc = opt_count(o, "max_tokens", 1, UINT32_MAX, &a, &ga, e);
    if (!rc)
        rc = opt_count(o, "max_completion_tokens", 1, UINT32_MAX, &b, &gb, e);
    if (!rc && ga && gb && a != b)
        rc = BAD(e, "max_completion_tokens", "max_tokens (%llu) and max_completion_tokens "
                 "(%llu) disagree: give one", (unsigned long long)a, (unsigned long long)b);
    r->max_tokens = gb ? b : a;
    return rc;
}

static int sampling(kl_req_chat *r, const cJSON *o, kl_api_error *e)
{
    uint64_t u = 0;
    float pen = 0;
    r->samp.temperature = 1.0f;   /* OpenAI's defaults */
    r->samp.top_p = 1.0f;
    int rc = opt_number(o, "temperature", 0, 2, 0, &r->samp.temperature, e);
    if (!rc)
        rc = opt_number(o, "top_p", 0, 1, 1, &r->samp.top_p, e);
    if (!rc)
        rc = opt_number(o, "min_p", 0, 1, 0, &r->samp.min_p, e);
    if (!rc && !(rc = opt_count(o, "top_k", 0, UINT32_MAX, &u, NULL, e)))
        r->samp.top_k = (uint32_t)u;
    for (int i = 0; !rc && i < 2; i++) {
        const char *k = i ? "presence_penalty" : "frequency_penalty";
        if (!(rc = opt_number(o, k, -2, 2, 0, &pen, e)) && pen != 0)
            rc = BAD(e, k, "%s is not supported (only 0)", k);
    }
    return rc ? rc : seed(r, o, e);
}

/* n (only 1), stream and its options. */
static int stream_format(kl_req_chat *r, const cJSON *o, kl_api_error *e)
{
    uint64_t n = 1;
    int rc = opt_count(o, "n", 1, UINT32_MAX, &n, NULL, e);
    if (!rc && n != 1)
        rc = BAD(e, "n", "n must be 1 (one choice per request)");
    if (!rc)
        rc = opt_bool(o, "stream", &r->stream, e);
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (!rc && so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so) || !r->stream)
            rc = BAD(e, "stream_options", "stream_options is an object, with stream only");
        else
            rc = opt_bool(so, "include_usage", &r->include_usage, e);
    }
    return rc;
}

/* stream_format, then logprobs and top_logprobs. */
static int reply_format(kl_req_chat *r, const cJSON *o, kl_api_error *e)
{
    uint64_t top = 0;
    int rc = stream_format(r, o, e);
    if (!rc)
        rc = opt_bool(o, "logprobs", &r->logprobs, e);
    int given = 0;
    if (!rc)
        rc = opt_count(o, "top_logprobs", 0, 20, &top, &given, e);
    if (!rc && given && !r->logprobs)
        rc = BAD(e, "top_logprobs", "top_logprobs needs logprobs: true");
    r->top_logprobs = (uint32_t)top;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The request                                                                                */

/* The body is an object naming the model. */
static int body_model(kl_req_chat *r, const cJSON *o, kl_api_error *e)
{
    if (!cJSON_IsObject(o))
        return BAD(e, NULL, "the request body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (!cJSON_IsString(model) || !*model->valuestring)
        return BAD(e, "model", "model is required: the name of a served model");
    if (!(r->model = own_str(r, model->valuestring)))
        return nomem(e);
    return 0;
}

static int request(kl_req_chat *r, const cJSON *o, kl_api_error *e)
{
    int rc = body_model(r, o, e);
    if (rc)
        return rc;
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "tools");
    rc = messages(r, cJSON_GetObjectItemCaseSensitive(o, "messages"), e);
    if (!rc)
        rc = tools(r, ts, e);
    if (!rc)
        rc = tool_choice(r, cJSON_GetObjectItemCaseSensitive(o, "tool_choice"), ts, e);
    if (!rc)
        rc = limits(r, o, e);
    if (!rc)
        rc = sampling(r, o, e);
    if (!rc)
        rc = stops(r, o, e);
    if (!rc)
        rc = reply_format(r, o, e);
    return rc;
}

/* A legacy completion's prompt: a string, or an array of one string. */
static int completion_prompt(kl_req_chat *r, const cJSON *p, kl_api_error *e)
{
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1)
        p = p->child;
    if (!cJSON_IsString(p))
        return BAD(e, "prompt", "prompt must be a string (or an array of one string)");
    return (r->prompt = own_str(r, p->valuestring)) ? 0 : nomem(e);
}

/* What a legacy completion may not ask here: echo, suffix, best_of > 1. */
static int completion_refusals(const cJSON *o, kl_api_error *e)
{
    static const char *const keys[] = {"echo", "suffix", "best_of"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, keys[i]);
        int off = !v || cJSON_IsNull(v) || cJSON_IsFalse(v) ||
                  (i == 2 && cJSON_IsNumber(v) && v->valuedouble == 1);
        if (!off)
            return BAD(e, keys[i], "%s is not supported by this server", keys[i]);
    }
    return 0;
}

/* A legacy completion's logprobs: null, false, or the number of alternatives (0..20). */
static int completion_logprobs(kl_req_chat *r, const cJSON *o, kl_api_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
    uint64_t top = 0;
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return 0;
    int rc = opt_count(o, "logprobs", 0, KL_JOB_MAX_TOP, &top, &r->logprobs, e);
    r->top_logprobs = (uint32_t)top;
    return rc;
}

static int completion(kl_req_chat *r, const cJSON *o, kl_api_error *e)
{
    int rc = body_model(r, o, e);
    if (rc)
        return rc;
    r->tool_choice = KL_TOOL_NONE;
    rc = completion_prompt(r, cJSON_GetObjectItemCaseSensitive(o, "prompt"), e);
    if (!rc)
        rc = completion_refusals(o, e);
    if (!rc)
        rc = limits(r, o, e);
    if (!rc && !r->max_tokens)
        r->max_tokens = 16;           /* the completions API's default */
    if (!rc)
        rc = sampling(r, o, e);
    if (!rc)
        rc = stops(r, o, e);
    if (!rc)
        rc = stream_format(r, o, e);
    if (!rc)
        rc = completion_logprobs(r, o, e);
    return rc;
}

/* Parses body as JSON and checks it with fn into *out. */
static int parse_with(const char *body, size_t len, kl_req_chat *out, kl_api_error *e,
                      int (*fn)(kl_req_chat *, const cJSON *, kl_api_error *))
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    cJSON *root = NULL;
    kl_err jerr;
    kl_err_clear(&jerr);
    int rc = kl_json_parse(body, len, "REQ", &root, &jerr);
    if (rc == KL_E_NOMEM)
        return nomem(e);
    if (rc)
        return BAD(e, NULL, "the request body is not valid JSON: %s", jerr.msg);
    rc = fn(out, root, e);
    cJSON_Delete(root);
    if (rc)
        kl_req_chat_free(out);
    return rc;
}

int kl_req_chat_parse(const char *body, size_t len, kl_req_chat *out, kl_api_error *e)
{
    return parse_with(body, len, out, e, request);
}

int kl_req_completion_parse(const char *body, size_t len, kl_req_chat *out, kl_api_error *e)
{
    return parse_with(body, len, out, e, completion);
}

void kl_req_chat_free(kl_req_chat *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_strings; i++)
        kl_free(r->strings[i]);
    kl_free(r->strings);
    kl_free(r->msgs);
    kl_free(r->calls);
    kl_free(r->tool_names);
    memset(r, 0, sizeof *r);
}

int kl_req_tools_on(const kl_req_chat *r)
{
    return !r->prompt && r->n_tools && r->tool_choice != KL_TOOL_NONE;
}

/* Calls in the conversation's messages: the IDX of the reply's first call. */
static size_t earlier_calls(const kl_req_chat *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n_msgs; i++)
        n += r->msgs[i].n_tool_calls;
    return n;
}

/* section (the calls section's and a call's begin markers, or "") then the head of a call to
 * name up to its arguments, kl_malloc'd into *out. */
static int call_head(const kl_req_chat *r, const char *section, const char *name, char **out,
                     kl_err *err)
{
    size_t cap = strlen(section) + strlen(name) + 64;
    if (!(*out = kl_malloc(cap)))
        return kl_fail(err, KL_E_NOMEM, "out of memory for the forced tool call");
    snprintf(*out, cap, "%sfunctions.%s:%zu<|tool_call_argument_begin|>", section, name,
             earlier_calls(r));
    return 0;
}

int kl_req_tool_prefix(const kl_req_chat *r, char **out, kl_err *err)
{
    *out = NULL;
    int required = r->tool_choice == KL_TOOL_REQUIRED;
    if (!kl_req_tools_on(r) || (!required && r->tool_choice != KL_TOOL_NAMED))
        return 0;
    static const char section[] = "<|tool_calls_section_begin|><|tool_call_begin|>";
    if (!required || r->n_tools == 1)
        return call_head(r, section, required ? r->tool_names[0] : r->tool_choice_name, out,
                         err);
    if (!(*out = kl_strdup(section)))
        return kl_fail(err, KL_E_NOMEM, "out of memory for the forced tool call");
    return 0;
}

size_t kl_req_tool_choices(const kl_req_chat *r)
{
    return kl_req_tools_on(r) && r->tool_choice == KL_TOOL_REQUIRED && r->n_tools > 1
               ? r->n_tools : 0;
}

int kl_req_tool_choice(const kl_req_chat *r, size_t k, char **out, kl_err *err)
{
    return call_head(r, "", r->tool_names[k], out, err);
}
