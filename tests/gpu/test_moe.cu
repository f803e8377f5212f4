/*
 * tests/gpu/test_moe.cu — kernels/moe.h against host references computed here: kl_gpu_route
 * (the CPU engine's route_token rule in float: idx exactly, weights to 1e-6, with ties, bias,
 * both weight modes, renormalisation on and off) and kl_gpu_experts (double: every kind, tiny
 * odd shapes, add_to_y both ways, an expert id out of range; MXFP4 through each per-slot path:
 * decode version 5 (the default), 6, 7, 3, 4, KL_GPU_MOE_DECODE=v2, and v2 with KL_GPU_MX=v1;
 * Kimi-Linear's E = 256, I = 1024, H = 2304, top 8 at n = 1, 2, 7 and 15 in MXFP4 (every path,
 * and 3, 4, 2 against version 5: the same sums) and BF16; versions 6, 7, 5, 3 and 4 replayed in
 * a graph with programmatic edges right after the router that writes its idx, against plain
 * launches; the grouped chunks path in both X forms of kernels/gemm.h (split against fp32,
 * bf16 X against a bf16-rounding host)).  Then n = 1 timed for each path with events (median
 * of 32 calls, each on 8 other experts so the L2 cannot hold them; and per call in graphs,
 * plain and with programmatic edges as the decode step runs) beside a device-to-device copy
 * measured in the same run (1 GiB, and one that moves the experts' 30.1 MB).  One JSON line;
 * exit 0 pass, 1 fail, 77 no GPU.
 */
#include "kernels/dense.h" /* kl_gpu_version_set */
#include "kernels/gemm.h"  /* kl_gpu_gemm_split */
#include "kernels/moe.h"
#include "kernels/runtime.h" /* graphs with programmatic edges */
#include "tests/gpu/gpu_testutil.h"

#define TOL 1e-5 /* relative L2 of fp32 sums over exactly representable weights */
#define TOL_GROUPED 3e-3 /* grouped, bf16 X (KL_GPU_GEMM_SPLIT=0) against a host that rounds x
                          * and h to bf16 (from fp32 sums there, double here: an h that rounds
                          * the other way moves a token of H = 960 by ~5e-4; seen 1.5e-3) */
#define TOL_SPLIT   1e-4 /* grouped, split X (the default) against the fp32 host and v2 */

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
static void route_inputs(const route_case &c, std::vector<float> &lg, std::vector<float> &bias)
{
    lg = t_vec((size_t)c.n * c.E), bias = t_vec(c.E);
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
}

static void check_route(const route_case &c, uint32_t held)
{
    std::vector<float> lg, bias;
    route_inputs(c, lg, bias);
    float *dl = t_upload(lg), *db = t_upload(bias);
    int32_t *di = (int32_t *)t_alloc((size_t)c.n * c.K * 4);
    float *dw = (float *)t_alloc((size_t)c.n * c.K * 4);
    /* expert parallel (held > 0): the ids local to a rank holding the second quarter */
    const uint32_t first = held ? c.E / 4 : 0;
    kl_gpu_route_args a = {dl, c.bias ? db : NULL, c.n, c.E, c.K, c.biased, c.renorm,
                           c.scaling, di, dw, first, held};
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_route(&a, NULL, &err), &err, "kl_gpu_route");
    std::vector<int32_t> gi = t_download(di, (size_t)c.n * c.K), ri(c.K);
    std::vector<float> gw = t_download(dw, (size_t)c.n * c.K), rw(c.K);
    double idx_wrong = 0, wt_err = 0;
    for (uint32_t t = 0; t < c.n; t++) {
        host_route(&lg[(size_t)t * c.E], c.bias ? bias.data() : NULL, c, ri.data(), rw.data());
        for (uint32_t k = 0; k < c.K; k++) {
            const int32_t id = ri[k], local = id - (int32_t)first;
            const int32_t want = !held ? id : local >= 0 && local < (int32_t)held
                                                  ? local : KL_GPU_EXPERT_ELSEWHERE;
            idx_wrong += gi[t * c.K + k] != want;
            const double e = fabs((double)gw[t * c.K + k] - rw[k]) / std::max(1.0f, fabsf(rw[k]));
            wt_err = e > wt_err || e != e ? e : wt_err;
        }
    }
    char what[128];
    snprintf(what, sizeof what, "route E=%u top=%u n=%u bias=%d biased=%d renorm=%d held=%u",
             c.E, c.K, c.n, c.bias, c.biased, c.renorm, held);
    std::string w = what;
    t_check((w + " (wrong idx)").c_str(), idx_wrong, 0);
    t_check((w + " (weights)").c_str(), wt_err, 1e-6);
}

/* 4-byte values of two device buffers of n floats (or ids) that differ bitwise. */
static double words_differ(const void *da, const void *db, size_t n)
{
    std::vector<uint32_t> x(n), y(n);
    T_CHECK(hipMemcpy(x.data(), da, n * 4, hipMemcpyDeviceToHost));
    T_CHECK(hipMemcpy(y.data(), db, n * 4, hipMemcpyDeviceToHost));
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d += x[i] != y[i];
    return d;
}

/* kl_gpu_matmul_glu_route (dense.h): the router riding in the shared expert's down launch
 * (n = 1, E <= 256) or the two launches (otherwise) gives kl_gpu_route's idx and wt and
 * kl_gpu_matmul_glu's y, bytewise; at Kimi-Linear's shapes (n = 1) both forms are timed in a
 * graph. */
static void check_route_rides(const route_case &c, uint32_t held, double copy_gbps)
{
    const size_t rows = 2304, cols = 1024, K = (size_t)c.n * c.K;
    const t_mat m = t_mat_random(KL_GPU_W_BF16, rows, cols);
    const kl_gpu_mat d = t_mat_upload(m);
    std::vector<float> lg, bias;
    route_inputs(c, lg, bias);
    const std::vector<float> a0 = t_vec(c.n * cols);
    float *dl = t_upload(lg), *db = t_upload(bias), *dg = t_upload(t_vec(c.n * cols));
    float *da[2], *dy[2], *dw[2];   /* a: each form its own (n > 1 gates it in place) */
    int32_t *di[2];
    for (int f = 0; f < 2; f++) {
        da[f] = t_upload(a0);
        dy[f] = (float *)t_alloc(c.n * rows * 4);
        dw[f] = (float *)t_alloc(K * 4);
        di[f] = (int32_t *)t_alloc(K * 4);
    }
    kl_gpu_route_args a[2];
    for (int f = 0; f < 2; f++)
        a[f] = {dl, c.bias ? db : NULL, c.n, c.E, c.K, c.biased, c.renorm, c.scaling, di[f],
                dw[f], held ? c.E / 4 : 0, held};
    kl_err err;
    kl_err_clear(&err);
    auto ride = [&](int, kl_gpu_stream st) {
        t_ok(kl_gpu_matmul_glu_route(&d, da[0], dg, c.n, dy[0], &a[0], st, &err), &err,
             "kl_gpu_matmul_glu_route");
    };
    auto apart = [&](int, kl_gpu_stream st) {
        t_ok(kl_gpu_route(&a[1], st, &err), &err, "kl_gpu_route");
        t_ok(kl_gpu_matmul_glu(&d, da[1], dg, c.n, dy[1], st, &err), &err, "kl_gpu_matmul_glu");
    };
    ride(0, NULL);
    apart(0, NULL);
    char what[128];
    snprintf(what, sizeof what, "route riding the shared down E=%u top=%u n=%u held=%u "
             "(values that differ from the two launches)", c.E, c.K, c.n, held);
    t_check(what, words_differ(di[0], di[1], K) + words_differ(dw[0], dw[1], K) +
                      words_differ(dy[0], dy[1], c.n * rows), 0);
    if (c.n == 1 && c.E == 256 && !held) {
        const size_t bytes = rows * cols * 2;
        t_time("shared down + route n=1 E=256, route riding", t_median_s(ride, 25),
               t_graph_s(ride, 32), bytes, copy_gbps);
        t_time("shared down + route n=1 E=256, two launches", t_median_s(apart, 25),
               t_graph_s(apart, 32), bytes, copy_gbps);
    }
    for (void *p : {(void *)dl, (void *)db, (void *)da[0], (void *)da[1], (void *)dg,
                    (void *)dy[0], (void *)dy[1], (void *)dw[0], (void *)dw[1], (void *)di[0],
                    (void *)di[1]})
        hipFree(p);
    t_mat_free(d);
}

static void test_route(double copy_gbps)
{
    static const route_case cases[] = {
        {256, 8, 5, 1, 0, 1, 2.446f}, {256, 8, 5, 1, 1, 1, 2.446f}, {256, 8, 2, 0, 0, 0, 1.0f},
        {40, 5, 3, 1, 1, 0, 1.5f},    {8, 2, 3, 0, 0, 1, 1.0f},     {1024, 64, 2, 1, 0, 1, 1.0f},
        {256, 8, 9, 1, 0, 1, 2.446f}, {256, 40, 3, 1, 0, 1, 1.0f}, {257, 8, 3, 1, 0, 1, 1.0f}};
    for (const auto &c : cases) {
        check_route(c, 0);
        check_route(c, c.E / 4);   /* expert parallel: a rank of 4 */
    }
    kl_err err;
    kl_err_clear(&err);
    float *dl = t_upload(t_vec(256));
    int32_t *di = (int32_t *)t_alloc(64);
    float *dw = (float *)t_alloc(64);
    kl_gpu_route_args a = {dl, NULL, 1, 256, 9, 0, 1, 1.0f, di, dw, 0, 0};
    a.top_k = 65;
    t_check("route refuses top_k 65", kl_gpu_route(&a, NULL, &err) != KL_E_USAGE, 0);
    a.top_k = 8;
    a.first = 200, a.held = 64;
    kl_err_clear(&err);
    t_check("route refuses experts [200, 264) held of 256",
            kl_gpu_route(&a, NULL, &err) != KL_E_USAGE, 0);
    a.first = a.held = 0;
    auto call = [&](int, kl_gpu_stream st) { kl_gpu_route(&a, st, &err); };
    t_time("route n=1 E=256 top=8", t_median_s(call, 25), t_graph_s(call, 32), 256 * 4,
           copy_gbps);
    static const route_case rides[] = { /* riding: the first two; the rest two launches */
        {256, 8, 1, 1, 0, 1, 2.446f}, {40, 5, 1, 1, 1, 0, 1.5f}, {256, 8, 3, 1, 0, 1, 2.446f},
        {257, 8, 1, 1, 0, 1, 1.0f}};
    for (const auto &c : rides) {
        check_route_rides(c, 0, copy_gbps);
        check_route_rides(c, c.E / 4, copy_gbps);
    }
}

/* ---- experts ----------------------------------------------------------------------------- */

/* The per-slot MXFP4 kernels (n < 16): decode version 5 (3 with gate/up's rounds pipelined:
 * the default), 6 (tensor cores: KL_GPU_MOE_DECODE=tc), 3 (KL_GPU_MOE_DECODE=v3), 4 (3 with
 * the early down launch: v3t), 2, or 2 with KL_GPU_MX=v1's.  same: the fp32 sums of version 5
 * in its order (checked equal to it at the real shapes). */
struct slot_path {
    int decode, mx, same;
    const char *name;
};
static const slot_path paths[] = {{5, 2, 1, "v3p"}, {6, 2, 0, "tc"}, {7, 2, 0, "i8"},
                                  {3, 2, 1, "v3"},  {4, 2, 1, "v3t"}, {2, 2, 1, "v2"},
                                  {2, 1, 0, "v2 mx=v1"}};
static const slot_path *cur_path = &paths[0];

static void path_set(const slot_path &p)
{
    kl_gpu_experts_decode_version_set(p.decode);
    kl_gpu_version_set(KL_GPU_K_MX, p.mx);
    cur_path = &p;
}

/* The name of the per-slot kernels kind takes (only MXFP4 has versions). */
static const char *slot_name(kl_gpu_wkind kind)
{
    return kind == KL_GPU_W_MXFP4 ? cur_path->name : "per-slot";
}

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

/* f rounded to bf16 (nearest even), as the grouped products stage their inputs. */
static double host_bf16(double d)
{
    float f = (float)d;
    uint32_t u;
    memcpy(&u, &f, 4);
    u = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;
    memcpy(&f, &u, 4);
    return f;
}

/* ref_t = y0_t (when add) + Σ_k wt · W2_e (SiLU(W1_e x_t) ⊙ W3_e x_t), in double, for tokens
 * t % tstep == 0 (others 0); bf16: x and h rounded to bf16 first (the grouped path). */
static std::vector<double> host_experts(const stacks &s, const experts_case &c,
                                        const std::vector<float> &x,
                                        const std::vector<int32_t> &idx,
                                        const std::vector<float> &wt,
                                        const std::vector<float> &y0, uint32_t tstep, int bf16)
{
    std::vector<double> ref((size_t)c.n * c.H), xd(c.H), h(c.I);
    for (uint32_t t = 0; t < c.n; t += tstep) {
        for (uint32_t i = 0; i < c.H; i++) {
            xd[i] = bf16 ? host_bf16(x[(size_t)t * c.H + i]) : x[(size_t)t * c.H + i];
            ref[(size_t)t * c.H + i] = c.add ? y0[(size_t)t * c.H + i] : 0.0;
        }
        for (uint32_t k = 0; k < c.K; k++) {
            if (idx[t * c.K + k] == KL_GPU_EXPERT_ELSEWHERE)
                continue;   /* another rank's expert: nothing */
            const size_t e = (size_t)idx[t * c.K + k];
            for (uint32_t r = 0; r < c.I; r++) {
                const double g = host_dot(s.w1, e * c.I + r, xd.data());
                h[r] = g / (1.0 + exp(-g)) * host_dot(s.w3, e * c.I + r, xd.data());
                h[r] = bf16 ? host_bf16(h[r]) : h[r];
            }
            for (uint32_t r = 0; r < c.H; r++)
                ref[(size_t)t * c.H + r] += wt[t * c.K + k] * host_dot(s.w2, e * c.H + r, h.data());
        }
    }
    return ref;
}

static int g_elsewhere; /* 1: random_choices makes about a third of the slots another rank's */

/* top_k distinct random experts per token, weights in (0, 1]; with g_elsewhere some of them
 * KL_GPU_EXPERT_ELSEWHERE (expert parallel: held by another rank). */
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
        for (uint32_t k = 0; g_elsewhere && k < c.K; k++)
            if (t_u32() % 3 == 0)
                idx[t * c.K + k] = KL_GPU_EXPERT_ELSEWHERE;
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

/* Whether kl_gpu_experts takes the grouped path of chunks for c (moe.h). */
static int grouped(const experts_case &c)
{
    return kl_gpu_experts_version() == 3 && c.n >= kl_gpu_experts_grouped_min() &&
           c.kind != KL_GPU_W_F32 && c.I % 32 == 0 && c.H % 32 == 0;
}

/* The worst relative L2 error over tokens t % tstep == 0 of y against ref. */
static double worst_error(const std::vector<float> &y, const std::vector<double> &ref,
                          const experts_case &c, uint32_t tstep)
{
    double worst = 0;
    for (uint32_t t = 0; t < c.n; t += tstep) {
        const double e = t_rel_l2(&y[(size_t)t * c.H], &ref[(size_t)t * c.H], c.H);
        worst = e > worst || e != e ? e : worst;
    }
    return worst;
}

/* The grouped path with X rounded to bf16 (kl_gpu_gemm_split_set(0)) against the host that
 * rounds x and h to bf16 as it does (tokens sampled as for ref), the form before restored. */
static void check_bf16x(const stacks &s, const experts_case &c, const std::vector<float> &x,
                        const std::vector<int32_t> &idx, const std::vector<float> &wt,
                        const std::vector<float> &y0, uint32_t tstep, const char *what)
{
    const int form = kl_gpu_gemm_split();
    kl_gpu_gemm_split_set(0);
    std::vector<float> y = run_experts(s, c, x, idx, wt, y0);
    kl_gpu_gemm_split_set(form);
    std::vector<double> ref = host_experts(s, c, x, idx, wt, y0, tstep, 1);
    const std::string w = std::string(what) + " bf16x";
    t_check(w.c_str(), worst_error(y, ref, c, tstep), TOL_GROUPED);
}

/* Every add mode and n of the list on one set of stacks.  The grouped path (split X, the
 * default) is checked against the fp32 host (tokens sampled at the real shapes) and against
 * the per-slot path (KL_GPU_MOE=v2) on every token; with X rounded to bf16 against the host
 * that rounds x and h to bf16 as it does. */
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
            const int g = grouped(c);
            const double work = 3.0 * c.n * c.K * c.I * c.H;
            const uint32_t tstep = work > 2e8 ? (uint32_t)(work / 2e8) + 1 : 1;
            std::vector<double> ref = host_experts(s, c, x, idx, wt, y0, tstep, 0);
            char what[128];
            snprintf(what, sizeof what, "experts %s E=%u I=%u H=%u top=%u n=%u add=%d %s%s",
                     t_kind_name(c.kind), c.E, c.I, c.H, c.K, c.n, c.add,
                     g ? "grouped" : slot_name(c.kind), g_elsewhere ? " elsewhere" : "");
            t_check(what, worst_error(y, ref, c, tstep), g ? TOL_SPLIT : TOL);
            if (g) { /* the same slots through the per-slot kernels, then bf16 X */
                kl_gpu_experts_version_set(2);
                std::vector<float> y2 = run_experts(s, c, x, idx, wt, y0);
                kl_gpu_experts_version_set(3);
                std::vector<double> r2(y2.begin(), y2.end());
                const std::string w = std::string(what) + " vs KL_GPU_MOE=v2";
                t_check(w.c_str(), worst_error(y, r2, c, 1), TOL_SPLIT);
                check_bf16x(s, c, x, idx, wt, y0, tstep, what);
            }
        }
    }
    stacks_free(s);
}

/* An expert id out of range (token 0's second) gives NaN for its token only, and no fault;
 * n = 16 takes the grouped path.  I x H: 32 x 64, or 128 x 128 (whole quads of blocks, as
 * version 6 takes). */
static void check_bad_id(kl_gpu_wkind kind, uint32_t n, uint32_t I = 32, uint32_t H = 64)
{
    const experts_case c = {kind, 4, I, H, 2, n, 0};
    stacks s;
    stacks_make(s, c);
    std::vector<int32_t> idx(2 * n);
    for (uint32_t t = 0; t < n; t++) {
        idx[2 * t] = t ? 1 : 0;
        idx[2 * t + 1] = t ? (int32_t)(t % 4) : 4;
        idx[2 * t + 1] = t && idx[2 * t + 1] == 1 ? 3 : idx[2 * t + 1];
    }
    std::vector<float> wt(2 * n, 0.5f), x = t_vec(n * H), y0(n * H, 0.0f);
    std::vector<float> y = run_experts(s, c, x, idx, wt, y0);
    double wrong = 0;
    for (uint32_t i = 0; i < H * n; i++)
        wrong += i < H ? !isnan(y[i]) : isnan(y[i]);
    char what[96];
    snprintf(what, sizeof what, "experts %s I=%u H=%u n=%u id out of range (wrong NaN pattern) %s",
             t_kind_name(kind), I, H, n, grouped(c) ? "grouped" : slot_name(kind));
    t_check(what, wrong, 0);
    stacks_free(s);
}

/* Decode at the real shapes (top 8 of 256, I = 1024, H = 2304), n = 1, 2, 7 and 15, add_to_y
 * both ways: every per-slot path against one host reference (tokens sampled as in
 * check_experts), and MXFP4's version 3 against version 2 on every token (the same fp32 sums
 * in the same order: expected 0). */
static void check_decode(kl_gpu_wkind kind)
{
    static const uint32_t ns[] = {1, 2, 7, 15};
    const experts_case base = {kind, 256, 1024, 2304, 8, 1, 0};
    stacks s;
    stacks_make(s, base);
    for (uint32_t n : ns) {
        for (int add = 0; add < 2; add++) {
            experts_case c = base;
            c.n = n;
            c.add = add;
            std::vector<int32_t> idx;
            std::vector<float> wt, x = t_vec((size_t)n * c.H), y0 = t_vec((size_t)n * c.H);
            random_choices(c, idx, wt);
            if (!add)
                for (auto &v : y0)
                    v = NAN;
            const double work = 3.0 * n * c.K * c.I * c.H;
            const uint32_t tstep = work > 2e8 ? (uint32_t)(work / 2e8) + 1 : 1;
            std::vector<double> ref = host_experts(s, c, x, idx, wt, y0, tstep, 0);
            std::vector<float> y_same; /* version 5's */
            for (const auto &p : paths) {
                path_set(p);
                std::vector<float> y = run_experts(s, c, x, idx, wt, y0);
                char what[128];
                snprintf(what, sizeof what, "decode %s top=8 of 256 n=%u add=%d %s",
                         t_kind_name(kind), n, add, slot_name(kind));
                t_check(what, worst_error(y, ref, c, tstep), TOL);
                if (kind != KL_GPU_W_MXFP4)
                    break; /* one per-slot path */
                if (p.same && y_same.empty()) {
                    y_same = y;
                } else if (p.same) {
                    std::vector<double> r(y.begin(), y.end());
                    snprintf(what + strlen(what), sizeof what - strlen(what),
                             " vs v3p (same sums)");
                    t_check(what, worst_error(y_same, r, c, 1), 1e-6);
                }
            }
            path_set(paths[0]);
        }
    }
    stacks_free(s);
}

/* After a timing: waits, then frees its device buffers and stacks. */
static void timing_free(std::initializer_list<void *> bufs, stacks &s)
{
    T_CHECK(hipDeviceSynchronize());
    for (void *b : bufs)
        hipFree(b);
    stacks_free(s);
}

/* Versions 6, 5, 3 and 4 (path p) right after the router that writes its idx and wt, STEPS
 * times in one graph with programmatic edges (the down kernel reads idx before its grid wait:
 * a stale read would give step i the experts of step i - 1), each step on its own logits, x
 * and y, against the same steps launched plainly: equal to the bit (add_to_y 0, so the
 * replays repeat one result). */
static void check_pdl(const slot_path &p)
{
    path_set(p);
    enum { STEPS = 8, N = 2 };
    const experts_case c = {KL_GPU_W_MXFP4, 256, 1024, 2304, 8, N, 0};
    stacks s;
    stacks_make(s, c);
    std::vector<float> lg = t_vec((size_t)STEPS * N * c.E);
    for (auto &v : lg)
        v *= 4.0f;
    const size_t ny = (size_t)STEPS * N * c.H;
    float *dl = t_upload(lg), *dx = t_upload(t_vec(ny)), *dy = t_upload(t_vec(ny));
    float *dw = (float *)t_alloc(N * c.K * 4);
    int32_t *di = (int32_t *)t_alloc(N * c.K * 4);
    float *scratch = (float *)t_alloc(kl_gpu_experts_scratch(N, c.K, c.I, c.H) * 4);
    kl_err err;
    kl_err_clear(&err);
    auto step = [&](int i, kl_gpu_stream st) {
        kl_gpu_route_args ra = {dl + (size_t)i * N * c.E, NULL, N, c.E, c.K, 0, 1, 2.5f, di, dw,
                                0, 0};
        t_ok(kl_gpu_route(&ra, st, &err), &err, "kl_gpu_route");
        kl_gpu_experts_args a = {&s.d1, &s.d2, &s.d3, dx + (size_t)i * N * c.H, N, c.K, di, dw,
                                 scratch, dy + (size_t)i * N * c.H, 0};
        t_ok(kl_gpu_experts(&a, st, &err), &err, "kl_gpu_experts");
    };
    for (int i = 0; i < STEPS; i++)
        step(i, NULL);
    const std::vector<float> plain = t_download(dy, ny);
    T_CHECK(hipMemset(dy, 0xff, ny * 4)); /* NaN: every output must be written again */
    t_pdl_graph_s(step, STEPS);
    const std::vector<float> graph = t_download(dy, ny);
    double differ = 0;
    for (size_t i = 0; i < ny; i++)
        differ += memcmp(&plain[i], &graph[i], 4) != 0;
    char what[160];
    snprintf(what, sizeof what, "decode %s mxfp4 n=2 after the router, graph with programmatic "
             "edges vs plain (values that differ)", p.name);
    t_check(what, differ, 0);
    timing_free({dl, dx, dy, dw, di, scratch}, s);
    path_set(paths[0]);
}

/* n = 1 at the real shapes through path p: 32 calls, call i on experts perm[8i .. 8i+8);
 * one call alone, then per call in a plain graph and in one with programmatic edges. */
static void time_experts(double copy_gbps, const slot_path &p)
{
    path_set(p);
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
    char what[160];
    snprintf(what, sizeof what, "experts mxfp4 E=256 I=1024 H=2304 top=8 n=1 %s", p.name);
    const double one = t_median_s(call, 32);
    t_time(what, one, t_graph_s(call, 32), bytes, copy_gbps);
    strncat(what, " pdl", sizeof what - strlen(what) - 1);
    t_time(what, one, t_pdl_graph_s(call, 32), bytes, copy_gbps);
    auto same = [&](int, kl_gpu_stream st) { /* the same 8 experts: their 30 MB from L2 */
        kl_gpu_experts_args a = {&s.d1, &s.d2, &s.d3, dx, 1, c.K, di, dw, scratch, dy, 1};
        t_ok(kl_gpu_experts(&a, st, &err), &err, "kl_gpu_experts");
    };
    strncat(what, ", the same experts every call (from L2)", sizeof what - strlen(what) - 1);
    t_time(what, t_median_s(same, 32), t_pdl_graph_s(same, 32), bytes, copy_gbps);
    timing_free({dx, dw, dy, di, scratch}, s);
    path_set(paths[0]);
}

/* A device-to-device copy that moves the bytes the experts read at n = 1 (half of them read,
 * half written), alone and per copy in graphs: what those bytes cost at this size. */
static void time_copy_same(double copy_gbps)
{
    const double bytes = 3.0 * 8 * 1024 * 2304 * (0.5 + 1.0 / 32);
    const size_t half = (size_t)(bytes / 2) / 16 * 16;
    void *src = t_alloc(32 * half), *dst = t_alloc(half);
    T_CHECK(hipMemset(src, 1, 32 * half));
    auto call = [&](int i, kl_gpu_stream st) { /* a fresh source each time: not from L2 */
        T_CHECK(hipMemcpyAsync(dst, (char *)src + (size_t)(i % 32) * half, half,
                               hipMemcpyDeviceToDevice, (hipStream_t)st));
    };
    t_time("d2d copy moving the experts' n=1 bytes (half read, half written)", t_median_s(call, 32),
           t_graph_s(call, 32), 2.0 * half, copy_gbps);
    T_CHECK(hipDeviceSynchronize());
    hipFree(src);
    hipFree(dst);
}

/* Chunks: the grouped path and, inside check_experts, the per-slot one; from 16 tokens on (the
 * default takes 128 and more), so the small shapes reach the grouped kernels' tails. */
static void check_grouped_cases(void)
{
    kl_gpu_experts_grouped_min_set(16);
    static const uint32_t small_n[] = {16, 37}, real_n[] = {64, 256};
    kl_gpu_version_set(KL_GPU_K_MX, 2);
    check_experts({KL_GPU_W_BF16, 5, 64, 96, 3, 1, 0}, small_n, 2);
    check_experts({KL_GPU_W_MXFP4, 5, 96, 960, 2, 1, 0}, small_n, 2);
    check_experts({KL_GPU_W_F32, 4, 32, 64, 2, 1, 0}, small_n, 1); /* not grouped: F32 */
    check_experts({KL_GPU_W_MXFP4, 256, 1024, 2304, 8, 1, 0}, real_n, 2);
    check_bad_id(KL_GPU_W_MXFP4, 16);
    check_bad_id(KL_GPU_W_BF16, 16);
    g_elsewhere = 1;
    check_experts({KL_GPU_W_BF16, 5, 64, 96, 3, 1, 0}, small_n, 2);
    check_experts({KL_GPU_W_MXFP4, 5, 96, 960, 2, 1, 0}, small_n, 2);
    g_elsewhere = 0;
    kl_gpu_experts_grouped_min_set(0);
    check_experts({KL_GPU_W_MXFP4, 256, 1024, 2304, 8, 1, 0}, real_n, 1); /* 64: per slot now */
}

/* n tokens at the real shapes through path version (3 grouped, 2 per-slot): median of 7
 * single calls; bytes: the three stacks whole (top 8 of 256 over 64+ tokens touch nearly all
 * experts). */
static void time_chunk(double copy_gbps, uint32_t n, int version)
{
    kl_gpu_experts_version_set(version);
    const experts_case c = {KL_GPU_W_MXFP4, 256, 1024, 2304, 8, n, 1};
    stacks s;
    stacks_make(s, c);
    std::vector<int32_t> idx;
    std::vector<float> wt;
    random_choices(c, idx, wt);
    float *dx = t_upload(t_vec((size_t)n * c.H)), *dw = t_upload(wt);
    float *dy = t_upload(t_vec((size_t)n * c.H));
    int32_t *di = t_upload(idx);
    float *scratch = (float *)t_alloc(kl_gpu_experts_scratch(n, c.K, c.I, c.H) * 4);
    kl_err err;
    kl_err_clear(&err);
    auto call = [&](int, kl_gpu_stream st) {
        kl_gpu_experts_args a = {&s.d1, &s.d2, &s.d3, dx, n, c.K, di, dw, scratch, dy, 1};
        t_ok(kl_gpu_experts(&a, st, &err), &err, "kl_gpu_experts");
    };
    const double bytes = 3.0 * c.E * c.I * c.H * (0.5 + 1.0 / 32), t = t_median_s(call, 7);
    char what[96];
    snprintf(what, sizeof what, "experts mxfp4 E=256 I=1024 H=2304 top=8 n=%u %s", n,
             version == 3 ? "grouped" : "KL_GPU_MOE=v2");
    t_time(what, t, t, bytes, copy_gbps);
    timing_free({dx, dw, dy, di, scratch}, s);
    kl_gpu_experts_version_set(3);
}

int main(void)
{
    if (!t_have_gpu("test_moe"))
        return 77;
    const double copy = t_copy_gbps();
    test_route(copy);
    static const uint32_t tiny_n[] = {1, 3};
    check_experts({KL_GPU_W_F32, 4, 32, 64, 2, 1, 0}, tiny_n, 2);
    check_experts({KL_GPU_W_F32, 3, 33, 37, 2, 1, 0}, tiny_n, 2);
    check_experts({KL_GPU_W_BF16, 5, 40, 24, 3, 1, 0}, tiny_n, 2);
    for (const auto &p : paths) { /* MXFP4 through each per-slot path */
        path_set(p);
        check_experts({KL_GPU_W_MXFP4, 4, 64, 96, 2, 1, 0}, tiny_n, 2);
        check_experts({KL_GPU_W_MXFP4, 5, 96, 960, 3, 1, 0}, tiny_n, 2);
        /* v3: top 40 (3 rounds of down units); gate/up rows of 129 blocks (2 rounds), down
         * rows of 65 blocks (3 rounds), a last down block of 8 rows out of 20 */
        check_experts({KL_GPU_W_MXFP4, 64, 64, 96, 40, 1, 0}, tiny_n, 2);
        check_experts({KL_GPU_W_MXFP4, 4, 2080, 4128, 3, 1, 0}, tiny_n, 1);
        /* tc (whole quads of blocks; other shapes take v3p): gate/up groups without blocks
         * (H = 128), down rows of 2 rounds (I = 640), a group with 1 quad (H = 640), top 40
         * (5 rounds of slots) */
        check_experts({KL_GPU_W_MXFP4, 6, 640, 128, 3, 1, 0}, tiny_n, 2);
        check_experts({KL_GPU_W_MXFP4, 64, 256, 640, 40, 1, 0}, tiny_n, 2);
        check_bad_id(KL_GPU_W_MXFP4, 2);
        check_bad_id(KL_GPU_W_MXFP4, 2, 128, 128);
        g_elsewhere = 1; /* expert parallel: some slots another rank's */
        check_experts({KL_GPU_W_MXFP4, 5, 96, 960, 3, 1, 0}, tiny_n, 2);
        check_experts({KL_GPU_W_MXFP4, 64, 64, 96, 40, 1, 0}, tiny_n, 2);
        check_experts({KL_GPU_W_MXFP4, 64, 256, 640, 40, 1, 0}, tiny_n, 2);
        g_elsewhere = 0;
    }
    g_elsewhere = 1;
    check_experts({KL_GPU_W_F32, 4, 32, 64, 2, 1, 0}, tiny_n, 2);
    check_experts({KL_GPU_W_BF16, 5, 40, 24, 3, 1, 0}, tiny_n, 2);
    g_elsewhere = 0;
    path_set(paths[0]);
    check_decode(KL_GPU_W_MXFP4);
    check_decode(KL_GPU_W_BF16);
    for (int i = 0; i < 5; i++) /* v3p, tc, i8, v3, v3t: their down kernels read idx early */
        check_pdl(paths[i]);
    check_bad_id(KL_GPU_W_F32, 2);
    check_grouped_cases();
    for (const auto &p : paths)
        time_experts(copy, p);
    time_copy_same(copy);
    kl_gpu_experts_grouped_min_set(16); /* time the grouped path at 64 too */
    for (uint32_t n : {64u, 256u}) {
        time_chunk(copy, n, 3);
        time_chunk(copy, n, 2);
    }
    kl_gpu_experts_grouped_min_set(0);
    return t_report("moe", copy);
}
