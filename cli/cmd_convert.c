/*
 * cli/cmd_convert.c — `kl convert SRC DST`: BF16 Kimi-Linear -> MXFP4 routed experts.
 */
#include "cli/cli.h"
#include "cli/progress.h"

#include "common/jsonout.h"
#include "common/log.h"
#include "convert/converter.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char usage_text[] =
    "usage: kl convert SRC DST [--scale-rule ocp|round|ceil|mse] [--threads N]\n"
    "                  [--max-memory BYTES] [--shard-size BYTES] [--json] [-q]\n"
    "\n"
    "Converts a BF16 Kimi-Linear checkpoint: every routed expert's w1/w2/w3 becomes MXFP4 in the\n"
    "compressed-tensors mxfp4-pack-quantized layout (weight_packed U8 [out, in/2], weight_scale\n"
    "U8 [out, in/32]); every other tensor is copied bit-exact; config.json gains a\n"
    "quantization_config; tokenizer and other files are copied.  SRC is audited first and never\n"
    "written.  DST is built in DST.partial and renamed when complete; after a crash, the same\n"
    "command resumes from the shards already finished.\n"
    "\n"
    "  --scale-rule R    ocp (default, the OCP spec's floor rule), round, ceil or mse\n"
    "  --threads N       quantizer threads (default: all CPUs)\n"
    "  --max-memory B    memory budget such as 1G (default 2G)\n"
    "  --shard-size B    output shard size such as 5G (default 5e9 bytes)\n"
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
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "kl_version", KL_VERSION);
    cJSON_AddStringToObject(j, "command", "convert");
    cJSON_AddBoolToObject(j, "ok", 1);
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
    char *text = cJSON_PrintUnformatted(j);
    if (text)
        puts(text);
    cJSON_free(text);
    cJSON_Delete(j);
}

int cmd_convert(int argc, char **argv)
{
    kl_convert_opts o;
    memset(&o, 0, sizeof o);
    int json = 0, quiet = 0;
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
    if (!o.src || !o.dst)
        return bad_usage("%s", "needs SRC and DST");
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
        return rc == KL_E_FORMAT || rc == KL_E_SCHEMA || rc == KL_E_UNSUPPORTED
                   ? KL_EXIT_PROBLEMS
                   : KL_EXIT_USAGE;
    }
    if (!quiet || json)
        print_result(&o, &res, json);
    return KL_EXIT_OK;
}
