/*
 * loader/reader_aio.c — libaio backend of the staged reader.
 *
 * One io_context of queue_depth events and one iocb per slot.  Ops are collected and handed to
 * io_submit in one batch per flush.  libaio only is asynchronous with O_DIRECT and aligned
 * requests; the reader always asks for the aligned enclosing range of direct files, so the
 * unaligned last page of a file (where io_submit would block) is never requested — the
 * aligned read past EOF simply returns short.  On buffered files io_submit completes the read
 * synchronously, which is correct but slow (AUTO never picks aio for buffered reads).
 */
#include "loader/reader_int.h"

#include "common/mem.h"

#include <errno.h>
#include <libaio.h>
#include <sched.h>
#include <string.h>

typedef struct aio_be {
    io_context_t     ctx;
    struct iocb     *iocbs;      /* [queue_depth], one per slot */
    struct iocb    **pending;    /* [queue_depth] prepared, not yet accepted by io_submit */
    unsigned         n_pending;
    unsigned         in_kernel;  /* accepted by io_submit, event not yet reaped */
    struct io_event *events;     /* [queue_depth] */
} aio_be;

static void free_be(aio_be *be)
{
    kl_free(be->iocbs);
    kl_free(be->pending);
    kl_free(be->events);
    kl_free(be);
}

static int aio_init(kl_reader *r, kl_err *err)
{
    unsigned qd = r->opts.queue_depth;
    aio_be *be = kl_calloc(1, sizeof *be);
    if (!be)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the libaio backend");
    be->iocbs = kl_calloc(qd, sizeof *be->iocbs);
    be->pending = kl_calloc(qd, sizeof *be->pending);
    be->events = kl_calloc(qd, sizeof *be->events);
    if (!be->iocbs || !be->pending || !be->events) {
        free_be(be);
        return kl_fail(err, KL_E_NOMEM, "out of memory for the libaio backend");
    }
    int rc = r->sys.aio_setup((int)qd, &be->ctx);
    if (rc < 0) {
        free_be(be);
        /* ENOSYS without CONFIG_AIO, EAGAIN when fs.aio-max-nr is exhausted. */
        return kl_fail_sys(err, KL_E_UNSUPPORTED, -rc, "libaio is not available (io_setup failed)");
    }
    r->be = be;
    return 0;
}

static void aio_fini(kl_reader *r)
{
    aio_be *be = r->be;
    if (!be)
        return;
    io_destroy(be->ctx);  /* waits for anything still in flight */
    free_be(be);
    r->be = NULL;
}

static int aio_queue(kl_reader *r, kl_slot *s, kl_err *err)
{
    aio_be *be = r->be;
    if (be->n_pending >= r->opts.queue_depth)
        return kl_fail(err, KL_E_BUG, "libaio pending list overflow");
    struct iocb *cb = &be->iocbs[s->idx];
    io_prep_pread(cb, s->op_fd, s->op_buf, s->op_len, (long long)s->op_off);
    cb->data = s;
    be->pending[be->n_pending++] = cb;
    return 0;
}

static int aio_flush(kl_reader *r, kl_err *err)
{
    aio_be *be = r->be;
    while (be->n_pending) {
        int rc = io_submit(be->ctx, (long)be->n_pending, be->pending);
        if (rc == -EINTR)
            continue;
        if (rc == -EAGAIN)
            return 0;  /* out of kernel resources for now: retried by reap */
        if (rc > 0) {
            be->in_kernel += (unsigned)rc;
            be->n_pending -= (unsigned)rc;
            memmove(be->pending, be->pending + rc, be->n_pending * sizeof *be->pending);
            continue;
        }
        if (rc == 0)
            return kl_fail(err, KL_E_IO, "io_submit accepted none of %u reads", be->n_pending);
        /* The first iocb was refused (EINVAL for a misaligned direct read, EBADF, ...):
         * complete it with that error so it is reported like any failed read. */
        struct iocb *cb = be->pending[0];
        be->n_pending--;
        memmove(be->pending, be->pending + 1, be->n_pending * sizeof *be->pending);
        kl_rd_complete(r, cb->data, rc);
    }
    return 0;
}

static int aio_reap(kl_reader *r, kl_err *err)
{
    aio_be *be = r->be;
    int rc = aio_flush(r, err);
    if (rc)
        return rc;
    if (!be->in_kernel) {
        /* Everything is waiting for io_submit to take it (EAGAIN), or flush already completed
         * ops with errors: give the kernel a moment and let the caller look again. */
        if (be->n_pending)
            sched_yield();
        return 0;
    }
    for (;;) {
        int n = r->sys.aio_getevents(be->ctx, 1, (long)r->opts.queue_depth, be->events);
        if (n == -EINTR)
            continue;
        if (n < 0)
            return kl_fail_sys(err, KL_E_IO, -n, "io_getevents failed");
        be->in_kernel -= (unsigned)n;
        for (int i = 0; i < n; i++) {
            /* res is unsigned long in libaio's ABI; errors are -errno stored in it. */
            long res = (long)be->events[i].res;
            kl_rd_complete(r, be->events[i].data, (ssize_t)res);
        }
        return 0;
    }
}

/* io_destroy cancels or waits for every iocb in flight, so a new context starts clean. */
static int aio_reset(kl_reader *r, kl_err *err)
{
    aio_fini(r);
    return aio_init(r, err);
}

const kl_backend_ops kl_rd_aio_ops = {
    .id = KL_IO_AIO,
    .init = aio_init,
    .fini = aio_fini,
    .queue = aio_queue,
    .flush = aio_flush,
    .reap = aio_reap,
    .reset = aio_reset,
};
