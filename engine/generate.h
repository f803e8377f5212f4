/*
 * engine/generate.h — the sampling loop shared by `kl run` and `kl chat`: sample from the
 * current logits, stop at the chat stop ids (engine/chat.h) or after n_predict ids, stream the
 * detokenized text through a callback, and feed every generated id but the last back into the
 * state so the logits follow the sequence.
 *
 * After kl_generate, g->st has processed its previous tokens plus ids[0..n_fed), and g->logits
 * hold the logits after the last fed id (or the prompt's when nothing was fed), unless
 * g->logits_stale: a greedy sampler without keep_logits feeds each id asking the backend for
 * the argmax alone (the GPU then copies back 4 bytes a step, not the 655 KB row), and the
 * logits stay those of the prompt.  The last
 * sampled id is not fed (nothing would read its logits); a stop id is never stored nor fed.
 * A cancel flag that turns nonzero ends the loop before the next sample, with no error.
 *
 * Errors: those of kl_sampler_sample, kl_forward, the tokenizer stream and the callbacks (the
 * first error ends the loop; the ids so far stay in g->ids).  Library code: prints nothing.
 * Ownership: every pointer in kl_gen is borrowed.  Thread safety: one call per state.
 */
#ifndef KL_ENGINE_GENERATE_H
#define KL_ENGINE_GENERATE_H

#include "common/err.h"
#include "engine/forward.h"
#include "engine/sampler.h"
#include "engine/token.h"
#include "engine/tokenizer.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* Receives text bytes as they become safe to show (whole UTF-8 sequences); 0 or an error. */
typedef int (*kl_gen_emit_fn)(void *user, const char *text, size_t len, kl_err *err);
/* Called after each fed id with the logits after it (NULL unless keep_logits or the sampler
 * is not greedy); 0 or an error. */
typedef int (*kl_gen_fed_fn)(void *user, const float *logits, kl_err *err);

typedef struct kl_gen {
    /* inputs */
    kl_model           *m;
    kl_state           *st;        /* holds the prompt */
    kl_sampler         *samp;
    const kl_tokenizer *tok;
    float              *logits;    /* [vocab] fp32: in, after the prompt; out, after the last fed */
    size_t              n_predict; /* ids to generate at most */
    kl_token           *ids;       /* [n_predict] out: generated ids (no stop id) */
    kl_gen_emit_fn      emit;      /* may be NULL */
    kl_gen_fed_fn       on_fed;    /* may be NULL */
    int                 keep_logits; /* 1: g->logits follow every fed id even when greedy */
    void               *user;      /* passed to the callbacks */
    const volatile sig_atomic_t *cancel; /* NULL, or nonzero: stop before the next sample
                                            (a SIGINT handler's flag) */
    /* outputs */
    size_t              n_ids;     /* ids stored */
    size_t              n_fed;     /* ids fed to st (n_ids or n_ids - 1) */
    int                 stopped;   /* 1: ended at a stop id; 0: at n_predict or cancelled */
    int                 cancelled; /* 1: ended by the cancel flag */
    int                 logits_stale; /* 1: ids were fed without their logits (see above) */
} kl_gen;

/* Runs the loop described above; the outputs are zeroed first. */
int kl_generate(kl_gen *g, kl_err *err);

#endif
