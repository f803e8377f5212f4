/*
 * loader/reader_uring.c — io_uring backend of the staged reader (liburing >= 2.3).
 *
 * One ring of queue_depth entries; the slot buffers are registered once so reads use
 * IORING_OP_READ_FIXED (no per-read page pinning).  When registration is refused (memlock
 * limit) plain IORING_OP_READ is used.  Reads of buffered (non-O_DIRECT) files carry
 * IOSQE_ASYNC so page-cache copies run on io-wq workers in parallel instead of inline in
 * io_uring_submit.  user_data is the slot.  Results go to kl_rd_complete unchanged.  No
 * files are registered with the ring, so closing a reader file needs nothing from here.
 */
#include "loader/reader_int.h"

#include "common/log.h"
#include "common/mem.h"

#include <errno.h>
#include <liburing.h>
#include <sys/uio.h>

typedef struct uring_be {
    struct io_uring ring;
    int             registered;  /* slot buffers registered: use read_fixed */
} uring_be;

static int uring_init(kl_reader *r, kl_err *err)
{
    unsigned qd = r->opts.queue_depth;
    uring_be *be = kl_calloc(1, sizeof *be);
    if (!be)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the io_uring backend");
    int rc = r->sys.uring_init(qd, &be->ring, 0);
    if (rc < 0) {
        kl_free(be);
        /* EPERM/ENOSYS under seccomp, gVisor or io_uring_disabled; ENOMEM on tiny limits. */
        return kl_fail_sys(err, KL_E_UNSUPPORTED, -rc,
                           "io_uring is not available (io_uring_queue_init failed)");
    }
    struct iovec *iov = kl_calloc(qd, sizeof *iov);
    if (iov) {
        for (unsigned i = 0; i < qd; i++) {
            iov[i].iov_base = r->slots[i].buf;
            iov[i].iov_len = r->cap;
        }
        rc = io_uring_register_buffers(&be->ring, iov, qd);
        be->registered = rc == 0;
        if (rc)
            kl_log(KL_LOG_DEBUG, "reader: io_uring buffer registration refused (%d); "
                                 "using unregistered reads", rc);
        kl_free(iov);
    }
    r->be = be;
    return 0;
}

static void uring_fini(kl_reader *r)
{
    uring_be *be = r->be;
    if (!be)
        return;
    /* A broken reader (reap kept failing) may still have reads in the kernel, and closing the
     * ring does not wait for them: give them a bounded chance to finish before the slot
     * buffers are freed.  Nothing to do in the normal case (inflight == 0). */
    for (unsigned tries = 0; r->inflight && tries < 100; tries++) {
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = 10 * 1000 * 1000};
        if (io_uring_wait_cqe_timeout(&be->ring, &cqe, &ts) == 0) {
            r->inflight--;
            io_uring_cqe_seen(&be->ring, cqe);
        }
    }
    io_uring_queue_exit(&be->ring);  /* also drops the buffer registration */
    kl_free(be);
    r->be = NULL;
}

static int uring_queue(kl_reader *r, kl_slot *s, kl_err *err)
{
    uring_be *be = r->be;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&be->ring);
    if (!sqe) {
        /* SQ full of prepared entries: push them to the kernel to make room. */
        io_uring_submit(&be->ring);
        sqe = io_uring_get_sqe(&be->ring);
        if (!sqe)
            return kl_fail(err, KL_E_IO, "io_uring submission queue is full");
    }
    if (be->registered)
        io_uring_prep_read_fixed(sqe, s->op_fd, s->op_buf, (unsigned)s->op_len, s->op_off,
                                 (int)s->idx);
    else
        io_uring_prep_read(sqe, s->op_fd, s->op_buf, (unsigned)s->op_len, s->op_off);
    if (!r->files[s->file].direct)
        sqe->flags |= IOSQE_ASYNC;
    io_uring_sqe_set_data(sqe, s);
    return 0;
}

static int uring_flush(kl_reader *r, kl_err *err)
{
    uring_be *be = r->be;
    while (io_uring_sq_ready(&be->ring)) {
        int rc = io_uring_submit(&be->ring);
        if (rc == -EINTR)
            continue;
        if (rc == -EAGAIN || rc == -EBUSY)
            return 0;  /* kernel short of resources: reap retries the submit */
        if (rc < 0)
            return kl_fail_sys(err, KL_E_IO, -rc, "io_uring_submit failed");
        if (rc == 0)
            break;
    }
    return 0;
}

static int uring_reap(kl_reader *r, kl_err *err)
{
    uring_be *be = r->be;
    for (;;) {
        int rc = r->sys.uring_wait(&be->ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME)
            return kl_fail_sys(err, KL_E_IO, -rc, "io_uring_submit_and_wait failed");
        unsigned head, n = 0;
        struct io_uring_cqe *cqe;
        io_uring_for_each_cqe(&be->ring, head, cqe)
        {
            n++;
            kl_rd_complete(r, io_uring_cqe_get_data(cqe), cqe->res);
        }
        io_uring_cq_advance(&be->ring, n);
        if (n)
            return 0;
    }
}

const kl_backend_ops kl_rd_uring_ops = {
    .id = KL_IO_URING,
    .init = uring_init,
    .fini = uring_fini,
    .queue = uring_queue,
    .flush = uring_flush,
    .reap = uring_reap,
    .reset = NULL,  /* io_uring_queue_exit does not wait for reads in flight */
};
