/*
 * cli/cmd_chat.c — `kl chat`: interactive multi-turn chat on the CPU engine.
 *
 * Each line of standard input is one user turn (EOF ends the chat).  The whole conversation is
 * rendered with Kimi's chat format and encoded; when the ids extend what the state already
 * holds, only the new ids are fed (prefix reuse, architecture.md "Engine"): first the live
 * state (prompt plus the fed reply ids), else the snapshot taken at the end of the previous
 * prompt, else a reset and a full prefill.  The reply streams to stdout and becomes the
 * assistant turn of the next rendering.  "in: REUSED + NEW" per turn goes to stderr.
 */
#include "cli/cli.h"
#include "cli/genflags.h"
#include "common/utf8.h"

#include "common/err.h"
#include "common/mem.h"
#include "engine/chat.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- usage and arguments ------------------------------------------------------------------ */

static const char chat_usage[] =
    "usage: kl chat MODEL [--system TEXT] [-n N] [--temp T] [--top-p P] [--top-k K]\n"
    "               [--min-p M] [--seed S] [--threads N] [--route-weights unbiased|biased]\n"
    "\n"
    "Interactive chat with the checkpoint in MODEL on the CPU: each line of standard input is a\n"
    "user turn (EOF ends the chat); the reply streams to stdout, ending with a newline.  A turn\n"
    "whose rendered conversation extends the previous one feeds only the new tokens; stderr\n"
    "shows \"in: REUSED + NEW\" tokens per turn.\n"
    "\n"
    "  --system TEXT      a system message before the first turn\n"
    "  -n N               tokens to generate per reply at most (default 512)\n"
    "  --temp T           temperature (default 0 = greedy)\n"
    "  --top-k K          keep the K most likely tokens (default 0 = off)\n"
    "  --top-p P          keep the smallest set of mass >= P (default 1 = off)\n"
    "  --min-p M          keep tokens with p >= M * p_max (default 0 = off)\n"
    "  --seed S           sampling seed (default 0)\n"
    "  --threads N        worker threads (default: online CPUs)\n"
    "  --route-weights W  MoE weights unbiased (default) or biased (HF remote code)\n"
    "  -h, --help         this text\n"
    "\n"
    "Exit status: 0 ok, 1 a broken checkpoint or tokenizer, 2 usage or I/O error, 3 internal "
    "bug.\n";

typedef struct chat_args {
    const char *model;  /* checkpoint directory */
    const char *system; /* --system */
    kl_gen_flags gen;   /* -n, sampling, --threads, --route-weights */
} chat_args;

static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "kl chat: %s%s\n\n%s", what, arg, chat_usage);
    return KL_EXIT_USAGE;
}

/* One option at argv[*i] into a; KL_EXIT_OK or a usage exit. */
static int parse_one(int argc, char **argv, int *i, chat_args *a)
{
    const char *arg = argv[*i], *v = NULL, *why = NULL, *bad = NULL;
    int g;
    if (kl_cli_opt_value(argc, argv, i, "--system", &v)) {
        if (!v)
            return usage_error("--system wants a text", "");
        a->system = v;
    } else if ((g = kl_gen_flag(argc, argv, i, &a->gen, &why, &bad)) != 0) {
        if (g < 0)
            return usage_error(why, bad);
    } else if (arg[0] == '-' && arg[1]) {
        return usage_error("unknown option ", arg);
    } else if (a->model) {
        return usage_error("more than one model directory: ", arg);
    } else {
        a->model = arg;
    }
    return KL_EXIT_OK;
}

/* Parses argv into a; KL_EXIT_OK, or a usage exit (help: -1 after printing it). */
static int parse_args(int argc, char **argv, chat_args *a)
{
    memset(a, 0, sizeof *a);
    a->gen.n_predict = 512;
    a->gen.samp.top_p = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(chat_usage, stdout);
            return -1;
        }
        int rc = parse_one(argc, argv, &i, a);
        if (rc != KL_EXIT_OK)
            return rc;
    }
    if (!a->model)
        return usage_error("no model directory given", "");
    return KL_EXIT_OK;
}

/* ---- the conversation --------------------------------------------------------------------- */

/* A token sequence a state holds (grown by doubling). */
typedef struct id_seq {
    uint32_t *ids; /* [cap] */
    size_t n, cap;
} id_seq;

/* Everything a chat holds; released by chat_free whatever was built. */
typedef struct chat_ctx {
    kl_tokenizer *tok;
    kl_model *m;
    kl_state live;   /* the sequence fed so far */
    kl_state snap;   /* snapshot at the end of the last prompt */
    id_seq live_ids; /* ids held by live */
    id_seq snap_ids; /* ids held by snap */
    kl_sampler samp;
    float *logits;     /* [vocab] fp32 */
    uint32_t *gen;     /* [n_predict] ids of the current reply */
    kl_chat_msg *msgs; /* [cap_msgs] the conversation; contents owned (kl_strdup) */
    size_t n_msgs, cap_msgs;
    char *reply; /* current reply text, reply_len bytes (kl_malloc'd) */
    size_t reply_len, reply_cap;
} chat_ctx;

static void chat_free(chat_ctx *c)
{
    kl_sampler_free(&c->samp);
    kl_state_free(&c->live);
    kl_state_free(&c->snap);
    kl_model_close(c->m);
    kl_tok_close(c->tok);
    kl_free(c->live_ids.ids);
    kl_free(c->snap_ids.ids);
    kl_free(c->logits);
    kl_free(c->gen);
    for (size_t i = 0; i < c->n_msgs; i++)
        kl_free((char *)c->msgs[i].content);
    kl_free(c->msgs);
    kl_free(c->reply);
    memset(c, 0, sizeof *c);
}

/* Makes room for need ids in q. */
static int seq_reserve(id_seq *q, size_t need, kl_err *err)
{
    if (need <= q->cap)
        return 0;
    size_t cap = q->cap ? q->cap : 256;
    while (cap < need)
        cap *= 2;
    uint32_t *p = kl_realloc(q->ids, cap * sizeof *p);
    if (!p)
        return kl_fail(err, KL_E_NOMEM, "a token sequence of %zu ids", need);
    q->ids = p;
    q->cap = cap;
    return 0;
}

static int seq_set(id_seq *q, const uint32_t *ids, size_t n, kl_err *err)
{
    int rc = seq_reserve(q, n, err);
    if (rc)
        return rc;
    if (n)
        memcpy(q->ids, ids, n * sizeof *ids);
    q->n = n;
    return 0;
}

/* 1 if q is a strict prefix of ids[0..n): feeding the rest leaves at least one id. */
static int seq_extends(const id_seq *q, const uint32_t *ids, size_t n)
{
    return q->n > 0 && q->n < n && !memcmp(q->ids, ids, q->n * sizeof *ids);
}

/* Appends a message with a copy of content. */
static int add_msg(chat_ctx *c, const char *role, const char *content, kl_err *err)
{
    if (c->n_msgs == c->cap_msgs) {
        size_t cap = c->cap_msgs ? 2 * c->cap_msgs : 16;
        kl_chat_msg *p = kl_realloc(c->msgs, cap * sizeof *p);
        if (!p)
            return kl_fail(err, KL_E_NOMEM, "a conversation of %zu messages", cap);
        c->msgs = p;
        c->cap_msgs = cap;
    }
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
    if (fwrite(s, 1, n, stdout) != n || fflush(stdout) != 0)
        return kl_fail_sys(err, KL_E_IO, errno, "cannot write standard output");
    if (c->reply_len + n + 1 > c->reply_cap) {
        size_t cap = c->reply_cap ? c->reply_cap : 256;
        while (cap < c->reply_len + n + 1)
            cap *= 2;
        char *p = kl_realloc(c->reply, cap);
        if (!p)
            return kl_fail(err, KL_E_NOMEM, "a reply of %zu bytes", c->reply_len + n);
        c->reply = p;
        c->reply_cap = cap;
    }
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

/* Brings the live state to ids[0..n) feeding as little as possible; *reused = ids kept. */
static int prefill(chat_ctx *c, const uint32_t *ids, size_t n, size_t *reused, kl_err *err)
{
    int rc;
    if (seq_extends(&c->live_ids, ids, n)) {
        *reused = c->live_ids.n;
    } else if (seq_extends(&c->snap_ids, ids, n)) {
        /* the reply was re-encoded differently (or not fed): back to the end of the prompt */
        if ((rc = kl_state_copy(&c->live, &c->snap, err)))
            return rc;
        *reused = c->snap_ids.n;
    } else {
        kl_state_reset(&c->live);
        *reused = 0;
    }
    size_t k = *reused, m = n - k;
    int32_t *x = kl_malloc(m * sizeof *x);
    if (!x)
        return kl_fail(err, KL_E_NOMEM, "a prompt of %zu ids", m);
    for (size_t i = 0; i < m; i++)
        x[i] = (int32_t)ids[k + i];
    rc = kl_forward(c->m, &c->live, x, m, c->logits, err);
    kl_free(x);
    if (rc) {
        /* the state is unspecified after an error: forget both so the next turn starts over */
        c->live_ids.n = c->snap_ids.n = 0;
        return rc;
    }
    /* snapshot at the end of the prompt: recurrent state cannot be rewound */
    if ((rc = seq_set(&c->live_ids, ids, n, err)) ||
        (rc = kl_state_copy(&c->snap, &c->live, err)) || (rc = seq_set(&c->snap_ids, ids, n, err)))
        c->snap_ids.n = 0;
    return rc;
}

/* One user line: render, prefill what is new, generate, record the reply. */
static int turn(chat_ctx *c, const chat_args *a, const char *line, kl_err *err)
{
    int rc;
    char *text = NULL;
    uint32_t *ids = NULL;
    size_t n = 0, reused = 0;
    if ((rc = add_msg(c, "user", line, err)) ||
        (rc = kl_chat_render(c->msgs, c->n_msgs, NULL, 1, &text, err)) ||
        (rc = kl_tok_encode(c->tok, text, strlen(text), &ids, &n, err)))
        goto out;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= c->m->cfg.vocab_size) {
            rc = kl_fail(err, KL_E_USAGE, "token id %u is outside the model's vocabulary (%u)",
                         (unsigned)ids[i], (unsigned)c->m->cfg.vocab_size);
            goto out;
        }
    if ((rc = prefill(c, ids, n, &reused, err)))
        goto out;
    fprintf(stderr, "kl chat: in: %zu + %zu\n", reused, n - reused);
    c->reply_len = 0;
    kl_gen g = {.m = c->m,
                .st = &c->live,
                .samp = &c->samp,
                .tok = c->tok,
                .logits = c->logits,
                .n_predict = (size_t)a->gen.n_predict,
                .ids = c->gen,
                .emit = emit_cb,
                .user = c};
    rc = kl_generate(&g, err);
    /* the live state now also holds the fed reply ids */
    int rc2 = seq_reserve(&c->live_ids, n + g.n_fed, err);
    if (rc || rc2) {
        c->live_ids.n = 0;
        rc = rc ? rc : rc2;
        goto out;
    }
    memcpy(c->live_ids.ids + n, g.ids, g.n_fed * sizeof *g.ids);
    c->live_ids.n = n + g.n_fed;
    if (fputc('\n', stdout) == EOF || fflush(stdout) != 0) {
        rc = kl_fail_sys(err, KL_E_IO, errno, "cannot write standard output");
        goto out;
    }
    rc = add_reply(c, err);
out:
    kl_free(text);
    kl_free(ids);
    return rc;
}

/* Loads the model, then one turn per line of stdin. */
static int chat(const chat_args *a, chat_ctx *c, kl_err *err)
{
    int rc;
    if ((rc = kl_tok_open(a->model, &c->tok, err)))
        return rc;
    kl_model_opts mo = {.threads = a->gen.threads, .route_weights = a->gen.route};
    if ((rc = kl_model_open(&c->m, a->model, &mo, err)))
        return rc;
    uint32_t vocab = c->m->cfg.vocab_size;
    c->logits = kl_calloc(vocab, sizeof *c->logits);
    c->gen = kl_calloc(a->gen.n_predict ? (size_t)a->gen.n_predict : 1, sizeof *c->gen);
    if (!c->logits || !c->gen)
        return kl_fail(err, KL_E_NOMEM, "buffers for a vocabulary of %u", (unsigned)vocab);
    if ((rc = kl_state_init(&c->live, c->m, err)) || (rc = kl_state_init(&c->snap, c->m, err)) ||
        (rc = kl_sampler_init(&c->samp, vocab, &a->gen.samp, err)))
        return rc;
    if (a->system && (rc = add_msg(c, "system", a->system, err)))
        return rc;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    while ((len = getline(&line, &line_cap, stdin)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (len == 0)
            continue;
        if ((rc = turn(c, a, line, err)))
            break;
    }
    if (!rc && ferror(stdin))
        rc = kl_fail_sys(err, KL_E_IO, errno, "cannot read standard input");
    free(line);
    return rc;
}

/* ---- command ------------------------------------------------------------------------------ */

int cmd_chat(int argc, char **argv)
{
    chat_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc < 0)
        return KL_EXIT_OK;
    if (rc != KL_EXIT_OK)
        return rc;
    char model[4096];
    if ((rc = kl_cli_model_dir("chat", a.model, model, sizeof model)))
        return rc;
    a.model = model;
    kl_err err;
    kl_err_clear(&err);
    chat_ctx c;
    memset(&c, 0, sizeof c);
    rc = chat(&a, &c, &err) ? kl_cli_report("chat", &err) : KL_EXIT_OK;
    chat_free(&c);
    return rc;
}
