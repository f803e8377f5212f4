/*
 * cli/cmd_run.c — `kl run`: one prompt through the CPU engine, then sampled generation or
 * teacher forcing (kimi_ref.py run's steps) with the logits written to a file.
 * Generated text on stdout (flushed per token) or one JSON object; timings on stderr.
 */
#include "cli/cli.h"
#include "cli/genflags.h"
#include "cli/loadmodel.h"
#include "cli/outfile.h"
#include "cli/progress.h"
#include "cli/sigint.h"
#include "common/utf8.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/grow.h"
#include "common/mem.h"
#include "engine/chat.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/tokenizer.h"
#include "loader/locate.h"

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- usage and arguments ------------------------------------------------------------------ */

static const char run_synopsis[] =
    "usage: kl run MODEL (-p TEXT | --chat TEXT | --ids 1,2,3) [-n N] [--temp T] [--top-p P]\n"
    "              [--top-k K] [--min-p M] [--seed S] [--device cpu|gpu|auto] [--threads N]\n"
    "              [--route-weights unbiased|biased] [--json] [-q] [--ignore-memory-check]\n"
    "              [--force-ids 4,5,6 --logits-out FILE] [--tp N [--expert-parallel]]\n";

static const char run_about[] =
    "Feeds a prompt to the checkpoint in MODEL (on the GPU or the CPU: --device) and generates\n"
    "up to N tokens, stopping early at <|im_end|>, [EOS] or [EOT] (the stop id is not printed).\n"
    "Text streams to stdout, timings and tok/s go to stderr.  The prompt plus the tokens to\n"
    "generate must fit in the model's context (model_max_length); the model must fit in the\n"
    "available memory.\n";

static const char run_footer[] =
    "Exit status: 0 ok, 1 a broken checkpoint or tokenizer, 2 usage or I/O error, 3 internal "
    "bug.\n";

typedef struct run_args {
    const char *model;      /* checkpoint directory */
    const char *prompt;     /* -p */
    const char *chat;       /* --chat */
    const char *ids;        /* --ids */
    const char *force_ids;  /* --force-ids */
    const char *logits_out; /* --logits-out */
    kl_gen_flags gen;       /* -n, sampling, --threads, --route-weights */
    int json;
} run_args;

/* Parses argv into a; KL_ARGS_RUN, or the exit status (0 after --help). */
static int parse_args(int argc, char **argv, run_args *a)
{
    memset(a, 0, sizeof *a);
    a->gen.n_predict = 128;
    a->gen.samp.top_p = 1;
    kl_opt opts[6 + KL_GEN_FLAG_ROWS + 3] = {
        KL_VALUE("--prompt", 'p', KL_OPT_STR, &a->prompt, "TEXT",
                 "prompt text, encoded with MODEL's tokenizer (no BOS added)", .group = 1),
        KL_VALUE("--chat", 0, KL_OPT_STR, &a->chat, "TEXT",
                 "one user turn rendered with Kimi's chat format plus the generation\n"
                 "prompt, then encoded",
                 .group = 1),
        KL_VALUE("--ids", 0, KL_OPT_STR, &a->ids, "LIST",
                 "prompt token ids: decimal, separated by commas (\"1,2, 3\"; no empty\n"
                 "items, at least one id)", .group = 1),
    };
    kl_gen_flag_rows(&a->gen, "tokens to generate (default 128; 0 = prompt only)", opts + 3);
    const kl_opt tail[] = {
        KL_FLAG("--json", 0, &a->json, "print one JSON object instead of the text"),
        KL_VALUE("--force-ids", 0, KL_OPT_STR, &a->force_ids, "LIST",
                 "teacher forcing: feed these ids after the prompt instead of sampling\n"
                 "(-n is ignored); needs --logits-out; with --ids the model\n"
                 "directory needs no tokenizer files"),
        KL_VALUE("--logits-out", 0, KL_OPT_STR, &a->logits_out, "FILE",
                 "write float32 little-endian logits, one vocab-sized row per step: after\n"
                 "the prompt, then after each fed token (forced ids: len+1 rows;\n"
                 "generation: one row per sampled token, at least one); written to a\n"
                 "temporary file and renamed when complete; never inside MODEL"),
    };
    memcpy(opts + 3 + KL_GEN_FLAG_ROWS, tail, sizeof tail);
    const kl_cmd_spec spec = {"run", run_synopsis, run_about, opts, run_footer, 1, 1, "MODEL"};
    int rc = kl_args_parse_into(&spec, argc, argv, &a->model, 1);
    if (rc != KL_ARGS_RUN)
        return rc;
    if (!!a->prompt + !!a->chat + !!a->ids != 1)
        return kl_cli_usage("give exactly one of -p, --chat and --ids");
    if (a->force_ids && !a->logits_out)
        return kl_cli_usage("--force-ids needs --logits-out");
    if (a->logits_out && !*a->logits_out)
        return kl_cli_usage("--logits-out wants a file");
    const char *tp_problem = kl_cli_tp_problem(a->gen.tp, a->gen.expert_parallel, a->gen.device);
    if (tp_problem)
        return kl_cli_usage("%s", tp_problem);
    return KL_ARGS_RUN;
}

/* ---- the run ------------------------------------------------------------------------------ */

/* Everything a run holds; released by run_free whatever was built. */
typedef struct run_ctx {
    kl_tokenizer *tok;
    kl_model *m;
    kl_session sess; /* the prompt's state and the logits after its last fed id */
    kl_sampler samp;
    const run_args *args; /* for the generation callbacks */
    kl_cli_load load;     /* plan, memory check, load time */
    kl_token *prompt;     /* [n_prompt] */
    size_t n_prompt;
    kl_token *force; /* [n_force] */
    size_t n_force;
    kl_token *gen; /* [n_predict] generated ids */
    size_t n_gen;
    char *text; /* generated text (kl_malloc'd), text_len bytes */
    size_t text_len, text_cap;
    uint8_t *row;  /* [vocab * 4] little-endian logits row */
    kl_outfile out; /* --logits-out, committed at the end */
    int logits_on;
    uint32_t vocab;
    size_t n_rows; /* logits rows written */
    double prefill_s, decode_s;
    size_t n_decode;         /* tokens fed after the prompt */
    const char *stop_reason; /* "stop", "length" or "forced" */
} run_ctx;

static void run_free(run_ctx *c)
{
    kl_sampler_free(&c->samp);
    kl_session_free(&c->sess);
    kl_model_close(c->m);
    kl_cli_load_release(&c->load);
    kl_tok_close(c->tok);
    kl_free(c->prompt);
    kl_free(c->force);
    kl_free(c->gen);
    kl_free(c->text);
    kl_free(c->row);
    kl_outfile_discard(&c->out);
    memset(c, 0, sizeof *c);
}

/* --ids and --force-ids through the one strict id-list parser. */
static int parse_id_lists(const run_args *a, run_ctx *c, kl_err *err)
{
    if (a->ids && kl_cli_parse_ids(a->ids, INT32_MAX, &c->prompt, &c->n_prompt))
        return kl_fail(err, KL_E_USAGE, "--ids wants comma-separated ids below 2^31, not "
                       "\"%.64s\"", a->ids);
    if (a->force_ids && kl_cli_parse_ids(a->force_ids, INT32_MAX, &c->force, &c->n_force))
        return kl_fail(err, KL_E_USAGE, "--force-ids wants comma-separated ids below 2^31, not "
                       "\"%.64s\"", a->force_ids);
    return 0;
}

/* The prompt ids from -p or --chat (--ids: parse_id_lists). */
static int build_prompt(const run_args *a, run_ctx *c, kl_err *err)
{
    if (a->ids)
        return 0;
    const char *text = a->prompt;
    char *rendered = NULL;
    if (a->chat) {
        kl_chat_msg msg = {.role = "user", .content = a->chat};
        int rc = kl_chat_render(&msg, 1, NULL, 1, &rendered, err);
        if (rc)
            return rc;
        text = rendered;
    }
    int rc = kl_tok_encode(c->tok, text, strlen(text), &c->prompt, &c->n_prompt, err);
    kl_free(rendered);
    return rc;
}

/* Appends bytes to the collected text. */
static int text_append(run_ctx *c, const char *s, size_t n, kl_err *err)
{
    if (kl_grow(&c->text, &c->text_cap, c->text_len + n + 1, 1))
        return kl_fail(err, KL_E_NOMEM, "generated text of %zu bytes", c->text_len + n);
    memcpy(c->text + c->text_len, s, n);
    c->text_len += n;
    c->text[c->text_len] = 0;
    return 0;
}

/* Emits the bytes now safe to print: to stdout (flushed) unless --json, and to c->text. */
static int emit(run_ctx *c, const run_args *a, const char *s, size_t n, kl_err *err)
{
    if (!n)
        return 0;
    if (!a->json && (fwrite(s, 1, n, stdout) != n || fflush(stdout) != 0))
        return kl_fail_sys(err, KL_E_IO, errno, "cannot write standard output");
    return text_append(c, s, n, err);
}

/* Writes the session's logits as one float32 little-endian row when --logits-out is given. */
static int write_row(run_ctx *c, const run_args *a, kl_err *err)
{
    if (!c->logits_on)
        return 0;
    for (uint32_t i = 0; i < c->vocab; i++) {
        uint32_t b;
        memcpy(&b, &c->sess.logits[i], 4);
        for (int k = 0; k < 4; k++)
            c->row[(size_t)i * 4 + (size_t)k] = (uint8_t)(b >> (8 * k));
    }
    size_t n = (size_t)c->vocab * 4;
    if (fwrite(c->row, 1, n, c->out.f) != n) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot write logits row %zu", c->n_rows);
        kl_err_context(err, a->logits_out, NULL, KL_NO_OFFSET, NULL);
        return err ? err->code : KL_E_IO;
    }
    c->n_rows++;
    return 0;
}

/* Feeds one id and writes the logits row after it. */
static int feed_one(run_ctx *c, const run_args *a, kl_token id, kl_err *err)
{
    int rc = kl_session_append(&c->sess, &id, 1, err);
    if (rc)
        return rc;
    c->n_decode++;
    return write_row(c, a, err);
}

static int emit_cb(void *user, const char *s, size_t n, kl_err *err)
{
    run_ctx *c = user;
    return emit(c, c->args, s, n, err);
}

static int fed_cb(void *user, const float *logits, kl_err *err)
{
    run_ctx *c = user;
    c->n_decode++;
    return write_row(c, c->args, err);
}

/* Sampling loop (engine/generate.h): up to n_predict ids, stopping at a stop id. */
static int generate(run_ctx *c, const run_args *a, kl_err *err)
{
    kl_gen g = {.samp = &c->samp,
                .tok = c->tok,
                .n_predict = (size_t)a->gen.n_predict,
                .ids = c->gen,
                .emit = emit_cb,
                .on_fed = fed_cb,
                .keep_logits = c->logits_on,   /* --logits-out writes every fed id's row */
                .user = c,
                .cancel = &kl_cli_interrupted};
    c->args = a;
    int rc = kl_session_generate(&c->sess, &g, err);
    c->n_gen = g.n_ids;
    c->stop_reason = g.stopped ? "stop" : "length";
    return rc;
}

/* Every id of the prompt and the forced ids inside the vocabulary (from the plan: before
 * loading anything). */
static int check_vocab(const run_ctx *c, uint32_t vocab, kl_err *err)
{
    for (size_t i = 0; i < c->n_prompt + c->n_force; i++) {
        kl_token id = i < c->n_prompt ? c->prompt[i] : c->force[i - c->n_prompt];
        if (id >= vocab)
            return kl_fail(err, KL_E_USAGE, "token id %u is outside the model's vocabulary (%u)",
                           (unsigned)id, (unsigned)vocab);
    }
    return 0;
}

/* Everything that can be refused before loading: ids, the output path, memory, the prompt,
 * the vocabulary and the context. */
static int prepare(const run_args *a, run_ctx *c, kl_err *err)
{
    int rc;
    if ((rc = parse_id_lists(a, c, err)))
        return rc;
    if (a->logits_out) {
        if ((rc = kl_outfile_open(&c->out, a->logits_out, a->model, err)))
            return rc;
        c->logits_on = 1;
    }
    c->load = (kl_cli_load){.cmd = "run",
                            .model = a->model,
                            .opts = {.threads = a->gen.threads, .route_weights = a->gen.route,
                                     .tp = (unsigned)a->gen.tp,
                                     .expert_parallel = a->gen.expert_parallel},
                            .quiet = a->gen.quiet,
                            .ignore_memory = a->gen.ignore_memory,
                            .device = a->gen.device};
    if ((rc = kl_cli_plan_model(&c->load, err)))
        return rc;
    /* Teacher forcing from ids never touches text: checkpoints without tokenizer files (as
     * the reference writes them) can still be checked. */
    int need_tokenizer = !(a->ids && a->force_ids);
    if ((need_tokenizer && (rc = kl_tok_open(a->model, &c->tok, err))) ||
        (rc = build_prompt(a, c, err)))
        return rc;
    if (c->n_prompt == 0)
        return kl_fail(err, KL_E_USAGE, "the prompt is empty: nothing to feed the model");
    if ((rc = check_vocab(c, c->load.plan.vocab_size, err)))
        return rc;
    return kl_session_check_context(c->load.plan.max_position, c->n_prompt,
                                    a->force_ids ? c->n_force : a->gen.n_predict, err);
}

static void show_prefill(void *user, size_t done, size_t total)
{
    kl_progress_show_count(user, done, total, "prompt tokens");
}

/* The prompt through the session, with a progress line for long ones. */
static int prefill(run_ctx *c, const run_args *a, kl_err *err)
{
    kl_progress p;
    kl_progress_init(&p, "kl run: prefill", a->gen.quiet);
    kl_session_feed f = {.progress = show_prefill, .user = &p, .cancel = &kl_cli_interrupted};
    double t0 = kl_now_s();
    int rc = kl_session_prompt(&c->sess, c->prompt, c->n_prompt, &f, NULL, err);
    c->prefill_s = kl_now_s() - t0;
    kl_progress_end(&p);
    return rc ? rc : write_row(c, a, err);
}

/* Refuses what it can, loads the model, runs the prompt, then generation or teacher forcing. */
static int run(const run_args *a, run_ctx *c, kl_err *err)
{
    int rc;
    if ((rc = prepare(a, c, err)) || (rc = kl_cli_open_model(&c->load, &c->m, err)))
        return rc;
    c->vocab = c->m->cfg.vocab_size;
    size_t n_gen_cap = a->force_ids ? 1 : (size_t)(a->gen.n_predict ? a->gen.n_predict : 1);
    c->row = kl_calloc(c->vocab, 4);
    c->gen = kl_calloc(n_gen_cap, sizeof *c->gen);
    if (!c->row || !c->gen)
        return kl_fail(err, KL_E_NOMEM, "buffers for a vocabulary of %u", (unsigned)c->vocab);
    /* Ctrl-C stops the prompt or the generation between tokens (no partial logits file) */
    kl_cli_catch_sigint(1);
    if ((rc = kl_session_init(&c->sess, c->m, 0, err)) ||
        (rc = kl_sampler_init(&c->samp, c->vocab, &a->gen.samp, err)) ||
        (rc = prefill(c, a, err)))
        return rc;
    kl_sampler_set_pool(&c->samp, c->m->pool);   /* idle between forward passes */
    /* decode: teacher forcing or sampling */
    double t0 = kl_now_s();
    if (a->force_ids) {
        c->stop_reason = "forced";
        for (size_t i = 0; i < c->n_force && !rc && !kl_cli_interrupted; i++)
            rc = feed_one(c, a, c->force[i], err);
    } else if (!kl_cli_interrupted) {
        rc = generate(c, a, err);
    }
    c->decode_s = kl_now_s() - t0;
    if (!rc && kl_cli_interrupted)
        rc = kl_fail(err, KL_E_USAGE, "interrupted");
    if (rc || !c->logits_on)
        return rc;
    /* the logits file appears only now, complete */
    c->logits_on = 0;
    return kl_outfile_commit(&c->out, err);
}

/* ---- output ------------------------------------------------------------------------------- */

static double rate(size_t n, double s)
{
    return s > 0 ? (double)n / s : 0.0;
}

/* The run as one JSON object; on failure with what was done and the error. */
static int print_json(const run_ctx *c, int ok, const kl_err *err)
{
    cJSON *j = kl_cli_json_head(ok);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)c->n_prompt);
    cJSON_AddNumberToObject(j, "weight_bytes", (double)c->load.plan.weight_bytes);
    cJSON_AddNumberToObject(j, "load_s", c->load.load_s);
    cJSON_AddNumberToObject(j, "load_gbps", c->load.load_gbps);
    cJSON *ids = cJSON_AddArrayToObject(j, "generated_ids");
    for (size_t i = 0; i < c->n_gen; i++)
        cJSON_AddItemToArray(ids, cJSON_CreateNumber((double)c->gen[i]));
    char *text = kl_utf8_sanitize(c->text ? c->text : "", c->text_len);
    cJSON_AddStringToObject(j, "text", text ? text : "");
    kl_free(text);
    cJSON_AddNumberToObject(j, "prefill_s", c->prefill_s);
    cJSON_AddNumberToObject(j, "decode_s", c->decode_s);
    cJSON_AddNumberToObject(j, "decode_tok_s", rate(c->n_decode, c->decode_s));
    if (c->stop_reason)
        cJSON_AddStringToObject(j, "stop_reason", c->stop_reason);
    if (c->logits_on || c->n_rows)
        cJSON_AddNumberToObject(j, "logits_rows", (double)c->n_rows);
    if (!ok) {
        char buf[1024];
        kl_cli_json_add_error(j, kl_err_code_name(err->code), kl_err_format(err, buf, sizeof buf),
                              err);
    }
    return kl_cli_print_json(j);
}

/* ---- command ------------------------------------------------------------------------------ */

int cmd_run(int argc, char **argv)
{
    run_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != KL_ARGS_RUN)
        return rc;
    kl_err err;
    kl_err_clear(&err);
    run_ctx c;
    memset(&c, 0, sizeof c);
    char model[4096]; /* MODEL may be a Hugging Face cache folder or ORG/NAME */
    int lrc = kl_model_dir_resolve(a.model, model, sizeof model, &err);
    a.model = lrc ? a.model : model;
    if (!lrc)
        lrc = run(&a, &c, &err);
    int prc = a.json ? print_json(&c, lrc == 0, &err) : KL_EXIT_OK; /* the object first */
    rc = lrc ? kl_cli_report("run", &err) : prc;
    if (lrc == 0 && !a.gen.quiet) {
        /* a newline first: the streamed text does not end in one */
        fprintf(stderr,
                "%skl run: prompt %zu tokens in %.3f s (%.1f tok/s); %s %zu tokens, decode "
                "%.3f s (%.2f tok/s)\n",
                a.json ? "" : "\n", c.n_prompt, c.prefill_s, rate(c.n_prompt, c.prefill_s),
                a.force_ids ? "forced" : "generated", a.force_ids ? c.n_force : c.n_gen, c.decode_s,
                rate(c.n_decode, c.decode_s));
        if (c.n_rows)
            fprintf(stderr, "kl run: %zu logits rows of %u floats -> %s\n", c.n_rows,
                    (unsigned)c.vocab, a.logits_out);
    }
    run_free(&c);
    return rc;
}
