/*
 * serve/prefix.h — the server's prefix cache: snapshots of sequence states (engine/forward.h's
 * kl_state, one backend slot each) keyed by the prompt ids they hold, so a request whose prompt
 * starts with an earlier prompt (the next turn of a conversation, a shared system prompt)
 * starts from the snapshot and feeds only the rest.
 *
 * Recurrent KDA state cannot be rewound: an entry serves a prompt only when the entry's ids
 * are a prefix of it, and the longest such entry wins; an entry that also holds the logits of
 * its last id serves a prompt of exactly its ids (a repeated request) with no forward.
 * Entries are bounded by a byte budget
 * (each entry's state: KDA states and conv windows of every KDA layer, MLA latent caches of
 * its length; engine/forward.h, loader/config.h) and a number of slots; when a new entry does
 * not fit, the least recently used entries that are not pinned go first (an entry is pinned
 * from kl_prefix_find until kl_prefix_unpin: a request still starting from it).
 *
 * Errors: KL_E_NOMEM.  A put that does not fit (budget, slots, everything pinned) is not an
 * error: nothing is stored.  Thread safety: none; the server's engine thread owns it.
 */
#ifndef KL_SERVE_PREFIX_H
#define KL_SERVE_PREFIX_H

#include "common/err.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/token.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_prefix kl_prefix;
typedef struct kl_prefix_entry kl_prefix_entry;

typedef struct kl_prefix_stats {
    uint64_t hits;           /* finds that returned an entry */
    uint64_t tokens_reused;  /* the lengths of those entries, summed */
    size_t   entries, bytes; /* held now */
} kl_prefix_stats;

/* A cache over m's backend: at most budget bytes of state in at most max_entries slots (0 for
 * either: a cache that stores nothing). */
int  kl_prefix_create(kl_prefix **out, kl_model *m, size_t budget, uint32_t max_entries,
                      kl_err *err);
void kl_prefix_free(kl_prefix *c);   /* every entry's slot closed; NULL ok */

/* Bytes an entry of len ids takes on m (its logits, when kept, add vocab floats). */
size_t kl_prefix_state_bytes(const kl_model *m, size_t len);

/* The longest entry whose ids are a prefix of ids[0..n) and whose length is at most max_len
 * (a request needs at least one id fed for logits: n - 1), or NULL.  The entry becomes the
 * most recently used and is pinned (kl_prefix_unpin). */
kl_prefix_entry *kl_prefix_find(kl_prefix *c, const kl_token *ids, size_t n, size_t max_len);
void kl_prefix_unpin(kl_prefix *c, kl_prefix_entry *e);   /* NULL ok */
size_t kl_prefix_entry_len(const kl_prefix_entry *e);
const kl_state *kl_prefix_entry_state(const kl_prefix_entry *e);

/* A snapshot of st (holding exactly ids[0..n)) as an entry, evicting least recently used
 * unpinned entries to make room; an entry of the same ids is only marked used (and given the
 * logits if it had none).  logits (may be NULL): the [vocab] logits of ids[n - 1], kept with
 * the entry so that a prompt of exactly these ids needs no forward at all (its first id is
 * sampled from them: they are a cold run's, bit for bit).  *stored (may be NULL) is 1 when the
 * ids are held after the call. */
int  kl_prefix_put(kl_prefix *c, const kl_token *ids, size_t n, const kl_state *st,
                   const float *logits, int *stored, kl_err *err);
/* The logits kept with e, or NULL. */
const float *kl_prefix_entry_logits(const kl_prefix_entry *e);
/* 1 when an entry holds exactly ids[0..n) with its logits (no use is counted). */
int  kl_prefix_holds_whole(const kl_prefix *c, const kl_token *ids, size_t n);

void kl_prefix_get_stats(const kl_prefix *c, kl_prefix_stats *out);

#endif
