/*
 * cli/cmd_chat.c — `kl chat`: interactive multi-turn chat on the CPU engine.
 *
 * Each line of standard input is one user turn (EOF, /exit or Ctrl-C at the prompt ends the
 * chat; /reset starts a new conversation).  The whole conversation is rendered with Kimi's chat
 * format and encoded, checked against the model's context, and handed to the engine session
 * (engine/session.h), which feeds only what it does not already hold.  The reply streams to
 * stdout and becomes the assistant turn of the next rendering; Ctrl-C during a turn stops that
 * prompt or reply only.  Per turn, stderr shows "in: REUSED + NEW tokens" and the prefill and
 * decode rates.
 */
#include "cli/cli.h"
#include "cli/genflags.h"
#include "cli/loadmodel.h"
#include "cli/progress.h"
#include "cli/sigint.h"
#include "common/clock.h"
#include "common/grow.h"
#include "common/utf8.h"

#include "common/err.h"
#include "common/mem.h"
#include "engine/chat.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/tokenizer.h"

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- usage and arguments ------------------------------------------------------------------ */

static const char chat_synopsis[] =
    "usage: kl chat MODEL [--system TEXT] [-n N] [--temp T] [--top-p P] [--top-k K]\n"
    "               [--min-p M] [--seed S] [--threads N] [--route-weights unbiased|biased]\n"
    "               [--json] [-q] [--ignore-memory-check] [--device D] [--tp N]\n"
    "               [--expert-parallel]\n";

static const char chat_about[] =
    "Interactive chat with the checkpoint in MODEL on the CPU: each line of standard input is a\n"
    "user turn; the reply streams to stdout, ending with a newline.  \"> \" prompts on stderr\n"
    "when standard input is a terminal.  /exit, EOF, or Ctrl-C at the prompt end the chat;\n"
    "/reset starts a new conversation (the --system message stays); Ctrl-C during a turn stops\n"
    "that prompt or reply only.  A turn whose rendered conversation extends the previous one\n"
    "feeds only the new tokens; stderr shows \"in: REUSED + NEW tokens\", prefill and decode\n"
    "tok/s per turn.  A turn whose prompt plus -n exceeds the model's context is refused with\n"
    "a message (the chat goes on; exit status 2 at the end).\n";

static const char chat_footer[] =
    "Exit status: 0 ok, 1 a broken checkpoint or tokenizer, 2 usage or I/O error, 3 internal "
    "bug.\n";

typedef struct chat_args {
    const char *model;  /* checkpoint directory */
    const char *system; /* --system */
    kl_gen_flags gen;   /* -n, sampling, --threads, --route-weights */
    int json;           /* --json: no streaming, one object with every turn at the end */
} chat_args;

/* Parses argv into a; KL_ARGS_RUN, or the exit status (0 after --help). */
static int parse_args(int argc, char **argv, chat_args *a)
{
    memset(a, 0, sizeof *a);
    a->gen.n_predict = 512;
    a->gen.samp.top_p = 1;
    kl_opt opts[1 + KL_GEN_FLAG_ROWS + 2] = {
        KL_VALUE("--system", 0, KL_OPT_STR, &a->system, "TEXT",
                 "a system message before the first turn"),
    };
    kl_gen_flag_rows(&a->gen, "tokens to generate per reply at most (default 512)", opts + 1);
    opts[1 + KL_GEN_FLAG_ROWS] = (kl_opt)KL_FLAG(
        "--json", 0, &a->json,
        "no streaming: one JSON object at the end with every turn (user, reply,\n"
        "reused and new prompt tokens)");
    const kl_cmd_spec spec = {"chat", chat_synopsis, chat_about, opts, chat_footer, 1, 1,
                              "MODEL"};
    int rc = kl_args_parse_into(&spec, argc, argv, &a->model, 1);
    const char *tp_problem = kl_cli_tp_problem(a->gen.tp, a->gen.expert_parallel, a->gen.device);
    return rc == KL_ARGS_RUN && tp_problem ? kl_cli_usage("%s", tp_problem) : rc;
}

/* ---- the conversation --------------------------------------------------------------------- */

/* Everything a chat holds; released by chat_free whatever was built. */
typedef struct chat_ctx {
    kl_tokenizer *tok;
    kl_model *m;
    kl_session sess; /* the conversation's state: prefix reuse and snapshots */
    kl_sampler samp;
    kl_cli_load load;
    kl_token *gen;     /* [n_predict] ids of the current reply */
    kl_chat_msg *msgs; /* [cap_msgs] the conversation; contents owned (kl_strdup) */
    size_t n_msgs, cap_msgs;
    size_t n_fixed; /* messages kept by /reset (the system message) */
    char *reply;    /* current reply text, reply_len bytes (kl_malloc'd) */
    size_t reply_len, reply_cap;
    int refused; /* a turn was refused (exit status 2 at the end) */
    int json;      /* --json: replies are collected, not streamed */
    cJSON *turns;  /* --json: one {user, reply, reused_tokens, new_tokens} per turn */
} chat_ctx;

static void drop_msgs(chat_ctx *c, size_t keep)
{
    while (c->n_msgs > keep)
        kl_free((char *)c->msgs[--c->n_msgs].content);
}

static void chat_free(chat_ctx *c)
{
    kl_sampler_free(&c->samp);
    kl_session_free(&c->sess);
    kl_model_close(c->m);
    kl_cli_load_release(&c->load);
    kl_tok_close(c->tok);
    kl_free(c->gen);
    drop_msgs(c, 0);
    kl_free(c->msgs);
    kl_free(c->reply);
    cJSON_Delete(c->turns);
    memset(c, 0, sizeof *c);
}

/* Appends a message with a copy of content. */
static int add_msg(chat_ctx *c, const char *role, const char *content, kl_err *err)
{
    if (kl_grow(&c->msgs, &c->cap_msgs, c->n_msgs + 1, sizeof *c->msgs))
        return kl_fail(err, KL_E_NOMEM, "a conversation of %zu messages", c->n_msgs + 1);
    char *s = kl_strdup(content);
    if (!s)
        return kl_fail(err, KL_E_NOMEM, "a message of %zu bytes", strlen(content));
    c->msgs[c->n_msgs++] = (kl_chat_msg){.role = role, .content = s};
    return 0;
}

/* Streams reply bytes to stdout (flushed) and keeps them for the assistant turn. */
static int emit_cb(void *user, const char *s, size_t n, kl_err *err)
{
    chat_ctx *c = user;
    if (!c->json && (fwrite(s, 1, n, stdout) != n || fflush(stdout) != 0))
        return kl_fail_sys(err, KL_E_IO, errno, "cannot write standard output");
    if (kl_grow(&c->reply, &c->reply_cap, c->reply_len + n + 1, 1))
        return kl_fail(err, KL_E_NOMEM, "a reply of %zu bytes", c->reply_len + n);
    memcpy(c->reply + c->reply_len, s, n);
    c->reply_len += n;
    c->reply[c->reply_len] = 0;
    return 0;
}

/* The reply as the assistant turn: bytes that are not valid UTF-8 (a sampled token can end
 * mid-character) become U+FFFD, since the tokenizer only encodes valid UTF-8.  The turn then
 * no longer matches the fed ids and the next prompt resumes from the snapshot instead. */
static int add_reply(chat_ctx *c, kl_err *err)
{
    char *t = kl_utf8_sanitize(c->reply ? c->reply : "", c->reply_len);
    if (!t)
        return kl_fail(err, KL_E_NOMEM, "a reply of %zu bytes", c->reply_len);
    int rc = add_msg(c, "assistant", t, err);
    kl_free(t);
    return rc;
}

/* --json: the turn just done as an entry of c->turns. */
static int add_turn_json(chat_ctx *c, const char *line, size_t reused, size_t fed, kl_err *err)
{
    cJSON *t = cJSON_CreateObject();
    if (!t || !cJSON_AddItemToArray(c->turns, t)) {
        cJSON_Delete(t);
        return kl_fail(err, KL_E_NOMEM, "out of memory collecting the turns");
    }
    cJSON_AddStringToObject(t, "user", line);
    cJSON_AddStringToObject(t, "reply", c->msgs[c->n_msgs - 1].content);
    cJSON_AddNumberToObject(t, "reused_tokens", (double)reused);
    cJSON_AddNumberToObject(t, "new_tokens", (double)fed);
    return 0;
}

static void show_prefill(void *user, size_t done, size_t total)
{
    kl_progress_show_count(user, done, total, "prompt tokens");
}

/* The conversation with the new user line, rendered and encoded into *ids (kl_malloc'd). */
static int encode_turn(chat_ctx *c, kl_token **ids, size_t *n, kl_err *err)
{
    char *text = NULL;
    int rc = kl_chat_render(c->msgs, c->n_msgs, NULL, 1, &text, err);
    if (!rc)
        rc = kl_tok_encode(c->tok, text, strlen(text), ids, n, err);
    kl_free(text);
    return rc;
}

/* Timings of one turn. */
typedef struct turn_stats {
    kl_session_stats feed;
    double prefill_s, decode_s;
    size_t n_prompt, n_out;
} turn_stats;

static double rate(size_t n, double s)
{
    return s > 0 ? (double)n / s : 0.0;
}

static void print_turn(const chat_args *a, const turn_stats *t)
{
    if (a->gen.quiet)
        return;
    fprintf(stderr, "kl chat: in: %zu + %zu tokens (prompt %zu), prefill %.3f s (%.1f tok/s); "
            "out: %zu tokens, %.3f s (%.2f tok/s)\n", t->feed.reused, t->feed.fed, t->n_prompt,
            t->prefill_s, rate(t->feed.fed, t->prefill_s), t->n_out, t->decode_s,
            rate(t->n_out, t->decode_s));
}

/* Prefill of the prompt ids[0..n) with progress; *stopped 1 when Ctrl-C cut it short. */
static int prefill(chat_ctx *c, const chat_args *a, const kl_token *ids, size_t n,
                   turn_stats *t, kl_err *err)
{
    kl_progress p;
    kl_progress_init(&p, "kl chat: prefill", a->gen.quiet);
    kl_session_feed f = {.progress = show_prefill, .user = &p, .cancel = &kl_cli_interrupted};
    double t0 = kl_now_s();
    int rc = kl_session_prompt(&c->sess, ids, n, &f, &t->feed, err);
    t->prefill_s = kl_now_s() - t0;
    kl_progress_end(&p);
    return rc;
}

/* Generates the reply into stdout and c->reply. */
static int reply(chat_ctx *c, const chat_args *a, turn_stats *t, int *cancelled, kl_err *err)
{
    c->reply_len = 0;
    kl_gen g = {.samp = &c->samp,
                .tok = c->tok,
                .n_predict = (size_t)a->gen.n_predict,
                .ids = c->gen,
                .emit = emit_cb,
                .user = c,
                .cancel = &kl_cli_interrupted};
    double t0 = kl_now_s();
    int rc = kl_session_generate(&c->sess, &g, err);
    t->decode_s = kl_now_s() - t0;
    t->n_out = g.n_ids;
    *cancelled = g.cancelled;
    if (rc)
        return rc;
    if (!c->json && (fputc('\n', stdout) == EOF || fflush(stdout) != 0))
        return kl_fail_sys(err, KL_E_IO, errno, "cannot write standard output");
    return add_reply(c, err);
}

/* One user line: render, check the context, prefill what is new, generate, record the reply.
 * A turn over the context is refused (message, no reply) and the chat goes on. */
static int turn(chat_ctx *c, const chat_args *a, const char *line, kl_err *err)
{
    kl_token *ids = NULL;
    turn_stats t = {0};
    int cancelled = 0;
    size_t n_before = c->n_msgs;
    int rc = add_msg(c, "user", line, err);
    if (!rc)
        rc = encode_turn(c, &ids, &t.n_prompt, err);
    if (!rc && (rc = kl_session_check_context(c->m->cfg.max_position, t.n_prompt,
                                              a->gen.n_predict, err)) == KL_E_USAGE) {
        char buf[1024];
        fprintf(stderr, "kl chat: %s\n", kl_err_format(err, buf, sizeof buf));
        kl_err_clear(err);
        c->refused = 1;
        drop_msgs(c, n_before);
        rc = 0;
        goto out;
    }
    if (rc || (rc = prefill(c, a, ids, t.n_prompt, &t, err)))
        goto out;
    if (t.feed.cancelled) {
        drop_msgs(c, n_before);
        fprintf(stderr, "kl chat: prompt interrupted\n");
        goto out;
    }
    rc = reply(c, a, &t, &cancelled, err);
    if (cancelled)
        fprintf(stderr, "kl chat: reply interrupted\n");
    if (!rc && c->json)
        rc = add_turn_json(c, line, t.feed.reused, t.feed.fed, err);
    if (!rc)
        print_turn(a, &t);
out:
    kl_free(ids);
    return rc;
}

/* A command line ("/exit", "/reset"): 1 to end the chat, 0 otherwise. */
static int command(chat_ctx *c, const char *line)
{
    if (!strcmp(line, "/exit"))
        return 1;
    if (!strcmp(line, "/reset")) {
        drop_msgs(c, c->n_fixed);
        kl_session_reset(&c->sess);
        fprintf(stderr, "kl chat: new conversation\n");
    } else {
        fprintf(stderr, "kl chat: unknown command %s (/exit, /reset)\n", line);
    }
    return 0;
}

/* Loads the model, then one turn per line of stdin. */
static int chat(const chat_args *a, chat_ctx *c, kl_err *err)
{
    int rc;
    c->load = (kl_cli_load){.cmd = "chat",
                            .model = a->model,
                            .opts = {.threads = a->gen.threads, .route_weights = a->gen.route,
                                     .tp = (unsigned)a->gen.tp,
                                     .expert_parallel = a->gen.expert_parallel},
                            .quiet = a->gen.quiet,
                            .ignore_memory = a->gen.ignore_memory,
                            .device = a->gen.device};
    if ((rc = kl_cli_plan_model(&c->load, err)) || (rc = kl_tok_open(a->model, &c->tok, err)) ||
        (rc = kl_cli_open_model(&c->load, &c->m, err)))
        return rc;
    uint32_t vocab = c->m->cfg.vocab_size;
    c->gen = kl_calloc(a->gen.n_predict ? (size_t)a->gen.n_predict : 1, sizeof *c->gen);
    if (!c->gen)
        return kl_fail(err, KL_E_NOMEM, "buffers for %llu ids", a->gen.n_predict);
    if ((rc = kl_session_init(&c->sess, c->m, 1, err)) ||
        (rc = kl_sampler_init(&c->samp, vocab, &a->gen.samp, err)))
        return rc;
    kl_sampler_set_pool(&c->samp, c->m->pool);   /* idle between forward passes */
    if (a->system && (rc = add_msg(c, "system", a->system, err)))
        return rc;
    c->n_fixed = c->n_msgs;
    int tty = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    for (;;) {
        /* a Ctrl-C from here until the line is read ends the chat; after, the turn */
        kl_cli_interrupted = 0;
        kl_cli_catch_sigint(0);
        if (tty)
            fputs("> ", stderr);
        len = getline(&line, &line_cap, stdin);
        kl_cli_catch_sigint(1);
        if (len < 0)
            break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (len == 0)
            continue;
        if (line[0] == '/' ? command(c, line) : (rc = turn(c, a, line, err)) != 0)
            break;
    }
    if (!rc && ferror(stdin) && !kl_cli_interrupted)
        rc = kl_fail_sys(err, KL_E_IO, errno, "cannot read standard input");
    if (tty && !rc)
        fputc('\n', stderr);
    free(line);
    return rc;
}

/* ---- command ------------------------------------------------------------------------------ */

int cmd_chat(int argc, char **argv)
{
    chat_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != KL_ARGS_RUN)
        return rc;
    char model[4096];
    if ((rc = kl_cli_model_dir("chat", a.model, model, sizeof model)))
        return rc;
    a.model = model;
    kl_err err;
    kl_err_clear(&err);
    chat_ctx c;
    memset(&c, 0, sizeof c);
    c.json = a.json;
    if (a.json && !(c.turns = cJSON_CreateArray()))
        return kl_cli_fail(KL_EXIT_BUG, "nomem", "out of memory", NULL);
    rc = chat(&a, &c, &err) ? kl_cli_report("chat", &err) : KL_EXIT_OK;
    if (rc == KL_EXIT_OK && c.refused)
        rc = kl_cli_fail(KL_EXIT_USAGE, "usage", "a turn was refused: over the model's context",
                         NULL);
    if (a.json && rc == KL_EXIT_OK) {
        cJSON *root = kl_cli_json_head(1);
        cJSON_AddItemToObject(root, "turns", c.turns);
        c.turns = NULL;
        rc = kl_cli_print_json(root);
    }
    chat_free(&c);
    return rc;
}
