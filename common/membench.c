/* common/membench.c — multi-threaded single-pass memory-read bandwidth (see membench.h). */
#include "common/membench.h"

#include "common/clock.h"
#include "common/mem.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* 16-byte vectors: plain SSE2 loads on x86-64, enough to saturate DRAM from many cores. */
typedef uint64_t v2u64 __attribute__((vector_size(16)));

/* Threads take CHUNK_VECS-sized pieces from a shared counter, like the mapped reader does,
 * so one slow thread cannot stretch a pass (a static split made the ceiling read ~10% low). */
#define CHUNK_VECS (((size_t)2 << 20) / sizeof(v2u64))

typedef struct bench {
    const v2u64      *buf;
    size_t            n_vec;       /* 16-byte vectors in buf */
    atomic_size_t     next;        /* next chunk of the current pass */
    unsigned          threads;
    unsigned          passes;
    pthread_barrier_t start, done;
    /* Workers wait at this gate until every thread started (go = 1) or one could not be
     * (go = -1: they return).  A barrier sized for the whole team cannot be left by a partial
     * one, and pthread_barrier_wait is not a cancellation point. */
    pthread_mutex_t   gate_mu;
    pthread_cond_t    gate_cv;
    int               go;
    uint64_t          sink[256];   /* per-thread results, so the loads cannot be dropped */
} bench;

typedef struct worker {
    bench   *b;
    unsigned idx;
} worker;

static uint64_t sum_range(const v2u64 *p, size_t n)
{
    /* Four independent accumulators keep several loads in flight per core. */
    v2u64 a = {0, 0}, b = {0, 0}, c = {0, 0}, d = {0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
    }
    for (; i < n; i++)
        a += p[i];
    v2u64 s = a + b + c + d;
    return s[0] + s[1];
}

uint64_t kl_mem_sum(const void *p, size_t bytes)
{
    size_t n_vec = bytes / sizeof(v2u64);
    uint64_t s = sum_range(p, n_vec);
    const uint8_t *tail = (const uint8_t *)p + n_vec * sizeof(v2u64);
    for (size_t i = 0; i < bytes % sizeof(v2u64); i++)
        s += tail[i];
    return s;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    bench *b = w->b;
    pthread_mutex_lock(&b->gate_mu);
    while (!b->go)
        pthread_cond_wait(&b->gate_cv, &b->gate_mu);
    int go = b->go;
    pthread_mutex_unlock(&b->gate_mu);
    if (go < 0)
        return NULL;
    size_t n_chunks = (b->n_vec + CHUNK_VECS - 1) / CHUNK_VECS;
    for (unsigned p = 0; p < b->passes; p++) {
        pthread_barrier_wait(&b->start);
        for (size_t i; (i = atomic_fetch_add(&b->next, 1)) < n_chunks;) {
            size_t first = i * CHUNK_VECS;
            size_t n = b->n_vec - first < CHUNK_VECS ? b->n_vec - first : CHUNK_VECS;
            b->sink[w->idx] += sum_range(b->buf + first, n);
        }
        pthread_barrier_wait(&b->done);
    }
    return NULL;
}

#define MAX_PASSES 64

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* AnonHugePages of the mapping holding addr, from /proc/self/smaps; 0 if unknown. */
static uint64_t huge_bytes_at(const void *addr)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return 0;
    char line[512];
    int inside = 0;
    unsigned long long kb = 0, lo, hi;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
        else if (inside && sscanf(line, "AnonHugePages: %llu kB", &kb) == 1)
            break;
    }
    fclose(f);
    return inside ? (uint64_t)kb * 1024 : 0;
}

static void open_gate(bench *b, int go)
{
    pthread_mutex_lock(&b->gate_mu);
    b->go = go;
    pthread_cond_broadcast(&b->gate_cv);
    pthread_mutex_unlock(&b->gate_mu);
}

/* Threads are started once; each pass is timed from the start barrier to the done barrier,
 * so thread creation is not part of the figure.  pass_s[0..passes): each pass's time; *best
 * the fastest.  -1 when not every thread could be started. */
static int run_passes(bench *b, double *best, double *pass_s)
{
    pthread_t tid[256];
    worker w[256];
    unsigned started = 0;
    pthread_mutex_init(&b->gate_mu, NULL);
    pthread_cond_init(&b->gate_cv, NULL);
    for (unsigned t = 0; t < b->threads; t++) {
        w[t] = (worker){b, t};
        if (pthread_create(&tid[t], NULL, worker_main, &w[t]) != 0)
            break;
        started++;
    }
    if (started == b->threads) {
        pthread_barrier_init(&b->start, NULL, b->threads + 1);
        pthread_barrier_init(&b->done, NULL, b->threads + 1);
    }
    open_gate(b, started == b->threads ? 1 : -1);
    if (started != b->threads) {
        for (unsigned t = 0; t < started; t++)
            pthread_join(tid[t], NULL);
        pthread_cond_destroy(&b->gate_cv);
        pthread_mutex_destroy(&b->gate_mu);
        return -1;
    }
    *best = 0;
    for (unsigned p = 0; p < b->passes; p++) {
        atomic_store(&b->next, 0);
        pthread_barrier_wait(&b->start);
        double t0 = kl_now_s();
        pthread_barrier_wait(&b->done);
        double s = kl_now_s() - t0;
        pass_s[p] = s;
        if (!*best || s < *best)
            *best = s;
    }
    for (unsigned t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    pthread_barrier_destroy(&b->start);
    pthread_barrier_destroy(&b->done);
    pthread_cond_destroy(&b->gate_cv);
    pthread_mutex_destroy(&b->gate_mu);
    return 0;
}

#define HUGE_PAGE ((size_t)2 << 20)

/* The buffer is asked for on 2 MiB pages (transparent huge pages, where the kernel allows
 * them): on 4 KiB pages the pass also measures TLB misses (costly under nested paging), and a
 * reader of 2 MiB-mapped page cache could beat such a "ceiling".  Returns the mapping's start
 * in *map and its length in *map_len, the aligned buffer as the result; NULL on failure. */
static void *alloc_buffer(size_t bytes, void **map, size_t *map_len)
{
    *map_len = bytes + HUGE_PAGE;
    *map = mmap(NULL, *map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*map == MAP_FAILED)
        return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)*map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

int kl_membench_read(size_t bytes, unsigned threads, unsigned passes, kl_membench_result *res,
                     kl_err *err)
{
    if (threads < 1 || threads > 256 || bytes < 4096 || !passes || passes > MAX_PASSES)
        return kl_fail(err, KL_E_USAGE, "membench: need 1..256 threads, >= 4 KiB, 1..%d passes",
                       MAX_PASSES);
    bytes &= ~(size_t)63;
    void *map;
    size_t map_len;
    v2u64 *buf = alloc_buffer(bytes, &map, &map_len);
    if (!buf)
        return kl_fail(err, KL_E_NOMEM, "membench: cannot allocate %zu bytes", bytes);
    memset(buf, 0x5a, bytes); /* first touch: fault every page in before timing */
    bench *b = kl_calloc(1, sizeof *b);
    if (!b) {
        munmap(map, map_len);
        return kl_fail(err, KL_E_NOMEM, "membench: out of memory");
    }
    b->buf = buf;
    b->n_vec = bytes / sizeof(v2u64);
    b->threads = threads;
    b->passes = passes;
    double best = 0, pass_s[MAX_PASSES];
    uint64_t huge = huge_bytes_at(buf);
    int rc = run_passes(b, &best, pass_s);
    kl_free(b);
    munmap(map, map_len);
    if (rc)
        return kl_fail(err, KL_E_IO, "membench: cannot start %u threads", threads);
    res->bytes = bytes;
    res->threads = threads;
    res->best_s = best;
    res->read_gbps = (double)bytes / best / 1e9;
    qsort(pass_s, passes, sizeof *pass_s, cmp_double);
    double median = passes % 2 ? pass_s[passes / 2]
                               : (pass_s[passes / 2 - 1] + pass_s[passes / 2]) / 2;
    res->median_gbps = (double)bytes / median / 1e9;
    res->huge_bytes = huge < bytes ? huge : bytes; /* the VMA may hold neighbours too */
    return 0;
}
