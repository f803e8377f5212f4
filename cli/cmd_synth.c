/*
 * cli/cmd_synth.c — `kl synth`: write a synthetic checkpoint (synth/synth.h).
 *
 * OUT must be new or an empty directory: synth never mixes its files with existing ones
 * (a non-empty OUT is refused with exit 2).  Progress goes to stderr only when stderr is a
 * terminal (and not with -q); the summary (or one JSON object with --json) goes to stdout.
 */
#include "cli/cli.h"
#include "cli/progress.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "synth/synth.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: kl synth OUT [--preset tiny|small|full] [--layers N] [--format bf16|mxfp4]\n"
    "                    [--seed S] [--shard-size BYTES] [--sparse] [--threads N] [--buffered]\n"
    "                    [--json] [-q]\n"
    "\n"
    "Writes a random Kimi-Linear checkpoint (config.json, index, shards, tokenizer) into OUT,\n"
    "which must not exist or be empty.  Deterministic for a seed and independent of --threads.\n"
    "\n"
    "  --preset P        tiny (default; 4 layers, hidden 64), small (8 layers, real head\n"
    "                    geometry) or full (Kimi-Linear-48B-A3B, 98 GB in BF16)\n"
    "  --layers N        layer count (3:1 KDA:MLA, MLA at every 4th and the last layer)\n"
    "  --format F        bf16 (default) or mxfp4 (routed experts in compressed-tensors\n"
    "                    mxfp4-pack-quantized, each layer's experts one contiguous region)\n"
    "  --seed S          random seed (default 0)\n"
    "  --shard-size B    shard size such as 5G or 512M (default: 256K tiny, 4M small, 5e9 full)\n"
    "  --sparse          write headers, index and config; leave tensor payloads as holes\n"
    "  --threads N       generator threads (default: all CPUs)\n"
    "  --buffered        write through the page cache instead of O_DIRECT\n"
    "  --json            print one JSON object instead of the text summary\n"
    "  -q                errors only on stderr\n";

static int draw_progress(void *ctx, uint64_t done, uint64_t total)
{
    kl_progress_show(ctx, done, total);
    return 0;
}

/* 0 if path does not exist or is an empty directory; 1 otherwise (message printed). */
static int refuse_out(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        fprintf(stderr, "kl synth: %s: %s\n", path, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kl synth: %s exists and is not a directory\n", path);
        return 1;
    }
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "kl synth: %s: %s\n", path, strerror(errno));
        return 1;
    }
    struct dirent *de;
    int busy = 0;
    while (!busy && (de = readdir(d)))
        busy = strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    if (busy)
        fprintf(stderr,
                "kl synth: %s is not empty; synth writes only into a new or empty "
                "directory\n",
                path);
    return busy;
}

static int bad_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "kl synth: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%.*s(kl synth --help for details)\n",
            (int)(strstr(usage_text, "\n\n") - usage_text + 1), usage_text);
    return KL_EXIT_USAGE;
}

static void print_json(const kl_synth_opts *o, const kl_synth_result *r, const kl_err *err, int rc)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "kl_version", KL_VERSION);
    cJSON_AddStringToObject(j, "command", "synth");
    cJSON_AddBoolToObject(j, "ok", rc == 0);
    cJSON_AddStringToObject(j, "out", o->out_dir);
    cJSON_AddStringToObject(j, "preset", o->preset);
    cJSON_AddStringToObject(j, "format", o->format == KL_SYNTH_MXFP4 ? "mxfp4" : "bf16");
    cJSON_AddBoolToObject(j, "sparse", o->sparse != 0);
    if (rc == 0) {
        cJSON_AddNumberToObject(j, "tensors", (double)r->n_tensors);
        cJSON_AddNumberToObject(j, "shards", (double)r->n_shards);
        cJSON_AddNumberToObject(j, "total_bytes", (double)r->tensor_bytes);
        cJSON_AddNumberToObject(j, "file_bytes", (double)r->file_bytes);
        cJSON_AddNumberToObject(j, "elapsed_s", r->elapsed_s);
        cJSON_AddNumberToObject(
            j, "write_gbps", r->elapsed_s > 0 ? (double)r->tensor_bytes / r->elapsed_s / 1e9 : 0);
    } else {
        char msg[1200];
        cJSON *e = cJSON_AddObjectToObject(j, "error");
        cJSON_AddStringToObject(e, "code", kl_err_code_name(rc));
        cJSON_AddStringToObject(e, "file", err->file);
        cJSON_AddStringToObject(e, "tensor", err->tensor);
        cJSON_AddStringToObject(e, "message", kl_err_format(err, msg, sizeof msg));
    }
    char *s = cJSON_PrintUnformatted(j);
    if (s)
        printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
}

int cmd_synth(int argc, char **argv)
{
    kl_synth_opts o;
    memset(&o, 0, sizeof o);
    o.preset = "tiny";
    int json = 0, quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        unsigned long long v;
        /* options with a value accept "--opt VALUE" and "--opt=VALUE" */
        static const char *const with_value[] = {"--preset", "--layers",     "--format",
                                                 "--seed",   "--shard-size", "--threads"};
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++) {
            size_t len = strlen(with_value[k]);
            if (!strncmp(a, with_value[k], len) && (a[len] == 0 || a[len] == '=')) {
                if (a[len] == '=')
                    val = a + len + 1;
                else if (i + 1 < argc)
                    val = argv[++i];
                else
                    return bad_usage("%s needs a value", a);
                break;
            }
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return KL_EXIT_OK;
        } else if (!strcmp(a, "--sparse")) {
            o.sparse = 1;
        } else if (!strcmp(a, "--buffered")) {
            o.buffered = 1;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "-q")) {
            quiet = 1;
        } else if (!strncmp(a, "--preset", 8) && val) {
            if (strcmp(val, "tiny") && strcmp(val, "small") && strcmp(val, "full"))
                return bad_usage("unknown preset '%s' (tiny, small, full)", val);
            o.preset = val;
        } else if (!strncmp(a, "--layers", 8) && val) {
            if (kl_cli_parse_u64(val, &v) || v < 1 || v > KL_MAX_LAYERS)
                return bad_usage("--layers wants 1..256, got '%s'", val);
            o.layers = (uint32_t)v;
        } else if (!strncmp(a, "--format", 8) && val) {
            if (!strcmp(val, "bf16"))
                o.format = KL_SYNTH_BF16;
            else if (!strcmp(val, "mxfp4"))
                o.format = KL_SYNTH_MXFP4;
            else
                return bad_usage("unknown format '%s' (bf16, mxfp4)", val);
        } else if (!strncmp(a, "--seed", 6) && val) {
            if (kl_cli_parse_u64(val, &v))
                return bad_usage("--seed wants a non-negative integer, got '%s'", val);
            o.seed = v;
        } else if (!strncmp(a, "--shard-size", 12) && val) {
            if (kl_cli_parse_bytes(val, &v) || v == 0)
                return bad_usage("--shard-size wants a byte count such as 5G, got '%s'", val);
            o.shard_bytes = v;
        } else if (!strncmp(a, "--threads", 9) && val) {
            if (kl_cli_parse_u64(val, &v) || v < 1 || v > 1024)
                return bad_usage("--threads wants 1..1024, got '%s'", val);
            o.threads = (unsigned)v;
        } else if (a[0] == '-' && a[1]) {
            return bad_usage("unknown option '%s'", a);
        } else if (!o.out_dir) {
            o.out_dir = a;
        } else {
            return bad_usage("more than one output directory ('%s')", a);
        }
    }
    if (!o.out_dir)
        return bad_usage("%s", "no output directory given");
    kl_log_set_level(quiet ? KL_LOG_ERROR : KL_LOG_WARN);
    if (refuse_out(o.out_dir))
        return KL_EXIT_USAGE;

    kl_progress ps;
    kl_progress_init(&ps, "synth", quiet);
    if (ps.on) {
        o.progress = draw_progress;
        o.progress_ctx = &ps;
    }
    kl_synth_result res;
    memset(&res, 0, sizeof res);
    o.result = &res;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_synth_write(&o, &err);
    kl_progress_end(&ps);
    if (rc) {
        char msg[1200];
        fprintf(stderr, "kl synth: %s\n", kl_err_format(&err, msg, sizeof msg));
    }
    if (json) {
        print_json(&o, &res, &err, rc);
    } else if (!rc) {
        double gbps = res.elapsed_s > 0 ? (double)res.tensor_bytes / res.elapsed_s / 1e9 : 0;
        printf("synth: %s (%s, %s%s): %zu tensors, %zu shards, %llu bytes (%.2f GB) in %.2f s, "
               "%.2f GB/s\n",
               o.out_dir, o.preset, o.format == KL_SYNTH_MXFP4 ? "mxfp4" : "bf16",
               o.sparse ? ", sparse" : "", res.n_tensors, res.n_shards,
               (unsigned long long)res.tensor_bytes, (double)res.tensor_bytes / 1e9, res.elapsed_s,
               gbps);
    }
    if (!rc)
        return KL_EXIT_OK;
    return rc == KL_E_BUG ? KL_EXIT_BUG : KL_EXIT_USAGE;
}
