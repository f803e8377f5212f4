/* common/fasthash.c — XXH3-128, header-only xxHash (see fasthash.h). */
#include "common/fasthash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/mem.h"

#include <stdio.h>

struct kl_fasthash {
    XXH3_state_t *st;
};

static void canonical(XXH128_hash_t h, unsigned char out[KL_FASTHASH_BYTES])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    for (int i = 0; i < KL_FASTHASH_BYTES; i++)
        out[i] = c.digest[i];
}

void kl_fasthash_buf(const void *data, size_t n, unsigned char out[KL_FASTHASH_BYTES])
{
    canonical(XXH3_128bits(data, n), out);
}

int kl_fasthash_create(kl_fasthash **out, kl_err *err)
{
    *out = NULL;
    XXH3_state_t *st = XXH3_createState();
    kl_fasthash *h = st ? kl_calloc(1, sizeof *h) : NULL;
    if (!h) {
        XXH3_freeState(st);
        return kl_fail(err, KL_E_NOMEM, "out of memory for a hash state");
    }
    h->st = st;
    XXH3_128bits_reset(st);
    *out = h;
    return 0;
}

void kl_fasthash_reset(kl_fasthash *h)
{
    XXH3_128bits_reset(h->st);
}

void kl_fasthash_update(kl_fasthash *h, const void *data, size_t n)
{
    XXH3_128bits_update(h->st, data, n);
}

void kl_fasthash_final(const kl_fasthash *h, unsigned char out[KL_FASTHASH_BYTES])
{
    canonical(XXH3_128bits_digest(h->st), out);
}

void kl_fasthash_destroy(kl_fasthash *h)
{
    if (!h)
        return;
    XXH3_freeState(h->st);
    kl_free(h);
}

void kl_fasthash_hex(const unsigned char d[KL_FASTHASH_BYTES], char out[2 * KL_FASTHASH_BYTES + 1])
{
    for (int i = 0; i < KL_FASTHASH_BYTES; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}
