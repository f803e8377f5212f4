/*
 * loader/reader_pread.c — pread(2) worker-thread backend of the staged reader.
 *
 * `threads` workers take ops from a FIFO job queue, do exactly one pread each (through the
 * syscall table, so tests can inject faults) and post the op to a done queue; the reader's
 * thread reaps from there.  Retries and short reads are handled by kl_rd_complete like for the
 * other backends.  Works on every file system, with or without O_DIRECT; from the page cache
 * the parallel copies are what make it fast (one thread copies about 8 GB/s).
 * Both queues hold at most queue_depth entries: a slot has at most one op in flight.
 */
#include "loader/reader_int.h"

#include "common/mem.h"

#include <errno.h>
#include <pthread.h>

typedef struct pread_be {
    pthread_mutex_t mu;
    pthread_cond_t  job_cv;     /* a job was queued, or stop */
    pthread_cond_t  done_cv;    /* an op finished */
    kl_slot       **jobs;       /* [queue_depth] ring */
    unsigned        job_head, n_jobs;
    kl_slot       **done;       /* [queue_depth] ring */
    unsigned        done_head, n_done;
    kl_slot       **batch;      /* [queue_depth] reaped ops, reader thread only */
    unsigned        cap;        /* queue_depth */
    int             stop;
    pthread_t      *th;         /* [n_th] */
    unsigned        n_th;
    ssize_t (*pread)(int fd, void *buf, size_t n, off_t off);
} pread_be;

static void *worker(void *p)
{
    pread_be *be = p;
    pthread_mutex_lock(&be->mu);
    for (;;) {
        while (!be->n_jobs && !be->stop)
            pthread_cond_wait(&be->job_cv, &be->mu);
        if (be->stop)
            break;
        kl_slot *s = be->jobs[be->job_head];
        be->job_head = (be->job_head + 1) % be->cap;
        be->n_jobs--;
        pthread_mutex_unlock(&be->mu);

        ssize_t n = be->pread(s->op_fd, s->op_buf, s->op_len, (off_t)s->op_off);
        s->op_res = n < 0 ? -(ssize_t)errno : n;

        pthread_mutex_lock(&be->mu);
        be->done[(be->done_head + be->n_done) % be->cap] = s;
        be->n_done++;
        pthread_cond_signal(&be->done_cv);
    }
    pthread_mutex_unlock(&be->mu);
    return NULL;
}

static void stop_workers(pread_be *be)
{
    pthread_mutex_lock(&be->mu);
    be->stop = 1;
    pthread_cond_broadcast(&be->job_cv);
    pthread_mutex_unlock(&be->mu);
    for (unsigned i = 0; i < be->n_th; i++)
        pthread_join(be->th[i], NULL);
    be->n_th = 0;
}

static void free_be(pread_be *be)
{
    pthread_mutex_destroy(&be->mu);
    pthread_cond_destroy(&be->job_cv);
    pthread_cond_destroy(&be->done_cv);
    kl_free(be->jobs);
    kl_free(be->done);
    kl_free(be->batch);
    kl_free(be->th);
    kl_free(be);
}

static int pread_init(kl_reader *r, kl_err *err)
{
    unsigned qd = r->opts.queue_depth, nt = r->opts.threads;
    pread_be *be = kl_calloc(1, sizeof *be);
    if (!be)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the pread backend");
    pthread_mutex_init(&be->mu, NULL);
    pthread_cond_init(&be->job_cv, NULL);
    pthread_cond_init(&be->done_cv, NULL);
    be->cap = qd;
    be->pread = r->sys.pread;
    be->jobs = kl_calloc(qd, sizeof *be->jobs);
    be->done = kl_calloc(qd, sizeof *be->done);
    be->batch = kl_calloc(qd, sizeof *be->batch);
    be->th = kl_calloc(nt, sizeof *be->th);
    if (!be->jobs || !be->done || !be->batch || !be->th) {
        free_be(be);
        return kl_fail(err, KL_E_NOMEM, "out of memory for the pread backend");
    }
    for (unsigned i = 0; i < nt; i++) {
        int rc = pthread_create(&be->th[i], NULL, worker, be);
        if (rc) {
            stop_workers(be);
            free_be(be);
            return kl_fail_sys(err, KL_E_NOMEM, rc, "cannot start %u pread threads", nt);
        }
        be->n_th++;
    }
    r->be = be;
    return 0;
}

static void pread_fini(kl_reader *r)
{
    pread_be *be = r->be;
    if (!be)
        return;
    stop_workers(be);
    free_be(be);
    r->be = NULL;
}

static int pread_queue(kl_reader *r, kl_slot *s, kl_err *err)
{
    pread_be *be = r->be;
    pthread_mutex_lock(&be->mu);
    if (be->n_jobs >= be->cap) {
        pthread_mutex_unlock(&be->mu);
        return kl_fail(err, KL_E_BUG, "pread job queue overflow");
    }
    be->jobs[(be->job_head + be->n_jobs) % be->cap] = s;
    be->n_jobs++;
    pthread_cond_signal(&be->job_cv);
    pthread_mutex_unlock(&be->mu);
    return 0;
}

static int pread_flush(kl_reader *r, kl_err *err)
{
    (void)r, (void)err;
    return 0;
}

static int pread_reap(kl_reader *r, kl_err *err)
{
    (void)err;
    pread_be *be = r->be;
    pthread_mutex_lock(&be->mu);
    while (!be->n_done)
        pthread_cond_wait(&be->done_cv, &be->mu);
    unsigned n = be->n_done;
    for (unsigned i = 0; i < n; i++)
        be->batch[i] = be->done[(be->done_head + i) % be->cap];
    be->done_head = (be->done_head + n) % be->cap;
    be->n_done = 0;
    pthread_mutex_unlock(&be->mu);
    /* Outside the lock: kl_rd_complete may queue a retry. */
    for (unsigned i = 0; i < n; i++)
        kl_rd_complete(r, be->batch[i], be->batch[i]->op_res);
    return 0;
}

/* Joining the workers waits for the preads in progress; queued jobs are dropped.  (reap never
 * fails here, so drain does not need this today.) */
static int pread_reset(kl_reader *r, kl_err *err)
{
    pread_fini(r);
    return pread_init(r, err);
}

const kl_backend_ops kl_rd_pread_ops = {
    .id = KL_IO_PREAD,
    .init = pread_init,
    .fini = pread_fini,
    .queue = pread_queue,
    .flush = pread_flush,
    .reap = pread_reap,
    .reset = pread_reset,
};
