/*
 * loader/reader_int.h — internals of the staged reader shared by reader.c and its backends
 * (reader_uring.c, reader_aio.c, reader_pread.c).  Never included from outside loader/, except
 * by tests/test_reader.c for the syscall table.
 *
 * Division of work: reader.c owns files, the ring of slots, chunk planning, completion handling
 * (short reads, EINTR/EAGAIN retries, EOF detection) and in-order delivery.  A backend only
 * moves one "op" (read op_len bytes at op_off of op_fd into op_buf) into the kernel and reports
 * its result through kl_rd_complete(); it never interprets results.
 *
 * Syscall table: every system call the reader makes on files (open, close, fstat, statx,
 * pread), the two ring set-ups and the two completion waits go through kl_reader_sys, so tests
 * can inject short reads, EINTR, EIO, an unavailable io_uring or a failing ring.  A reader
 * copies the table when it is created, so a test must install its table before
 * kl_reader_create and restore it (NULL) afterwards.  fcntl(F_GETFL/F_SETFL), used to clear
 * O_NONBLOCK and O_DIRECT on a descriptor the table's open returned, is called directly.
 */
#ifndef KL_LOADER_READER_INT_H
#define KL_LOADER_READER_INT_H

#include "loader/reader.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

struct io_uring;
struct io_context;
struct io_event;

/* ---- syscall table ---------------------------------------------------------------------- */

typedef struct kl_reader_sys {
    /* open(2) without a mode: the reader only ever passes
     * O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK [| O_DIRECT]. */
    int     (*open)(const char *path, int flags);
    int     (*close)(int fd);
    int     (*fstat)(int fd, struct stat *st);
    /* Direct-I/O alignment of an open file: 1 and both values set when the kernel reports it,
     * 0 when unknown (old kernel / file system), -1 when the file cannot do direct I/O. */
    int     (*dio_align)(int fd, uint32_t *mem_align, uint32_t *off_align);
    ssize_t (*pread)(int fd, void *buf, size_t n, off_t off);
    /* liburing's io_uring_queue_init and libaio's io_setup: 0 or -errno. */
    int     (*uring_init)(unsigned entries, struct io_uring *ring, unsigned flags);
    int     (*aio_setup)(int nr_events, struct io_context **ctx);
    /* io_uring_submit_and_wait and io_getevents (no timeout): as liburing / libaio return. */
    int     (*uring_wait)(struct io_uring *ring, unsigned wait_nr);
    int     (*aio_getevents)(struct io_context *ctx, long min_nr, long nr, struct io_event *ev);
} kl_reader_sys;

/* Installs a table for readers created afterwards; NULL fields (or sys == NULL) mean the real
 * call.  Not thread-safe: for tests, while no reader is being created. */
void kl_reader_set_sys(const kl_reader_sys *sys);

/* ---- internal types --------------------------------------------------------------------- */

/* Largest direct-I/O alignment handled: buffers carry this much slack on each side and are
 * aligned to it in memory.  A file asking for more is read buffered (or refused with
 * KL_DIRECT_ON). */
#define KL_RD_MAX_ALIGN 4096u
/* Upper bound of buf_bytes: io_uring and Linux read(2) cap one op near 2 GiB. */
#define KL_RD_MAX_BUF ((size_t)1 << 30)
#define KL_RD_MAX_QD 4096u
/* Consecutive EINTR/EAGAIN results on one op before giving up. */
#define KL_RD_MAX_RETRIES 1000u

typedef struct kl_rfile {
    char    *path;       /* owned, kl_strdup; kept after kl_reader_close_file */
    int      fd;         /* read-only, blocking; -1 after kl_reader_close_file */
    int      direct;     /* O_DIRECT in effect on fd */
    uint32_t align;      /* offset/length/memory alignment of reads: dio alignment, 1 buffered */
    uint64_t size;       /* bytes, from fstat at kl_reader_add_file */
} kl_rfile;

enum { KL_SLOT_FREE = 0, KL_SLOT_BUSY, KL_SLOT_DONE, KL_SLOT_FAILED };

/* One ring entry: an aligned buffer and the chunk it holds.  File offsets: rd_off <= payload
 * start < need_end <= rd_end; buf[0] holds the byte at rd_off. */
typedef struct kl_slot {
    uint8_t *buf;        /* [cap] aligned to KL_RD_MAX_ALIGN; registered with io_uring */
    unsigned idx;        /* index in the ring (io_uring buffer index, user_data) */
    int      state;      /* KL_SLOT_* */
    /* the chunk */
    size_t   ext_idx;    /* extent this chunk belongs to */
    uint64_t ext_off;    /* payload offset within the extent */
    uint32_t file;       /* index into files */
    uint64_t rd_off;     /* file offset of buf[0] (aligned down for direct files) */
    uint64_t need_end;   /* file offset one past the last payload byte */
    uint64_t rd_end;     /* file offset one past the last byte asked for (aligned up) */
    uint64_t filled;     /* bytes valid from buf[0] */
    unsigned retries;    /* consecutive EINTR/EAGAIN on the current op */
    /* the op in flight */
    int      op_fd;
    uint8_t *op_buf;     /* inside buf */
    size_t   op_len;
    uint64_t op_off;
    ssize_t  op_res;     /* pread backend: bytes or -errno */
    /* why the chunk failed (KL_SLOT_FAILED); reported when delivery reaches it, so every
     * chunk before a failed one is still delivered */
    int      err_code;   /* KL_E_* */
    int      err_errno;
    uint64_t err_off;    /* file offset of the failure */
    char     err_msg[192];
} kl_slot;

typedef struct kl_backend_ops {
    kl_io_backend id;
    /* 0, KL_E_UNSUPPORTED when the backend cannot run here (err says why), KL_E_NOMEM. */
    int  (*init)(kl_reader *r, kl_err *err);
    void (*fini)(kl_reader *r);          /* after init succeeded; no op may be in flight */
    /* Hands s->op_* to the kernel (possibly deferred until flush).  0 or KL_E_*. */
    int  (*queue)(kl_reader *r, kl_slot *s, kl_err *err);
    int  (*flush)(kl_reader *r, kl_err *err);
    /* Waits for at least one op to finish and calls kl_rd_complete for every finished one. */
    int  (*reap)(kl_reader *r, kl_err *err);
    /* After reap kept failing while ops were in flight: restarts the backend such that no op
     * can touch a slot buffer afterwards; ops not yet finished are dropped without
     * kl_rd_complete.  NULL when the backend cannot promise that (io_uring: closing a ring does
     * not wait for its reads).  0 or KL_E_*; on failure r->be may be NULL. */
    int  (*reset)(kl_reader *r, kl_err *err);
} kl_backend_ops;

extern const kl_backend_ops kl_rd_uring_ops;
extern const kl_backend_ops kl_rd_aio_ops;
extern const kl_backend_ops kl_rd_pread_ops;

struct kl_reader {
    kl_reader_opts        opts;       /* resolved: no zero fields */
    kl_reader_sys         sys;        /* copy of the table at create time, all fields set */
    const kl_backend_ops *ops;        /* backend in use */
    void                 *be;         /* backend state, owned by ops */
    size_t                cap;        /* bytes per slot buffer: buf_bytes + 2 * KL_RD_MAX_ALIGN */
    kl_slot              *slots;      /* [queue_depth] */
    kl_rfile             *files;      /* [n_files] */
    uint32_t              n_files;
    size_t                files_cap;
    kl_reader_stats       stats;
    /* run state */
    unsigned              inflight;   /* ops handed to the backend and not completed */
    int                   draining;   /* after an error: completions only retire ops */
    int                   any_failed; /* a slot failed: plan no more chunks */
    int                   run_rc;     /* first error of the current run */
    kl_err               *run_err;    /* caller's err for the current run (may be NULL) */
    int                   running;    /* inside kl_reader_run: files may not be closed */
    int                   broken;     /* ops lost in a failed ring: every call fails */
};

/* Called by a backend for every finished op, with the byte count or -errno.  Decrements
 * inflight, then resubmits the rest of a short read, retries EINTR/EAGAIN, or marks the slot
 * done or failed (the error is kept in the slot until delivery reaches it). */
void kl_rd_complete(kl_reader *r, kl_slot *s, ssize_t res);

/* Every extent names an open file of r, does not overflow and ends inside the file's size:
 * 0, or KL_E_USAGE / KL_E_IO naming the extent's index. */
int kl_rd_check_extents(const kl_reader *r, const kl_extent *ext, size_t n_ext, kl_err *err);

#endif
