/*
 * tests/gpu/test_nccl.cu — the collectives tensor parallelism needs (docs/TP-GPU.md), on every
 * visible GPU of the machine through NCCL (RCCL on AMD: the same API): one communicator per
 * GPU in this process (ncclCommInitAll), then for blocks of [T, 2304] fp32 (the model's
 * hidden width; T = 1, 8, 64, 512, 4096) an in-place sum all-reduce of rank-dependent values
 * whose sums fp32 holds exactly, checked on every rank, and timed (median of 20 after a
 * warm-up): microseconds per all-reduce and NCCL's "bus bandwidth" (2 (N - 1) / N x bytes /
 * time).  With two GPUs or more, also the GPU 0 -> GPU r peer copy rate (the loader's
 * fan-out, 256 MiB) and whether peer access is possible.  The engine's own sum
 * (kernels/collective.h) directly and captured in graphs (exact; microseconds per captured
 * sum of one token's row).  With one GPU the all-reduce is a copy, which still checks that the
 * library loads, runs and can be captured.
 * One JSON line per measurement ({"test":"nccl-case",...}), then {"test":"nccl","ok":...};
 * exit 0 pass, 1 fail, 77 no GPU or no collective library in this build.
 */
#include "kernels/gpu.h"

#include <stdio.h>

/* The Makefile defines KL_NO_COLLECTIVES where it finds no library to link */
#if !defined(KL_NO_COLLECTIVES) && defined(__HIP_PLATFORM_AMD__)
#if __has_include(<rccl/rccl.h>)
#define KL_HAVE_COLLECTIVES 1
#endif
#elif !defined(KL_NO_COLLECTIVES)
#if __has_include(<nccl.h>)
#define KL_HAVE_COLLECTIVES 1
#endif
#endif

#ifndef KL_HAVE_COLLECTIVES
int main(void)
{
    fprintf(stderr, "test_nccl: built without NCCL/RCCL headers, skipped\n");
    return 77;
}
#else

#if defined(__HIP_PLATFORM_AMD__)
#include <rccl/rccl.h>
#else
#include <nccl.h>
#endif

#include "kernels/collective.h"
#include "kernels/runtime.h"
#include "tests/gpu/gpu_testutil.h"

#define HIDDEN   2304u
#define MAX_GPUS 8

#define N_CHECK(call)                                                                       \
    do {                                                                                    \
        ncclResult_t r_ = (call);                                                           \
        if (r_ != ncclSuccess) {                                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                   \
                    ncclGetErrorString(r_));                                                \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

struct rank {
    ncclComm_t comm;
    hipStream_t st;
    float *buf;
};

/* Rank r's value at i: small integers, so every sum over ranks is exact in fp32. */
static float value(int r, size_t i)
{
    return (float)((int)((i * 7 + (size_t)r * 13) % 97) - 48) * (float)(r + 1);
}

/* One all-reduce of n floats on every rank (grouped: one thread drives all GPUs). */
static void all_reduce(rank *rk, int N, size_t n)
{
    N_CHECK(ncclGroupStart());
    for (int r = 0; r < N; r++) {
        T_CHECK(hipSetDevice(r));
        N_CHECK(ncclAllReduce(rk[r].buf, rk[r].buf, n, ncclFloat, ncclSum, rk[r].comm, rk[r].st));
    }
    N_CHECK(ncclGroupEnd());
}

static void sync_all(rank *rk, int N)
{
    for (int r = 0; r < N; r++) {
        T_CHECK(hipSetDevice(r));
        T_CHECK(hipStreamSynchronize(rk[r].st));
    }
}

/* Every rank's block of n floats filled with value(); their sum returned. */
static std::vector<float> fill_ranks(rank *rk, int N, size_t n)
{
    std::vector<float> h(n), want(n, 0.0f);
    for (int r = 0; r < N; r++) {
        for (size_t i = 0; i < n; i++) {
            h[i] = value(r, i);
            want[i] += h[i];
        }
        T_CHECK(hipSetDevice(r));
        T_CHECK(hipMemcpy(rk[r].buf, h.data(), n * sizeof(float), hipMemcpyHostToDevice));
    }
    return want;
}

/* After a sum: the ranks whose block is not want (streams synchronized first). */
static double ranks_differing(rank *rk, int N, const std::vector<float> &want)
{
    sync_all(rk, N);
    std::vector<float> h(want.size());
    size_t bad = 0;
    for (int r = 0; r < N; r++) {
        T_CHECK(hipSetDevice(r));
        T_CHECK(hipMemcpy(h.data(), rk[r].buf, h.size() * sizeof(float), hipMemcpyDeviceToHost));
        bad += memcmp(h.data(), want.data(), h.size() * sizeof(float)) != 0;
    }
    return (double)bad;
}

/* Fills every rank's block, all-reduces it once and checks every rank's result. */
static void check_sum(rank *rk, int N, size_t n, uint32_t T)
{
    const std::vector<float> want = fill_ranks(rk, N, n);
    all_reduce(rk, N, n);
    char what[64];
    snprintf(what, sizeof what, "all-reduce of [%u, %u]: ranks that differ", T, HIDDEN);
    t_check(what, ranks_differing(rk, N, want), 0);
}

/* Median microseconds of fn() (work enqueued on every rank's stream) over reps calls after
 * `warm` more: each between two events on rank 0's stream, every stream drained before and
 * after (the ranks' collectives keep them in step, so rank 0's span is the call's). */
template <class F> static double median_us(rank *rk, int N, int warm, int reps, F fn)
{
    std::vector<double> us;
    for (int i = 0; i < warm + reps; i++) {
        sync_all(rk, N);
        T_CHECK(hipSetDevice(0));
        hipEvent_t a, b;
        T_CHECK(hipEventCreate(&a));
        T_CHECK(hipEventCreate(&b));
        T_CHECK(hipEventRecord(a, rk[0].st));
        fn();
        T_CHECK(hipSetDevice(0));
        T_CHECK(hipEventRecord(b, rk[0].st));
        sync_all(rk, N);
        float ms = 0;
        T_CHECK(hipEventElapsedTime(&ms, a, b));
        T_CHECK(hipEventDestroy(a));
        T_CHECK(hipEventDestroy(b));
        if (i >= warm)
            us.push_back(ms * 1e3);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
}

/* REPS of the engine's sums of n floats captured into one graph per rank's stream (how the
 * captured decode step holds them: docs/TP-GPU.md), without programmatic edges (NCCL's
 * kernels do not wait for them: kernels/runtime.h). */
static void capture_sums(kl_gpu_comm *c, float **bufs, kl_gpu_stream *st, int N, size_t n,
                         int reps, kl_gpu_graph *g)
{
    kl_err err;
    kl_err_clear(&err);
    for (int r = 0; r < N; r++) {
        T_CHECK(hipSetDevice(r));
        t_ok(kl_gpu_capture_begin(st[r], &err), &err, "kl_gpu_capture_begin");
    }
    for (int i = 0; i < reps; i++)
        t_ok(kl_gpu_comm_sum(c, bufs, n, st, &err), &err, "kl_gpu_comm_sum (captured)");
    for (int r = 0; r < N; r++) {
        T_CHECK(hipSetDevice(r));
        t_ok(kl_gpu_capture_end(st[r], &g[r], NULL, 0, &err), &err, "kl_gpu_capture_end");
    }
}

static void launch_all(kl_gpu_graph *g, kl_gpu_stream *st, int N)
{
    kl_err err;
    kl_err_clear(&err);
    for (int r = 0; r < N; r++) {
        T_CHECK(hipSetDevice(r));
        t_ok(kl_gpu_graph_launch(g[r], st[r], &err), &err, "kl_gpu_graph_launch");
    }
}

/* The sum replayed from graphs: exact on every rank, twice (a graph is replayed); then the
 * microseconds one sum of [1, 2304] costs inside a graph (54 of them a decode step), the
 * median of 10 replays of 20 sums each. */
static void check_captured_sum(rank *rk, int N, kl_gpu_comm *c, float **bufs, kl_gpu_stream *st)
{
    const size_t n = (size_t)8 * HIDDEN;
    kl_gpu_graph g[MAX_GPUS];
    capture_sums(c, bufs, st, N, n, 1, g);
    for (int rep = 0; rep < 2; rep++) {
        const std::vector<float> want = fill_ranks(rk, N, n);
        launch_all(g, st, N);
        t_check("kl_gpu_comm_sum of [8, 2304] replayed from graphs: ranks that differ",
                ranks_differing(rk, N, want), 0);
    }
    for (int r = 0; r < N; r++)
        kl_gpu_graph_destroy(g[r]);
    enum { SUMS = 20 };
    capture_sums(c, bufs, st, N, HIDDEN, SUMS, g);
    const double us = median_us(rk, N, 2, 10, [&] { launch_all(g, st, N); }) / SUMS;
    printf("{\"test\":\"nccl-case\",\"case\":\"captured-sum\",\"gpus\":%d,\"tokens\":1,"
           "\"us_per_sum\":%.2f}\n", N, us);
    for (int r = 0; r < N; r++)
        kl_gpu_graph_destroy(g[r]);
}

/* The engine's sum (kernels/collective.h: the library loaded at run time) over the same
 * ranks: exact, on every rank, run directly and replayed from captured graphs. */
static void check_comm_sum(rank *rk, int N, size_t n)
{
    int devs[MAX_GPUS];
    float *bufs[MAX_GPUS];
    kl_gpu_stream st[MAX_GPUS];
    for (int r = 0; r < N; r++)
        devs[r] = r, bufs[r] = rk[r].buf, st[r] = (kl_gpu_stream)rk[r].st;
    const std::vector<float> want = fill_ranks(rk, N, n);
    kl_gpu_comm *c = NULL;
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_comm_create(&c, devs, (unsigned)N, &err), &err, "kl_gpu_comm_create");
    t_ok(kl_gpu_comm_sum(c, bufs, n, st, &err), &err, "kl_gpu_comm_sum");
    printf("{\"test\":\"nccl-case\",\"case\":\"kl_gpu_comm\",\"library\":\"%s\"}\n",
           kl_gpu_comm_library());
    t_check("kl_gpu_comm_sum of [8, 2304]: ranks that differ", ranks_differing(rk, N, want), 0);
    check_captured_sum(rk, N, c, bufs, st);
    kl_gpu_comm_free(c);
}

/* Median microseconds of one all-reduce of n floats (20 after 3 warm-ups). */
static double time_all_reduce(rank *rk, int N, size_t n)
{
    return median_us(rk, N, 3, 20, [&] { all_reduce(rk, N, n); });
}

/* GPU 0 -> GPU r copies of 256 MiB (peer access enabled where possible). */
static void peer_copies(int N)
{
    const size_t bytes = (size_t)256 << 20;
    for (int r = 1; r < N; r++) {
        int can = 0;
        T_CHECK(hipDeviceCanAccessPeer(&can, r, 0));
        void *src = NULL, *dst = NULL;
        T_CHECK(hipSetDevice(0));
        T_CHECK(hipMalloc(&src, bytes));
        T_CHECK(hipSetDevice(r));
        T_CHECK(hipMalloc(&dst, bytes));
        if (can)
            (void)hipDeviceEnablePeerAccess(0, 0);   /* already enabled: fine */
        (void)hipGetLastError();
        T_CHECK(hipSetDevice(0));
        hipEvent_t a, b;
        T_CHECK(hipEventCreate(&a));
        T_CHECK(hipEventCreate(&b));
        float best = 1e30f;
        for (int i = 0; i < 5; i++) {
            T_CHECK(hipEventRecord(a, 0));
            T_CHECK(hipMemcpyPeerAsync(dst, r, src, 0, bytes, 0));
            T_CHECK(hipEventRecord(b, 0));
            T_CHECK(hipEventSynchronize(b));
            float ms = 0;
            T_CHECK(hipEventElapsedTime(&ms, a, b));
            best = std::min(best, ms);
        }
        printf("{\"test\":\"nccl-case\",\"case\":\"peer-copy\",\"from\":0,\"to\":%d,"
               "\"peer_access\":%s,\"bytes\":%zu,\"gbps\":%.1f}\n",
               r, can ? "true" : "false", bytes, bytes / (best * 1e-3) / 1e9);
        T_CHECK(hipEventDestroy(a));
        T_CHECK(hipEventDestroy(b));
        T_CHECK(hipFree(src));
        T_CHECK(hipSetDevice(r));
        T_CHECK(hipFree(dst));
    }
}

int main(void)
{
    if (!t_have_gpu("test_nccl"))
        return 77;
    int N = 0, version = 0;
    T_CHECK(hipGetDeviceCount(&N));
    N = std::min(N, MAX_GPUS);
    N_CHECK(ncclGetVersion(&version));
    rank rk[MAX_GPUS];
    ncclComm_t comms[MAX_GPUS];
    int devs[MAX_GPUS];
    for (int r = 0; r < N; r++)
        devs[r] = r;
    setenv("NCCL_NVLS_ENABLE", "0", 1);   /* never NVLink multicast, as kl_gpu_comm_create */
    N_CHECK(ncclCommInitAll(comms, N, devs));
    static const uint32_t tokens[] = {1, 8, 64, 512, 4096};
    const size_t most = (size_t)tokens[4] * HIDDEN;
    for (int r = 0; r < N; r++) {
        rk[r].comm = comms[r];
        T_CHECK(hipSetDevice(r));
        T_CHECK(hipStreamCreateWithFlags(&rk[r].st, hipStreamNonBlocking));
        T_CHECK(hipMalloc((void **)&rk[r].buf, most * sizeof(float)));
    }
    printf("{\"test\":\"nccl-case\",\"case\":\"setup\",\"gpus\":%d,\"nccl_version\":%d}\n", N,
           version);
    for (uint32_t T : tokens) {
        const size_t n = (size_t)T * HIDDEN;
        check_sum(rk, N, n, T);
        double us = time_all_reduce(rk, N, n);
        double bus = N > 1 ? 2.0 * (N - 1) / N * n * sizeof(float) / (us * 1e-6) / 1e9 : 0;
        printf("{\"test\":\"nccl-case\",\"case\":\"all-reduce\",\"gpus\":%d,\"tokens\":%u,"
               "\"bytes\":%zu,\"us\":%.1f,\"bus_gbps\":%.1f}\n",
               N, T, n * sizeof(float), us, bus);
    }
    check_comm_sum(rk, N, (size_t)8 * HIDDEN);
    peer_copies(N);
    for (int r = 0; r < N; r++) {
        T_CHECK(hipSetDevice(r));
        T_CHECK(hipFree(rk[r].buf));
        T_CHECK(hipStreamDestroy(rk[r].st));
        N_CHECK(ncclCommDestroy(rk[r].comm));
    }
    printf("{\"test\":\"nccl\",\"ok\":%s,\"gpus\":%d,\"checks\":[%s]}\n",
           t_all_ok ? "true" : "false", N, t_checks.c_str());
    return t_all_ok ? 0 : 1;
}
#endif
