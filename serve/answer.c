/*
 * serve/answer.c — a job's ids into a reply (see answer.h).
 *
 * The path of every id: its logprobs item; the special-id rule (kl_answer_id_shown); the
 * tokenizer's stream (whole characters), U+FFFD for bytes that are not UTF-8, the stop-string
 * filter, then emit(): events for a stream, the text for a whole reply.  A forced tool-call
 * head (tool_choice required or named) enters at emit() before any id: it is part of the
 * prompt, the tool-call parser must still read it.
 */
#include "serve/answer.h"

#include "common/grow.h"
#include "common/mem.h"
#include "common/utf8.h"
#include "serve/reply.h"

#include <cJSON.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

struct kl_answer {
    kl_job             *job;
    const kl_tokenizer *tok;
    char                id[64];
    char               *model;
    int64_t             created;
    int                 text_kind;     /* a legacy completion */
    int                 tools_on, stream, include_usage, logprobs;
    kl_id_rule          rule;          /* which ids reach the text */
    cJSON              *lp_items;      /* a whole reply's logprobs items */
    cJSON              *legacy;        /* a legacy completion's logprobs not sent yet: {tokens,
                                        * token_logprobs, top_logprobs, text_offset} */
    uint32_t            top_n;         /* alternatives per token (legacy top_logprobs) */
    size_t              n_chars;       /* code points of the shown tokens' texts so far */
    size_t              n_prompt;
    char               *stops[KL_REQ_MAX_STOP];
    size_t              n_stop, max_stop;
    kl_tok_stream       ts;
    kl_chat_stream      cs;
    char               *held;          /* text that may start a stop string */
    size_t              n_held, cap_held;
    char               *text;          /* a whole reply's text */
    size_t              n_text, cap_text;
    char               *out;           /* a stream's bytes not yet taken: out[off..n_out) */
    size_t              n_out, off, cap_out;
    size_t              n_ids;         /* ids read */
    int                 stopped;       /* a stop string ended the reply */
    int                 over;
    kl_job_end          end;
};

static int nomem(kl_err *err)
{
    return kl_fail(err, KL_E_NOMEM, "out of memory for a reply");
}

/* Appends s[0..n) to the growable buffer *buf. */
static int append(char **buf, size_t *len, size_t *cap, const char *s, size_t n, kl_err *err)
{
    if (kl_grow(buf, cap, *len + n + 1, 1))
        return nomem(err);
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

/* kl_chat_stream's sink, and every other event: into the pending bytes. */
static int sink(void *user, const char *ev, size_t len, kl_err *err)
{
    kl_answer *a = user;
    return append(&a->out, &a->n_out, &a->cap_out, ev, len, err);
}

/* A legacy completion's event: text (NULL: the usage chunk), finish, usage. */
static int text_event(kl_answer *a, const char *text, size_t len, const char *finish,
                      const kl_usage *u, kl_err *err)
{
    char *json = NULL;
    cJSON *lp = text ? a->legacy : NULL;     /* logprobs travel with a choice */
    if (lp)
        a->legacy = NULL;
    int rc = kl_text_completion_json(a->id, a->model, a->created, text, len, finish, u, lp,
                                     &json, err);
    if (!rc)
        rc = sink(a, "data: ", 6, err);
    if (!rc)
        rc = sink(a, json, strlen(json), err);
    if (!rc)
        rc = sink(a, "\n\n", 2, err);
    kl_free(json);
    return rc;
}

/* Reply text that is final: an event, or the whole reply's text. */
static int emit(kl_answer *a, const char *t, size_t len, kl_err *err)
{
    if (!len)
        return 0;
    if (!a->stream)
        return append(&a->text, &a->n_text, &a->cap_text, t, len, err);
    return a->text_kind ? text_event(a, t, len, NULL, NULL, err)
                        : kl_chat_stream_text(&a->cs, t, len, err);
}

/* The earliest stop string in held: its offset, or n_held when none. */
static size_t first_stop(const kl_answer *a)
{
    size_t best = a->n_held;
    for (size_t i = 0; i < a->n_stop; i++) {
        const char *p = memmem(a->held, a->n_held, a->stops[i], strlen(a->stops[i]));
        if (p && (size_t)(p - a->held) < best)
            best = (size_t)(p - a->held);
    }
    return best;
}

/* Text through the stop filter: what can no longer start a stop string goes on (cut at a
 * character boundary); a match ends the reply. */
static int filter(kl_answer *a, const char *t, size_t len, kl_err *err)
{
    if (a->stopped)
        return 0;
    if (!a->n_stop)
        return emit(a, t, len, err);
    int rc = append(&a->held, &a->n_held, &a->cap_held, t, len, err);
    if (rc)
        return rc;
    size_t at = first_stop(a);
    if (at < a->n_held) {
        a->stopped = 1;
        kl_job_cancel(a->job);
        rc = emit(a, a->held, at, err);
        a->n_held = 0;
        return rc;
    }
    if (a->n_held < a->max_stop)
        return 0;
    size_t cut = a->n_held - (a->max_stop - 1);
    while (cut && ((unsigned char)a->held[cut] & 0xC0) == 0x80)
        cut--;
    rc = emit(a, a->held, cut, err);
    memmove(a->held, a->held + cut, a->n_held - cut);
    a->n_held -= cut;
    return rc;
}

/* Detokenized bytes: U+FFFD for what is not UTF-8 (the tokenizer's stream never splits a
 * valid character, so piece by piece equals the whole), then the filter. */
static int piece(kl_answer *a, const char *t, size_t len, kl_err *err)
{
    if (!len)
        return 0;
    char *clean = kl_utf8_sanitize(t, len);
    if (!clean)
        return nomem(err);
    int rc = filter(a, clean, strlen(clean), err);
    kl_free(clean);
    return rc;
}

static const char *finish_reason(const kl_answer *a)
{
    return !a->stopped && a->end.why == KL_SCHED_LENGTH ? "length" : "stop";
}

/* The job ended without completing (engine error, or cancelled by a shutdown). */
static int incomplete(const kl_answer *a)
{
    return !a->stopped && (a->end.why == KL_SCHED_ERROR || a->end.why == KL_SCHED_CANCELLED);
}

/* A stream's error event (OpenAI's shape inside the stream). */
static int error_event(kl_answer *a, kl_err *err)
{
    cJSON *o = cJSON_CreateObject(), *e = o ? cJSON_AddObjectToObject(o, "error") : NULL;
    char msg[400];
    snprintf(msg, sizeof msg, "the request did not complete: %s",
             a->end.why == KL_SCHED_ERROR ? a->end.err.msg : "cancelled (shutting down)");
    int ok = e && cJSON_AddStringToObject(e, "message", msg) &&
             cJSON_AddStringToObject(e, "type", "server_error") &&
             cJSON_AddNullToObject(e, "param") && cJSON_AddNullToObject(e, "code");
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    int rc = s ? sink(a, "data: ", 6, err) : nomem(err);
    if (!rc)
        rc = sink(a, s, strlen(s), err);
    if (!rc)
        rc = sink(a, "\n\n", 2, err);
    cJSON_free(s);
    return rc;
}

static kl_usage usage_of(kl_answer *a)
{
    return (kl_usage){.prompt_tokens = a->n_prompt, .completion_tokens = a->n_ids,
                      .cached_tokens = kl_job_cached(a->job)};
}

/* The end of the reply: held bytes, then (a stream) the finish, usage and [DONE] events. */
static int finish(kl_answer *a, kl_err *err)
{
    const char *t;
    size_t len;
    kl_tok_stream_flush(&a->ts, &t, &len);
    int rc = piece(a, t, len, err);
    if (!rc && !a->stopped)
        rc = emit(a, a->held, a->n_held, err);
    a->n_held = 0;
    if (rc || !a->stream)
        return rc;
    if (incomplete(a))
        return error_event(a, err);
    kl_usage u = usage_of(a);
    const kl_usage *up = a->include_usage ? &u : NULL;
    if (!a->text_kind)
        return kl_chat_stream_end(&a->cs, finish_reason(a), up, err);
    rc = text_event(a, "", 0, finish_reason(a), NULL, err);
    if (!rc && up)
        rc = text_event(a, NULL, 0, NULL, up, err);
    return rc ? rc : sink(a, "data: [DONE]\n\n", 14, err);
}

/* The text of id (kl_malloc'd; U+FFFD where its bytes are not UTF-8); its bytes in *b, *n. */
static char *token_text(const kl_tokenizer *tok, kl_token id, const uint8_t **b, size_t *n)
{
    *n = 0;
    *b = kl_tok_token_bytes(tok, id, n);
    return kl_utf8_sanitize(*b ? (const char *)*b : "", *b ? *n : 0);
}

/* {"token", "logprob", "bytes"} of id: its text and its bytes as numbers. */
static cJSON *token_json(const kl_tokenizer *tok, kl_token id, float logprob)
{
    size_t n = 0;
    const uint8_t *b;
    char *text = token_text(tok, id, &b, &n);
    cJSON *o = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    int ok = text && o && bytes && cJSON_AddStringToObject(o, "token", text) &&
             cJSON_AddNumberToObject(o, "logprob", logprob);
    for (size_t i = 0; ok && i < n; i++)
        ok = cJSON_AddItemToArray(bytes, cJSON_CreateNumber(b[i]));
    kl_free(text);
    if (ok && o) {
        cJSON_AddItemToObject(o, "bytes", bytes);
        return o;
    }
    cJSON_Delete(o);
    cJSON_Delete(bytes);
    return NULL;
}

/* The logprobs item of one id, to the stream or the whole reply's list. */
static int logprob_item(kl_answer *a, kl_token id, const kl_job_lp *lp, kl_err *err)
{
    cJSON *item = token_json(a->tok, id, lp->logprob);
    cJSON *top = item ? cJSON_AddArrayToObject(item, "top_logprobs") : NULL;
    int ok = top != NULL;
    for (uint32_t t = 0; ok && t < lp->n_top; t++) {
        cJSON *alt = token_json(a->tok, lp->top[t], lp->top_lp[t]);
        ok = alt && cJSON_AddItemToArray(top, alt);
    }
    if (!ok) {
        cJSON_Delete(item);
        return nomem(err);
    }
    if (a->stream)
        return kl_chat_stream_logprob(&a->cs, item, err);
    if (!a->lp_items && !(a->lp_items = cJSON_CreateArray())) {
        cJSON_Delete(item);
        return nomem(err);
    }
    cJSON_AddItemToArray(a->lp_items, item);
    return 0;
}

/* The arrays of a legacy completion's logprobs, in the order legacy_item fills them. */
static const char *const legacy_keys[4] = {"tokens", "token_logprobs", "top_logprobs",
                                           "text_offset"};

/* {"tokens", "token_logprobs", "top_logprobs", "text_offset"}: empty arrays. */
static cJSON *legacy_new(void)
{
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; o && i < 4; i++)
        if (!cJSON_AddArrayToObject(o, legacy_keys[i])) {
            cJSON_Delete(o);
            return NULL;
        }
    return o;
}

/* Adds {text of id: logprob} to the top dict (the first of equal texts stays). */
static int legacy_alt(const kl_tokenizer *tok, cJSON *dict, kl_token id, float logprob)
{
    const uint8_t *b;
    size_t n;
    char *t = token_text(tok, id, &b, &n);
    int ok = t != NULL;
    if (ok && !cJSON_GetObjectItemCaseSensitive(dict, t))
        ok = cJSON_AddNumberToObject(dict, t, logprob) != NULL;
    kl_free(t);
    return ok;
}

/* One id into the legacy logprobs arrays: its text, logprob, its top_n alternatives (and
 * itself: OpenAI's legacy top_logprobs always hold the sampled token) and its offset: the code
 * points of the texts of the shown tokens before it. */
static int legacy_item(kl_answer *a, kl_token id, const kl_job_lp *lp, int shown, kl_err *err)
{
    if (!a->legacy && !(a->legacy = legacy_new()))
        return nomem(err);
    const uint8_t *b;
    size_t n;
    char *t = token_text(a->tok, id, &b, &n);
    cJSON *dict = cJSON_CreateObject();
    int ok = t && dict;
    for (uint32_t i = 0; ok && i < lp->n_top && i < a->top_n; i++)
        ok = legacy_alt(a->tok, dict, lp->top[i], lp->top_lp[i]);
    ok = ok && legacy_alt(a->tok, dict, id, lp->logprob);
    cJSON *arr[4] = {cJSON_CreateString(t ? t : ""), cJSON_CreateNumber(lp->logprob), dict,
                     cJSON_CreateNumber((double)a->n_chars)};
    for (const char *c = t; shown && c && *c; c++)
        a->n_chars += ((unsigned char)*c & 0xC0) != 0x80;
    for (size_t i = 0; i < 4; i++) {
        ok = ok && arr[i];
        if (ok)
            cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(a->legacy, legacy_keys[i]),
                                 arr[i]);
        else
            cJSON_Delete(arr[i]);
    }
    kl_free(t);
    return ok ? 0 : nomem(err);
}

/* One id: its logprobs, then (when the rule shows it) its text. */
static int take_id(kl_answer *a, kl_token id, const kl_job_lp *lp, kl_err *err)
{
    const char *t;
    size_t len;
    int rc = 0;
    int shown = kl_answer_id_shown(&a->rule, id);
    a->n_ids++;
    if (a->logprobs)   /* with its text */
        rc = a->text_kind ? legacy_item(a, id, lp, shown, err) : logprob_item(a, id, lp, err);
    if (rc || !shown)
        return rc;
    rc = kl_tok_stream_push(&a->ts, id, &t, &len, err);
    return rc ? rc : piece(a, t, len, err);
}

int kl_answer_pump(kl_answer *a, int timeout_ms, int *over, kl_err *err)
{
    kl_token ids[64];
    kl_job_lp lps[64];
    int done = 0;
    *over = a->over;
    if (a->over)
        return 0;
    size_t n = kl_job_wait(a->job, ids, lps, 64, timeout_ms, &done, &a->end);
    if (!n && !done && a->stream)
        return sink(a, ": waiting\n\n", 11, err);
    int rc = 0;
    for (size_t i = 0; !rc && i < n && !a->stopped; i++)
        rc = take_id(a, ids[i], &lps[i], err);
    if (!rc && done) {
        a->over = *over = 1;
        rc = finish(a, err);
    }
    return rc;
}

size_t kl_answer_bytes(kl_answer *a, char *buf, size_t max)
{
    size_t k = a->n_out - a->off < max ? a->n_out - a->off : max;
    if (!k)
        return 0;
    memcpy(buf, a->out + a->off, k);
    a->off += k;
    if (a->off == a->n_out)
        a->off = a->n_out = 0;
    return k;
}

int kl_answer_json(kl_answer *a, char **json, int *status, kl_err *err)
{
    *json = NULL;
    *status = 200;
    if (incomplete(a)) {
        *status = a->end.why == KL_SCHED_ERROR ? 500 : 503;
        if (a->end.why == KL_SCHED_ERROR) {
            if (err)
                *err = a->end.err;
            return a->end.err.code ? a->end.err.code : KL_E_BUG;
        }
        return kl_fail(err, KL_E_CANCELLED, "the request was cancelled: the server is "
                       "shutting down");
    }
    kl_usage u = usage_of(a);
    const char *t = a->text ? a->text : "";
    int rc = a->text_kind
                 ? kl_text_completion_json(a->id, a->model, a->created, t, a->n_text,
                                           finish_reason(a), &u, a->legacy, json, err)
                 : kl_chat_reply_json_lp(a->id, a->model, a->created, a->tools_on, t,
                                         a->n_text, finish_reason(a), &u, a->lp_items, json,
                                         err);
    a->lp_items = a->legacy = NULL;    /* taken */
    if (rc)
        *status = 500;
    return rc;
}

/* The request's stop strings, copied. */
static int keep_stops(kl_answer *a, const kl_req_chat *r, kl_err *err)
{
    for (size_t i = 0; i < r->n_stop; i++) {
        if (!(a->stops[i] = kl_strdup(r->stop[i])))
            return nomem(err);
        a->n_stop = i + 1;
        size_t n = strlen(r->stop[i]);
        a->max_stop = n > a->max_stop ? n : a->max_stop;
    }
    return 0;
}

/* The tool-call head tool_choice forced into the prompt, read by the tool-call parser first
 * (the rule then lets the section's markers through). */
static int forced_head(kl_answer *a, const kl_req_chat *r, kl_err *err)
{
    char *head = NULL;
    int rc = kl_req_tool_prefix(r, &head, err);
    kl_answer_id_rule_init(&a->rule, a->tok, a->tools_on, head != NULL);
    if (!rc && head)
        rc = emit(a, head, strlen(head), err);
    kl_free(head);
    return rc;
}

int kl_answer_new(kl_answer **out, kl_job *job, const kl_req_chat *r, const kl_tokenizer *tok,
                  const char *model, uint64_t serial, size_t n_prompt, kl_err *err)
{
    *out = NULL;
    kl_answer *a = kl_calloc(1, sizeof *a);
    if (!a) {
        kl_job_release(job);
        return nomem(err);
    }
    a->job = job;
    a->tok = tok;
    a->text_kind = r->prompt != NULL;
    a->tools_on = kl_req_tools_on(r);
    a->stream = r->stream;
    a->include_usage = r->include_usage;
    a->logprobs = r->logprobs;
    a->top_n = r->top_logprobs;
    a->n_prompt = n_prompt;
    a->created = (int64_t)time(NULL);
    snprintf(a->id, sizeof a->id, "%s-%016llx", a->text_kind ? "cmpl" : "chatcmpl",
             (unsigned long long)serial);
    int rc = (a->model = kl_strdup(model)) ? keep_stops(a, r, err) : nomem(err);
    if (!rc)
        rc = kl_tok_stream_init(&a->ts, tok, 0, err);
    if (!rc && a->stream && !a->text_kind)
        rc = kl_chat_stream_begin(&a->cs, a->id, model, a->created, a->tools_on, sink, a, err);
    if (!rc)
        rc = forced_head(a, r, err);
    if (rc) {
        kl_answer_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void kl_answer_free(kl_answer *a)
{
    if (!a)
        return;
    kl_job_release(a->job);
    kl_tok_stream_free(&a->ts);
    kl_chat_stream_free(&a->cs);
    for (size_t i = 0; i < a->n_stop; i++)
        kl_free(a->stops[i]);
    kl_free(a->model);
    kl_free(a->held);
    kl_free(a->text);
    kl_free(a->out);
    cJSON_Delete(a->lp_items);
    cJSON_Delete(a->legacy);
    kl_free(a);
}

/* ------------------------------------------------------------------------------------------ */
/* The special-id rule                                                                        */

void kl_answer_id_rule_init(kl_id_rule *r, const kl_tokenizer *tok, int tools_on,
                            int in_section)
{
    static const char *const names[] = {
        "<|tool_calls_section_begin|>", "<|tool_call_section_begin|>", /* opening: first */
        "<|tool_calls_section_end|>", "<|tool_call_section_end|>", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_call_end|>",
    };
    memset(r, 0, sizeof *r);
    r->n_ranks = kl_tok_n_ranks(tok);
    r->tools_on = tools_on;
    r->in_section = in_section;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        kl_token id;
        if (kl_tok_special_id(tok, names[i], &id)) {
            r->marker[r->n_markers] = id;
            r->opens[r->n_markers++] = i < 2;
        }
    }
}

int kl_answer_id_shown(kl_id_rule *r, kl_token id)
{
    if (id < r->n_ranks)
        return 1;
    for (size_t i = 0; r->tools_on && i < r->n_markers; i++)
        if (r->marker[i] == id) {
            r->in_section |= r->opens[i];
            return r->in_section;
        }
    return 0;
}
