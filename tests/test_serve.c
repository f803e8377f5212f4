/*
 * tests/test_serve.c — `kl serve` end to end over raw HTTP: the binary in $KL_BIN (the ASan
 * build) serves a tiny synthetic checkpoint on 127.0.0.1 at a free port (--port 0, the port
 * read from its --json line) with an API key.  Greedy chat and legacy completions, whole and
 * streamed, equal `kl run` greedy for the same conversation / prompt; stop strings cut the
 * reply before the earliest match; logprobs (greedy: the chosen id heads its alternatives,
 * the same items whole and streamed); models, health, metrics; malformed JSON, wrong types,
 * unknown model, unknown route, oversized body, missing and wrong key answer OpenAI error
 * objects with their status; a client that disconnects mid-stream frees its slot (the running
 * gauge drops to 0, the next request runs); a full queue answers 429 (a second server, one
 * slot, no queue); a queued stream gets keep-alives, then its reply; slow senders and readers
 * stall only themselves; a stopping server answers new requests 503 at once (never a wait);
 * 8 concurrent clients get what each gets alone; a conversation's second
 * turn reuses the first turn's state (usage cached_tokens > 0, whole and streamed) and gets
 * the text and logprobs of a server without the cache (--cache-mb 0); clients sharing a long
 * system prompt at once get what each gets alone; SIGTERM stops the servers with exit 0.
 * Replies never carry special ids (compared with `kl run`'s ids by that rule); tool_choice
 * none / auto / required / named is enforced, a required call is always well-formed; a stop
 * string across two tokens cuts the reply;
 * legacy completions' logprobs; a seed reproduces a sampled reply, min_p 1 is greedy; a stream
 * has a usage chunk only when asked.
 */
#include "common/mem.h"
#include "common/utf8.h"
#include "engine/tokenizer.h"
#include "tests/testutil.h"

#include <arpa/inet.h>
#include <cJSON.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KEY "sekret-key"
#define NCONC 8

static char g_root[512], g_model[600];
static pid_t g_pid;
static int g_port;
static const char *g_keepalive_ms = "1000"; /* kl serve --keepalive-ms for servers started */
static kl_tokenizer *g_tok;
static size_t g_run_specials;    /* special ids among the ids of the last `kl run` */
static time_t g_rcv_timeout_s = 60;   /* receive timeout of the test's connections */

/* ---- the server --------------------------------------------------------------------------- */

/* Starts kl serve with max_seqs, max_queue and cache_mb; *pid and the port it listens on. */
static int start_server_cache(const char *max_seqs, const char *max_queue,
                              const char *cache_mb, pid_t *pid)
{
    int p[2];
    ck_assert(pipe(p) == 0);
    *pid = fork();
    ck_assert(*pid >= 0);
    if (!*pid) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        execl(t_kl_bin(), "kl", "serve", g_model, "--port", "0", "--json", "--threads", "2",
              "--max-seqs", max_seqs, "--max-queue", max_queue, "--api-key", KEY,
              "--served-model-name", "tiny", "--cache-mb", cache_mb, "--keepalive-ms",
              g_keepalive_ms, "-q", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char line[1024];
    FILE *f = fdopen(p[0], "r");
    ck_assert(f && fgets(line, sizeof line, f));
    fclose(f);
    cJSON *j = cJSON_Parse(line);
    ck_assert_msg(j, "not JSON: %s", line);
    cJSON *port = cJSON_GetObjectItem(j, "port");
    ck_assert_msg(cJSON_IsNumber(port), "no port: %s", line);
    int n = port->valueint;
    cJSON_Delete(j);
    return n;
}

static int start_server_with(const char *max_seqs, const char *max_queue, pid_t *pid)
{
    return start_server_cache(max_seqs, max_queue, "64", pid);
}

static void start_server(void)
{
    g_port = start_server_with("4", "64", &g_pid);
}

/* SIGTERM: the server stops with exit 0. */
static void stop_pid(pid_t pid)
{
    int st = 0;
    kill(pid, SIGTERM);
    ck_assert(waitpid(pid, &st, 0) == pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kl serve ended with status %d", st);
}

static void stop_server(void)
{
    stop_pid(g_pid);
}

static void setup(void)
{
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_model, sizeof g_model, "%s/tiny", g_root);
    t_kl_synth_tiny(g_model, 5);
    kl_err err;
    ck_assert(kl_tok_open(g_model, &g_tok, &err) == 0);
    start_server();
}

static void teardown(void)
{
    stop_server();
    kl_tok_close(g_tok);
    t_rmrf(g_root);
}

/* ---- raw HTTP ----------------------------------------------------------------------------- */

typedef struct resp {
    int    status;
    char  *head, *body;   /* malloc'd; body NUL-terminated, de-chunked */
    size_t n;
} resp;

static void resp_free(resp *r)
{
    free(r->head);
    free(r->body);
}

static int connect_server(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert(fd >= 0);
    struct timeval tv = {g_rcv_timeout_s, 0};   /* a server that died or hangs fails the test */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return;          /* the server may answer (413) and close before reading it all */
        p += k;
        n -= (size_t)k;
    }
}

static void send_head(int fd, const char *method, const char *path, const char *key, size_t len)
{
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n%s%s%s\r\n",
                     method, path, len, key ? "Authorization: Bearer " : "", key ? key : "",
                     key ? "\r\n" : "");
    send_all(fd, head, (size_t)n);
}

static void send_request(int fd, const char *method, const char *path, const char *key,
                         const char *body, size_t len)
{
    send_head(fd, method, path, key, len);
    if (len)
        send_all(fd, body, len);
}

/* Removes chunked transfer coding from b[0..*n) in place. */
static void dechunk(char *b, size_t *n)
{
    size_t in = 0, out = 0;
    while (in < *n) {
        char *end;
        size_t k = strtoul(b + in, &end, 16);
        char *nl = strstr(end, "\r\n");
        if (!nl || !k)
            break;
        in = (size_t)(nl + 2 - b);
        memmove(b + out, b + in, k);
        out += k;
        in += k + 2;
    }
    *n = out;
    b[out] = 0;
}

static resp read_response(int fd)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    ssize_t k;
    while ((k = recv(fd, buf + n, cap - n, 0)) > 0) {
        n += (size_t)k;
        if (n == cap)
            buf = realloc(buf, (cap *= 2) + 1);
    }
    close(fd);
    buf[n] = 0;
    resp r = {0};
    char *sep = strstr(buf, "\r\n\r\n");
    ck_assert_msg(sep && sscanf(buf, "HTTP/1.%*d %d", &r.status) == 1, "bad reply: %.200s", buf);
    r.head = strndup(buf, (size_t)(sep - buf));
    r.n = n - (size_t)(sep + 4 - buf);
    r.body = malloc(r.n + 1);
    memcpy(r.body, sep + 4, r.n);
    r.body[r.n] = 0;
    free(buf);
    if (strcasestr(r.head, "transfer-encoding: chunked"))
        dechunk(r.body, &r.n);
    return r;
}

static resp http(const char *method, const char *path, const char *key, const char *body)
{
    int fd = connect_server();
    send_request(fd, method, path, key, body, body ? strlen(body) : 0);
    return read_response(fd);
}

/* The error object of r: its status, type and (when wanted) param and code. */
static void check_error(const resp *r, int status, const char *param, const char *code)
{
    ck_assert_msg(r->status == status, "status %d, wanted %d: %s", r->status, status, r->body);
    cJSON *j = cJSON_Parse(r->body);
    ck_assert_msg(j, "not JSON: %s", r->body);
    cJSON *e = cJSON_GetObjectItem(j, "error");
    ck_assert(cJSON_IsObject(e));
    ck_assert(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    ck_assert(cJSON_IsString(cJSON_GetObjectItem(e, "type")));
    cJSON *p = cJSON_GetObjectItem(e, "param"), *c = cJSON_GetObjectItem(e, "code");
    ck_assert(p && c);
    if (param)
        ck_assert_str_eq(cJSON_GetStringValue(p) ? p->valuestring : "", param);
    if (code)
        ck_assert_str_eq(cJSON_GetStringValue(c) ? c->valuestring : "", code);
    cJSON_Delete(j);
}

/* ---- chat --------------------------------------------------------------------------------- */

static char *chat_body(const char *user, unsigned max_tokens, int stream)
{
    char *b = malloc(1024);
    snprintf(b, 1024, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],"
             "\"max_tokens\":%u,\"temperature\":0%s}", user, max_tokens,
             stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "");
    return b;
}

/* The content of a whole reply (malloc'd); *finish gets its finish_reason. */
static char *whole_content(const resp *r, char *finish, size_t n_finish)
{
    ck_assert_msg(r->status == 200, "status %d: %s", r->status, r->body);
    cJSON *j = cJSON_Parse(r->body);
    ck_assert_msg(j, "not JSON: %s", r->body);
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *msg = cJSON_GetObjectItem(ch, "message");
    const char *c = msg ? cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content"))
                        : cJSON_GetStringValue(cJSON_GetObjectItem(ch, "text"));
    char *out = strdup(c ? c : "");
    snprintf(finish, n_finish, "%s",
             cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason")));
    cJSON_Delete(j);
    return out;
}

/* The content deltas of a streamed reply joined (malloc'd); checks the events' shape. */
static char *stream_content(const resp *r, char *finish, size_t n_finish)
{
    ck_assert_msg(r->status == 200, "status %d: %s", r->status, r->body);
    ck_assert(strcasestr(r->head, "content-type: text/event-stream"));
    size_t cap = r->n + 1, n = 0;
    char *out = calloc(1, cap);
    int done = 0, usage = 0;
    finish[0] = 0;
    for (char *ev = r->body; *ev; ) {
        char *end = strstr(ev, "\n\n");
        ck_assert_msg(end, "an event without its blank line: %.200s", ev);
        *end = 0;
        if (ev[0] != ':') {
            ck_assert_msg(!strncmp(ev, "data: ", 6), "not a data line: %.200s", ev);
            ck_assert_msg(!done, "an event after [DONE]");
            if (!strcmp(ev + 6, "[DONE]")) {
                done = 1;
            } else {
                cJSON *j = cJSON_Parse(ev + 6);
                ck_assert_msg(j, "not JSON: %s", ev + 6);
                cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
                cJSON *delta = cJSON_GetObjectItem(ch, "delta");
                const char *c = delta ? cJSON_GetStringValue(cJSON_GetObjectItem(delta,
                                                                                 "content"))
                                      : cJSON_GetStringValue(cJSON_GetObjectItem(ch, "text"));
                const char *f = cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason"));
                if (c) {
                    memcpy(out + n, c, strlen(c));
                    n += strlen(c);
                }
                if (f)
                    snprintf(finish, n_finish, "%s", f);
                usage |= cJSON_IsObject(cJSON_GetObjectItem(j, "usage"));
                cJSON_Delete(j);
            }
        }
        ev = end + 2;
    }
    ck_assert_msg(done, "no [DONE]");
    ck_assert_msg(usage, "no usage chunk");
    return out;
}

/* A reply's content (stream or not) to body b on path. */
static char *ask(const char *path, const char *b, int stream, char *finish)
{
    resp r = http("POST", path, KEY, b);
    char *c = stream ? stream_content(&r, finish, 16) : whole_content(&r, finish, 16);
    resp_free(&r);
    return c;
}

static char *chat(const char *user, unsigned max_tokens, int stream, char *finish)
{
    char *b = chat_body(user, max_tokens, stream);
    char *c = ask("/v1/chat/completions", b, stream, finish);
    free(b);
    return c;
}

/* The reply text of ids (a cJSON array) by the server's rule for replies without tools: special
 * ids dropped, the rest decoded, bytes that are not UTF-8 as U+FFFD (malloc'd); counts the
 * dropped ids in g_run_specials. */
static char *reply_text(const cJSON *ids)
{
    size_t n = 0, cap = (size_t)cJSON_GetArraySize(ids) + 1;
    kl_token *keep = malloc(cap * sizeof *keep);
    g_run_specials = 0;
    for (const cJSON *v = ids->child; v; v = v->next) {
        if ((uint32_t)v->valuedouble < kl_tok_n_ranks(g_tok))
            keep[n++] = (kl_token)v->valuedouble;
        else
            g_run_specials++;
    }
    char *bytes = NULL;
    size_t len = 0;
    kl_err err;
    ck_assert(kl_tok_decode(g_tok, keep, n, 0, &bytes, &len, &err) == 0);
    char *clean = kl_utf8_sanitize(bytes, len), *out = strdup(clean);
    kl_free(clean);
    kl_free(bytes);
    free(keep);
    return out;
}

/* `kl run --chat USER -n N` (how "--chat"; "-p" for a plain prompt) greedy ids (its --json
 * "generated_ids") as the server shows them: reply_text. */
static char *run_text_as(const char *how, const char *user, unsigned n)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s run %s %s '%s' -n %u --threads 2 --json -q", t_kl_bin(),
             g_model, how, user, n);
    FILE *p = popen(cmd, "r");
    ck_assert(p);
    static char line[1 << 16];
    ck_assert(fgets(line, sizeof line, p));
    ck_assert_int_eq(pclose(p), 0);
    cJSON *j = cJSON_Parse(line);
    ck_assert_msg(j, "kl run: %s", line);
    char *t = reply_text(cJSON_GetObjectItem(j, "generated_ids"));
    cJSON_Delete(j);
    return t;
}

static char *run_text(const char *user, unsigned n)
{
    return run_text_as("--chat", user, n);
}

/* The whole and the streamed reply both equal want, cut by the length limit; frees all. */
static void same_replies(char *want, char *whole, const char *fw, char *streamed,
                         const char *fs)
{
    ck_assert_str_eq(whole, want);
    ck_assert_str_eq(streamed, want);
    ck_assert_str_eq(fw, "length");
    ck_assert_str_eq(fs, "length");
    free(want);
    free(whole);
    free(streamed);
}

/* The server's text is `kl run`'s ids without the special ones (this reply has some: a
 * reserved id and a tool-call marker), whole and streamed. */
START_TEST(test_chat_equals_run)
{
    char *want = run_text("hello there", 12);
    ck_assert_msg(g_run_specials > 0, "no special id in the reply: the rule is not exercised");
    ck_assert_msg(!strstr(want, "<|"), "special text in '%s'", want);
    char fw[16], fs[16];
    char *whole = chat("hello there", 12, 0, fw);
    char *streamed = chat("hello there", 12, 1, fs);
    same_replies(want, whole, fw, streamed, fs);
}
END_TEST

START_TEST(test_completions_equal_run)
{
    char *want = run_text_as("-p", "Once upon a time", 10);
    char b[512], fw[16], fs[16];
    snprintf(b, sizeof b, "{\"model\":\"tiny\",\"prompt\":\"Once upon a time\","
             "\"max_tokens\":10,\"temperature\":0}");
    char *whole = ask("/v1/completions", b, 0, fw);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",\"prompt\":[\"Once upon a time\"],"
             "\"max_tokens\":10,\"temperature\":0,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}");
    char *streamed = ask("/v1/completions", b, 1, fs);
    same_replies(want, whole, fw, streamed, fs);
    resp r = http("POST", "/v1/completions", KEY,
                  "{\"model\":\"tiny\",\"prompt\":\"x\",\"echo\":true}");
    check_error(&r, 400, "echo", NULL);
    resp_free(&r);
}
END_TEST

/* A stop string cuts the reply before it (the earliest match), finish_reason "stop". */
START_TEST(test_stop_strings)
{
    char f[16];
    char *all = chat("hello there", 24, 0, f);
    /* a 3-byte ASCII stop string from the middle of the reply */
    size_t n = strlen(all), p = n / 3;
    while (p + 3 < n && !(all[p] > 32 && all[p] < 127 && all[p + 1] > 32 && all[p + 1] < 127 &&
                          all[p + 2] > 32 && all[p + 2] < 127 && !strchr("\"\\", all[p]) &&
                          !strchr("\"\\", all[p + 1]) && !strchr("\"\\", all[p + 2])))
        p++;
    ck_assert_msg(p + 3 < n, "no ASCII run in: %s", all);
    char stop[4] = {all[p], all[p + 1], all[p + 2], 0};
    size_t cut = (size_t)(strstr(all, stop) - all);
    for (int stream = 0; stream < 2; stream++) {
        char b[512], fr[16];
        snprintf(b, sizeof b, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"hello there\"}],\"max_tokens\":24,\"temperature\":0,"
                 "\"stop\":[\"%s\", \"zzzzzzzzzzzzzzz\"]%s}", stop,
                 stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "");
        char *got = ask("/v1/chat/completions", b, stream, fr);
        ck_assert_msg(strlen(got) == cut && !strncmp(got, all, cut),
                      "stop '%s': got '%s' of '%s'", stop, got, all);
        ck_assert_str_eq(fr, "stop");
        free(got);
    }
    free(all);
}
END_TEST

START_TEST(test_models_health_metrics)
{
    resp r = http("GET", "/health", NULL, NULL);
    ck_assert_int_eq(r.status, 200);
    ck_assert(strstr(r.body, "\"ok\""));
    resp_free(&r);
    r = http("GET", "/v1/models", KEY, NULL);
    ck_assert_int_eq(r.status, 200);
    cJSON *j = cJSON_Parse(r.body);
    cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(m, "id")), "tiny");
    ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(j, "object")), "list");
    cJSON_Delete(j);
    resp_free(&r);
    r = http("GET", "/metrics", KEY, NULL);
    ck_assert_int_eq(r.status, 200);
    ck_assert(strstr(r.body, "kl_requests_total "));
    ck_assert(strstr(r.body, "kl_time_to_first_token_seconds_bucket{le=\"+Inf\"}"));
    resp_free(&r);
}
END_TEST

START_TEST(test_errors)
{
    resp r = http("GET", "/v1/models", NULL, NULL);
    check_error(&r, 401, NULL, "invalid_api_key");
    resp_free(&r);
    r = http("GET", "/v1/models", "wrong", NULL);
    check_error(&r, 401, NULL, "invalid_api_key");
    resp_free(&r);
    r = http("POST", "/v1/chat/completions", KEY, "{\"model\": \"tiny\", \"messages\": [");
    check_error(&r, 400, NULL, NULL);
    resp_free(&r);
    r = http("POST", "/v1/chat/completions", KEY,
             "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
             "\"max_tokens\":\"ten\"}");
    check_error(&r, 400, "max_tokens", NULL);
    resp_free(&r);
    r = http("POST", "/v1/chat/completions", KEY,
             "{\"model\":\"other\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
    check_error(&r, 404, "model", "model_not_found");
    resp_free(&r);
    r = http("GET", "/v1/nothing", KEY, NULL);
    check_error(&r, 404, NULL, NULL);
    resp_free(&r);
    size_t big = (4u << 20) + 10;
    char *b = malloc(big);
    memset(b, ' ', big);
    int fd = connect_server();
    send_request(fd, "POST", "/v1/chat/completions", KEY, b, big);
    r = read_response(fd);
    check_error(&r, 413, NULL, NULL);
    resp_free(&r);
    free(b);
}
END_TEST

/* Every logprobs item of a reply, whole or streamed, as one JSON array text (malloc'd). */
static char *logprob_items(const resp *r, int stream)
{
    cJSON *all = cJSON_CreateArray();
    for (char *ev = r->body; ev && *ev; ) {
        char *end = stream ? strstr(ev, "\n\n") : NULL;
        if (end)
            *end = 0;
        const char *js = stream ? (strncmp(ev, "data: {", 7) ? NULL : ev + 6) : ev;
        cJSON *j = js ? cJSON_Parse(js) : NULL;
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "logprobs"), "content");
        for (cJSON *it = c ? c->child : NULL; it; it = it->next)
            cJSON_AddItemToArray(all, cJSON_Duplicate(it, 1));
        cJSON_Delete(j);
        ev = end ? end + 2 : NULL;
    }
    char *s = cJSON_PrintUnformatted(all);
    cJSON_Delete(all);
    return s;
}

/* Greedy with logprobs: one item per id, the chosen id first among its alternatives (sorted,
 * <= 0), the same items whole and streamed. */
START_TEST(test_logprobs)
{
    char *items[2];
    for (int stream = 0; stream < 2; stream++) {
        char b[512];
        snprintf(b, sizeof b, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"hi\"}],\"max_tokens\":6,\"temperature\":0,"
                 "\"logprobs\":true,\"top_logprobs\":3%s}", stream ? ",\"stream\":true" : "");
        resp r = http("POST", "/v1/chat/completions", KEY, b);
        ck_assert_int_eq(r.status, 200);
        items[stream] = logprob_items(&r, stream);
        resp_free(&r);
    }
    ck_assert_str_eq(items[0], items[1]);
    cJSON *all = cJSON_Parse(items[0]);
    ck_assert_int_eq(cJSON_GetArraySize(all), 6);
    for (cJSON *it = all->child; it; it = it->next) {
        cJSON *top = cJSON_GetObjectItem(it, "top_logprobs");
        ck_assert_int_eq(cJSON_GetArraySize(top), 3);
        double lp = cJSON_GetObjectItem(it, "logprob")->valuedouble, prev = 0;
        ck_assert_str_eq(cJSON_GetObjectItem(it, "token")->valuestring,
                         cJSON_GetObjectItem(top->child, "token")->valuestring);
        ck_assert(lp == cJSON_GetObjectItem(top->child, "logprob")->valuedouble);
        for (cJSON *t = top->child; t; t = t->next) {
            double v = cJSON_GetObjectItem(t, "logprob")->valuedouble;
            ck_assert(v <= prev);
            prev = v;
        }
    }
    cJSON_Delete(all);
    free(items[0]);
    free(items[1]);
}
END_TEST

/* 1 when s is printable ASCII without quotes or backslashes (safe in a JSON string as is). */
static int plain_ascii(const char *s)
{
    for (; *s; s++)
        if (*s <= ' ' || *s > '~' || *s == '"' || *s == '\\')
            return 0;
    return 1;
}

/* A stop string made of the end of one token and the start of the next (streamed, they come
 * in different chunks) cuts the reply before its earliest match. */
START_TEST(test_stop_across_tokens)
{
    const char *fmt = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":"
                      "\"hello there\"}],\"max_tokens\":24,\"temperature\":0%s%s%s%s}";
    char b[512], f[16], stop[8] = "";
    snprintf(b, sizeof b, fmt, ",\"logprobs\":true", "", "", "");
    resp r = http("POST", "/v1/chat/completions", KEY, b);
    char *all = whole_content(&r, f, sizeof f);
    cJSON *j = cJSON_Parse(r.body);
    cJSON *items = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(
        cJSON_GetObjectItem(j, "choices"), 0), "logprobs"), "content");
    for (cJSON *it = items->child; it && it->next && !stop[0]; it = it->next) {
        const char *t1 = cJSON_GetObjectItem(it, "token")->valuestring;
        const char *t2 = cJSON_GetObjectItem(it->next, "token")->valuestring;
        if (*t1 && *t2 && plain_ascii(t1) && plain_ascii(t2) && strncmp(t1, "<|", 2) &&
            strncmp(t2, "<|", 2))
            snprintf(stop, sizeof stop, "%c%.2s", t1[strlen(t1) - 1], t2);
    }
    cJSON_Delete(j);
    resp_free(&r);
    ck_assert_msg(stop[0], "no two plain ASCII tokens in a row in '%s'", all);
    size_t cut = (size_t)(strstr(all, stop) - all);
    for (int stream = 0; stream < 2; stream++) {
        snprintf(b, sizeof b, fmt, ",\"stop\":\"", stop, "\"",
                 stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "");
        char *got = ask("/v1/chat/completions", b, stream, f);
        ck_assert_msg(strlen(got) == cut && !strncmp(got, all, cut), "stop '%s': got '%s' of '%s'",
                      stop, got, all);
        ck_assert_str_eq(f, "stop");
        free(got);
    }
    free(all);
}
END_TEST

/* A client that sends its body slowly and one that does not read its stream hold only their
 * own connections: other requests are served meanwhile, and both complete. */
START_TEST(test_slow_clients)
{
    char *b = chat_body("slow one", 4, 0), *lb = chat_body("unread", 1500, 1), f[16];
    size_t n = strlen(b);
    int slow = connect_server(), lazy = connect_server();
    send_head(slow, "POST", "/v1/chat/completions", KEY, n);
    send_all(slow, b, n / 2);
    send_request(lazy, "POST", "/v1/chat/completions", KEY, lb, strlen(lb));
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    for (int i = 0; i < 2; i++) {
        char *c = chat("meanwhile", 4, i, f);
        ck_assert_str_eq(f, "length");
        free(c);
    }
    send_all(slow, b + n / 2, n - n / 2);
    resp r = read_response(slow);
    free(whole_content(&r, f, sizeof f));
    ck_assert_str_eq(f, "length");
    resp_free(&r);
    r = read_response(lazy);
    free(stream_content(&r, f, sizeof f));
    ck_assert_str_eq(f, "length");
    resp_free(&r);
    free(b);
    free(lb);
}
END_TEST

/* ---- tool_choice ------------------------------------------------------------------------- */

#define TOOLS "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"," \
              "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":" \
              "\"string\"}}}}}]"
#define TOOLS2 "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"," \
               "\"parameters\":{\"type\":\"object\"}}},{\"type\":\"function\",\"function\":{" \
               "\"name\":\"get_time\",\"parameters\":{\"type\":\"object\"}}}]"
#define NAMED "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}"
#define EARLIER_CALL ",{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":" \
                     "\"functions.get_weather:0\",\"type\":\"function\",\"function\":{" \
                     "\"name\":\"get_weather\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\"," \
                     "\"tool_call_id\":\"functions.get_weather:0\",\"content\":\"rain\"}," \
                     "{\"role\":\"user\",\"content\":\"and tomorrow?\"}"

/* A chat about the weather (limits and sampling: "" 16 greedy ids, else keys such as
 * ",\"max_tokens\":64,\"temperature\":1"):
 * tools (0 none, 1 get_weather, 2 get_weather and get_time), tool_choice (NULL: not given),
 * messages after the first (or ""). */
static resp weather_with(int tools, const char *choice, const char *more, int stream,
                         const char *sampling)
{
    char b[2048], tc[160] = "";
    if (choice)
        snprintf(tc, sizeof tc, ",\"tool_choice\":%s", choice);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":"
             "\"weather please\"}%s]%s%s%s%s}", more,
             tools == 2 ? "," TOOLS2 : tools ? "," TOOLS : "", tc,
             *sampling ? sampling : ",\"max_tokens\":16,\"temperature\":0",
             stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "");
    return http("POST", "/v1/chat/completions", KEY, b);
}

static resp weather(int tools, const char *choice, const char *more, int stream)
{
    return weather_with(tools, choice, more, stream, "");
}

/* usage.prompt_tokens of a whole reply or a stream's usage chunk. */
static int prompt_tokens(const resp *r)
{
    const char *p = strstr(r->body, "\"prompt_tokens\":");
    ck_assert_msg(p, "no usage: %.300s", r->body);
    return atoi(p + 16);
}

typedef struct calls {
    char id[64], name[64], args[1024], content[1024], finish[16];
    int  n;            /* calls */
} calls;

/* The content and the first call of a whole reply. */
static calls whole_calls(const resp *r)
{
    calls c = {0};
    ck_assert_msg(r->status == 200, "status %d: %s", r->status, r->body);
    cJSON *j = cJSON_Parse(r->body);
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *msg = cJSON_GetObjectItem(ch, "message");
    cJSON *tc = cJSON_GetObjectItem(msg, "tool_calls");
    const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content"));
    snprintf(c.content, sizeof c.content, "%s", content ? content : "");
    snprintf(c.finish, sizeof c.finish, "%s",
             cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason")));
    c.n = cJSON_GetArraySize(tc);
    cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(tc, 0), "function");
    if (c.n) {
        snprintf(c.id, sizeof c.id, "%s",
                 cJSON_GetStringValue(cJSON_GetObjectItem(tc->child, "id")));
        snprintf(c.name, sizeof c.name, "%s",
                 cJSON_GetStringValue(cJSON_GetObjectItem(fn, "name")));
        snprintf(c.args, sizeof c.args, "%s",
                 cJSON_GetStringValue(cJSON_GetObjectItem(fn, "arguments")));
    }
    cJSON_Delete(j);
    return c;
}

/* The same from a stream's deltas (the first call's id, name and arguments joined). */
static calls stream_calls(const resp *r)
{
    calls c = {0};
    ck_assert_msg(r->status == 200, "status %d: %s", r->status, r->body);
    char *body = strdup(r->body);
    for (char *ev = body, *end; (end = strstr(ev, "\n\n")); ev = end + 2) {
        *end = 0;
        cJSON *j = strncmp(ev, "data: {", 7) ? NULL : cJSON_Parse(ev + 6);
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        cJSON *d = cJSON_GetObjectItem(ch, "delta");
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(d, "content"));
        const char *f = cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason"));
        cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "tool_calls"), 0);
        cJSON *fn = cJSON_GetObjectItem(tc, "function");
        if (t)
            strncat(c.content, t, sizeof c.content - strlen(c.content) - 1);
        if (f)
            snprintf(c.finish, sizeof c.finish, "%s", f);
        if (tc && cJSON_GetObjectItem(tc, "id") && ++c.n == 1) {
            snprintf(c.id, sizeof c.id, "%s", cJSON_GetObjectItem(tc, "id")->valuestring);
            snprintf(c.name, sizeof c.name, "%s", cJSON_GetObjectItem(fn, "name")->valuestring);
        }
        if (tc && cJSON_GetObjectItem(tc, "index")->valueint == 0)
            strncat(c.args, cJSON_GetObjectItem(fn, "arguments")->valuestring,
                    sizeof c.args - strlen(c.args) - 1);
        cJSON_Delete(j);
    }
    free(body);
    return c;
}

/* One reply to weather(...): prompt tokens, content and calls (whole or streamed). */
static calls weather_calls(int tools, const char *choice, const char *more, int stream,
                           int *n_prompt)
{
    resp r = weather(tools, choice, more, stream);
    calls c = stream ? stream_calls(&r) : whole_calls(&r);
    *n_prompt = prompt_tokens(&r);
    resp_free(&r);
    ck_assert_msg(!strstr(c.content, "<|"), "special text in the content: '%s'", c.content);
    return c;
}

/* "none" renders no tools (the reply is the one without tools), a named tool (or "required"
 * with one tool) starts the reply with its whole head: a call to it comes back, whole and
 * streamed alike, its index counting the conversation's earlier calls. */
START_TEST(test_tool_choice_is_enforced)
{
    int plain, none, aut, req, named, named_s, later;
    calls c0 = weather_calls(0, NULL, "", 0, &plain);
    calls cn = weather_calls(1, "\"none\"", "", 0, &none);
    ck_assert_int_eq(none, plain);
    ck_assert_str_eq(cn.content, c0.content);
    ck_assert_int_eq(cn.n, 0);
    weather_calls(1, "\"auto\"", "", 0, &aut);
    ck_assert_int_gt(aut, plain + 20);
    calls cr = weather_calls(1, "\"required\"", "", 0, &req);
    calls w = weather_calls(1, NAMED, "", 0, &named);
    calls st = weather_calls(1, NAMED, "", 1, &named_s);
    ck_assert_int_gt(named, aut + 2);     /* the section, a call's begin, then its head */
    ck_assert_int_eq(named_s, named);
    ck_assert_int_eq(req, named);         /* "required" with one tool: the same head */
    for (int i = 0; i < 3; i++) {
        const calls *c = i == 2 ? &cr : i ? &st : &w;
        ck_assert_msg(c->n == 1, "%s: %d calls", i ? "stream" : "whole", c->n);
        ck_assert_str_eq(c->id, "functions.get_weather:0");
        ck_assert_str_eq(c->name, "get_weather");
        ck_assert_str_eq(c->finish, "tool_calls");
        ck_assert_str_eq(c->content, "");
    }
    ck_assert_str_eq(st.args, w.args);
    calls c2 = weather_calls(1, NAMED, EARLIER_CALL, 1, &later);
    ck_assert_str_eq(c2.id, "functions.get_weather:1");
    resp r = weather(1, "{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}", "", 0);
    check_error(&r, 400, "tool_choice", NULL);
    resp_free(&r);
    r = weather(0, "\"required\"", "", 0);
    check_error(&r, 400, "tool_choice", NULL);
    resp_free(&r);
}
END_TEST

/* "required" with two tools: the prompt ends with the section and a call's begin, and the
 * model chooses which call head follows.  The random tiny model would write anything there;
 * every reply (64 ids: room for the head), greedy or sampled with several seeds, whole or
 * streamed, still carries a well-formed call functions.NAME:0 to a declared tool, named as its
 * id says. */
START_TEST(test_required_call_is_well_formed)
{
    int aut, req;
    weather_calls(2, "\"auto\"", "", 0, &aut);
    for (int k = 0; k < 8; k++) {
        char sampling[96] = ",\"max_tokens\":64,\"temperature\":0";
        if (k >= 2)
            snprintf(sampling, sizeof sampling, ",\"max_tokens\":64,\"temperature\":1.5,"
                     "\"seed\":%d", k);
        resp r = weather_with(2, "\"required\"", "", k & 1, sampling);
        calls c = k & 1 ? stream_calls(&r) : whole_calls(&r);
        req = prompt_tokens(&r);
        resp_free(&r);
        ck_assert_int_eq(req, aut + 2);   /* <|tool_calls_section_begin|><|tool_call_begin|> */
        ck_assert_msg(c.n >= 1, "reply %d: no call (content '%s')", k, c.content);
        ck_assert_msg(!strcmp(c.name, "get_weather") || !strcmp(c.name, "get_time"),
                      "reply %d: call to '%s'", k, c.name);
        char want[96];
        snprintf(want, sizeof want, "functions.%s:0", c.name);
        ck_assert_str_eq(c.id, want);
        ck_assert_str_eq(c.content, "");
        ck_assert_str_eq(c.finish, "tool_calls");
    }
}
END_TEST

/* ---- legacy completions' logprobs, seed, min_p, usage ------------------------------------ */

/* The legacy logprobs of a completion (whole, or its chunks' arrays joined): a cJSON object. */
static cJSON *legacy_logprobs(const resp *r, int stream)
{
    static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs",
                                       "text_offset"};
    ck_assert_msg(r->status == 200, "status %d: %s", r->status, r->body);
    cJSON *all = cJSON_CreateObject();
    for (int k = 0; k < 4; k++)
        cJSON_AddArrayToObject(all, keys[k]);
    char *body = strdup(r->body);
    for (char *ev = body, *end = NULL; ev; ev = end ? end + 2 : NULL) {
        end = stream ? strstr(ev, "\n\n") : NULL;
        if (end)
            *end = 0;
        cJSON *j = cJSON_Parse(stream ? (strncmp(ev, "data: {", 7) ? "null" : ev + 6) : ev);
        cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"),
                                                           0), "logprobs");
        for (int k = 0; lp && !cJSON_IsNull(lp) && k < 4; k++)
            for (cJSON *v = cJSON_GetObjectItem(lp, keys[k])->child; v; v = v->next)
                cJSON_AddItemToArray(cJSON_GetObjectItem(all, keys[k]), cJSON_Duplicate(v, 1));
        cJSON_Delete(j);
        if (stream && !end)
            break;
    }
    free(body);
    return all;
}

/* logprobs N on /v1/completions: OpenAI's legacy arrays, one entry per id, the sampled token
 * (greedy: the most likely) among at most N + 1 alternatives, offsets from 0 not decreasing;
 * streamed chunks carry the same entries; out of range is a 400. */
START_TEST(test_completion_logprobs)
{
    const char *b = "{\"model\":\"tiny\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,"
                    "\"temperature\":0,\"logprobs\":2%s}";
    char body[512];
    cJSON *got[2];
    for (int stream = 0; stream < 2; stream++) {
        snprintf(body, sizeof body, b, stream ? ",\"stream\":true" : "");
        resp r = http("POST", "/v1/completions", KEY, body);
        got[stream] = legacy_logprobs(&r, stream);
        resp_free(&r);
    }
    ck_assert(cJSON_Compare(got[0], got[1], 1));
    cJSON *toks = cJSON_GetObjectItem(got[0], "tokens");
    cJSON *lps = cJSON_GetObjectItem(got[0], "token_logprobs");
    cJSON *top = cJSON_GetObjectItem(got[0], "top_logprobs");
    cJSON *off = cJSON_GetObjectItem(got[0], "text_offset");
    ck_assert_int_eq(cJSON_GetArraySize(toks), 8);
    ck_assert_int_eq(cJSON_GetArraySize(lps), 8);
    ck_assert_int_eq(cJSON_GetArraySize(top), 8);
    ck_assert_int_eq(cJSON_GetArraySize(off), 8);
    ck_assert_int_eq(off->child->valueint, 0);
    for (int i = 0; i < 8; i++) {
        const char *t = cJSON_GetArrayItem(toks, i)->valuestring;
        double lp = cJSON_GetArrayItem(lps, i)->valuedouble;
        cJSON *alts = cJSON_GetArrayItem(top, i);
        ck_assert_int_le(cJSON_GetArraySize(alts), 3);
        ck_assert_msg(cJSON_GetObjectItemCaseSensitive(alts, t) &&
                      cJSON_GetObjectItemCaseSensitive(alts, t)->valuedouble == lp,
                      "token %d '%s' not among its alternatives", i, t);
        for (cJSON *a = alts->child; a; a = a->next)
            ck_assert(a->valuedouble <= lp);
        if (i)
            ck_assert_int_ge(cJSON_GetArrayItem(off, i)->valueint,
                             cJSON_GetArrayItem(off, i - 1)->valueint);
    }
    cJSON_Delete(got[0]);
    cJSON_Delete(got[1]);
    resp r = http("POST", "/v1/completions", KEY,
                  "{\"model\":\"tiny\",\"prompt\":\"x\",\"logprobs\":21}");
    check_error(&r, 400, "logprobs", NULL);
    resp_free(&r);
}
END_TEST

/* A sampled chat body: temperature, seed, min_p (< 0: not given), streamed or not. */
static char *sampled(double temp, long seed, double min_p, int stream, char *finish)
{
    char b[512], mp[32] = "";
    if (min_p >= 0)
        snprintf(mp, sizeof mp, ",\"min_p\":%g", min_p);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":"
             "\"tell a story\"}],\"max_tokens\":12,\"temperature\":%g,\"seed\":%ld%s%s}", temp,
             seed, mp, stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}"
                              : "");
    return ask("/v1/chat/completions", b, stream, finish);
}

/* The same seed samples the same reply (whole or streamed, again); min_p 1 keeps only the most
 * likely id: the greedy reply at any temperature. */
START_TEST(test_seed_and_min_p)
{
    char f[16];
    char *a = sampled(1.3, -42, -1, 0, f), *b = sampled(1.3, -42, -1, 1, f);
    char *c = sampled(1.3, -42, -1, 0, f);
    ck_assert_str_eq(a, b);
    ck_assert_str_eq(a, c);
    char *greedy = sampled(0, 1, -1, 0, f), *mp = sampled(1.3, 7, 1.0, 1, f);
    ck_assert_str_eq(mp, greedy);
    free(a);
    free(b);
    free(c);
    free(greedy);
    free(mp);
}
END_TEST

/* A stream without stream_options.include_usage has no usage chunk. */
START_TEST(test_usage_only_when_asked)
{
    resp r = http("POST", "/v1/chat/completions", KEY,
                  "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                  "\"max_tokens\":3,\"stream\":true}");
    ck_assert_int_eq(r.status, 200);
    ck_assert_msg(!strstr(r.body, "\"usage\""), "usage without include_usage: %s", r.body);
    ck_assert(strstr(r.body, "data: [DONE]\n\n"));
    resp_free(&r);
}
END_TEST

/* The value of one metric of /metrics (name followed by a space). */
static long metric_now(const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "\n%s ", name);
    resp r = http("GET", "/metrics", KEY, NULL);
    const char *p = strstr(r.body, key);
    ck_assert_msg(p, "no %s in /metrics", name);
    long n = atol(p + strlen(key));
    resp_free(&r);
    return n;
}

static int running_now(void)
{
    return (int)metric_now("kl_running");
}

/* A long stream, its first 2000 bytes read: the connection (left open).  The tiny model's
 * greedy reply to this prompt runs for about 2,100 ids before its end id (seconds here). */
static int long_stream(void)
{
    char *b = chat_body("hello there", 30000, 1);
    int fd = connect_server();
    send_request(fd, "POST", "/v1/chat/completions", KEY, b, strlen(b));
    free(b);
    char buf[4096];
    size_t got = 0;
    while (got < 2000) {          /* the role chunk and some content */
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        ck_assert(k > 0);
        got += (size_t)k;
    }
    return fd;
}

/* Polls the running gauge until it is want (10 s at most); the last value. */
static int wait_running(int want)
{
    int n = -1;
    for (int i = 0; i < 200 && (n = running_now()) != want; i++) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return n;
}

START_TEST(test_disconnect_frees_slot)
{
    int fd = long_stream();
    ck_assert_int_eq(running_now(), 1);
    close(fd);
    ck_assert_msg(wait_running(0) == 0, "the disconnected stream still holds its slot");
    /* the same for a whole (not streamed) reply: the client leaves once the server has
     * accepted the request (the greedy reply of the tiny model may end on its own within a
     * fraction of a second, so "running" is not waited for: accepted is what counts) */
    const long accepted = metric_now("kl_requests_total");
    char *b = chat_body("a long story", 30000, 0);
    fd = connect_server();
    send_request(fd, "POST", "/v1/chat/completions", KEY, b, strlen(b));
    free(b);
    for (int i = 0; i < 200 && metric_now("kl_requests_total") == accepted; i++) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ck_assert_int_gt(metric_now("kl_requests_total"), accepted);
    close(fd);
    ck_assert_msg(wait_running(0) == 0, "the disconnected client still holds its slot");
    char f[16];
    char *c = chat("after", 4, 0, f);
    ck_assert_str_eq(f, "length");
    free(c);
}
END_TEST

/* One slot and no queue: a second request while the first streams gets 429; once the first
 * client is gone, requests run again. */
START_TEST(test_queue_full)
{
    int main_port = g_port;
    pid_t pid;
    g_port = start_server_with("1", "0", &pid);
    int fd = long_stream();
    char *b = chat_body("second", 4, 0);
    resp r = http("POST", "/v1/chat/completions", KEY, b);
    check_error(&r, 429, NULL, "rate_limit_exceeded");
    resp_free(&r);
    close(fd);
    int status = 429;
    for (int i = 0; i < 200 && status == 429; i++) {
        r = http("POST", "/v1/chat/completions", KEY, b);
        status = r.status;
        resp_free(&r);
        if (status == 429) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    ck_assert_int_eq(status, 200);
    free(b);
    stop_pid(pid);
    g_port = main_port;
}
END_TEST

/* A request queued behind a busy slot gets keep-alive comments (its job has no ids yet) every
 * --keepalive-ms (20 here: ten periods while it waits), then its whole stream once the slot is
 * free. */
START_TEST(test_queued_stream_waits)
{
    int main_port = g_port;
    pid_t pid;
    g_keepalive_ms = "20";
    g_port = start_server_with("1", "4", &pid);
    g_keepalive_ms = "1000";
    int busy = long_stream(); /* the one slot busy: ~2,100 ids, ~1 s on a development VM */
    char *b = chat_body("queued", 4, 1), f[16];
    int fd = connect_server();
    send_request(fd, "POST", "/v1/chat/completions", KEY, b, strlen(b));
    int queued = -1;
    for (int i = 0; i < 200 && (queued = (int)metric_now("kl_queue_depth")) < 1; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ck_assert_int_eq(queued, 1);
    struct timespec ts = {0, 200 * 1000 * 1000}; /* ten keep-alive periods in the queue */
    nanosleep(&ts, NULL);
    close(busy); /* a gone client: its job cancelled, the queued one runs */
    resp r = read_response(fd);
    ck_assert_msg(strstr(r.body, ": waiting\n\n"), "no keep-alive while queued: %.300s", r.body);
    free(stream_content(&r, f, sizeof f));
    ck_assert_str_eq(f, "length");
    resp_free(&r);
    free(b);
    stop_pid(pid);
    g_port = main_port;
}
END_TEST

/* A server stopping (SIGTERM) while a stream is in flight answers every new request at once
 * with 503 and an OpenAI error object, whatever the route, whole or streamed, and never keeps
 * a client waiting (receive timeout 10 s); once the stream's client is gone it exits 0. */
START_TEST(test_stopping_answers_503)
{
    int main_port = g_port;
    pid_t pid;
    g_port = start_server_with("1", "4", &pid);
    int busy = long_stream();
    g_rcv_timeout_s = 10;
    kill(pid, SIGTERM);
    resp r = http("GET", "/health", NULL, NULL);
    for (int i = 0; i < 200 && r.status == 200; i++) {
        resp_free(&r);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        r = http("GET", "/health", NULL, NULL);
    }
    check_error(&r, 503, NULL, "service_unavailable");
    resp_free(&r);
    for (int stream = 0; stream < 2; stream++) {
        char *b = chat_body("late", 4, stream);
        r = http("POST", "/v1/chat/completions", KEY, b);
        check_error(&r, 503, NULL, "service_unavailable");
        resp_free(&r);
        free(b);
    }
    r = http("GET", "/v1/models", KEY, NULL);
    check_error(&r, 503, NULL, "service_unavailable");
    resp_free(&r);
    g_rcv_timeout_s = 60;
    close(busy);
    int st = 0;
    ck_assert(waitpid(pid, &st, 0) == pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kl serve ended with status %d", st);
    g_port = main_port;
}
END_TEST

typedef struct conc {
    int   k;
    char *got;
} conc;

static void user_of(int k, char *u, size_t n)
{
    snprintf(u, n, "client %d asks something %d", k, k * 7);
}

static void *conc_main(void *arg)
{
    conc *c = arg;
    char u[64], f[16];
    user_of(c->k, u, sizeof u);
    c->got = chat(u, 10 + (unsigned)c->k, c->k % 2, f);
    return NULL;
}

START_TEST(test_concurrent_equal_alone)
{
    char *alone[NCONC];
    for (int k = 0; k < NCONC; k++) {
        char u[64], f[16];
        user_of(k, u, sizeof u);
        alone[k] = chat(u, 10 + (unsigned)k, 0, f);
    }
    conc c[NCONC];
    pthread_t th[NCONC];
    for (int k = 0; k < NCONC; k++) {
        c[k] = (conc){.k = k};
        ck_assert(pthread_create(&th[k], NULL, conc_main, &c[k]) == 0);
    }
    for (int k = 0; k < NCONC; k++) {
        pthread_join(th[k], NULL);
        ck_assert_msg(c[k].got && !strcmp(c[k].got, alone[k]),
                      "client %d: '%s' served among others, '%s' alone", k, c[k].got, alone[k]);
        free(c[k].got);
        free(alone[k]);
    }
}
END_TEST

/* ---- state reuse ------------------------------------------------------------------------- */

/* A greedy chat body with logprobs over messages (role, content pairs; NULL-ended). */
static char *turn_body(const char *const *msgs, int stream)
{
    cJSON *b = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(b, "messages");
    cJSON_AddStringToObject(b, "model", "tiny");
    for (size_t i = 0; msgs[i]; i += 2) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", msgs[i]);
        cJSON_AddStringToObject(m, "content", msgs[i + 1]);
        cJSON_AddItemToArray(arr, m);
    }
    cJSON_AddNumberToObject(b, "max_tokens", 8);
    cJSON_AddNumberToObject(b, "temperature", 0);
    cJSON_AddBoolToObject(b, "logprobs", 1);
    cJSON_AddNumberToObject(b, "top_logprobs", 2);
    if (stream) {
        cJSON_AddBoolToObject(b, "stream", 1);
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(b, "stream_options"), "include_usage", 1);
    }
    char *t = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    return t;
}

/* usage.prompt_tokens_details.cached_tokens of a whole reply or of a stream's usage chunk. */
static int cached_tokens(const resp *r)
{
    const char *u = strstr(r->body, "\"prompt_tokens_details\"");
    ck_assert_msg(u, "no prompt_tokens_details: %.300s", r->body);
    const char *c = strstr(u, "\"cached_tokens\":");
    ck_assert(c);
    return atoi(c + 16);
}

typedef struct turn {
    char *text, *lps;
    int   cached;
} turn;

/* One greedy turn over msgs on the server at g_port. */
static turn ask_turn(const char *const *msgs, int stream)
{
    char *b = turn_body(msgs, stream), f[16];
    resp r = http("POST", "/v1/chat/completions", KEY, b);
    free(b);
    resp copy = r;                  /* logprob_items cuts the events it reads */
    copy.body = strdup(r.body);
    turn t = {.cached = cached_tokens(&r), .lps = logprob_items(&copy, stream)};
    free(copy.body);
    t.text = stream ? stream_content(&r, f, sizeof f) : whole_content(&r, f, sizeof f);
    resp_free(&r);
    return t;
}

static void turn_free(turn *t)
{
    free(t->text);
    free(t->lps);
}

/* A /metrics value. */
static double metric(const char *name)
{
    resp r = http("GET", "/metrics", KEY, NULL);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(r.body, key);
    ck_assert_msg(p, "no %s in /metrics", name);
    double v = atof(p + strlen(key));
    resp_free(&r);
    return v;
}

START_TEST(test_second_turn_reuses_state)
{
    const char *t1[] = {"system", "You are terse.", "user", "name three rivers", NULL};
    turn a = ask_turn(t1, 0);
    const char *t2[] = {"system", "You are terse.", "user", "name three rivers",
                        "assistant", a.text, "user", "and two lakes", NULL};
    turn warm = ask_turn(t2, 0), warm_s = ask_turn(t2, 1);
    ck_assert_msg(warm.cached > 0, "the second turn reused nothing");
    ck_assert_int_gt(warm_s.cached, 0);
    ck_assert(metric("kl_prompt_tokens_cached_total") >= warm.cached + warm_s.cached);
    ck_assert(metric("kl_prefix_cache_entries") > 0 && metric("kl_prefix_cache_bytes") > 0);
    int main_port = g_port;
    pid_t pid;
    g_port = start_server_cache("4", "64", "0", &pid);
    turn cold = ask_turn(t2, 0), cold_s = ask_turn(t2, 1);
    ck_assert_int_eq(cold.cached, 0);
    ck_assert_int_eq(cold_s.cached, 0);
    ck_assert(metric("kl_prefix_cache_entries") == 0);
    stop_pid(pid);
    g_port = main_port;
    ck_assert_str_eq(warm.text, cold.text);
    ck_assert_str_eq(warm.lps, cold.lps);
    ck_assert_str_eq(warm_s.text, cold.text);
    ck_assert_str_eq(warm_s.lps, cold_s.lps);
    turn_free(&a);
    turn_free(&warm);
    turn_free(&warm_s);
    turn_free(&cold);
    turn_free(&cold_s);
}
END_TEST

typedef struct shared {
    int  k;
    turn got;
} shared;

#define SHARED_SYS "You answer questions about rivers, lakes and seas, briefly and kindly."

static void *shared_main(void *arg)
{
    shared *c = arg;
    char u[64];
    user_of(c->k, u, sizeof u);
    const char *msgs[] = {"system", SHARED_SYS, "user", u, NULL};
    c->got = ask_turn(msgs, c->k % 2);
    return NULL;
}

/* Clients sharing a system prompt at once (one of them seeded it first, so the others start
 * from it) get what each gets alone from a server without the cache. */
START_TEST(test_shared_prefix_concurrent)
{
    enum { N = 4 };
    shared c[N];
    pthread_t th[N];
    c[0] = (shared){.k = 100};
    shared_main(&c[0]);
    for (int k = 1; k < N; k++) {
        c[k] = (shared){.k = 100 + k};
        ck_assert(pthread_create(&th[k], NULL, shared_main, &c[k]) == 0);
    }
    for (int k = 1; k < N; k++)
        pthread_join(th[k], NULL);
    int main_port = g_port;
    pid_t pid;
    g_port = start_server_cache("4", "64", "0", &pid);
    for (int k = 0; k < N; k++) {
        shared alone = {.k = 100 + k};
        shared_main(&alone);
        ck_assert_msg(!strcmp(c[k].got.text, alone.got.text) &&
                      !strcmp(c[k].got.lps, alone.got.lps),
                      "client %d: '%s' with the cache, '%s' without", k, c[k].got.text,
                      alone.got.text);
        turn_free(&c[k].got);
        turn_free(&alone.got);
    }
    stop_pid(pid);
    g_port = main_port;
}
END_TEST

int main(void)
{
    Suite *s = suite_create("serve");
    TCase *tc = tcase_create("http");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_models_health_metrics);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_chat_equals_run);
    tcase_add_test(tc, test_completions_equal_run);
    tcase_add_test(tc, test_stop_strings);
    tcase_add_test(tc, test_logprobs);
    tcase_add_test(tc, test_tool_choice_is_enforced);
    tcase_add_test(tc, test_required_call_is_well_formed);
    tcase_add_test(tc, test_stop_across_tokens);
    tcase_add_test(tc, test_slow_clients);
    tcase_add_test(tc, test_completion_logprobs);
    tcase_add_test(tc, test_seed_and_min_p);
    tcase_add_test(tc, test_usage_only_when_asked);
    tcase_add_test(tc, test_disconnect_frees_slot);
    tcase_add_test(tc, test_queue_full);
    tcase_add_test(tc, test_queued_stream_waits);
    tcase_add_test(tc, test_stopping_answers_503);
    tcase_add_test(tc, test_concurrent_equal_alone);
    tcase_add_test(tc, test_second_turn_reuses_state);
    tcase_add_test(tc, test_shared_prefix_concurrent);
    suite_add_tcase(s, tc);
    return t_run_suite(s);
}
