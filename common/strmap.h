/*
 * common/strmap.h — string -> uint32 hash map (open addressing, FNV-1a).
 *
 * Keys are borrowed: the map stores the caller's pointers, which must stay valid and unchanged
 * until kl_strmap_free.  Used for tensor tables (20k+ names) and duplicate detection.
 * Not thread-safe for writers; concurrent readers are fine.
 */
#ifndef KL_COMMON_STRMAP_H
#define KL_COMMON_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kl_strmap {
    const char **keys;   /* [cap] borrowed key pointers, NULL = empty slot */
    uint32_t    *vals;   /* [cap] */
    size_t       cap;    /* power of two */
    size_t       count;
} kl_strmap;

/* Zeroes the map and reserves room for `expected` keys.  0 or KL_E_NOMEM. */
int  kl_strmap_init(kl_strmap *m, size_t expected);
void kl_strmap_free(kl_strmap *m);

/* Inserts key -> val.  Returns 0 if inserted, 1 if the key was already present (the stored
 * value is left unchanged and written to *existing if non-NULL), KL_E_NOMEM on failure. */
int kl_strmap_put(kl_strmap *m, const char *key, uint32_t val, uint32_t *existing);

/* Looks key up: 1 and *val set if found, 0 if absent. */
int kl_strmap_get(const kl_strmap *m, const char *key, uint32_t *val);

#endif
