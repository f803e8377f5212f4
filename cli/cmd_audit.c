/*
 * cli/cmd_audit.c — `kl audit DIR`: check a checkpoint before renting GPUs.
 */
#include "cli/cli.h"

#include "audit/audit.h"
#include "audit/report.h"
#include "cli/genflags.h" /* KL_EP_ROW */
#include "cli/progress.h"
#include "common/log.h"
#include "loader/locate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char synopsis[] =
    "usage: kl audit MODEL [--json] [--hash [--expect FILE|SNAPSHOT]] [--tp N]\n"
    "                [--expert-parallel] [--context N] [--threads N] [-v] [-q]\n";

static const char about[] =
    "Checks a checkpoint directory without writing to it: every safetensors header rule, the\n"
    "index against the headers, every tensor against the model schema (missing, unexpected,\n"
    "shape, dtype), total_size, the routed-expert layout per layer, and the memory per GPU.\n"
    "MODEL is a checkpoint directory, a Hugging Face cache folder models--ORG--NAME, or ORG/NAME\n"
    "in the local cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub).\n";

static const char footer[] =
    "Exit status: 0 clean, 1 problems found, 2 usage or I/O error.\n"
    "Example: kl audit ~/models/Kimi-Linear-48B-A3B-Instruct --tp 2 --context 1048576\n";

typedef struct audit_args {
    int json, verbose, quiet, hash, expert_parallel;
    const char *expect;
    unsigned long long tp, context, threads;
} audit_args;

/* Parses argv into a and o: KL_ARGS_RUN or the exit status. */
static int parse_args(int argc, char **argv, audit_args *a, kl_audit_opts *o, const char **dir)
{
    a->tp = 1;
    const kl_opt opts[] = {
        KL_FLAG("--json", 0, &a->json, "one JSON object on stdout (schema: docs/AUDIT.md)"),
        KL_FLAG("--hash", 0, &a->hash, "SHA-256 of every shard, shards hashed in parallel"),
        KL_VALUE("--expect", 0, KL_OPT_STR, &a->expect, "F",
                 "expected hashes: a sha256sum file (every line must parse, every shard\n"
                 "needs one hash), or a Hugging Face cache snapshot or repository (blob\n"
                 "names are the expected SHA-256); implies --hash"),
        KL_VALUE("--tp", 0, KL_OPT_U64, &a->tp, "N",
                 "tensor-parallel size for the memory plan (default 1); must divide the\n"
                 "heads, experts and MLP widths (an error lists the valid sizes)",
                 .lo = 1, .hi = 4096),
        KL_EP_ROW(&a->expert_parallel),
        KL_VALUE("--context", 0, KL_OPT_TOKENS, &a->context, "N",
                 "context length in tokens for the memory plan, at most the model's\n"
                 "maximum; K, M, G are powers of 1024: 128K, 1M (default 131072)",
                 .lo = 1, .hi = 1099511627776.0),
        KL_VALUE("--threads", 0, KL_OPT_U64, &a->threads, "N",
                 "hashing threads (default: all CPUs)", .lo = 1, .hi = 1024),
        KL_FLAG(NULL, 'v', &a->verbose, "also list information findings and every expert region"),
        KL_FLAG(NULL, 'q', &a->quiet, "only the result line (text mode), no progress"),
        {0}};
    const kl_cmd_spec spec = {"audit", synopsis, about, opts, footer, 1, 1, "MODEL"};
    int rc = kl_args_parse_into(&spec, argc, argv, dir, 1);
    if (rc != KL_ARGS_RUN)
        return rc;
    o->hash = a->hash || a->expect;
    o->expect = a->expect;
    o->tp = (unsigned)a->tp;
    o->expert_parallel = a->expert_parallel;
    o->context = a->context;
    o->threads = (unsigned)a->threads;
    return KL_ARGS_RUN;
}

static int print_json(const kl_audit_report *r)
{
    cJSON *root = kl_cli_json_head(!kl_audit_has_problems(r));
    if (!root || kl_audit_to_json(r, root)) {
        cJSON_Delete(root);
        fprintf(stderr, "kl audit: out of memory rendering JSON\n");
        return KL_EXIT_BUG;
    }
    return kl_cli_print_json(root);
}

static void show_progress(void *ctx, uint64_t done, uint64_t total)
{
    kl_progress_show(ctx, done, total);
}

/* MODEL and a snapshot-like --expect go through the Hugging Face cache lookup. */
static int resolve_paths(const char **dir, kl_audit_opts *o, char *dir_buf, char *expect_buf,
                         size_t n, kl_err *err)
{
    int rc = kl_model_dir_resolve(*dir, dir_buf, n, err);
    if (!rc && o->expect && !(rc = kl_model_dir_resolve(o->expect, expect_buf, n, err)))
        o->expect = expect_buf;
    *dir = dir_buf;
    return rc;
}

static int run_audit(const char *dir, kl_audit_opts *o, int quiet, kl_audit_report *r,
                     kl_err *err)
{
    char dir_buf[4096], expect_buf[4096];
    int rc = resolve_paths(&dir, o, dir_buf, expect_buf, sizeof dir_buf, err);
    if (rc)
        return rc;
    kl_progress prog;
    kl_progress_init(&prog, "kl audit: sha256", quiet);
    o->progress = show_progress;
    o->progress_ctx = &prog;
    rc = kl_audit_run(r, dir, o, err);
    kl_progress_end(&prog);
    return rc;
}

int cmd_audit(int argc, char **argv)
{
    audit_args a;
    memset(&a, 0, sizeof a);
    kl_audit_opts o;
    memset(&o, 0, sizeof o);
    const char *dir = NULL;
    int p = parse_args(argc, argv, &a, &o, &dir);
    if (p != KL_ARGS_RUN)
        return p;
    kl_audit_report r;
    kl_err err;
    kl_err_clear(&err);
    if (run_audit(dir, &o, a.quiet, &r, &err))
        return kl_cli_report_as(err.code == KL_E_BUG ? KL_EXIT_BUG : KL_EXIT_USAGE, &err);
    int rc = 0;
    if (a.json)
        rc = print_json(&r);
    else if (a.quiet)
        printf("%s: %s (%zu problem(s), %zu warning(s))\n", r.dir,
               r.n_errors ? "problems" : "clean", r.n_errors, r.n_warnings);
    else
        kl_audit_print_text(&r, stdout, a.verbose);
    if (!rc)
        rc = kl_audit_has_problems(&r) ? KL_EXIT_PROBLEMS : KL_EXIT_OK;
    kl_audit_report_free(&r);
    return rc;
}
