/*
 * tests/gpu/test_dense.cu — kernels/dense.h against host references computed here (double):
 * kl_gpu_matmul for every weight kind at tiny odd shapes and at Kimi-Linear's real shapes
 * (n = 1 and n = 5), kl_gpu_matmul_glu, kl_gpu_matmul_pair, kl_gpu_embed, kl_gpu_add_rmsnorm
 * (and kl_gpu_sum_add_rmsnorm against the adds it replaces: bit for bit), kl_gpu_add,
 * kl_gpu_silu_mul and kl_gpu_argmax (ties, NaN), plus the launchers' refusals; MXFP4 and BF16 at n = 1 with both kernel
 * versions (2 and round 1's).  Then the n = 1 products timed with events
 * (median of 25 single calls, weights rotated over copies so the L2 cannot hold them) beside
 * a device-to-device copy measured in the same run.  One JSON line; exit 0 pass, 1 fail,
 * 77 no GPU.
 */
#include "kernels/dense.h"

extern "C" {
#include "engine/sampler.h" /* kl_sample_argmax: the rule kl_gpu_argmax follows */
}
#include "tests/gpu/gpu_testutil.h"

#define TOL 1e-5 /* relative L2 of fp32 sums over exactly representable weights */

/* ---- matmul ------------------------------------------------------------------------------ */

/* " v1", " v2" or " v3": the kernel version kl_gpu_matmul uses now for kind (F32: ""). */
static const char *version_tag(kl_gpu_wkind kind)
{
    static char tag[32];
    const int v = kind == KL_GPU_W_MXFP4 ? kl_gpu_version(KL_GPU_K_MX)
                  : kind == KL_GPU_W_BF16 ? kl_gpu_version(KL_GPU_K_BF16) : 0;
    if (v)
        snprintf(tag, sizeof tag, " v%d", v);
    else
        tag[0] = 0;
    return tag;
}

/* The largest over the n tokens of the relative L2 error of Y = X Wᵀ, rows r % step == 0
 * checked; x starts x_off floats into its buffer (1: not 16-byte aligned). */
static double matmul_error(const t_mat &m, const kl_gpu_mat &d, uint32_t n, size_t step,
                           size_t x_off)
{
    std::vector<float> x = t_vec(n * m.cols + x_off);
    float *dx = t_upload(x), *dy = (float *)t_alloc(n * m.rows * sizeof(float));
    T_CHECK(hipMemset(dy, 0xff, n * m.rows * sizeof(float))); /* NaN: unwritten shows */
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_matmul(&d, dx + x_off, n, dy, NULL, &err), &err, "kl_gpu_matmul");
    std::vector<float> y = t_download(dy, n * m.rows), w(m.cols), got;
    std::vector<std::vector<double>> ref(n);
    std::vector<std::vector<float>> gy(n);
    for (size_t r = 0; r < m.rows; r += step) {
        t_mat_row(m, r, w.data());
        for (uint32_t t = 0; t < n; t++) {
            double s = 0;
            for (size_t c = 0; c < m.cols; c++)
                s += (double)w[c] * x[x_off + t * m.cols + c];
            ref[t].push_back(s);
            gy[t].push_back(y[t * m.rows + r]);
        }
    }
    double worst = 0;
    for (uint32_t t = 0; t < n; t++) {
        const double e = t_rel_l2(gy[t].data(), ref[t].data(), ref[t].size());
        worst = e > worst || e != e ? e : worst;
    }
    hipFree(dx);
    hipFree(dy);
    return worst;
}

static void check_matmul(kl_gpu_wkind kind, size_t rows, size_t cols, const uint32_t *ns,
                         size_t n_ns, size_t step, size_t x_off)
{
    const t_mat m = t_mat_random(kind, rows, cols);
    const kl_gpu_mat d = t_mat_upload(m);
    for (size_t i = 0; i < n_ns; i++) {
        char what[96];
        snprintf(what, sizeof what, "matmul %s %zux%zu n=%u%s%s", t_kind_name(kind), rows, cols,
                 ns[i], x_off ? " x unaligned" : "",
                 version_tag(kind));
        t_check(what, matmul_error(m, d, ns[i], step, x_off), TOL);
    }
}

/* Median time of y = W x (n tokens) over weights rotated among copies of >= 512 MB in all. */
static void time_matmul(kl_gpu_wkind kind, size_t rows, size_t cols, uint32_t n,
                        double copy_gbps)
{
    const t_mat m = t_mat_random(kind, rows, cols);
    const size_t bytes = t_mat_bytes(m);
    const std::vector<kl_gpu_mat> w = t_mat_rotation(m);
    const size_t copies = w.size();
    float *dx = t_upload(t_vec(n * cols)), *dy = (float *)t_alloc(n * rows * sizeof(float));
    kl_err err;
    kl_err_clear(&err);
    auto call = [&](int i, kl_gpu_stream st) {
        t_ok(kl_gpu_matmul(&w[i % copies], dx, n, dy, st, &err), &err, "kl_gpu_matmul");
    };
    const double s1 = t_median_s(call, 25), sg = t_graph_s(call, 32);
    char what[96];
    snprintf(what, sizeof what, "matmul %s %zux%zu n=%u%s", t_kind_name(kind), rows, cols, n,
             version_tag(kind));
    t_time(what, s1, sg, bytes, copy_gbps);
    T_CHECK(hipDeviceSynchronize());
    hipFree(dx);
    hipFree(dy);
    for (auto &c : w)
        t_mat_free(c);
}

static void test_matmul(void)
{
    static const uint32_t tiny_n[] = {1, 3, 5, 9}, real_n[] = {1, 5};
    /* tiny: the 16-byte paths (cols 32, 64), the plain path (cols 37, or x unaligned) */
    for (kl_gpu_wkind k : {KL_GPU_W_F32, KL_GPU_W_BF16, KL_GPU_W_MXFP4}) {
        check_matmul(k, 3, 32, tiny_n, 4, 1, 0);
        check_matmul(k, 3, 64, tiny_n, 4, 1, 0);
        check_matmul(k, 17, 96, tiny_n, 4, 1, 0);
        if (k != KL_GPU_W_MXFP4) {
            check_matmul(k, 3, 37, tiny_n, 4, 1, 0);
            check_matmul(k, 5, 64, tiny_n, 4, 1, 1);
        }
    }
    /* the projections, dense MLP, fused input products and lm_head of Kimi-Linear (lm_head
     * rows sampled); BF16 at n = 1 with every kernel version (3, 2 and 1: KL_GPU_BF16=vN) */
    static const size_t shapes[][2] = {{4096, 2304},  {2304, 4096}, {128, 2304},
                                       {8192, 512},   {9216, 2304}, {2304, 9216},
                                       {12576, 2304}, {6720, 2304}, {2304, 2304},
                                       {2056, 808},   {163840, 2304}, {1028, 2304},
                                       {516, 1152}};
    for (int v = 3; v >= 1; v--) {
        kl_gpu_version_set(KL_GPU_K_BF16, v);
        for (const auto &sh : shapes)
            check_matmul(KL_GPU_W_BF16, sh[0], sh[1], real_n, 2, sh[0] > 10000 ? 41 : 1, 0);
    }
    /* MXFP4: the routed experts' shapes, and matrices of many rows (version 2 at n = 1, odd
     * row counts: the last chunk partial; 800 columns: 25 blocks, a second round per lane) */
    for (int v = 2; v >= 1; v--) {
        kl_gpu_version_set(KL_GPU_K_MX, v);
        check_matmul(KL_GPU_W_MXFP4, 3072, 2304, real_n, 2, 1, 0);
        check_matmul(KL_GPU_W_MXFP4, 2304, 1024, real_n, 2, 1, 0);
        check_matmul(KL_GPU_W_MXFP4, 32768 + 37, 2304, real_n, 2, 7, 0);
        check_matmul(KL_GPU_W_MXFP4, 65536 + 3, 800, real_n, 2, 5, 0);
        check_matmul(KL_GPU_W_MXFP4, 32768, 8192, real_n, 2, 61, 0);
    }
    check_matmul(KL_GPU_W_F32, 1000, 2304, real_n, 2, 1, 0);
}

/* The launchers refuse what they cannot do, before any work. */
static void test_refusals(void)
{
    kl_err err;
    kl_gpu_mat m = t_mat_upload(t_mat_random(KL_GPU_W_MXFP4, 4, 64));
    float *x = (float *)t_alloc(4096), *y = (float *)t_alloc(4096);
    kl_err_clear(&err);
    int bad_cols, bad_align, bad_kind, alias;
    m.cols = 48;
    bad_cols = kl_gpu_matmul(&m, x, 1, y, NULL, &err) == KL_E_USAGE;
    m.cols = 64;
    kl_err_clear(&err);
    bad_align = kl_gpu_matmul(&m, x + 1, 1, y, NULL, &err) == KL_E_USAGE;
    kl_err_clear(&err);
    bad_kind = kl_gpu_embed(&m, 0, 0, (const uint32_t *)x, 1, y, NULL, &err) == KL_E_USAGE;
    kl_err_clear(&err);
    alias = kl_gpu_add_rmsnorm(x, NULL, y, 1, 8, 1e-6f, x, NULL, &err) == KL_E_USAGE;
    kl_err_clear(&err);
    const float *many[KL_GPU_SUM_MAX + 1];
    for (auto &p : many)
        p = y;
    const int too_many = kl_gpu_sum_add_rmsnorm(x, many, KL_GPU_SUM_MAX + 1, y, 1, 8, 1e-6f,
                                                x + 64, NULL, &err) == KL_E_USAGE;
    t_check("refuses mxfp4 cols 48", !bad_cols, 0);
    t_check("refuses mxfp4 x unaligned", !bad_align, 0);
    t_check("refuses mxfp4 embed", !bad_kind, 0);
    t_check("refuses xn aliasing x", !alias, 0);
    t_check("refuses more than KL_GPU_SUM_MAX buffers to add", !too_many, 0);
}

/* ---- embed, add_rmsnorm, silu_mul, argmax ------------------------------------------------ */

static void check_embed(kl_gpu_wkind kind, size_t rows, size_t cols)
{
    const t_mat m = t_mat_random(kind, rows, cols);
    const kl_gpu_mat d = t_mat_upload(m);
    const std::vector<uint32_t> ids = {3, 0, (uint32_t)rows - 1, 3, (uint32_t)rows};
    uint32_t *di = t_upload(ids);
    float *dx = (float *)t_alloc(ids.size() * cols * sizeof(float));
    kl_err err;
    kl_err_clear(&err);
    /* the whole table (outside: NaN), then as the vocabulary part from row 1 (outside: 0) */
    for (uint32_t row0 = 0; row0 < 2; row0++) {
        t_ok(kl_gpu_embed(&d, row0, row0, di, (uint32_t)ids.size(), dx, NULL, &err), &err,
             "kl_gpu_embed");
        std::vector<float> x = t_download(dx, ids.size() * cols), w(cols);
        double bad = 0;
        for (size_t t = 0; t < ids.size(); t++) {
            const uint32_t r = ids[t] - row0;
            if (r < rows)
                t_mat_row(m, r, w.data());
            for (size_t c = 0; c < cols; c++)
                bad += r < rows ? memcmp(&w[c], &x[t * cols + c], 4) != 0
                      : row0    ? x[t * cols + c] != 0.0f
                                : !isnan(x[t * cols + c]);
        }
        char what[80];
        snprintf(what, sizeof what, "embed %s %zux%zu from row %u (wrong values)",
                 t_kind_name(kind), rows, cols, row0);
        t_check(what, bad, 0);
    }
}

static void check_add_rmsnorm(uint32_t n, uint32_t h, int with_y)
{
    const float eps = 1e-6f;
    std::vector<float> x = t_vec((size_t)n * h), y = t_vec((size_t)n * h), w = t_vec(h);
    float *dx = t_upload(x), *dy = t_upload(y), *dw = t_upload(w);
    float *dn = (float *)t_alloc((size_t)n * h * sizeof(float));
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_add_rmsnorm(dx, with_y ? dy : NULL, dw, n, h, eps, dn, NULL, &err), &err,
         "kl_gpu_add_rmsnorm");
    std::vector<float> gx = t_download(dx, (size_t)n * h), gn = t_download(dn, (size_t)n * h);
    double worst = 0, x_bad = 0;
    for (uint32_t t = 0; t < n; t++) {
        std::vector<double> ref(h);
        double ss = 0;
        for (uint32_t i = 0; i < h; i++) {
            const float v = with_y ? x[t * h + i] + y[t * h + i] : x[t * h + i];
            x_bad += memcmp(&v, &gx[t * h + i], 4) != 0;
            ss += (double)v * v;
        }
        const double inv = 1.0 / sqrt(ss / h + eps);
        for (uint32_t i = 0; i < h; i++)
            ref[i] = (double)w[i] * gx[t * h + i] * inv;
        worst = std::max(worst, t_rel_l2(&gn[t * h], ref.data(), h));
    }
    char what[96];
    snprintf(what, sizeof what, "add_rmsnorm n=%u h=%u y=%d", n, h, with_y);
    t_check(what, worst, TOL);
    snprintf(what, sizeof what, "add_rmsnorm n=%u h=%u y=%d (x != x + y)", n, h, with_y);
    t_check(what, x_bad, 0);
}

/* kl_gpu_matmul_norm (one token, BF16 [rows, cols]) against kl_gpu_add_rmsnorm then
 * kl_gpu_matmul: x_out is x + r bit for bit, xn_out and y agree to the norm's sum order
 * (~1 ulp); with copy_gbps, both forms timed in a graph. */
static void check_matmul_norm(size_t rows, size_t cols, double copy_gbps)
{
    const float eps = 1e-6f;
    const t_mat m = t_mat_random(KL_GPU_W_BF16, rows, cols);
    const kl_gpu_mat d = t_mat_upload(m);
    std::vector<float> x = t_vec(cols), r = t_vec(cols), w = t_vec(cols);
    float *dx = t_upload(x), *dr = t_upload(r), *dw = t_upload(w), *dx2 = t_upload(x);
    float *dxo = (float *)t_alloc(cols * 4), *dn = (float *)t_alloc(cols * 4);
    float *dn2 = (float *)t_alloc(cols * 4), *dy = (float *)t_alloc(rows * 4);
    float *dy2 = (float *)t_alloc(rows * 4);
    kl_err err;
    kl_err_clear(&err);
    t_check("matmul_norm takes the one-token BF16 shapes",
            !kl_gpu_matmul_norm_takes(&d, dx, dr, dw, dxo, dn), 0);
    t_check("matmul_norm refuses x_out == x", kl_gpu_matmul_norm_takes(&d, dx, dr, dw, dx, dn),
            0);
    auto fused = [&](int, kl_gpu_stream st) {
        t_ok(kl_gpu_matmul_norm(&d, dx, dr, dw, eps, dxo, dn, dy, st, &err), &err,
             "kl_gpu_matmul_norm");
    };
    auto apart = [&](int, kl_gpu_stream st) {   /* dx2 grows by r each call: only timed */
        t_ok(kl_gpu_add_rmsnorm(dx2, dr, dw, 1, (uint32_t)cols, eps, dn2, st, &err), &err,
             "kl_gpu_add_rmsnorm");
        t_ok(kl_gpu_matmul(&d, dn2, 1, dy2, st, &err), &err, "kl_gpu_matmul");
    };
    fused(0, NULL);
    apart(0, NULL);
    std::vector<float> xo = t_download(dxo, cols), n1 = t_download(dn, cols);
    std::vector<float> n2 = t_download(dn2, cols), y1 = t_download(dy, rows);
    std::vector<float> y2 = t_download(dy2, rows);
    double x_bad = 0;
    for (size_t i = 0; i < cols; i++) {
        const float v = x[i] + r[i];
        x_bad += memcmp(&v, &xo[i], 4) != 0;
    }
    const std::vector<double> n2d(n2.begin(), n2.end()), y2d(y2.begin(), y2.end());
    char what[96];
    snprintf(what, sizeof what, "matmul_norm %zux%zu (x_out != x + r)", rows, cols);
    t_check(what, x_bad, 0);
    snprintf(what, sizeof what, "matmul_norm %zux%zu xn vs add_rmsnorm", rows, cols);
    t_check(what, t_rel_l2(n1.data(), n2d.data(), cols), 1e-6);
    snprintf(what, sizeof what, "matmul_norm %zux%zu y vs add_rmsnorm + matmul", rows, cols);
    t_check(what, t_rel_l2(y1.data(), y2d.data(), rows), 1e-6);
    if (copy_gbps > 0) {
        const size_t bytes = rows * cols * 2;
        snprintf(what, sizeof what, "add_rmsnorm + matmul bf16 %zux%zu n=1, in one launch",
                 rows, cols);
        t_time(what, t_median_s(fused, 25), t_graph_s(fused, 32), bytes, copy_gbps);
        snprintf(what, sizeof what, "add_rmsnorm + matmul bf16 %zux%zu n=1, two launches",
                 rows, cols);
        t_time(what, t_median_s(apart, 25), t_graph_s(apart, 32), bytes, copy_gbps);
    }
    for (void *p : {(void *)dx, (void *)dr, (void *)dw, (void *)dx2, (void *)dxo, (void *)dn,
                    (void *)dn2, (void *)dy, (void *)dy2})
        hipFree(p);
    t_mat_free(d);
}

/* kl_gpu_sum_add_rmsnorm of ny buffers against their sum made first (kl_gpu_add in order)
 * and then kl_gpu_add_rmsnorm: x and xn bit for bit (the tensor-parallel norm's promise). */
static void check_sum_add_rmsnorm(uint32_t n, uint32_t h, unsigned ny)
{
    const size_t len = (size_t)n * h;
    const std::vector<float> x = t_vec(len), w = t_vec(h);
    const float *ys[KL_GPU_SUM_MAX];
    for (unsigned k = 0; k < ny; k++)
        ys[k] = t_upload(t_vec(len));
    float *xa = t_upload(x), *xb = t_upload(x), *dw = t_upload(w), *sum = t_upload(x);
    float *na = (float *)t_alloc(len * sizeof(float)), *nb = (float *)t_alloc(len * sizeof(float));
    kl_err err;
    kl_err_clear(&err);
    T_CHECK(hipMemcpy(sum, ys[0], len * sizeof(float), hipMemcpyDeviceToDevice));
    for (unsigned k = 1; k < ny; k++)
        t_ok(kl_gpu_add(sum, ys[k], len, NULL, &err), &err, "kl_gpu_add");
    t_ok(kl_gpu_add_rmsnorm(xa, sum, dw, n, h, 1e-6f, na, NULL, &err), &err, "add_rmsnorm");
    t_ok(kl_gpu_sum_add_rmsnorm(xb, ys, ny, dw, n, h, 1e-6f, nb, NULL, &err), &err,
         "kl_gpu_sum_add_rmsnorm");
    const std::vector<float> ga = t_download(xa, len), gb = t_download(xb, len);
    const std::vector<float> ma = t_download(na, len), mb = t_download(nb, len);
    char what[96];
    snprintf(what, sizeof what, "sum_add_rmsnorm n=%u h=%u of %u (x, xn not bitwise)", n, h, ny);
    t_check(what, (double)(memcmp(ga.data(), gb.data(), len * 4) != 0) +
                      (memcmp(ma.data(), mb.data(), len * 4) != 0), 0);
    for (unsigned k = 0; k < ny; k++)
        hipFree((void *)ys[k]);
    for (float *p : {xa, xb, dw, sum, na, nb})
        hipFree(p);
}

/* kl_gpu_add against the host's fp32 adds: bit for bit. */
static void check_add(size_t count)
{
    std::vector<float> x = t_vec(count), y = t_vec(count);
    float *dx = t_upload(x), *dy = t_upload(y);
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_add(dx, dy, count, NULL, &err), &err, "kl_gpu_add");
    std::vector<float> g = t_download(dx, count);
    double wrong = 0;
    for (size_t i = 0; i < count; i++)
        wrong += g[i] != x[i] + y[i];
    t_check("add 1000003 (values not the host's fp32 sum)", wrong, 0);
    hipFree(dx);
    hipFree(dy);
}

static void check_silu_mul(size_t count)
{
    std::vector<float> a = t_vec(count), b = t_vec(count);
    for (auto &v : a)
        v *= 8.0f;
    float *da = t_upload(a), *db = t_upload(b);
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_silu_mul(da, db, count, NULL, &err), &err, "kl_gpu_silu_mul");
    std::vector<float> g = t_download(da, count);
    std::vector<double> ref(count);
    for (size_t i = 0; i < count; i++)
        ref[i] = a[i] / (1.0 + exp(-(double)a[i])) * b[i];
    t_check("silu_mul 1000003", t_rel_l2(g.data(), ref.data(), count), TOL);
}

/* kl_gpu_matmul_glu: y = (SiLU(a) ⊙ b) Wᵀ for n tokens (n = 1: the fused one-token kernel;
 * else SiLU into a, then the product), BF16 and F32, against a host reference. */
static void check_glu(kl_gpu_wkind kind, size_t rows, size_t cols, uint32_t n)
{
    const t_mat m = t_mat_random(kind, rows, cols);
    const kl_gpu_mat d = t_mat_upload(m);
    std::vector<float> a = t_vec(n * cols), b = t_vec(n * cols), w(cols);
    for (auto &v : a)
        v *= 8.0f;
    float *da = t_upload(a), *db = t_upload(b), *dy = (float *)t_alloc(n * rows * sizeof(float));
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_matmul_glu(&d, da, db, n, dy, NULL, &err), &err, "kl_gpu_matmul_glu");
    std::vector<float> y = t_download(dy, n * rows);
    std::vector<double> ref(n * rows);
    for (size_t r = 0; r < rows; r++) {
        t_mat_row(m, r, w.data());
        for (uint32_t t = 0; t < n; t++) {
            double s = 0;
            for (size_t c = 0; c < cols; c++) {
                const double z = a[t * cols + c];
                s += (double)w[c] * (z / (1.0 + exp(-z)) * b[t * cols + c]);
            }
            ref[t * rows + r] = s;
        }
    }
    char what[96];
    snprintf(what, sizeof what, "matmul_glu %s %zux%zu n=%u", t_kind_name(kind), rows, cols, n);
    t_check(what, t_rel_l2(y.data(), ref.data(), n * rows), TOL);
    hipFree(da);
    hipFree(db);
    hipFree(dy);
    t_mat_free(d);
}

/* The host reference of y = x Wᵀ for n tokens (double). */
static std::vector<double> host_product(const t_mat &m, const std::vector<float> &x, uint32_t n)
{
    std::vector<double> ref(n * m.rows);
    std::vector<float> w(m.cols);
    for (size_t r = 0; r < m.rows; r++) {
        t_mat_row(m, r, w.data());
        for (uint32_t t = 0; t < n; t++) {
            double s = 0;
            for (size_t c = 0; c < m.cols; c++)
                s += (double)w[c] * x[t * m.cols + c];
            ref[t * m.rows + r] = s;
        }
    }
    return ref;
}

/* kl_gpu_matmul_pair: two products in one launch (KDA's f_b and g_b: [4096, 128] BF16) and
 * the fallback (shapes of different layouts, n = 3), each against the host. */
static void check_pair(size_t rows_a, size_t rows_b, size_t cols, uint32_t n)
{
    const t_mat ma = t_mat_random(KL_GPU_W_BF16, rows_a, cols);
    const t_mat mb = t_mat_random(KL_GPU_W_BF16, rows_b, cols);
    const kl_gpu_mat da = t_mat_upload(ma), db = t_mat_upload(mb);
    std::vector<float> xa = t_vec(n * cols), xb = t_vec(n * cols);
    float *dxa = t_upload(xa), *dxb = t_upload(xb);
    float *dya = (float *)t_alloc(n * rows_a * sizeof(float));
    float *dyb = (float *)t_alloc(n * rows_b * sizeof(float));
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_matmul_pair(&da, dxa, dya, &db, dxb, dyb, n, NULL, &err), &err,
         "kl_gpu_matmul_pair");
    const std::vector<float> ya = t_download(dya, n * rows_a), yb = t_download(dyb, n * rows_b);
    const std::vector<double> ra = host_product(ma, xa, n), rb = host_product(mb, xb, n);
    char what[96];
    snprintf(what, sizeof what, "matmul_pair bf16 %zux%zu + %zux%zu n=%u (first)", rows_a, cols,
             rows_b, cols, n);
    t_check(what, t_rel_l2(ya.data(), ra.data(), ra.size()), TOL);
    snprintf(what, sizeof what, "matmul_pair bf16 %zux%zu + %zux%zu n=%u (second)", rows_a,
             cols, rows_b, cols, n);
    t_check(what, t_rel_l2(yb.data(), rb.data(), rb.size()), TOL);
    for (float *p : {dxa, dxb, dya, dyb})
        hipFree(p);
    t_mat_free(da);
    t_mat_free(db);
}

/* Values of a and b [n] that differ to the bit. */
static double bits_differ(const std::vector<float> &a, const std::vector<float> &b)
{
    double n = 0;
    for (size_t i = 0; i < a.size(); i++)
        n += memcmp(&a[i], &b[i], 4) != 0;
    return n;
}

/* kl_gpu_matmul_chain (version 3): a block's output product [ra, ca], the residual add and
 * norm, and the next block's first product [rb, ra] in one launch, against the same made by
 * kl_gpu_matmul and kl_gpu_matmul_norm: every output equal to the bit, once and after 32
 * chains in a graph with programmatic edges (the grid barrier's counter across launches);
 * with copy_gbps, both timed there, the weights rotated over >= 512 MB. */
static void check_chain(size_t ra, size_t ca, size_t rb, double copy_gbps)
{
    const float eps = 1e-6f;
    const t_mat ma = t_mat_random(KL_GPU_W_BF16, ra, ca), mb = t_mat_random(KL_GPU_W_BF16, rb, ra);
    const std::vector<kl_gpu_mat> wa = t_mat_rotation(ma), wb = t_mat_rotation(mb);
    float *xa = t_upload(t_vec(ca)), *r = t_upload(t_vec(ra)), *nw = t_upload(t_vec(ra));
    float *out[2][4]; /* [chain, apart][ya, x_out, xn_out, yb] */
    for (auto &o : out)
        for (int i = 0; i < 4; i++)
            o[i] = (float *)t_alloc((i == 3 ? rb : ra) * 4);
    kl_err err;
    kl_err_clear(&err);
    char what[128];
    snprintf(what, sizeof what, "matmul_chain %zux%zu then %zux%zu: taken", ra, ca, rb, ra);
    t_check(what, !kl_gpu_matmul_chain_takes(&wa[0], xa, &wb[0], r, nw, out[0][1], out[0][2]),
            0);
    auto chain = [&](int i, kl_gpu_stream st) {
        float *const *o = out[0];
        t_ok(kl_gpu_matmul_chain(&wa[i % wa.size()], xa, o[0], r, nw, eps, o[1], o[2],
                                 &wb[i % wb.size()], o[3], st, &err), &err, "matmul_chain");
    };
    auto apart = [&](int i, kl_gpu_stream st) {
        float *const *o = out[1];
        t_ok(kl_gpu_matmul(&wa[i % wa.size()], xa, 1, o[0], st, &err), &err, "matmul");
        t_ok(kl_gpu_matmul_norm(&wb[i % wb.size()], r, o[0], nw, eps, o[1], o[2], o[3], st,
                                &err), &err, "matmul_norm");
    };
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0) {
            chain(0, NULL);
            apart(0, NULL);
        } else {
            T_CHECK(hipMemset(out[0][3], 0xff, rb * 4)); /* NaN: written again, or seen */
            const double s = t_pdl_graph_s(chain, 32);
            if (copy_gbps > 0) {
                const double bytes = (double)(ra * ca + rb * ra) * 2;
                snprintf(what, sizeof what, "matmul_chain %zux%zu then %zux%zu n=1, one launch",
                         ra, ca, rb, ra);
                t_time(what, t_median_s(chain, 25), s, bytes, copy_gbps);
                snprintf(what, sizeof what, "matmul %zux%zu + matmul_norm %zux%zu n=1, two "
                         "launches", ra, ca, rb, ra);
                t_time(what, t_median_s(apart, 25), t_pdl_graph_s(apart, 32), bytes, copy_gbps);
            }
        }
        static const char *const names[4] = {"ya", "x_out", "xn_out", "yb"};
        for (int i = 0; i < 4; i++) {
            const size_t n = i == 3 ? rb : ra;
            snprintf(what, sizeof what, "matmul_chain %zux%zu then %zux%zu %s%s (values that "
                     "differ)", ra, ca, rb, ra, names[i], pass ? " after a graph" : "");
            t_check(what, bits_differ(t_download(out[0][i], n), t_download(out[1][i], n)), 0);
        }
    }
    T_CHECK(hipDeviceSynchronize());
    for (auto &o : out)
        for (float *p : o)
            hipFree(p);
    for (float *p : {xa, r, nw})
        hipFree(p);
    for (const auto *w : {&wa, &wb})
        for (const auto &c : *w)
            t_mat_free(c);
}

/* A one-token product alone with its weights from DRAM (rotated over >= 512 MB) and from L2
 * (the same copy every call), in a graph with programmatic edges as the decode step runs:
 * what the kernel spends beyond its bytes (session 19: the output product [2304, 4096] takes
 * ~10 us from L2 against ~11.5 from DRAM, so it is not bound by DRAM). */
static void time_from_l2(size_t rows, size_t cols, double copy_gbps)
{
    const t_mat m = t_mat_random(KL_GPU_W_BF16, rows, cols);
    const std::vector<kl_gpu_mat> w = t_mat_rotation(m);
    float *x = t_upload(t_vec(cols)), *y = (float *)t_alloc(rows * sizeof(float));
    kl_err err;
    kl_err_clear(&err);
    for (int hot = 0; hot < 2; hot++) {
        auto call = [&](int i, kl_gpu_stream st) {
            t_ok(kl_gpu_matmul(&w[hot ? 0 : i % w.size()], x, 1, y, st, &err), &err, "matmul");
        };
        char what[128];
        snprintf(what, sizeof what, "matmul bf16 %zux%zu n=1%s, graph with programmatic "
                 "edges%s", rows, cols, version_tag(KL_GPU_W_BF16),
                 hot ? ", its weights in L2" : "");
        t_time(what, t_median_s(call, 25), t_pdl_graph_s(call, 32), t_mat_bytes(m), copy_gbps);
    }
    T_CHECK(hipDeviceSynchronize());
    hipFree(x);
    hipFree(y);
    for (const auto &c : w)
        t_mat_free(c);
}

/* Ties across parts (9 and 70001), NaNs, all NaN, all -inf, the last index; vocab 163841:
 * the scalar path (split in parts too by version 2). */
static void check_argmax(uint32_t vocab, int version, double copy_gbps)
{
    kl_gpu_version_set(KL_GPU_K_ARGMAX, version);
    const uint32_t n = 6;
    std::vector<float> l = t_vec((size_t)n * vocab);
    l[1 * vocab + 70001] = 3.0f; /* a tie: the lower index wins */
    l[1 * vocab + 9] = 3.0f;
    for (uint32_t i = 0; i < vocab; i += 7)
        l[2 * vocab + i] = NAN;
    l[2 * vocab + 5] = 2.0f; /* among NaNs */
    for (uint32_t i = 0; i < vocab; i++) {
        l[3 * vocab + i] = NAN;       /* all NaN: 0 */
        l[4 * vocab + i] = -INFINITY; /* all -inf: 0 */
    }
    l[4 * vocab + 0] = NAN;           /* ... and the first -inf is index 1 */
    l[5 * vocab + vocab - 1] = 5.0f;  /* the last index */
    float *dl = t_upload(l);
    uint32_t *dout = (uint32_t *)t_alloc(n * sizeof(uint32_t));
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_argmax(dl, n, vocab, dout, NULL, &err), &err, "kl_gpu_argmax");
    std::vector<uint32_t> got = t_download(dout, n);
    double wrong = 0;
    for (uint32_t t = 0; t < n; t++) {
        const uint32_t want = kl_sample_argmax(&l[(size_t)t * vocab], vocab);
        if (got[t] != want) {
            fprintf(stderr, "test_dense: argmax row %u: got %u, want %u\n", t, got[t], want);
            wrong++;
        }
    }
    char what[96];
    snprintf(what, sizeof what, "argmax 6 x %u (wrong rows) v%d", vocab, version);
    t_check(what, wrong, 0);
    if (copy_gbps <= 0)
        return;
    auto call = [&](int, kl_gpu_stream st) { kl_gpu_argmax(dl, 1, vocab, dout, st, &err); };
    snprintf(what, sizeof what, "argmax n=1 vocab=%u v%d", vocab, version);
    t_time(what, t_median_s(call, 25), t_graph_s(call, 32), vocab * 4.0, copy_gbps);
}

int main(void)
{
    if (!t_have_gpu("test_dense"))
        return 77;
    test_refusals();
    test_matmul();
    check_embed(KL_GPU_W_F32, 50, 37);
    check_embed(KL_GPU_W_BF16, 1000, 2304);
    for (int y = 0; y < 2; y++) {
        check_add_rmsnorm(5, 2304, y);  /* rows in registers (h <= 3072, h % 4 == 0) */
        check_add_rmsnorm(1, 3072, y);
        check_add_rmsnorm(2, 4100, y);  /* the general loop: too wide, */
        check_add_rmsnorm(3, 37, y);    /* and not a multiple of 4 */
    }
    check_silu_mul(1000003);
    check_add(1000003);
    for (unsigned ny : {1u, 2u, 3u, 8u}) {
        check_sum_add_rmsnorm(1, 2304, ny);   /* rows in registers */
        check_sum_add_rmsnorm(5, 37, ny);     /* the general loop */
    }
    for (uint32_t n : {1u, 3u}) {   /* the shared experts' and the dense MLP's down products */
        check_glu(KL_GPU_W_BF16, 2304, 1024, n);
        check_glu(KL_GPU_W_BF16, 2304, 9216, n);
        check_glu(KL_GPU_W_F32, 40, 64, n);
        check_pair(4096, 4096, 128, n);
    }
    check_pair(4096, 2304, 128, 1);   /* two shapes in one launch */
    check_pair(4096, 4096, 2304, 1);
    const double copy = t_copy_gbps();
    /* the add_norm inside the next product (the one-token kernel's versions 3 and 2): KDA's,
     * MLA's and the MoE's fused inputs, the dense MLP's gate + up (version 2: G 1, 2 and 4
     * groups a row; version 3 takes up to 4096 columns) */
    for (int v = 3; v >= 2; v--) {
        kl_gpu_version_set(KL_GPU_K_BF16, v);
        for (const auto &sh : {std::pair<size_t, size_t>{12576, 2304}, {6720, 2304},
                               {2816, 2304}, {18432, 2304}, {512, 2304}})
            check_matmul_norm(sh.first, sh.second,
                              sh.first == 12576 || sh.first == 2816 ? copy : 0);
    }
    /* ... and the fused input products: KDA q/k/v/f_a/g_a/b, MLA q + kv_a, shared gate + up
     * + router */
    static const size_t bf16_shapes[][2] = {{163840, 2304}, {9216, 2304}, {2304, 9216},
                                            {4096, 2304},   {2304, 4096}, {8192, 512},
                                            {128, 2304},    {12576, 2304}, {6720, 2304},
                                            {2304, 2304},   {1024, 2304}, {512, 2304}};
    for (int v = 3; v >= 1; v--) {
        kl_gpu_version_set(KL_GPU_K_BF16, v);
        for (const auto &sh : bf16_shapes)
            time_matmul(KL_GPU_W_BF16, sh[0], sh[1], 1, copy);
        if (v >= 2) {
            time_from_l2(2304, 4096, copy);
            time_from_l2(12576, 2304, copy);
        }
    }
    time_matmul(KL_GPU_W_BF16, 163840, 2304, 5, copy);
    /* a block's output product, its add and norm, the next block's input (version 3): KDA or
     * MLA output into the MoE input (shared gate + up + router), and into the KDA input */
    kl_gpu_version_set(KL_GPU_K_BF16, 3);
    check_chain(2304, 4096, 2304, copy);
    check_chain(2304, 4096, 12576, copy);
    check_chain(2304, 2304, 2304, 0);
    for (int v = 2; v >= 1; v--) {
        kl_gpu_version_set(KL_GPU_K_MX, v);
        time_matmul(KL_GPU_W_MXFP4, 131072, 8192, 1, copy);
        time_matmul(KL_GPU_W_MXFP4, 262144, 2304, 1, copy);
        time_matmul(KL_GPU_W_MXFP4, 3072, 2304, 1, copy);
        time_matmul(KL_GPU_W_MXFP4, 2304, 1024, 1, copy);
    }
    for (int v = 2; v >= 1; v--) {
        check_argmax(163841, v, 0);
        check_argmax(163840, v, copy);
    }
    return t_report("dense", copy);
}
