/*
 * tests/gpu/test_mxfp4_gemv.cu — kl_gpu_mxfp4_gemv against the host reference
 * (kl_mxfp4_dequantize_row, then a dot product in double), and its bandwidth beside a
 * device-to-device copy measured in the same run.  Exit 0 pass, 1 fail, 77 no GPU.
 * Prints one JSON line with the figures.
 */
#include "kernels/gpu.h"
#include "kernels/mxfp4_gemv.h"

#include "common/mxfp4_format.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

struct matrix {
    size_t rows, cols;
    std::vector<uint8_t> packed, scale;
    std::vector<float> x;
};

/* Random codes, scales 2^-8..2^7 around 1 (E8M0 119..134), x in [-1, 1). */
static void fill(matrix &m, size_t rows, size_t cols)
{
    m.rows = rows;
    m.cols = cols;
    m.packed.resize(rows * cols / 2);
    m.scale.resize(rows * cols / 32);
    m.x.resize(cols);
    for (auto &b : m.packed)
        b = (uint8_t)next_u32();
    for (auto &s : m.scale)
        s = (uint8_t)(119 + next_u32() % 16);
    for (auto &v : m.x)
        v = (float)((int)(next_u32() % 2000) - 1000) / 1000.0f;
}

/* Relative error of row r: |gpu - ref| / sum |w x| (the scale of the dot's rounding). */
static double row_error(const matrix &m, size_t r, float got)
{
    std::vector<float> w(m.cols);
    kl_mxfp4_dequantize_row(&m.packed[r * m.cols / 2], &m.scale[r * m.cols / 32], m.cols, w.data());
    double ref = 0, mag = 0;
    for (size_t i = 0; i < m.cols; i++) {
        ref += (double)w[i] * m.x[i];
        mag += fabs((double)w[i] * m.x[i]);
    }
    return fabs(got - ref) / (mag > 0 ? mag : 1);
}

struct device_matrix {
    uint8_t *packed = nullptr, *scale = nullptr;
    float *x = nullptr, *y = nullptr;
};

static int upload(const matrix &m, device_matrix &d, kl_err *err)
{
    if (KL_GPU_CHECK(err, hipMalloc((void **)&d.packed, m.packed.size())) ||
        KL_GPU_CHECK(err, hipMalloc((void **)&d.scale, m.scale.size())) ||
        KL_GPU_CHECK(err, hipMalloc((void **)&d.x, m.x.size() * sizeof(float))) ||
        KL_GPU_CHECK(err, hipMalloc((void **)&d.y, m.rows * sizeof(float))))
        return err->code;
    if (KL_GPU_CHECK(err, hipMemcpy(d.packed, m.packed.data(), m.packed.size(),
                                    hipMemcpyHostToDevice)) ||
        KL_GPU_CHECK(err, hipMemcpy(d.scale, m.scale.data(), m.scale.size(),
                                    hipMemcpyHostToDevice)) ||
        KL_GPU_CHECK(err, hipMemcpy(d.x, m.x.data(), m.x.size() * sizeof(float),
                                    hipMemcpyHostToDevice)))
        return err->code;
    return 0;
}

static void release(device_matrix &d)
{
    hipFree(d.packed);
    hipFree(d.scale);
    hipFree(d.x);
    hipFree(d.y);
}

static kl_mxfp4_gemv_args args_of(const matrix &m, const device_matrix &d)
{
    kl_mxfp4_gemv_args a = {d.packed, d.scale, d.x, d.y, m.rows, m.cols};
    return a;
}

/* Max error over `check` rows (all when check >= rows, else spread over the matrix). */
static int check_rows(const matrix &m, const device_matrix &d, size_t check, double *max_err,
                      kl_err *err)
{
    kl_mxfp4_gemv_args a = args_of(m, d);
    std::vector<float> y(m.rows);
    if (kl_gpu_mxfp4_gemv(&a, NULL, err) || KL_GPU_CHECK(err, hipDeviceSynchronize()) ||
        KL_GPU_CHECK(err, hipMemcpy(y.data(), d.y, m.rows * sizeof(float),
                                    hipMemcpyDeviceToHost)))
        return err->code;
    size_t step = check >= m.rows ? 1 : m.rows / check;
    *max_err = 0;
    for (size_t r = 0; r < m.rows; r += step) {
        double e = row_error(m, r, y[r]);
        *max_err = e > *max_err ? e : *max_err;
    }
    return 0;
}

/* Seconds per call of fn over reps calls, timed with events. */
template <class F> static int time_calls(F fn, int reps, double *s, kl_err *err)
{
    hipEvent_t t0, t1;
    float ms = 0;
    if (KL_GPU_CHECK(err, hipEventCreate(&t0)) || KL_GPU_CHECK(err, hipEventCreate(&t1)))
        return err->code;
    fn(); /* warm-up */
    hipEventRecord(t0, 0);
    for (int i = 0; i < reps; i++)
        fn();
    hipEventRecord(t1, 0);
    int rc = KL_GPU_CHECK(err, hipEventSynchronize(t1)) ||
             KL_GPU_CHECK(err, hipEventElapsedTime(&ms, t0, t1));
    hipEventDestroy(t0);
    hipEventDestroy(t1);
    *s = ms / 1e3 / reps;
    return rc ? err->code : 0;
}

int main(void)
{
    int n_dev = 0;
    if (hipGetDeviceCount(&n_dev) != hipSuccess || n_dev == 0) {
        fprintf(stderr, "test_mxfp4_gemv: no GPU, skipped\n");
        return 77;
    }
    kl_err err;
    kl_err_clear(&err);
    /* correctness: every row of a 3072 x 2304 matrix (an expert's gate+up at Kimi-Linear's
     * hidden size), and the launcher's refusals */
    matrix small;
    fill(small, 3072, 2304);
    device_matrix ds;
    double small_err = 1;
    if (upload(small, ds, &err) || check_rows(small, ds, small.rows, &small_err, &err)) {
        fprintf(stderr, "test_mxfp4_gemv: %s\n", err.msg);
        return 1;
    }
    kl_mxfp4_gemv_args bad = args_of(small, ds);
    bad.cols = 100;
    kl_err berr;
    kl_err_clear(&berr);
    int refused = kl_gpu_mxfp4_gemv(&bad, NULL, &berr) == KL_E_USAGE;
    release(ds);
    /* bandwidth: 512 MiB of packed weights (more than the 60 MiB L2), rows sampled */
    matrix big;
    fill(big, 131072, 8192);
    device_matrix db;
    double big_err = 1, gemv_s = 0, copy_s = 0;
    void *copy_dst = nullptr;
    size_t bytes = big.packed.size() + big.scale.size();
    kl_mxfp4_gemv_args a;
    if (upload(big, db, &err) || check_rows(big, db, 512, &big_err, &err) ||
        KL_GPU_CHECK(&err, hipMalloc(&copy_dst, big.packed.size())))
        goto fail;
    a = args_of(big, db);
    if (time_calls([&] { kl_gpu_mxfp4_gemv(&a, NULL, &err); }, 20, &gemv_s, &err) ||
        time_calls([&] { hipMemcpyAsync(copy_dst, db.packed, big.packed.size(),
                                         hipMemcpyDeviceToDevice, 0); }, 20, &copy_s, &err))
        goto fail;
    {
        /* a device-to-device copy reads and writes every byte: 2 x size moved */
        double copy_gbps = 2.0 * big.packed.size() / copy_s / 1e9;
        double gemv_gbps = bytes / gemv_s / 1e9;
        int ok = refused && small_err < 1e-5 && big_err < 1e-5;
        printf("{\"test\":\"mxfp4_gemv\",\"ok\":%s,\"refuses_bad_cols\":%s,"
               "\"max_rel_err_3072x2304\":%.3g,\"max_rel_err_131072x8192_sampled\":%.3g,"
               "\"weight_bytes\":%zu,\"gemv_us\":%.1f,\"gemv_gbps\":%.1f,"
               "\"d2d_copy_gbps\":%.1f,\"ratio_to_copy\":%.3f}\n",
               ok ? "true" : "false", refused ? "true" : "false", small_err, big_err, bytes,
               gemv_s * 1e6, gemv_gbps, copy_gbps, gemv_gbps / copy_gbps);
        release(db);
        hipFree(copy_dst);
        return ok ? 0 : 1;
    }
fail:
    fprintf(stderr, "test_mxfp4_gemv: %s\n", err.msg);
    return 1;
}
