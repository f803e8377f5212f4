/*
 * serve/request.h — an OpenAI chat-completions request body checked and turned into what the
 * engine takes: the messages as kl_chat_msg (engine/chat.h), the tools JSON, the sampling
 * options (engine/sampler.h) and the reply's limits and format.
 *
 * Accepted (tokenizer-and-api.md B3): model (string, required); messages (non-empty array of
 * {role: system | developer (as system) | user | assistant | tool, content: string, null, or an
 * array of {"type": "text", "text": ...} parts (joined), name, tool_calls (assistant: [{id,
 * type "function", function {name, arguments string}}]), tool_call_id (tool, required)});
 * tools (array of {"type": "function", "function": {"name", ...}}); tool_choice ("none",
 * "auto", "required", {"type": "function", "function": {"name"}} naming a declared tool: an
 * unknown name, or "required" / a name without tools, is a 400);
 * max_tokens / max_completion_tokens (>= 1; both: they must agree); temperature [0, 2];
 * top_p (0, 1]; top_k >= 0 and min_p [0, 1] (extensions); seed (an integer; negative ones are
 * taken modulo 2^64); stop (a string or up to 16 strings, none empty); n (only 1); stream;
 * stream_options.include_usage (with stream only); logprobs; top_logprobs 0..20 (with
 * logprobs); frequency_penalty / presence_penalty only 0; any other key is ignored, as the
 * OpenAI API ignores unknown ones.
 *
 * A refusal is an OpenAI error: HTTP status 400, type "invalid_request_error", the offending
 * parameter (e.g. "messages[2].tool_call_id") and a message saying what was wrong and what is
 * wanted.  The body must be valid UTF-8 JSON (common/json.h, the one strict reader).
 *
 * tool_choice is enforced, not advisory: "none" renders no tools (and the reply carries no
 * calls), "auto" lets the model choose, "required" starts the assistant's reply with the calls
 * section and a call's begin marker and makes the model choose one of the tools' call heads
 * (kl_req_tool_choice), a named function (or "required" with one tool) forces the whole call
 * head up to its arguments (kl_req_tool_prefix): the model can then only write a call.
 *
 * Ownership: *out owns everything it points to (kl_req_chat_free; safe on a zeroed struct).
 */
#ifndef KL_SERVE_REQUEST_H
#define KL_SERVE_REQUEST_H

#include "common/err.h"
#include "engine/chat.h"
#include "engine/sampler.h"

#include <stddef.h>
#include <stdint.h>

#define KL_REQ_MAX_STOP 16

/* An OpenAI error object's fields. */
typedef struct kl_api_error {
    int  status;               /* HTTP status: 400, 401, 404, 413, 429, 500, 503 */
    char type[32];             /* "invalid_request_error", ... */
    char param[96];            /* the offending parameter, "" if none */
    char message[512];
} kl_api_error;

typedef enum kl_tool_choice {
    KL_TOOL_AUTO = 0,          /* the default when tools are given */
    KL_TOOL_NONE,              /* the default without tools */
    KL_TOOL_REQUIRED,
    KL_TOOL_NAMED,             /* tool_choice_name */
} kl_tool_choice;

typedef struct kl_req_chat {
    char             *model;
    kl_chat_msg      *msgs;            /* [n_msgs] */
    size_t            n_msgs;
    char             *tools_json;      /* the tools array as JSON text, NULL without tools */
    size_t            n_tools;
    char            **tool_names;      /* [n_tools] the tools' names, in order */
    kl_tool_choice    tool_choice;
    char             *tool_choice_name;
    uint64_t          max_tokens;      /* 0: not given (up to the context) */
    kl_sampler_opts   samp;            /* temperature 1 and top_p 1 by default, as OpenAI */
    int               has_seed;
    char             *stop[KL_REQ_MAX_STOP];
    size_t            n_stop;
    int               stream, include_usage;
    char             *prompt;          /* a legacy completion's prompt (msgs NULL then) */
    int               logprobs;
    uint32_t          top_logprobs;
    /* storage the messages point into */
    kl_chat_tool_call *calls;          /* every message's tool calls */
    char             **strings;        /* every string owned */
    size_t            n_strings, cap_strings;
} kl_req_chat;

/* Parses and checks body[0..len) into *out (zeroed first).  0 on success; otherwise the
 * OpenAI error in *e and KL_E_USAGE (or KL_E_NOMEM with status 500). */
int  kl_req_chat_parse(const char *body, size_t len, kl_req_chat *out, kl_api_error *e);
/* A legacy completions body (POST /v1/completions) into the same struct: model, prompt (a
 * string or an array of one string), the limits (max_tokens default 16), sampling, stop,
 * n, stream and stream_options as for chat; logprobs (null, false, or an integer 0..20: the
 * alternatives per token; sets logprobs and top_logprobs); echo, suffix and best_of > 1 are
 * refused (400: not supported). */
int  kl_req_completion_parse(const char *body, size_t len, kl_req_chat *out, kl_api_error *e);
void kl_req_chat_free(kl_req_chat *r);

/* 1 when the reply is parsed for tool calls and the tools are rendered into the prompt: a chat
 * request with tools whose tool_choice is not "none". */
int  kl_req_tools_on(const kl_req_chat *r);
/* The start of the assistant's reply that tool_choice forces, appended to the prompt after the
 * generation prompt: "required" with several tools -> <|tool_calls_section_begin|>
 * <|tool_call_begin|> (the call's head then comes from kl_req_tool_choice); a named function,
 * or "required" with one tool -> that and functions.NAME:IDX<|tool_call_argument_begin|>, IDX
 * counting the conversation's earlier calls as the chat template does.  *out is kl_malloc'd
 * (caller frees) or NULL when nothing is forced.  0 or KL_E_NOMEM. */
int  kl_req_tool_prefix(const kl_req_chat *r, char **out, kl_err *err);
/* "required" with several tools: how the reply must go on after its prefix, one way per tool
 * (n_tools; 0 otherwise).  Way k is functions.NAME_k:IDX<|tool_call_argument_begin|>: the
 * server makes the model choose among them (serve/sched.h's forced choice), so a forced call
 * always carries a well-formed id and a declared name, whatever the model would write. */
size_t kl_req_tool_choices(const kl_req_chat *r);
/* Way k (< kl_req_tool_choices) as text into *out (kl_malloc'd, caller frees); KL_E_NOMEM. */
int  kl_req_tool_choice(const kl_req_chat *r, size_t k, char **out, kl_err *err);

/* Fills e (status, type, param, printf message); returns KL_E_USAGE, or KL_E_NOMEM for 500. */
int  kl_api_fail(kl_api_error *e, int status, const char *type, const char *param,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#endif
