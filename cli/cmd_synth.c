/*
 * cli/cmd_synth.c — `kl synth`: write a synthetic checkpoint (synth/synth.h).
 *
 * OUT must be new or an empty directory: synth never mixes its files with existing ones
 * (a non-empty OUT is refused with exit 2), and its parent must exist (synth creates OUT, not
 * its parents).  Progress goes to stderr only when stderr is a
 * terminal (and not with -q); the summary (or one JSON object with --json) goes to stdout.
 */
#include "cli/cli.h"
#include "cli/outplan.h"
#include "cli/progress.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/fs.h"
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

static const char synopsis[] =
    "usage: kl synth OUT [--preset tiny|small|full] [--layers N] [--format bf16|mxfp4]\n"
    "                    [--seed S] [--shard-size BYTES] [--sparse] [--threads N] [--buffered]\n"
    "                    [--dry-run] [--json] [-q]\n";

static const char about[] =
    "Writes a random Kimi-Linear checkpoint (config.json, index, shards, tokenizer) into OUT,\n"
    "which must not exist or be empty; its parent directory must exist.  Deterministic for a\n"
    "seed and independent of --threads.  The output must fit the free space of OUT's file\n"
    "system; that is checked before anything is written.\n";

static const char *const presets[] = {"tiny", "small", "full"};

typedef struct synth_args {
    int preset, format, sparse, buffered, dry_run, json, quiet;
    unsigned long long layers, seed, shard_bytes, threads;
} synth_args;

/* Parses argv into o: KL_ARGS_RUN or the exit status. */
static int parse_args(int argc, char **argv, kl_synth_opts *o, int *json, int *quiet)
{
    synth_args a;
    memset(&a, 0, sizeof a);
    const kl_opt opts[] = {
        KL_VALUE("--preset", 0, KL_OPT_CHOICE, &a.preset, "P",
                 "tiny (default; 4 layers, hidden 64), small (8 layers, real head\n"
                 "geometry) or full (Kimi-Linear-48B-A3B, 98 GB in BF16)",
                 .choices = "tiny|small|full"),
        KL_VALUE("--layers", 0, KL_OPT_U64, &a.layers, "N",
                 "layer count (3:1 KDA:MLA, MLA at every 4th and the last layer)", .lo = 1,
                 .hi = KL_MAX_LAYERS),
        KL_VALUE("--format", 0, KL_OPT_CHOICE, &a.format, "F",
                 "bf16 (default) or mxfp4 (routed experts in compressed-tensors\n"
                 "mxfp4-pack-quantized, each layer's experts one contiguous region)",
                 .choices = "bf16|mxfp4"),
        KL_VALUE("--seed", 0, KL_OPT_U64, &a.seed, "S", "random seed (default 0)"),
        KL_VALUE("--shard-size", 0, KL_OPT_BYTES, &a.shard_bytes, "B",
                 "shard size such as 5G or 512M (default: 256K tiny, 4M small, 5e9 full);\n"
                 "a soft limit: a shard exceeds it when one tensor or one layer's\n"
                 "experts do",
                 .lo = 1),
        KL_FLAG("--sparse", 0, &a.sparse,
                "write headers, index and config; leave tensor payloads as holes"),
        KL_VALUE("--threads", 0, KL_OPT_U64, &a.threads, "N",
                 "generator threads (default: all CPUs)", .lo = 1, .hi = 1024),
        KL_FLAG("--buffered", 0, &a.buffered, "write through the page cache instead of O_DIRECT"),
        KL_FLAG("--dry-run", 0, &a.dry_run,
                "print the plan (shards, their file sizes, total, free space) and\n"
                "write nothing"),
        KL_FLAG("--json", 0, &a.json, "print one JSON object instead of the text summary"),
        KL_FLAG(NULL, 'q', &a.quiet, "errors only on stderr"),
        {0}};
    const kl_cmd_spec spec = {.name = "synth", .synopsis = synopsis, .about = about,
                              .opts = opts, .min_pos = 1, .max_pos = 1, .pos_name = "OUT"};
    int rc = kl_args_parse_into(&spec, argc, argv, &o->out_dir, 1);
    if (rc != KL_ARGS_RUN)
        return rc;
    o->preset = presets[a.preset];
    o->format = a.format ? KL_SYNTH_MXFP4 : KL_SYNTH_BF16;
    o->layers = (uint32_t)a.layers;
    o->seed = a.seed;
    o->shard_bytes = a.shard_bytes;
    o->threads = (unsigned)a.threads;
    o->sparse = a.sparse;
    o->buffered = a.buffered;
    o->dry_run = a.dry_run;
    *json = a.json;
    *quiet = a.quiet;
    return KL_ARGS_RUN;
}

static int draw_progress(void *ctx, uint64_t done, uint64_t total)
{
    kl_progress_show(ctx, done, total);
    return 0;
}

/* 0 if the parent directory of path (which does not exist) exists; else the exit status
 * (message given): synth creates OUT, never its missing parents. */
static int refuse_no_parent(const char *path)
{
    char parent[4096] = "", msg[9000];
    struct stat st;
    if (!kl_path_parent(parent, sizeof parent, path, NULL) && stat(parent, &st) == 0 &&
        S_ISDIR(st.st_mode))
        return 0;
    snprintf(msg, sizeof msg,
             "the parent directory %s of %s does not exist; synth creates %s but not its parents",
             parent, path, path);
    return kl_cli_fail(KL_EXIT_USAGE, "usage", msg, NULL);
}

/* 0 if path does not exist (its parent does) or is an empty directory; else the exit status
 * (message given). */
static int refuse_out(const char *path)
{
    char msg[4400];
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return refuse_no_parent(path);
        snprintf(msg, sizeof msg, "%s: %s", path, strerror(errno));
        return kl_cli_fail(KL_EXIT_USAGE, "io", msg, NULL);
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(msg, sizeof msg, "%s exists and is not a directory", path);
        return kl_cli_fail(KL_EXIT_USAGE, "usage", msg, NULL);
    }
    DIR *d = opendir(path);
    if (!d) {
        snprintf(msg, sizeof msg, "%s: %s", path, strerror(errno));
        return kl_cli_fail(KL_EXIT_USAGE, "io", msg, NULL);
    }
    struct dirent *de;
    int busy = 0;
    while (!busy && (de = readdir(d)))
        busy = strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    if (!busy)
        return 0;
    snprintf(msg, sizeof msg,
             "%s is not empty; synth writes only into a new or empty directory", path);
    return kl_cli_fail(KL_EXIT_USAGE, "usage", msg, NULL);
}

/* plan: the dry run's plan, or NULL. */
static int print_json(const kl_synth_opts *o, const kl_synth_result *r, const kl_out_plan *plan,
                      const kl_err *err, int rc)
{
    cJSON *j = kl_cli_json_head(rc == 0);
    cJSON_AddStringToObject(j, "out", o->out_dir);
    cJSON_AddStringToObject(j, "preset", o->preset);
    cJSON_AddStringToObject(j, "format", o->format == KL_SYNTH_MXFP4 ? "mxfp4" : "bf16");
    cJSON_AddBoolToObject(j, "sparse", o->sparse != 0);
    if (rc == 0 && plan) {
        kl_cli_plan_json(j, plan);
    } else if (rc == 0) {
        cJSON_AddNumberToObject(j, "tensors", (double)r->n_tensors);
        cJSON_AddNumberToObject(j, "shards", (double)r->n_shards);
        cJSON_AddNumberToObject(j, "total_bytes", (double)r->tensor_bytes);
        cJSON_AddNumberToObject(j, "file_bytes", (double)r->file_bytes);
        cJSON_AddNumberToObject(j, "elapsed_s", r->elapsed_s);
        cJSON_AddNumberToObject(
            j, "write_gbps", r->elapsed_s > 0 ? (double)r->tensor_bytes / r->elapsed_s / 1e9 : 0);
    } else {
        char msg[1200];
        kl_cli_json_add_error(j, kl_err_code_name(rc), kl_err_format(err, msg, sizeof msg), err);
    }
    return kl_cli_print_json(j);
}

int cmd_synth(int argc, char **argv)
{
    kl_synth_opts o;
    memset(&o, 0, sizeof o);
    int json = 0, quiet = 0;
    int prc = parse_args(argc, argv, &o, &json, &quiet);
    if (prc != KL_ARGS_RUN)
        return prc;
    kl_log_set_level(quiet ? KL_LOG_ERROR : KL_LOG_WARN);
    if ((prc = refuse_out(o.out_dir)) != 0)
        return prc;

    kl_progress ps;
    kl_progress_init(&ps, "synth", quiet);
    if (ps.on) {
        o.progress = draw_progress;
        o.progress_ctx = &ps;
    }
    kl_synth_result res;
    memset(&res, 0, sizeof res);
    o.result = &res;
    kl_out_plan plan;
    memset(&plan, 0, sizeof plan);
    o.plan = &plan;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_synth_write(&o, &err);
    kl_progress_end(&ps);
    if (rc) {
        char msg[1200];
        fprintf(stderr, "kl synth: %s\n", kl_err_format(&err, msg, sizeof msg));
    }
    int out = KL_EXIT_OK;
    if (json) {
        out = print_json(&o, &res, o.dry_run ? &plan : NULL, &err, rc);
    } else if (!rc && o.dry_run) {
        printf("synth --dry-run: %s (%s, %s%s)\n", o.out_dir, o.preset,
               o.format == KL_SYNTH_MXFP4 ? "mxfp4" : "bf16", o.sparse ? ", sparse" : "");
        kl_cli_plan_print(&plan);
    } else if (!rc) {
        double gbps = res.elapsed_s > 0 ? (double)res.tensor_bytes / res.elapsed_s / 1e9 : 0;
        printf("synth: %s (%s, %s%s): %zu tensors, %zu shards, %llu bytes (%.2f GB) in %.2f s, "
               "%.2f GB/s\n",
               o.out_dir, o.preset, o.format == KL_SYNTH_MXFP4 ? "mxfp4" : "bf16",
               o.sparse ? ", sparse" : "", res.n_tensors, res.n_shards,
               (unsigned long long)res.tensor_bytes, (double)res.tensor_bytes / 1e9, res.elapsed_s,
               gbps);
    }
    kl_out_plan_free(&plan);
    if (rc)
        return rc == KL_E_BUG ? KL_EXIT_BUG : KL_EXIT_USAGE;
    return out;
}
