/*
 * tests/gpu/gpu_testutil.h — what the device tests share: random data, weight matrices on host
 * and device (every kl_gpu_wkind) with the host decoding of a row, device buffers (freed one by
 * one, or kept and freed together), relative L2 errors, event timing (median of single calls,
 * graph replays) and the device-to-device copy rate.  Header only; a failing runtime call
 * prints where and exits 1 (tests only).
 */
#ifndef KL_TESTS_GPU_TESTUTIL_H
#define KL_TESTS_GPU_TESTUTIL_H

#include "kernels/gpu.h"
#include "kernels/gpu_api.h"
#include "kernels/runtime.h" /* t_pdl_graph_s: graphs with programmatic edges */

#include "common/mxfp4_format.h"

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

#define T_CHECK(call)                                                                       \
    do {                                                                                    \
        hipError_t e_ = (call);                                                             \
        if (e_ != hipSuccess) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                   \
                    hipGetErrorString(e_));                                                 \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* Exits 1 with the launcher's message when rc is not 0. */
static inline void t_ok(int rc, const kl_err *err, const char *what)
{
    if (rc) {
        fprintf(stderr, "%s: %s (%d)\n", what, err->msg, rc);
        exit(1);
    }
}

/* 1 when a GPU is present (else the test should exit 77). */
static inline int t_have_gpu(const char *test)
{
    int n = 0;
    if (hipGetDeviceCount(&n) != hipSuccess || n == 0) {
        fprintf(stderr, "%s: no GPU, skipped\n", test);
        return 0;
    }
    return 1;
}

/* ---- random data ------------------------------------------------------------------------- */

/* xorshift64 from a fixed seed: the same sequence on every run. */
#define T_RNG_SEED 88172645463325252ull
static uint64_t t_rng_state = T_RNG_SEED;
static inline uint32_t t_u32(void)
{
    t_rng_state ^= t_rng_state << 13;
    t_rng_state ^= t_rng_state >> 7;
    t_rng_state ^= t_rng_state << 17;
    return (uint32_t)(t_rng_state >> 11);
}
/* Uniform in [-1, 1), multiples of 2^-20. */
static inline float t_uniform(void)
{
    return (float)((int32_t)(t_u32() % (1u << 21)) - (1 << 20)) / (float)(1 << 20);
}
static inline std::vector<float> t_vec(size_t n)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = t_uniform();
    return v;
}
/* Uniform in [lo, hi), steps of (hi - lo) / 10^6: a draw of its own, not t_uniform scaled, so
 * the data test_kda and test_mla were tuned on stay what they were. */
static inline float t_uniform_in(float lo, float hi)
{
    return lo + (hi - lo) * (float)(t_u32() % 1000000u) / 1e6f;
}
static inline std::vector<float> t_vec_in(size_t n, float lo, float hi)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = t_uniform_in(lo, hi);
    return v;
}
/* Starts the sequence over: a stage's data then do not depend on what ran before it. */
static inline void t_rng_reset(void)
{
    t_rng_state = T_RNG_SEED;
}

/* ---- device buffers ---------------------------------------------------------------------- */

static inline void *t_alloc(size_t bytes)
{
    void *p = nullptr;
    T_CHECK(hipMalloc(&p, bytes ? bytes : 16));
    return p;
}
template <class T> static inline T *t_upload(const std::vector<T> &v)
{
    T *d = (T *)t_alloc(v.size() * sizeof(T));
    T_CHECK(hipMemcpy(d, v.data(), v.size() * sizeof(T), hipMemcpyHostToDevice));
    return d;
}
template <class T> static inline std::vector<T> t_download(const T *d, size_t n)
{
    std::vector<T> v(n);
    T_CHECK(hipDeviceSynchronize());
    T_CHECK(hipMemcpy(v.data(), d, n * sizeof(T), hipMemcpyDeviceToHost));
    return v;
}

/* Buffers kept for t_free_kept: a test that allocates many buffers per case keeps them
 * (t_keep(t_upload(v))) and frees them all at the case's end, with no pointer passed back. */
static std::vector<void *> t_kept;
template <class T> static inline T *t_keep(T *p)
{
    t_kept.push_back((void *)p);
    return p;
}
static inline void t_free_kept(void)
{
    for (void *p : t_kept)
        hipFree(p);
    t_kept.clear();
}

/* ---- weight matrices --------------------------------------------------------------------- */

/* A matrix [rows, cols] of one kind on the host: random values every kind holds exactly
 * (BF16: uniform floats cut to bf16; MXFP4: random codes, scales 2^-8..2^7). */
struct t_mat {
    kl_gpu_wkind kind;
    size_t rows, cols;
    std::vector<float> f32;
    std::vector<uint16_t> bf16;
    std::vector<uint8_t> packed, scale;
};

static inline t_mat t_mat_random(kl_gpu_wkind kind, size_t rows, size_t cols)
{
    t_mat m;
    m.kind = kind;
    m.rows = rows;
    m.cols = cols;
    if (kind == KL_GPU_W_F32) {
        m.f32 = t_vec(rows * cols);
    } else if (kind == KL_GPU_W_BF16) {
        m.bf16.resize(rows * cols);
        for (auto &b : m.bf16) {
            const float f = t_uniform();
            uint32_t u;
            memcpy(&u, &f, 4);
            b = (uint16_t)(u >> 16);
        }
    } else {
        m.packed.resize(rows * cols / 2);
        m.scale.resize(rows * cols / KL_MXFP4_BLOCK);
        for (auto &b : m.packed)
            b = (uint8_t)t_u32();
        for (auto &s : m.scale)
            s = (uint8_t)(119 + t_u32() % 16);
    }
    return m;
}

/* Row r of m as fp32 (exact). */
static inline void t_mat_row(const t_mat &m, size_t r, float *out)
{
    if (m.kind == KL_GPU_W_F32) {
        memcpy(out, &m.f32[r * m.cols], m.cols * sizeof(float));
    } else if (m.kind == KL_GPU_W_BF16) {
        for (size_t c = 0; c < m.cols; c++) {
            const uint32_t u = (uint32_t)m.bf16[r * m.cols + c] << 16;
            memcpy(&out[c], &u, 4);
        }
    } else {
        kl_mxfp4_dequantize_row(&m.packed[r * m.cols / 2], &m.scale[r * m.cols / 32], m.cols,
                                out);
    }
}

/* Payload bytes as stored. */
static inline size_t t_mat_bytes(const t_mat &m)
{
    return m.f32.size() * 4 + m.bf16.size() * 2 + m.packed.size() + m.scale.size();
}

/* m copied to the device (payloads never freed: tests are short programs). */
static inline kl_gpu_mat t_mat_upload(const t_mat &m)
{
    kl_gpu_mat d;
    memset(&d, 0, sizeof d);
    d.kind = m.kind;
    d.rows = (uint32_t)m.rows;
    d.cols = (uint32_t)m.cols;
    if (m.kind == KL_GPU_W_F32)
        d.data = t_upload(m.f32);
    else if (m.kind == KL_GPU_W_BF16)
        d.data = t_upload(m.bf16);
    else {
        d.packed = t_upload(m.packed);
        d.scale = t_upload(m.scale);
    }
    return d;
}

/* A device copy of d's payloads (bytes: the host matrix's), for timing without the L2. */
static inline kl_gpu_mat t_mat_replica(const kl_gpu_mat &d, const t_mat &m)
{
    kl_gpu_mat c = d;
    void *a = t_alloc(m.f32.size() * 4 + m.bf16.size() * 2 + m.packed.size());
    if (m.kind == KL_GPU_W_MXFP4) {
        void *s = t_alloc(m.scale.size());
        T_CHECK(hipMemcpy(a, d.packed, m.packed.size(), hipMemcpyDeviceToDevice));
        T_CHECK(hipMemcpy(s, d.scale, m.scale.size(), hipMemcpyDeviceToDevice));
        c.packed = (const uint8_t *)a;
        c.scale = (const uint8_t *)s;
    } else {
        T_CHECK(hipMemcpy(a, d.data, t_mat_bytes(m), hipMemcpyDeviceToDevice));
        c.data = a;
    }
    return c;
}

/* m on the device and copies of it, >= 512 MB in all (at most 256): weights rotated over them
 * in timed calls cannot stay in the L2. */
static inline std::vector<kl_gpu_mat> t_mat_rotation(const t_mat &m)
{
    const size_t copies = std::min<size_t>(256, ((size_t)512 << 20) / t_mat_bytes(m) + 1);
    std::vector<kl_gpu_mat> w(1, t_mat_upload(m));
    while (w.size() < copies)
        w.push_back(t_mat_replica(w[0], m));
    return w;
}

/* Frees what t_mat_upload or t_mat_replica allocated. */
static inline void t_mat_free(const kl_gpu_mat &d)
{
    hipFree((void *)d.data);
    hipFree((void *)d.packed);
    hipFree((void *)d.scale);
}

static inline const char *t_kind_name(kl_gpu_wkind k)
{
    return k == KL_GPU_W_F32 ? "f32" : k == KL_GPU_W_BF16 ? "bf16" : "mxfp4";
}

/* ---- errors ------------------------------------------------------------------------------ */

/* ‖y - ref‖ / ‖ref‖ over n values (‖y - ref‖ when ref is 0); NaN when y holds a NaN. */
static inline double t_rel_l2(const float *y, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)y[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
}

/* t_rel_l2 as a finite number: 1e30 when y holds a NaN or an infinity.  As much a failure,
 * but one that std::max keeps (it drops a NaN) and JSON can print: for errors taken as a max. */
static inline double t_rel_l2_finite(const float *y, const double *ref, size_t n)
{
    const double e = t_rel_l2(y, ref, n);
    return e <= 1e30 ? e : 1e30;
}

/* ---- timing ------------------------------------------------------------------------------ */

/* Median seconds of one call fn(i, NULL) over reps calls (i = 0..reps-1), each between two
 * events on the default stream, after two warm-up calls: what one launch costs alone. */
template <class F> static double t_median_s(F fn, int reps)
{
    std::vector<hipEvent_t> a(reps), b(reps);
    for (int i = 0; i < reps; i++) {
        T_CHECK(hipEventCreate(&a[i]));
        T_CHECK(hipEventCreate(&b[i]));
    }
    fn(0, (kl_gpu_stream)NULL);
    fn(1 % reps, (kl_gpu_stream)NULL);
    for (int i = 0; i < reps; i++) {
        T_CHECK(hipEventRecord(a[i], 0));
        fn(i, (kl_gpu_stream)NULL);
        T_CHECK(hipEventRecord(b[i], 0));
    }
    T_CHECK(hipEventSynchronize(b[reps - 1]));
    std::vector<double> s(reps);
    for (int i = 0; i < reps; i++) {
        float ms = 0;
        T_CHECK(hipEventElapsedTime(&ms, a[i], b[i]));
        s[i] = ms / 1e3;
        hipEventDestroy(a[i]);
        hipEventDestroy(b[i]);
    }
    std::sort(s.begin(), s.end());
    return s[reps / 2];
}

/* Seconds per call of fn(i, stream) when reps calls (i = 0..reps-1) are captured in one graph
 * and replayed (as the engine runs a decode step): the median over 7 timed replays, after one
 * warm-up replay, divided by reps. */
template <class F> static double t_graph_s(F fn, int reps)
{
    hipStream_t st;
    hipGraph_t g;
    hipGraphExec_t ge;
    hipEvent_t a, b;
    T_CHECK(hipStreamCreateWithFlags(&st, hipStreamNonBlocking));
    T_CHECK(hipStreamBeginCapture(st, hipStreamCaptureModeThreadLocal));
    for (int i = 0; i < reps; i++)
        fn(i, (kl_gpu_stream)st);
    T_CHECK(hipStreamEndCapture(st, &g));
    T_CHECK(hipGraphInstantiateWithFlags(&ge, g, 0));
    T_CHECK(hipEventCreate(&a));
    T_CHECK(hipEventCreate(&b));
    T_CHECK(hipGraphLaunch(ge, st));
    std::vector<double> s(7);
    for (auto &v : s) {
        float ms = 0;
        T_CHECK(hipEventRecord(a, st));
        T_CHECK(hipGraphLaunch(ge, st));
        T_CHECK(hipEventRecord(b, st));
        T_CHECK(hipEventSynchronize(b));
        T_CHECK(hipEventElapsedTime(&ms, a, b));
        v = ms / 1e3 / reps;
    }
    hipEventDestroy(a);
    hipEventDestroy(b);
    hipGraphExecDestroy(ge);
    hipGraphDestroy(g);
    hipStreamDestroy(st);
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
}

/* Device-to-device copy rate of a buffer of `bytes` (1 GiB unless told; test_kda and test_mla
 * have always copied 256 MiB), bytes read plus written per second (GB/s). */
static inline double t_copy_gbps(size_t bytes = (size_t)1 << 30)
{
    void *src = t_alloc(bytes), *dst = t_alloc(bytes);
    T_CHECK(hipMemset(src, 1, bytes));
    const double s = t_median_s(
        [&](int, kl_gpu_stream) {
            T_CHECK(hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToDevice, 0));
        },
        20);
    hipFree(src);
    hipFree(dst);
    return 2.0 * bytes / s / 1e9;
}

/* A kl_gpu_stream, or exit 1. */
static inline kl_gpu_stream t_stream(void)
{
    kl_gpu_stream st;
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_stream_create(&st, &err), &err, "kl_gpu_stream_create");
    return st;
}

/* Seconds per call of fn(i, st), i < reps, captured once as the decode step is
 * (kernels/runtime.h: programmatic kernel-to-kernel edges unless KL_GPU_PDL=0), replayed after
 * a warm-up replay. */
template <class F> static double t_pdl_graph_s(F fn, int reps)
{
    kl_gpu_stream st = t_stream();
    kl_gpu_graph g;
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_capture_begin(st, &err), &err, "kl_gpu_capture_begin");
    for (int i = 0; i < reps; i++)
        fn(i, st);
    t_ok(kl_gpu_capture_end(st, &g, NULL, 1, &err), &err, "kl_gpu_capture_end");
    t_ok(kl_gpu_graph_launch(g, st, &err), &err, "kl_gpu_graph_launch");
    kl_gpu_timer tm;
    double ms = 0;
    t_ok(kl_gpu_timer_begin(&tm, st, &err), &err, "kl_gpu_timer_begin");
    t_ok(kl_gpu_graph_launch(g, st, &err), &err, "kl_gpu_graph_launch");
    t_ok(kl_gpu_timer_end(tm, st, &ms, &err), &err, "kl_gpu_timer_end");
    kl_gpu_graph_destroy(g);
    kl_gpu_stream_destroy(st);
    return ms / 1e3 / reps;
}

/* ---- results: checks and timings, printed as one JSON line ------------------------------- */

static int t_all_ok = 1;
static std::string t_checks, t_times;

/* Records one check (err must be <= tol; NaN fails). */
static inline void t_check(const char *what, double err, double tol)
{
    const int ok = err <= tol;
    t_all_ok &= ok;
    char buf[256];
    snprintf(buf, sizeof buf, "%s{\"what\":\"%s\",\"err\":%.3g,\"ok\":%s}",
             t_checks.empty() ? "" : ",", what, err, ok ? "true" : "false");
    t_checks += buf;
    if (!ok)
        fprintf(stderr, "FAIL %s: %.3g > %.3g\n", what, err, tol);
}

/* Records a timing: one call alone (s1) and per call in a graph replay (sg), with the GB/s
 * of the bytes it must read and the ratio to the copy rate (from the replay). */
static inline void t_time(const char *what, double s1, double sg, double bytes,
                          double copy_gbps)
{
    char buf[320];
    const double gbps = bytes / sg / 1e9;
    snprintf(buf, sizeof buf,
             "%s{\"what\":\"%s\",\"bytes\":%.0f,\"us\":%.2f,\"graph_us\":%.2f,"
             "\"graph_gbps\":%.1f,\"ratio_to_copy\":%.3f}",
             t_times.empty() ? "" : ",", what, bytes, s1 * 1e6, sg * 1e6, gbps,
             gbps / copy_gbps);
    t_times += buf;
}

/* Prints the JSON line; the exit status: 0 when every check passed, else 1. */
static inline int t_report(const char *test, double copy_gbps)
{
    printf("{\"test\":\"%s\",\"ok\":%s,\"d2d_copy_gbps\":%.1f,\"checks\":[%s],"
           "\"timing\":[%s]}\n",
           test, t_all_ok ? "true" : "false", copy_gbps, t_checks.c_str(), t_times.c_str());
    return t_all_ok ? 0 : 1;
}

#endif
