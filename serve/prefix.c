/*
 * serve/prefix.c — the prefix cache (see prefix.h): a list of entries, each a slot copy with
 * its ids and a use tick; lookups and evictions are linear (entries are few: one per slot).
 */
#include "serve/prefix.h"

#include "common/mem.h"

#include <string.h>

struct kl_prefix_entry {
    kl_token        *ids;
    size_t           n, bytes;
    uint64_t         used;     /* tick of the last use */
    uint32_t         pins;
    kl_state         st;
    float           *logits;   /* [vocab] of ids[n - 1], or NULL */
    kl_prefix_entry *next;
};

struct kl_prefix {
    kl_model        *m;
    size_t           budget;
    uint32_t         max_entries;
    uint64_t         tick;
    kl_prefix_entry *head;
    kl_prefix_stats  st;
};

size_t kl_prefix_state_bytes(const kl_model *m, size_t len)
{
    const kl_config *c = &m->cfg;
    uint64_t kda = 0;
    if (kl_config_kda_state_bytes(c, c->kda_num_heads, 4, &kda))
        kda = 0;
    uint64_t n_kda = kl_config_count_attn(c, KL_ATTN_KDA);
    uint64_t n_mla = kl_config_count_attn(c, KL_ATTN_MLA);
    return (size_t)(n_kda * kda + n_mla * kl_config_mla_token_bytes(c, 4) * len);
}

int kl_prefix_create(kl_prefix **out, kl_model *m, size_t budget, uint32_t max_entries,
                     kl_err *err)
{
    *out = kl_calloc(1, sizeof **out);
    if (!*out)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the prefix cache");
    (*out)->m = m;
    (*out)->budget = budget;
    (*out)->max_entries = max_entries;
    return 0;
}

static void entry_free(kl_prefix *c, kl_prefix_entry *e)
{
    c->st.entries--;
    c->st.bytes -= e->bytes;
    kl_state_free(&e->st);
    kl_free(e->logits);
    kl_free(e->ids);
    kl_free(e);
}

void kl_prefix_free(kl_prefix *c)
{
    if (!c)
        return;
    while (c->head) {
        kl_prefix_entry *e = c->head;
        c->head = e->next;
        entry_free(c, e);
    }
    kl_free(c);
}

/* 1 when e's ids are a prefix of ids[0..n). */
static int is_prefix(const kl_prefix_entry *e, const kl_token *ids, size_t n)
{
    return e->n <= n && !memcmp(e->ids, ids, e->n * sizeof *ids);
}

kl_prefix_entry *kl_prefix_find(kl_prefix *c, const kl_token *ids, size_t n, size_t max_len)
{
    kl_prefix_entry *best = NULL;
    for (kl_prefix_entry *e = c->head; e; e = e->next)
        if (e->n <= max_len && (!best || e->n > best->n) && is_prefix(e, ids, n))
            best = e;
    if (best) {
        best->used = ++c->tick;
        best->pins++;
        c->st.hits++;
        c->st.tokens_reused += best->n;
    }
    return best;
}

void kl_prefix_unpin(kl_prefix *c, kl_prefix_entry *e)
{
    (void)c;
    if (e && e->pins)
        e->pins--;
}

size_t kl_prefix_entry_len(const kl_prefix_entry *e)
{
    return e->n;
}

const kl_state *kl_prefix_entry_state(const kl_prefix_entry *e)
{
    return &e->st;
}

/* Evicts the least recently used unpinned entry; 0 when every entry is pinned. */
static int evict_one(kl_prefix *c)
{
    kl_prefix_entry **victim = NULL;
    for (kl_prefix_entry **pp = &c->head; *pp; pp = &(*pp)->next)
        if (!(*pp)->pins && (!victim || (*pp)->used < (*victim)->used))
            victim = pp;
    if (!victim)
        return 0;
    kl_prefix_entry *e = *victim;
    *victim = e->next;
    entry_free(c, e);
    return 1;
}

/* Room for one more entry of the given bytes, evicting as needed; 0 when there is none. */
static int make_room(kl_prefix *c, size_t bytes)
{
    if (bytes > c->budget || !c->max_entries)
        return 0;
    while (c->st.entries >= c->max_entries || c->st.bytes + bytes > c->budget)
        if (!evict_one(c))
            return 0;
    return 1;
}

/* The entry holding exactly ids[0..n), or NULL. */
static kl_prefix_entry *same(const kl_prefix *c, const kl_token *ids, size_t n)
{
    for (kl_prefix_entry *e = c->head; e; e = e->next)
        if (e->n == n && is_prefix(e, ids, n))
            return e;
    return NULL;
}

int kl_prefix_holds_whole(const kl_prefix *c, const kl_token *ids, size_t n)
{
    const kl_prefix_entry *e = same(c, ids, n);
    return e && e->logits;
}

const float *kl_prefix_entry_logits(const kl_prefix_entry *e)
{
    return e->logits;
}

/* A copy of logits [vocab] for e (nothing when logits is NULL or e has some); the bytes are
 * counted. */
static int keep_logits(kl_prefix *c, kl_prefix_entry *e, const float *logits, kl_err *err)
{
    size_t bytes = (size_t)c->m->cfg.vocab_size * sizeof *logits;
    if (!logits || e->logits)
        return 0;
    if (!(e->logits = kl_memdup(logits, bytes)))
        return kl_fail(err, KL_E_NOMEM, "out of memory for a prefix cache entry's logits");
    e->bytes += bytes;
    c->st.bytes += bytes;
    return 0;
}

int kl_prefix_put(kl_prefix *c, const kl_token *ids, size_t n, const kl_state *st,
                  const float *logits, int *stored, kl_err *err)
{
    if (stored)
        *stored = 0;
    kl_prefix_entry *old = same(c, ids, n);
    if (old) {
        old->used = ++c->tick;
        if (stored)
            *stored = 1;
        return keep_logits(c, old, logits, err);
    }
    size_t bytes = kl_prefix_state_bytes(c->m, n) +
                   (logits ? (size_t)c->m->cfg.vocab_size * sizeof *logits : 0);
    if (!n || !make_room(c, bytes))
        return 0;
    kl_prefix_entry *e = kl_calloc(1, sizeof *e);
    if (!e || !(e->ids = kl_malloc(n * sizeof *ids))) {
        kl_free(e);
        return kl_fail(err, KL_E_NOMEM, "out of memory for a prefix cache entry");
    }
    int rc = kl_state_init(&e->st, c->m, err);
    if (rc || (rc = kl_state_copy(&e->st, st, err)) ||
        (logits && !(e->logits = kl_memdup(logits, bytes - kl_prefix_state_bytes(c->m, n))))) {
        kl_state_free(&e->st);
        kl_free(e->ids);
        kl_free(e);
        return rc ? rc : kl_fail(err, KL_E_NOMEM, "out of memory for a prefix cache entry");
    }
    memcpy(e->ids, ids, n * sizeof *ids);
    e->n = n;
    e->bytes = bytes;
    e->used = ++c->tick;
    e->next = c->head;
    c->head = e;
    c->st.entries++;
    c->st.bytes += bytes;
    if (stored)
        *stored = 1;
    return 0;
}

void kl_prefix_get_stats(const kl_prefix *c, kl_prefix_stats *out)
{
    *out = c->st;
}
