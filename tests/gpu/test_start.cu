/*
 * tests/gpu/test_start.cu — what the device's start costs a fresh process, step by step: the
 * part of kl's load that no fill overlaps (docs/PERFORMANCE.md, sessions 22-23: 0.11-0.18 s of
 * a 0.75-0.9 s load on the H200 machine).  In this process, in order, each timed:
 *   driver      the runtime's first call (hipGetDeviceCount: the driver loaded and started)
 *   context     device 0 current and its primary context made (hipSetDevice, hipFree(NULL))
 *   stream      one stream; events: 64 events (the load's)
 *   alloc       1 GiB of device memory
 *   register_fresh     320 MiB of fresh anonymous memory page-locked (its pages made inside)
 *   register_populated the same for 320 MiB whose pages were made first (the load's way since
 *                      session 23), and populate: the making of them
 * The load runs the first three on a thread while the model opens; how far other work (a
 * second process holding the device, engine.sh's HOLD_DEVICE=1) or the environment
 * (CUDA_MODULE_LOADING, CUDA_DEVICE_MAX_CONNECTIONS) moves them is what it is for.  One JSON
 * line {"test":"start",...}; exit 0, 77 without a GPU.
 */
extern "C" {
#include "common/clock.h"
}
#include "tests/gpu/gpu_testutil.h"

#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define RING_BYTES ((size_t)320 << 20)

/* RING_BYTES of anonymous memory on 2 MiB pages where the kernel gives them; its pages made
 * first when populate (seconds of that into *pop_s). */
static void *map_ring(int populate, double *pop_s)
{
    void *m = mmap(NULL, RING_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "test_start: mmap of %zu bytes failed\n", RING_BYTES);
        exit(1);
    }
    (void)madvise(m, RING_BYTES, MADV_HUGEPAGE);
    double t0 = kl_now_s();
    if (populate && madvise(m, RING_BYTES, MADV_POPULATE_WRITE))
        memset(m, 0, RING_BYTES);
    *pop_s = kl_now_s() - t0;
    return m;
}

/* Seconds to page-lock m (then unlocked and unmapped). */
static double register_s(void *m)
{
    double t0 = kl_now_s();
    T_CHECK(hipHostRegister(m, RING_BYTES, hipHostRegisterPortable));
    double s = kl_now_s() - t0;
    T_CHECK(hipHostUnregister(m));
    munmap(m, RING_BYTES);
    return s;
}

int main(void)
{
    const double t0 = kl_now_s();
    int n = 0;
    if (hipGetDeviceCount(&n) != hipSuccess || n == 0) {
        fprintf(stderr, "test_start: no GPU, skipped\n");
        return 77;
    }
    const double t1 = kl_now_s();
    T_CHECK(hipSetDevice(0));
    T_CHECK(hipFree(NULL));
    const double t2 = kl_now_s();
    hipStream_t st;
    T_CHECK(hipStreamCreateWithFlags(&st, hipStreamNonBlocking));
    const double t3 = kl_now_s();
    hipEvent_t ev[64];
    for (int i = 0; i < 64; i++)
        T_CHECK(hipEventCreateWithFlags(&ev[i], hipEventDisableTiming));
    const double t4 = kl_now_s();
    void *d = NULL;
    T_CHECK(hipMalloc(&d, (size_t)1 << 30));
    const double t5 = kl_now_s();
    double pop_fresh, pop_s;
    const double fresh = register_s(map_ring(0, &pop_fresh));
    void *m = map_ring(1, &pop_s);
    const double populated = register_s(m);
    T_CHECK(hipFree(d));
    for (int i = 0; i < 64; i++)
        T_CHECK(hipEventDestroy(ev[i]));
    T_CHECK(hipStreamDestroy(st));
    printf("{\"test\":\"start\",\"ok\":true,\"driver_s\":%.4f,\"context_s\":%.4f,"
           "\"stream_s\":%.5f,\"events_s\":%.5f,\"alloc_s\":%.4f,\"register_fresh_s\":%.4f,"
           "\"populate_s\":%.4f,\"register_populated_s\":%.4f,\"start_s\":%.4f}\n",
           t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, fresh, pop_s, populated, t4 - t0);
    return 0;
}
