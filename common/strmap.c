/* common/strmap.c — open-addressing string map (see strmap.h). */
#include "common/strmap.h"

#include "common/err.h"
#include "common/mem.h"

#include <string.h>

/* Mixes 64 bits so every input bit reaches the low bits the mask keeps (names that differ only
 * in a layer or expert number must not probe long runs). */
static uint64_t mix64(uint64_t h)
{
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    return h ^ (h >> 32);
}

uint64_t kl_strmap_hash(const char *key)
{
    size_t n = strlen(key), i = 0;
    uint64_t h = 0x9E3779B97F4A7C15ull, w;
    /* eight bytes a step (tensor names are 30-60 bytes), then the 0-7 left, then the length;
     * each step a bijection of h, so keys that differ in one word differ after it */
    for (;; i += 8) {
        size_t k = n - i < 8 ? n - i : 8;
        w = 0;
        memcpy(&w, key + i, k);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        if (k < 8)
            break;
    }
    return mix64(h ^ ((uint64_t)n * 0x94D049BB133111EBull));
}

static int alloc_slots(kl_strmap *m, size_t cap)
{
    m->slots = kl_calloc(cap, sizeof *m->slots);
    if (!m->slots)
        return KL_E_NOMEM;
    m->cap = cap;
    return 0;
}

int kl_strmap_init(kl_strmap *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < expected * 2 && cap < ((size_t)1 << 40))
        cap <<= 1;
    return alloc_slots(m, cap);
}

void kl_strmap_free(kl_strmap *m)
{
    if (!m)
        return;
    kl_free(m->slots);
    memset(m, 0, sizeof *m);
}

/* The slot holding key, or the empty slot where it would go. */
static size_t find_slot(const kl_strmap *m, const char *key, uint64_t hash)
{
    size_t mask = m->cap - 1;
    size_t i = (size_t)hash & mask;
    uint32_t h32 = (uint32_t)hash;
    for (;; i = (i + 1) & mask) {
        const kl_strmap_slot *s = &m->slots[i];
        if (!s->key || (s->hash == h32 && strcmp(s->key, key) == 0))
            return i;
    }
}

static int grow(kl_strmap *m)
{
    kl_strmap bigger;
    memset(&bigger, 0, sizeof bigger);
    if (alloc_slots(&bigger, m->cap * 2))
        return KL_E_NOMEM;
    size_t mask = bigger.cap - 1;
    for (size_t i = 0; i < m->cap; i++) {
        const kl_strmap_slot *s = &m->slots[i];
        if (!s->key)
            continue;
        /* the low 32 bits place it: caps above 2^32 slots would need the key's full hash */
        size_t j = bigger.cap > ((size_t)1 << 32) ? (size_t)kl_strmap_hash(s->key) & mask
                                                  : s->hash & mask;
        while (bigger.slots[j].key)
            j = (j + 1) & mask;
        bigger.slots[j] = *s;
    }
    bigger.count = m->count;
    kl_strmap_free(m);
    *m = bigger;
    return 0;
}

int kl_strmap_put_h(kl_strmap *m, const char *key, uint64_t hash, uint32_t val,
                    uint32_t *existing)
{
    if (!m->cap && alloc_slots(m, 16))
        return KL_E_NOMEM;
    if ((m->count + 1) * 2 > m->cap && grow(m))
        return KL_E_NOMEM;
    kl_strmap_slot *s = &m->slots[find_slot(m, key, hash)];
    if (s->key) {
        if (existing)
            *existing = s->val;
        return 1;
    }
    *s = (kl_strmap_slot){key, val, (uint32_t)hash};
    m->count++;
    return 0;
}

int kl_strmap_put(kl_strmap *m, const char *key, uint32_t val, uint32_t *existing)
{
    return kl_strmap_put_h(m, key, kl_strmap_hash(key), val, existing);
}

int kl_strmap_get_h(const kl_strmap *m, const char *key, uint64_t hash, uint32_t *val)
{
    if (!m->cap)
        return 0;
    const kl_strmap_slot *s = &m->slots[find_slot(m, key, hash)];
    if (!s->key)
        return 0;
    if (val)
        *val = s->val;
    return 1;
}

int kl_strmap_get(const kl_strmap *m, const char *key, uint32_t *val)
{
    return kl_strmap_get_h(m, key, kl_strmap_hash(key), val);
}
