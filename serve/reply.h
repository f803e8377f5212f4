/*
 * serve/reply.h — a chat completion's reply in OpenAI's wire format (tokenizer-and-api.md B3):
 * the whole-reply JSON object, and the stream of server-sent events built while the reply is
 * generated, with Kimi tool calls turned into `tool_calls` (engine/toolstream.h for both, so
 * a whole reply reports the calls its stream would: a call cut off by the limit too).
 *
 * Stream: a first chunk with delta {"role": "assistant", "content": ""}; content deltas as text
 * arrives (never any part of a tool-call marker); for each call a delta with index, id, type and
 * name and "arguments": "", then argument deltas with the index only; a final chunk with an
 * empty delta and finish_reason ("tool_calls" when a call was made, else the caller's: "stop"
 * or "length"); with include_usage a chunk with "choices": [] and usage; then "data: [DONE]".
 * Every event is "data: " + one JSON object on one line + a blank line; id, created and model
 * are the same in every chunk.  When tools are off (none given, or tool_choice "none") the text
 * is all content, markers included, as the model wrote them.
 *
 * Errors: KL_E_NOMEM, and the sink's.  Ownership: the stream copies id and model; every event
 * passed to the sink is valid during the call only.
 */
#ifndef KL_SERVE_REPLY_H
#define KL_SERVE_REPLY_H

#include "common/err.h"
#include "engine/toolstream.h"

#include <stddef.h>
#include <stdint.h>

struct cJSON;

/* Token counts of the usage object. */
typedef struct kl_usage {
    uint64_t prompt_tokens, completion_tokens, cached_tokens;
} kl_usage;

/* Receives one whole event ("data: ...\n\n"); 0 or an error (a closed connection). */
typedef int (*kl_sse_sink)(void *user, const char *event, size_t len, kl_err *err);

typedef struct kl_chat_stream {
    char          id[64], model[128];
    int64_t       created;
    int           tools_on;    /* parse tool calls out of the text */
    int           called;      /* a tool call was streamed */
    kl_toolstream ts;
    kl_sse_sink   sink;
    void         *user;
    struct cJSON *lp_pending;  /* logprobs items not sent yet (they go with the next chunk) */
} kl_chat_stream;

/* Starts a stream (the role chunk goes out).  tools_on: see the header comment. */
int  kl_chat_stream_begin(kl_chat_stream *s, const char *id, const char *model, int64_t created,
                          int tools_on, kl_sse_sink sink, void *user, kl_err *err);
/* The next piece of the reply's text (detokenized, special-token text included). */
int  kl_chat_stream_text(kl_chat_stream *s, const char *text, size_t len, kl_err *err);
/* One logprobs item ({"token", "logprob", "bytes", "top_logprobs"}, taken over) for the reply:
 * it goes out as "logprobs": {"content": [...]} with the next chunk sent. */
int  kl_chat_stream_logprob(kl_chat_stream *s, struct cJSON *item, kl_err *err);
/* Ends it: held text, the finish chunk, usage when usage is non-NULL, [DONE]. */
int  kl_chat_stream_end(kl_chat_stream *s, const char *finish_reason, const kl_usage *usage,
                        kl_err *err);
void kl_chat_stream_free(kl_chat_stream *s);   /* safe on a zeroed struct */

/* The whole reply text[0..len) as a chat.completion object (*json: kl_malloc'd, one line). */
int  kl_chat_reply_json(const char *id, const char *model, int64_t created, int tools_on,
                        const char *text, size_t len, const char *finish_reason,
                        const kl_usage *usage, char **json, kl_err *err);

/* As kl_chat_reply_json with the choice's "logprobs": {"content": items} (items: a cJSON array,
 * taken over; NULL: null). */
int  kl_chat_reply_json_lp(const char *id, const char *model, int64_t created, int tools_on,
                           const char *text, size_t len, const char *finish_reason,
                           const kl_usage *usage, struct cJSON *items, char **json,
                           kl_err *err);

/* A legacy completion (POST /v1/completions) object "text_completion": the whole reply, or one
 * streamed chunk (the same shape: choices [{text, index, logprobs, finish_reason}],
 * finish_reason NULL: null).  text NULL: no choice at all (choices [], the usage chunk);
 * usage NULL: no usage; logprobs: the choice's legacy logprobs object (taken over, also on
 * failure), NULL: null.  *json: kl_malloc'd, one line. */
int  kl_text_completion_json(const char *id, const char *model, int64_t created,
                             const char *text, size_t len, const char *finish_reason,
                             const kl_usage *usage, struct cJSON *logprobs, char **json,
                             kl_err *err);

#endif
