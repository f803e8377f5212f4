/*
 * engine/chat.h — Kimi's chat format: rendering a message list (with optional tool declarations)
 * into the prompt text, parsing tool calls out of model output, and the stop-token list.
 * Reference: kimi-linear.md §4.3 (the transformers test vector) and tokenizer-and-api.md B4.
 *
 * Rendering (Kimi-Linear's template; no BOS, no default system prompt, nothing between turns):
 *   tools      <|im_system|>tool_declare<|im_middle|>{tools JSON}<|im_end|>      (first, if any)
 *   system     <|im_system|>{name or "system"}<|im_middle|>{content}<|im_end|>
 *   user       <|im_user|>{name or "user"}<|im_middle|>{content}<|im_end|>
 *   assistant  <|im_assistant|>{name or "assistant"}<|im_middle|>{content}[calls]<|im_end|>
 *              calls = <|tool_calls_section_begin|> then per call
 *                      <|tool_call_begin|>{id}<|tool_call_argument_begin|>{arguments}
 *                      <|tool_call_end|>
 *                      then <|tool_calls_section_end|>; id defaults to functions.{name}:{i}, i
 *                      counting calls across the whole conversation from 0; arguments verbatim.
 *   tool       <|im_system|>{name or "tool"}<|im_middle|>## Return of {tool_call_id}\n{content}
 *              <|im_end|>
 *   generation prompt  <|im_assistant|>assistant<|im_middle|>
 * The tools JSON (an array; "[]" or NULL = no tools turn) is re-serialised the way Kimi's
 * transformers path does it: keys sorted recursively (tokenization_kimi.py deep_sort_dict), then
 * compact separators (kimi-linear.md §4.3), non-ASCII kept as UTF-8 (transformers' tojson uses
 * ensure_ascii=False).  Strings are re-escaped as Python's json.dumps does; numbers are copied
 * as written.  kl_chat_opts selects the other variants tokenizer-and-api.md B4 lists.
 * Special-token text inside contents is copied as is (the tokenizer will recognise it).
 *
 * Ownership: messages are borrowed for the call.  *out (kl_malloc'd, NUL-terminated) is owned
 * by the caller (kl_free).  A kl_chat_parsed owns one buffer all its strings point into;
 * release with kl_chat_parsed_free.
 * Errors: KL_E_USAGE (unknown role, tool message without tool_call_id, tool calls on a message
 * that is not the assistant's, a call without name or arguments, tools JSON that is not a JSON
 * array), KL_E_NOMEM; stop ids: KL_E_FORMAT when the tokenizer has no <|im_end|>.
 * Thread safety: no shared state; any number of threads may call these at once.
 */
#ifndef KL_ENGINE_CHAT_H
#define KL_ENGINE_CHAT_H

#include "common/err.h"
#include "engine/token.h"
#include "engine/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* One tool call of an assistant message (all borrowed). */
typedef struct kl_chat_tool_call {
    const char *id;        /* e.g. "functions.get_weather:0"; NULL = functions.{name}:{index} */
    const char *name;      /* function name, required */
    const char *arguments; /* JSON text, printed verbatim, required */
} kl_chat_tool_call;

/* One message (all borrowed). */
typedef struct kl_chat_msg {
    const char              *role;         /* "system" | "user" | "assistant" | "tool" */
    const char              *content;      /* NULL = "" */
    const char              *name;         /* replaces the role name when non-NULL */
    const kl_chat_tool_call *tool_calls;   /* [n_tool_calls], assistant only */
    size_t                   n_tool_calls;
    const char              *tool_call_id; /* tool messages: required */
} kl_chat_msg;

/* How the tools JSON is written (tokenizer-and-api.md B4 lists the template variants). */
enum {
    KL_CHAT_JSON_COMPACT = 0, /* separators (',', ':') — Kimi-Linear (kimi-linear.md §4.3) */
    KL_CHAT_JSON_PYTHON = 1,  /* json.dumps default (', ', ': ') — `tools | tojson` templates */
    KL_CHAT_JSON_VERBATIM = 2 /* the caller's text unchanged (still checked to be an array) */
};

typedef struct kl_chat_opts {
    int tools_json;    /* KL_CHAT_JSON_* */
    int no_sort_keys;  /* 1 = keep the caller's key order (Jinja-only renderers) */
} kl_chat_opts;

/* ---- rendering ---- */

/* Renders msgs[0..n) (n may be 0) with Kimi-Linear's defaults (compact, sorted tools JSON).
 * tools_json may be NULL.  add_generation_prompt appends <|im_assistant|>assistant<|im_middle|>. */
int kl_chat_render(const kl_chat_msg *msgs, size_t n, const char *tools_json,
                   int add_generation_prompt, char **out, kl_err *err);

/* As kl_chat_render with explicit options (opts NULL = defaults). */
int kl_chat_render_opts(const kl_chat_msg *msgs, size_t n, const char *tools_json,
                        int add_generation_prompt, const kl_chat_opts *opts, char **out,
                        kl_err *err);

/* ---- parsing model output ---- */

/* Result of kl_chat_parse_tool_calls: every string points into buf. */
typedef struct kl_chat_parsed {
    const char        *content;  /* text before the calls section; NULL when empty */
    kl_chat_tool_call *calls;    /* [n_calls]: id = the model's id, name from it, raw arguments */
    size_t             n_calls;
    int                tools_called; /* 1 if a section-begin marker was seen */
    char              *buf;      /* owned storage */
} kl_chat_parsed;

/* Splits model output (len bytes; special-token text included) as vLLM's kimi_k2 parser does:
 * without <|tool_calls_section_begin|> (or the singular <|tool_call_section_begin|>) the whole
 * text is content and there are no calls.  Otherwise content = the text before the first such
 * marker, and each match of
 *   <|tool_call_begin|>\s*ID<|...|>  with ID = [^<]+:\d+ ,  \s*ARGS\s*<|tool_call_end|>
 * (ARGS not containing <|tool_call_begin|>) anywhere in the text is a call; name =
 * ID.split(":")[0].split(".")[-1].  *out is zeroed first; free it with kl_chat_parsed_free.
 * KL_E_NOMEM only. */
int kl_chat_parse_tool_calls(const char *text, size_t len, kl_chat_parsed *out, kl_err *err);

/* Releases p's storage and zeroes it; safe on a zeroed struct. */
void kl_chat_parsed_free(kl_chat_parsed *p);

/* ---- stopping ---- */

#define KL_CHAT_MAX_STOP 3u

/* Writes the stop ids of tok into ids[0..*n): <|im_end|> first (required, KL_E_FORMAT if the
 * tokenizer lacks it), then [EOS] and [EOT] where the tokenizer names them.  ids has room for
 * KL_CHAT_MAX_STOP entries. */
int kl_chat_stop_ids(const kl_tokenizer *tok, kl_token ids[KL_CHAT_MAX_STOP], size_t *n,
                     kl_err *err);

#endif
