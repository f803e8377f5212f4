/* common/pool.c — worker team for data-parallel loops (see pool.h). */
#include "common/pool.h"

#include "common/clock.h"
#include "common/mem.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* How long a worker (or the caller waiting for the workers) spins before it sleeps on a
 * condition variable.  A decode step is hundreds of short runs back to back; waking a
 * sleeping team through futexes costs ~10 us per run on a VM, more than many of the runs
 * themselves.  Spinning that briefly after each run costs nothing measurable when idle. */
#define SPIN_SECONDS 100e-6
#define SPIN_CHECK_EVERY 64 /* pause loops between clock reads */

typedef void (*item_fn)(void *ctx, size_t i);

/* The run's items are claimed from one 64-bit word, (run << 32) | index, checked against
 * (run << 32) | n: a claim counts only if it names the current run and an index below n, so a
 * worker that wakes late (descheduled, asleep, preempted by another thread of the process)
 * can neither run an item twice nor run one of a finished run.  A claimed item keeps its run
 * current (the caller waits for every item to be done), so fn and ctx stay valid while it
 * runs.  The caller waits for the items, not for the workers: a worker that has not woken yet
 * delays nothing. */
struct kl_pool {
    pthread_mutex_t mu;
    pthread_cond_t  start_cv, done_cv;
    pthread_t      *th;
    unsigned        n_th;          /* worker threads (threads - 1) */
    atomic_ulong    generation;    /* bumped for every run (under mu) */
    atomic_int      stop;
    unsigned        sleepers;      /* workers waiting on start_cv (under mu) */
    int             caller_sleeps; /* the caller waits on done_cv (under mu) */
    uint32_t        run;           /* the current run's number (the caller's) */
    /* the current run: fn and ctx written before limit, limit before next */
    _Atomic(item_fn) fn;
    _Atomic(void *) ctx;
    atomic_uint_fast64_t limit;    /* (run << 32) | n */
    atomic_uint_fast64_t next;     /* (run << 32) | next index to claim */
    atomic_size_t   done;          /* items of the current run finished */
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spins until done(p, arg) or SPIN_SECONDS pass; returns the last done() result. */
static int spin_until(kl_pool *p, int (*done)(kl_pool *p, unsigned long arg), unsigned long arg)
{
    double t0 = kl_now_s();
    for (unsigned i = 1;; i++) {
        if (done(p, arg))
            return 1;
        cpu_relax();
        if (i % SPIN_CHECK_EVERY == 0 && kl_now_s() - t0 > SPIN_SECONDS)
            return done(p, arg);
    }
}

static int new_run_or_stop(kl_pool *p, unsigned long seen)
{
    return atomic_load(&p->stop) || atomic_load(&p->generation) != seen;
}

static int items_done(kl_pool *p, unsigned long n)
{
    return atomic_load(&p->done) == n;
}

/* Claims and runs items of the current run until none is left; the one who finishes the last
 * item wakes a sleeping caller. */
static void drain(kl_pool *p)
{
    for (;;) {
        uint64_t c = atomic_fetch_add(&p->next, 1), lim = atomic_load(&p->limit);
        if (c >> 32 != lim >> 32 || (c & 0xffffffffu) >= (lim & 0xffffffffu))
            return;
        atomic_load(&p->fn)(atomic_load(&p->ctx), (size_t)(c & 0xffffffffu));
        if (atomic_fetch_add(&p->done, 1) + 1 == (lim & 0xffffffffu)) {
            pthread_mutex_lock(&p->mu);
            if (p->caller_sleeps)
                pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker_main(void *arg)
{
    kl_pool *p = arg;
    unsigned long seen = 0;
    for (;;) {
        if (!spin_until(p, new_run_or_stop, seen)) {
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while (!new_run_or_stop(p, seen))
                pthread_cond_wait(&p->start_cv, &p->mu);
            p->sleepers--;
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            break;
        seen = atomic_load(&p->generation);
        drain(p);
    }
    return NULL;
}

int kl_pool_create(kl_pool **out, unsigned threads, kl_err *err)
{
    *out = NULL;
    kl_pool *p = kl_calloc(1, sizeof *p);
    unsigned nw = threads > 1 ? threads - 1 : 0;
    if (!p || !(p->th = kl_calloc(nw ? nw : 1, sizeof *p->th))) {
        kl_free(p);
        return kl_fail(err, KL_E_NOMEM, "out of memory for a thread pool");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    for (unsigned i = 0; i < nw; i++) {
        int rc = pthread_create(&p->th[i], NULL, worker_main, p);
        if (rc) {
            kl_pool_destroy(p);
            return kl_fail_sys(err, KL_E_NOMEM, rc, "cannot start %u threads", nw);
        }
        p->n_th++;
    }
    *out = p;
    return 0;
}

void kl_pool_destroy(kl_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->n_th; i++)
        pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start_cv);
    pthread_cond_destroy(&p->done_cv);
    kl_free(p->th);
    kl_free(p);
}

void kl_pool_run(kl_pool *p, size_t n, void (*fn)(void *ctx, size_t i), void *ctx)
{
    if (!n)
        return;
    if (!p->n_th || n == 1 || n > 0xffffffffu) { /* nobody to share with (or too many) */
        for (size_t i = 0; i < n; i++)
            fn(ctx, i);
        return;
    }
    uint64_t run = (uint64_t)++p->run << 32;
    atomic_store(&p->fn, fn);
    atomic_store(&p->ctx, ctx);
    atomic_store(&p->done, 0);
    atomic_store(&p->limit, run | n);
    atomic_store(&p->next, run);
    /* Bumped under mu: a worker checks it under mu before sleeping, so it either sees the
     * new run or is counted in sleepers and woken. */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->generation, 1);
    if (p->sleepers)
        pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    if (!spin_until(p, items_done, (unsigned long)n)) {
        pthread_mutex_lock(&p->mu);
        p->caller_sleeps = 1;
        while (atomic_load(&p->done) != n)
            pthread_cond_wait(&p->done_cv, &p->mu);
        p->caller_sleeps = 0;
        pthread_mutex_unlock(&p->mu);
    }
}

unsigned kl_pool_threads(const kl_pool *p)
{
    return p->n_th + 1;
}
