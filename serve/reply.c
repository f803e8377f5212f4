/*
 * serve/reply.c — chat-completion replies in OpenAI's wire format (see reply.h).
 */
#include "serve/reply.h"

#include "common/grow.h"
#include "common/mem.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

static int nomem(kl_err *err)
{
    return kl_fail(err, KL_E_NOMEM, "out of memory building a reply");
}

/* ------------------------------------------------------------------------------------------ */
/* Chunks                                                                                     */

/* {"id", "object": "chat.completion.chunk", "created", "model"} */
static cJSON *chunk_head(const kl_chat_stream *s)
{
    cJSON *c = cJSON_CreateObject();
    if (c && (!cJSON_AddStringToObject(c, "id", s->id) ||
              !cJSON_AddStringToObject(c, "object", "chat.completion.chunk") ||
              !cJSON_AddNumberToObject(c, "created", (double)s->created) ||
              !cJSON_AddStringToObject(c, "model", s->model))) {
        cJSON_Delete(c);
        return NULL;
    }
    return c;
}

/* Sends c as "data: {c}\n\n" and deletes it (NULL: out of memory). */
static int send_json(kl_chat_stream *s, cJSON *c, kl_err *err)
{
    char *text = c ? cJSON_PrintUnformatted(c) : NULL;
    cJSON_Delete(c);
    if (!text)
        return nomem(err);
    size_t n = strlen(text);
    char *ev = kl_malloc(n + 9);
    int rc;
    if (!ev) {
        rc = nomem(err);
    } else {
        memcpy(ev, "data: ", 6);
        memcpy(ev + 6, text, n);
        memcpy(ev + 6 + n, "\n\n", 3);
        rc = s->sink(s->user, ev, n + 8, err);
    }
    kl_free(ev);
    cJSON_free(text);
    return rc;
}

/* A chunk whose only choice has delta (taken over) and finish_reason (NULL: null). */
static int send_delta(kl_chat_stream *s, cJSON *delta, const char *finish, kl_err *err)
{
    cJSON *c = chunk_head(s), *choices = c ? cJSON_AddArrayToObject(c, "choices") : NULL;
    cJSON *ch = cJSON_CreateObject();
    if (!choices || !ch || !delta) {
        cJSON_Delete(c);
        cJSON_Delete(ch);
        cJSON_Delete(delta);
        return nomem(err);
    }
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    cJSON_AddItemToObject(ch, "delta", delta);
    cJSON *lp = s->lp_pending ? cJSON_AddObjectToObject(ch, "logprobs") : NULL;
    if (lp) {
        cJSON_AddItemToObject(lp, "content", s->lp_pending);
        s->lp_pending = NULL;
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    return send_json(s, c, err);
}

/* {"content": text[0..len)} */
static cJSON *content_delta(const char *text, size_t len)
{
    char *t = kl_malloc(len + 1);
    cJSON *d = t ? cJSON_CreateObject() : NULL;
    if (d) {
        memcpy(t, text, len);
        t[len] = '\0';
        if (!cJSON_AddStringToObject(d, "content", t)) {
            cJSON_Delete(d);
            d = NULL;
        }
    }
    kl_free(t);
    return d;
}

/* {"tool_calls": [{"index", ["id", "type", "function": {"name", "arguments"}] | ["function":
 * {"arguments"}]}]} */
static cJSON *call_delta(const kl_ts_event *ev, const char *args, size_t len)
{
    cJSON *d = cJSON_CreateObject(), *arr = d ? cJSON_AddArrayToObject(d, "tool_calls") : NULL;
    cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    char *a = kl_malloc(len + 1);
    if (!arr || !call || !fn || !a) {
        cJSON_Delete(d);
        cJSON_Delete(call);
        cJSON_Delete(fn);
        kl_free(a);
        return NULL;
    }
    memcpy(a, args, len);
    a[len] = '\0';
    cJSON_AddItemToArray(arr, call);
    cJSON_AddNumberToObject(call, "index", ev->index);
    if (ev->kind == KL_TS_CALL_BEGIN) {
        cJSON_AddStringToObject(call, "id", ev->id);
        cJSON_AddStringToObject(call, "type", "function");
        cJSON_AddStringToObject(fn, "name", ev->name);
    }
    cJSON_AddStringToObject(fn, "arguments", a);
    cJSON_AddItemToObject(call, "function", fn);
    kl_free(a);
    return d;
}

/* The tool-call parser's events, as deltas. */
static int on_event(void *user, const kl_ts_event *ev, kl_err *err)
{
    kl_chat_stream *s = user;
    switch (ev->kind) {
    case KL_TS_CONTENT:
        return send_delta(s, content_delta(ev->text, ev->len), NULL, err);
    case KL_TS_CALL_BEGIN:
        s->called = 1;
        return send_delta(s, call_delta(ev, "", 0), NULL, err);
    case KL_TS_ARGS:
        return send_delta(s, call_delta(ev, ev->text, ev->len), NULL, err);
    default:   /* a call's end has no delta of its own */
        return 0;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The stream                                                                                 */

int kl_chat_stream_begin(kl_chat_stream *s, const char *id, const char *model, int64_t created,
                         int tools_on, kl_sse_sink sink, void *user, kl_err *err)
{
    memset(s, 0, sizeof *s);
    snprintf(s->id, sizeof s->id, "%s", id);
    snprintf(s->model, sizeof s->model, "%s", model);
    s->created = created;
    s->tools_on = tools_on;
    s->sink = sink;
    s->user = user;
    kl_toolstream_init(&s->ts, on_event, s);
    cJSON *d = cJSON_CreateObject();
    if (d && (!cJSON_AddStringToObject(d, "role", "assistant") ||
              !cJSON_AddStringToObject(d, "content", ""))) {
        cJSON_Delete(d);
        d = NULL;
    }
    return send_delta(s, d, NULL, err);
}

int kl_chat_stream_text(kl_chat_stream *s, const char *text, size_t len, kl_err *err)
{
    if (!len)
        return 0;
    if (!s->tools_on)
        return send_delta(s, content_delta(text, len), NULL, err);
    return kl_toolstream_feed(&s->ts, text, len, err);
}

/* usage {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
 * {"cached_tokens"}} into o */
static int add_usage(cJSON *o, const kl_usage *u)
{
    cJSON *us = cJSON_AddObjectToObject(o, "usage");
    cJSON *det = us ? cJSON_AddObjectToObject(us, "prompt_tokens_details") : NULL;
    return det && cJSON_AddNumberToObject(us, "prompt_tokens", (double)u->prompt_tokens) &&
           cJSON_AddNumberToObject(us, "completion_tokens", (double)u->completion_tokens) &&
           cJSON_AddNumberToObject(us, "total_tokens",
                                   (double)(u->prompt_tokens + u->completion_tokens)) &&
           cJSON_AddNumberToObject(det, "cached_tokens", (double)u->cached_tokens);
}

int kl_chat_stream_end(kl_chat_stream *s, const char *finish_reason, const kl_usage *usage,
                       kl_err *err)
{
    int rc = s->tools_on ? kl_toolstream_finish(&s->ts, err) : 0;
    if (!rc)
        rc = send_delta(s, cJSON_CreateObject(), s->called ? "tool_calls" : finish_reason, err);
    if (!rc && usage) {
        cJSON *c = chunk_head(s);
        if (!c || !cJSON_AddArrayToObject(c, "choices") || !add_usage(c, usage)) {
            cJSON_Delete(c);
            return nomem(err);
        }
        rc = send_json(s, c, err);
    }
    if (!rc)
        rc = s->sink(s->user, "data: [DONE]\n\n", 14, err);
    return rc;
}

int kl_chat_stream_logprob(kl_chat_stream *s, cJSON *item, kl_err *err)
{
    if (!s->lp_pending && !(s->lp_pending = cJSON_CreateArray())) {
        cJSON_Delete(item);
        return nomem(err);
    }
    cJSON_AddItemToArray(s->lp_pending, item);
    return 0;
}

void kl_chat_stream_free(kl_chat_stream *s)
{
    if (s) {
        kl_toolstream_free(&s->ts);
        cJSON_Delete(s->lp_pending);
        s->lp_pending = NULL;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The whole reply                                                                            */

/* A whole reply read through the same tool-call parser as a stream (so that both report the
 * same content and calls, a call cut off by the limit included). */
typedef struct collect {
    char  *content;            /* text before the calls section */
    size_t n, cap;
    char  *args;               /* the current call's arguments */
    size_t n_args, cap_args;
    cJSON *calls;              /* [{"id", "type", "function": {"name", "arguments"}}] */
} collect;

static int buf_add(char **b, size_t *n, size_t *cap, const char *s, size_t len, kl_err *err)
{
    if (kl_grow(b, cap, *n + len + 1, 1))
        return nomem(err);
    memcpy(*b + *n, s, len);
    *n += len;
    (*b)[*n] = '\0';
    return 0;
}

/* {"id", "type": "function", "function": {"name"}} of a call that begins, into c->calls. */
static int call_begin(collect *c, const kl_ts_event *ev, kl_err *err)
{
    cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    int ok = call && fn && cJSON_AddStringToObject(call, "id", ev->id) &&
             cJSON_AddStringToObject(call, "type", "function") &&
             cJSON_AddStringToObject(fn, "name", ev->name);
    if (!ok) {
        cJSON_Delete(call);
        cJSON_Delete(fn);
        return nomem(err);
    }
    cJSON_AddItemToObject(call, "function", fn);
    cJSON_AddItemToArray(c->calls, call);
    c->n_args = 0;
    return buf_add(&c->args, &c->n_args, &c->cap_args, "", 0, err);
}

static int on_whole(void *user, const kl_ts_event *ev, kl_err *err)
{
    collect *c = user;
    cJSON *last = cJSON_GetArrayItem(c->calls, cJSON_GetArraySize(c->calls) - 1);
    switch (ev->kind) {
    case KL_TS_CONTENT:
        return buf_add(&c->content, &c->n, &c->cap, ev->text, ev->len, err);
    case KL_TS_CALL_BEGIN:
        return call_begin(c, ev, err);
    case KL_TS_ARGS:
        return buf_add(&c->args, &c->n_args, &c->cap_args, ev->text, ev->len, err);
    default:   /* the end: the arguments as they came (cut off: what there was) */
        return cJSON_AddStringToObject(cJSON_GetObjectItemCaseSensitive(last, "function"),
                                       "arguments", c->args) ? 0 : nomem(err);
    }
}

/* text[0..len) through the tool-call parser into c (zeroed first; free with collect_free). */
static int collect_reply(collect *c, const char *text, size_t len, kl_err *err)
{
    memset(c, 0, sizeof *c);
    if (!(c->calls = cJSON_CreateArray()))
        return nomem(err);
    kl_toolstream ts;
    kl_toolstream_init(&ts, on_whole, c);
    int rc = kl_toolstream_feed(&ts, text, len, err);
    if (!rc)
        rc = kl_toolstream_finish(&ts, err);
    kl_toolstream_free(&ts);
    return rc;
}

static void collect_free(collect *c)
{
    kl_free(c->content);
    kl_free(c->args);
    cJSON_Delete(c->calls);
}

/* message {"role": "assistant", "content", ["tool_calls"]} of the reply into ch; tools off:
 * the text is the content; on: the content before the calls section (null when empty). */
static int add_message(cJSON *ch, int tools_on, const char *text, size_t len, int *called,
                       kl_err *err)
{
    collect c = {0};
    int rc = tools_on ? collect_reply(&c, text, len, err)
                      : buf_add(&c.content, &c.n, &c.cap, text, len, err);
    if (!tools_on)
        c.calls = NULL;
    cJSON *msg = rc ? NULL : cJSON_AddObjectToObject(ch, "message");
    int n_calls = c.calls ? cJSON_GetArraySize(c.calls) : 0;
    int ok = msg && cJSON_AddStringToObject(msg, "role", "assistant") &&
             (c.n || !tools_on ? cJSON_AddStringToObject(msg, "content", c.content) != NULL
                               : cJSON_AddNullToObject(msg, "content") != NULL);
    if (ok && n_calls) {
        cJSON_AddItemToObject(msg, "tool_calls", c.calls);
        c.calls = NULL;
    }
    *called = n_calls > 0;
    collect_free(&c);
    return rc ? rc : ok ? 0 : nomem(err);
}

int kl_chat_reply_json(const char *id, const char *model, int64_t created, int tools_on,
                       const char *text, size_t len, const char *finish_reason,
                       const kl_usage *usage, char **json, kl_err *err)
{
    return kl_chat_reply_json_lp(id, model, created, tools_on, text, len, finish_reason, usage,
                                 NULL, json, err);
}

/* "logprobs": {"content": items} or null into ch (items taken over). */
static int add_logprobs(cJSON *ch, cJSON *items)
{
    if (!items)
        return cJSON_AddNullToObject(ch, "logprobs") != NULL;
    cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
    if (!lp) {
        cJSON_Delete(items);
        return 0;
    }
    cJSON_AddItemToObject(lp, "content", items);
    return 1;
}

int kl_chat_reply_json_lp(const char *id, const char *model, int64_t created, int tools_on,
                          const char *text, size_t len, const char *finish_reason,
                          const kl_usage *usage, cJSON *items, char **json, kl_err *err)
{
    *json = NULL;
    cJSON *o = cJSON_CreateObject(), *choices = o ? cJSON_AddArrayToObject(o, "choices") : NULL;
    cJSON *ch = cJSON_CreateObject();
    if (!choices || !ch) {
        cJSON_Delete(o);
        cJSON_Delete(ch);
        cJSON_Delete(items);
        return nomem(err);
    }
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "chat.completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    int called = 0;
    int rc = add_message(ch, tools_on, text, len, &called, err);
    if (rc)
        cJSON_Delete(items);
    else if (!add_logprobs(ch, items))
        rc = nomem(err);
    if (!rc) {
        cJSON_AddStringToObject(ch, "finish_reason", called ? "tool_calls" : finish_reason);
        if (usage && !add_usage(o, usage))
            rc = nomem(err);
    }
    char *t = rc ? NULL : cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!rc && !t)
        rc = nomem(err);
    if (!rc && !(*json = kl_malloc(strlen(t) + 1)))
        rc = nomem(err);
    if (!rc)
        strcpy(*json, t);
    cJSON_free(t);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Legacy completions                                                                         */

/* "logprobs": *lp or null into c; *lp is NULL once c owns it. */
static int add_logprobs_as(cJSON *c, cJSON **lp)
{
    if (!*lp)
        return cJSON_AddNullToObject(c, "logprobs") != NULL;
    if (!cJSON_AddItemToObject(c, "logprobs", *lp))
        return 0;
    *lp = NULL;
    return 1;
}

int kl_text_completion_json(const char *id, const char *model, int64_t created, const char *text,
                            size_t len, const char *finish_reason, const kl_usage *usage,
                            cJSON *logprobs, char **json, kl_err *err)
{
    *json = NULL;
    cJSON *o = cJSON_CreateObject(), *choices = o ? cJSON_AddArrayToObject(o, "choices") : NULL;
    cJSON *ch = text ? cJSON_CreateObject() : NULL;
    char *t = text ? kl_malloc(len + 1) : NULL;
    int ok = choices && (!text || (ch && t));
    if (ok && text) {
        memcpy(t, text, len);
        t[len] = '\0';
        cJSON_AddItemToArray(choices, ch);
        ch = NULL;
        cJSON *c = cJSON_GetArrayItem(choices, 0);
        ok = cJSON_AddStringToObject(c, "text", t) && cJSON_AddNumberToObject(c, "index", 0) &&
             add_logprobs_as(c, &logprobs) &&
             (finish_reason ? cJSON_AddStringToObject(c, "finish_reason", finish_reason) != NULL
                            : cJSON_AddNullToObject(c, "finish_reason") != NULL);
    }
    ok = ok && cJSON_AddStringToObject(o, "id", id) &&
         cJSON_AddStringToObject(o, "object", "text_completion") &&
         cJSON_AddNumberToObject(o, "created", (double)created) &&
         cJSON_AddStringToObject(o, "model", model) && (!usage || add_usage(o, usage));
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    cJSON_Delete(ch);
    cJSON_Delete(logprobs);   /* NULL once taken */
    kl_free(t);
    if (s)
        *json = kl_malloc(strlen(s) + 1);
    if (*json)
        strcpy(*json, s);
    cJSON_free(s);
    return *json ? 0 : nomem(err);
}
