/*
 * convert/shard_digest.h — the digest by which the converter's journal proves a shard
 * complete, computed from the bytes while they are written.
 *
 * A shard file is cut into pieces that lie back to back from offset 0: its header (the first
 * data-offset bytes), then every tensor in file order; every piece is cut further into leaves
 * of KL_SDIGEST_LEAF bytes (the last one shorter; an empty piece is one empty leaf).  The
 * digest is SHA-256 over the SHA-256 of every leaf, in file order:
 *     SHA-256( SHA-256(leaf 0) || SHA-256(leaf 1) || ... )
 * The leaf boundaries follow from the plan alone, so this binds every byte of the file as a
 * SHA-256 of the whole file does.  Unlike that, it can be fed in any order across leaves —
 * each leaf only needs its own bytes in order — so the writer lanes hash a shard while they
 * write it, in parallel, instead of one thread reading it back afterwards (~1.3 GB/s, after
 * the last write).  Leaves of 32 MiB let one large tensor (an embedding of 0.75 GB) spread
 * over all lanes.
 *
 * Thread safety: kl_sdigest_update may run concurrently for different leaves; calls touching
 * one leaf must not overlap.  Errors: KL_E_BUG (bytes out of order, a leaf incomplete at
 * final), KL_E_NOMEM, KL_E_IO (kl_sdigest_file).
 */
#ifndef KL_CONVERT_SHARD_DIGEST_H
#define KL_CONVERT_SHARD_DIGEST_H

#include "common/err.h"

#include <stddef.h>
#include <stdint.h>

#define KL_SDIGEST_LEAF ((uint64_t)32 << 20)

typedef struct kl_sdigest kl_sdigest;

/* piece_bytes[0..n): the pieces' sizes. */
int  kl_sdigest_create(kl_sdigest **out, const uint64_t *piece_bytes, size_t n, kl_err *err);
void kl_sdigest_destroy(kl_sdigest *d); /* NULL ok */

/* n bytes of piece p at byte `off`; every leaf they touch must have seen exactly the bytes
 * before them. */
int  kl_sdigest_update(kl_sdigest *d, size_t p, uint64_t off, const void *data, size_t n,
                       kl_err *err);
/* Every leaf must be complete. */
int  kl_sdigest_final(kl_sdigest *d, unsigned char out[32], kl_err *err);

/* The digest of the file at path with these pieces, read back; KL_E_IO also when the file's
 * size is not the pieces' sum. */
int  kl_sdigest_file(const char *path, const uint64_t *piece_bytes, size_t n,
                     unsigned char out[32], kl_err *err);

#endif
