/*
 * cli/cmd_convert.c — `kl convert SRC DST`: BF16 Kimi-Linear -> MXFP4 routed experts.
 */
#include "cli/cli.h"
#include "cli/outplan.h"
#include "cli/progress.h"

#include "common/jsonout.h"
#include "common/log.h"
#include "common/mem.h"
#include "convert/converter.h"
#include "convert/verify.h"

#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

static const char synopsis[] =
    "usage: kl convert SRC DST [--scale-rule ocp|round|ceil|mse] [--threads N]\n"
    "                  [--max-memory BYTES] [--shard-size BYTES] [--dry-run] [--json] [-q]\n"
    "       kl convert --verify SRC DST [--json] [-q]\n"
    "       kl convert --compare-rules SRC [--sample N] [--threads N] [--json]\n";

static const char about[] =
    "Converts a BF16 Kimi-Linear checkpoint: every routed expert's w1/w2/w3 becomes MXFP4 in the\n"
    "compressed-tensors mxfp4-pack-quantized layout (weight_packed U8 [out, in/2], weight_scale\n"
    "U8 [out, in/32]); every other tensor is copied bit-exact; config.json gains a\n"
    "quantization_config; tokenizer and other files are copied.  SRC is audited first and never\n"
    "written.  DST is built in DST.partial and renamed when complete; after a crash, the same\n"
    "command resumes from the shards already finished (each journaled shard is checked against\n"
    "the source bytes it was made from, and redone if they changed).  A DST.partial that kl did\n"
    "not create is refused, never emptied.  The output must fit the free space of DST's file\n"
    "system; that is checked before anything is written.\n";

static const char footer[] =
    "Exit status: 0 converted, 1 the source was refused (its audit found problems),\n"
    "2 usage or I/O error.\n"
    "Example: kl convert ~/models/Kimi-Linear-48B-A3B-Instruct /data/kimi-linear-mxfp4\n";

typedef struct convert_args {
    int json, quiet, verify, compare, dry_run, rule;
    unsigned long long sample, threads, max_memory, shard_bytes;
} convert_args;

/* Parses argv into a and o (src, dst, rule, sizes): KL_ARGS_RUN or the exit status. */
static int parse_args(int argc, char **argv, convert_args *a, kl_convert_opts *o)
{
    a->sample = 16;
    const kl_opt opts[] = {
        KL_VALUE("--scale-rule", 0, KL_OPT_FN, &a->rule, "R",
                 "ocp (default, the OCP spec's floor rule), mse (least squared error per\n"
                 "block: 3-4% lower error, 2.5x the CPU), round or ceil; every rule\n"
                 "writes standard MXFP4",
                 .fn = kl_cli_parse_scale_rule, .wants = "one of ocp, round, ceil, mse"),
        KL_VALUE("--threads", 0, KL_OPT_U64, &a->threads, "N",
                 "quantizer threads (default: all CPUs)", .lo = 1, .hi = 1024),
        KL_VALUE("--max-memory", 0, KL_OPT_BYTES, &a->max_memory, "B",
                 "memory cap such as 1G (default 2G); buffers are no larger than the\n"
                 "source needs",
                 .lo = 64 << 20,
                 .wants = "a byte count of at least 64M"),
        KL_VALUE("--shard-size", 0, KL_OPT_BYTES, &a->shard_bytes, "B",
                 "output shard size such as 5G (default 5e9 bytes); a soft limit: a\n"
                 "shard exceeds it when one tensor or one layer's experts do",
                 .lo = 1),
        KL_FLAG("--dry-run", 0, &a->dry_run,
                "print the plan (shards, their file sizes, total, free space) and\n"
                "write nothing"),
        KL_FLAG("--verify", 0, &a->verify,
                "re-read SRC and DST: copies must be byte-identical; report the error\n"
                "of every dequantized expert (relative RMSE, max |error|)",
                .group = 1),
        KL_FLAG("--compare-rules", 0, &a->compare,
                "quantize a sample of SRC's experts with every scale rule and report\n"
                "the error of each (--sample N experts, default 16)",
                .group = 1),
        KL_VALUE("--sample", 0, KL_OPT_U64, &a->sample, "N",
                 "experts sampled by --compare-rules (default 16)", .lo = 1, .hi = 100000),
        KL_FLAG("--json", 0, &a->json, "one JSON object on stdout"),
        KL_FLAG(NULL, 'q', &a->quiet, "errors only (no progress line)"),
        {0}};
    const kl_cmd_spec spec = {"convert", synopsis, about, opts, footer, 1, 2, "SRC DST"};
    const char *pos[2];
    int rc = kl_args_parse_into(&spec, argc, argv, pos, 2);
    if (rc != KL_ARGS_RUN)
        return rc;
    o->src = pos[0];
    o->dst = pos[1];
    o->rule = (kl_scale_rule)a->rule;
    o->threads = (unsigned)a->threads;
    o->max_memory = a->max_memory;
    o->shard_bytes = a->shard_bytes;
    o->dry_run = a->dry_run;
    if (a->dry_run && (a->verify || a->compare))
        return kl_cli_usage("--dry-run plans a conversion; --verify and --compare-rules write "
                            "nothing anyway");
    if (a->compare && o->dst)
        return kl_cli_usage("--compare-rules takes one SRC");
    if (!a->compare && !o->dst)
        return kl_cli_usage("missing DST (kl convert SRC DST)");
    if (a->verify || a->compare)
        kl_cli_begin(a->verify ? "convert --verify" : "convert --compare-rules", a->json);
    return KL_ARGS_RUN;
}

static int draw(void *ctx, uint64_t done, uint64_t total)
{
    kl_progress_show(ctx, done, total);
    return 0;
}

static cJSON *stats_json(const kl_quant_stats *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tensors", (double)s->tensors);
    cJSON_AddNumberToObject(o, "mean_rel_rmse", s->mean_rel_rmse);
    cJSON_AddNumberToObject(o, "max_rel_rmse", s->max_rel_rmse);
    cJSON_AddNumberToObject(o, "max_abs_err", s->max_abs_err);
    cJSON_AddStringToObject(o, "worst_tensor", s->worst);
    return o;
}

static int print_result(const kl_convert_opts *o, const kl_convert_result *r, int json)
{
    if (!json) {
        printf("convert: %s -> %s (%s): %zu tensors (%zu quantized), %zu shards (%zu resumed), "
               "read %.2f GB, wrote %.2f GB in %.1f s\n",
               o->src, o->dst, kl_scale_rule_name(o->rule), r->n_tensors, r->n_quantized,
               r->n_shards, r->n_shards_resumed, (double)r->read_bytes / 1e9,
               (double)r->written_bytes / 1e9, r->elapsed_s);
        return KL_EXIT_OK;
    }
    cJSON *j = kl_cli_json_head(1);
    cJSON_AddStringToObject(j, "src", o->src);
    cJSON_AddStringToObject(j, "dst", o->dst);
    cJSON_AddStringToObject(j, "scale_rule", kl_scale_rule_name(o->rule));
    cJSON_AddNumberToObject(j, "tensors", (double)r->n_tensors);
    cJSON_AddNumberToObject(j, "quantized", (double)r->n_quantized);
    cJSON_AddNumberToObject(j, "shards", (double)r->n_shards);
    cJSON_AddNumberToObject(j, "shards_resumed", (double)r->n_shards_resumed);
    kl_json_add_u64(j, "read_bytes", r->read_bytes);
    kl_json_add_u64(j, "written_bytes", r->written_bytes);
    cJSON_AddNumberToObject(j, "elapsed_s", r->elapsed_s);
    cJSON_AddNumberToObject(j, "quantize_s", r->quantize_s);
    cJSON_AddNumberToObject(j, "write_s", r->write_s);
    cJSON_AddNumberToObject(j, "write_wait_s", r->write_wait_s);
    cJSON_AddNumberToObject(j, "commit_s", r->commit_s);
    kl_json_add_u64(j, "peak_counted_bytes", kl_mem_peak());
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        kl_json_add_u64(j, "peak_rss_bytes", (uint64_t)ru.ru_maxrss * 1024);
    return kl_cli_print_json(j);
}

static int print_plan(const kl_convert_opts *o, const kl_out_plan *p, int json)
{
    if (!json) {
        printf("convert --dry-run: %s -> %s\n", o->src, o->dst);
        kl_cli_plan_print(p);
        return KL_EXIT_OK;
    }
    cJSON *j = kl_cli_json_head(1);
    cJSON_AddStringToObject(j, "src", o->src);
    cJSON_AddStringToObject(j, "dst", o->dst);
    kl_cli_plan_json(j, p);
    return kl_cli_print_json(j);
}

static int fail_with(const kl_err *err)
{
    return kl_cli_report_as(err->code == KL_E_IO || err->code == KL_E_USAGE ||
                                    err->code == KL_E_NOMEM
                                ? KL_EXIT_USAGE
                                : KL_EXIT_PROBLEMS,
                            err);
}

/* --verify SRC DST: exit 1 if DST's metadata check finds errors or a copied tensor differs. */
static int run_verify(const char *src, const char *dst, int json, int quiet)
{
    kl_verify_result v;
    kl_err err;
    kl_err_clear(&err);
    kl_progress line;
    kl_progress_init(&line, "verify", quiet || json);
    kl_verify_opts vo = {.src = src, .dst = dst};
    if (line.on) {
        vo.progress = draw;
        vo.progress_ctx = &line;
    }
    int rc = kl_convert_verify(&vo, &v, &err);
    kl_progress_end(&line);
    if (rc)
        return fail_with(&err);
    int ok = v.copies_differing == 0 && v.schema_errors == 0 && v.experts.tensors > 0;
    if (json) {
        cJSON *j = kl_cli_json_head(ok);
        cJSON_AddNumberToObject(j, "schema_errors", (double)v.schema_errors);
        cJSON_AddStringToObject(j, "first_schema_error", v.first_schema_error);
        cJSON_AddNumberToObject(j, "tensors_missing", (double)v.tensors_missing);
        cJSON_AddStringToObject(j, "first_missing", v.first_missing);
        cJSON_AddNumberToObject(j, "tensors_extra", (double)v.tensors_extra);
        cJSON_AddStringToObject(j, "first_extra", v.first_extra);
        cJSON_AddNumberToObject(j, "copies_checked", (double)v.copies_checked);
        cJSON_AddNumberToObject(j, "copies_differing", (double)v.copies_differing);
        cJSON_AddStringToObject(j, "first_differing", v.first_differing);
        cJSON_AddItemToObject(j, "experts", stats_json(&v.experts));
        int rc = kl_cli_print_json(j);
        return rc ? rc : ok ? KL_EXIT_OK : KL_EXIT_PROBLEMS;
    } else {
        if (v.schema_errors)
            printf("verify: DST's metadata check found %zu errors (first: %s)\n",
                   v.schema_errors, v.first_schema_error);
        if (v.tensors_missing)
            printf("verify: %zu tensors of the schema missing from DST (first: %s)\n",
                   v.tensors_missing, v.first_missing);
        if (v.tensors_extra)
            printf("verify: %zu tensors in DST that the schema does not have (first: %s)\n",
                   v.tensors_extra, v.first_extra);
        printf("verify: %zu copied tensors checked, %zu differ%s%s\n", v.copies_checked,
               v.copies_differing, v.copies_differing ? " (first: " : "",
               v.copies_differing ? v.first_differing : "");
        if (v.copies_differing)
            printf(")\n");
        printf("verify: %zu quantized experts: relative RMSE mean %.4f, max %.4f (%s), "
               "max |error| %.4g\n",
               v.experts.tensors, v.experts.mean_rel_rmse, v.experts.max_rel_rmse, v.experts.worst,
               v.experts.max_abs_err);
    }
    return ok ? KL_EXIT_OK : KL_EXIT_PROBLEMS;
}

/* --compare-rules SRC: the error of every scale rule on a sample of experts. */
static int run_compare(const char *src, unsigned long long sample, unsigned threads, int json)
{
    kl_quant_stats st[KL_SCALE_RULE_COUNT];
    kl_err err;
    kl_err_clear(&err);
    if (kl_convert_compare_rules(src, (size_t)sample, threads, st, &err))
        return fail_with(&err);
    cJSON *j = json ? kl_cli_json_head(1) : NULL;
    cJSON *rules = j ? cJSON_AddObjectToObject(j, "rules") : NULL;
    if (!json)
        printf("%-6s %8s %14s %14s %14s\n", "rule", "tensors", "mean rel RMSE", "max rel RMSE",
               "max |error|");
    for (int r = 0; r < KL_SCALE_RULE_COUNT; r++) {
        if (json)
            cJSON_AddItemToObject(rules, kl_scale_rule_name((kl_scale_rule)r), stats_json(&st[r]));
        else
            printf("%-6s %8zu %14.5f %14.5f %14.4g\n", kl_scale_rule_name((kl_scale_rule)r),
                   st[r].tensors, st[r].mean_rel_rmse, st[r].max_rel_rmse, st[r].max_abs_err);
    }
    return j ? kl_cli_print_json(j) : KL_EXIT_OK;
}

int cmd_convert(int argc, char **argv)
{
    kl_convert_opts o;
    memset(&o, 0, sizeof o);
    convert_args a;
    memset(&a, 0, sizeof a);
    int prc = parse_args(argc, argv, &a, &o);
    if (prc != KL_ARGS_RUN)
        return prc;
    char src[4096];
    if ((prc = kl_cli_model_dir(kl_cli_cmd(), o.src, src, sizeof src)))
        return prc;
    o.src = src;
    int json = a.json, quiet = a.quiet;
    if (a.compare)
        return run_compare(o.src, a.sample, o.threads, json);
    if (a.verify)
        return run_verify(o.src, o.dst, json, quiet);
    kl_log_set_level(quiet ? KL_LOG_ERROR : KL_LOG_WARN);
    kl_progress line;
    kl_progress_init(&line, "convert", quiet || json);
    if (line.on) {
        o.progress = draw;
        o.progress_ctx = &line;
    }
    kl_convert_result res;
    memset(&res, 0, sizeof res);
    o.result = &res;
    kl_out_plan plan;
    memset(&plan, 0, sizeof plan);
    o.plan = o.dry_run ? &plan : NULL;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_convert(&o, &err);
    kl_progress_end(&line);
    if (!rc && o.dry_run) {
        int out = print_plan(&o, &plan, json);
        kl_out_plan_free(&plan);
        return out;
    }
    if (rc)
        return kl_cli_report_as(rc == KL_E_FORMAT || rc == KL_E_SCHEMA || rc == KL_E_UNSUPPORTED
                                    ? KL_EXIT_PROBLEMS
                                    : KL_EXIT_USAGE,
                                &err);
    if (!quiet || json)
        return print_result(&o, &res, json);
    return KL_EXIT_OK;
}
