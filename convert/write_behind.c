/* convert/write_behind.c — bounded write-behind queue (see write_behind.h). */
#include "convert/write_behind.h"

#include "common/clock.h"
#include "common/mem.h"

#include <pthread.h>
#include <string.h>

typedef struct wb_item {
    struct wb_item *next;
    kl_st_writer   *w;
    size_t          tensor;
    uint64_t        off;
    size_t          n;
    uint8_t         data[];
} wb_item;

struct kl_wb {
    pthread_mutex_t mu;
    pthread_cond_t  work_cv;   /* an item was queued, or stop */
    pthread_cond_t  space_cv;  /* an item was written (space freed, or the queue is empty) */
    wb_item        *head, *tail;
    size_t          queued;    /* bytes waiting or being written */
    size_t          cap;
    int             busy;      /* the writer holds an item */
    int             stop;
    int             rc;        /* first error */
    kl_err          err;
    double          wait_s;
    pthread_t       th;
};

static void *writer_main(void *arg)
{
    kl_wb *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop)
            pthread_cond_wait(&q->work_cv, &q->mu);
        if (!q->head)
            break;
        wb_item *it = q->head;
        q->head = it->next;
        if (!q->head)
            q->tail = NULL;
        q->busy = 1;
        int failed = q->rc != 0;
        pthread_mutex_unlock(&q->mu);

        kl_err e;
        kl_err_clear(&e);
        int rc = failed ? 0 : kl_st_writer_pwrite(it->w, it->tensor, it->off, it->data, it->n, &e);

        pthread_mutex_lock(&q->mu);
        if (rc && !q->rc) {
            q->rc = rc;
            q->err = e;
        }
        q->queued -= it->n;
        q->busy = 0;
        kl_free(it);
        pthread_cond_broadcast(&q->space_cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int kl_wb_create(kl_wb **out, size_t cap_bytes, kl_err *err)
{
    *out = NULL;
    if (cap_bytes < ((size_t)1 << 20))
        return kl_fail(err, KL_E_USAGE, "write-behind queue of %zu bytes: at least 1 MiB",
                       cap_bytes);
    kl_wb *q = kl_calloc(1, sizeof *q);
    if (!q)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the write-behind queue");
    q->cap = cap_bytes;
    kl_err_clear(&q->err);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->work_cv, NULL);
    pthread_cond_init(&q->space_cv, NULL);
    if (pthread_create(&q->th, NULL, writer_main, q) != 0) {
        pthread_cond_destroy(&q->work_cv);
        pthread_cond_destroy(&q->space_cv);
        pthread_mutex_destroy(&q->mu);
        kl_free(q);
        return kl_fail(err, KL_E_NOMEM, "cannot start the writer thread");
    }
    *out = q;
    return 0;
}

void kl_wb_destroy(kl_wb *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->work_cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL);
    pthread_cond_destroy(&q->work_cv);
    pthread_cond_destroy(&q->space_cv);
    pthread_mutex_destroy(&q->mu);
    kl_free(q);
}

/* Copies q's first error into err; returns its code. */
static int report(kl_wb *q, kl_err *err)
{
    if (err)
        *err = q->err;
    return q->rc;
}

int kl_wb_write(kl_wb *q, kl_st_writer *w, size_t tensor, uint64_t off, const void *buf,
                size_t n, kl_err *err)
{
    if (!n)
        return 0;
    /* An item larger than the cap waits for an empty queue instead of deadlocking. */
    size_t need = n < q->cap ? n : q->cap;
    pthread_mutex_lock(&q->mu);
    if (q->queued + need > q->cap && !q->rc) {
        double t0 = kl_now_s();
        while (q->queued + need > q->cap && !q->rc)
            pthread_cond_wait(&q->space_cv, &q->mu);
        q->wait_s += kl_now_s() - t0;
    }
    int rc = q->rc ? report(q, err) : 0;
    pthread_mutex_unlock(&q->mu);
    if (rc)
        return rc;
    wb_item *it = kl_malloc(sizeof *it + n);
    if (!it)
        return kl_fail(err, KL_E_NOMEM, "out of memory queueing a %zu-byte write", n);
    *it = (wb_item){.w = w, .tensor = tensor, .off = off, .n = n};
    memcpy(it->data, buf, n);
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
    q->queued += n;
    pthread_cond_signal(&q->work_cv);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

int kl_wb_drain(kl_wb *q, kl_err *err)
{
    pthread_mutex_lock(&q->mu);
    while (q->head || q->busy)
        pthread_cond_wait(&q->space_cv, &q->mu);
    int rc = q->rc ? report(q, err) : 0;
    pthread_mutex_unlock(&q->mu);
    return rc;
}

double kl_wb_wait_s(const kl_wb *q)
{
    return q ? q->wait_s : 0.0;
}
