/*
 * loader/mapped.h — zero-copy reads of files that sit in the page cache.
 *
 * A buffered read(2) copies every byte from the page cache into the caller's buffer
 * (copy_to_user), so from cache it runs at the CPUs' copy rate, not their read rate.  This
 * path maps each file read-only instead, and worker threads make chunks of the mapping
 * resident in parallel with madvise(MADV_POPULATE_READ) — page-table entries only, no copy —
 * while the calling thread hands each chunk to the callback IN ORDER (file order, then
 * offset), as pointers into the mapping, and populates chunks itself whenever the next one is
 * not ready yet.  That is what an uploader wants: the GPU's copy engine
 * (or a hash, or a quantizer) reads the cached pages directly.
 *
 * touch: when set, each worker also reads every byte of its chunk once (kl_mem_sum, the loop of
 * the memory-read ceiling) and folds it into stats.checksum, so the measured rate is that of
 * bytes a CPU actually read — the figure `kl read --mapped` reports against the ceiling.
 * Without it a chunk is only made resident.
 *
 * Files: regular files only (FILE-NOT-REGULAR otherwise, naming the path); each is opened
 * O_RDONLY (never for writing), mapped PROT_READ/MAP_SHARED, and its descriptor closed at once
 * (the mapping keeps the file), so RLIMIT_NOFILE does not limit the number of files (each file
 * is one mapping: vm.max_map_count, 65530 by default, does).  Populating runs at most 256 MiB
 * (at least two chunks per thread) ahead of delivery, and the threads drop the page-table
 * entries of delivered chunks in 64 MiB batches (MADV_DONTNEED: the cached pages stay), so page
 * tables and not-yet-delivered resident bytes stay bounded whatever the consumer's speed.  Empty
 * files deliver nothing.  Mappings carry MADV_HUGEPAGE: pages a read brings in from disk come
 * as 2 MiB folios, and cached 2 MiB folios are mapped with one entry each (populating 24 GB
 * then costs milliseconds instead of ~1.2 core-seconds of 4 KiB entries).
 *
 * Errors: an I/O error while populating (MADV_POPULATE_READ returns EFAULT/EIO: the file
 * shrank or the disk failed) is reported as KL_E_IO with the file and offset, after every
 * chunk before it was delivered; a kernel without MADV_POPULATE_READ (Linux < 5.14) gives
 * KL_E_UNSUPPORTED — pages are never faulted by touching.  A file truncated while it is read is
 * reported as KL_E_IO when the truncation is seen while populating; bytes already populated
 * (at most the look-ahead) lose their pages instead, and reading them — by `touch` or by the
 * consumer, from the pointer it was given — raises SIGBUS, as with any mapping.  Files must
 * not be truncated while they are read (checkpoints are read-only to kl).  KL_E_CANCELLED when
 * the callback returns non-zero; KL_E_NOMEM; KL_E_USAGE for bad options.
 * The data pointer is valid during the callback only.  Thread safety: the callback runs on the
 * calling thread; the call is reentrant (no global state).
 */
#ifndef KL_LOADER_MAPPED_H
#define KL_LOADER_MAPPED_H

#include "common/err.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_mapped_opts {
    unsigned threads;      /* populating threads, the calling one included (it works while
                              the chunk it must deliver next is not ready); 0 = usable CPUs
                              (at most 64) */
    size_t   chunk_bytes;  /* delivery and populate unit; 0 = 2 MiB; rounded to pages */
    int      touch;        /* read every byte once in the workers (see above) */
} kl_mapped_opts;

typedef struct kl_mapped_stats {
    uint64_t bytes;        /* bytes delivered */
    uint64_t chunks;
    uint64_t checksum;     /* with touch: sum of all 64-bit words read; 0 otherwise */
    unsigned threads;
    double   elapsed_s;    /* from the first open to the last unmap */
} kl_mapped_stats;

/* Called once per chunk, in order.  Return 0 to continue, non-zero to cancel. */
typedef int (*kl_mapped_cb)(void *ctx, size_t file_idx, uint64_t off, const uint8_t *data,
                            size_t len);

/* Reads paths[0..n) as described above; cb and stats may be NULL, opts NULL for defaults. */
int kl_mapped_read(const char *const *paths, size_t n, const kl_mapped_opts *opts,
                   kl_mapped_cb cb, void *ctx, kl_mapped_stats *stats, kl_err *err);

#endif
