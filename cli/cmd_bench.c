/*
 * cli/cmd_bench.c — `kl bench`: measured figures, each beside the ceiling it is bound by.
 *
 *   kl bench mxfp4 [--threads N] [--mib N] [--rule R]
 *       BF16 -> MXFP4 quantizer throughput on Gaussian rows (2304 wide, like the experts'
 *       w1/w3 rows), per core and on N cores, against the host memory-read ceiling.
 * JSON on stdout (one object), as every figure of a benchmark should be machine-readable.
 */
#include "cli/cli.h"

#include "common/clock.h"
#include "common/membench.h"
#include "common/mem.h"
#include "common/numfmt.h"
#include "common/pool.h"
#include "common/rng.h"
#include "convert/mxfp4.h"
#include "convert/verify.h"

#include <math.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: kl bench mxfp4 [--threads N] [--mib N] [--rule ocp|round|ceil|mse]\n"
    "       kl bench rules [--rows N]\n"
    "\n"
    "Quantizes N MiB (default 512) of random BF16 rows of 2304 values to MXFP4 with one thread\n"
    "and with N threads (default: all CPUs) and prints one JSON object: GB/s of BF16 input per\n"
    "core and in total, and the host memory-read ceiling measured in the same run.\n"
    "`rules` quantizes rows drawn from several weight distributions (Gaussian, Laplace,\n"
    "Student-t with 3 degrees of freedom, Gaussian with 0.1%% outliers at 10 sigma) with every\n"
    "scale rule and prints the relative RMSE of each (one JSON object).\n";

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
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc && !kl_cli_parse_u64(argv[++i], &rows) &&
            rows >= 1 && rows <= (1u << 20))
            continue;
        fprintf(stderr, "kl bench rules: bad argument '%s'\n\n%s", argv[i], usage_text);
        return KL_EXIT_USAGE;
    }
    static const char *const names[] = {"gaussian", "laplace", "student_t3", "gaussian_outliers"};
    uint16_t *in = kl_malloc((size_t)rows * ROW * sizeof *in);
    if (!in)
        return KL_EXIT_USAGE;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "kl_version", KL_VERSION);
    cJSON_AddStringToObject(j, "command", "bench rules");
    cJSON_AddBoolToObject(j, "ok", 1);
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
    char *text = cJSON_PrintUnformatted(j);
    puts(text ? text : "{}");
    cJSON_free(text);
    cJSON_Delete(j);
    kl_free(in);
    return rc ? KL_EXIT_BUG : KL_EXIT_OK;
}

int cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "rules"))
        return bench_rules(argc, argv);
    if (argc < 2 || strcmp(argv[1], "mxfp4")) {
        fputs(usage_text, argc >= 2 && !strcmp(argv[1], "--help") ? stdout : stderr);
        return argc >= 2 && !strcmp(argv[1], "--help") ? KL_EXIT_OK : KL_EXIT_USAGE;
    }
    unsigned long long threads = 0, mib = 512;
    int rule = KL_SCALE_OCP;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc &&
            !kl_cli_parse_u64(argv[++i], &threads) && threads >= 1 && threads <= 256)
            continue;
        if (!strcmp(argv[i], "--mib") && i + 1 < argc && !kl_cli_parse_u64(argv[++i], &mib) &&
            mib >= 1 && mib <= 65536)
            continue;
        if (!strcmp(argv[i], "--rule") && i + 1 < argc &&
            (rule = kl_scale_rule_parse(argv[++i])) >= 0)
            continue;
        fprintf(stderr, "kl bench: bad argument '%s'\n\n%s", argv[i], usage_text);
        return KL_EXIT_USAGE;
    }
    if (!threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned long long)n : 1;
    }
    qbench b = {.rule = (kl_scale_rule)rule};
    b.rows = (size_t)mib * (1u << 20) / (ROW * 2);
    uint16_t *in = kl_malloc(b.rows * ROW * 2);
    b.packed = kl_malloc(b.rows * ROW / 2);
    b.scale = kl_malloc(b.rows * ROW / 32);
    if (!in || !b.packed || !b.scale) {
        fprintf(stderr, "kl bench: out of memory\n");
        return KL_EXIT_USAGE;
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
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "kl_version", KL_VERSION);
    cJSON_AddStringToObject(j, "command", "bench mxfp4");
    cJSON_AddBoolToObject(j, "ok", !b.rc);
    cJSON_AddStringToObject(j, "rule", kl_scale_rule_name(b.rule));
    cJSON_AddBoolToObject(j, "avx2", kl_mxfp4_have_avx2());
    cJSON_AddNumberToObject(j, "input_bytes", (double)b.rows * ROW * 2);
    cJSON_AddNumberToObject(j, "threads", (double)threads);
    cJSON_AddNumberToObject(j, "quantize_gbps_one_core", one);
    cJSON_AddNumberToObject(j, "quantize_gbps_all_cores", all);
    cJSON_AddNumberToObject(j, "memory_read_ceiling_gbps", ceiling.read_gbps);
    cJSON_AddNumberToObject(j, "ratio_to_ceiling",
                            ceiling.read_gbps > 0 ? all / ceiling.read_gbps : 0);
    char *text = cJSON_PrintUnformatted(j);
    puts(text ? text : "{}");
    cJSON_free(text);
    cJSON_Delete(j);
    kl_free(in);
    kl_free(b.packed);
    kl_free(b.scale);
    return b.rc ? KL_EXIT_BUG : KL_EXIT_OK;
}
