/*
 * serve/http.c — routes, bodies, errors and streams over libmicrohttpd (see http.h).
 */
#include "serve/http.h"

#include "common/grow.h"
#include "common/mem.h"
#include "engine/chat.h"
#include "serve/answer.h"
#include "serve/request.h"

#include <cJSON.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define CHECK_MS 1000          /* a whole reply's client checked this often */

struct kl_http {
    struct MHD_Daemon  *d;
    kl_engine          *e;
    const kl_tokenizer *tok;
    kl_http_opts        o;
    char               *api_key, *model;
    kl_token            stops[KL_CHAT_MAX_STOP];
    size_t              n_stops;
    uint16_t            port;
    atomic_uint_fast64_t next_id;
    atomic_int          stopping;
};

/* A connection's request body. */
typedef struct conn {
    char   *body;
    size_t  n, cap;
    int     too_big;
} conn;

/* ------------------------------------------------------------------------------------------ */
/* Replies                                                                                    */

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type,
                                 const char *text, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* Sends root (freed) as JSON. */
static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, cJSON *root)
{
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s)
        return send_text(c, 500, "text/plain", "out of memory\n", 14);
    enum MHD_Result rc = send_text(c, status, "application/json", s, strlen(s));
    cJSON_free(s);
    return rc;
}

/* The error code OpenAI gives with a status, or NULL. */
static const char *error_code(int status)
{
    switch (status) {
    case 401: return "invalid_api_key";
    case 404: return "not_found";
    case 413: return "request_too_large";
    case 429: return "rate_limit_exceeded";
    case 503: return "service_unavailable";
    default:  return NULL;
    }
}

static enum MHD_Result send_error(struct MHD_Connection *c, const kl_api_error *e,
                                  const char *code)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    if (!o)
        return send_json(c, 500, NULL);
    if (!code)
        code = error_code(e->status);
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type);
    if (e->param[0])
        cJSON_AddStringToObject(o, "param", e->param);
    else
        cJSON_AddNullToObject(o, "param");
    if (code)
        cJSON_AddStringToObject(o, "code", code);
    else
        cJSON_AddNullToObject(o, "code");
    return send_json(c, (unsigned)e->status, root);
}

/* A printf-formatted OpenAI error. */
static enum MHD_Result fail(struct MHD_Connection *c, int status, const char *type,
                            const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static enum MHD_Result fail(struct MHD_Connection *c, int status, const char *type,
                            const char *param, const char *code, const char *fmt, ...)
{
    kl_api_error e = {.status = status};
    snprintf(e.type, sizeof e.type, "%s", type);
    snprintf(e.param, sizeof e.param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return send_error(c, &e, code);
}

/* ------------------------------------------------------------------------------------------ */
/* Simple routes                                                                              */

static enum MHD_Result route_health(kl_http *h, struct MHD_Connection *c)
{
    const char ok[] = "{\"status\":\"ok\"}";
    return send_text(c, 200, "application/json", ok, sizeof ok - 1);
}

static enum MHD_Result route_models(kl_http *h, struct MHD_Connection *c)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", h->model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "kl");
    cJSON_AddNumberToObject(m, "max_model_len", (double)h->o.ctx);
    return send_json(c, 200, root);
}

/* Appends one Prometheus histogram. */
static void put_hist(FILE *f, const char *name, const char *help, const uint64_t *b,
                     double sum, uint64_t n)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t acc = 0;
    for (size_t i = 0; i < KL_ENGINE_N_BUCKETS; i++) {
        acc += b[i];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, kl_engine_buckets[i],
                (unsigned long long)acc);
    }
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
            (unsigned long long)(acc + b[KL_ENGINE_N_BUCKETS]), name, sum, name,
            (unsigned long long)n);
}

static void put_metric(FILE *f, const char *name, const char *type, const char *help,
                       double v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static enum MHD_Result route_metrics(kl_http *h, struct MHD_Connection *c)
{
    kl_engine_stats s;
    kl_engine_get_stats(h->e, &s);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return fail(c, 500, "server_error", NULL, NULL, "out of memory");
    put_metric(f, "kl_requests_total", "counter", "requests accepted", (double)s.requests);
    put_metric(f, "kl_requests_refused_total", "counter", "requests refused: queue full",
               (double)s.refused_busy);
    put_metric(f, "kl_prompt_tokens_total", "counter", "prompt tokens", (double)s.tokens_in);
    put_metric(f, "kl_prompt_tokens_cached_total", "counter", "prompt tokens reused from the "
               "prefix cache", (double)s.tokens_cached);
    put_metric(f, "kl_prefix_cache_hits_total", "counter", "requests that reused a cached "
               "prefix", (double)s.cache_hits);
    put_metric(f, "kl_prefix_cache_entries", "gauge", "prefix cache entries",
               (double)s.cache_entries);
    put_metric(f, "kl_prefix_cache_bytes", "gauge", "state bytes the prefix cache holds",
               (double)s.cache_bytes);
    put_metric(f, "kl_generation_tokens_total", "counter", "generated tokens",
               (double)s.tokens_out);
    put_metric(f, "kl_queue_depth", "gauge", "requests waiting for a slot", s.queued);
    put_metric(f, "kl_running", "gauge", "requests holding a slot", s.running);
    put_metric(f, "kl_steps_total", "counter", "batches run", (double)s.steps);
    put_metric(f, "kl_batch_tokens_total", "counter", "tokens over all batches (divided by "
               "kl_steps_total: the mean batch size)", (double)s.batch_tokens);
    put_hist(f, "kl_time_to_first_token_seconds", "from arrival to the first id", s.ttft,
             s.ttft_sum, s.ttft_n);
    put_hist(f, "kl_inter_token_latency_seconds", "between two ids of one reply", s.itl,
             s.itl_sum, s.itl_n);
    fclose(f);
    enum MHD_Result rc = send_text(c, 200, "text/plain; version=0.0.4", buf, len);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Chat completions                                                                           */

/* The prompt ids of a checked request: a completion's prompt, or the chat template's
 * rendering (tools only when tool_choice allows calls) and the tool-call head tool_choice
 * forces, through the tokenizer. */
static int chat_prompt(kl_http *h, const kl_req_chat *r, kl_token **ids, size_t *n, kl_err *err)
{
    if (r->prompt)
        return kl_tok_encode(h->tok, r->prompt, strlen(r->prompt), ids, n, err);
    char *text = NULL, *head = NULL, *all = NULL;
    int rc = kl_chat_render(r->msgs, r->n_msgs, kl_req_tools_on(r) ? r->tools_json : NULL, 1,
                            &text, err);
    if (!rc)
        rc = kl_req_tool_prefix(r, &head, err);
    size_t nt = text ? strlen(text) : 0, nh = head ? strlen(head) : 0;
    if (!rc && !(all = kl_malloc(nt + nh + 1)))
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for the prompt");
    if (!rc) {
        memcpy(all, text, nt);
        memcpy(all + nt, head ? head : "", nh + 1);
        rc = kl_tok_encode(h->tok, all, nt + nh, ids, n, err);
    }
    kl_free(text);
    kl_free(head);
    kl_free(all);
    return rc;
}

/* The ways a "required" reply with several tools may go on (kl_req_tool_choice), as id
 * sequences for the scheduler's forced choice: *ids and *off (n + 1 offsets), kl_malloc'd;
 * both NULL when there is no choice to make. */
static int tool_choices(kl_http *h, const kl_req_chat *r, kl_token **ids, size_t **off,
                        size_t *n, kl_err *err)
{
    *ids = NULL;
    *off = NULL;
    *n = kl_req_tool_choices(r);
    if (!*n)
        return 0;
    size_t cap = 0, used = 0;
    if (!(*off = kl_calloc(*n + 1, sizeof **off)))
        return kl_fail(err, KL_E_NOMEM, "out of memory for the forced tool call");
    int rc = 0;
    for (size_t k = 0; k < *n && !rc; k++) {
        char *text = NULL;
        kl_token *way = NULL;
        size_t len = 0;
        rc = kl_req_tool_choice(r, k, &text, err);
        if (!rc)
            rc = kl_tok_encode(h->tok, text, strlen(text), &way, &len, err);
        if (!rc && kl_grow(ids, &cap, used + len, sizeof **ids))
            rc = kl_fail(err, KL_E_NOMEM, "out of memory for the forced tool call");
        if (!rc && len)
            memcpy(*ids + used, way, len * sizeof *way);
        used += len;
        (*off)[k + 1] = used;
        kl_free(text);
        kl_free(way);
    }
    return rc;
}

/* The job's limits and sampling from the request; a refusal is sent (*sent) and -1 returned. */
static int job_spec(kl_http *h, struct MHD_Connection *c, const kl_req_chat *r, size_t n_prompt,
                    kl_job_spec *spec, enum MHD_Result *sent)
{
    if (n_prompt >= h->o.ctx) {
        *sent = fail(c, 400, "invalid_request_error", r->prompt ? "prompt" : "messages",
                     "context_length_exceeded", "the prompt has %zu tokens; this server's "
                     "context is %zu", n_prompt, h->o.ctx);
        return -1;
    }
    size_t room = h->o.ctx - n_prompt;
    if (r->max_tokens > room) {
        *sent = fail(c, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                     "max_tokens is %llu but the prompt (%zu tokens) leaves room for %zu in "
                     "this server's context of %zu", (unsigned long long)r->max_tokens,
                     n_prompt, room, h->o.ctx);
        return -1;
    }
    spec->max_tokens = r->max_tokens ? (size_t)r->max_tokens : room;
    spec->samp = r->samp;
    if (!r->has_seed)
        spec->samp.seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^
                          atomic_fetch_add(&h->next_id, 1);
    spec->logprobs = r->logprobs;
    spec->top_logprobs = r->top_logprobs;
    spec->stop_ids = h->stops;
    spec->n_stop_ids = h->n_stops;
    return 0;
}

/* Submits the job; on a refusal (429 queue full, 503 stopping) the error is sent. */
static int job_submit(kl_http *h, struct MHD_Connection *c, const kl_job_spec *spec,
                      kl_job **job, enum MHD_Result *sent)
{
    kl_err err;
    kl_err_clear(&err);
    int busy = 0;
    if (!kl_engine_submit(h->e, spec, job, &busy, &err))
        return 0;
    int status = busy == 1 ? 429 : busy == 2 ? 503 : 500;
    *sent = fail(c, status, busy == 1 ? "rate_limit_error" : "server_error", NULL, NULL, "%s",
                 err.msg);
    return -1;
}

/* 1 when the client closed its side of the connection (nothing left to read: EOF). */
static int client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    char b;
    return ci && recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Waits for the whole reply (checking each second that the client is still there: a gone
 * one's job is cancelled), then sends its object. */
static enum MHD_Result answer_whole(kl_answer *a, struct MHD_Connection *c)
{
    kl_err err;
    kl_err_clear(&err);
    int over = 0, status = 500, rc = 0;
    char *json = NULL;
    while (!rc && !over) {
        rc = kl_answer_pump(a, CHECK_MS, &over, &err);
        if (!rc && !over && client_gone(c)) {
            kl_answer_free(a);
            return MHD_NO;
        }
    }
    if (!rc)
        rc = kl_answer_json(a, &json, &status, &err);
    kl_answer_free(a);
    if (rc)
        return fail(c, status, "server_error", NULL, NULL, "%s", err.msg);
    enum MHD_Result r = send_text(c, 200, "application/json", json, strlen(json));
    kl_free(json);
    return r;
}

/* A stream's response callbacks' state: its answer and the keep-alive period. */
typedef struct stream_ctx {
    kl_answer *a;
    int        keepalive_ms;
} stream_ctx;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream_ctx *sc = cls;
    kl_answer *a = sc->a;
    kl_err err;
    kl_err_clear(&err);
    size_t k;
    int over = 0;
    while (!(k = kl_answer_bytes(a, buf, max))) {
        if (over)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (kl_answer_pump(a, sc->keepalive_ms, &over, &err))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    return (ssize_t)k;
}

static void stream_done(void *cls)
{
    stream_ctx *sc = cls;
    kl_answer_free(sc->a);
    kl_free(sc);
}

/* Starts the SSE response; a is the response's from here on. */
static enum MHD_Result answer_stream(const kl_http *h, kl_answer *a, struct MHD_Connection *c)
{
    stream_ctx *sc = kl_malloc(sizeof *sc);
    if (!sc) {
        kl_answer_free(a);
        return MHD_NO;
    }
    *sc = (stream_ctx){a, (int)h->o.keepalive_ms};
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, sc, stream_done);
    if (!r) {
        stream_done(sc);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

/* A checked request through the engine: a refusal, the whole reply, or a stream. */
static enum MHD_Result gen_run(kl_http *h, struct MHD_Connection *c, const kl_req_chat *r)
{
    enum MHD_Result sent = MHD_NO;
    kl_err err;
    kl_err_clear(&err);
    kl_token *prompt = NULL;
    size_t n_prompt = 0;
    if (chat_prompt(h, r, &prompt, &n_prompt, &err))
        return fail(c, err.code == KL_E_NOMEM ? 500 : 400, "invalid_request_error",
                    r->prompt ? "prompt" : "messages", NULL, "%s", err.msg);
    kl_job_spec spec = {.prompt = prompt, .n_prompt = n_prompt};
    kl_token *heads = NULL;
    size_t *head_off = NULL;
    if (tool_choices(h, r, &heads, &head_off, &spec.n_heads, &err)) {
        kl_free(prompt);
        kl_free(heads);
        kl_free(head_off);
        return fail(c, 500, "server_error", NULL, NULL, "%s", err.msg);
    }
    spec.head_ids = heads;
    spec.head_off = head_off;
    kl_job *job = NULL;
    int refused = job_spec(h, c, r, n_prompt, &spec, &sent) ||
                  job_submit(h, c, &spec, &job, &sent);
    kl_free(prompt);
    kl_free(heads);
    kl_free(head_off);
    if (refused)
        return sent;
    kl_answer *a;
    if (kl_answer_new(&a, job, r, h->tok, h->model, atomic_fetch_add(&h->next_id, 1), n_prompt,
                      &err))
        return fail(c, 500, "server_error", NULL, NULL, "%s", err.msg);
    return r->stream ? answer_stream(h, a, c) : answer_whole(a, c);
}

/* POST /v1/chat/completions (parse: kl_req_chat_parse) or /v1/completions. */
static enum MHD_Result route_gen(kl_http *h, struct MHD_Connection *c, const conn *cn,
                                 int (*parse)(const char *, size_t, kl_req_chat *,
                                              kl_api_error *))
{
    kl_req_chat r;
    kl_api_error e;
    if (parse(cn->body ? cn->body : "", cn->n, &r, &e)) {
        kl_req_chat_free(&r);
        return send_error(c, &e, NULL);
    }
    enum MHD_Result rc;
    if (strcmp(r.model, h->model))
        rc = fail(c, 404, "invalid_request_error", "model", "model_not_found",
                  "the model '%.200s' does not exist; this server serves '%.200s'", r.model,
                  h->model);
    else
        rc = gen_run(h, c, &r);
    kl_req_chat_free(&r);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Dispatch                                                                                   */

/* 1 when the request carries the key (or none is set). */
static int authorized(kl_http *h, struct MHD_Connection *c)
{
    if (!h->api_key)
        return 1;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7))
        return 0;
    a += 7;
    while (*a == ' ')
        a++;
    /* constant time over the key's length */
    size_t n = strlen(h->api_key), m = strlen(a);
    unsigned diff = n != m;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)h->api_key[i] ^ (unsigned char)(i < m ? a[i] : 0);
    return !diff;
}

static enum MHD_Result route(kl_http *h, struct MHD_Connection *c, const char *url,
                             const char *method, const conn *cn)
{
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (atomic_load(&h->stopping))   /* every request from now on: an answer, not a wait */
        return fail(c, 503, "server_error", NULL, NULL, "the server is shutting down");
    if (!strcmp(url, "/health"))
        return get ? route_health(h, c)
                   : fail(c, 405, "invalid_request_error", NULL, NULL, "use GET on /health");
    int chat = !strcmp(url, "/v1/chat/completions"), text = !strcmp(url, "/v1/completions");
    int known = chat || text || !strcmp(url, "/v1/models") || !strcmp(url, "/metrics");
    if (!known)
        return fail(c, 404, "invalid_request_error", NULL, "not_found",
                    "no route %.16s %.200s", method, url);
    if (!authorized(h, c))
        return fail(c, 401, "invalid_request_error", NULL, NULL,
                    "a valid API key is required: Authorization: Bearer KEY");
    if (cn->too_big)
        return fail(c, 413, "invalid_request_error", NULL, NULL,
                    "the request body is over %zu bytes", h->o.max_body);
    if (chat || text)
        return post ? route_gen(h, c, cn, chat ? kl_req_chat_parse : kl_req_completion_parse)
                    : fail(c, 405, "invalid_request_error", NULL, NULL, "use POST on %s", url);
    if (!get)
        return fail(c, 405, "invalid_request_error", NULL, NULL, "use GET on %s", url);
    return !strcmp(url, "/metrics") ? route_metrics(h, c) : route_models(h, c);
}

/* Appends a piece of the body (or notes that it is too big). */
static void take_body(kl_http *h, conn *cn, const char *data, size_t len)
{
    if (cn->too_big || cn->n + len > h->o.max_body) {
        cn->too_big = 1;
        return;
    }
    if (kl_grow(&cn->body, &cn->cap, cn->n + len + 1, 1)) {
        cn->too_big = 1;
        return;
    }
    memcpy(cn->body + cn->n, data, len);
    cn->n += len;
    cn->body[cn->n] = 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls)
{
    kl_http *h = cls;
    conn *cn = *con_cls;
    if (!cn) {
        cn = kl_calloc(1, sizeof *cn);
        *con_cls = cn;
        return cn ? MHD_YES : MHD_NO;
    }
    if (*upload_size) {
        take_body(h, cn, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    return route(h, c, url, method, cn);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    conn *cn = *con_cls;
    if (cn) {
        kl_free(cn->body);
        kl_free(cn);
        *con_cls = NULL;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Daemon                                                                                     */

/* The address to bind: host (numeric, or a name such as localhost) and port. */
static int bind_addr(const char *host, uint16_t port, struct sockaddr_storage *sa, int *v6,
                     kl_err *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE}, *res = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", (unsigned)port);
    int rc = getaddrinfo(host ? host : "127.0.0.1", ps, &hints, &res);
    if (rc || !res)
        return kl_fail(err, KL_E_USAGE, "cannot resolve host '%.200s': %s", host,
                       gai_strerror(rc));
    memset(sa, 0, sizeof *sa);
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return 0;
}

static void http_free(kl_http *h)
{
    kl_free(h->api_key);
    kl_free(h->model);
    kl_free(h);
}

/* h's copies of the options; 0 or KL_E_USAGE / KL_E_NOMEM. */
static int http_init(kl_http *h, const kl_http_opts *o, kl_err *err)
{
    h->o = *o;
    if (!h->o.max_body)
        h->o.max_body = 4u << 20;
    if (!h->o.max_conns)
        h->o.max_conns = 256;
    if (!h->o.keepalive_ms)
        h->o.keepalive_ms = 1000;
    if (!o->model_name || !*o->model_name || o->ctx < 2)
        return kl_fail(err, KL_E_USAGE, "the server needs a model name and a context >= 2");
    h->model = kl_strdup(o->model_name);
    h->api_key = o->api_key && *o->api_key ? kl_strdup(o->api_key) : NULL;
    if (!h->model || (o->api_key && *o->api_key && !h->api_key))
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    return kl_chat_stop_ids(h->tok, h->stops, &h->n_stops, err);
}

int kl_http_start(kl_http **out, kl_engine *e, const kl_tokenizer *tok, const kl_http_opts *o,
                  kl_err *err)
{
    *out = NULL;
    kl_http *h = kl_calloc(1, sizeof *h);
    if (!h)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    h->e = e;
    h->tok = tok;
    struct sockaddr_storage sa;
    int v6 = 0;
    int rc = http_init(h, o, err);
    if (!rc)
        rc = bind_addr(o->host, o->port, &sa, &v6, err);
    if (rc) {
        http_free(h);
        return rc;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ITC | (v6 ? MHD_USE_IPv6 : 0);
    h->d = MHD_start_daemon(flags, o->port, NULL, NULL, on_request, h,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, h->o.max_conns,
                            MHD_OPTION_CONNECTION_TIMEOUT, 600u,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_END);
    if (!h->d) {
        http_free(h);
        return kl_fail(err, KL_E_IO, "cannot listen on %.200s port %u (in use, or not an "
                       "address of this machine)", o->host ? o->host : "127.0.0.1",
                       (unsigned)o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
    *out = h;
    return 0;
}

uint16_t kl_http_port(const kl_http *h)
{
    return h->port;
}

void kl_http_quiesce(kl_http *h)
{
    atomic_store(&h->stopping, 1);
}

void kl_http_stop(kl_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d);
    http_free(h);
}
