/*
 * tests/gpu/test_kda.cu — kl_gpu_kda_conv and kl_gpu_kda_recur against a host reference in
 * double that follows engine/forward.c (short_conv, forget_gate, kda_head_token: decay, then
 * u = β (v − Sᵀ k̂), then S += k̂ uᵀ, then o = Sᵀ q̂, then the gated RMSNorm); the kernel's
 * one-pass form is thereby checked against the reference form.  Chunks of several runs in
 * different slots, tiny and full shapes; then the n = 1 full-shape launches timed, with bytes
 * moved / time beside a device-to-device copy.  The recurrence is checked in three versions
 * (v3 the chunked form for runs of >= 16 tokens, v2, round 1's v1; kl_gpu_kda_select), v3
 * also against v2 and in two calls that carry the state; v1 and v2 timed at n = 1, v2 and v3
 * on prefill runs of 256, 1024 and 8192 tokens.  v3's two chunk_apply kernels
 * (kl_gpu_kda_apply_select: 2 the default, the next chunk's records copied while one
 * computes; 1 round 1's) must give bitwise the same o and final state: on every case and on
 * full-shape runs of up to 8,192 tokens (several runs with tails, two calls) without the
 * reference; both timed at 8,192.  Exit 0 pass, 1 fail, 77 no GPU; one JSON line.
 */
#include "kernels/dense.h" /* kl_gpu_matmul_pair_conv */
#include "kernels/kda.h"
#include "tests/gpu/gpu_testutil.h"

#include <string.h>

struct run_spec {
    uint32_t slot, len;
};

struct kda_case {
    const char *name;
    uint32_t H, K, W, slots;
    std::vector<run_spec> runs;
    uint32_t split = 0;       /* > 0: the recurrence in two calls, the first of split tokens */
    float    a_log_add = 0;   /* added to a_log: 3 makes the decay strong (g down to -100) */
};

/* One case's inputs on the host (q, k, v before the conv). */
struct kda_host {
    uint32_t H, K, D, W, n, slots;
    size_t win_stride, state_stride;
    float eps = 1e-6f;
    std::vector<float> qkv[3], taps[3], win, f, beta, gate, a_log, dt, onorm, state;
    std::vector<uint32_t> tok_slot, tok_pos, run_start, run_slot;
};

static void make_host(const kda_case &c, kda_host &x)
{
    x.H = c.H, x.K = c.K, x.D = c.H * c.K, x.W = c.W, x.slots = c.slots, x.n = 0;
    x.win_stride = 3 * (size_t)x.D * (x.W - 1) + 5;  /* strides wider than needed */
    x.state_stride = (size_t)x.H * x.K * x.K + 8;
    x.run_start.push_back(0);
    for (const run_spec &r : c.runs) {
        for (uint32_t i = 0; i < r.len; i++) {
            x.tok_slot.push_back(r.slot);
            x.tok_pos.push_back(3 + i);
        }
        x.n += r.len;
        x.run_start.push_back(x.n);
        x.run_slot.push_back(r.slot);
    }
    const size_t nD = (size_t)x.n * x.D;
    for (int i = 0; i < 3; i++) {
        x.qkv[i] = t_vec_in(nD, -1, 1);
        x.taps[i] = t_vec_in((size_t)x.D * x.W, -0.6f, 0.6f);
    }
    x.win = t_vec_in(x.slots * x.win_stride, -1, 1);
    x.f = t_vec_in(nD, -3, 2);
    x.beta = t_vec_in((size_t)x.n * x.H, -2, 2);
    x.gate = t_vec_in(nD, -2, 2);
    x.a_log = t_vec_in(x.H, -1, 0.5f);
    for (float &v : x.a_log)
        v += c.a_log_add;
    x.dt = t_vec_in(x.D, -1, 1);
    x.onorm = t_vec_in(x.K, 0.5f, 1.5f);
    x.state = t_vec_in(x.slots * x.state_stride, -0.5f, 0.5f);
}

/* ---- host reference (double) ------------------------------------------------------------ */

struct kda_ref {
    std::vector<double> qkv[3], win, o, state;
};

static double sigmoid_d(double z) { return 1.0 / (1.0 + exp(-z)); }
static double softplus_d(double z) { return z > 20.0 ? z : log1p(exp(z)); }

static void ref_conv(const kda_host &x, kda_ref &r)
{
    const uint32_t D = x.D, W = x.W;
    r.win.assign(x.win.begin(), x.win.end());
    for (int w = 0; w < 3; w++) {
        r.qkv[w].assign(x.qkv[w].begin(), x.qkv[w].end());
        for (size_t ri = 0; ri < x.run_slot.size(); ri++)
            for (uint32_t c = 0; c < D; c++) {
                double *st = &r.win[x.run_slot[ri] * x.win_stride + ((size_t)w * D + c) * (W - 1)];
                const float *tap = &x.taps[w][(size_t)c * W];
                for (uint32_t t = x.run_start[ri]; t < x.run_start[ri + 1]; t++) {
                    double in = r.qkv[w][(size_t)t * D + c], a = tap[W - 1] * in;
                    for (uint32_t j = 0; j + 1 < W; j++)
                        a += tap[j] * st[j];
                    for (uint32_t j = 0; j + 2 < W; j++)
                        st[j] = st[j + 1];
                    if (W > 1)
                        st[W - 2] = in;
                    r.qkv[w][(size_t)t * D + c] = a / (1.0 + exp(-a));
                }
            }
    }
}

/* One head h, token t, state S [K][K] of the head: the reference form, step by step. */
static void ref_head_token(const kda_host &x, kda_ref &r, double *S, uint32_t h, uint32_t t)
{
    const uint32_t K = x.K;
    const size_t off = (size_t)t * x.D + (size_t)h * K;
    std::vector<double> q(K), k(K), d(K), u(K), o(K, 0.0);
    double qq = 0, kk = 0;
    for (uint32_t i = 0; i < K; i++) {
        q[i] = r.qkv[0][off + i], k[i] = r.qkv[1][off + i];
        qq += q[i] * q[i], kk += k[i] * k[i];
    }
    for (uint32_t i = 0; i < K; i++) {
        q[i] *= 1.0 / sqrt((double)K) / sqrt(qq + 1e-6);
        k[i] *= 1.0 / sqrt(kk + 1e-6);
        d[i] = exp(-exp((double)x.a_log[h]) * softplus_d((double)x.f[off + i] + x.dt[h * K + i]));
    }
    const double beta = sigmoid_d(x.beta[(size_t)t * x.H + h]);
    for (uint32_t i = 0; i < K; i++)   /* S ← diag(d) S */
        for (uint32_t j = 0; j < K; j++)
            S[i * K + j] *= d[i];
    for (uint32_t j = 0; j < K; j++) { /* u = β (v − Sᵀ k̂) */
        double a = 0;
        for (uint32_t i = 0; i < K; i++)
            a += S[i * K + j] * k[i];
        u[j] = beta * (r.qkv[2][off + j] - a);
    }
    for (uint32_t i = 0; i < K; i++)   /* S += k̂ uᵀ, o = Sᵀ q̂ */
        for (uint32_t j = 0; j < K; j++) {
            S[i * K + j] += k[i] * u[j];
            o[j] += S[i * K + j] * q[i];
        }
    double ss = 0;
    for (uint32_t j = 0; j < K; j++)
        ss += o[j] * o[j];
    const double inv = 1.0 / sqrt(ss / K + x.eps);
    for (uint32_t j = 0; j < K; j++)
        r.o[off + j] = o[j] * inv * x.onorm[j] * sigmoid_d(x.gate[off + j]);
}

static void ref_recur(const kda_host &x, kda_ref &r)
{
    r.state.assign(x.state.begin(), x.state.end());
    r.o.assign((size_t)x.n * x.D, 0.0);
    for (size_t ri = 0; ri < x.run_slot.size(); ri++)
        for (uint32_t h = 0; h < x.H; h++) {
            double *S = &r.state[x.run_slot[ri] * x.state_stride + (size_t)h * x.K * x.K];
            for (uint32_t t = x.run_start[ri]; t < x.run_start[ri + 1]; t++)
                ref_head_token(x, r, S, h, t);
        }
}

/* ---- the device side -------------------------------------------------------------------- */

struct kda_dev {
    kl_gpu_kda_conv_args conv;
    kl_gpu_kda_recur_args recur;
    kl_gpu_tokens tok;
};

/* The case's inputs on the device (kept: t_free_kept frees them), o and the scratch NaN. */
static void upload(const kda_host &x, kda_dev &d)
{
    float *qkv[3], *taps[3];
    for (int i = 0; i < 3; i++) {
        qkv[i] = t_keep(t_upload(x.qkv[i]));
        taps[i] = t_keep(t_upload(x.taps[i]));
    }
    const size_t o_bytes = (size_t)x.n * x.D * sizeof(float);
    const size_t scr_bytes = kl_gpu_kda_scratch(x.n, x.H, x.K) * sizeof(float);
    float *o = t_keep((float *)t_alloc(o_bytes)), *scr = t_keep((float *)t_alloc(scr_bytes));
    T_CHECK(hipMemset(o, 0xff, o_bytes)); /* NaN */
    T_CHECK(hipMemset(scr, 0xff, scr_bytes));
    d.conv = {{qkv[0], qkv[1], qkv[2]}, {taps[0], taps[1], taps[2]}, x.D, x.W,
              t_keep(t_upload(x.win)), x.win_stride};
    d.recur = {qkv[0], qkv[1], qkv[2], t_keep(t_upload(x.f)), t_keep(t_upload(x.beta)),
               t_keep(t_upload(x.gate)), t_keep(t_upload(x.a_log)), t_keep(t_upload(x.dt)),
               t_keep(t_upload(x.onorm)), x.eps, x.H, x.K, t_keep(t_upload(x.state)),
               x.state_stride, o, scr};
    uint32_t max_run = 0;
    for (size_t i = 0; i + 1 < x.run_start.size(); i++)
        max_run = std::max(max_run, x.run_start[i + 1] - x.run_start[i]);
    d.tok = {x.n, (uint32_t)x.run_slot.size(), max_run, 4 + max_run,
             t_keep(t_upload(x.tok_slot)), t_keep(t_upload(x.tok_pos)),
             t_keep(t_upload(x.run_start)), t_keep(t_upload(x.run_slot))};
}

/* Max over blocks of `width` values of the relative L2 error of got against ref. */
static double max_block_err(const std::vector<float> &got, const std::vector<double> &ref,
                            size_t width)
{
    double m = 0;
    for (size_t b = 0; b + width <= ref.size(); b += width)
        m = std::max(m, t_rel_l2_finite(&got[b], &ref[b], width));
    return m;
}

struct kda_errs {
    double conv = 1e30, win = 1e30, o = 1e30, state = 1e30;
    std::vector<float> out, state_out;   /* o and the state pool as the device wrote them */
};

/* 1 when a and b hold the same bits (sizes included). */
static bool same_bits(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && !memcmp(a.data(), b.data(), a.size() * sizeof(float));
}

/* The recurrence of the case: one call, or (c.split, one run) two calls of split and n - split
 * tokens, the state carried from the first to the second. */
static void recur_calls(const kda_case &c, const kda_host &x, const kda_dev &d)
{
    kl_err err;
    kl_err_clear(&err);
    if (!c.split) {
        t_ok(kl_gpu_kda_recur(&d.recur, &d.tok, NULL, &err), &err, "kl_gpu_kda_recur");
        return;
    }
    const uint32_t len[2] = {c.split, x.n - c.split};
    size_t t0 = 0;
    for (int i = 0; i < 2; i++) {
        const uint32_t *rs = t_keep(t_upload(std::vector<uint32_t>{0, len[i]}));
        kl_gpu_kda_recur_args a = d.recur;
        const size_t off = t0 * x.D;
        a.q += off, a.k += off, a.v += off, a.f += off, a.gate += off, a.o += off;
        a.beta_logit += t0 * x.H;
        const kl_gpu_tokens t = {len[i], 1, len[i], 0, nullptr, nullptr, rs, d.tok.run_slot};
        t_ok(kl_gpu_kda_recur(&a, &t, NULL, &err), &err, "kl_gpu_kda_recur");
        t0 += len[i];
    }
}

/* The case on the device with recurrence kernels v (kl_gpu_kda_select) and v3's apply kernel
 * `apply` (kl_gpu_kda_apply_select): its errors into e. */
static void run_version(const kda_case &c, const kda_host &x, const kda_ref &r, int v, int apply,
                        kda_errs *e)
{
    kda_dev d;
    kl_err err;
    kl_err_clear(&err);
    kl_gpu_kda_select(v);
    kl_gpu_kda_apply_select(apply);
    upload(x, d);
    t_ok(kl_gpu_kda_conv(&d.conv, &d.tok, NULL, &err), &err, "kl_gpu_kda_conv");
    recur_calls(c, x, d);
    e->conv = 0;
    for (int w = 0; w < 3; w++) {
        const std::vector<float> qkv = t_download(d.conv.qkv[w], r.qkv[w].size());
        e->conv = std::max(e->conv, t_rel_l2_finite(qkv.data(), r.qkv[w].data(), qkv.size()));
    }
    const std::vector<float> win = t_download(d.conv.win, x.win.size());
    e->out = t_download(d.recur.o, r.o.size());
    e->state_out = t_download(d.recur.state, x.state.size());
    const std::vector<float> &state = e->state_out;
    e->win = t_rel_l2_finite(win.data(), r.win.data(), win.size());
    e->o = max_block_err(e->out, r.o, x.K);
    e->state = 0;
    for (uint32_t s = 0; s < x.slots; s++)
        for (uint32_t h = 0; h < x.H; h++) {
            size_t b = s * x.state_stride + (size_t)h * x.K * x.K;
            e->state = std::max(e->state,
                                t_rel_l2_finite(&state[b], &r.state[b], (size_t)x.K * x.K));
        }
    fprintf(stderr, "test_kda: %-16s v%d apply %d conv %.2e win %.2e o %.2e state %.2e\n",
            c.name, v, apply, e->conv, e->win, e->o, e->state);
    t_free_kept();
}

/* The case with the three versions: e[v - 1] (v3 with the default apply kernel); *v3_v2:
 * v3's o against v2's (max over the (token, head) blocks of the relative L2 error);
 * *apply_same: v3 with apply kernel 1 gave bitwise the same o and state. */
static void run_case(const kda_case &c, kda_errs e[3], double *v3_v2, bool *apply_same)
{
    kda_host x;
    kda_ref r;
    kda_errs e31;
    make_host(c, x);
    ref_conv(x, r);
    ref_recur(x, r);
    run_version(c, x, r, 3, 2, &e[2]);
    run_version(c, x, r, 3, 1, &e31);
    run_version(c, x, r, 2, 0, &e[1]);
    run_version(c, x, r, 1, 0, &e[0]);
    kl_gpu_kda_select(0);
    kl_gpu_kda_apply_select(0);
    const std::vector<double> o2(e[1].out.begin(), e[1].out.end());
    *v3_v2 = max_block_err(e[2].out, o2, x.K);
    *apply_same = same_bits(e[2].out, e31.out) && same_bits(e[2].state_out, e31.state_out);
}

/* ---- the conv riding in the gate expansions' launch ------------------------------------ */

/* kl_gpu_matmul_pair_conv (dense.h) on the case, the conv riding in the pair's launch (one
 * run of one token, D <= the products' rows) or not, against kl_gpu_kda_conv then
 * kl_gpu_matmul_pair (f_b and g_b's shapes, [4096, 128] BF16): true when q, k, v, the
 * windows and both products agree bit for bit. */
static bool conv_rides(const kda_case &c)
{
    const size_t rows = 4096, cols = 128;
    kda_host x;
    make_host(c, x);
    kda_dev d[2];
    upload(x, d[0]);
    upload(x, d[1]);
    const t_mat ma = t_mat_random(KL_GPU_W_BF16, rows, cols);
    const t_mat mb = t_mat_random(KL_GPU_W_BF16, rows, cols);
    const kl_gpu_mat wa = t_mat_upload(ma), wb = t_mat_upload(mb);
    float *xa = t_keep(t_upload(t_vec(x.n * cols))), *xb = t_keep(t_upload(t_vec(x.n * cols)));
    float *y[2][2];
    for (auto &f : y)
        for (auto &p : f)
            p = t_keep((float *)t_alloc(x.n * rows * sizeof(float)));
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_matmul_pair_conv(&wa, xa, y[0][0], &wb, xb, y[0][1], &d[0].conv, &d[0].tok,
                                 NULL, &err), &err, "kl_gpu_matmul_pair_conv");
    t_ok(kl_gpu_kda_conv(&d[1].conv, &d[1].tok, NULL, &err), &err, "kl_gpu_kda_conv");
    t_ok(kl_gpu_matmul_pair(&wa, xa, y[1][0], &wb, xb, y[1][1], x.n, NULL, &err), &err,
         "kl_gpu_matmul_pair");
    bool same = same_bits(t_download(d[0].conv.win, x.win.size()),
                          t_download(d[1].conv.win, x.win.size()));
    for (int w = 0; w < 3; w++)
        same = same && same_bits(t_download(d[0].conv.qkv[w], (size_t)x.n * x.D),
                                 t_download(d[1].conv.qkv[w], (size_t)x.n * x.D));
    for (int p = 0; p < 2; p++)
        same = same && same_bits(t_download(y[0][p], x.n * rows), t_download(y[1][p], x.n * rows));
    t_mat_free(wa);
    t_mat_free(wb);
    t_free_kept();
    fprintf(stderr, "test_kda: %-16s conv riding == its own launch: %s\n", c.name,
            same ? "yes" : "NO");
    return same;
}

/* ---- v3's apply kernels, bitwise, at full shapes (no reference: the runs are long) --------- */

/* The case's recurrence (after the conv, once) with v3 and each apply kernel, from the same
 * state: true when o and the state pool agree bit for bit. */
static bool apply_ab(const kda_case &c)
{
    kda_host x;
    kda_dev d;
    kl_err err;
    kl_err_clear(&err);
    make_host(c, x);
    std::vector<float> o[2], st[2];
    upload(x, d);
    t_ok(kl_gpu_kda_conv(&d.conv, &d.tok, NULL, &err), &err, "kl_gpu_kda_conv");
    kl_gpu_kda_select(3);
    for (int i = 0; i < 2; i++) {
        const size_t n_o = (size_t)x.n * x.D;
        kl_gpu_kda_apply_select(i + 1);
        T_CHECK(hipMemcpy(d.recur.state, x.state.data(), x.state.size() * sizeof(float),
                          hipMemcpyHostToDevice));
        T_CHECK(hipMemset(d.recur.o, 0xff, n_o * sizeof(float)));
        recur_calls(c, x, d);
        o[i] = t_download(d.recur.o, n_o);
        st[i] = t_download(d.recur.state, x.state.size());
    }
    kl_gpu_kda_select(0);
    kl_gpu_kda_apply_select(0);
    t_free_kept();
    const bool same = same_bits(o[0], o[1]) && same_bits(st[0], st[1]);
    fprintf(stderr, "test_kda: %-16s apply 1 and 2 %s\n", c.name,
            same ? "bitwise equal" : "DIFFER");
    return same;
}

/* The launchers refuse what they cannot do: K > 128, W > 8, NULL inputs, runs > tokens,
 * scratch not 16-byte aligned. */
static bool refusals(void)
{
    kda_case c = {"refusals", 2, 16, 4, 1, {{0, 2}}};
    kda_host x;
    kda_dev d;
    make_host(c, x);
    upload(x, d);
    kl_err e;
    kl_err_clear(&e);
    kl_gpu_kda_recur_args rk = d.recur, rs = d.recur;
    rk.K = 129;
    rs.scratch += 1;
    kl_gpu_kda_conv_args cw = d.conv, cn = d.conv;
    cw.W = 9;
    cn.qkv[1] = nullptr;
    kl_gpu_tokens bad = d.tok;
    bad.n_runs = 3;
    return kl_gpu_kda_recur(&rk, &d.tok, NULL, &e) == KL_E_USAGE &&
           kl_gpu_kda_conv(&cw, &d.tok, NULL, &e) == KL_E_USAGE &&
           kl_gpu_kda_conv(&cn, &d.tok, NULL, &e) == KL_E_USAGE &&
           kl_gpu_kda_recur(&d.recur, &bad, NULL, &e) == KL_E_USAGE &&
           kl_gpu_kda_recur(&rs, &d.tok, NULL, &e) == KL_E_USAGE;
}

/* ---- timing at the full shape, n = 1 ----------------------------------------------------- */

struct kda_times {
    double conv_us = 0, recur_us[2] = {0, 0}, copy_gbps = 0; /* recur_us[v - 1] */
    size_t conv_bytes = 0, recur_bytes = 0;
};

/* One token of the full shape; the state rotates over 64 slots (128 MiB, past the L2). */
static void time_full(kda_times *tm)
{
    const uint32_t slots = 64, H = 32, K = 128, D = H * K, W = 4;
    kda_case c = {"timing", H, K, W, 1, {{0, 1}}};
    kda_host x;
    kda_dev d;
    make_host(c, x);
    std::vector<uint32_t> slot_ids(slots);
    for (uint32_t s = 0; s < slots; s++)
        slot_ids[s] = s;
    const size_t sstride = (size_t)H * K * K, wstride = 3 * (size_t)D * (W - 1);
    upload(x, d);
    const uint32_t *ids = t_keep(t_upload(slot_ids));
    float *state = t_keep((float *)t_alloc(slots * sstride * sizeof(float)));
    float *win = t_keep((float *)t_alloc(slots * wstride * sizeof(float)));
    T_CHECK(hipMemset(state, 0x3c, slots * sstride * sizeof(float)));
    T_CHECK(hipMemset(win, 0x3c, slots * wstride * sizeof(float)));
    d.recur.state = state, d.recur.state_stride = sstride;
    d.conv.win = win, d.conv.win_stride = wstride;
    kl_gpu_tokens tok = d.tok;
    kl_err err;
    kl_err_clear(&err);
    auto conv = [&](int i, kl_gpu_stream st) {
        tok.run_slot = ids + i % slots;
        t_ok(kl_gpu_kda_conv(&d.conv, &tok, st, &err), &err, "kl_gpu_kda_conv");
    };
    auto recur = [&](int i, kl_gpu_stream st) {
        tok.run_slot = ids + i % slots;
        t_ok(kl_gpu_kda_recur(&d.recur, &tok, st, &err), &err, "kl_gpu_kda_recur");
    };
    for (int v = 1; v <= 2; v++) {
        kl_gpu_kda_select(v);
        tm->recur_us[v - 1] = t_median_s(recur, 41) * 1e6;
    }
    kl_gpu_kda_select(0);
    tm->conv_us = t_median_s(conv, 41) * 1e6;
    tm->copy_gbps = t_copy_gbps((size_t)256 << 20);
    /* conv: q, k, v read and written, taps read, windows read and written */
    tm->conv_bytes = 3 * ((size_t)D * 2 + (size_t)D * W + (size_t)D * (W - 1) * 2) * 4;
    /* recur: the state read and written, q k v f gate in and o out, the small vectors */
    tm->recur_bytes = (2 * sstride + 6 * (size_t)D + D + K + 2 * H) * 4;
}

/* ---- prefill timing: one run of n tokens at the full shape, v2 against v3 ---------------- */

struct prefill_time {
    uint32_t n = 0;
    double us[3] = {0, 0, 0};   /* v2, v3, v3 with apply kernel 1 (recurrence and norm) */
    double v3_flop = 0;      /* v3's arithmetic, for its GFLOP/s */
};

/* v3's floating-point operations for n tokens in one run (chunks of 32, H = 32, K = 128):
 * per chunk and head the scores (2 sums over K per pair s <= t), the forward substitution
 * (2 K columns), u and the inter-chunk readout (2 C K K), the intra-chunk one, the update. */
static double v3_flop(uint32_t n)
{
    const double C = 32, K = 128, H = 32, chunks = ceil(n / C);
    const double per = C * (C + 1) / 2 * K * 4 + C * (C - 1) / 2 * 2 * K * 2 + 2 * C * K * K * 2 +
                       C * (C + 1) / 2 * K * 2 + C * K * K * 2;
    return chunks * H * per;
}

static void time_prefill(uint32_t n, prefill_time *pt)
{
    kda_case c = {"prefill", 32, 128, 4, 1, {{0, n}}};
    kda_host x;
    kda_dev d;
    make_host(c, x);
    upload(x, d);
    pt->n = n;
    pt->v3_flop = v3_flop(n);
    kl_err err;
    kl_err_clear(&err);
    auto recur = [&](int, kl_gpu_stream st) {
        t_ok(kl_gpu_kda_recur(&d.recur, &d.tok, st, &err), &err, "kl_gpu_kda_recur");
    };
    for (int i = 0; i < 3; i++) { /* v2; v3 with apply kernel 2, then 1 */
        kl_gpu_kda_select(i ? 3 : 2);
        kl_gpu_kda_apply_select(i == 2 ? 1 : 2);
        pt->us[i] = t_median_s(recur, i ? 11 : 5) * 1e6;
    }
    kl_gpu_kda_select(0);
    kl_gpu_kda_apply_select(0);
    t_free_kept();
}

static void print_prefill(const prefill_time &p, bool last)
{
    printf("{\"n\":%u,\"v2_us\":%.1f,\"v2_us_per_token\":%.3f,\"v3_us\":%.1f,"
           "\"v3_us_per_token\":%.3f,\"v3_tok_s\":%.0f,\"v3_gflops\":%.1f,\"speedup\":%.2f,"
           "\"v3_apply1_us\":%.1f,\"apply2_saves_us\":%.1f}%s",
           p.n, p.us[0], p.us[0] / p.n, p.us[1], p.us[1] / p.n, p.n / (p.us[1] * 1e-6),
           p.v3_flop / (p.us[1] * 1e-6) / 1e9, p.us[0] / p.us[1], p.us[2], p.us[2] - p.us[1],
           last ? "" : ",");
}

/* ---- main -------------------------------------------------------------------------------- */

static const char *const version_name[3] = {"v1", "v2", "v3"};

int main(void)
{
    if (!t_have_gpu("test_kda"))
        return 77;
    const kda_case cases[] = {
        {"tiny_3runs", 2, 16, 4, 3, {{2, 3}, {0, 1}, {1, 4}}},
        {"odd_K40_W2", 3, 40, 2, 2, {{1, 2}, {0, 5}}},
        {"tiny_W1", 2, 32, 1, 2, {{1, 3}}},
        {"full_n1", 32, 128, 4, 2, {{1, 1}}},
        {"full_3runs", 32, 128, 4, 3, {{0, 5}, {2, 1}, {1, 3}}},
        {"odd_K40_run50", 3, 40, 2, 2, {{1, 50}, {0, 17}}},
        {"run16", 32, 128, 4, 2, {{1, 16}}},
        {"run64", 32, 128, 4, 2, {{0, 64}}},
        {"run100_strong", 32, 128, 4, 2, {{1, 100}}, 0, 3.0f},
        {"run256", 32, 128, 4, 2, {{1, 256}}},
        {"run1000", 32, 128, 4, 1, {{0, 1000}}},
        {"runs3_100_16_64", 32, 128, 4, 3, {{0, 100}, {2, 16}, {1, 64}}},
        {"runs3_1000_37_256", 32, 128, 4, 3, {{2, 1000}, {0, 37}, {1, 256}}},
        {"calls_128_128", 32, 128, 4, 2, {{1, 256}}, 128},
        {"calls_100_45", 32, 128, 4, 2, {{0, 145}}, 100},
        /* the conv's token segments (runs >= 64): W 2 and 1, a run shorter than a segment */
        {"K40_W2_run70", 3, 40, 2, 2, {{1, 70}, {0, 9}}},
        {"W1_run80", 2, 32, 1, 1, {{0, 80}}},
        {"runs2_300_3", 32, 128, 4, 2, {{0, 300}, {1, 3}}},
    };
    const size_t nc = sizeof cases / sizeof cases[0];
    double worst[3] = {0, 0, 0}, worst_v3_v2 = 0;
    std::vector<double> case_err[3], case_v3_v2;
    std::vector<int> case_same; /* v3's apply kernels bitwise equal */
    bool all_same = true;
    for (const kda_case &c : cases) {
        kda_errs e[3];
        double d32 = 1e30;
        bool same = false;
        run_case(c, e, &d32, &same);
        case_same.push_back(same);
        all_same = all_same && same;
        for (int v = 0; v < 3; v++) {
            const double m = std::max({e[v].conv, e[v].win, e[v].o, e[v].state});
            worst[v] = std::max(worst[v], m);
            case_err[v].push_back(std::max(e[v].o, e[v].state));
        }
        worst_v3_v2 = std::max(worst_v3_v2, d32);
        case_v3_v2.push_back(d32);
        t_free_kept();
    }
    const bool refused = refusals();
    t_free_kept();
    /* full shapes (and K 40, 64): one run of 8,192; runs with tails of 25, 13, 26 tokens; two
     * calls, the first ending mid-chunk; strong decay */
    const kda_case ab[] = {
        {"ab_8192", 32, 128, 4, 1, {{0, 8192}}},
        {"ab_runs_tails", 32, 128, 4, 3, {{0, 3001}, {2, 45}, {1, 4090}}},
        {"ab_calls_4100", 32, 128, 4, 2, {{1, 8192}}, 4100},
        {"ab_K40_strong", 3, 40, 2, 2, {{1, 999}, {0, 77}}, 0, 3.0f},
        {"ab_K64", 8, 64, 4, 1, {{0, 517}}},
    };
    const size_t nab = sizeof ab / sizeof ab[0];
    bool ab_same[nab];
    for (size_t i = 0; i < nab; i++) {
        ab_same[i] = apply_ab(ab[i]);
        all_same = all_same && ab_same[i];
    }
    /* the conv riding (one token, D = 4096 and 120, windows of 3 and 1) and not (3 runs) */
    const kda_case rides[] = {
        {"ride_full_n1", 32, 128, 4, 2, {{1, 1}}},
        {"ride_K40_W2_n1", 3, 40, 2, 2, {{0, 1}}},
        {"ride_runs3", 32, 128, 4, 3, {{0, 5}, {2, 1}, {1, 3}}},
    };
    const size_t nr = sizeof rides / sizeof rides[0];
    bool ride_same[nr], rides_same = true;
    for (size_t i = 0; i < nr; i++) {
        ride_same[i] = conv_rides(rides[i]);
        rides_same = rides_same && ride_same[i];
    }
    kda_times tm;
    prefill_time pf[3];
    const uint32_t pn[3] = {256, 1024, 8192};
    time_full(&tm);
    t_free_kept();
    for (int i = 0; i < 3; i++)
        time_prefill(pn[i], &pf[i]);
    const double all = std::max({worst[0], worst[1], worst[2], worst_v3_v2});
    const int ok = refused && all < 1e-4 && all_same && rides_same;
    printf("{\"test\":\"kda\",\"ok\":%s,\"refusals\":%s,\"max_rel_l2\":%.3g,"
           "\"max_v3_vs_v2\":%.3g,\"apply_bitwise\":%s,\"cases\":[", ok ? "true" : "false",
           refused ? "true" : "false", all, worst_v3_v2, all_same ? "true" : "false");
    for (size_t i = 0; i < nc; i++) /* per case: max of o and state errors per version */
        printf("{\"case\":\"%s\",\"v3\":%.3g,\"v2\":%.3g,\"v1\":%.3g,\"v3_vs_v2\":%.3g,"
               "\"apply_same\":%s}%s", cases[i].name, case_err[2][i], case_err[1][i],
               case_err[0][i], case_v3_v2[i], case_same[i] ? "true" : "false",
               i + 1 < nc ? "," : "],");
    printf("\"conv_rides\":[");
    for (size_t i = 0; i < nr; i++)
        printf("{\"case\":\"%s\",\"same\":%s}%s", rides[i].name,
               ride_same[i] ? "true" : "false", i + 1 < nr ? "," : "],");
    printf("\"apply_ab\":[");
    for (size_t i = 0; i < nab; i++)
        printf("{\"case\":\"%s\",\"same\":%s}%s", ab[i].name, ab_same[i] ? "true" : "false",
               i + 1 < nab ? "," : "],");
    for (int v = 3; v >= 1; v--)
        printf("\"%s_max_rel_l2\":%.3g,", version_name[v - 1], worst[v - 1]);
    for (int v = 2; v >= 1; v--) {
        const double us = tm.recur_us[v - 1], gbps = tm.recur_bytes / (us * 1e-6) / 1e9;
        printf("\"%s_n1\":{\"recur_us\":%.2f,\"recur_gbps\":%.1f,"
               "\"recur_ratio_to_copy\":%.3f},", version_name[v - 1], us, gbps,
               gbps / tm.copy_gbps);
    }
    printf("\"prefill\":[");
    for (int i = 0; i < 3; i++)
        print_prefill(pf[i], i == 2);
    printf("],\"conv_us\":%.2f,\"conv_bytes\":%zu,\"recur_bytes\":%zu,"
           "\"d2d_copy_gbps\":%.1f}\n", tm.conv_us, tm.conv_bytes, tm.recur_bytes, tm.copy_gbps);
    return ok ? 0 : 1;
}
