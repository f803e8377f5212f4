/* common/pool.c — worker team for data-parallel loops (see pool.h). */
#include "common/pool.h"

#include "common/mem.h"

#include <pthread.h>
#include <stdatomic.h>

struct kl_pool {
    pthread_mutex_t mu;
    pthread_cond_t  start_cv, done_cv;
    pthread_t      *th;
    unsigned        n_th;          /* worker threads (threads - 1) */
    unsigned long   generation;    /* bumped for every run */
    unsigned        busy;          /* workers still inside the current run */
    int             stop;
    /* the current run */
    size_t          n;
    atomic_size_t   next;
    void (*fn)(void *ctx, size_t i);
    void           *ctx;
};

static void drain(kl_pool *p)
{
    for (size_t i; (i = atomic_fetch_add(&p->next, 1)) < p->n;)
        p->fn(p->ctx, i);
}

static void *worker_main(void *arg)
{
    kl_pool *p = arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->start_cv, &p->mu);
        if (p->stop)
            break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0)
            pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
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
    p->stop = 1;
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
    pthread_mutex_lock(&p->mu);
    p->n = n;
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->next, 0);
    p->busy = p->n_th;
    p->generation++;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    pthread_mutex_lock(&p->mu);
    while (p->busy)
        pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

unsigned kl_pool_threads(const kl_pool *p)
{
    return p->n_th + 1;
}
