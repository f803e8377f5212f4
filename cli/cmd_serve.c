/*
 * cli/cmd_serve.c — `kl serve`: the OpenAI-compatible server (serve/http.h over the engine
 * thread of serve/engine.h).  Loads the model, warms it up, opens the port, prints where it
 * listens, serves until SIGINT or SIGTERM, then stops cleanly: no new requests, in-flight ones
 * finished (cancelled after a grace period), exit 0.
 */
#include "cli/cli.h"
#include "cli/genflags.h"
#include "cli/loadmodel.h"

#include "common/clock.h"
#include "common/err.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "serve/engine.h"
#include "serve/http.h"

#include <cJSON.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define GRACE_S 30.0   /* how long in-flight requests may run on after a stop signal */

static const char serve_synopsis[] =
    "usage: kl serve MODEL [--host 127.0.0.1] [--port 8000] [--device cpu|gpu|auto]\n"
    "                [--api-key KEY] [--max-seqs N] [--max-queue N] [--cache-mb N]\n"
    "                [--ctx N] [--served-model-name NAME] [--keepalive-ms N] [--threads N]\n"
    "                [--tp N] [--expert-parallel] [--json] [-q]\n";

static const char serve_about[] =
    "Serves the checkpoint in MODEL over an OpenAI-compatible HTTP API: POST\n"
    "/v1/chat/completions (streamed or not, Kimi tool calls, logprobs), POST /v1/completions,\n"
    "GET /v1/models, GET /health, GET /metrics (Prometheus).  Requests are batched\n"
    "continuously: up to --max-seqs run at once, --max-queue more wait (beyond that: 429).\n"
    "The model is loaded and warmed up before the port opens; then one line says where it\n"
    "listens (stderr; with --json one object on stdout).  SIGINT or SIGTERM stops it:\n"
    "in-flight requests finish (up to 30 s), exit 0.\n";

static const char serve_footer[] =
    "Exit status: 0 stopped by a signal, 1 a broken checkpoint or tokenizer, 2 usage or I/O\n"
    "error (the port cannot be opened), 3 internal bug.\n";

typedef struct serve_args {
    const char *model, *host, *api_key, *name;
    unsigned long long port, max_seqs, max_queue, ctx, cache_mb, keepalive_ms;
    kl_gen_flags gen;   /* --threads, --route-weights, -q, --ignore-memory-check, --device */
    int json;
} serve_args;

/* The rows of kl_gen_flag_rows that serve takes: from --threads on (the sampling rows are
 * per request here). */
#define GEN_FIRST_LOAD_ROW 6

static int parse_args(int argc, char **argv, serve_args *a)
{
    memset(a, 0, sizeof *a);
    a->host = "127.0.0.1";
    a->port = 8000;
    a->max_seqs = 16;
    a->max_queue = 64;
    a->cache_mb = 2048;
    a->keepalive_ms = 1000;
    kl_opt gen[KL_GEN_FLAG_ROWS];
    kl_gen_flag_rows(&a->gen, "", gen);
    enum { N_OWN = 10, N_GEN = KL_GEN_FLAG_ROWS - GEN_FIRST_LOAD_ROW };
    kl_opt opts[N_OWN + N_GEN + 1] = {
        KL_VALUE("--host", 0, KL_OPT_STR, &a->host, "ADDR",
                 "address to listen on (default 127.0.0.1: this machine only)"),
        KL_VALUE("--port", 0, KL_OPT_U64, &a->port, "PORT",
                 "TCP port (default 8000; 0 = any free port, printed)", .hi = 65535),
        KL_VALUE("--api-key", 0, KL_OPT_STR, &a->api_key, "KEY",
                 "require \"Authorization: Bearer KEY\" on /v1 and /metrics"),
        KL_VALUE("--max-seqs", 0, KL_OPT_U64, &a->max_seqs, "N",
                 "requests generating at once (default 16)", .lo = 1, .hi = 256),
        KL_VALUE("--max-queue", 0, KL_OPT_U64, &a->max_queue, "N",
                 "requests waiting for a slot before 429 (default 64)", .hi = 65536),
        KL_VALUE("--cache-mb", 0, KL_OPT_U64, &a->cache_mb, "N",
                 "prefix cache: state of earlier prompts reused by prompts that extend\n"
                 "them, up to N MiB in the backend's slots beyond --max-seqs (default\n"
                 "2048; 0: off)", .hi = 1u << 24),
        KL_VALUE("--ctx", 0, KL_OPT_TOKENS, &a->ctx, "N",
                 "tokens per sequence, prompt and reply (default: the model's context,\n"
                 "at most 32K)", .lo = 2, .hi = (double)(1u << 30)),
        KL_VALUE("--served-model-name", 0, KL_OPT_STR, &a->name, "NAME",
                 "the model's name in the API (default: MODEL as given)"),
        KL_VALUE("--keepalive-ms", 0, KL_OPT_U64, &a->keepalive_ms, "N",
                 "a streamed reply's keep-alive comment (\": waiting\") after N ms without\n"
                 "tokens, e.g. while it waits in the queue (default 1000)", .lo = 10,
                 .hi = 600000),
        KL_FLAG("--json", 0, &a->json, "print where it listens as one JSON object on stdout"),
    };
    memcpy(opts + N_OWN, gen + GEN_FIRST_LOAD_ROW, N_GEN * sizeof *gen);
    const kl_cmd_spec spec = {"serve", serve_synopsis, serve_about, opts, serve_footer, 1, 1,
                              "MODEL"};
    int rc = kl_args_parse_into(&spec, argc, argv, &a->model, 1);
    if (rc == KL_ARGS_RUN && a->name && !*a->name)
        return kl_cli_usage("--served-model-name wants a name");
    const char *tp_problem = kl_cli_tp_problem(a->gen.tp, a->gen.expert_parallel, a->gen.device);
    return rc == KL_ARGS_RUN && tp_problem ? kl_cli_usage("%s", tp_problem) : rc;
}

/* Everything a server holds; released by serve_free whatever was built. */
typedef struct serve_ctx {
    kl_cli_load   load;
    kl_tokenizer *tok;
    kl_model     *m;
    kl_engine    *e;
    kl_http      *h;
} serve_ctx;

static void serve_free(serve_ctx *c)
{
    kl_http_stop(c->h);
    kl_engine_free(c->e);
    kl_model_close(c->m);
    kl_cli_load_release(&c->load);
    kl_tok_close(c->tok);
}

/* One short request through the engine before the port opens (every path serving uses). */
static int warm_up(kl_engine *e, kl_err *err)
{
    kl_token p[2] = {1, 2};
    kl_job_spec spec = {.prompt = p, .n_prompt = 2, .max_tokens = 2};
    kl_job *j;
    int rc = kl_engine_submit(e, &spec, &j, NULL, err);
    if (rc)
        return rc;
    kl_token ids[4];
    int over = 0;
    kl_job_end end;
    while (!over)
        kl_job_wait(j, ids, NULL, 4, -1, &over, &end);
    kl_job_release(j);
    if (end.why == KL_SCHED_ERROR) {
        if (err)
            *err = end.err;
        return end.err.code ? end.err.code : KL_E_BUG;
    }
    return 0;
}

/* The context: --ctx, else the model's (at most 32K), else 4096. */
static size_t context_of(const serve_args *a, const kl_model *m)
{
    if (a->ctx)
        return (size_t)a->ctx;
    uint64_t c = m->cfg.max_position;
    return !c ? 4096 : c > 32768 ? 32768 : (size_t)c;
}

/* Prints where the server listens: a line on stderr, or the JSON object. */
static int announce(const serve_args *a, const serve_ctx *c, const kl_http_opts *ho)
{
    char url[300];
    int v6 = strchr(a->host, ':') != NULL;
    snprintf(url, sizeof url, "http://%s%.200s%s:%u", v6 ? "[" : "", a->host, v6 ? "]" : "",
             (unsigned)kl_http_port(c->h));
    if (!a->json) {
        fprintf(stderr, "kl serve: listening on %s (model %s, %s, %llu sequences, context "
                "%zu)\n", url, ho->model_name, c->load.device_used, a->max_seqs, ho->ctx);
        return KL_EXIT_OK;
    }
    cJSON *root = kl_cli_json_head(1);
    cJSON_AddStringToObject(root, "url", url);
    cJSON_AddStringToObject(root, "host", a->host);
    cJSON_AddNumberToObject(root, "port", kl_http_port(c->h));
    cJSON_AddStringToObject(root, "model", ho->model_name);
    cJSON_AddStringToObject(root, "device", c->load.device_used);
    cJSON_AddNumberToObject(root, "max_seqs", (double)a->max_seqs);
    cJSON_AddNumberToObject(root, "ctx", (double)ho->ctx);
    return kl_cli_print_json(root);
}

/* Waits for SIGINT or SIGTERM (blocked in every thread: see serve). */
static void wait_signal(const sigset_t *set)
{
    int sig;
    while (sigwait(set, &sig))
        ;
}

/* After the signal: no new requests, in-flight ones finish (cancelled after GRACE_S). */
static void drain(serve_ctx *c)
{
    kl_http_quiesce(c->h);
    kl_engine_stop_accepting(c->e, 0);
    double t0 = kl_now_s();
    while (kl_engine_active(c->e) && kl_now_s() - t0 < GRACE_S) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kl_engine_stop_accepting(c->e, 1);
}

static int serve(const serve_args *a, serve_ctx *c, kl_err *err)
{
    c->load = (kl_cli_load){.cmd = "serve", .model = a->model,
                            .opts = {.threads = a->gen.threads, .route_weights = a->gen.route,
                                     .tp = (unsigned)a->gen.tp,
                                     .expert_parallel = a->gen.expert_parallel},
                            .quiet = a->gen.quiet, .ignore_memory = a->gen.ignore_memory,
                            .device = a->gen.device};
    int rc;
    if ((rc = kl_cli_plan_model(&c->load, err)) || (rc = kl_tok_open(a->model, &c->tok, err)) ||
        (rc = kl_cli_open_model(&c->load, &c->m, err)))
        return rc;
    /* the engine and connection threads inherit this mask: the signals come to sigwait */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    kl_http_opts ho = {.host = a->host, .port = (uint16_t)a->port, .api_key = a->api_key,
                       .model_name = a->name ? a->name : a->model, .ctx = context_of(a, c->m),
                       .keepalive_ms = (unsigned)a->keepalive_ms};
    if ((rc = kl_engine_start(&c->e, c->m, (uint32_t)a->max_seqs, (size_t)a->max_queue,
                              (size_t)a->cache_mb << 20, err)) ||
        (rc = warm_up(c->e, err)) || (rc = kl_http_start(&c->h, c->e, c->tok, &ho, err)))
        return rc;
    if (announce(a, c, &ho) != KL_EXIT_OK)
        return kl_fail(err, KL_E_IO, "cannot write standard output");
    wait_signal(&set);
    if (!a->gen.quiet)
        fprintf(stderr, "kl serve: stopping\n");
    drain(c);
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    serve_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != KL_ARGS_RUN)
        return rc;
    char model[4096];
    if ((rc = kl_cli_model_dir("serve", a.model, model, sizeof model)))
        return rc;
    const char *given = a.model;
    a.model = model;
    if (!a.name)
        a.name = given;
    kl_err err;
    kl_err_clear(&err);
    serve_ctx c;
    memset(&c, 0, sizeof c);
    rc = serve(&a, &c, &err) ? kl_cli_report("serve", &err) : KL_EXIT_OK;
    serve_free(&c);
    return rc;
}
