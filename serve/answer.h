/*
 * serve/answer.h — one reply being produced: a job's ids (serve/engine.h) turned into text
 * (the tokenizer's stream, bytes that are not UTF-8 as U+FFFD), cut at the request's stop
 * strings, then into the wire format: server-sent events for a stream (chat.completion.chunk
 * through serve/reply.h, or text_completion chunks for a legacy completion), or the whole
 * object at the end.
 *
 * Special ids never reach the text (kl_answer_id_shown): control and reserved ids are dropped,
 * and Kimi's tool-call markers are read by the tool-call parser only when tools are on and a
 * calls section has begun (a stray marker before it is dropped too).  Logprobs still list
 * every id.  With logprobs, a chat reply carries OpenAI's chat items (token, logprob, bytes,
 * top_logprobs) and a legacy completion the legacy arrays (tokens, token_logprobs,
 * top_logprobs as {text: logprob} with the sampled token, text_offset: the code points of the
 * texts of the shown tokens before it), each with the chunk of the token's text.
 *
 * Stop strings: text that could still grow into one is held back; at the first match the text
 * before it is the reply, the job is cancelled (its slot freed) and finish_reason is "stop".
 * The usage counts the ids read up to then.
 *
 * Ownership: the answer owns its job (released by kl_answer_free: a job still running is
 * cancelled) and copies what it keeps of the request.  Thread safety: one thread per answer.
 */
#ifndef KL_SERVE_ANSWER_H
#define KL_SERVE_ANSWER_H

#include "common/err.h"
#include "engine/tokenizer.h"
#include "serve/engine.h"
#include "serve/request.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_answer kl_answer;

/* Which generated ids reach a reply's text (the rule above); one per reply. */
typedef struct kl_id_rule {
    uint32_t n_ranks;          /* ids from here on are special */
    kl_token marker[7];        /* the tool-call markers the tokenizer has */
    int      opens[7];         /* marker[i] opens a calls section */
    size_t   n_markers;
    int      tools_on, in_section;
} kl_id_rule;

/* The rule for one reply: tools_on as kl_req_tools_on; in_section 1 when the prompt already
 * opened the calls section (a forced tool call). */
void kl_answer_id_rule_init(kl_id_rule *r, const kl_tokenizer *tok, int tools_on,
                            int in_section);
/* 1 when id's text goes into the reply (updates the section state). */
int  kl_answer_id_shown(kl_id_rule *r, kl_token id);

/* An answer to r (kl_req_chat_parse or kl_req_completion_parse: r->prompt set) over job (taken
 * over, also on failure); model is the served name, n_prompt the prompt's ids. */
int  kl_answer_new(kl_answer **out, kl_job *job, const kl_req_chat *r, const kl_tokenizer *tok,
                   const char *model, uint64_t serial, size_t n_prompt, kl_err *err);
/* Waits up to timeout_ms (< 0: no limit) for ids and adds their events to the pending bytes
 * (a stream; kl_answer_bytes takes them); *over is set once the reply is complete.  A stream
 * that got nothing in time gets an SSE comment line (a keep-alive: a gone client shows). */
int  kl_answer_pump(kl_answer *a, int timeout_ms, int *over, kl_err *err);
/* The pending bytes: up to max copied into buf, returned (0: none now). */
size_t kl_answer_bytes(kl_answer *a, char *buf, size_t max);
/* After the reply is over (not a stream): the whole object (*json kl_malloc'd).  A reply that
 * did not complete (engine error, cancelled by a shutdown) is KL_E_CANCELLED (or the engine's
 * error) with *status 503 (or 500). */
int  kl_answer_json(kl_answer *a, char **json, int *status, kl_err *err);
void kl_answer_free(kl_answer *a);   /* NULL ok */

#endif
