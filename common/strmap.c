/* common/strmap.c — open-addressing string map (see strmap.h). */
#include "common/strmap.h"

#include "common/err.h"
#include "common/mem.h"

#include <string.h>

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    /* FNV-1a's multiply carries only upward: mix the high bits into the low ones the mask
     * keeps (names that differ in a layer or expert number otherwise probe long runs) */
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    return h ^ (h >> 32);
}

static int alloc_slots(kl_strmap *m, size_t cap)
{
    m->keys = kl_calloc(cap, sizeof *m->keys);
    m->vals = kl_calloc(cap, sizeof *m->vals);
    if (!m->keys || !m->vals) {
        kl_free(m->keys);
        kl_free(m->vals);
        m->keys = NULL;
        m->vals = NULL;
        return KL_E_NOMEM;
    }
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
    kl_free(m->keys);
    kl_free(m->vals);
    memset(m, 0, sizeof *m);
}

static size_t find_slot(const kl_strmap *m, const char *key)
{
    size_t mask = m->cap - 1;
    size_t i = (size_t)hash_str(key) & mask;
    while (m->keys[i] && strcmp(m->keys[i], key) != 0)
        i = (i + 1) & mask;
    return i;
}

static int grow(kl_strmap *m)
{
    kl_strmap bigger;
    memset(&bigger, 0, sizeof bigger);
    if (alloc_slots(&bigger, m->cap * 2))
        return KL_E_NOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i]) {
            size_t j = find_slot(&bigger, m->keys[i]);
            bigger.keys[j] = m->keys[i];
            bigger.vals[j] = m->vals[i];
        }
    }
    bigger.count = m->count;
    kl_strmap_free(m);
    *m = bigger;
    return 0;
}

int kl_strmap_put(kl_strmap *m, const char *key, uint32_t val, uint32_t *existing)
{
    if (!m->cap && alloc_slots(m, 16))
        return KL_E_NOMEM;
    if ((m->count + 1) * 2 > m->cap && grow(m))
        return KL_E_NOMEM;
    size_t i = find_slot(m, key);
    if (m->keys[i]) {
        if (existing)
            *existing = m->vals[i];
        return 1;
    }
    m->keys[i] = key;
    m->vals[i] = val;
    m->count++;
    return 0;
}

int kl_strmap_get(const kl_strmap *m, const char *key, uint32_t *val)
{
    if (!m->cap)
        return 0;
    size_t i = find_slot(m, key);
    if (!m->keys[i])
        return 0;
    if (val)
        *val = m->vals[i];
    return 1;
}
