/*
 * cli/cmd_bench.c — `kl bench`: measured figures, each beside the ceiling it is bound by.
 *
 *   kl bench mxfp4 [--threads N] [--mib N] [--rule R]
 *       BF16 -> MXFP4 quantizer throughput on Gaussian rows (2304 wide, like the experts'
 *       w1/w3 rows), per core and on N cores, against the host memory-read ceiling.
 *   kl bench rules [--rows N]
 *       relative RMSE of every scale rule on several weight distributions.
 *   kl bench decode MODEL [--threads N] [--prompt-tokens N] [--tokens N] [--json]
 *       CPU engine prefill and greedy decode tok/s, the weight bytes a decoded token reads,
 *       and the bandwidth that implies against the host memory-read ceiling.
 * mxfp4 and rules print one JSON object; decode prints text, or one JSON object with --json.
 */
#include "cli/cli.h"
#include "cli/genflags.h"
#include "cli/loadmodel.h"

#include "common/clock.h"
#include "common/cpu.h"
#include "common/membench.h"
#include "common/mem.h"
#include "common/numfmt.h"
#include "common/pool.h"
#include "common/rng.h"
#include "convert/mxfp4.h"
#include "convert/verify.h"
#include "engine/backend.h"
#include "engine/backend_tp.h"
#include "engine/cost.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "loader/reader.h"

#include <math.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: kl bench mxfp4 [--threads N] [--mib N] [--rule ocp|round|ceil|mse] [--json]\n"
    "       kl bench rules [--rows N] [--json]\n"
    "       kl bench decode MODEL [--threads N] [--prompt-tokens N] [--tokens N] [--json]\n"
    "`kl bench NAME --help` for one benchmark's options.\n"
    "\n"
    "Quantizes N MiB (default 512) of random BF16 rows of 2304 values to MXFP4 with one thread\n"
    "and with N threads (default: all CPUs) and prints one JSON object: GB/s of BF16 input per\n"
    "core and in total, and the host memory-read ceiling measured in the same run.\n"
    "`rules` quantizes rows drawn from several weight distributions (Gaussian, Laplace,\n"
    "Student-t with 3 degrees of freedom, Gaussian with 0.1% outliers at 10 sigma) with every\n"
    "scale rule and prints the relative RMSE of each (one JSON object).\n"
    "`decode` loads MODEL, feeds a prompt of N random ids (default 64, fixed seed) in one call,\n"
    "then decodes N greedy tokens (default 32) one at a time (--device: CPU or GPU engine), and\n"
    "reports prefill and decode tok/s, the weight bytes one decoded token reads (non-expert\n"
    "weights, shared experts, the top-k routed experts of each MoE layer, lm_head and one\n"
    "embedding row, from the model's tensors), the bandwidth that implies (bytes x tok/s) and\n"
    "the ceiling measured in the same run (host memory read; on the GPU its device copy rate).\n"
    "Text, or one JSON object with --json.\n"
    "KL_CPU_KERNELS=scalar in the environment measures the scalar kernels.\n";

static const char mxfp4_about[] =
    "Quantizes N MiB (default 512) of random BF16 rows of 2304 values to MXFP4 with one thread\n"
    "and with N threads (default: all CPUs) and prints one JSON object: GB/s of BF16 input per\n"
    "core and in total, and the host memory-read ceiling measured in the same run.\n";

static const char rules_about[] =
    "Quantizes rows drawn from several weight distributions (Gaussian, Laplace, Student-t with\n"
    "3 degrees of freedom, Gaussian with 0.1% outliers at 10 sigma) with every scale rule and\n"
    "prints the relative RMSE of each (one JSON object).\n";

static const char decode_about[] =
    "Loads MODEL, feeds a prompt of N random ids (default 64, fixed seed) in one call, then\n"
    "decodes N greedy tokens (default 32) one at a time on the engine --device picks, and\n"
    "reports prefill and decode tok/s, the weight bytes one decoded token reads (non-expert\n"
    "weights, shared experts, the top-k routed experts of each MoE layer, lm_head and one\n"
    "embedding row, from the model's tensors: kl_cost_token_bytes), the bandwidth that implies\n"
    "(bytes x tok/s) and the ceiling measured in the same run: host memory read on the CPU,\n"
    "the device-to-device copy rate (HBM) on the GPU.  Text, or one JSON object with\n"
    "--json.  The model must fit in the available memory (--ignore-memory-check to load\n"
    "anyway); loading shows progress on a terminal and its time on stderr (-q: errors only).\n"
    "KL_CPU_KERNELS=scalar in the environment measures the scalar kernels.\n";

#define ROW 2304

typedef struct qbench {
    const uint16_t *in;
    uint8_t *packed, *scale;
    size_t rows;
    kl_scale_rule rule;
    int rc;
} qbench;

static void quantize_row(void *ctx, size_t i)
{
    qbench *b = ctx;
    if (kl_mxfp4_quantize_row_bf16(b->in + i * ROW, ROW, b->rule, b->packed + i * ROW / 2,
                                   b->scale + i * ROW / 32, NULL, NULL))
        b->rc = 1;
}

/* Best of three passes over all rows; GB/s of BF16 input. */
static double run(qbench *b, unsigned threads)
{
    kl_pool *pool;
    if (kl_pool_create(&pool, threads, NULL))
        return 0;
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = kl_now_s();
        kl_pool_run(pool, b->rows, quantize_row, b);
        double s = kl_now_s() - t0;
        if (!best || s < best)
            best = s;
    }
    kl_pool_destroy(pool);
    return (double)b->rows * ROW * 2 / best / 1e9;
}

/* One sample of distribution d (0 Gaussian, 1 Laplace, 2 Student-t(3), 3 Gaussian with
 * 0.1% outliers at 10 sigma), unit scale. */
static float draw(kl_rng *r, int d)
{
    float a, b;
    switch (d) {
    case 1: {
        double u = kl_rng_uniform(r) - 0.5;
        return (float)(u < 0 ? log(1 + 2 * u) : -log(1 - 2 * u)) / (float)M_SQRT2;
    }
    case 2: { /* t(3) = Z / sqrt(chi2(3) / 3) */
        float z, c1, c2, c3;
        kl_rng_normal2(r, &z, &c1);
        kl_rng_normal2(r, &c2, &c3);
        return z / sqrtf((c1 * c1 + c2 * c2 + c3 * c3) / 3.0f);
    }
    case 3:
        kl_rng_normal2(r, &a, &b);
        return kl_rng_uniform(r) < 0.001 ? 10.0f * (a < 0 ? -1.0f : 1.0f) : a;
    default: kl_rng_normal2(r, &a, &b); return a;
    }
}

static int bench_rules(int argc, char **argv)
{
    unsigned long long rows = 1024;
    int json = 0;
    const kl_opt opts[] = {
        KL_VALUE("--rows", 0, KL_OPT_U64, &rows, "N", "rows per distribution (default 1024)",
                 .lo = 1, .hi = 1 << 20),
        KL_FLAG("--json", 0, &json, "one JSON object on stdout (the only output)"),
        {0}};
    const kl_cmd_spec spec = {.name = "bench rules",
                              .synopsis = "usage: kl bench rules [--rows N] [--json]\n",
                              .about = rules_about,
                              .opts = opts};
    int prc = kl_args_parse_into(&spec, argc, argv, NULL, 0);
    if (prc != KL_ARGS_RUN)
        return prc;
    static const char *const names[] = {"gaussian", "laplace", "student_t3", "gaussian_outliers"};
    uint16_t *in = kl_malloc((size_t)rows * ROW * sizeof *in);
    if (!in)
        return kl_cli_fail(KL_EXIT_USAGE, "nomem", "out of memory", NULL);
    cJSON *j = kl_cli_json_head(1);
    cJSON_AddNumberToObject(j, "rows", (double)rows);
    cJSON_AddNumberToObject(j, "row_length", ROW);
    cJSON *dists = cJSON_AddObjectToObject(j, "rel_rmse");
    int rc = 0;
    for (int d = 0; d < 4 && !rc; d++) {
        kl_rng r;
        kl_rng_seed(&r, 7, (uint64_t)d);
        for (size_t i = 0; i < rows * ROW; i++)
            in[i] = kl_f32_to_bf16(0.02f * draw(&r, d));
        cJSON *o = cJSON_AddObjectToObject(dists, names[d]);
        for (int rule = 0; rule < KL_SCALE_RULE_COUNT && !rc; rule++) {
            double rel, max_abs;
            rc = kl_quant_error_bf16(in, rows, ROW, (kl_scale_rule)rule, &rel, &max_abs, NULL);
            cJSON_AddNumberToObject(o, kl_scale_rule_name((kl_scale_rule)rule), rel);
        }
    }
    kl_free(in);
    if (rc) {
        cJSON_Delete(j);
        return kl_cli_fail(KL_EXIT_BUG, "bug", "the error measurement failed", NULL);
    }
    return kl_cli_print_json(j);
}

/* ---- bench decode ------------------------------------------------------------------------- */

#define MAX_CONTEXTS 8

typedef struct decode_args {
    const char        *model;
    unsigned long long threads, prompt_tokens, tokens, context, tp;
    int expert_parallel;
    const char        *at;                        /* --decode-at LIST */
    size_t             n_at;
    unsigned long long at_ctx[MAX_CONTEXTS];
    const char        *pf;                        /* --prefill-at LIST */
    size_t             n_pf;
    unsigned long long pf_len[MAX_CONTEXTS];
    const char        *bt;                        /* --batch-at LIST */
    size_t             n_bt;
    unsigned long long bt_seqs[MAX_CONTEXTS];
    int                json, quiet, ignore_memory;
    kl_cli_device      device;
} decode_args;

/* Decode measured at one more context (--decode-at). */
typedef struct decode_at {
    double tok_s;
    double cache_bytes;           /* MLA cache a step reads at that context (all MLA layers) */
} decode_at;

typedef struct decode_result {
    double         prefill_s, decode_s;
    double         ttft_s;        /* process start to the prompt's logits (-1: unknown) */
    uint64_t       peak_rss;      /* host bytes, before the ceilings are measured */
    kl_token_bytes bytes;
    kl_membench_result ceiling;   /* CPU: host memory read */
    kl_gpu_ceilings gpu;          /* GPU: HBM (device copy) and pinned host-to-device */
    int            on_gpu;
    decode_at      at[MAX_CONTEXTS];
    double         pf_tok_s[MAX_CONTEXTS];   /* --prefill-at */
    double         bt_tok_s[MAX_CONTEXTS];   /* --batch-at: output tok/s of all sequences */
    kl_gpu_profile bt_prof[MAX_CONTEXTS];    /* --batch-at: $KL_GPU_PROFILE times */
    kl_gpu_profile prof_prefill, prof_decode;   /* GPU: graph size, $KL_GPU_PROFILE times */
    double         disk_gbps;     /* GPU: raw read of the last shard (O_DIRECT), 0: unknown */
    kl_membench_result host_copy; /* GPU: host memcpy with the load's threads (its fill copies
                                     cached file bytes into pinned buffers) */
} decode_result;

/* The bandwidth the decode rate is bound by: HBM on the GPU, host memory read on the CPU. */
static double ceiling_gbps(const decode_result *r)
{
    return r->on_gpu ? r->gpu.hbm_gbps : r->ceiling.read_gbps;
}

/* The load's seconds after the device's start (context, stream, the ring's buffers) on its
 * critical path: the part the link's rate bounds. */
static double load_after_start_s(const kl_cli_load *l)
{
    const kl_gpu_load_info *g = &l->gpu_load;
    double start = g->overlapped ? g->wait_s : g->device_s + g->buffers_s;
    double s = l->load_s - l->open_s - start;
    return s > 0 ? s : 0;
}

static double load_after_start_gbps(const kl_cli_load *l, uint64_t bytes)
{
    double s = load_after_start_s(l);
    return s > 0 ? (double)bytes / s / 1e9 : 0;
}

/* The most resident memory this process has had, in bytes. */
static uint64_t peak_rss_bytes(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? 0 : (uint64_t)ru.ru_maxrss * 1024;
}

/* ids[0 .. n) random below vocab, from the fixed seed (the same prompt every run). */
static void random_ids(kl_token *ids, size_t n, uint32_t vocab, uint64_t seed)
{
    kl_rng r;
    kl_rng_seed(&r, seed, 0);
    for (size_t i = 0; i < n; i++)
        ids[i] = (kl_token)(kl_rng_next(&r) % vocab);
}

/* Prefill of random ids, then greedy decode steps; timings into res. */
static int time_decode(kl_model *m, const decode_args *a, decode_result *res, kl_err *err)
{
    kl_state st;
    uint32_t V = m->cfg.vocab_size;
    kl_token *ids = kl_malloc((size_t)a->prompt_tokens * sizeof *ids);
    float *logits = kl_malloc((size_t)V * sizeof *logits);
    int rc = !ids || !logits ? kl_fail(err, KL_E_NOMEM, "out of memory for the prompt")
                             : kl_state_init(&st, m, err);
    if (rc) {
        kl_free(ids);
        kl_free(logits);
        return rc;
    }
    random_ids(ids, (size_t)a->prompt_tokens, V, 1);
    /* --context: synthetic positions before the prompt (the step's cost at that length) */
    if (a->context && (rc = kl_state_fill_synthetic(&st, (size_t)a->context, err))) {
        kl_state_free(&st);
        kl_free(ids);
        kl_free(logits);
        return rc;
    }
    double t0 = kl_now_s();
    kl_backend_gpu_profile(m->be, NULL, 1);
    rc = kl_forward(m, &st, ids, (size_t)a->prompt_tokens, logits, err);
    res->prefill_s = kl_now_s() - t0;
    res->ttft_s = kl_process_age_s();
    kl_backend_gpu_profile(m->be, &res->prof_prefill, 1);
    t0 = kl_now_s();
    /* greedy, as kl run decodes: each step's argmax where the backend computed it (the row
       of logits stays there: a greedy step needs only its argmax) */
    kl_token id = kl_sample_argmax(logits, V), next;
    for (size_t i = 0; i < a->tokens && !rc; i++, id = next)
        rc = kl_forward_argmax(m, &st, &id, 1, NULL, &next, err);
    res->decode_s = kl_now_s() - t0;
    kl_backend_gpu_profile(m->be, &res->prof_decode, 1);
    res->peak_rss = peak_rss_bytes();
    kl_state_free(&st);
    kl_free(ids);
    kl_free(logits);
    return rc;
}

static double per_s(double n, double s)
{
    return s > 0 ? n / s : 0;
}

/* Greedy decode tok/s after ctx synthetic positions and one fed token (which also captures
 * the GPU's decode graph for the new cache size). */
static int time_decode_at(kl_model *m, const decode_args *a, size_t ctx, decode_at *out,
                          kl_err *err)
{
    uint32_t V = m->cfg.vocab_size;
    float *logits = kl_malloc((size_t)V * sizeof *logits);
    kl_state st;
    int rc = !logits ? kl_fail(err, KL_E_NOMEM, "out of memory") : kl_state_init(&st, m, err);
    if (rc) {
        kl_free(logits);
        return rc;
    }
    kl_token id = 1;
    rc = kl_state_fill_synthetic(&st, ctx, err);
    if (!rc)
        rc = kl_forward(m, &st, &id, 1, logits, err);
    double t0 = kl_now_s();
    id = kl_sample_argmax(logits, V);
    kl_token next;
    for (size_t i = 0; i < a->tokens && !rc; i++, id = next)
        rc = kl_forward_argmax(m, &st, &id, 1, NULL, &next, err);
    out->tok_s = per_s((double)a->tokens, kl_now_s() - t0);
    out->cache_bytes = (double)(ctx + 1) * (double)kl_config_mla_token_bytes(&m->cfg, 4) *
                       (double)kl_config_count_attn(&m->cfg, KL_ATTN_MLA);
    kl_state_free(&st);
    kl_free(logits);
    return rc;
}

/* Output tok/s of n sequences decoding together (--batch-at): each step one batch of n tokens,
 * one per sequence (as kl serve's scheduler packs them), greedy from their argmax, after a
 * first step that opens them. */
static int time_batch_at(kl_model *m, const decode_args *a, size_t n, double *tok_s,
                         kl_gpu_profile *prof, kl_err *err)
{
    kl_state *st = kl_calloc(n, sizeof *st);
    kl_token *ids = kl_calloc(n, sizeof *ids);
    uint32_t *slot = kl_calloc(n, sizeof *slot);
    uint8_t *want = kl_malloc(n);
    int rc = st && ids && slot && want ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    size_t open = 0;
    for (; !rc && open < n; open++) {
        rc = kl_state_init(&st[open], m, err);
        slot[open] = st[open].slot;
        ids[open] = (kl_token)(1 + open % 100);
    }
    if (want)
        memset(want, 1, n);
    kl_batch b = {.n = n, .ids = ids, .slot = slot, .want = want};
    if (!rc)
        rc = kl_backend_forward(m->be, &b, NULL, ids, err);
    kl_backend_gpu_profile(m->be, NULL, 1);
    double t0 = kl_now_s();
    for (size_t i = 0; i < a->tokens && !rc; i++)
        rc = kl_backend_forward(m->be, &b, NULL, ids, err);
    *tok_s = per_s((double)(a->tokens * n), kl_now_s() - t0);
    kl_backend_gpu_profile(m->be, prof, 1);
    for (size_t i = 0; st && i < open; i++)
        kl_state_free(&st[i]);
    kl_free(st);
    kl_free(ids);
    kl_free(slot);
    kl_free(want);
    return rc;
}

/* Prefill tok/s of n random ids on a fresh state (--prefill-at). */
static int time_prefill_at(kl_model *m, size_t n, double *tok_s, kl_err *err)
{
    uint32_t V = m->cfg.vocab_size;
    kl_token *ids = kl_malloc(n * sizeof *ids);
    kl_state st;
    int rc = !ids ? kl_fail(err, KL_E_NOMEM, "out of memory for %zu ids", n)
                  : kl_state_init(&st, m, err);
    if (rc) {
        kl_free(ids);
        return rc;
    }
    random_ids(ids, n, V, 2);
    double t0 = kl_now_s();
    rc = kl_forward(m, &st, ids, n, NULL, err);
    *tok_s = per_s((double)n, kl_now_s() - t0);
    kl_state_free(&st);
    kl_free(ids);
    return rc;
}

/* The raw read rate of the storage under the checkpoint: up to 1 GiB of its last shard read
 * with O_DIRECT (past the page cache) by the staged reader; 0 where O_DIRECT is refused
 * (tmpfs) or the read fails. */
static double raw_disk_gbps(const kl_model *m)
{
    kl_reader_opts o = {.direct = KL_DIRECT_ON};
    kl_reader *r = NULL;
    kl_err err;
    kl_err_clear(&err);
    double gbps = 0;
    if (!m->n_shards || kl_reader_create(&r, &o, &err))
        return 0;
    int f = kl_reader_add_file(r, m->shard_paths[m->n_shards - 1], &err);
    if (f >= 0) {
        uint64_t size = kl_reader_file_size(r, (uint32_t)f);
        kl_extent e = {(uint32_t)f, 0, size < (1ull << 30) ? size : 1ull << 30};
        double t0 = kl_now_s();
        if (e.len && !kl_reader_run(r, &e, 1, NULL, NULL, &err))
            gbps = per_s((double)e.len / 1e9, kl_now_s() - t0);
    }
    kl_reader_destroy(r);
    return gbps;
}

/* The profile's per-kind milliseconds divided by per (tokens) into a new object of j. */
static void add_profile(cJSON *j, const char *name, const kl_gpu_profile *p, double per)
{
    cJSON *o = cJSON_AddObjectToObject(j, name);
    for (int k = 0; k < KL_GPU_OPS; k++)
        cJSON_AddNumberToObject(o, kl_gpu_op_names[k], per > 0 ? p->op_s[k] * 1e3 / per : 0);
    cJSON *parts = cJSON_AddObjectToObject(o, "parts");
    for (int k = 0; k < KL_GPU_PARTS; k++)
        cJSON_AddNumberToObject(parts, kl_gpu_part_names[k],
                                per > 0 ? p->part_s[k] * 1e3 / per : 0);
}

/* Where the GPU load's time went (engine/backend.h kl_gpu_load_info; open: kl_model_open)
 * and how its ring was set. */
/* Tensor parallel on GPUs: the bytes the load sent to each rank (its GPU's link), and where
 * the ranks' sums run. */
static void add_rank_bytes(cJSON *j, const kl_backend *be)
{
    const unsigned n = kl_backend_tp_size(be);
    if (n)
        cJSON_AddStringToObject(j, "tp_sums", kl_backend_gpu_tp_sums(be));
    cJSON *a = n ? cJSON_AddArrayToObject(j, "load_copied_bytes_per_rank") : NULL;
    for (unsigned r = 0; a && r < n; r++) {
        kl_gpu_load_info li;
        kl_backend_gpu_load_info(kl_backend_tp_rank(be, r), &li);
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)li.bytes));
    }
}

static void add_load_phases(cJSON *j, const kl_cli_load *l)
{
    const kl_gpu_load_info *g = &l->gpu_load;
    cJSON *o = cJSON_AddObjectToObject(j, "load_phases");
    const struct { const char *name; double s; } ph[] = {
        {"open", l->open_s}, {"device_init", g->device_s}, {"host_buffers", g->buffers_s},
        {"wait_device", g->wait_s}, {"plan", g->plan_s}, {"alloc", g->alloc_s},
        {"fill", g->fill_s}, {"pools", g->pools_s}, {"finish", g->finish_s}};
    for (size_t i = 0; i < sizeof ph / sizeof *ph; i++)
        cJSON_AddNumberToObject(o, ph[i].name, ph[i].s);
    cJSON_AddBoolToObject(j, "load_overlapped", g->overlapped);
    cJSON_AddNumberToObject(j, "load_fill_gbps", g->fill_s > 0 ? (double)g->bytes / g->fill_s / 1e9
                                                               : 0);
    cJSON_AddNumberToObject(j, "load_threads", g->threads);
    cJSON_AddNumberToObject(j, "load_buffers", g->buffers);
    cJSON_AddNumberToObject(j, "load_buffer_bytes", (double)g->buffer_bytes);
    cJSON_AddStringToObject(j, "load_buffer_mem", g->buffer_mem ? g->buffer_mem : "");
    cJSON *d = cJSON_AddObjectToObject(j, "load_fill_detail");   /* the ring's side of it */
    cJSON_AddNumberToObject(d, "threads_reading_s", g->fill_read_s);
    cJSON_AddNumberToObject(d, "threads_waiting_for_copies_s", g->fill_wait_s);
    cJSON_AddNumberToObject(d, "copier_idle_s", g->fill_idle_s);
    cJSON_AddNumberToObject(d, "copier_issuing_s", g->fill_issue_s);
}

static int print_decode_json(const decode_args *a, const kl_model *m, const decode_result *r,
                             const kl_cli_load *l)
{
    const kl_token_bytes *b = &r->bytes;
    double tok_s = per_s((double)a->tokens, r->decode_s), eff = b->total * tok_s / 1e9;
    cJSON *j = kl_cli_json_head(1);
    cJSON_AddStringToObject(j, "model", a->model);
    cJSON_AddStringToObject(j, "device", r->on_gpu ? r->gpu.device : "cpu");
    cJSON_AddNumberToObject(j, "threads", kl_pool_threads(m->pool));
    cJSON_AddStringToObject(j, "kernels", kl_matvec_kernels_name(kl_matvec_kernels()));
    cJSON_AddNumberToObject(j, "weight_bytes", (double)m->weight_bytes);
    cJSON_AddNumberToObject(j, "load_s", l->load_s);
    cJSON_AddNumberToObject(j, "load_gbps", l->load_gbps);
    cJSON_AddNumberToObject(j, "synthetic_context_tokens", (double)a->context);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)a->prompt_tokens);
    cJSON_AddNumberToObject(j, "prefill_s", r->prefill_s);
    cJSON_AddNumberToObject(j, "prefill_tok_s", per_s((double)a->prompt_tokens, r->prefill_s));
    cJSON_AddNumberToObject(j, "time_to_first_token_s", r->ttft_s);
    cJSON_AddNumberToObject(j, "peak_host_rss_bytes", (double)r->peak_rss);
    cJSON_AddNumberToObject(j, "decode_tokens", (double)a->tokens);
    cJSON_AddNumberToObject(j, "decode_s", r->decode_s);
    cJSON_AddNumberToObject(j, "decode_tok_s", tok_s);
    cJSON_AddNumberToObject(j, "bytes_per_token", b->total);
    cJSON *parts = cJSON_AddObjectToObject(j, "bytes_per_token_parts");
    cJSON_AddNumberToObject(parts, "non_expert", b->non_expert);
    cJSON_AddNumberToObject(parts, "shared_experts", b->shared_experts);
    cJSON_AddNumberToObject(parts, "routed_experts", b->routed_experts);
    cJSON_AddNumberToObject(parts, "lm_head", b->lm_head);
    cJSON_AddNumberToObject(parts, "embedding_row", b->embedding_row);
    cJSON_AddNumberToObject(j, "effective_gbps", eff);
    if (r->on_gpu) {
        cJSON_AddNumberToObject(j, "upload_s", l->upload_s);
        cJSON_AddStringToObject(j, "load_how", l->gpu_load.how ? l->gpu_load.how : "");
        cJSON_AddNumberToObject(j, "load_windows", (double)l->gpu_load.windows);
        cJSON_AddNumberToObject(j, "load_windows_pinned", (double)l->gpu_load.pinned);
        cJSON_AddNumberToObject(j, "load_windows_staged", (double)l->gpu_load.staged);
        cJSON_AddNumberToObject(j, "load_lanes", l->gpu_load.lanes);
        /* bytes read from the checkpoint's files and copied to the GPU(s): with tensor
         * parallel, the ranks' pieces share bytes (read once, copied to each rank) */
        cJSON_AddNumberToObject(j, "load_read_bytes", (double)l->gpu_load.read_bytes);
        cJSON_AddNumberToObject(j, "load_copied_bytes", (double)l->gpu_load.bytes);
        add_rank_bytes(j, m->be);
        add_load_phases(j, l);
        cJSON_AddNumberToObject(j, "hbm_copy_gbps", r->gpu.hbm_gbps);
        cJSON_AddNumberToObject(j, "pinned_h2d_gbps", r->gpu.h2d_gbps);
        double after = load_after_start_gbps(l, m->weight_bytes);
        cJSON_AddNumberToObject(j, "load_ratio_to_pinned",
                                r->gpu.h2d_gbps > 0 ? l->load_gbps / r->gpu.h2d_gbps : 0);
        cJSON_AddNumberToObject(j, "load_after_device_start_s", load_after_start_s(l));
        cJSON_AddNumberToObject(j, "load_after_device_start_gbps", after);
        cJSON_AddNumberToObject(j, "load_after_device_start_ratio",
                                r->gpu.h2d_gbps > 0 ? after / r->gpu.h2d_gbps : 0);
        cJSON_AddNumberToObject(j, "disk_read_gbps", r->disk_gbps);
        cJSON_AddNumberToObject(j, "host_copy_gbps", r->host_copy.read_gbps);
        cJSON_AddNumberToObject(j, "host_copy_threads", r->host_copy.threads);
        cJSON_AddNumberToObject(j, "gpu_memory_used_bytes", (double)r->gpu.mem_used);
        cJSON_AddNumberToObject(j, "launches_per_decode_step", (double)r->prof_decode.graph_nodes);
        if (r->prof_decode.on) {   /* $KL_GPU_PROFILE=1: shares of the time per operation */
            add_profile(j, "profile_prefill_ms", &r->prof_prefill, 1);
            add_profile(j, "profile_decode_ms_per_token", &r->prof_decode, (double)a->tokens);
        }
    } else {
        cJSON_AddNumberToObject(j, "memory_read_ceiling_gbps", r->ceiling.read_gbps);
    }
    cJSON_AddNumberToObject(j, "ratio_to_ceiling",
                            ceiling_gbps(r) > 0 ? eff / ceiling_gbps(r) : 0);
    cJSON *at = cJSON_AddArrayToObject(j, "decode_at_context");
    for (size_t i = 0; i < a->n_at; i++) {
        const decode_at *d = &r->at[i];
        double bytes = b->total + d->cache_bytes, ceil_tok = ceiling_gbps(r) * 1e9 / bytes;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "context", (double)a->at_ctx[i]);
        cJSON_AddNumberToObject(o, "decode_tok_s", d->tok_s);
        cJSON_AddNumberToObject(o, "ms_per_token", d->tok_s > 0 ? 1e3 / d->tok_s : 0);
        cJSON_AddNumberToObject(o, "bytes_per_token", bytes);
        cJSON_AddNumberToObject(o, "ratio_to_ceiling", ceil_tok > 0 ? d->tok_s / ceil_tok : 0);
        cJSON_AddItemToArray(at, o);
    }
    cJSON *pf = cJSON_AddArrayToObject(j, "prefill_at");
    for (size_t i = 0; i < a->n_pf; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "tokens", (double)a->pf_len[i]);
        cJSON_AddNumberToObject(o, "prefill_tok_s", r->pf_tok_s[i]);
        cJSON_AddItemToArray(pf, o);
    }
    cJSON *bt = cJSON_AddArrayToObject(j, "batch_at");
    for (size_t i = 0; i < a->n_bt; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "sequences", (double)a->bt_seqs[i]);
        cJSON_AddNumberToObject(o, "decode_tok_s", r->bt_tok_s[i]);
        cJSON_AddNumberToObject(o, "ms_per_step", r->bt_tok_s[i] > 0
                                ? 1e3 * (double)a->bt_seqs[i] / r->bt_tok_s[i] : 0);
        if (r->bt_prof[i].on)   /* $KL_GPU_PROFILE=1: where a step's time goes */
            add_profile(o, "profile_ms_per_step", &r->bt_prof[i], (double)a->tokens);
        cJSON_AddItemToArray(bt, o);
    }
    return kl_cli_print_json(j);
}

static void print_decode_text(const decode_args *a, const kl_model *m, const decode_result *r,
                              const kl_cli_load *l)
{
    const kl_token_bytes *b = &r->bytes;
    double tok_s = per_s((double)a->tokens, r->decode_s), eff = b->total * tok_s / 1e9;
    printf("kl bench decode: %s (%u threads, %s kernels, %.3f GB of weights)\n", a->model,
           kl_pool_threads(m->pool), kl_matvec_kernels_name(kl_matvec_kernels()),
           (double)m->weight_bytes / 1e9);
    if (a->context)
        printf("  context  %llu synthetic positions before the prompt\n", a->context);
    printf("  prefill  %llu tokens in %.3f s: %.1f tok/s (first token %.2f s after the process "
           "started)\n", a->prompt_tokens, r->prefill_s,
           per_s((double)a->prompt_tokens, r->prefill_s), r->ttft_s);
    if (r->on_gpu)
        printf("  load     %.3f s: %.2f GB/s (%s, %u lanes); pinned host-to-GPU copy %.2f GB/s, "
               "raw disk read %.2f GB/s, host memcpy %.2f GB/s (%u threads)\n           open "
               "%.3f s, device %.3f s, buffers %.3f s, waited %.3f s, plan %.3f s, alloc "
               "%.3f s, fill %.3f s, finish %.3f s\n",
               l->load_s, l->load_gbps, l->gpu_load.how, l->gpu_load.lanes, r->gpu.h2d_gbps,
               r->disk_gbps,
               r->host_copy.read_gbps, r->host_copy.threads,
               l->open_s, l->gpu_load.device_s, l->gpu_load.buffers_s, l->gpu_load.wait_s,
               l->gpu_load.plan_s, l->gpu_load.alloc_s, l->gpu_load.fill_s,
               l->gpu_load.finish_s);
    if (r->on_gpu && r->gpu.h2d_gbps > 0)
        printf("           ratio to the pinned copy %.2f; after the device's start %.3f s, "
               "%.2f GB/s, ratio %.2f\n", l->load_gbps / r->gpu.h2d_gbps,
               load_after_start_s(l), load_after_start_gbps(l, m->weight_bytes),
               load_after_start_gbps(l, m->weight_bytes) / r->gpu.h2d_gbps);
    if (r->on_gpu && kl_backend_tp_size(m->be))
        printf("  ranks    %u tensor-parallel: read %.3f GB from the files, sent %.3f GB to "
               "the GPUs; sums: %s\n", kl_backend_tp_size(m->be),
               (double)l->gpu_load.read_bytes / 1e9, (double)l->gpu_load.bytes / 1e9,
               kl_backend_gpu_tp_sums(m->be));
    printf("  decode   %llu tokens in %.3f s: %.2f tok/s\n", a->tokens, r->decode_s, tok_s);
    printf("  weights per decoded token: %.4f GB (non-expert %.4f, shared experts %.4f, routed "
           "experts %.4f, lm_head %.4f, embedding row %.6f)\n", b->total / 1e9,
           b->non_expert / 1e9, b->shared_experts / 1e9, b->routed_experts / 1e9,
           b->lm_head / 1e9, b->embedding_row / 1e9);
    printf("  effective bandwidth %.2f GB/s; %s %.2f GB/s (ratio %.2f)\n", eff,
           r->on_gpu ? "HBM (device copy) on the GPU" : "host memory-read ceiling",
           ceiling_gbps(r), ceiling_gbps(r) > 0 ? eff / ceiling_gbps(r) : 0);
    for (size_t i = 0; i < a->n_at; i++) {
        double bytes = b->total + r->at[i].cache_bytes;
        printf("  decode at context %llu: %.2f tok/s (%.3f GB a step with the cache, ratio %.2f)"
               "\n", a->at_ctx[i], r->at[i].tok_s, bytes / 1e9,
               ceiling_gbps(r) > 0 ? r->at[i].tok_s * bytes / 1e9 / ceiling_gbps(r) : 0);
    }
    for (size_t i = 0; i < a->n_pf; i++)
        printf("  prefill of %llu tokens: %.1f tok/s\n", a->pf_len[i], r->pf_tok_s[i]);
    for (size_t i = 0; i < a->n_bt; i++)
        printf("  batch of %llu sequences: %.1f tok/s in all, %.3f ms per step\n",
               a->bt_seqs[i], r->bt_tok_s[i],
               r->bt_tok_s[i] > 0 ? 1e3 * (double)a->bt_seqs[i] / r->bt_tok_s[i] : 0);
}

/* A list like "0,8192,65536" into v[0 .. *n) (at most MAX_CONTEXTS counts, each in
 * [lo, 2^24]); -1 when it is not such a list. */
static int parse_counts(const char *p, unsigned long long lo, unsigned long long *v, size_t *n_out)
{
    size_t n_v = 0;
    for (;;) {
        char item[32];
        size_t n = strcspn(p, ",");
        if (!n || n >= sizeof item || n_v == MAX_CONTEXTS)
            return -1;
        memcpy(item, p, n);
        item[n] = 0;
        if (kl_cli_parse_u64(item, &v[n_v]) || v[n_v] < lo || v[n_v] > (1u << 24))
            return -1;
        *n_out = ++n_v;
        if (!p[n])
            return 0;
        p += n + 1;
    }
}

static int parse_decode(int argc, char **argv, decode_args *a)
{
    memset(a, 0, sizeof *a);
    a->prompt_tokens = 64;
    a->tokens = 32;
    const kl_opt opts[] = {
        KL_VALUE("--threads", 0, KL_OPT_U64, &a->threads, "N",
                 "engine threads (default: all CPUs)", .lo = 1, .hi = 256),
        KL_VALUE("--prompt-tokens", 0, KL_OPT_U64, &a->prompt_tokens, "N",
                 "random prompt ids fed in one call (default 64)", .lo = 1, .hi = 1 << 20),
        KL_VALUE("--tokens", 0, KL_OPT_U64, &a->tokens, "N",
                 "greedy decode steps (default 32)", .hi = 1 << 20),
        KL_VALUE("--decode-at", 0, KL_OPT_STR, &a->at, "LIST",
                 "also decode at these synthetic contexts (up to 8, e.g. 0,8192,65536)"),
        KL_VALUE("--prefill-at", 0, KL_OPT_STR, &a->pf, "LIST",
                 "also time the prefill of these prompt lengths, each on a fresh state\n"
                 "(up to 8, e.g. 512,8192,65536)"),
        KL_VALUE("--batch-at", 0, KL_OPT_STR, &a->bt, "LIST",
                 "also decode these numbers of sequences together, --tokens steps of\n"
                 "one token each (up to 8 counts, e.g. 1,4,16,64: continuous batching)"),
        KL_VALUE("--context", 0, KL_OPT_U64, &a->context, "N",
                 "synthetic positions before the prompt (zero state, zero cache rows):\n"
                 "prefill and decode timed at context N without feeding N tokens (default 0)",
                 .hi = 1 << 24),
        KL_FLAG("--json", 0, &a->json, "one JSON object instead of the text"),
        KL_FLAG("--quiet", 'q', &a->quiet, "errors only on stderr (no load progress or time)"),
        KL_FLAG("--ignore-memory-check", 0, &a->ignore_memory,
                "load even when the model is larger than the available memory"),
        KL_DEVICE_ROW(&a->device),
        KL_TP_ROW(&a->tp),
        KL_EP_ROW(&a->expert_parallel),
        {0}};
    const kl_cmd_spec spec = {
        .name = "bench decode",
        .synopsis = "usage: kl bench decode MODEL [--threads N] [--prompt-tokens N] [--tokens N]\n"
                    "                       [--context N] [--decode-at LIST] [--prefill-at LIST]\n"
                    "                       [--batch-at LIST]\n"
                    "                       [--json] [-q] [--ignore-memory-check] [--device D]\n"
                    "                       [--tp N [--expert-parallel]]\n",
        .about = decode_about,
        .opts = opts,
        .min_pos = 1,
        .max_pos = 1,
        .pos_name = "MODEL"};
    int rc = kl_args_parse_into(&spec, argc, argv, &a->model, 1);
    if (rc == KL_ARGS_RUN && a->at && parse_counts(a->at, 0, a->at_ctx, &a->n_at))
        return kl_cli_usage("--decode-at wants up to %d counts separated by commas, each at most "
                            "16777216 (e.g. 0,8192,65536)", MAX_CONTEXTS);
    if (rc == KL_ARGS_RUN && a->pf && parse_counts(a->pf, 1, a->pf_len, &a->n_pf))
        return kl_cli_usage("--prefill-at wants up to %d counts separated by commas, each 1 to "
                            "16777216 (e.g. 512,8192,65536)", MAX_CONTEXTS);
    if (rc == KL_ARGS_RUN && a->bt && parse_counts(a->bt, 1, a->bt_seqs, &a->n_bt))
        return kl_cli_usage("--batch-at wants up to %d counts separated by commas, each at "
                            "least 1 (e.g. 1,4,16,64)", MAX_CONTEXTS);
    const char *tp_problem = kl_cli_tp_problem(a->tp, a->expert_parallel, a->device);
    return rc == KL_ARGS_RUN && tp_problem ? kl_cli_usage("%s", tp_problem) : rc;
}

static int bench_decode(int argc, char **argv)
{
    decode_args a;
    int rc = parse_decode(argc, argv, &a);
    if (rc != KL_ARGS_RUN)
        return rc;
    char model[4096];
    if ((rc = kl_cli_model_dir("bench decode", a.model, model, sizeof model)))
        return rc;
    a.model = model;
    kl_err err;
    kl_err_clear(&err);
    kl_model *m = NULL;
    kl_cli_load l = {.cmd = "bench decode",
                     .model = a.model,
                     .opts = {.threads = (unsigned)a.threads, .route_weights = KL_ROUTE_UNBIASED,
                              .tp = (unsigned)a.tp, .expert_parallel = a.expert_parallel},
                     .quiet = a.quiet,
                     .ignore_memory = a.ignore_memory,
                     .device = a.device};
    decode_result res;
    memset(&res, 0, sizeof res);
    int failed = kl_cli_plan_model(&l, &err) || kl_cli_open_model(&l, &m, &err) ||
                 time_decode(m, &a, &res, &err);
    for (size_t i = 0; !failed && i < a.n_at; i++)
        failed = time_decode_at(m, &a, (size_t)a.at_ctx[i], &res.at[i], &err);
    for (size_t i = 0; !failed && i < a.n_pf; i++)
        failed = time_prefill_at(m, (size_t)a.pf_len[i], &res.pf_tok_s[i], &err);
    for (size_t i = 0; !failed && i < a.n_bt; i++)
        failed = time_batch_at(m, &a, (size_t)a.bt_seqs[i], &res.bt_tok_s[i], &res.bt_prof[i],
                               &err);
    if (failed) {
        kl_model_close(m);
        kl_cli_load_release(&l);
        return kl_cli_report("bench decode", &err);
    }
    kl_cost_token_bytes(m, &res.bytes);
    res.on_gpu = !strcmp(l.device_used, "gpu");
    if (res.on_gpu) {
        res.disk_gbps = raw_disk_gbps(m);
        /* what the fill's copies from the page cache can reach on this host, at most */
        unsigned threads = l.gpu_load.threads ? l.gpu_load.threads : 1;
        if (kl_membench_copy((size_t)1 << 30, threads, 3, &res.host_copy, &err))
            fprintf(stderr, "kl bench decode: no host copy ceiling: %s\n", err.msg);
    }
    /* the ceiling measured after the model is loaded (CPU: as many threads as the engine) */
    if (res.on_gpu ? kl_backend_gpu_ceilings(&res.gpu, &err)
                   : kl_membench_read((size_t)1 << 30, kl_pool_threads(m->pool), 3, &res.ceiling,
                                      &err))
        fprintf(stderr, "kl bench decode: no bandwidth ceiling: %s\n", err.msg);
    rc = KL_EXIT_OK;
    if (a.json)
        rc = print_decode_json(&a, m, &res, &l);
    else
        print_decode_text(&a, m, &res, &l);
    kl_model_close(m);
    return rc;
}

/* ---- command ------------------------------------------------------------------------------ */

static int bench_mxfp4(int argc, char **argv)
{
    unsigned long long threads = 0, mib = 512;
    int rule = KL_SCALE_OCP, json = 0;
    const kl_opt opts[] = {
        KL_VALUE("--threads", 0, KL_OPT_U64, &threads, "N",
                 "threads of the all-cores pass (default: all CPUs)", .lo = 1, .hi = 256),
        KL_VALUE("--mib", 0, KL_OPT_U64, &mib, "N", "MiB of BF16 input (default 512)", .lo = 1,
                 .hi = 65536),
        KL_VALUE("--rule", 0, KL_OPT_FN, &rule, "R", "scale rule: ocp (default), round, ceil, mse",
                 .fn = kl_cli_parse_scale_rule, .wants = "one of ocp, round, ceil, mse"),
        KL_FLAG("--json", 0, &json, "one JSON object on stdout (the only output)"),
        {0}};
    const kl_cmd_spec spec = {
        .name = "bench mxfp4",
        .synopsis = "usage: kl bench mxfp4 [--threads N] [--mib N] [--rule ocp|round|ceil|mse]\n"
                    "                      [--json]\n",
        .about = mxfp4_about,
        .opts = opts};
    int prc = kl_args_parse_into(&spec, argc, argv, NULL, 0);
    if (prc != KL_ARGS_RUN)
        return prc;
    if (!threads)
        threads = kl_cpu_count(0);
    qbench b = {.rule = (kl_scale_rule)rule};
    b.rows = (size_t)mib * (1u << 20) / (ROW * 2);
    uint16_t *in = kl_malloc(b.rows * ROW * 2);
    b.packed = kl_malloc(b.rows * ROW / 2);
    b.scale = kl_malloc(b.rows * ROW / 32);
    if (!in || !b.packed || !b.scale) {
        kl_free(in);
        kl_free(b.packed);
        kl_free(b.scale);
        return kl_cli_fail(KL_EXIT_USAGE, "nomem", "out of memory", NULL);
    }
    kl_rng r;
    kl_rng_seed(&r, 1, 0);
    for (size_t i = 0; i < b.rows * ROW; i += 2) {
        float x, y;
        kl_rng_normal2(&r, &x, &y);
        in[i] = kl_f32_to_bf16(x * 0.02f);
        in[i + 1] = kl_f32_to_bf16(y * 0.02f);
    }
    b.in = in;
    double one = run(&b, 1), all = run(&b, (unsigned)threads);
    kl_membench_result ceiling = {0};
    kl_membench_read((size_t)1 << 30, (unsigned)threads, 3, &ceiling, NULL);
    cJSON *j = kl_cli_json_head(!b.rc);
    cJSON_AddStringToObject(j, "rule", kl_scale_rule_name(b.rule));
    cJSON_AddBoolToObject(j, "avx2", kl_cpu_has_avx2_fma());
    cJSON_AddNumberToObject(j, "input_bytes", (double)b.rows * ROW * 2);
    cJSON_AddNumberToObject(j, "threads", (double)threads);
    cJSON_AddNumberToObject(j, "quantize_gbps_one_core", one);
    cJSON_AddNumberToObject(j, "quantize_gbps_all_cores", all);
    cJSON_AddNumberToObject(j, "memory_read_ceiling_gbps", ceiling.read_gbps);
    cJSON_AddNumberToObject(j, "ratio_to_ceiling",
                            ceiling.read_gbps > 0 ? all / ceiling.read_gbps : 0);
    kl_free(in);
    kl_free(b.packed);
    kl_free(b.scale);
    int rc = kl_cli_print_json(j);
    return rc ? rc : b.rc ? KL_EXIT_BUG : KL_EXIT_OK;
}

/* ---- command ------------------------------------------------------------------------------ */

int cmd_bench(int argc, char **argv)
{
    static const char *const subs[] = {"mxfp4", "rules", "decode"};
    static int (*const run_sub[])(int, char **) = {bench_mxfp4, bench_rules, bench_decode};
    for (size_t i = 0; argc >= 2 && i < 3; i++)
        if (!strcmp(argv[1], subs[i]))
            return run_sub[i](argc - 1, argv + 1);
    int json = 0;
    for (int i = 1; i < argc; i++)
        json |= !strcmp(argv[i], "--json");
    kl_cli_begin("bench", json);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        if (!json) {
            fputs(usage_text, stdout);
            return KL_EXIT_OK;
        }
        cJSON *root = kl_cli_json_head(1);
        cJSON_AddStringToObject(root, "help", usage_text);
        return kl_cli_print_json(root);
    }
    if (argc < 2 || argv[1][0] == '-')
        return kl_cli_usage("missing the benchmark: mxfp4, rules or decode");
    const char *near = kl_cli_nearest(argv[1], subs, 3);
    if (near)
        return kl_cli_usage("unknown benchmark '%s'; did you mean '%s'?", argv[1], near);
    return kl_cli_usage("unknown benchmark '%s' (mxfp4, rules, decode)", argv[1]);
}
