/*
 * loader/hashpass.h — SHA-256 of many whole files, in parallel across files.
 *
 * SHA-256 is sequential within a file (~1.3 GB/s per core with SHA-NI), so the speed of a
 * hash pass comes from hashing several files at once: `threads` workers, each with its own
 * kl_reader, take the next file (largest first, so the long ones do not end up last) and
 * stream it through kl_reader_stream_file.  Used by `kl read --hash` and `kl audit --hash`.
 *
 * Contract: every entry of files gets size_bytes, sha256 (valid when rc == 0), rc and err,
 * whatever happens to the other files.  kl_hashpass_run returns 0 when every file was hashed;
 * otherwise the rc of the first failed file in array order, with its whole kl_err (file,
 * tensor, offset, rule, message) copied to err unless err already holds an error.
 * A reader that cannot be created (forced backend unavailable, bad options) fails the whole
 * call before any file is read: then the per-file fields are left unset.
 * Memory: threads * queue_depth * (buf_bytes + 8 KiB).  Descriptors: each worker closes a file
 * once hashed, so at most two per worker (file, io_uring ring) are open, whatever n_files is;
 * the thread count is also capped at a quarter of RLIMIT_NOFILE.
 * Thread safety: the call itself may run from any thread; progress is called from workers.
 */
#ifndef KL_LOADER_HASHPASS_H
#define KL_LOADER_HASHPASS_H

#include "common/err.h"
#include "loader/reader.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_hashpass_file {
    const char   *path;          /* in: borrowed for the duration of the call */
    uint64_t      size_bytes;    /* out: bytes hashed (file size when opened) */
    unsigned char sha256[32];    /* out: digest, valid when rc == 0 */
    int           rc;            /* out: 0 or a KL_E_* code */
    kl_err        err;           /* out: details when rc != 0 (file and offset set) */
} kl_hashpass_file;

/* Called from worker threads (serialised by the pass, never concurrently) with the total
 * bytes hashed so far over all files. */
typedef void (*kl_hashpass_progress)(void *ctx, uint64_t bytes_done);

typedef struct kl_hashpass_opts {
    unsigned             threads;      /* 0: usable CPUs; always <= n_files, RLIMIT_NOFILE / 4 */
    kl_reader_opts       reader;       /* per worker; zero queue_depth/buf_bytes take 4 x 8 MiB */
    kl_hashpass_progress progress;     /* may be NULL */
    void                *progress_ctx;
} kl_hashpass_opts;

typedef struct kl_hashpass_stats {
    kl_io_backend backend;             /* backend of the workers' readers */
    int           direct;              /* 1 if every file was read with O_DIRECT */
    unsigned      threads;             /* workers used */
    uint64_t      bytes;               /* bytes hashed over all files */
    uint64_t      short_reads;         /* summed over the readers */
    double        elapsed_s;           /* wall time of the pass, readers' set-up included */
} kl_hashpass_stats;

/* Hashes files[0..n_files); opts and st may be NULL.  See the contract above. */
int kl_hashpass_run(kl_hashpass_file *files, size_t n_files, const kl_hashpass_opts *opts,
                    kl_hashpass_stats *st, kl_err *err);

/* Writes the 64 lowercase hex digits of sha256 and a NUL into hex. */
void kl_sha256_hex(const unsigned char sha256[32], char hex[65]);

#endif
