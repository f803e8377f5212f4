/*
 * common/fasthash.h — a fast non-cryptographic 128-bit hash (XXH3-128 of xxHash 0.8), for
 * identities that must catch accidental change (an edited or replaced file), not an attacker.
 * Use SHA-256 (OpenSSL) where the digest proves what was written.
 *
 * xxHash is used header-only (compiled into fasthash.c alone), so nothing new is linked.
 * kl_fasthash of a buffer equals the streamed kl_fasthash_* of the same bytes, however they
 * are split.  The digest is written big-endian (high 64 bits first), as XXH128's canonical
 * form.  Thread safety: a state is used by one thread at a time.
 */
#ifndef KL_COMMON_FASTHASH_H
#define KL_COMMON_FASTHASH_H

#include "common/err.h"

#include <stddef.h>

#define KL_FASTHASH_BYTES 16

typedef struct kl_fasthash kl_fasthash;

/* One buffer at once. */
void kl_fasthash_buf(const void *data, size_t n, unsigned char out[KL_FASTHASH_BYTES]);

/* Streamed: create (KL_E_NOMEM), update any number of times, final (the state may then be
 * updated no more), destroy (NULL ok). */
int  kl_fasthash_create(kl_fasthash **out, kl_err *err);
void kl_fasthash_reset(kl_fasthash *h); /* as if just created */
void kl_fasthash_update(kl_fasthash *h, const void *data, size_t n);
void kl_fasthash_final(const kl_fasthash *h, unsigned char out[KL_FASTHASH_BYTES]);
void kl_fasthash_destroy(kl_fasthash *h);

/* Lowercase hex of a digest: 2 * KL_FASTHASH_BYTES characters and a NUL. */
void kl_fasthash_hex(const unsigned char d[KL_FASTHASH_BYTES], char out[2 * KL_FASTHASH_BYTES + 1]);

#endif
