/*
 * engine/generate.c — the sampling loop (generate.h).
 */
#include "engine/generate.h"

#include "engine/chat.h"

static int emit(kl_gen *g, const char *s, size_t n, kl_err *err)
{
    return n && g->emit ? g->emit(g->user, s, n, err) : 0;
}

static int is_stop(const kl_token *stop, size_t n_stop, kl_token id)
{
    for (size_t k = 0; k < n_stop; k++)
        if (id == stop[k])
            return 1;
    return 0;
}

int kl_generate(kl_gen *g, kl_err *err)
{
    g->n_ids = g->n_fed = 0;
    g->stopped = g->cancelled = g->logits_stale = 0;
    /* the row of logits after a fed id: only where the sampler or the caller reads it */
    float *fed_logits = g->keep_logits || !kl_sampler_greedy(g->samp) ? g->logits : NULL;
    kl_token stop[KL_CHAT_MAX_STOP];
    size_t n_stop = 0;
    int rc = kl_chat_stop_ids(g->tok, stop, &n_stop, err);
    if (rc)
        return rc;
    kl_tok_stream ts;
    if ((rc = kl_tok_stream_init(&ts, g->tok, 0, err)))
        return rc;
    const char *s;
    size_t n;
    kl_token best = 0; /* the argmax of g->logits, once a fed id gave it */
    for (size_t step = 0; step < g->n_predict; step++) {
        kl_token id;
        if (g->cancel && *g->cancel) {
            g->cancelled = 1;
            break;
        }
        rc = g->n_fed ? kl_sampler_sample_best(g->samp, fed_logits, best, &id, err)
                      : kl_sampler_sample(g->samp, g->logits, &id, err);
        if (rc)
            goto out;
        if (is_stop(stop, n_stop, id)) {
            g->stopped = 1;
            break;
        }
        g->ids[g->n_ids++] = id;
        if ((rc = kl_tok_stream_push(&ts, id, &s, &n, err)) || (rc = emit(g, s, n, err)))
            goto out;
        if (step + 1 == g->n_predict)
            break;
        /* feed it: the next step samples from the logits after it */
        if ((rc = kl_forward_argmax(g->m, g->st, &id, 1, fed_logits, &best, err)))
            goto out;
        g->n_fed++;
        g->logits_stale = !fed_logits;
        if (g->on_fed && (rc = g->on_fed(g->user, fed_logits, err)))
            goto out;
    }
    kl_tok_stream_flush(&ts, &s, &n);
    rc = emit(g, s, n, err);
out:
    kl_tok_stream_free(&ts);
    return rc;
}
