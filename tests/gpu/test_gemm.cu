/*
 * tests/gpu/test_gemm.cu — kernels/gemm.h against host references computed here (double):
 * kl_gpu_gemm (BF16 and MXFP4 at Kimi-Linear's shapes [4096, 2304], [2304, 4096],
 * [12576, 2304], [1024, 2304] for n = 16, 37, 64, 256, 512, 1,024, and a small odd shape with a row
 * and a K tail) and kl_gpu_gemm_grouped (random segment sizes with empty ones and one longer
 * than a tile, x_row given or NULL, and the routed experts' shapes).  Every call runs in three
 * forms (kl_gpu_gemm_split_set): split X ("promote", the default, with each K step's sums
 * added in fp32 registers: measured 3e-7 .. 7e-7 against plain fp32 X; "split", the MMAs
 * accumulating over the whole K: 3e-6 .. 2e-5)
 * and X rounded to bf16 ("bf16x": against X rounded to bf16 as the kernels do,
 * ~1e-6: only the fp32 summation order differs; and against fp32 X, ~3e-3: bf16's rounding of
 * X).  Outputs are sampled (rows_error) to bound the host's work.  Every
 * form runs in versions 1 and 5 of the kernels (kl_gpu_gemm_tiles_set; the small shapes
 * reach the row and token tails of 5, K % 64 != 0 runs version 1 in both; version 5
 * from parts split by an earlier call equals splitting anew, bit for bit).  Then timings of
 * every version in the forms used, at those shapes and at a prefill chunk of 4,096 tokens:
 * median of single calls, TFLOPS and GB/s of the bytes each must read.  One JSON line; exit 0
 * pass, 1 fail, 77 no GPU.
 */
#include "kernels/gemm.h"
#include "tests/gpu/gpu_testutil.h"

#define TOL_BF16 1e-4 /* against X rounded to bf16 (expected ~1e-6: tensor-core fp32 sums) */
/* The two bounds below are the worst row's.  When large shapes were checked on two outputs
 * a row, one such row cancelled by chance (m = 8,192: 6.3e-5 and 0.039, every version alike;
 * m = 32,768: 1.04e-4 and 0.203); rows_error now checks at least 64 outputs a row. */
#define TOL_F32  1e-1 /* against fp32 X */
#define TOL_SPLIT 2e-4 /* split form against fp32 X (expected ~1e-5 at most) */
#define TOL_PROMOTE 1e-5 /* promote form against fp32 X (expected < 1e-6; the cancelling row
                            at m = 8,192: 2.6e-6 .. 4.1e-6 across versions) */

/* The runs of every call, in order: versions 1 and 5 of the kernels (kl_gpu_gemm_tiles_set;
 * 5 is the default), each in three forms: split X, split X with the sums promoted to fp32
 * registers (the default), X rounded to bf16. */
#define FORMS    3
#define VERSIONS 2
#define RUNS     (VERSIONS * FORMS)
static const int form_split[FORMS] = {1, 2, 0};
static const char *const form_name[FORMS] = {"split", "promote", "bf16x"};
static const int run_version[VERSIONS] = {1, 5};
#define RUN_V5_PROMOTE (FORMS * 1 + 1) /* the run of version 5 in form 2 */

/* Version v for both kinds of products. */
static void set_version(int v)
{
    kl_gpu_gemm_tiles_set(v, v);
}

/* f rounded to bf16 (nearest even), as the kernels stage X. */
static float host_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u = (u >> 16 | 0x40u) << 16;
    else
        u = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;
    memcpy(&f, &u, 4);
    return f;
}

/* Output rows i < src.size() of each run f: y[f][i][r] = W row wbase[i] + r against
 * x[src[i]], r < R.  The worst over i of the relative L2 error over the checked r, against
 * bf16 X (e[f][0]) and fp32 X (e[f][1]); the host does about 5e7 products at most, sampling
 * rows i (every istep-th) and in each at least 64 r (every rstep-th, and the last): a row
 * checked on a few r only could cancel by chance and show a large relative error. */
static void rows_error(const t_mat &m, size_t R, const std::vector<size_t> &src,
                       const std::vector<size_t> &wbase, const std::vector<float> &x,
                       const std::vector<float> y[RUNS], double e[RUNS][2])
{
    const size_t K = m.cols, work = src.size() * R * K;
    const size_t step = work > 50000000 ? (work + 49999999) / 50000000 : 1;
    const size_t rmax = R / 64 ? R / 64 : 1;
    const size_t rstep = step < rmax ? step : rmax, istep = (step + rstep - 1) / rstep;
    std::vector<float> w(K);
    for (int f = 0; f < RUNS; f++)
        e[f][0] = e[f][1] = 0;
    for (size_t i = 0; i < src.size(); i += istep) {
        std::vector<double> rb, rf;
        std::vector<float> got[RUNS];
        for (size_t r = 0; r < R; r = r + rstep < R || r == R - 1 ? r + rstep : R - 1) {
            t_mat_row(m, wbase[i] + r, w.data());
            const float *xi = &x[src[i] * K];
            double sb = 0, sf = 0;
            for (size_t c = 0; c < K; c++) {
                sb += (double)w[c] * host_bf16(xi[c]);
                sf += (double)w[c] * xi[c];
            }
            rb.push_back(sb);
            rf.push_back(sf);
            for (int f = 0; f < RUNS; f++)
                got[f].push_back(y[f][i * R + r]);
        }
        for (int f = 0; f < RUNS; f++) {
            const double eb = t_rel_l2(got[f].data(), rb.data(), rb.size());
            const double ef = t_rel_l2(got[f].data(), rf.data(), rf.size());
            e[f][0] = eb > e[f][0] || eb != eb ? eb : e[f][0];
            e[f][1] = ef > e[f][1] || ef != ef ? ef : e[f][1];
        }
    }
}

/* Split and promote: against fp32 X; bf16x: against X rounded to bf16, and (loosely) fp32 X;
 * for both versions ("what v2 split (x f32)", ...). */
static void check_forms(const char *what, const double e[RUNS][2])
{
    char buf[160];
    for (int v = 0; v < VERSIONS; v++) {
        const double(*ev)[2] = e + FORMS * v;
        const int n = run_version[v];
        snprintf(buf, sizeof buf, "%s v%d split (x f32)", what, n);
        t_check(buf, ev[0][1], TOL_SPLIT);
        snprintf(buf, sizeof buf, "%s v%d promote (x f32)", what, n);
        t_check(buf, ev[1][1], TOL_PROMOTE);
        snprintf(buf, sizeof buf, "%s v%d bf16x (x bf16)", what, n);
        t_check(buf, ev[2][0], TOL_BF16);
        snprintf(buf, sizeof buf, "%s v%d bf16x (x f32)", what, n);
        t_check(buf, ev[2][1], TOL_F32);
    }
}

/* call (y) in each run into y[f], dy (n_out floats) set to NaN first: unwritten shows. */
template <class F>
static void run_forms(F call, float *dy, size_t n_out, std::vector<float> y[RUNS])
{
    for (int f = 0; f < RUNS; f++) {
        set_version(run_version[f / FORMS]);
        kl_gpu_gemm_split_set(form_split[f % FORMS]);
        T_CHECK(hipMemset(dy, 0xff, n_out * 4));
        call();
        y[f] = t_download(dy, n_out);
    }
    kl_gpu_gemm_tiles_set(0, 0);
    kl_gpu_gemm_split_set(2);
}

/* Records a timing with its FLOPs and bytes. */
static void time_record(const char *what, double s, double flops, double bytes)
{
    char buf[360];
    snprintf(buf, sizeof buf,
             "%s{\"what\":\"%s\",\"us\":%.2f,\"tflops\":%.1f,\"bytes\":%.0f,\"gbps\":%.1f}",
             t_times.empty() ? "" : ",", what, s * 1e6, flops / s / 1e12, bytes,
             bytes / s / 1e9);
    t_times += buf;
}

/* Times call in each run ("what v1 promote", "what v1 bf16x", ..., "what v5 bf16x"). */
template <class F>
static void time_forms(const char *what, F call, double flops, double bytes, int grouped)
{
    for (int f = 0; f < RUNS; f++) {
        if (form_split[f % FORMS] == 1)
            continue; /* the split form is not used */
        char buf[160];
        snprintf(buf, sizeof buf, "%s v%d %s", what, run_version[f / FORMS],
                 form_name[f % FORMS]);
        set_version(run_version[f / FORMS]);
        kl_gpu_gemm_split_set(form_split[f % FORMS]);
        time_record(buf, t_median_s(call, 11), flops, bytes);
    }
    kl_gpu_gemm_tiles_set(0, 0);
    kl_gpu_gemm_split_set(2);
}

/* ---- dense ------------------------------------------------------------------------------- */

/* Version 5 from parts split by an earlier call (parts_ready): bit-equal to splitting anew
 * (want: the version 5 promote run), and the parts really read (x poisoned meanwhile). */
static void check_parts_ready(const kl_gpu_mat &d, float *dx, uint32_t n, float *dy,
                              uint16_t *parts, const std::vector<float> &want, const char *what)
{
    kl_err err;
    kl_err_clear(&err);
    set_version(5);
    if (!kl_gpu_gemm_uses_parts(&d, parts)) { /* K not in whole steps: version 1 runs */
        kl_gpu_gemm_tiles_set(0, 0);
        return;
    }
    t_ok(kl_gpu_gemm_p(&d, dx, n, dy, parts, 0, NULL, &err), &err, "kl_gpu_gemm_p");
    T_CHECK(hipMemset(dx, 0xff, (size_t)n * d.cols * 4));
    T_CHECK(hipMemset(dy, 0xff, (size_t)n * d.rows * 4));
    t_ok(kl_gpu_gemm_p(&d, dx, n, dy, parts, 1, NULL, &err), &err, "kl_gpu_gemm_p ready");
    const std::vector<float> got = t_download(dy, (size_t)n * d.rows);
    kl_gpu_gemm_tiles_set(0, 0);
    char buf[160];
    snprintf(buf, sizeof buf, "%s v5 parts_ready bit-equal", what);
    t_check(buf, memcmp(got.data(), want.data(), got.size() * 4) != 0, 0);
}

static void check_dense(kl_gpu_wkind kind, size_t rows, size_t cols, const uint32_t *ns,
                        size_t n_ns, int timed)
{
    const t_mat m = t_mat_random(kind, rows, cols);
    const kl_gpu_mat d = t_mat_upload(m);
    kl_err err;
    kl_err_clear(&err);
    for (size_t k = 0; k < n_ns; k++) {
        const uint32_t n = ns[k];
        std::vector<float> x = t_vec((size_t)n * cols);
        float *dx = t_upload(x), *dy = (float *)t_alloc((size_t)n * rows * 4);
        uint16_t *parts = (uint16_t *)t_alloc(kl_gpu_gemm_parts_bytes(n, (uint32_t)cols));
        std::vector<float> y[RUNS];
        run_forms([&] { t_ok(kl_gpu_gemm_p(&d, dx, n, dy, parts, 0, NULL, &err), &err,
                             "kl_gpu_gemm_p"); },
                  dy, (size_t)n * rows, y);
        std::vector<size_t> src(n), wbase(n, 0);
        for (uint32_t t = 0; t < n; t++)
            src[t] = t;
        double e[RUNS][2];
        rows_error(m, rows, src, wbase, x, y, e);
        char what[96];
        snprintf(what, sizeof what, "gemm %s %zux%zu n=%u", t_kind_name(kind), rows, cols, n);
        check_forms(what, e);
        if (timed && n >= 256) {
            auto call = [&](int, kl_gpu_stream st) {
                kl_gpu_gemm_p(&d, dx, n, dy, parts, 0, st, &err);
            };
            const double bytes = (double)t_mat_bytes(m) + 4.0 * n * (rows + cols);
            time_forms(what, call, 2.0 * n * rows * cols, bytes, 0);
        }
        if (k == 0) /* last: it poisons dx */
            check_parts_ready(d, dx, n, dy, parts, y[RUN_V5_PROMOTE], what);
        hipFree(dx);
        hipFree(dy);
        hipFree(parts);
    }
    t_mat_free(d);
}

/* ---- grouped ----------------------------------------------------------------------------- */

/* E experts [R, K] of one kind, segment sizes sz (m = their sum), x of n_x tokens; x_row
 * random tokens, or NULL (x has m rows then).  Checked, and timed when timed. */
static void check_grouped(kl_gpu_wkind kind, uint32_t E, size_t R, size_t K,
                          const std::vector<uint32_t> &sz, uint32_t n_x, int use_x_row,
                          int timed)
{
    const t_mat m = t_mat_random(kind, (size_t)E * R, K);
    kl_gpu_stack st;
    st.m = t_mat_upload(m);
    st.m.rows = (uint32_t)R;
    st.n = E;
    std::vector<uint32_t> seg(E + 1, 0);
    for (uint32_t e = 0; e < E; e++)
        seg[e + 1] = seg[e] + sz[e];
    const uint32_t rows = seg[E];
    const uint32_t nx = use_x_row ? n_x : rows;
    std::vector<uint32_t> xr(rows ? rows : 1);
    for (auto &v : xr)
        v = t_u32() % nx;
    std::vector<float> x = t_vec((size_t)nx * K);
    float *dx = t_upload(x), *dy = (float *)t_alloc((size_t)rows * R * 4 + 16);
    uint32_t *dseg = t_upload(seg), *dxr = t_upload(xr);
    uint16_t *parts = (uint16_t *)t_alloc(kl_gpu_gemm_parts_bytes(rows + 3, (uint32_t)K) + 16);
    kl_gpu_gemm_grouped_args a = {&st, dx, use_x_row ? dxr : NULL, dseg, rows + 3, dy, parts, 0};
    kl_err err;
    kl_err_clear(&err);
    std::vector<float> y[RUNS];
    run_forms([&] { t_ok(kl_gpu_gemm_grouped(&a, NULL, &err), &err, "kl_gpu_gemm_grouped"); },
              dy, (size_t)rows * R, y);
    std::vector<size_t> src(rows), wbase(rows);
    uint32_t nonempty = 0;
    for (uint32_t e = 0; e < E; e++) {
        nonempty += sz[e] > 0;
        for (uint32_t i = seg[e]; i < seg[e + 1]; i++) {
            src[i] = use_x_row ? xr[i] : i;
            wbase[i] = (size_t)e * R;
        }
    }
    double e[RUNS][2];
    rows_error(m, R, src, wbase, x, y, e);
    char what[128];
    snprintf(what, sizeof what, "grouped %s E=%u %zux%zu m=%u%s", t_kind_name(kind), E, R, K,
             rows, use_x_row ? "" : " x_row NULL");
    check_forms(what, e);
    if (timed) {
        auto call = [&](int, kl_gpu_stream s) { kl_gpu_gemm_grouped(&a, s, &err); };
        const double bytes = (double)t_mat_bytes(m) / E * nonempty + 4.0 * rows * (R + K);
        time_forms(what, call, 2.0 * rows * R * K, bytes, 1);
    }
    hipFree(dx);
    hipFree(dy);
    hipFree(dseg);
    hipFree(dxr);
    hipFree(parts);
    t_mat_free(st.m);
}

/* Segment sizes of m slots each on a random expert of E (as the router spreads them). */
static std::vector<uint32_t> random_sizes(uint32_t E, uint32_t m)
{
    std::vector<uint32_t> sz(E, 0);
    for (uint32_t i = 0; i < m; i++)
        sz[t_u32() % E]++;
    return sz;
}

static void check_refusals(void)
{
    kl_err err;
    kl_err_clear(&err);
    const t_mat m = t_mat_random(KL_GPU_W_F32, 64, 64);
    kl_gpu_mat d = t_mat_upload(m);
    float *dx = t_upload(t_vec(64 * 16)), *dy = (float *)t_alloc(64 * 16 * 4);
    t_check("gemm refuses F32", kl_gpu_gemm(&d, dx, 16, dy, NULL, &err) != KL_E_USAGE, 0);
    d.kind = KL_GPU_W_BF16;
    d.cols = 48;
    t_check("gemm refuses cols 48", kl_gpu_gemm(&d, dx, 16, dy, NULL, &err) != KL_E_USAGE, 0);
    d.cols = 64;
    t_check("gemm refuses x unaligned",
            kl_gpu_gemm(&d, dx + 1, 16, dy, NULL, &err) != KL_E_USAGE, 0);
    t_mat_free(d);
    hipFree(dx);
    hipFree(dy);
}

int main(void)
{
    if (!t_have_gpu("test_gemm"))
        return 77;
    const double copy = t_copy_gbps();
    check_refusals();
    static const uint32_t ns[] = {16, 37, 64, 256, 512, 1024}, small_n[] = {16, 37, 70};
    static const size_t shapes[4][2] = {{4096, 2304}, {2304, 4096}, {12576, 2304}, {1024, 2304}};
    for (kl_gpu_wkind kind : {KL_GPU_W_BF16, KL_GPU_W_MXFP4}) {
        check_dense(kind, 200, 96, small_n, 3, 0);  /* a row tail and a K tail (v1 only) */
        check_dense(kind, 200, 128, small_n, 3, 0); /* row and token tails of v5 */
        for (const auto &s : shapes)
            check_dense(kind, s[0], s[1], ns, 6, 1);
        /* small stacks: empty segments, one over a tile (150 rows), a row and a K tail */
        const std::vector<uint32_t> sz = {3, 0, 150, 1, 0, 17, 64, 0, 65, 2};
        check_grouped(kind, 10, 288, 160, sz, 40, 1, 0);
        check_grouped(kind, 10, 288, 160, sz, 0, 0, 0);
        check_grouped(kind, 10, 288, 384, sz, 40, 1, 0); /* K in steps of 128: v5 takes it */
        check_grouped(kind, 10, 288, 384, sz, 0, 0, 0);
        check_grouped(kind, 4, 96, 64, {0, 0, 0, 0}, 8, 1, 0); /* no rows at all */
    }
    /* a layer's routed experts for 256, 512 and 1,024 tokens, top 8: gate/up, then down */
    for (uint32_t n : {256u, 512u, 1024u}) {
        check_grouped(KL_GPU_W_MXFP4, 256, 1024, 2304, random_sizes(256, 8 * n), n, 1, 1);
        check_grouped(KL_GPU_W_MXFP4, 256, 2304, 1024, random_sizes(256, 8 * n), 0, 0, 1);
    }
    check_grouped(KL_GPU_W_BF16, 64, 1024, 2304, random_sizes(64, 2048), 256, 1, 1);
    /* a prefill chunk of 4,096 tokens: the dense q/k/v shape and the routed experts */
    static const uint32_t chunk[] = {4096};
    check_dense(KL_GPU_W_BF16, 4096, 2304, chunk, 1, 1);
    check_grouped(KL_GPU_W_MXFP4, 256, 1024, 2304, random_sizes(256, 8 * 4096), 4096, 1, 1);
    check_grouped(KL_GPU_W_MXFP4, 256, 2304, 1024, random_sizes(256, 8 * 4096), 0, 0, 1);
    return t_report("gemm", copy);
}
