/*
 * serve/sched.h — continuous batching: many generation requests through one backend
 * (engine/backend.h), every step one batch holding the next token of each decoding sequence
 * and pieces of the prompts of new ones.
 *
 * A request is a prompt of ids, a sampler (engine/sampler.h), a limit of new tokens and stop
 * ids.  Submitted requests wait in arrival order until a slot is free (at most max_seqs run).
 * A step then builds one batch: first the decode token of every running sequence (its last
 * sampled id), then prompt pieces of sequences still in prefill, in arrival order, until the
 * step holds step_tokens tokens; the backend returns the logits of each sequence's last token
 * in the batch (a decode token, or the end of a prompt), which its sampler turns into the next
 * id (the rows' samplers run in parallel over the model's pool; what follows, in row order).
 * The id goes to the request's callback; a stop id (not passed on), the token limit or a
 * cancel ends the request (its callback gets the end), and its slot is free for the next.
 *
 * Because the backend computes each sequence's values independently of the batch it travels in
 * (engine/backend.h; bit for bit on the CPU), a request's ids do not depend on the others:
 * greedy output served among others equals the same request served alone.
 *
 * Errors: KL_E_USAGE (empty prompt, id outside the vocabulary, an empty forced sequence:
 * refused at submit), KL_E_NOMEM,
 * the backend's (a failed step ends every running request with the error), and a callback's
 * (ends that request only).  Callbacks must not call the scheduler.  Thread safety: none; one
 * thread drives a scheduler (the server's engine thread) and serialises submit/cancel/step.
 */
#ifndef KL_SERVE_SCHED_H
#define KL_SERVE_SCHED_H

#include "common/err.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/token.h"

#include <stddef.h>
#include <stdint.h>

struct kl_prefix;

typedef enum kl_sched_end {
    KL_SCHED_STOP = 0,     /* a stop id */
    KL_SCHED_LENGTH,       /* max_tokens reached */
    KL_SCHED_CANCELLED,    /* kl_sched_cancel */
    KL_SCHED_ERROR,        /* the step failed (err says why) */
} kl_sched_end;

/* A new id of request user's reply (0 to go on; an error ends the request). */
typedef int (*kl_sched_token_fn)(void *user, kl_token id, kl_err *err);
/* The logits row id was sampled from (vocab floats, valid during the call), before on_token
 * gets id (a stop id is not passed): per-token logprobs.  0 to go on. */
typedef int (*kl_sched_logits_fn)(void *user, const float *logits, size_t vocab, kl_token id,
                                  kl_err *err);
/* The request starts from a prefix-cache entry of n ids (called at admission, only when n > 0):
 * the prompt's first n ids are not fed again. */
typedef void (*kl_sched_cached_fn)(void *user, size_t n);
/* The request is over (called once; err is set for KL_SCHED_ERROR). */
typedef void (*kl_sched_done_fn)(void *user, kl_sched_end why, size_t n_generated,
                                 const kl_err *err);

typedef struct kl_sched_req {
    const kl_token   *prompt;       /* copied at submit */
    size_t            n_prompt;
    size_t            max_tokens;   /* >= 1 */
    kl_sampler_opts   samp;
    const kl_token   *stop_ids;     /* copied at submit; may be NULL */
    size_t            n_stop_ids;
    kl_sched_token_fn on_token;
    kl_sched_logits_fn on_logits;   /* may be NULL */
    kl_sched_done_fn  on_done;
    kl_sched_cached_fn on_cached;   /* may be NULL */
    void             *user;
    /* A forced choice (may be absent: n_heads 0): the reply starts with one of n_heads id
     * sequences, sequence k = head_ids[head_off[k] .. head_off[k + 1]) (non-empty; copied at
     * submit).  Until one is complete, only ids that go on a sequence matching every id so far
     * can be sampled: the others' logits are -inf in the row the sampler (and on_logits) sees.
     * The model still chooses among the sequences by its own probabilities (e.g. which tool a
     * call forced by tool_choice "required" names). */
    const kl_token   *head_ids;
    const size_t     *head_off;     /* [n_heads + 1] */
    size_t            n_heads;
} kl_sched_req;

typedef struct kl_sched kl_sched;

/* A scheduler over m's backend: at most max_seqs sequences at once, step_tokens per batch
 * (>= max_seqs, so every decoding sequence fits in each step). */
int  kl_sched_create(kl_sched **out, kl_model *m, uint32_t max_seqs, size_t step_tokens,
                     kl_err *err);
/* Prefix reuse (serve/prefix.h; NULL: none, the default): a request admitted into a slot starts
 * from the cache's longest entry that is a prefix of its prompt (at most n_prompt - 1 ids) and
 * feeds the rest, or from an entry of its whole prompt kept with its last id's logits (its
 * first id is then sampled from those, in the next step, with no forward); when its prompt is
 * fed, before its first id is sampled, its state and those logits are put in the cache.  The
 * logits equal those of a cold run (kl_state_copy is exact).  The cache must
 * outlive the scheduler's requests; the scheduler does not own it. */
void kl_sched_set_prefix(kl_sched *s, struct kl_prefix *c);
/* Queues a request; *handle names it for kl_sched_cancel. */
int  kl_sched_submit(kl_sched *s, const kl_sched_req *r, uint64_t *handle, kl_err *err);
/* Ends a queued or running request (its done callback runs now); unknown handles are ignored. */
void kl_sched_cancel(kl_sched *s, uint64_t handle);
/* One batch; *n_tokens (may be NULL) gets the tokens it held (0: nothing to do). */
int  kl_sched_step(kl_sched *s, size_t *n_tokens, kl_err *err);
/* Requests queued or running. */
size_t kl_sched_pending(const kl_sched *s);
void kl_sched_free(kl_sched *s);   /* cancels what is left; NULL ok */

#endif
