/*
 * cli/cmd_audit.c — `kl audit DIR`: check a checkpoint before renting GPUs.
 */
#include "cli/cli.h"

#include "audit/audit.h"
#include "audit/report.h"
#include "cli/progress.h"
#include "common/log.h"
#include "loader/locate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: kl audit MODEL [--json] [--hash [--expect FILE|SNAPSHOT]] [--tp N] [--context N]\n"
    "                [--threads N] [-v] [-q]\n"
    "\n"
    "Checks a checkpoint directory without writing to it: every safetensors header rule, the\n"
    "index against the headers, every tensor against the model schema (missing, unexpected,\n"
    "shape, dtype), total_size, the routed-expert layout per layer, and the memory per GPU.\n"
    "MODEL is a checkpoint directory, a Hugging Face cache folder models--ORG--NAME, or ORG/NAME\n"
    "in the local cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub).\n"
    "\n"
    "  --json          one JSON object on stdout (schema: docs/AUDIT.md)\n"
    "  --hash          SHA-256 of every shard, shards hashed in parallel\n"
    "  --expect F      expected hashes: a sha256sum file (every line must parse, every shard\n"
    "                  needs one hash), or a Hugging Face cache snapshot or repository (blob\n"
    "                  names are the expected SHA-256); implies --hash\n"
    "  --tp N          tensor-parallel size for the memory plan (default 1); must divide the\n"
    "                  heads, experts and MLP widths (an error lists the valid sizes)\n"
    "  --context N     context length in tokens for the memory plan, at most the model's\n"
    "                  maximum; K, M, G are powers of 1024: 128K, 1M (default 131072)\n"
    "  --threads N     hashing threads (default: all CPUs)\n"
    "  -v              also list information findings and every expert region\n"
    "  -q              only the result line (text mode), no progress\n"
    "\n"
    "Exit status: 0 clean, 1 problems found, 2 usage or I/O error.\n"
    "Example: kl audit ~/models/Kimi-Linear-48B-A3B-Instruct --tp 2 --context 1048576\n";

typedef struct audit_args {
    const char *dir;
    int json, verbose, quiet;
    kl_audit_opts opts;
} audit_args;

static int parse_args(int argc, char **argv, audit_args *a)
{
    a->opts.tp = 1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        unsigned long long v;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(usage_text, stdout);
            return 1;
        } else if (!strcmp(s, "--json")) {
            a->json = 1;
        } else if (!strcmp(s, "--hash")) {
            a->opts.hash = true;
        } else if (!strcmp(s, "-v")) {
            a->verbose = 1;
        } else if (!strcmp(s, "-q")) {
            a->quiet = 1;
        } else if (!strcmp(s, "--expect") && i + 1 < argc) {
            a->opts.expect = argv[++i];
            a->opts.hash = true;
        } else if (!strcmp(s, "--tp") && i + 1 < argc && !kl_cli_parse_u64(argv[++i], &v) &&
                   v >= 1 && v <= 4096) {
            a->opts.tp = (unsigned)v;
        } else if (!strcmp(s, "--context") && i + 1 < argc &&
                   !kl_cli_parse_tokens(argv[++i], &v) && v >= 1 && v <= (1ull << 40)) {
            a->opts.context = v;
        } else if (!strcmp(s, "--threads") && i + 1 < argc && !kl_cli_parse_u64(argv[++i], &v) &&
                   v >= 1 && v <= 1024) {
            a->opts.threads = (unsigned)v;
        } else if (s[0] != '-' && !a->dir) {
            a->dir = s;
        } else {
            fprintf(stderr, "kl audit: bad or incomplete argument '%s'\n\n%s", s, usage_text);
            return -1;
        }
    }
    if (!a->dir) {
        fprintf(stderr, "kl audit: missing DIR\n\n%s", usage_text);
        return -1;
    }
    return 0;
}

static int print_json(const kl_audit_report *r)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return KL_EXIT_BUG;
    cJSON_AddStringToObject(root, "kl_version", KL_VERSION);
    cJSON_AddStringToObject(root, "command", "audit");
    cJSON_AddBoolToObject(root, "ok", !kl_audit_has_problems(r));
    int rc = kl_audit_to_json(r, root);
    char *text = rc ? NULL : cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) {
        fprintf(stderr, "kl audit: out of memory rendering JSON\n");
        return KL_EXIT_BUG;
    }
    puts(text);
    cJSON_free(text);
    return 0;
}

static void print_error_json(const kl_err *err, const char *msg)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *e = root ? cJSON_CreateObject() : NULL;
    if (!e) {
        cJSON_Delete(root);
        return;
    }
    cJSON_AddStringToObject(root, "kl_version", KL_VERSION);
    cJSON_AddStringToObject(root, "command", "audit");
    cJSON_AddBoolToObject(root, "ok", 0);
    cJSON_AddStringToObject(e, "code", kl_err_code_name(err->code));
    cJSON_AddStringToObject(e, "file", err->file);
    cJSON_AddStringToObject(e, "rule", err->rule);
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddItemToObject(root, "error", e);
    char *text = cJSON_PrintUnformatted(root);
    if (text)
        puts(text);
    cJSON_free(text);
    cJSON_Delete(root);
}

static void show_progress(void *ctx, uint64_t done, uint64_t total)
{
    kl_progress_show(ctx, done, total);
}

/* MODEL and a snapshot-like --expect go through the Hugging Face cache lookup. */
static int resolve_paths(audit_args *a, char *dir, char *expect, size_t n, kl_err *err)
{
    int rc = kl_model_dir_resolve(a->dir, dir, n, err);
    if (!rc && a->opts.expect && !(rc = kl_model_dir_resolve(a->opts.expect, expect, n, err)))
        a->opts.expect = expect;
    a->dir = dir;
    return rc;
}

static int run_audit(audit_args *a, kl_audit_report *r, kl_err *err)
{
    char dir[4096], expect[4096];
    int rc = resolve_paths(a, dir, expect, sizeof dir, err);
    if (rc)
        return rc;
    kl_progress prog;
    kl_progress_init(&prog, "kl audit: sha256", a->quiet);
    a->opts.progress = show_progress;
    a->opts.progress_ctx = &prog;
    rc = kl_audit_run(r, a->dir, &a->opts, err);
    kl_progress_end(&prog);
    return rc;
}

int cmd_audit(int argc, char **argv)
{
    audit_args a;
    memset(&a, 0, sizeof a);
    int p = parse_args(argc, argv, &a);
    if (p)
        return p > 0 ? KL_EXIT_OK : KL_EXIT_USAGE;
    kl_audit_report r;
    kl_err err;
    kl_err_clear(&err);
    if (run_audit(&a, &r, &err)) {
        char msg[1024];
        kl_err_format(&err, msg, sizeof msg);
        fprintf(stderr, "kl audit: %s\n", msg);
        if (a.json) /* one object on stdout, also when the audit could not run */
            print_error_json(&err, msg);
        return err.code == KL_E_BUG ? KL_EXIT_BUG : KL_EXIT_USAGE;
    }
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
