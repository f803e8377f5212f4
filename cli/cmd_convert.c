/*
 * cli/cmd_convert.c — `kl convert SRC DST`: BF16 Kimi-Linear -> MXFP4 routed experts.
 */
#include "cli/cli.h"
#include "cli/progress.h"

#include "common/jsonout.h"
#include "common/log.h"
#include "common/mem.h"
#include "convert/converter.h"
#include "convert/verify.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

static const char usage_text[] =
    "usage: kl convert SRC DST [--scale-rule ocp|round|ceil|mse] [--threads N]\n"
    "                  [--max-memory BYTES] [--shard-size BYTES] [--json] [-q]\n"
    "       kl convert --verify SRC DST [--json]\n"
    "       kl convert --compare-rules SRC [--sample N] [--threads N] [--json]\n"
    "\n"
    "Converts a BF16 Kimi-Linear checkpoint: every routed expert's w1/w2/w3 becomes MXFP4 in the\n"
    "compressed-tensors mxfp4-pack-quantized layout (weight_packed U8 [out, in/2], weight_scale\n"
    "U8 [out, in/32]); every other tensor is copied bit-exact; config.json gains a\n"
    "quantization_config; tokenizer and other files are copied.  SRC is audited first and never\n"
    "written.  DST is built in DST.partial and renamed when complete; after a crash, the same\n"
    "command resumes from the shards already finished.\n"
    "\n"
    "  --scale-rule R    ocp (default, the OCP spec's floor rule), mse (least squared error per\n"
    "                    block: 3-4%% lower error, 2.5x the CPU), round or ceil; every rule\n"
    "                    writes standard MXFP4\n"
    "  --threads N       quantizer threads (default: all CPUs)\n"
    "  --max-memory B    memory budget such as 1G (default 2G)\n"
    "  --shard-size B    output shard size such as 5G (default 5e9 bytes)\n"
    "  --verify          re-read SRC and DST: copies must be byte-identical; report the error\n"
    "                    of every dequantized expert (relative RMSE, max |error|)\n"
    "  --compare-rules   quantize a sample of SRC's experts with every scale rule and report\n"
    "                    the error of each (--sample N experts, default 16)\n"
    "  --json            one JSON object on stdout\n"
    "  -q                errors only\n"
    "\n"
    "Exit status: 0 converted, 1 the source was refused (its audit found problems),\n"
    "2 usage or I/O error.\n"
    "Example: kl convert ~/models/Kimi-Linear-48B-A3B-Instruct /data/kimi-linear-mxfp4\n";

KL_PRINTF(1, 2)
static int bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kl convert: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n\n%s", usage_text);
    return KL_EXIT_USAGE;
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

static void print_json(cJSON *j)
{
    char *text = cJSON_PrintUnformatted(j);
    if (text)
        puts(text);
    cJSON_free(text);
    cJSON_Delete(j);
}

static cJSON *json_head(const char *command, int ok)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "kl_version", KL_VERSION);
    cJSON_AddStringToObject(j, "command", command);
    cJSON_AddBoolToObject(j, "ok", ok);
    return j;
}

static void print_result(const kl_convert_opts *o, const kl_convert_result *r, int json)
{
    if (!json) {
        printf("convert: %s -> %s (%s): %zu tensors (%zu quantized), %zu shards (%zu resumed), "
               "read %.2f GB, wrote %.2f GB in %.1f s\n",
               o->src, o->dst, kl_scale_rule_name(o->rule), r->n_tensors, r->n_quantized,
               r->n_shards, r->n_shards_resumed, (double)r->read_bytes / 1e9,
               (double)r->written_bytes / 1e9, r->elapsed_s);
        return;
    }
    cJSON *j = json_head("convert", 1);
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
    print_json(j);
}

static int fail_with(const char *what, const kl_err *err)
{
    char msg[1200];
    fprintf(stderr, "kl convert %s: %s\n", what, kl_err_format(err, msg, sizeof msg));
    return err->code == KL_E_IO || err->code == KL_E_USAGE || err->code == KL_E_NOMEM
               ? KL_EXIT_USAGE
               : KL_EXIT_PROBLEMS;
}

/* --verify SRC DST: exit 1 if a copied tensor differs. */
static int run_verify(const char *src, const char *dst, int json)
{
    kl_verify_result v;
    kl_err err;
    kl_err_clear(&err);
    if (kl_convert_verify(src, dst, 0, &v, &err))
        return fail_with("--verify", &err);
    int ok = v.copies_differing == 0 && v.experts.tensors > 0;
    if (json) {
        cJSON *j = json_head("convert --verify", ok);
        cJSON_AddNumberToObject(j, "copies_checked", (double)v.copies_checked);
        cJSON_AddNumberToObject(j, "copies_differing", (double)v.copies_differing);
        cJSON_AddStringToObject(j, "first_differing", v.first_differing);
        cJSON_AddItemToObject(j, "experts", stats_json(&v.experts));
        print_json(j);
    } else {
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
        return fail_with("--compare-rules", &err);
    cJSON *j = json ? json_head("convert --compare-rules", 1) : NULL;
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
    if (j)
        print_json(j);
    return KL_EXIT_OK;
}

int cmd_convert(int argc, char **argv)
{
    kl_convert_opts o;
    memset(&o, 0, sizeof o);
    int json = 0, quiet = 0, verify = 0, compare = 0;
    unsigned long long sample = 16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        unsigned long long v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return KL_EXIT_OK;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "-q")) {
            quiet = 1;
        } else if (!strcmp(a, "--verify")) {
            verify = 1;
        } else if (!strcmp(a, "--compare-rules")) {
            compare = 1;
        } else if (!strcmp(a, "--sample") && i + 1 < argc) {
            if (kl_cli_parse_u64(argv[++i], &sample) || !sample || sample > 100000)
                return bad_usage("--sample wants 1..100000, got '%s'", argv[i]);
        } else if (!strcmp(a, "--scale-rule") && i + 1 < argc) {
            int r = kl_scale_rule_parse(argv[++i]);
            if (r < 0)
                return bad_usage("unknown scale rule '%s' (ocp, round, ceil, mse)", argv[i]);
            o.rule = (kl_scale_rule)r;
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            if (kl_cli_parse_u64(argv[++i], &v) || !v || v > 1024)
                return bad_usage("--threads wants 1..1024, got '%s'", argv[i]);
            o.threads = (unsigned)v;
        } else if (!strcmp(a, "--max-memory") && i + 1 < argc) {
            if (kl_cli_parse_bytes(argv[++i], &v) || v < (64ull << 20))
                return bad_usage("--max-memory wants at least 64M, got '%s'", argv[i]);
            o.max_memory = v;
        } else if (!strcmp(a, "--shard-size") && i + 1 < argc) {
            if (kl_cli_parse_bytes(argv[++i], &v) || !v)
                return bad_usage("--shard-size wants a byte count such as 5G, got '%s'", argv[i]);
            o.shard_bytes = v;
        } else if (a[0] != '-' && !o.src) {
            o.src = a;
        } else if (a[0] != '-' && !o.dst) {
            o.dst = a;
        } else {
            return bad_usage("bad or incomplete argument '%s'", a);
        }
    }
    char src[4096];
    int rrc = o.src ? kl_cli_model_dir("convert", o.src, src, sizeof src) : 0;
    if (rrc)
        return rrc;
    if (o.src)
        o.src = src;
    if (verify && compare)
        return bad_usage("%s", "--verify and --compare-rules are separate runs");
    if (compare) {
        if (!o.src || o.dst)
            return bad_usage("%s", "--compare-rules takes one SRC");
        return run_compare(o.src, sample, o.threads, json);
    }
    if (!o.src || !o.dst)
        return bad_usage("%s", "needs SRC and DST");
    if (verify)
        return run_verify(o.src, o.dst, json);
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
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_convert(&o, &err);
    kl_progress_end(&line);
    if (rc) {
        char msg[1200];
        fprintf(stderr, "kl convert: %s\n", kl_err_format(&err, msg, sizeof msg));
        return rc == KL_E_FORMAT || rc == KL_E_SCHEMA || rc == KL_E_UNSUPPORTED ? KL_EXIT_PROBLEMS
                                                                                : KL_EXIT_USAGE;
    }
    if (!quiet || json)
        print_result(&o, &res, json);
    return KL_EXIT_OK;
}
