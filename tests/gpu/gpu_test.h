/*
 * tests/gpu/gpu_test.h — helpers shared by the device tests (header only, C++17): random
 * numbers, device buffers freed together, relative L2 errors, event timing (median of single
 * launches) and the device-to-device copy rate measured beside a kernel's.
 */
#ifndef KL_TESTS_GPU_TEST_H
#define KL_TESTS_GPU_TEST_H

#include "kernels/gpu.h"

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <vector>

/* xorshift64: the same sequence on every run */
struct t_rng {
    uint64_t s = 88172645463325252ull;
    uint32_t u32()
    {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return (uint32_t)(s >> 11);
    }
    float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(u32() % 1000000u) / 1e6f; }
    void fill(std::vector<float> &v, float lo, float hi)
    {
        for (auto &x : v)
            x = uniform(lo, hi);
    }
};

/* Every device allocation of a test, freed at once by t_free_all. */
static std::vector<void *> t_allocs;

static inline void t_free_all()
{
    for (void *p : t_allocs)
        (void)hipFree(p);
    t_allocs.clear();
}

template <class T> static int t_alloc(T **d, size_t n, kl_err *err)
{
    *d = nullptr;
    if (KL_GPU_CHECK(err, hipMalloc((void **)d, (n ? n : 1) * sizeof(T))))
        return err->code;
    t_allocs.push_back(*d);
    return 0;
}

/* A device copy of h in *d. */
template <class T> static int t_put(T **d, const std::vector<T> &h, kl_err *err)
{
    if (t_alloc(d, h.size(), err))
        return err->code;
    return KL_GPU_CHECK(err, hipMemcpy(*d, h.data(), h.size() * sizeof(T), hipMemcpyHostToDevice));
}

/* h (sized by the caller) from d, after the device is idle. */
template <class T> static int t_get(std::vector<T> &h, const T *d, kl_err *err)
{
    if (KL_GPU_CHECK(err, hipDeviceSynchronize()))
        return err->code;
    return KL_GPU_CHECK(err, hipMemcpy(h.data(), d, h.size() * sizeof(T), hipMemcpyDeviceToHost));
}

/* ‖got − ref‖ / ‖ref‖ over n values; 1e30 when got holds a NaN or ref is 0. */
static inline double t_rel_l2(const float *got, const double *ref, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (got[i] != got[i])
            return 1e30;
        e += (got[i] - ref[i]) * (got[i] - ref[i]);
        r += ref[i] * ref[i];
    }
    return r > 0 ? sqrt(e / r) : 1e30;
}

/* Median microseconds of reps single calls of fn(i) (i = 0..reps-1), each between two events,
 * after one warm-up call. */
template <class F> static int t_median_us(F fn, int reps, double *us, kl_err *err)
{
    hipEvent_t t0, t1;
    if (KL_GPU_CHECK(err, hipEventCreate(&t0)) || KL_GPU_CHECK(err, hipEventCreate(&t1)))
        return err->code;
    std::vector<double> v;
    int rc = fn(0);
    for (int i = 0; i < reps && !rc; i++) {
        float ms = 0;
        if (KL_GPU_CHECK(err, hipEventRecord(t0, 0)) || (rc = fn(i)) ||
            KL_GPU_CHECK(err, hipEventRecord(t1, 0)) ||
            KL_GPU_CHECK(err, hipEventSynchronize(t1)) ||
            KL_GPU_CHECK(err, hipEventElapsedTime(&ms, t0, t1)))
            rc = err->code;
        v.push_back(ms * 1e3);
    }
    (void)hipEventDestroy(t0);
    (void)hipEventDestroy(t1);
    if (rc)
        return rc;
    std::sort(v.begin(), v.end());
    *us = v[v.size() / 2];
    return 0;
}

/* GB/s of a device-to-device copy of `bytes` (read + written: 2 x bytes moved), median of 21. */
static inline int t_copy_gbps(size_t bytes, double *gbps, kl_err *err)
{
    char *a, *b;
    double us = 0;
    if (t_alloc(&a, bytes, err) || t_alloc(&b, bytes, err) ||
        KL_GPU_CHECK(err, hipMemset(a, 1, bytes)) ||
        t_median_us([&](int) {
            return KL_GPU_CHECK(err, hipMemcpyAsync(b, a, bytes, hipMemcpyDeviceToDevice, 0));
        }, 21, &us, err))
        return err->code;
    *gbps = 2.0 * (double)bytes / (us * 1e-6) / 1e9;
    return 0;
}

/* 0 when a GPU is present, else prints the skip and returns 77. */
static inline int t_need_gpu(const char *test)
{
    int n = 0;
    if (hipGetDeviceCount(&n) != hipSuccess || n == 0) {
        fprintf(stderr, "%s: no GPU, skipped\n", test);
        return 77;
    }
    return 0;
}

#endif
