/*
 * loader/reader.c — the staged reader (see reader.h): files, the ring of slots, chunk planning,
 * completion handling and in-order delivery.  The backends (reader_uring.c, reader_aio.c,
 * reader_pread.c) only move ops into the kernel; everything that interprets a result lives here
 * so the three behave identically.
 *
 * Divisions, in order: includes; syscall table; helpers; create/destroy; files; completion
 * handling; the run loop; whole-file streaming with SHA-256; stats and names.
 */

/* ---- includes ------------------------------------------------------------------------------ */

#include "loader/reader_int.h"

#include "common/checked.h"
#include "common/log.h"
#include "common/grow.h"
#include "common/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libaio.h>
#include <liburing.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- syscall table ------------------------------------------------------------------------- */

static int real_open(const char *path, int flags) { return open(path, flags); }
static int real_close(int fd) { return close(fd); }
static int real_fstat(int fd, struct stat *st) { return fstat(fd, st); }

static int real_dio_align(int fd, uint32_t *mem_align, uint32_t *off_align)
{
#ifdef STATX_DIOALIGN
    struct statx stx;
    memset(&stx, 0, sizeof stx);
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) != 0)
        return 0;
    if (!(stx.stx_mask & STATX_DIOALIGN))
        return 0;
    /* The kernel reports 0/0 when the file supports no direct I/O at all. */
    if (!stx.stx_dio_mem_align || !stx.stx_dio_offset_align)
        return -1;
    *mem_align = stx.stx_dio_mem_align;
    *off_align = stx.stx_dio_offset_align;
    return 1;
#else
    (void)fd, (void)mem_align, (void)off_align;
    return 0;
#endif
}

static ssize_t real_pread(int fd, void *buf, size_t n, off_t off) { return pread(fd, buf, n, off); }

static int real_uring_init(unsigned entries, struct io_uring *ring, unsigned flags)
{
    return io_uring_queue_init(entries, ring, flags);
}

static int real_aio_setup(int nr_events, struct io_context **ctx)
{
    return io_setup(nr_events, ctx);
}

static int real_uring_wait(struct io_uring *ring, unsigned wait_nr)
{
    return io_uring_submit_and_wait(ring, wait_nr);
}

static int real_aio_getevents(struct io_context *ctx, long min_nr, long nr, struct io_event *ev)
{
    return io_getevents(ctx, min_nr, nr, ev, NULL);
}

static kl_reader_sys sys_override;  /* test hook; zero = all real */

void kl_reader_set_sys(const kl_reader_sys *sys)
{
    if (sys)
        sys_override = *sys;
    else
        memset(&sys_override, 0, sizeof sys_override);
}

static void resolve_sys(kl_reader_sys *s)
{
    *s = sys_override;
    if (!s->open)
        s->open = real_open;
    if (!s->close)
        s->close = real_close;
    if (!s->fstat)
        s->fstat = real_fstat;
    if (!s->dio_align)
        s->dio_align = real_dio_align;
    if (!s->pread)
        s->pread = real_pread;
    if (!s->uring_init)
        s->uring_init = real_uring_init;
    if (!s->aio_setup)
        s->aio_setup = real_aio_setup;
    if (!s->uring_wait)
        s->uring_wait = real_uring_wait;
    if (!s->aio_getevents)
        s->aio_getevents = real_aio_getevents;
}

/* ---- helpers ------------------------------------------------------------------------------- */

#define DEFAULT_BUF_BYTES ((size_t)8 << 20)
#define DEFAULT_QD 16u
#define MAX_THREADS 1024u
/* Consecutive failed reaps while draining before the backend is restarted. */
#define DRAIN_ATTEMPTS 3u

static uint64_t round_down(uint64_t v, uint64_t a) { return v / a * a; }

static int is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

/* Validates opts and fills the defaults; 0 or KL_E_USAGE. */
static int resolve_opts(kl_reader_opts *o, kl_err *err)
{
    if ((unsigned)o->backend > KL_IO_PREAD)
        return kl_fail(err, KL_E_USAGE, "unknown I/O backend %d", (int)o->backend);
    if ((unsigned)o->direct > KL_DIRECT_OFF)
        return kl_fail(err, KL_E_USAGE, "unknown direct-I/O mode %d", (int)o->direct);
    if (o->buf_bytes > KL_RD_MAX_BUF)
        return kl_fail(err, KL_E_USAGE, "chunk size %zu is above the maximum %zu", o->buf_bytes,
                       KL_RD_MAX_BUF);
    if (o->queue_depth > KL_RD_MAX_QD)
        return kl_fail(err, KL_E_USAGE, "queue depth %u is above the maximum %u", o->queue_depth,
                       KL_RD_MAX_QD);
    if (o->threads > MAX_THREADS)
        return kl_fail(err, KL_E_USAGE, "%u reader threads is above the maximum %u", o->threads,
                       MAX_THREADS);
    if (!o->buf_bytes)
        o->buf_bytes = DEFAULT_BUF_BYTES;
    o->buf_bytes = (size_t)kl_round_up_u64(o->buf_bytes, KL_RD_MAX_ALIGN);
    if (!o->queue_depth)
        o->queue_depth = DEFAULT_QD;
    if (!o->threads)
        o->threads = o->queue_depth < MAX_THREADS ? o->queue_depth : MAX_THREADS;
    return 0;
}

/* ---- create / destroy ---------------------------------------------------------------------- */

static void free_slots(kl_reader *r)
{
    if (!r->slots)
        return;
    for (unsigned i = 0; i < r->opts.queue_depth; i++)
        kl_aligned_free(r->slots[i].buf);
    kl_free(r->slots);
    r->slots = NULL;
}

static int alloc_slots(kl_reader *r, kl_err *err)
{
    unsigned qd = r->opts.queue_depth;
    r->cap = r->opts.buf_bytes + 2 * (size_t)KL_RD_MAX_ALIGN;
    r->slots = kl_calloc(qd, sizeof *r->slots);
    if (!r->slots)
        return kl_fail(err, KL_E_NOMEM, "out of memory for %u reader slots", qd);
    for (unsigned i = 0; i < qd; i++) {
        r->slots[i].idx = i;
        r->slots[i].buf = kl_aligned_alloc(KL_RD_MAX_ALIGN, r->cap);
        if (!r->slots[i].buf)
            return kl_fail(err, KL_E_NOMEM, "out of memory for %u reader buffers of %zu bytes",
                           qd, r->cap);
        /* Fault the pages in now: otherwise the first pass over the ring pays one page fault
         * per 4 KiB inside the reads (about 10% of a page-cache read of a few GB). */
        memset(r->slots[i].buf, 0, r->cap);
    }
    return 0;
}

/* Starts the forced backend, or the first one that works in AUTO mode.  Buffered AUTO prefers
 * pread threads: page-cache copies then run on many cores, while io_uring and libaio would
 * perform buffered reads inline in the submitting thread. */
static int start_backend(kl_reader *r, kl_err *err)
{
    static const kl_backend_ops *const direct_order[] = {&kl_rd_uring_ops, &kl_rd_aio_ops,
                                                          &kl_rd_pread_ops};
    static const kl_backend_ops *const buffered_order[] = {&kl_rd_pread_ops};
    const kl_backend_ops *forced[1];
    const kl_backend_ops *const *order;
    size_t n;
    switch (r->opts.backend) {
    case KL_IO_URING: forced[0] = &kl_rd_uring_ops; order = forced; n = 1; break;
    case KL_IO_AIO: forced[0] = &kl_rd_aio_ops; order = forced; n = 1; break;
    case KL_IO_PREAD: forced[0] = &kl_rd_pread_ops; order = forced; n = 1; break;
    default:
        if (r->opts.direct == KL_DIRECT_OFF) {
            order = buffered_order;
            n = 1;
        } else {
            order = direct_order;
            n = sizeof direct_order / sizeof direct_order[0];
        }
        break;
    }
    for (size_t i = 0; i < n; i++) {
        kl_err tried;
        kl_err_clear(&tried);
        int rc = order[i]->init(r, n == 1 ? err : &tried);
        if (rc == 0) {
            r->ops = order[i];
            r->stats.backend = order[i]->id;
            return 0;
        }
        if (n == 1 || rc != KL_E_UNSUPPORTED) {
            if (n > 1)
                kl_fail_sys(err, rc, tried.sys_errno, "%s", tried.msg);
            return rc;
        }
        char line[512];
        kl_log(KL_LOG_DEBUG, "reader: %s; trying the next backend",
               kl_err_format(&tried, line, sizeof line));
    }
    return kl_fail(err, KL_E_UNSUPPORTED, "no I/O backend could start");
}

int kl_reader_create(kl_reader **out, const kl_reader_opts *opts, kl_err *err)
{
    kl_reader_opts o;
    if (opts)
        o = *opts;
    else
        memset(&o, 0, sizeof o);
    if (!out)
        return kl_fail(err, KL_E_USAGE, "kl_reader_create: out is NULL");
    int rc = resolve_opts(&o, err);
    if (rc)
        return rc;
    kl_reader *r = kl_calloc(1, sizeof *r);
    if (!r)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the reader");
    r->opts = o;
    resolve_sys(&r->sys);
    rc = alloc_slots(r, err);
    if (!rc)
        rc = start_backend(r, err);
    if (rc) {
        kl_reader_destroy(r);
        return rc;
    }
    *out = r;
    return 0;
}

void kl_reader_destroy(kl_reader *r)
{
    if (!r)
        return;
    if (r->ops)
        r->ops->fini(r);
    for (uint32_t i = 0; i < r->n_files; i++) {
        if (r->files[i].fd >= 0)
            r->sys.close(r->files[i].fd);
        kl_free(r->files[i].path);
    }
    kl_free(r->files);
    free_slots(r);
    kl_free(r);
}

/* ---- files --------------------------------------------------------------------------------- */

/* Fails with the path as context; returns code. */
static int file_fail(kl_err *err, int code, int sys_errno, const char *path, const char *msg)
{
    kl_fail_sys(err, code, sys_errno, "%s", msg);
    kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
    return code;
}

/* The error every call returns once the reader is broken (see reader.h). */
static int broken_fail(const kl_reader *r, kl_err *err)
{
    return kl_fail(err, KL_E_IO,
                   "reader is unusable: %u reads submitted earlier never completed", r->inflight);
}

/* Changes the status flags of fd: sets `set`, clears `clear`.  0 or -1 with errno. */
static int set_fl(int fd, int set, int clear)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    int nfl = (fl | set) & ~clear;
    return nfl == fl ? 0 : fcntl(fd, F_SETFL, nfl);
}

/* Refuses anything but a regular file and makes fd blocking again.  The open used O_NONBLOCK
 * so that a FIFO (no writer) or a terminal cannot block it forever; it must not stay set, as
 * io_uring treats O_NONBLOCK files as no-wait and would fail reads with EAGAIN.  Closes fd on
 * failure. */
static int check_regular(kl_reader *r, int fd, const char *path, struct stat *st, kl_err *err)
{
    int rc = 0;
    if (r->sys.fstat(fd, st) != 0)
        rc = file_fail(err, KL_E_IO, errno, path, "cannot stat");
    else if (!S_ISREG(st->st_mode)) {
        rc = kl_fail_rule(err, KL_E_FORMAT, "FILE-NOT-REGULAR",
                          "not a regular file (a FIFO, device, socket or directory)");
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
    } else if (set_fl(fd, 0, O_NONBLOCK) != 0)
        rc = file_fail(err, KL_E_IO, errno, path, "cannot clear O_NONBLOCK");
    if (rc)
        r->sys.close(fd);
    return rc;
}

/* Opens path as a regular file, with O_DIRECT when the mode asks for it and the file system
 * takes it; fills fd, direct, align (1 for buffered files) and size of f.  open(O_DIRECT)
 * fails with EINVAL both when the file system refuses direct I/O and for FIFOs and devices,
 * so on EINVAL the file is opened again without it to tell the two apart. */
static int open_file(kl_reader *r, const char *path, kl_rfile *f, kl_err *err)
{
    const int base = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    kl_direct_mode mode = r->opts.direct;
    int fd = -1, refused = 0;
    if (mode != KL_DIRECT_OFF) {
        fd = r->sys.open(path, base | O_DIRECT);
        if (fd < 0 && errno != EINVAL)
            return file_fail(err, KL_E_IO, errno, path, "cannot open for reading");
        refused = fd < 0;
    }
    if (fd < 0) {
        fd = r->sys.open(path, base);
        if (fd < 0)
            return file_fail(err, KL_E_IO, errno, path, "cannot open for reading");
    }
    struct stat st;
    int rc = check_regular(r, fd, path, &st, err);
    if (rc)
        return rc;
    f->size = (uint64_t)st.st_size;
    if (refused && mode == KL_DIRECT_ON) {
        r->sys.close(fd);
        return file_fail(err, KL_E_UNSUPPORTED, EINVAL, path, "the file system refuses O_DIRECT");
    }
    f->fd = fd;
    if (mode == KL_DIRECT_OFF || refused)
        return 0;
    uint32_t mem = 0, off = 0;
    int known = r->sys.dio_align(fd, &mem, &off);
    uint32_t a = known > 0 ? (mem > off ? mem : off) : (known == 0 ? KL_RD_MAX_ALIGN : 0);
    if (a && is_pow2(a) && a <= KL_RD_MAX_ALIGN) {
        f->direct = 1;
        f->align = a;
        return 0;
    }
    if (mode == KL_DIRECT_ON) {
        r->sys.close(fd);
        f->fd = -1;
        return file_fail(err, KL_E_UNSUPPORTED, 0, path,
                         known < 0 ? "the file does not support direct I/O"
                                   : "the file's direct-I/O alignment is above 4096 bytes");
    }
    /* AUTO: read this file buffered through the same descriptor. */
    if (set_fl(fd, 0, O_DIRECT) != 0) {
        int e = errno;
        r->sys.close(fd);
        f->fd = -1;
        return file_fail(err, KL_E_IO, e, path, "cannot clear O_DIRECT");
    }
    return 0;
}

int kl_reader_add_file(kl_reader *r, const char *path, kl_err *err)
{
    if (!r || !path)
        return kl_fail(err, KL_E_USAGE, "kl_reader_add_file: reader or path is NULL");
    if (r->broken)
        return broken_fail(r, err);
    if (r->n_files >= (uint32_t)INT32_MAX)
        return file_fail(err, KL_E_USAGE, 0, path, "too many files in one reader");
    if (kl_grow(&r->files, &r->files_cap, (size_t)r->n_files + 1, sizeof *r->files))
        return file_fail(err, KL_E_NOMEM, 0, path, "out of memory for the file table");
    kl_rfile f = {.fd = -1, .align = 1};
    if (!(f.path = kl_strdup(path)))
        return file_fail(err, KL_E_NOMEM, 0, path, "out of memory");
    int rc = open_file(r, path, &f, err);
    if (rc) {
        kl_free(f.path);
        return rc;
    }
    r->files[r->n_files] = f;
    return (int)r->n_files++;
}

uint64_t kl_reader_file_size(const kl_reader *r, uint32_t file)
{
    return r && file < r->n_files ? r->files[file].size : 0;
}

int kl_reader_close_file(kl_reader *r, uint32_t file, kl_err *err)
{
    if (!r || file >= r->n_files)
        return kl_fail(err, KL_E_USAGE, "kl_reader_close_file: no file %" PRIu32, file);
    if (r->running)
        return file_fail(err, KL_E_USAGE, 0, r->files[file].path,
                         "kl_reader_close_file called during a run");
    /* The backends keep no per-file state (no io_uring registered files) and, outside a run,
     * no op is in flight (drain waits for them, or the reader is broken): closing the
     * descriptor is all there is to do.  close() errors are moot for a read-only file. */
    kl_rfile *f = &r->files[file];
    if (f->fd >= 0) {
        r->sys.close(f->fd);
        f->fd = -1;
    }
    return 0;
}

/* ---- completion handling ------------------------------------------------------------------- */

/* Marks the slot failed; the error is reported when delivery reaches the slot. */
static void slot_fail(kl_reader *r, kl_slot *s, int code, int sys_errno, uint64_t off,
                      const char *fmt, ...) KL_PRINTF(6, 7);

static void slot_fail(kl_reader *r, kl_slot *s, int code, int sys_errno, uint64_t off,
                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err_msg, sizeof s->err_msg, fmt, ap);
    va_end(ap);
    s->err_code = code;
    s->err_errno = sys_errno;
    s->err_off = off;
    s->state = KL_SLOT_FAILED;
    r->any_failed = 1;
}

/* Records a failed slot's error as the run's error, with the file and offset as context. */
static void report_slot(kl_reader *r, const kl_slot *s)
{
    if (r->run_rc)
        return;
    r->run_rc = kl_fail_sys(r->run_err, s->err_code, s->err_errno, "%s", s->err_msg);
    kl_err_context(r->run_err, r->files[s->file].path, NULL, s->err_off, NULL);
}

/* Hands the slot's current op (op_* fields) to the backend. */
static void submit_op(kl_reader *r, kl_slot *s)
{
    kl_err qerr;
    kl_err_clear(&qerr);
    r->inflight++;
    r->stats.reads++;
    int rc = r->ops->queue(r, s, &qerr);
    if (rc) {
        r->inflight--;
        slot_fail(r, s, rc, qerr.sys_errno, s->op_off, "%s", qerr.msg);
    }
}

/* Points the op at the bytes still missing, from file offset `from` (aligned for direct). */
static void set_op(kl_reader *r, kl_slot *s, uint64_t from)
{
    s->op_fd = r->files[s->file].fd;
    s->op_off = from;
    s->op_buf = s->buf + (from - s->rd_off);
    s->op_len = (size_t)(s->rd_end - from);
}

void kl_rd_complete(kl_reader *r, kl_slot *s, ssize_t res)
{
    r->inflight--;
    if (r->draining) {
        s->state = KL_SLOT_FREE;
        return;
    }
    const kl_rfile *f = &r->files[s->file];
    if (res < 0) {
        int e = (int)-res;
        if ((e == EINTR || e == EAGAIN) && ++s->retries <= KL_RD_MAX_RETRIES) {
            submit_op(r, s);
            return;
        }
        slot_fail(r, s, KL_E_IO, e, s->op_off, "read of %zu bytes failed", s->op_len);
        return;
    }
    uint64_t have = s->rd_off + s->filled;      /* first byte not yet in the buffer */
    uint64_t got_end = s->op_off + (uint64_t)res;
    if (res == 0 || got_end <= have) {
        /* Nothing new although bytes up to need_end were asked for.  Usually the file ends
         * early; but a direct read restarted at an aligned offset can also come back shorter
         * than the bytes already held: retry that while the file is still long enough. */
        struct stat st;
        int longer = res > 0 && r->sys.fstat(f->fd, &st) == 0 && (uint64_t)st.st_size > have;
        if (longer && ++s->retries <= KL_RD_MAX_RETRIES) {
            r->stats.short_reads++;
            submit_op(r, s);
            return;
        }
        if (longer)
            slot_fail(r, s, KL_E_IO, 0, have, "reads make no progress at this offset");
        else
            slot_fail(r, s, KL_E_IO, 0, have,
                      "unexpected end of file: %" PRIu64 " more bytes needed (size was %" PRIu64
                      " bytes when opened)",
                      s->need_end - have, f->size);
        return;
    }
    s->retries = 0;  /* progress: the retry budget counts consecutive failures only */
    s->filled = got_end - s->rd_off;
    if (got_end >= s->need_end) {
        /* Done, also when an O_DIRECT read of the aligned tail stopped short at EOF. */
        s->state = KL_SLOT_DONE;
        return;
    }
    /* Short read: ask again for the rest.  Direct reads restart at an aligned offset, which may
     * re-read a few bytes already present. */
    r->stats.short_reads++;
    set_op(r, s, round_down(got_end, f->align));
    submit_op(r, s);
}

/* ---- the run loop -------------------------------------------------------------------------- */

typedef struct chunk_iter {
    const kl_extent *ext;
    size_t           n_ext;
    size_t           i;       /* current extent */
    uint64_t         off;     /* bytes of extent i already planned */
} chunk_iter;

/* Plans the next chunk into s; 0 when every extent is planned.  Chunk ends fall on absolute
 * multiples of KL_RD_MAX_ALIGN, so only an extent's first and last chunks are unaligned and
 * the enclosing aligned range never exceeds buf_bytes + 2 * align <= cap. */
static int plan_chunk(kl_reader *r, chunk_iter *it, kl_slot *s)
{
    while (it->i < it->n_ext && it->off >= it->ext[it->i].len) {
        it->i++;
        it->off = 0;
    }
    if (it->i == it->n_ext)
        return 0;
    const kl_extent *e = &it->ext[it->i];
    const kl_rfile *f = &r->files[e->file];
    uint64_t pos = e->off + it->off;
    uint64_t end = e->off + e->len;
    uint64_t cend = round_down(pos + r->opts.buf_bytes, KL_RD_MAX_ALIGN);
    if (cend > end)
        cend = end;
    s->state = KL_SLOT_BUSY;
    s->ext_idx = it->i;
    s->ext_off = it->off;
    s->file = e->file;
    s->rd_off = round_down(pos, f->align);
    s->need_end = cend;
    s->rd_end = kl_round_up_u64(cend, f->align);
    s->filled = 0;
    s->retries = 0;
    set_op(r, s, s->rd_off);
    it->off += cend - pos;
    return 1;
}

/* Checks every extent before the first read: file index, overflow, end within the file. */
int kl_rd_check_extents(const kl_reader *r, const kl_extent *ext, size_t n_ext, kl_err *err)
{
    for (size_t i = 0; i < n_ext; i++) {
        const kl_extent *e = &ext[i];
        uint64_t end;
        if (e->file >= r->n_files)
            return kl_fail(err, KL_E_USAGE, "extent %zu names file %" PRIu32 " of %" PRIu32, i,
                           e->file, r->n_files);
        if (r->files[e->file].fd < 0)
            return file_fail(err, KL_E_USAGE, 0, r->files[e->file].path,
                             "an extent names a file closed with kl_reader_close_file");
        if (kl_add_u64(e->off, e->len, &end) || end > (uint64_t)INT64_MAX) {
            kl_fail(err, KL_E_USAGE, "extent %zu [%" PRIu64 " + %" PRIu64 ") overflows", i,
                    e->off, e->len);
            kl_err_context(err, r->files[e->file].path, NULL, e->off, NULL);
            return KL_E_USAGE;
        }
        if (e->len && end > r->files[e->file].size) {
            uint64_t size = r->files[e->file].size;
            kl_fail(err, KL_E_IO,
                    "extent %zu [%" PRIu64 ", %" PRIu64 ") reads past the end of the file (%" PRIu64
                    " bytes)",
                    i, e->off, end, size);
            kl_err_context(err, r->files[e->file].path, NULL, e->off > size ? e->off : size,
                           NULL);
            return KL_E_IO;
        }
    }
    return 0;
}

/* Waits until the slot is done or failed, or the backend itself failed. */
static void wait_slot(kl_reader *r, kl_slot *s)
{
    while (!r->run_rc && s->state == KL_SLOT_BUSY) {
        kl_err rerr;
        kl_err_clear(&rerr);
        int rc = r->ops->reap(r, &rerr);
        if (rc && !r->run_rc) {
            r->run_rc = kl_fail_sys(r->run_err, rc, rerr.sys_errno, "%s", rerr.msg);
            kl_err_context(r->run_err, r->files[s->file].path, NULL, s->op_off, NULL);
        }
    }
}

/* After an error: lets every op in flight finish so no buffer is written behind our back.
 * When the backend cannot report completions any more (its ring failed), it is restarted if
 * it can guarantee that nothing is in flight afterwards (libaio: io_destroy waits; pread:
 * joining the workers waits); otherwise the reader is marked broken. */
static void drain(kl_reader *r)
{
    r->draining = 1;
    unsigned failures = 0;
    while (r->inflight) {
        kl_err rerr;
        kl_err_clear(&rerr);
        if (!r->ops->reap(r, &rerr)) {
            failures = 0;
            continue;
        }
        char line[512];
        kl_log(KL_LOG_WARN, "reader: cannot collect %u reads: %s", r->inflight,
               kl_err_format(&rerr, line, sizeof line));
        if (++failures < DRAIN_ATTEMPTS)
            continue;
        kl_err_clear(&rerr);
        if (r->ops->reset && r->ops->reset(r, &rerr) == 0) {
            r->inflight = 0;
            break;
        }
        kl_log(KL_LOG_ERROR, "reader: %u reads are lost in the kernel; the reader is unusable%s%s",
               r->inflight, rerr.code ? ": " : "",
               rerr.code ? kl_err_format(&rerr, line, sizeof line) : "");
        r->broken = 1;
        break;
    }
    r->draining = 0;
}

int kl_reader_run(kl_reader *r, const kl_extent *ext, size_t n_ext, kl_reader_cb cb, void *ctx,
                  kl_err *err)
{
    if (!r || (n_ext && !ext))
        return kl_fail(err, KL_E_USAGE, "kl_reader_run: reader or extents is NULL");
    if (r->broken)
        return broken_fail(r, err);
    int rc = kl_rd_check_extents(r, ext, n_ext, err);
    if (rc)
        return rc;
    unsigned qd = r->opts.queue_depth;
    for (unsigned i = 0; i < qd; i++)
        r->slots[i].state = KL_SLOT_FREE;
    r->run_rc = 0;
    r->any_failed = 0;
    r->run_err = err;
    r->running = 1;
    chunk_iter it = {.ext = ext, .n_ext = n_ext};
    uint64_t issued = 0, delivered = 0;
    for (;;) {
        /* Keep the ring full: every free slot gets the next chunk. */
        while (!r->run_rc && !r->any_failed && issued - delivered < qd &&
               plan_chunk(r, &it, &r->slots[issued % qd])) {
            submit_op(r, &r->slots[issued % qd]);
            issued++;
        }
        if (!r->run_rc) {
            kl_err ferr;
            kl_err_clear(&ferr);
            int frc = r->ops->flush(r, &ferr);
            if (frc && !r->run_rc)
                r->run_rc = kl_fail_sys(err, frc, ferr.sys_errno, "%s", ferr.msg);
        }
        if (r->run_rc || delivered == issued)
            break;
        /* Deliver the oldest chunk once its read is complete. */
        kl_slot *s = &r->slots[delivered % qd];
        wait_slot(r, s);
        if (s->state == KL_SLOT_FAILED)
            report_slot(r, s);
        if (r->run_rc)
            break;
        uint64_t pos = ext[s->ext_idx].off + s->ext_off;  /* file offset of the payload */
        const uint8_t *data = s->buf + (pos - s->rd_off);
        size_t len = (size_t)(s->need_end - pos);
        s->state = KL_SLOT_FREE;
        delivered++;
        if (cb && cb(ctx, s->ext_idx, s->ext_off, data, len) != 0) {
            r->run_rc = kl_fail(err, KL_E_CANCELLED, "cancelled by the callback at extent %zu",
                                s->ext_idx);
            kl_err_context(err, r->files[s->file].path, NULL, pos, NULL);
            break;
        }
        r->stats.bytes += len;
    }
    rc = r->run_rc;
    if (r->inflight)
        drain(r);
    r->run_rc = 0;
    r->any_failed = 0;
    r->run_err = NULL;
    r->running = 0;
    return rc;
}

/* ---- whole-file streaming with SHA-256 ------------------------------------------------------ */

typedef struct hash_ctx {
    EVP_MD_CTX  *md;      /* NULL when no digest is wanted */
    kl_reader_cb cb;      /* caller's callback, may be NULL */
    void        *ctx;
    kl_err      *err;
    int          failed;  /* EVP_DigestUpdate failed */
} hash_ctx;

static int hash_chunk(void *p, size_t ext_idx, uint64_t ext_off, const uint8_t *data, size_t len)
{
    hash_ctx *h = p;
    if (h->md && EVP_DigestUpdate(h->md, data, len) != 1) {
        h->failed = 1;
        kl_fail(h->err, KL_E_BUG, "OpenSSL SHA-256 update failed");
        return 1;
    }
    return h->cb ? h->cb(h->ctx, ext_idx, ext_off, data, len) : 0;
}

int kl_reader_stream_file(kl_reader *r, uint32_t file, unsigned char sha256[32], kl_reader_cb cb,
                          void *ctx, kl_err *err)
{
    if (!r || file >= r->n_files)
        return kl_fail(err, KL_E_USAGE, "kl_reader_stream_file: no file %" PRIu32, file);
    hash_ctx h = {.cb = cb, .ctx = ctx, .err = err};
    if (sha256) {
        h.md = EVP_MD_CTX_new();
        if (!h.md || EVP_DigestInit_ex(h.md, EVP_sha256(), NULL) != 1) {
            EVP_MD_CTX_free(h.md);
            return kl_fail(err, KL_E_NOMEM, "cannot start an OpenSSL SHA-256 context");
        }
    }
    kl_extent e = {.file = file, .off = 0, .len = r->files[file].size};
    int rc = kl_reader_run(r, &e, 1, hash_chunk, &h, err);
    if (h.failed)
        rc = KL_E_BUG;
    if (!rc && h.md) {
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned n = 0;
        if (EVP_DigestFinal_ex(h.md, md, &n) != 1 || n != 32)
            rc = kl_fail(err, KL_E_BUG, "OpenSSL SHA-256 final failed");
        else
            memcpy(sha256, md, 32);
    }
    EVP_MD_CTX_free(h.md);
    return rc;
}

/* ---- stats and names ----------------------------------------------------------------------- */

void kl_reader_get_stats(const kl_reader *r, kl_reader_stats *st)
{
    if (!st)
        return;
    memset(st, 0, sizeof *st);
    if (!r)
        return;
    *st = r->stats;
    st->direct = r->n_files > 0;
    for (uint32_t i = 0; i < r->n_files; i++)
        st->direct &= r->files[i].direct;
}

const char *kl_io_backend_name(kl_io_backend b)
{
    switch (b) {
    case KL_IO_AUTO: return "auto";
    case KL_IO_URING: return "uring";
    case KL_IO_AIO: return "aio";
    case KL_IO_PREAD: return "pread";
    default: return "unknown";
    }
}

int kl_io_backend_parse(const char *s)
{
    if (!s)
        return -1;
    if (!strcmp(s, "auto"))
        return KL_IO_AUTO;
    if (!strcmp(s, "uring") || !strcmp(s, "io_uring"))
        return KL_IO_URING;
    if (!strcmp(s, "aio") || !strcmp(s, "libaio"))
        return KL_IO_AIO;
    if (!strcmp(s, "pread"))
        return KL_IO_PREAD;
    return -1;
}
