/*
 * engine/sampler.c — token sampling (see sampler.h for the order of operations).
 *
 * Sections: helpers, public API.
 */
#include "engine/sampler.h"

#include "common/mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------ */

/* z descending, then id ascending: a total order, so qsort's result is unique. */
static int cand_cmp(const void *a, const void *b)
{
    const kl_sample_cand *x = a, *y = b;
    if (x->z != y->z)
        return x->z > y->z ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Unnormalised probabilities of cand[0..n) into p; returns their sum.  z_max is the largest
 * z (finite: the caller handles +inf and all -inf). */
static double softmax_unnorm(const kl_sample_cand *cand, size_t n, float z_max, double *p)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        p[i] = exp((double)cand[i].z - (double)z_max);
        sum += p[i];
    }
    return sum;
}

/* ---- public API --------------------------------------------------------------------------- */

int kl_sampler_init(kl_sampler *s, uint32_t n_vocab, const kl_sampler_opts *o, kl_err *err)
{
    memset(s, 0, sizeof *s);
    kl_sampler_opts opts = {0};
    if (o)
        opts = *o;
    if (opts.top_p == 0)
        opts.top_p = 1;
    if (n_vocab == 0)
        return kl_fail(err, KL_E_USAGE, "sampler needs a vocabulary of at least one id");
    if (!isfinite(opts.temperature) || opts.temperature < 0)
        return kl_fail(err, KL_E_USAGE, "temperature %g: want a finite value >= 0",
                       (double)opts.temperature);
    if (!(opts.top_p > 0 && opts.top_p <= 1))
        return kl_fail(err, KL_E_USAGE, "top-p %g: want a value in (0, 1]", (double)opts.top_p);
    if (!(opts.min_p >= 0 && opts.min_p <= 1))
        return kl_fail(err, KL_E_USAGE, "min-p %g: want a value in [0, 1]", (double)opts.min_p);
    s->cand = kl_calloc(n_vocab, sizeof *s->cand);
    s->p = kl_calloc(n_vocab, sizeof *s->p);
    if (!s->cand || !s->p) {
        kl_sampler_free(s);
        return kl_fail(err, KL_E_NOMEM, "sampler scratch for %u ids", (unsigned)n_vocab);
    }
    s->opts = opts;
    s->n_vocab = n_vocab;
    kl_rng_seed(&s->rng, opts.seed, 0);
    return 0;
}

kl_token kl_sample_argmax(const float *logits, uint32_t n)
{
    kl_token best = 0;
    int found = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (isnan(logits[i]))
            continue;
        if (!found || logits[i] > logits[best]) {
            best = i;
            found = 1;
        }
    }
    return best;
}

int kl_sampler_pick(kl_sampler *s, const float *logits, double u, kl_token *id, kl_err *err)
{
    const kl_sampler_opts *o = &s->opts;
    uint32_t n_vocab = s->n_vocab;
    size_t n = 0;
    for (uint32_t i = 0; i < n_vocab; i++)
        n += !isnan(logits[i]);
    if (n == 0)
        return kl_fail(err, KL_E_USAGE, "every one of the %u logits is NaN", (unsigned)n_vocab);
    uint32_t best = kl_sample_argmax(logits, n_vocab);
    /* 1. greedy; a +inf or all -inf maximum leaves no distribution to sample either */
    if (o->temperature == 0 || o->top_k == 1 || !isfinite(logits[best])) {
        *id = best;
        return 0;
    }
    /* 1-2. temperature-scaled candidates */
    kl_sample_cand *cand = s->cand;
    n = 0;
    for (uint32_t i = 0; i < n_vocab; i++)
        if (!isnan(logits[i]))
            cand[n++] = (kl_sample_cand){logits[i] / o->temperature, i};
    float z_max = logits[best] / o->temperature;
    if (!isfinite(z_max)) { /* a tiny temperature overflowed: the limit is greedy */
        *id = best;
        return 0;
    }
    /* qsort of the whole vocabulary: O(V log V) per token, small next to a forward pass */
    if (o->top_k > 0 || o->top_p < 1)
        qsort(cand, n, sizeof *cand, cand_cmp);
    /* 3. top-k */
    if (o->top_k > 0 && o->top_k < n)
        n = o->top_k;
    double *p = s->p;
    double total = softmax_unnorm(cand, n, z_max, p);
    /* 4. top-p: shortest prefix of mass >= top_p */
    if (o->top_p < 1) {
        double need = (double)o->top_p * total, acc = 0;
        size_t keep = 0;
        while (keep < n) {
            acc += p[keep++];
            if (acc >= need)
                break;
        }
        n = keep;
        total = acc;
    }
    /* 5. min-p: p_max = exp(0) = 1 unnormalised (the argmax is always kept) */
    if (o->min_p > 0) {
        double thr = (double)o->min_p, kept = 0;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (p[i] >= thr) {
                cand[k] = cand[i];
                p[k++] = p[i];
                kept += p[i];
            }
        }
        n = k;
        total = kept;
    }
    /* 6. sample by the cumulative sum; the last candidate absorbs rounding */
    double target = u * total, acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += p[i];
        if (target < acc) {
            *id = cand[i].id;
            return 0;
        }
    }
    *id = cand[n - 1].id;
    return 0;
}

int kl_sampler_sample(kl_sampler *s, const float *logits, kl_token *id, kl_err *err)
{
    double u = kl_rng_uniform(&s->rng);
    return kl_sampler_pick(s, logits, u, id, err);
}

int kl_sampler_sample_best(kl_sampler *s, const float *logits, kl_token best, kl_token *id,
                           kl_err *err)
{
    if (!logits && !kl_sampler_greedy(s))
        return kl_fail(err, KL_E_USAGE, "sampling needs the logits (only a greedy pick goes "
                       "by the argmax alone)");
    if (!logits && best >= s->n_vocab)
        return kl_fail(err, KL_E_USAGE, "argmax %u outside the vocabulary (%u)", (unsigned)best,
                       (unsigned)s->n_vocab);
    /* a non-NaN logit at the argmax: not every logit is NaN, and the pick is greedy */
    if (kl_sampler_greedy(s) && best < s->n_vocab && (!logits || !isnan(logits[best]))) {
        (void)kl_rng_uniform(&s->rng);   /* one draw per call, as kl_sampler_sample */
        *id = best;
        return 0;
    }
    return kl_sampler_sample(s, logits, id, err);
}

int kl_sampler_greedy(const kl_sampler *s)
{
    return s->opts.temperature == 0 || s->opts.top_k == 1;
}

void kl_sampler_free(kl_sampler *s)
{
    kl_free(s->cand);
    kl_free(s->p);
    s->cand = NULL;
    s->p = NULL;
    s->n_vocab = 0;
}
