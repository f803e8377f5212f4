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
#include "common/pool.h"

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

/* ---- the source digest ----------------------------------------------------------------------
 *
 * The journal's identity of the source bytes a shard was made from: it must catch a replaced
 * or edited source, not an attacker, so it is XXH3-128 (common/fasthash.h), cheap enough to
 * hash every source byte where the reader put it (no copy) while conversion from memory stays
 * disk-bound.  Every piece (one source extent) is cut into leaves of KL_SRCDIGEST_LEAF bytes
 * (the last one shorter, an empty piece has none); with H = XXH3-128 (canonical bytes) and
 * le64 a little-endian 64-bit size:
 *     piece digest = H( H(leaf 0) || H(leaf 1) || ... )
 *     digest       = H( le64(size 0) || piece digest 0 || le64(size 1) || piece digest 1 ... )
 * It depends on the bytes and the piece sizes alone: not on how they arrive, nor on how many
 * threads hash the leaves.  Each piece's bytes must arrive in order; pieces may interleave
 * across calls but calls must not overlap.  Errors: KL_E_BUG (bytes out of order, a piece
 * incomplete at final), KL_E_NOMEM. */

#define KL_SRCDIGEST_LEAF ((uint64_t)256 << 10)
#define KL_SRCDIGEST_BYTES 16

typedef struct kl_srcdigest kl_srcdigest;

/* pool (NULL: hash in the caller) hashes whole leaves in parallel; it must be idle during
 * kl_srcdigest_update. */
int  kl_srcdigest_create(kl_srcdigest **out, const uint64_t *piece_bytes, size_t n,
                         kl_pool *pool, kl_err *err);
void kl_srcdigest_destroy(kl_srcdigest *d); /* NULL ok */
/* n bytes of piece p at byte `off`: the piece's bytes before off came in earlier calls. */
int  kl_srcdigest_update(kl_srcdigest *d, size_t p, uint64_t off, const void *data, size_t n,
                         kl_err *err);
/* kl_srcdigest_update in steps, for a caller that hashes the whole leaves in a pool run of its
 * own, together with other work (one wake-up of the pool per chunk, not two):
 * kl_srcdigest_begin takes update's arguments, hashes the ragged head (the rest of a leaf begun
 * in an earlier call) and sets *leaves to the number of whole leaves in the bytes; then
 * kl_srcdigest_leaf(d, i) must run once for every i in [0, *leaves), in any order and on any
 * threads (it is a kl_pool_run item function; ctx is d), or kl_srcdigest_leaves runs them all
 * (on the pool given to create, if any, when there are several); kl_srcdigest_end adds their
 * digests in order and hashes the ragged tail.  The bytes must stay in place until then; no
 * other call on d in between.  The digest is the same as kl_srcdigest_update's. */
int  kl_srcdigest_begin(kl_srcdigest *d, size_t p, uint64_t off, const void *data, size_t n,
                        size_t *leaves, kl_err *err);
void kl_srcdigest_leaf(void *d, size_t i);
void kl_srcdigest_leaves(kl_srcdigest *d);
void kl_srcdigest_end(kl_srcdigest *d); /* no-op after a failed begin */
int  kl_srcdigest_final(kl_srcdigest *d, unsigned char out[KL_SRCDIGEST_BYTES], kl_err *err);

#endif
