/*
 * common/strmap.h — string -> uint32 hash map (open addressing, linear probing).
 *
 * Keys are borrowed: the map stores the caller's pointers, which must stay valid and unchanged
 * until kl_strmap_free.  Used for tensor tables (40k+ names) and duplicate detection.  Each slot
 * keeps its key's pointer, value and hash together, so a lookup touches one slot and the key
 * text of a slot whose hash matches.  kl_strmap_hash gives a name's hash once, for callers that
 * look the same name up in several maps (the *_h forms take it).
 * Not thread-safe for writers; concurrent readers are fine.
 */
#ifndef KL_COMMON_STRMAP_H
#define KL_COMMON_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kl_strmap_slot {
    const char *key;     /* borrowed, NULL = empty slot */
    uint32_t    val;
    uint32_t    hash;    /* low 32 bits of the key's hash */
} kl_strmap_slot;

typedef struct kl_strmap {
    kl_strmap_slot *slots; /* [cap] */
    size_t          cap;   /* power of two */
    size_t          count;
} kl_strmap;

/* Zeroes the map and reserves room for `expected` keys.  0 or KL_E_NOMEM. */
int  kl_strmap_init(kl_strmap *m, size_t expected);
void kl_strmap_free(kl_strmap *m);

/* Inserts key -> val.  Returns 0 if inserted, 1 if the key was already present (the stored
 * value is left unchanged and written to *existing if non-NULL), KL_E_NOMEM on failure. */
int kl_strmap_put(kl_strmap *m, const char *key, uint32_t val, uint32_t *existing);

/* Looks key up: 1 and *val set if found, 0 if absent. */
int kl_strmap_get(const kl_strmap *m, const char *key, uint32_t *val);

/* The hash the map uses for key (not stable across builds: never store it). */
uint64_t kl_strmap_hash(const char *key);
/* kl_strmap_put and kl_strmap_get for a key whose kl_strmap_hash is hash. */
int kl_strmap_put_h(kl_strmap *m, const char *key, uint64_t hash, uint32_t val,
                    uint32_t *existing);
int kl_strmap_get_h(const kl_strmap *m, const char *key, uint64_t hash, uint32_t *val);

#endif
