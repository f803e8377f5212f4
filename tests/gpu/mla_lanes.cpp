/*
 * tests/gpu/mla_lanes.cpp — attend4 on the CPU at lane level (see mla_lanes.sh, which cuts its
 * device code out of kernels/mla.cu): a block is 256 threads; __syncthreads, the shuffles and
 * hence the stand-in MMA are barriers over the block or its groups of 32.  Arguments: NH DR R
 * SPLITS SPAN... (dn = dv = 16: attend4 reads the absorbed queries, filled here at random);
 * one token per span, each in its own slot whose rows past the span are NaN, shared memory
 * NaN-filled before each block.  Prints the worst rel. L2 of the combined context against
 * double; exit 0 when below 3e-5.  "mha NH DN DR DV R POS0 N": mha_kernel (the prefill in MHA
 * form, 128 threads a block) likewise, its output against double (run_mha); "mha2 ..." the
 * same with mha_planes_kernel and mha2_kernel (v2, 256 threads a block; ldmatrix and its
 * .trans by the stand-ins of kernels/mma.cuh).
 */
#define __HIPCC__ 1 /* the SIMT stand-ins (no PTX) */
#include "kernels/mla.h"
#include "tests/gpu/lanes.h"

#include <math.h>
#include <pthread.h>
#include <random>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __shared__
#define __launch_bounds__(...)
#define KL_GPU_GROUP        32
#define KL_GPU_GRID_WAIT() ((void)0)

struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    uint32_t x, y;
};
static uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
/* fp16 for kernels/mma.cuh's stand-in of the fp16 MMA (unused here, compiled) */
struct __half {
    unsigned short bits;
};
static __half __ushort_as_half(unsigned short b) { return {b}; }
static float __half2float(__half h)
{
    const int e = h.bits >> 10 & 31, f = h.bits & 1023;
    const float v = e ? ldexpf((float)(f | 1024), e - 25) : ldexpf((float)f, -24);
    return h.bits >> 15 ? -v : v;
}
static float2 make_float2(float a, float b) { return {a, b}; }
static float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

static uint32_t lanes[8][32];

static uint32_t __float_as_uint(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float __uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* v from lane src of this thread's group of 32 (every lane of the group calls it) */
static uint32_t from_lane(uint32_t v, uint32_t src)
{
    const unsigned g = threadIdx.x / 32;
    lanes[g][threadIdx.x % 32] = v;
    pthread_barrier_wait(&group_bar[g]);
    const uint32_t r = lanes[g][src % 32];
    pthread_barrier_wait(&group_bar[g]);
    return r;
}
static uint32_t __shfl(uint32_t v, int src, int) { return from_lane(v, (uint32_t)src); }
template <class T> static T kl_gpu_shfl_xor(T v, int o)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    u = from_lane(u, (threadIdx.x % 32) ^ o);
    T r;
    memcpy(&r, &u, 4);
    return r;
}

/* p = max(p, v) as one step (shared memory's integer atomic) */
static uint32_t atomicMax(uint32_t *p, uint32_t v)
{
    uint32_t old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v &&
           !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        ;
    return old;
}

/* the MHA form's scratch layout asks for it (kernels/gemm.h) */
static size_t kl_gpu_gemm_parts_bytes(uint32_t m, uint32_t cols)
{
    return (size_t)m * 3 * cols * 2;
}

float4 shared4[60000]; /* the block's dynamic shared memory */

/* cp.async as late as it may land: a thread's copies (their sources read at the issue) are
 * written when a copy_wait lets their group complete, so a tile read before its wait and
 * barrier, or a stage refilled while still read, shows in the results. */
#define KL_MMA_DEFERRED_COPIES 1
struct pending_copy {
    void *dst;
    unsigned char bytes[16];
    uint32_t n;
};
static thread_local std::vector<std::vector<pending_copy>> copy_groups;
static thread_local std::vector<pending_copy> copy_open;
static void copy_issue(void *dst, const void *src, uint32_t n, bool zero)
{
    pending_copy c = {dst, {}, n};
    if (!zero)
        memcpy(c.bytes, src, n);
    copy_open.push_back(c);
}
static void copy16(void *dst, const void *src, uint32_t bytes) { copy_issue(dst, src, 16, !bytes); }
static void copy4(void *dst, const void *src) { copy_issue(dst, src, 4, false); }
static void copy_commit()
{
    copy_groups.push_back(copy_open);
    copy_open.clear();
}
template <int N> static void copy_wait()
{
    while (copy_groups.size() > (size_t)N) {
        for (const pending_copy &c : copy_groups.front())
            memcpy(c.dst, c.bytes, c.n);
        copy_groups.erase(copy_groups.begin());
    }
}

#include "kernels/mma.cuh"
#include "mla_lanes_deps.inc"
#include "mla_lanes_v4.inc"
#include "mla_lanes_mha.inc"

/* Runs kernel() as the blocks of grid, `threads` threads each (shared memory NaN first). */
template <class K> static void run_grid(dim3 grid, unsigned threads, K kernel)
{
    lanes_grid(grid, threads, kernel, [] { memset(shared4, 0xff, sizeof shared4); /* NaN */ });
}

/* The worst rel. L2 over (token, head) of the context combined from the splits' partials. */
static double check(const std::vector<std::vector<float>> &cache, const std::vector<float> &ql,
                    const std::vector<uint32_t> &spans, const kl_gpu_mla_dims &d, uint32_t splits,
                    const attend_ctx &x)
{
    const uint32_t cw = d.R + d.dr, R = d.R, nh = d.nh;
    double worst = 0;
    for (uint32_t t = 0; t < spans.size(); t++) {
        const uint32_t span = spans[t], ns = (span + x.sc.rp[t] - 1) / x.sc.rp[t];
        for (uint32_t h = 0; h < nh; h++) {
            const float *q = &ql[((size_t)t * nh + h) * cw];
            std::vector<double> sc(span), ctx(R, 0.0), got(R, 0.0);
            double mx = -INFINITY, sum = 0, M = -INFINITY, den = 0, e2 = 0, r2 = 0;
            for (uint32_t u = 0; u < span; u++) {
                double v = 0;
                for (uint32_t k = 0; k < cw; k++)
                    v += (double)q[k] * cache[t][(size_t)u * cw + k];
                sc[u] = v / sqrt((double)(d.dn + d.dr));
                mx = fmax(mx, sc[u]);
            }
            for (uint32_t u = 0; u < span; u++)
                sum += (sc[u] = exp(sc[u] - mx));
            for (uint32_t u = 0; u < span; u++)
                for (uint32_t k = 0; k < R; k++)
                    ctx[k] += sc[u] / sum * cache[t][(size_t)u * cw + k];
            for (uint32_t s = 0; s < ns; s++)
                M = fmax(M, x.sc.pm[((size_t)t * splits + s) * nh + h]);
            for (uint32_t s = 0; s < ns; s++) {
                const size_t p = ((size_t)t * splits + s) * nh + h;
                const double w = exp(x.sc.pm[p] - M);
                den += w * x.sc.pl[p];
                for (uint32_t k = 0; k < R; k++)
                    got[k] += w * x.sc.pc[p * R + k];
            }
            for (uint32_t k = 0; k < R; k++)
                e2 += (got[k] / den - ctx[k]) * (got[k] / den - ctx[k]), r2 += ctx[k] * ctx[k];
            const double rel = sqrt(e2 / r2);
            worst = rel <= worst ? worst : rel; /* NaN sticks */
        }
        printf("mla_lanes: token %u span %u rows per split %u splits %u\n", t, span,
               x.sc.rp[t], ns);
    }
    return worst;
}

/* mha NH DN DR DV R POS0 N: one prompt of N tokens at positions POS0.. in slot 0, the
 * expanded keys and values [span][nh (dn + dv)] and the cache's rope keys at random (rows past
 * the span NaN); the worst rel. L2 of o against double.  v2 (mha2): mha_planes_kernel and
 * mha2_kernel, else mha_kernel. */
static int run_mha(int argc, char **argv, bool v2)
{
    if (argc < 8) {
        fprintf(stderr, "usage: mla_lanes mha NH DN DR DV R POS0 N\n");
        return 2;
    }
    const kl_gpu_mla_dims d = {(uint32_t)atoi(argv[1]), (uint32_t)atoi(argv[2]),
                               (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]),
                               (uint32_t)atoi(argv[5])};
    const uint32_t pos0 = atoi(argv[6]), n = atoi(argv[7]), span = pos0 + n, cw = d.R + d.dr;
    const uint32_t qw = d.dn + d.dr, kw = d.nh * (d.dn + d.dv);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uni(-1.5f, 1.5f);
    std::vector<float> cache((size_t)(span + 40) * cw, NAN), kv((size_t)(span + 40) * kw, NAN);
    for (size_t i = 0; i < (size_t)span * cw; i++)
        cache[i] = uni(rng);
    for (size_t i = 0; i < (size_t)span * kw; i++)
        kv[i] = 0.3f * uni(rng);
    std::vector<float> q((size_t)n * d.nh * qw), o((size_t)n * d.nh * d.dv, NAN);
    for (float &v : q)
        v = uni(rng);
    std::vector<uint32_t> tok_pos(n), tok_slot(n, 0), run_start = {0, n}, run_slot = {0};
    for (uint32_t t = 0; t < n; t++)
        tok_pos[t] = pos0 + t;
    const float *slot = cache.data();
    kl_gpu_mla_attend_args a = {};
    a.d = d, a.q = q.data(), a.cache = &slot, a.o = o.data();
    const kl_gpu_tokens tk = {n, 1, n, span, tok_slot.data(), tok_pos.data(), run_start.data(),
                              run_slot.data()};
    if (v2) { /* the planes (NaN past them), then mha2_kernel */
        std::vector<uint16_t> pl(2 * (mha_kplane(&d, span) + mha_vplane(&d, span)) + 64, 0xffff);
        if (mha2_shared(&d) > sizeof shared4)
            return 2;
        run_grid({span, 1, 1}, 32, [&] {
            mha_planes_kernel(d, kv.data(), a.cache, run_slot.data(), span, pl.data());
        });
        run_grid({(n + MHA2_ROWS - 1) / MHA2_ROWS, d.nh, 1}, MHA2_THREADS,
                 [&] { mha2_kernel(a, pl.data(), span, tk); });
    } else {
        if (mha_shared(&d) > sizeof shared4)
            return 2;
        run_grid({(n + MHA_ROWS - 1) / MHA_ROWS, d.nh, 1}, MHA_THREADS,
                 [&] { mha_kernel(a, kv.data(), tk); });
    }
    double worst = 0;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < d.nh; h++) {
            const uint32_t p = tok_pos[t];
            const float *qq = &q[((size_t)t * d.nh + h) * qw];
            const float *got = &o[((size_t)t * d.nh + h) * d.dv];
            std::vector<double> sc(p + 1), ctx(d.dv, 0.0);
            double mx = -INFINITY, sum = 0, e2 = 0, r2 = 0;
            for (uint32_t u = 0; u <= p; u++) {
                const float *k = &kv[(size_t)u * kw + h * (d.dn + d.dv)];
                double v = 0;
                for (uint32_t i = 0; i < qw; i++)
                    v += (double)qq[i] * (i < d.dn ? k[i] : cache[(size_t)u * cw + d.R + i - d.dn]);
                sc[u] = v / sqrt((double)qw);
                mx = fmax(mx, sc[u]);
            }
            for (uint32_t u = 0; u <= p; u++)
                sum += (sc[u] = exp(sc[u] - mx));
            for (uint32_t u = 0; u <= p; u++)
                for (uint32_t j = 0; j < d.dv; j++)
                    ctx[j] += sc[u] / sum * kv[(size_t)u * kw + h * (d.dn + d.dv) + d.dn + j];
            for (uint32_t j = 0; j < d.dv; j++)
                e2 += (got[j] - ctx[j]) * (got[j] - ctx[j]), r2 += ctx[j] * ctx[j];
            const double rel = sqrt(e2 / r2);
            worst = rel <= worst ? worst : rel; /* NaN sticks */
        }
    printf("mla_lanes: %s nh %u dn %u dr %u dv %u R %u positions %u..%u: worst rel. L2 %.3e\n",
           v2 ? "mha2" : "mha", d.nh, d.dn, d.dr, d.dv, d.R, pos0, span - 1, worst);
    return worst < 3e-5 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "mha") || !strcmp(argv[1], "mha2")))
        return run_mha(argc - 1, argv + 1, !strcmp(argv[1], "mha2"));
    if (argc < 6) {
        fprintf(stderr, "usage: mla_lanes NH DR R SPLITS SPAN...\n");
        return 2;
    }
    const kl_gpu_mla_dims d = {(uint32_t)atoi(argv[1]), 16, (uint32_t)atoi(argv[2]), 16,
                               (uint32_t)atoi(argv[3])};
    const uint32_t splits = atoi(argv[4]), cw = d.R + d.dr;
    std::vector<uint32_t> spans;
    for (int i = 5; i < argc; i++)
        spans.push_back(atoi(argv[i]));
    const uint32_t n = spans.size();
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uni(-1.5f, 1.5f);
    std::vector<std::vector<float>> cache(n);
    std::vector<float *> slot(n);
    std::vector<uint32_t> tok_slot(n), tok_pos(n), rp(n);
    for (uint32_t t = 0; t < n; t++) {
        cache[t].assign((size_t)(spans[t] + 40) * cw, NAN);
        for (size_t i = 0; i < (size_t)spans[t] * cw; i++)
            cache[t][i] = uni(rng);
        slot[t] = cache[t].data(), tok_slot[t] = t, tok_pos[t] = spans[t] - 1;
    }
    std::vector<float> ql((size_t)n * d.nh * cw), pc((size_t)n * splits * d.nh * d.R, NAN);
    std::vector<float> pm((size_t)n * splits * d.nh, NAN), pl(pm.size(), NAN);
    for (float &v : ql)
        v = uni(rng);
    kl_gpu_mla_attend_args a = {};
    a.d = d;
    a.cache = (const float *const *)slot.data();
    attend_ctx x = {};
    x.tok_slot = tok_slot.data(), x.tok_pos = tok_pos.data(), x.scale = 1 / sqrtf(16.0f + d.dr);
    x.sc.ql = ql.data(), x.sc.pc = pc.data(), x.sc.pm = pm.data(), x.sc.pl = pl.data();
    x.sc.rp = rp.data();
    if (attend4_shared(&d) > sizeof shared4)
        return 2;
    run_grid({splits, n, 1}, T4_THREADS, [&] { attend4_kernel(a, x); });
    const double worst = check(cache, ql, spans, d, splits, x);
    printf("mla_lanes: nh %u dr %u R %u splits %u: worst rel. L2 %.3e\n", d.nh, d.dr, d.R, splits,
           worst);
    return worst < 3e-5 ? 0 : 1;
}
