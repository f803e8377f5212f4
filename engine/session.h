/*
 * engine/session.h — one conversation's model state: what `kl chat`, `kl run` and the server
 * call instead of driving kl_forward themselves.
 *
 * A session owns a live state (the sequence fed so far, engine/forward.h), the ids it holds,
 * the logits after its last fed id, and (with snapshots on) a copy of the state taken at the
 * end of the last prompt.  kl_session_prompt brings the live state to a new prompt feeding as
 * little as possible: when the prompt extends what the live state holds (the previous prompt
 * plus the reply ids fed since), only the new ids are fed; else, when it extends the last
 * prompt, the snapshot is restored first (recurrent state cannot be rewound, so the snapshot is
 * the only way back); else the state is reset and the whole prompt fed.  Any of the three gives
 * bit-identical logits to a fresh feed of the whole prompt (forward.h: any split of a sequence
 * gives the same values).  Long prompts go in pieces of KL_SESSION_PIECE ids, with a progress
 * callback and a cancel flag checked between pieces; the cost of a piece is its projections
 * (linear in the ids) plus MLA's causal attention over the cache (the one term that grows with
 * the position; past keys and values are cached, never recomputed).
 *
 * Context: kl_session_check_context refuses a prompt whose ids plus the ids to generate exceed
 * the model's maximum (config model_max_length / max_position_embeddings), before any work.
 *
 * Errors: KL_E_USAGE (an id outside the vocabulary, an empty prompt, over the context),
 * KL_E_NOMEM, and those of kl_forward / kl_generate.  After a failed feed or generation the
 * session forgets its live state (reset); the snapshot, untouched, stays usable.
 * Ownership: the session borrows the model (it must outlive the session) and owns everything
 * else until kl_session_free (idempotent, safe on a zeroed struct).  Library code: prints
 * nothing.  Thread safety: one call at a time per session; one kl_forward at a time per model.
 */
#ifndef KL_ENGINE_SESSION_H
#define KL_ENGINE_SESSION_H

#include "common/err.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/token.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* Ids per kl_forward call of a long prompt: progress and cancel are looked at in between. */
#define KL_SESSION_PIECE 256

/* A token sequence (grown by doubling). */
typedef struct kl_id_seq {
    kl_token *ids;            /* [cap] */
    size_t    n, cap;
} kl_id_seq;

typedef struct kl_session {
    kl_model  *m;             /* borrowed */
    kl_state   live;          /* the sequence fed so far */
    kl_state   snap;          /* the state at the end of the last prompt (snapshots on) */
    kl_id_seq  live_ids;      /* ids held by live */
    kl_id_seq  snap_ids;      /* ids held by snap (n 0: no snapshot) */
    float     *logits;        /* [vocab] fp32: after the last id fed to live (after a greedy
                                 kl_session_generate: see g->logits_stale) */
    int        snapshots;     /* 1: keep a snapshot at the end of each prompt */
} kl_session;

/* Called after each piece of a prompt: ids fed so far of total (this call's new ids). */
typedef void (*kl_session_progress_fn)(void *user, size_t done, size_t total);

/* Options of one kl_session_prompt (all may be zero). */
typedef struct kl_session_feed {
    kl_session_progress_fn       progress; /* NULL: none */
    void                        *user;     /* passed to progress */
    const volatile sig_atomic_t *cancel;   /* NULL, or nonzero: stop before the next piece */
} kl_session_feed;

/* What one kl_session_prompt did. */
typedef struct kl_session_stats {
    size_t reused;            /* ids of the prompt already held (not fed) */
    size_t fed;               /* ids fed by this call */
    int    cancelled;         /* 1: stopped early by the cancel flag; the prompt is not held */
} kl_session_stats;

/* Binds a session to m with an empty sequence; snapshots 1 keeps a snapshot per prompt (chat,
 * server), 0 does not (a single prompt: half the state memory). */
int  kl_session_init(kl_session *s, kl_model *m, int snapshots, kl_err *err);
void kl_session_free(kl_session *s);
/* A new conversation: forgets the live sequence and the snapshot (no memory is released). */
void kl_session_reset(kl_session *s);

/* 0 if n_prompt ids plus n_generate more fit in max_position (0 = no limit known), else
 * KL_E_USAGE naming both numbers and the limit. */
int kl_session_check_context(uint64_t max_position, size_t n_prompt, uint64_t n_generate,
                             kl_err *err);

/* Brings the live state to ids[0..n) as described above; s->logits then hold the logits after
 * ids[n-1].  f and stats may be NULL.  Every id is checked against the vocabulary before
 * anything is fed.  When cancelled, the live state holds the ids fed so far and s->logits
 * follow them; no snapshot is taken. */
int kl_session_prompt(kl_session *s, const kl_token *ids, size_t n, const kl_session_feed *f,
                      kl_session_stats *stats, kl_err *err);

/* Feeds ids[0..n) after what the live state holds (teacher forcing: no reuse, no snapshot);
 * s->logits then follow ids[n-1]. */
int kl_session_append(kl_session *s, const kl_token *ids, size_t n, kl_err *err);

/* kl_generate on the live state (g->m, g->st and g->logits are set here; the caller fills the
 * rest), then records the ids it fed, so the next prompt can reuse them. */
int kl_session_generate(kl_session *s, kl_gen *g, kl_err *err);

#endif
