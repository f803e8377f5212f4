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

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- usage and arguments ------------------------------------------------------------------ */

static const char chat_synopsis[] =
    "usage: kl chat MODEL [--system TEXT] [-n N] [--temp T] [--top-p P] [--top-k K]\n"
    "               [--min-p M] [--seed S] [--threads N] [--route-weights unbiased|biased]\n"
    "               [--json]\n";

static const char chat_about[] =
    "Interactive chat with the checkpoint in MODEL on the CPU: each line of standard input is a\n"
    "user turn (EOF ends the chat); the reply streams to stdout, ending with a newline.  A turn\n"
    "whose rendered conversation extends the previous one feeds only the new tokens; stderr\n"
    "shows \"in: REUSED + NEW\" tokens per turn.\n";

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
    return kl_args_parse_into(&spec, argc, argv, &a->model, 1);
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
    int json;      /* --json: replies are collected, not streamed */
    cJSON *turns;  /* --json: one {user, reply, reused_tokens, new_tokens} per turn */
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
    cJSON_Delete(c->turns);
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
    if (!c->json && (fwrite(s, 1, n, stdout) != n || fflush(stdout) != 0))
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
    if (!c->json && (fputc('\n', stdout) == EOF || fflush(stdout) != 0)) {
        rc = kl_fail_sys(err, KL_E_IO, errno, "cannot write standard output");
        goto out;
    }
    if ((rc = add_reply(c, err)) == 0 && c->json)
        rc = add_turn_json(c, line, reused, n - reused, err);
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
    if (a.json && rc == KL_EXIT_OK) {
        cJSON *root = kl_cli_json_head(1);
        cJSON_AddItemToObject(root, "turns", c.turns);
        c.turns = NULL;
        rc = kl_cli_print_json(root);
    }
    chat_free(&c);
    return rc;
}
