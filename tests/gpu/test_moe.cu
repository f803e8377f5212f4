/*
 * tests/gpu/test_moe.cu — kernels/moe.h against host references computed here: kl_gpu_route
 * (the CPU engine's route_token rule in float: idx exactly, weights to 1e-6, with ties, bias,
 * both weight modes, renormalisation on and off) and kl_gpu_experts (double: every kind, tiny
 * odd shapes and Kimi-Linear's E = 256, I = 1024, H = 2304, top 8 in MXFP4 at n = 1 and 5,
 * add_to_y both ways, an expert id out of range; MXFP4 with both kernel versions, 2 and
 * KL_GPU_MX=v1's).  Then n = 1 timed (both versions) with events (median of 32
 * calls, each on 8 other experts so the L2 cannot hold them) beside a device-to-device copy
 * measured in the same run.  One JSON line; exit 0 pass, 1 fail, 77 no GPU.
 */
#include "kernels/dense.h" /* kl_gpu_version_set */
#include "kernels/moe.h"
#include "tests/gpu/gpu_testutil.h"

#define TOL 1e-5 /* relative L2 of fp32 sums over exactly representable weights */

/* ---- router ------------------------------------------------------------------------------ */

struct route_case {
    uint32_t E, K, n;
    int bias, biased, renorm;
    float scaling;
};

/* engine/forward.c route_token, for one token. */
static void host_route(const float *lg, const float *bias, const route_case &c, int32_t *idx,
                       float *wt)
{
    std::vector<float> s(c.E), sel(c.E);
    for (uint32_t e = 0; e < c.E; e++) {
        s[e] = 1.0f / (1.0f + expf(-lg[e]));
        sel[e] = s[e] + (bias ? bias[e] : 0.0f);
    }
    float wsum = 0.0f;
    for (uint32_t k = 0; k < c.K; k++) {
        uint32_t best = 0;
        float bv = -INFINITY;
        for (uint32_t e = 0; e < c.E; e++) {
            if (sel[e] > bv) {
                bv = sel[e];
                best = e;
            }
        }
        idx[k] = (int32_t)best;
        wt[k] = c.biased ? bv : s[best];
        wsum += wt[k];
        sel[best] = -INFINITY;
    }
    for (uint32_t k = 0; k < c.K; k++) {
        if (c.renorm)
            wt[k] /= wsum + 1e-20f;
        wt[k] *= c.scaling;
    }
}

/* Random logits with ties: token 0's experts 3, 17 and E-1 share the top logit (and bias);
 * token 1's logits are all equal. */
static void check_route(const route_case &c)
{
    std::vector<float> lg = t_vec((size_t)c.n * c.E), bias = t_vec(c.E);
    for (auto &v : lg)
        v *= 4.0f;
    for (auto &v : bias)
        v *= 0.1f;
    if (c.E > 17) {
        for (uint32_t e : {3u, 17u, c.E - 1}) {
            lg[e] = 6.0f;
            bias[e] = 0.05f;
        }
    }
    if (c.n > 1)
        for (uint32_t e = 0; e < c.E; e++)
            lg[c.E + e] = 0.5f;
    float *dl = t_upload(lg), *db = t_upload(bias);
    int32_t *di = (int32_t *)t_alloc((size_t)c.n * c.K * 4);
    float *dw = (float *)t_alloc((size_t)c.n * c.K * 4);
    kl_gpu_route_args a = {dl, c.bias ? db : NULL, c.n, c.E, c.K, c.biased, c.renorm,
                           c.scaling, di, dw};
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_route(&a, NULL, &err), &err, "kl_gpu_route");
    std::vector<int32_t> gi = t_download(di, (size_t)c.n * c.K), ri(c.K);
    std::vector<float> gw = t_download(dw, (size_t)c.n * c.K), rw(c.K);
    double idx_wrong = 0, wt_err = 0;
    for (uint32_t t = 0; t < c.n; t++) {
        host_route(&lg[(size_t)t * c.E], c.bias ? bias.data() : NULL, c, ri.data(), rw.data());
        for (uint32_t k = 0; k < c.K; k++) {
            idx_wrong += gi[t * c.K + k] != ri[k];
            const double e = fabs((double)gw[t * c.K + k] - rw[k]) / std::max(1.0f, fabsf(rw[k]));
            wt_err = e > wt_err || e != e ? e : wt_err;
        }
    }
    char what[128];
    snprintf(what, sizeof what, "route E=%u top=%u n=%u bias=%d biased=%d renorm=%d", c.E, c.K,
             c.n, c.bias, c.biased, c.renorm);
    std::string w = what;
    t_check((w + " (wrong idx)").c_str(), idx_wrong, 0);
    t_check((w + " (weights)").c_str(), wt_err, 1e-6);
}

static void test_route(double copy_gbps)
{
    static const route_case cases[] = {
        {256, 8, 5, 1, 0, 1, 2.446f}, {256, 8, 5, 1, 1, 1, 2.446f}, {256, 8, 2, 0, 0, 0, 1.0f},
        {40, 5, 3, 1, 1, 0, 1.5f},    {8, 2, 3, 0, 0, 1, 1.0f},     {1024, 64, 2, 1, 0, 1, 1.0f},
        {256, 8, 9, 1, 0, 1, 2.446f}};
    for (const auto &c : cases)
        check_route(c);
    kl_err err;
    kl_err_clear(&err);
    float *dl = t_upload(t_vec(256));
    int32_t *di = (int32_t *)t_alloc(64);
    float *dw = (float *)t_alloc(64);
    kl_gpu_route_args a = {dl, NULL, 1, 256, 9, 0, 1, 1.0f, di, dw};
    a.top_k = 65;
    t_check("route refuses top_k 65", kl_gpu_route(&a, NULL, &err) != KL_E_USAGE, 0);
    a.top_k = 8;
    auto call = [&](int, kl_gpu_stream st) { kl_gpu_route(&a, st, &err); };
    t_time("route n=1 E=256 top=8", t_median_s(call, 25), t_graph_s(call, 32), 256 * 4,
           copy_gbps);
}

/* ---- experts ----------------------------------------------------------------------------- */

struct experts_case {
    kl_gpu_wkind kind;
    uint32_t E, I, H, K, n;
    int add;
};

/* Stacked experts of one case on host and device. */
struct stacks {
    t_mat w1, w2, w3;
    kl_gpu_stack d1, d2, d3;
};

static void stacks_make(stacks &s, const experts_case &c)
{
    s.w1 = t_mat_random(c.kind, (size_t)c.E * c.I, c.H);
    s.w2 = t_mat_random(c.kind, (size_t)c.E * c.H, c.I);
    s.w3 = t_mat_random(c.kind, (size_t)c.E * c.I, c.H);
    kl_gpu_stack *d[3] = {&s.d1, &s.d2, &s.d3};
    const t_mat *h[3] = {&s.w1, &s.w2, &s.w3};
    for (int i = 0; i < 3; i++) {
        d[i]->m = t_mat_upload(*h[i]);
        d[i]->m.rows = (uint32_t)(h[i]->rows / c.E);
        d[i]->n = c.E;
    }
}

/* Row r of a stacked matrix dotted with v, in double. */
static double host_dot(const t_mat &m, size_t r, const double *v)
{
    std::vector<float> w(m.cols);
    t_mat_row(m, r, w.data());
    double s = 0;
    for (size_t c = 0; c < m.cols; c++)
        s += (double)w[c] * v[c];
    return s;
}

/* ref_t = y0_t (when add) + Σ_k wt · W2_e (SiLU(W1_e x_t) ⊙ W3_e x_t), in double. */
static std::vector<double> host_experts(const stacks &s, const experts_case &c,
                                        const std::vector<float> &x,
                                        const std::vector<int32_t> &idx,
                                        const std::vector<float> &wt,
                                        const std::vector<float> &y0)
{
    std::vector<double> ref((size_t)c.n * c.H), xd(c.H), h(c.I);
    for (uint32_t t = 0; t < c.n; t++) {
        for (uint32_t i = 0; i < c.H; i++) {
            xd[i] = x[(size_t)t * c.H + i];
            ref[(size_t)t * c.H + i] = c.add ? y0[(size_t)t * c.H + i] : 0.0;
        }
        for (uint32_t k = 0; k < c.K; k++) {
            const size_t e = (size_t)idx[t * c.K + k];
            for (uint32_t r = 0; r < c.I; r++) {
                const double g = host_dot(s.w1, e * c.I + r, xd.data());
                h[r] = g / (1.0 + exp(-g)) * host_dot(s.w3, e * c.I + r, xd.data());
            }
            for (uint32_t r = 0; r < c.H; r++)
                ref[(size_t)t * c.H + r] += wt[t * c.K + k] * host_dot(s.w2, e * c.H + r, h.data());
        }
    }
    return ref;
}

/* top_k distinct random experts per token, weights in (0, 1]. */
static void random_choices(const experts_case &c, std::vector<int32_t> &idx,
                           std::vector<float> &wt)
{
    idx.resize((size_t)c.n * c.K);
    wt.resize(idx.size());
    for (uint32_t t = 0; t < c.n; t++) {
        for (uint32_t k = 0; k < c.K; k++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(t_u32() % c.E);
                dup = 0;
                for (uint32_t j = 0; j < k; j++)
                    dup |= idx[t * c.K + j] == e;
            } while (dup);
            idx[t * c.K + k] = e;
            wt[t * c.K + k] = (float)(1 + t_u32() % 1024) / 1024.0f;
        }
    }
}

/* Runs one case on the device; returns y [n, H]. */
static std::vector<float> run_experts(const stacks &s, const experts_case &c,
                                      const std::vector<float> &x,
                                      const std::vector<int32_t> &idx,
                                      const std::vector<float> &wt,
                                      const std::vector<float> &y0)
{
    float *dx = t_upload(x), *dw = t_upload(wt), *dy = t_upload(y0);
    int32_t *di = t_upload(idx);
    float *scratch = (float *)t_alloc(kl_gpu_experts_scratch(c.n, c.K, c.I, c.H) * 4);
    kl_gpu_experts_args a = {&s.d1, &s.d2, &s.d3, dx, c.n, c.K, di, dw, scratch, dy, c.add};
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_experts(&a, NULL, &err), &err, "kl_gpu_experts");
    std::vector<float> y = t_download(dy, (size_t)c.n * c.H);
    hipFree(dx);
    hipFree(dw);
    hipFree(dy);
    hipFree(di);
    hipFree(scratch);
    return y;
}

static void stacks_free(stacks &s)
{
    t_mat_free(s.d1.m);
    t_mat_free(s.d2.m);
    t_mat_free(s.d3.m);
}

/* Every add mode and n of the list on one set of stacks. */
static void check_experts(const experts_case &base, const uint32_t *ns, size_t n_ns)
{
    stacks s;
    stacks_make(s, base);
    for (size_t i = 0; i < n_ns; i++) {
        for (int add = 0; add < 2; add++) {
            experts_case c = base;
            c.n = ns[i];
            c.add = add;
            std::vector<int32_t> idx;
            std::vector<float> wt, x = t_vec((size_t)c.n * c.H), y0 = t_vec((size_t)c.n * c.H);
            random_choices(c, idx, wt);
            if (!add)
                for (auto &v : y0)
                    v = NAN; /* poison: every output must be written */
            std::vector<float> y = run_experts(s, c, x, idx, wt, y0);
            std::vector<double> ref = host_experts(s, c, x, idx, wt, y0);
            double worst = 0;
            for (uint32_t t = 0; t < c.n; t++) {
                const double e = t_rel_l2(&y[(size_t)t * c.H], &ref[(size_t)t * c.H], c.H);
                worst = e > worst || e != e ? e : worst;
            }
            char what[128];
            snprintf(what, sizeof what, "experts %s E=%u I=%u H=%u top=%u n=%u add=%d v%d",
                     t_kind_name(c.kind), c.E, c.I, c.H, c.K, c.n, c.add,
                     kl_gpu_version(KL_GPU_K_MX));
            t_check(what, worst, TOL);
        }
    }
    stacks_free(s);
}

/* An expert id out of range gives NaN for its token only, and no fault. */
static void check_bad_id(kl_gpu_wkind kind)
{
    const experts_case c = {kind, 4, 32, 64, 2, 2, 0};
    stacks s;
    stacks_make(s, c);
    std::vector<int32_t> idx = {0, 4, 1, 2};
    std::vector<float> wt = {0.5f, 0.5f, 0.5f, 0.5f}, x = t_vec(2 * 64), y0(2 * 64, 0.0f);
    std::vector<float> y = run_experts(s, c, x, idx, wt, y0);
    double wrong = 0;
    for (int i = 0; i < 64; i++)
        wrong += !isnan(y[i]) + isnan(y[64 + i]);
    char what[96];
    snprintf(what, sizeof what, "experts %s id out of range (wrong NaN pattern) v%d",
             t_kind_name(kind), kl_gpu_version(KL_GPU_K_MX));
    t_check(what, wrong, 0);
    stacks_free(s);
}

/* n = 1 at the real shapes: 32 calls, call i on experts perm[8i .. 8i+8). */
static void time_experts(double copy_gbps, int version)
{
    kl_gpu_version_set(KL_GPU_K_MX, version);
    const experts_case c = {KL_GPU_W_MXFP4, 256, 1024, 2304, 8, 1, 1};
    stacks s;
    stacks_make(s, c);
    std::vector<int32_t> perm(c.E);
    for (uint32_t e = 0; e < c.E; e++)
        perm[e] = (int32_t)e;
    for (uint32_t e = c.E - 1; e > 0; e--)
        std::swap(perm[e], perm[t_u32() % (e + 1)]);
    std::vector<float> wt(c.K, 0.125f);
    float *dx = t_upload(t_vec(c.H)), *dw = t_upload(wt), *dy = t_upload(t_vec(c.H));
    int32_t *di = t_upload(perm);
    float *scratch = (float *)t_alloc(kl_gpu_experts_scratch(1, c.K, c.I, c.H) * 4);
    kl_err err;
    kl_err_clear(&err);
    auto call = [&](int i, kl_gpu_stream st) {
        kl_gpu_experts_args a = {&s.d1, &s.d2, &s.d3, dx, 1, c.K, di + (i % 32) * c.K,
                                 dw, scratch, dy, 1};
        t_ok(kl_gpu_experts(&a, st, &err), &err, "kl_gpu_experts");
    };
    const double bytes = 3.0 * c.K * c.I * c.H * (0.5 + 1.0 / 32);
    char what[96];
    snprintf(what, sizeof what, "experts mxfp4 E=256 I=1024 H=2304 top=8 n=1 v%d", version);
    t_time(what, t_median_s(call, 32), t_graph_s(call, 32), bytes, copy_gbps);
    T_CHECK(hipDeviceSynchronize());
    hipFree(dx);
    hipFree(dw);
    hipFree(dy);
    hipFree(di);
    hipFree(scratch);
    stacks_free(s);
}

int main(void)
{
    if (!t_have_gpu("test_moe"))
        return 77;
    const double copy = t_copy_gbps();
    test_route(copy);
    static const uint32_t tiny_n[] = {1, 3}, real_n[] = {1, 5};
    check_experts({KL_GPU_W_F32, 4, 32, 64, 2, 1, 0}, tiny_n, 2);
    check_experts({KL_GPU_W_F32, 3, 33, 37, 2, 1, 0}, tiny_n, 2);
    check_experts({KL_GPU_W_BF16, 5, 40, 24, 3, 1, 0}, tiny_n, 2);
    check_experts({KL_GPU_W_BF16, 8, 1024, 2304, 8, 1, 0}, real_n, 1);
    for (int v = 2; v >= 1; v--) { /* MXFP4: version 2, then round 1's (KL_GPU_MX=v1) */
        kl_gpu_version_set(KL_GPU_K_MX, v);
        check_experts({KL_GPU_W_MXFP4, 4, 64, 96, 2, 1, 0}, tiny_n, 2);
        check_experts({KL_GPU_W_MXFP4, 5, 96, 960, 2, 1, 0}, tiny_n, 2);
        check_experts({KL_GPU_W_MXFP4, 256, 1024, 2304, 8, 1, 0}, real_n, 2);
        check_bad_id(KL_GPU_W_MXFP4);
    }
    check_bad_id(KL_GPU_W_F32);
    time_experts(copy, 2);
    time_experts(copy, 1);
    return t_report("moe", copy);
}
