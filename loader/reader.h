/*
 * loader/reader.h — the staged reader: many extents in flight, bounded buffers, in-order
 * delivery, optional SHA-256.
 *
 * The caller lists extents (file, offset, length).  The reader splits them into chunks of at
 * most buf_bytes, keeps up to queue_depth chunks in flight in a ring of buffers allocated once
 * (aligned for O_DIRECT), and calls the callback for each chunk IN ORDER (extent order, then
 * offset order) from the calling thread.  The data pointer is borrowed: valid only during the
 * callback; the buffer is reused for the next read afterwards.  Memory use is bounded by
 * queue_depth * (buf_bytes + 2 * alignment), never by the file sizes.
 *
 * Backends: io_uring (O_DIRECT, registered buffers), libaio (O_DIRECT), pread (a pool of
 * threads).  KL_IO_AUTO tries them in that order and falls back when one is unavailable
 * (io_uring refused by seccomp/gVisor, io_setup failing); with KL_DIRECT_OFF it picks pread
 * threads at once (page-cache copies scale with threads).  io_uring reads of buffered files are
 * marked IOSQE_ASYNC so the kernel copies in parallel.  O_DIRECT: KL_DIRECT_AUTO uses it when
 * the file system accepts it and falls back to buffered reads when open(O_DIRECT) fails with
 * EINVAL or the file reports no direct-I/O support; KL_DIRECT_ON then fails with
 * KL_E_UNSUPPORTED.  Unaligned starts and tails are handled by reading the enclosing aligned
 * range and slicing; short reads are resubmitted for the rest; EINTR/EAGAIN are retried (up to
 * 1000 times in a row); a read that returns 0 before the requested end is an error (the file
 * is shorter than the extent).  An extent past the size a file had when it was added fails
 * before any read.  After a read error, every chunk before the failing one has been delivered.
 *
 * Hashing: kl_reader_stream_file streams a whole file and returns its SHA-256 (OpenSSL EVP),
 * computed from the same bytes that were read.
 *
 * Files: only regular files are read.  Each path is opened with O_NONBLOCK so that a FIFO or a
 * terminal cannot block the open, then anything else (FIFO, device, socket, directory) is
 * refused with KL_E_FORMAT, rule "FILE-NOT-REGULAR", naming the path; O_NONBLOCK is cleared
 * again before any read.  Every added file holds one descriptor until kl_reader_close_file or
 * kl_reader_destroy: a caller going through more files than RLIMIT_NOFILE allows closes each
 * one when done with it.
 *
 * Errors and reuse: after any error of kl_reader_run (I/O error, bad extent, cancel) the
 * reader can be used again: the run waits for every read it submitted before returning.  The
 * one exception is a ring that stops reporting completions (io_uring_enter or io_getevents
 * failing with an unexpected errno several times in a row): libaio and pread backends are then
 * restarted (that waits for their reads), but an io_uring ring cannot be, and the reader
 * becomes broken: kl_reader_run, kl_reader_stream_file and kl_reader_add_file fail with
 * KL_E_IO "reader is unusable"; kl_reader_close_file, the getters and kl_reader_destroy work.
 *
 * Thread safety: one kl_reader per thread.  Errors: KL_E_IO (with the file and offset),
 * KL_E_FORMAT (not a regular file), KL_E_USAGE (bad extent, closed file), KL_E_CANCELLED
 * (callback returned non-zero), KL_E_NOMEM, KL_E_UNSUPPORTED (O_DIRECT refused with
 * KL_DIRECT_ON, backend unavailable).
 */
#ifndef KL_LOADER_READER_H
#define KL_LOADER_READER_H

#include "common/err.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kl_io_backend {
    KL_IO_AUTO = 0,
    KL_IO_URING,
    KL_IO_AIO,
    KL_IO_PREAD,
} kl_io_backend;

typedef enum kl_direct_mode {
    KL_DIRECT_AUTO = 0,  /* O_DIRECT where the file system accepts it */
    KL_DIRECT_ON,        /* O_DIRECT or fail */
    KL_DIRECT_OFF,       /* buffered (page cache) */
} kl_direct_mode;

typedef struct kl_reader_opts {
    kl_io_backend  backend;       /* default AUTO */
    kl_direct_mode direct;        /* default AUTO */
    size_t         buf_bytes;     /* chunk size, default 8 MiB (rounded to the alignment) */
    unsigned       queue_depth;   /* chunks in flight, default 16 */
    unsigned       threads;       /* pread backend worker threads, default queue_depth */
} kl_reader_opts;

typedef struct kl_extent {
    uint32_t file;                /* index returned by kl_reader_add_file */
    uint64_t off;                 /* byte offset in the file */
    uint64_t len;                 /* bytes; 0 is allowed (no callback) */
} kl_extent;

/* Called once per chunk, in order.  ext_idx: index into the extents array; ext_off: offset of
 * data within that extent.  Return 0 to continue, non-zero to cancel the run. */
typedef int (*kl_reader_cb)(void *ctx, size_t ext_idx, uint64_t ext_off, const uint8_t *data,
                            size_t len);

typedef struct kl_reader kl_reader;

typedef struct kl_reader_stats {
    kl_io_backend backend;        /* backend actually used */
    int           direct;         /* 1 if O_DIRECT was used for every file */
    uint64_t      bytes;          /* payload bytes delivered */
    uint64_t      reads;          /* read operations submitted (including resubmits) */
    uint64_t      short_reads;    /* reads that returned less than asked and were resubmitted */
} kl_reader_stats;

/* Creates a reader; opts may be NULL for defaults.  Falls back between backends as described
 * above (unless a backend is forced, then KL_E_UNSUPPORTED if it cannot start). */
int kl_reader_create(kl_reader **out, const kl_reader_opts *opts, kl_err *err);
void kl_reader_destroy(kl_reader *r);  /* NULL ok; closes files */

/* Opens path read-only (never for writing) and returns its index (>= 0) or a KL_E_* code.
 * Indices count up from 0 in the order of successful adds and are never reused, also not
 * after kl_reader_close_file. */
int kl_reader_add_file(kl_reader *r, const char *path, kl_err *err);
/* Size in bytes when the file was added (also after it was closed); 0 for an unknown index. */
uint64_t kl_reader_file_size(const kl_reader *r, uint32_t file);

/* Closes the file's descriptor.  The index stays taken: a later add gets a new index, and an
 * extent naming a closed file fails the run with KL_E_USAGE.  Closing a closed file is a
 * no-op.  Returns 0, or KL_E_USAGE for an unknown index or when called from a callback
 * during kl_reader_run (reads of the file may be in flight). */
int kl_reader_close_file(kl_reader *r, uint32_t file, kl_err *err);

/* Reads every extent, calling cb (may be NULL) for each chunk in order.  Returns 0 or a
 * KL_E_* code; after an error the reader can be used again (see "Errors and reuse"). */
int kl_reader_run(kl_reader *r, const kl_extent *ext, size_t n_ext, kl_reader_cb cb, void *ctx,
                  kl_err *err);

/* Streams a whole file (added with kl_reader_add_file); if sha256 is non-NULL fills it with the
 * file's SHA-256.  cb may be NULL. */
int kl_reader_stream_file(kl_reader *r, uint32_t file, unsigned char sha256[32], kl_reader_cb cb,
                          void *ctx, kl_err *err);

/* Reads many extents that are each small and scattered (the tensors of a checkpoint) as few
 * long reads: sorts them by (file, offset), merges neighbours separated by at most max_gap
 * bytes into one extent (the gap bytes are read and skipped), and hands every chunk back per
 * original extent: cb(ctx, ext_idx, ext_off, data, len) with ext_idx an index into ext.
 * Each extent's bytes arrive in order and it is complete before the next one starts; extents
 * come in file order (the order of kl_reader_add_file, then offset), not in the order given.
 * Empty extents get no callback.  Overlapping extents: KL_E_USAGE.  Otherwise as
 * kl_reader_run (which it calls once). */
/* max_gap for the tensors of a checkpoint: reading through a gap this small costs less than
 * starting another read. */
#define KL_GATHER_GAP ((uint64_t)256 << 10)
int kl_reader_run_gathered(kl_reader *r, const kl_extent *ext, size_t n_ext, uint64_t max_gap,
                           kl_reader_cb cb, void *ctx, kl_err *err);

/* Chooses how to stream whole checkpoint files (paths[0..n)) into o: left as given (O_DIRECT
 * where allowed) unless the files are already at least 90% in the page cache — re-reading
 * them from the disk would be slower than copying them from memory — or the first one refuses
 * O_DIRECT (tmpfs); then buffered reads on one pread thread per CPU, as page-cache copies
 * scale with threads.  Returns 1 when it chose buffered reads.  Best effort: a file it cannot
 * inspect counts as not cached (kl_reader_add_file reports the real error later). */
int kl_reader_opts_for_files(kl_reader_opts *o, const char *const *paths, size_t n);
/* Fills the zero fields of o for streaming whole files one after another (kl read): buffered
 * reads get one pread thread per CPU (at most 64) and two 2 MiB chunks per thread (at least
 * 4), as a ring that stays in the CPU caches is copied into faster; other reads a deep queue
 * of 32 chunks.  threads (nonzero) replaces the thread count first. */
void kl_reader_opts_for_streaming(kl_reader_opts *o, unsigned threads);
/* Files to keep open at once when streaming many: at most 64 and a quarter of RLIMIT_NOFILE,
 * so a checkpoint with more shards than descriptors can still be read. */
size_t kl_reader_max_open_files(void);

void kl_reader_get_stats(const kl_reader *r, kl_reader_stats *st);
const char *kl_io_backend_name(kl_io_backend b);
/* "uring"|"aio"|"pread"|"auto" -> backend; -1 if unknown. */
int kl_io_backend_parse(const char *s);

#endif
