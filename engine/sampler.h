/*
 * engine/sampler.h — picks the next token from a row of logits: greedy, temperature, top-k,
 * top-p (nucleus), min-p, with a seeded deterministic random stream (common/rng.h).
 *
 * Order of operations (kl_sampler_pick), on the logits of one position:
 *   1. temperature: temperature == 0 (or top_k == 1) is greedy: the argmax, lowest id on ties,
 *      and nothing below applies.  Otherwise z_i = logit_i / temperature.
 *   2. candidates: every id with a non-NaN logit, in id order; the sorted order is z
 *      descending, id ascending on ties (only the part that top-k or top-p needs is sorted).
 *   3. top-k (0 < top_k < candidates): keep the first top_k of the sorted order, sorted.
 *   4. top-p (top_p < 1): keep the shortest prefix of the sorted order whose probability mass,
 *      summed in that order, reaches top_p times the mass of the candidates of step 3 (summed
 *      in their order: sorted after a top-k, else id order); always at least one candidate.
 *   5. min-p (min_p > 0): keep candidates with p >= min_p * p_max.  min-p is a ratio to the most
 *      likely candidate, so it does not matter whether p is renormalised after steps 3-4.
 *   6. sample: renormalise the kept probabilities and walk their cumulative sum in candidate
 *      order (sorted after steps 3-4, else id order) to the first one that exceeds u * total,
 *      u uniform in [0, 1).  Without top-k and top-p the sums go by chunks of 4,096 ids (each
 *      chunk's in id order, the chunks' in order), so a pool can share the pass.
 * Probabilities are computed in double: exp(z_i - z_max) by the sampler's own exp (the same
 * bits on every machine; 0 below e^-708).  An id whose logit is -inf has probability 0 and is
 * never sampled unless every logit is -inf (then the lowest such id).
 *
 * kl_sampler_pick is a pure function of (options, logits, u): the sampler only lends scratch
 * memory.  kl_sampler_sample draws u from the sampler's stream (kl_rng_seed(seed, 0)), exactly
 * one draw per call, greedy or not, so equal seeds and logits give equal ids on every machine.
 *
 * Errors: KL_E_USAGE (bad options: temperature < 0 or not finite, top_p outside (0, 1], min_p
 * outside [0, 1], n_vocab == 0; every logit NaN), KL_E_NOMEM.
 * Ownership: the sampler owns its scratch until kl_sampler_free (idempotent, safe on a zeroed
 * struct); logits are borrowed for the call.  Thread safety: a sampler belongs to one thread.
 */
#ifndef KL_ENGINE_SAMPLER_H
#define KL_ENGINE_SAMPLER_H

#include "common/err.h"
#include "common/pool.h"
#include "common/rng.h"
#include "engine/token.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_sampler_opts {
    float    temperature;  /* 0 = greedy */
    uint32_t top_k;        /* 0 = off */
    float    top_p;        /* (0, 1]; 1 = off (0 in a zeroed struct is read as 1) */
    float    min_p;        /* [0, 1]; 0 = off */
    uint64_t seed;         /* stream of kl_sampler_sample */
} kl_sampler_opts;

/* One candidate of the filtered distribution (scratch). */
typedef struct kl_sample_cand {
    float    z;            /* logit / temperature */
    kl_token id;
} kl_sample_cand;

typedef struct kl_sampler {
    kl_sampler_opts opts;
    uint32_t        n_vocab;
    kl_rng          rng;
    kl_sample_cand *cand;  /* [n_vocab] candidates in id order, scratch */
    kl_sample_cand *sorted, *tmp; /* [n_vocab] those top-k or top-p sorts, and the sort's */
    double         *p;     /* [n_vocab] unnormalised probabilities of cand, scratch */
    double         *p_id;  /* [n_vocab] the same by id (top-p without top-k), scratch */
    uint32_t       *hist;  /* [4096] candidates per bucket of z, scratch */
    double         *chunk_sum; /* [n_vocab / 4096, rounded up] a chunk's mass, scratch */
    kl_pool        *pool;  /* borrowed, or NULL (kl_sampler_set_pool) */
    double         *mass;  /* [4096] probability per bucket of z, scratch */
    uint32_t       *chunk_n;   /* [as chunk_sum] a chunk's candidates, scratch */
    uint32_t       *radix;     /* [16 x 2048] the sort's counts per part, scratch */
} kl_sampler;

/* Validates o (NULL = greedy defaults) and allocates scratch for n_vocab logits. */
int  kl_sampler_init(kl_sampler *s, uint32_t n_vocab, const kl_sampler_opts *o, kl_err *err);

/* Argmax of logits[0..n) (NaN skipped, lowest id on ties); 0 if n == 0 or all are NaN. */
kl_token kl_sample_argmax(const float *logits, uint32_t n);

/* Picks from logits[n_vocab] with the uniform draw u in [0, 1) by the steps above; *id is
 * written on success. */
int  kl_sampler_pick(kl_sampler *s, const float *logits, double u, kl_token *id, kl_err *err);

/* kl_sampler_pick with the next draw of the sampler's stream. */
int  kl_sampler_sample(kl_sampler *s, const float *logits, kl_token *id, kl_err *err);

/* kl_sampler_sample when best == kl_sample_argmax(logits) is known already (e.g. computed on
 * the GPU: kl_forward_argmax): the same id, error and draw, without the passes over the row
 * that a greedy pick otherwise makes (~0.1 ms a token at Kimi's 163,840 ids).  logits may be
 * NULL for a greedy sampler (the row was never copied back): best is taken as it is, so a row
 * of NaN is not noticed (best is then 0); KL_E_USAGE for a sampler that is not greedy. */
int  kl_sampler_sample_best(kl_sampler *s, const float *logits, kl_token best, kl_token *id,
                            kl_err *err);

/* Lends the sampler a pool for its passes over the vocabulary (NULL: the calling thread
 * only): the plain distribution's chunks, the candidates and their p, a large top-k or
 * top-p's sort (in parts: a stable sort's result is unique); the ids do not depend on it.
 * No other kl_pool_run may be running on it during a pick (pools are not re-entrant): not
 * from inside one of its own items. */
void kl_sampler_set_pool(kl_sampler *s, kl_pool *pool);

/* 1 if the sampler picks the argmax whatever the draw (temperature 0 or top_k 1). */
int  kl_sampler_greedy(const kl_sampler *s);

void kl_sampler_free(kl_sampler *s);

#endif
