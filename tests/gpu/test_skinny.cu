/*
 * tests/gpu/test_skinny.cu — kernels/skinny.h against a host reference in double: BF16 and
 * MXFP4 weights at Kimi-Linear's shapes (projections, KDA o, shared expert, dense MLP, lm_head
 * with rows sampled, and small ones) for n = 2, 3, 4, 7, 8, 9, 16, 17, 31, 32: the new kernel
 * (kl_gpu_skinny, versions 1 and 2, fail above 1e-6 relative L2), the old path (kl_gpu_matmul
 * with KL_GPU_SKINNY off, fail above 1e-5), kl_gpu_matmul switched on equal bit for bit to
 * kl_gpu_skinny below KL_GPU_GEMM_MIN_N, odd shapes (partial warps and tiles, one granule,
 * uneven K splits), kl_gpu_skinny_parts (the rows of fused matrices to their members'
 * outputs) and the refusals.  Each case is timed (events, median of 20 single calls
 * after warm-up, weights rotated over copies so the L2 cannot hold them): new (v1, v2) and old
 * also per call in a graph of 32, from 16 tokens the prefill products too (kl_gpu_gemm_p, x
 * split each call); one JSON line a case: weight bytes, µs, GB/s of weight bytes, the ratio
 * new/old of the single-call times.  Then a sweep of the blocks aimed at per SM
 * (kl_gpu_skinny_blocks_set) at n = 8, 16, 32 for both versions (BF16 steps of 64 or 128
 * columns), one KDA layer's products and the shared expert's as one graph at n = 2 .. 31
 * (old, v1, v2), and the summary line.  Exit 0 pass, 1 fail, 77 no GPU.
 */
#include "kernels/dense.h"
#include "kernels/gemm.h"
#include "kernels/skinny.h"
#include "tests/gpu/gpu_testutil.h"

#define TOL     1e-6 /* the split form's products: ~3e-7 of an fp32 sum */
#define OLD_TOL 1e-5 /* fp32 SIMT sums */
#define MAX_N   32u

static const uint32_t ns[] = {2, 3, 4, 7, 8, 9, 16, 17, 31, 32};

/* The reference: rows r % step == 0 of Y for MAX_N tokens of x, [token][checked row]. */
struct ref_t {
    size_t step, count;
    std::vector<double> y;
};

static ref_t reference(const t_mat &m, const std::vector<float> &x, size_t step)
{
    ref_t r = {step, (m.rows + step - 1) / step, {}};
    r.y.assign(MAX_N * r.count, 0.0);
    std::vector<float> w(m.cols);
    for (size_t i = 0; i < r.count; i++) {
        t_mat_row(m, i * step, w.data());
        for (uint32_t t = 0; t < MAX_N; t++) {
            double s = 0;
            for (size_t c = 0; c < m.cols; c++)
                s += (double)w[c] * x[t * m.cols + c];
            r.y[t * r.count + i] = s;
        }
    }
    return r;
}

/* The worst over n tokens of the relative L2 error of y [n, rows] on the checked rows. */
static double error_of(const std::vector<float> &y, const ref_t &r, uint32_t n, size_t rows)
{
    double worst = 0;
    std::vector<float> got(r.count);
    for (uint32_t t = 0; t < n; t++) {
        for (size_t i = 0; i < r.count; i++)
            got[i] = y[t * rows + i * r.step];
        const double e = t_rel_l2(got.data(), &r.y[t * r.count], r.count);
        worst = e > worst || e != e ? e : worst;
    }
    return worst;
}

/* y [n, w.rows] by kl_gpu_skinny at `version` (1 or 2), or (version 0) kl_gpu_matmul with the
 * skinny path switched off, or (version -1) on; on the host, y's device buffer set to NaN
 * first. */
static std::vector<float> product(const kl_gpu_mat &w, const float *dx, uint32_t n, float *dy,
                                  int version)
{
    kl_err err;
    kl_err_clear(&err);
    T_CHECK(hipMemset(dy, 0xff, (size_t)n * w.rows * sizeof(float)));
    kl_gpu_skinny_version_set(version < 0 ? 1 : version);
    const int rc = version > 0 ? kl_gpu_skinny(&w, dx, n, dy, NULL, &err)
                               : kl_gpu_matmul(&w, dx, n, dy, NULL, &err);
    kl_gpu_skinny_version_set(1);
    t_ok(rc, &err, version > 0 ? "kl_gpu_skinny" : "kl_gpu_matmul");
    return t_download(dy, (size_t)n * w.rows);
}

/* The paths timed: the new kernel (versions 1 and 2), kl_gpu_matmul's SIMT kernels, the
 * prefill products. */
enum path { NEW, NEW2, OLD, GEMM };

/* Median seconds of one call of a path over the copies (GEMM: kl_gpu_gemm_p with x split into
 * parts each call, as the engine's first product of an input); *graph_s (unless NULL): per
 * call when 32 calls replay as one graph (as the engine's decode step runs them). */
static double time_path(const std::vector<kl_gpu_mat> &w, const float *dx, uint32_t n,
                        float *dy, path how, uint16_t *parts, double *graph_s)
{
    kl_err err;
    kl_err_clear(&err);
    kl_gpu_skinny_version_set(how == OLD ? 0 : how == NEW2 ? 2 : 1);
    auto call = [&](int i, kl_gpu_stream st) {
        const kl_gpu_mat &c = w[(size_t)i % w.size()];
        t_ok(how <= NEW2  ? kl_gpu_skinny(&c, dx, n, dy, st, &err)
             : how == OLD ? kl_gpu_matmul(&c, dx, n, dy, st, &err)
                          : kl_gpu_gemm_p(&c, dx, n, dy, parts, 0, st, &err),
             &err, "timed product");
    };
    const double s = t_median_s(call, 20);
    if (graph_s)
        *graph_s = t_graph_s(call, 32);
    kl_gpu_skinny_version_set(1);
    return s;
}

/* One matrix: every n checked (new, old, routing) and timed both ways, one JSON line each. */
static void check_shape(kl_gpu_wkind kind, size_t rows, size_t cols, size_t step,
                        double copy_gbps)
{
    const t_mat m = t_mat_random(kind, rows, cols);
    const size_t bytes = t_mat_bytes(m);
    const std::vector<kl_gpu_mat> w = t_mat_rotation(m);
    const std::vector<float> x = t_vec(MAX_N * cols);
    const ref_t ref = reference(m, x, step);
    float *dx = t_upload(x), *dy = (float *)t_alloc(MAX_N * rows * sizeof(float));
    uint16_t *parts = (uint16_t *)t_alloc(kl_gpu_gemm_parts_bytes(MAX_N, (uint32_t)cols));
    for (uint32_t n : ns) {
        const std::vector<float> y_new = product(w[0], dx, n, dy, 1);
        const std::vector<float> y_old = product(w[0], dx, n, dy, 0);
        const double e_new = error_of(y_new, ref, n, rows), e_old = error_of(y_old, ref, n, rows);
        const double e_v2 = error_of(product(w[0], dx, n, dy, 2), ref, n, rows);
        char what[128];
        snprintf(what, sizeof what, "skinny %s %zux%zu n=%u", t_kind_name(kind), rows, cols, n);
        t_check(what, e_new, TOL);
        snprintf(what, sizeof what, "skinny v2 %s %zux%zu n=%u", t_kind_name(kind), rows, cols,
                 n);
        t_check(what, e_v2, TOL);
        snprintf(what, sizeof what, "old %s %zux%zu n=%u", t_kind_name(kind), rows, cols, n);
        t_check(what, e_old, OLD_TOL);
        if (n < KL_GPU_GEMM_MIN_N) { /* kl_gpu_matmul sends it where kl_gpu_skinny_takes says */
            const std::vector<float> y_mm = product(w[0], dx, n, dy, -1);
            const std::vector<float> &y_to = kl_gpu_skinny_takes(&w[0], dx, n) ? y_new : y_old;
            snprintf(what, sizeof what, "matmul routes %s %zux%zu n=%u (differing values)",
                     t_kind_name(kind), rows, cols, n);
            t_check(what, memcmp(y_mm.data(), y_to.data(), y_to.size() * 4) != 0, 0);
        }
        double g_new = 0, g_old = 0, g_v2 = 0;
        const double s_new = time_path(w, dx, n, dy, NEW, parts, &g_new);
        const double s_v2 = time_path(w, dx, n, dy, NEW2, parts, &g_v2);
        const double s_old = time_path(w, dx, n, dy, OLD, parts, &g_old);
        /* from 16 tokens also the prefill products (KL_GPU_GEMM_MIN_N: where they take over) */
        const double s_gemm = n >= 16 ? time_path(w, dx, n, dy, GEMM, parts, NULL) : 0.0;
        printf("{\"case\":\"skinny\",\"kind\":\"%s\",\"rows\":%zu,\"cols\":%zu,\"n\":%u,"
               "\"err_new\":%.3g,\"err_v2\":%.3g,\"err_old\":%.3g,\"weight_bytes\":%zu,"
               "\"us_new\":%.2f,\"us_v2\":%.2f,\"us_old\":%.2f,\"us_gemm\":%.2f,"
               "\"graph_us_new\":%.2f,\"graph_us_v2\":%.2f,\"graph_us_old\":%.2f,"
               "\"gbps_new\":%.1f,\"gbps_v2\":%.1f,\"gbps_old\":%.1f,\"new_to_copy\":%.3f,"
               "\"time_ratio_new_old\":%.3f}\n",
               t_kind_name(kind), rows, cols, n, e_new, e_v2, e_old, bytes, s_new * 1e6,
               s_v2 * 1e6, s_old * 1e6, s_gemm * 1e6, g_new * 1e6, g_v2 * 1e6, g_old * 1e6,
               bytes / s_new / 1e9, bytes / s_v2 / 1e9, bytes / s_old / 1e9,
               bytes / s_new / 1e9 / copy_gbps, s_new / s_old);
        fflush(stdout);
    }
    T_CHECK(hipDeviceSynchronize());
    hipFree(dx);
    hipFree(dy);
    hipFree(parts);
    for (auto &c : w)
        t_mat_free(c);
}

/* Odd shapes, checked only: rows that leave warps and tiles partial, one granule, several
 * stages in a split, and (per_sm 1: fewer blocks aimed at) K splits of unequal spans. */
static void check_odd(kl_gpu_wkind kind, size_t rows, size_t cols, unsigned per_sm)
{
    const t_mat m = t_mat_random(kind, rows, cols);
    const kl_gpu_mat d = t_mat_upload(m);
    const std::vector<float> x = t_vec(MAX_N * cols);
    const ref_t ref = reference(m, x, 1);
    float *dx = t_upload(x), *dy = (float *)t_alloc(MAX_N * rows * sizeof(float));
    kl_gpu_skinny_blocks_set(per_sm);
    for (int v = 1; v <= 2; v++)
        for (uint32_t n : {2u, 5u, 13u, 24u, 32u}) {
            char what[128];
            snprintf(what, sizeof what, "skinny v%d %s %zux%zu n=%u per_sm=%u", v,
                     t_kind_name(kind), rows, cols, n, per_sm);
            t_check(what, error_of(product(d, dx, n, dy, v), ref, n, rows), TOL);
        }
    kl_gpu_skinny_blocks_set(0);
    hipFree(dx);
    hipFree(dy);
    t_mat_free(d);
}

/* kl_gpu_skinny_parts over matrices stacked by rows (the engine's fused input products: KDA
 * q, k, v, f_a, g_a, b; MLA q, kv_a) equal bit for bit to the rows of one output. */
static void check_parts(const std::vector<uint32_t> &members)
{
    kl_gpu_skinny_out out;
    memset(&out, 0, sizeof out);
    out.count = (uint32_t)members.size();
    uint32_t rows = 0;
    for (uint32_t i = 0; i < out.count; i++) {
        rows += members[i];
        out.end[i] = rows;
    }
    const t_mat m = t_mat_random(KL_GPU_W_BF16, rows, 2304);
    const kl_gpu_mat d = t_mat_upload(m);
    float *dx = t_upload(t_vec(MAX_N * 2304)), *dy = (float *)t_alloc(MAX_N * rows * 4);
    std::vector<float *> py(out.count);
    for (uint32_t i = 0; i < out.count; i++)
        out.y[i] = py[i] = (float *)t_alloc((size_t)MAX_N * members[i] * 4);
    for (uint32_t n : {5u, 16u, 31u}) {
        const std::vector<float> whole = product(d, dx, n, dy, 1);
        kl_err err;
        kl_err_clear(&err);
        t_ok(kl_gpu_skinny_parts(&d, dx, n, &out, NULL, &err), &err, "kl_gpu_skinny_parts");
        double bad = 0;
        for (uint32_t i = 0; i < out.count; i++) {
            const uint32_t r0 = i ? out.end[i - 1] : 0;
            const std::vector<float> part = t_download(py[i], (size_t)n * members[i]);
            for (uint32_t t = 0; t < n; t++)
                bad += memcmp(&part[(size_t)t * members[i]], &whole[(size_t)t * rows + r0],
                              members[i] * 4) != 0;
        }
        char what[96];
        snprintf(what, sizeof what, "parts %u rows in %u n=%u (differing rows)", rows,
                 out.count, n);
        t_check(what, bad, 0);
    }
    hipFree(dx);
    hipFree(dy);
    for (float *p : py)
        hipFree(p);
    t_mat_free(d);
}

/* What the launcher refuses, and where kl_gpu_skinny_takes says no. */
static void check_refusals(void)
{
    kl_gpu_mat m = t_mat_upload(t_mat_random(KL_GPU_W_BF16, 64, 256));
    float *x = (float *)t_alloc(MAX_N * 512 * sizeof(float)), *y = (float *)t_alloc(1 << 20);
    kl_err err;
    int bad = 0;
    for (uint32_t n : {0u, 1u, MAX_N + 1}) {
        kl_err_clear(&err);
        bad += kl_gpu_skinny(&m, x, n, y, NULL, &err) != KL_E_USAGE ||
               kl_gpu_skinny_takes(&m, x, n);
    }
    kl_err_clear(&err);
    bad += kl_gpu_skinny(&m, x + 1, 4, y, NULL, &err) != KL_E_USAGE;
    m.cols = 192;
    kl_err_clear(&err);
    bad += kl_gpu_skinny(&m, x, 4, y, NULL, &err) != KL_E_USAGE || kl_gpu_skinny_takes(&m, x, 4);
    m.cols = 256;
    bad += !kl_gpu_skinny_takes(&m, x, 4);
    bad += kl_gpu_skinny_takes(&m, x, 2);  /* 2 tokens by a small matrix: per-token kernels */
    kl_gpu_skinny_version_set(0);
    bad += kl_gpu_skinny_takes(&m, x, 4);
    kl_gpu_skinny_version_set(2);
    bad += !kl_gpu_skinny_takes(&m, x, 4);
    kl_gpu_skinny_version_set(1);
    kl_gpu_skinny_out out;  /* malformed outputs: no parts, ends not rising, short, NULL */
    memset(&out, 0, sizeof out);
    for (int c = 0; c < 4; c++) {
        out.count = c == 0 ? 0 : 2;
        out.end[0] = c == 1 ? 0 : 32, out.end[1] = c == 2 ? 63 : 64;
        out.y[0] = y, out.y[1] = c == 3 ? NULL : y + 1024;
        kl_err_clear(&err);
        bad += kl_gpu_skinny_parts(&m, x, 4, &out, NULL, &err) != KL_E_USAGE;
    }
    const kl_gpu_mat f = t_mat_upload(t_mat_random(KL_GPU_W_F32, 64, 256));
    bad += kl_gpu_skinny_takes(&f, x, 4);
    t_check("refusals (wrong answers)", bad, 0);
    hipFree(x);
    hipFree(y);
    t_mat_free(m);
    t_mat_free(f);
}

/* Median µs of the new kernel (versions 1 and 2) at per_sm blocks aimed at per SM, one JSON
 * line per setting. */
static void sweep(size_t rows, size_t cols, uint32_t n, double copy_gbps)
{
    const t_mat m = t_mat_random(KL_GPU_W_BF16, rows, cols);
    const size_t bytes = t_mat_bytes(m);
    const std::vector<kl_gpu_mat> w = t_mat_rotation(m);
    float *dx = t_upload(t_vec(MAX_N * cols)), *dy = (float *)t_alloc(MAX_N * rows * 4);
    for (path how : {NEW, NEW2})
        for (unsigned per_sm : {0u, 1u, 2u, 3u, 4u, 6u}) {
            kl_gpu_skinny_blocks_set(per_sm);
            double g = 0;
            const double s = time_path(w, dx, n, dy, how, NULL, &g);
            printf("{\"case\":\"sweep\",\"version\":%d,\"kind\":\"bf16\",\"rows\":%zu,"
                   "\"cols\":%zu,\"n\":%u,\"per_sm\":%u,\"us\":%.2f,\"graph_us\":%.2f,"
                   "\"gbps\":%.1f,\"to_copy\":%.3f}\n",
                   how == NEW2 ? 2 : 1, rows, cols, n, per_sm, s * 1e6, g * 1e6,
                   bytes / s / 1e9, bytes / s / 1e9 / copy_gbps);
        }
    kl_gpu_skinny_blocks_set(0);
    fflush(stdout);
    hipFree(dx);
    hipFree(dy);
    for (auto &c : w)
        t_mat_free(c);
}

/* One KDA layer's products and the shared expert's (BF16: q, k, v, f_a, g_a, b, f_b, g_b, o;
 * gate, up, down) for n tokens replayed as one graph, per version (0: the old path), as a
 * decode step of n sequences runs them: one JSON line with the µs of the whole. */
static void layer(uint32_t n, double copy_gbps)
{
    static const size_t shapes[][2] = {{4096, 2304}, {4096, 2304}, {4096, 2304}, {128, 2304},
                                       {128, 2304},  {32, 2304},   {4096, 128},  {4096, 128},
                                       {2304, 4096}, {1024, 2304}, {1024, 2304}, {2304, 1024}};
    const size_t count = sizeof shapes / sizeof shapes[0];
    std::vector<kl_gpu_mat> w;
    size_t bytes = 0;
    for (const auto &sh : shapes) {
        const t_mat m = t_mat_random(KL_GPU_W_BF16, sh[0], sh[1]);
        w.push_back(t_mat_upload(m));
        bytes += t_mat_bytes(m);
    }
    float *dx = t_upload(t_vec(MAX_N * 4096)), *dy = (float *)t_alloc(MAX_N * 4096 * 4);
    double us[3];
    for (int v = 0; v <= 2; v++) {
        kl_gpu_skinny_version_set(v);
        kl_err err;
        kl_err_clear(&err);
        us[v] = 1e6 * count * t_graph_s(
                                  [&](int i, kl_gpu_stream st) {
                                      t_ok(kl_gpu_matmul(&w[(size_t)i % count], dx, n, dy, st,
                                                         &err),
                                           &err, "layer product");
                                  },
                                  (int)count);
    }
    kl_gpu_skinny_version_set(1);
    printf("{\"case\":\"layer\",\"what\":\"KDA projections and o, shared expert\","
           "\"n\":%u,\"weight_bytes\":%zu,\"us_old\":%.1f,\"us_new\":%.1f,\"us_v2\":%.1f,"
           "\"new_to_copy\":%.3f}\n",
           n, bytes, us[0], us[1], us[2], bytes / (us[1] * 1e-6) / 1e9 / copy_gbps);
    fflush(stdout);
    hipFree(dx);
    hipFree(dy);
    for (auto &c : w)
        t_mat_free(c);
}

int main(void)
{
    if (!t_have_gpu("test_skinny"))
        return 77;
    fprintf(stderr, "test_skinny: KL_GPU_SKINNY gives version %d in this environment\n",
            kl_gpu_skinny_version());
    kl_gpu_skinny_version_set(1);
    check_refusals();
    check_parts({4096, 4096, 4096, 128, 128, 32});
    check_parts({6144, 576});
    for (kl_gpu_wkind k : {KL_GPU_W_BF16, KL_GPU_W_MXFP4}) {
        check_odd(k, 37, 128, 0);     /* one granule, one partial warp */
        check_odd(k, 300, 640, 0);    /* partial tiles, 5 granules */
        check_odd(k, 6144, 1152, 1);  /* per_sm 1 on 132 SMs: splits of 2, 2, 2, 2, 1 granules */
        check_odd(k, 1000, 2304, 64); /* as many splits as granules */
    }
    const double copy = t_copy_gbps();
    /* the model's products of 2..31 tokens: KDA q/k/v, o; MLA q, kv_a; shared expert gate and
     * down; f_a; f_b; the dense MLP's up and down; b; lm_head (rows sampled) */
    static const size_t shapes[][3] = {
        {2304, 2304, 1}, {4096, 2304, 1}, {2304, 4096, 1}, {1024, 2304, 1}, {6144, 2304, 1},
        {576, 2304, 1},  {128, 2304, 1},  {4096, 128, 1},  {9216, 2304, 1}, {2304, 9216, 1},
        {32, 2304, 1},   {163840, 2304, 41}};
    for (kl_gpu_wkind k : {KL_GPU_W_BF16, KL_GPU_W_MXFP4})
        for (const auto &sh : shapes)
            check_shape(k, sh[0], sh[1], sh[2], copy);
    for (uint32_t n : {2u, 4u, 8u, 16u, 31u})
        layer(n, copy);
    for (uint32_t n : {8u, 16u, 32u}) {
        sweep(4096, 2304, n, copy);
        sweep(1024, 2304, n, copy);
        sweep(2304, 4096, n, copy);
    }
    return t_report("skinny", copy);
}
