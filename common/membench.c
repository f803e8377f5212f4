/* common/membench.c — multi-threaded single-pass memory-read bandwidth (see membench.h). */
#include "common/membench.h"

#include "common/clock.h"
#include "common/mem.h"
#include "common/stats.h"

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
#define MAX_THREADS 256u
#define HUGE_PAGE ((size_t)2 << 20)

struct kl_membench {
    const v2u64      *buf;
    void             *map;         /* the mapping holding buf */
    size_t            map_len;
    v2u64            *dst;         /* a copy bench: where pieces of buf are copied; else NULL */
    void             *dst_map;
    size_t            dst_map_len;
    size_t            n_vec;       /* 16-byte vectors in buf */
    size_t            buf_chunks;  /* CHUNK_VECS pieces in buf */
    size_t            pass_chunks; /* pieces in the current pass (wrapping around buf) */
    atomic_size_t     next;        /* next piece of the current pass */
    unsigned          threads;
    int               quit;        /* set before the start barrier: workers return */
    uint64_t          huge_bytes;
    unsigned          started;     /* workers created */
    pthread_t         tid[MAX_THREADS];
    pthread_barrier_t start, done;
    /* Workers wait at this gate until every thread started (go = 1) or one could not be
     * (go = -1: they return).  A barrier sized for the whole team cannot be left by a partial
     * one, and pthread_barrier_wait is not a cancellation point. */
    pthread_mutex_t   gate_mu;
    pthread_cond_t    gate_cv;
    int               go;
    uint64_t          sink[MAX_THREADS]; /* per-thread results, so the loads cannot be dropped */
};

typedef struct worker_arg {
    kl_membench *b;
    unsigned     idx;
} worker_arg;

/* noinline: inlined with a constant n, GCC 12 warns about the tail loop (a false alarm). */
__attribute__((noinline)) static uint64_t sum_range(const v2u64 *p, size_t n)
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
    worker_arg w = *(worker_arg *)arg;
    kl_membench *b = w.b;
    kl_free(arg);
    pthread_mutex_lock(&b->gate_mu);
    while (!b->go)
        pthread_cond_wait(&b->gate_cv, &b->gate_mu);
    int go = b->go;
    pthread_mutex_unlock(&b->gate_mu);
    if (go < 0)
        return NULL;
    for (;;) {
        pthread_barrier_wait(&b->start);
        if (b->quit)
            return NULL;
        for (size_t i; (i = atomic_fetch_add(&b->next, 1)) < b->pass_chunks;) {
            const size_t at = i % b->buf_chunks * CHUNK_VECS;
            if (b->dst)
                memcpy(b->dst + at, b->buf + at, CHUNK_VECS * sizeof(v2u64));
            else
                b->sink[w.idx] += sum_range(b->buf + at, CHUNK_VECS);
        }
        pthread_barrier_wait(&b->done);
    }
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

/* bytes (a whole number of 2 MiB pieces) asked for on 2 MiB pages (transparent huge pages,
 * where the kernel allows them) and touched: on 4 KiB pages a pass also measures TLB misses
 * (costly under nested paging), and a reader of 2 MiB-mapped page cache could beat such a
 * "ceiling".  NULL if the mapping fails; *map and *map_len say what to unmap. */
static uint8_t *map_huge(size_t bytes, int fill, void **map, size_t *map_len)
{
    *map_len = bytes + HUGE_PAGE;
    *map = mmap(NULL, *map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*map == MAP_FAILED) {
        *map = NULL;
        return NULL;
    }
    uint8_t *p = (uint8_t *)(((uintptr_t)*map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    memset(p, fill, bytes); /* first touch: fault every page in before timing */
    return p;
}

static void unmap_buffers(kl_membench *b)
{
    if (b->map)
        munmap(b->map, b->map_len);
    if (b->dst_map)
        munmap(b->dst_map, b->dst_map_len);
}

/* The buffer (bytes rounded up to whole 2 MiB pieces), and for a copy bench the destination
 * of the same size. */
static int alloc_buffer(kl_membench *b, size_t bytes, int copy)
{
    bytes = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    uint8_t *p = map_huge(bytes, 0x5a, &b->map, &b->map_len);
    if (!p)
        return -1;
    if (copy && !(b->dst = (v2u64 *)map_huge(bytes, 0, &b->dst_map, &b->dst_map_len)))
        return -1;
    b->buf = (const v2u64 *)p;
    b->n_vec = bytes / sizeof(v2u64);
    b->buf_chunks = b->n_vec / CHUNK_VECS;
    b->huge_bytes = huge_bytes_at(p);
    if (b->huge_bytes > bytes)
        b->huge_bytes = bytes; /* the VMA may hold neighbours too */
    return 0;
}

static void open_gate(kl_membench *b, int go)
{
    pthread_mutex_lock(&b->gate_mu);
    b->go = go;
    pthread_cond_broadcast(&b->gate_cv);
    pthread_mutex_unlock(&b->gate_mu);
}

/* Starts the team behind the gate; -1 (workers told to return) if one thread cannot start. */
static int start_threads(kl_membench *b)
{
    pthread_mutex_init(&b->gate_mu, NULL);
    pthread_cond_init(&b->gate_cv, NULL);
    for (; b->started < b->threads; b->started++) {
        worker_arg *w = kl_malloc(sizeof *w);
        if (!w)
            break;
        *w = (worker_arg){b, b->started};
        if (pthread_create(&b->tid[b->started], NULL, worker_main, w) != 0) {
            kl_free(w);
            break;
        }
    }
    if (b->started < b->threads) {
        open_gate(b, -1);
        return -1;
    }
    pthread_barrier_init(&b->start, NULL, b->threads + 1);
    pthread_barrier_init(&b->done, NULL, b->threads + 1);
    open_gate(b, 1);
    return 0;
}

/* kl_membench_open, or with copy set a bench whose passes copy the pieces into a second
 * buffer. */
static int bench_open(size_t bytes, unsigned threads, int copy, kl_membench **out, kl_err *err)
{
    *out = NULL;
    if (threads < 1 || threads > MAX_THREADS || bytes < 4096)
        return kl_fail(err, KL_E_USAGE, "membench: need 1..%u threads and >= 4 KiB", MAX_THREADS);
    kl_membench *b = kl_calloc(1, sizeof *b);
    if (!b)
        return kl_fail(err, KL_E_NOMEM, "membench: out of memory");
    b->threads = threads;
    if (bytes > SIZE_MAX - 2 * HUGE_PAGE || alloc_buffer(b, bytes, copy)) {
        unmap_buffers(b);
        kl_free(b);
        return kl_fail(err, KL_E_NOMEM, "membench: cannot allocate %zu bytes%s", bytes,
                       copy ? " twice" : "");
    }
    if (start_threads(b)) {
        kl_membench_close(b);
        return kl_fail(err, KL_E_IO, "membench: cannot start %u threads", threads);
    }
    *out = b;
    return 0;
}

int kl_membench_open(size_t bytes, unsigned threads, kl_membench **out, kl_err *err)
{
    return bench_open(bytes, threads, 0, out, err);
}

double kl_membench_pass(kl_membench *b, uint64_t bytes, uint64_t *bytes_read)
{
    uint64_t piece = CHUNK_VECS * sizeof(v2u64);
    b->pass_chunks = (size_t)((bytes + piece - 1) / piece);
    *bytes_read = (uint64_t)b->pass_chunks * piece;
    atomic_store(&b->next, 0);
    pthread_barrier_wait(&b->start);
    double t0 = kl_now_s();
    pthread_barrier_wait(&b->done);
    return kl_now_s() - t0;
}

size_t kl_membench_buffer_bytes(const kl_membench *b) { return b->n_vec * sizeof(v2u64); }
unsigned kl_membench_threads(const kl_membench *b) { return b->threads; }
uint64_t kl_membench_huge_bytes(const kl_membench *b) { return b->huge_bytes; }

void kl_membench_close(kl_membench *b)
{
    if (!b)
        return;
    if (b->started == b->threads && b->go > 0) {
        b->quit = 1;
        pthread_barrier_wait(&b->start);
    }
    for (unsigned t = 0; t < b->started; t++)
        pthread_join(b->tid[t], NULL);
    if (b->go > 0) {
        pthread_barrier_destroy(&b->start);
        pthread_barrier_destroy(&b->done);
    }
    pthread_cond_destroy(&b->gate_cv);
    pthread_mutex_destroy(&b->gate_mu);
    unmap_buffers(b);
    kl_free(b);
}

#define MAX_PASSES 64

/* Open (a copy bench with copy set), `passes` passes over the buffer, close. */
static int bench_passes(size_t bytes, unsigned threads, unsigned passes, int copy,
                        kl_membench_result *res, kl_err *err)
{
    if (!passes || passes > MAX_PASSES)
        return kl_fail(err, KL_E_USAGE, "membench: need 1..%d passes", MAX_PASSES);
    kl_membench *b;
    int rc = bench_open(bytes, threads, copy, &b, err);
    if (rc)
        return rc;
    uint64_t n = kl_membench_buffer_bytes(b);
    double pass_s[MAX_PASSES], best = 0;
    for (unsigned p = 0; p < passes; p++) {
        pass_s[p] = kl_membench_pass(b, n, &n);
        if (!best || pass_s[p] < best)
            best = pass_s[p];
    }
    *res = (kl_membench_result){.bytes = (size_t)n, .threads = threads, .best_s = best,
                                .read_gbps = (double)n / best / 1e9,
                                .huge_bytes = kl_membench_huge_bytes(b)};
    kl_membench_close(b);
    res->median_gbps = (double)n / kl_median(pass_s, passes) / 1e9;
    return 0;
}

int kl_membench_read(size_t bytes, unsigned threads, unsigned passes, kl_membench_result *res,
                     kl_err *err)
{
    return bench_passes(bytes, threads, passes, 0, res, err);
}

int kl_membench_copy(size_t bytes, unsigned threads, unsigned passes, kl_membench_result *res,
                     kl_err *err)
{
    return bench_passes(bytes, threads, passes, 1, res, err);
}
