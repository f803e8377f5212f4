/* common/membench.c — multi-threaded single-pass memory-read bandwidth (see membench.h). */
#include "common/membench.h"

#include "common/clock.h"
#include "common/mem.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

typedef struct slice {
    const uint64_t *p;
    size_t          n;        /* uint64 words */
    uint64_t        sum;      /* kept so the compiler cannot drop the loads */
} slice;

static void *sum_slice(void *arg)
{
    slice *s = arg;
    /* Four independent accumulators let the loads stream without a dependency chain. */
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= s->n; i += 4) {
        a += s->p[i];
        b ^= s->p[i + 1];
        c += s->p[i + 2];
        d ^= s->p[i + 3];
    }
    for (; i < s->n; i++)
        a += s->p[i];
    s->sum = a + b + c + d;
    return NULL;
}

static int one_pass(const uint64_t *buf, size_t words, unsigned threads, double *secs)
{
    pthread_t tid[256];
    slice sl[256];
    size_t per = words / threads;
    double t0 = kl_now_s();
    unsigned started = 0;
    for (unsigned t = 0; t < threads; t++) {
        sl[t] = (slice){buf + t * per, t + 1 == threads ? words - t * per : per, 0};
        if (pthread_create(&tid[t], NULL, sum_slice, &sl[t]) != 0)
            break;
        started++;
    }
    for (unsigned t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    *secs = kl_now_s() - t0;
    volatile uint64_t sink = 0;
    for (unsigned t = 0; t < started; t++)
        sink += sl[t].sum;
    (void)sink;
    return started == threads ? 0 : -1;
}

int kl_membench_read(size_t bytes, unsigned threads, unsigned passes, kl_membench_result *res,
                     kl_err *err)
{
    if (threads < 1 || threads > 256 || bytes < 4096 || !passes)
        return kl_fail(err, KL_E_USAGE, "membench: need 1..256 threads, >= 4 KiB, >= 1 pass");
    uint64_t *buf = kl_aligned_alloc(4096, bytes);
    if (!buf)
        return kl_fail(err, KL_E_NOMEM, "membench: cannot allocate %zu bytes", bytes);
    memset(buf, 0x5a, bytes); /* first touch: fault every page in before timing */
    double best = 0;
    int rc = 0;
    for (unsigned p = 0; p < passes && !rc; p++) {
        double s;
        if (one_pass(buf, bytes / 8, threads, &s))
            rc = kl_fail(err, KL_E_IO, "membench: cannot start %u threads", threads);
        else if (!best || s < best)
            best = s;
    }
    kl_aligned_free(buf);
    if (rc)
        return rc;
    res->bytes = bytes;
    res->threads = threads;
    res->best_s = best;
    res->read_gbps = (double)bytes / best / 1e9;
    return 0;
}
