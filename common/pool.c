/* common/pool.c — worker team for data-parallel loops (see pool.h). */
#include "common/pool.h"

#include "common/clock.h"
#include "common/mem.h"

#include <pthread.h>
#include <stdatomic.h>

/* How long a worker (or the caller waiting for the workers) spins before it sleeps on a
 * condition variable.  A decode step is hundreds of short runs back to back; waking a
 * sleeping team through futexes costs ~10 us per run on a VM, more than many of the runs
 * themselves.  Spinning that briefly after each run costs nothing measurable when idle. */
#define SPIN_SECONDS 100e-6
#define SPIN_CHECK_EVERY 64 /* pause loops between clock reads */

struct kl_pool {
    pthread_mutex_t mu;
    pthread_cond_t  start_cv, done_cv;
    pthread_t      *th;
    unsigned        n_th;          /* worker threads (threads - 1) */
    atomic_ulong    generation;    /* bumped for every run (under mu) */
    atomic_uint     busy;          /* workers still inside the current run */
    atomic_int      stop;
    unsigned        sleepers;      /* workers waiting on start_cv (under mu) */
    int             caller_sleeps; /* the caller waits on done_cv (under mu) */
    /* the current run: written before generation is bumped */
    size_t          n;
    atomic_size_t   next;
    void (*fn)(void *ctx, size_t i);
    void           *ctx;
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

static int workers_done(kl_pool *p, unsigned long unused)
{
    (void)unused;
    return atomic_load(&p->busy) == 0;
}

static void drain(kl_pool *p)
{
    for (size_t i; (i = atomic_fetch_add(&p->next, 1)) < p->n;)
        p->fn(p->ctx, i);
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
        if (atomic_fetch_sub(&p->busy, 1) == 1) { /* the last one out wakes a sleeping caller */
            pthread_mutex_lock(&p->mu);
            if (p->caller_sleeps)
                pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
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
    if (!p->n_th || n == 1) { /* nobody to share with */
        for (size_t i = 0; i < n; i++)
            fn(ctx, i);
        return;
    }
    p->n = n;
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->next, 0);
    atomic_store(&p->busy, p->n_th);
    /* Bumped under mu: a worker checks it under mu before sleeping, so it either sees the
     * new run or is counted in sleepers and woken. */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->generation, 1);
    if (p->sleepers)
        pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    if (!spin_until(p, workers_done, 0)) {
        pthread_mutex_lock(&p->mu);
        p->caller_sleeps = 1;
        while (atomic_load(&p->busy))
            pthread_cond_wait(&p->done_cv, &p->mu);
        p->caller_sleeps = 0;
        pthread_mutex_unlock(&p->mu);
    }
}

unsigned kl_pool_threads(const kl_pool *p)
{
    return p->n_th + 1;
}
