/*
 * engine/toolstream.h — Kimi tool calls parsed from a reply as it streams (the server's
 * streamed tool-call deltas; kl_chat_parse_tool_calls in engine/chat.h parses a whole reply).
 *
 * The reply's text arrives in pieces of any size (detokenized ids, the markers included as
 * text: they are special:false tokens).  The parser turns it into events:
 *   CONTENT     text before the calls section, never any part of a marker: a piece that may
 *               start a marker is held until the next piece decides;
 *   CALL_BEGIN  a call's id is complete: index (0, 1, ...), id (the model's, trimmed), name
 *               (id.split(":")[0].split(".")[-1]);
 *   ARGS        argument text of the current call, in order (leading and trailing blanks
 *               dropped, as the whole-reply parser's \s* does);
 *   CALL_END    the call is over: ok 1 when <|tool_call_end|> closed it, 0 when it was cut off
 *               (another <|tool_call_begin|>, the section's end, or the end of the reply).
 * Grammar (vLLM's kimi_k2 parser): content, then <|tool_calls_section_begin|> (or the singular
 * <|tool_call_section_begin|>), then calls <|tool_call_begin|> ID <|tool_call_argument_begin|>
 * ARGS <|tool_call_end|>, then <|tool_calls_section_end|> (or singular); text between calls
 * and after the section is dropped.  An ID that is not NAME:DIGITS (after trimming blanks, NAME
 * without '<') makes the call malformed: no event at all for it, its text skipped up to its end.
 * Once the section has begun, raw marker text never reaches an event.
 *
 * Errors: KL_E_NOMEM, and whatever the callback returns (it stops the parse).  Ownership: the
 * parser owns its buffers until kl_toolstream_free; event strings are valid during the call.
 */
#ifndef KL_ENGINE_TOOLSTREAM_H
#define KL_ENGINE_TOOLSTREAM_H

#include "common/err.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kl_ts_kind {
    KL_TS_CONTENT = 0,
    KL_TS_CALL_BEGIN,
    KL_TS_ARGS,
    KL_TS_CALL_END,
} kl_ts_kind;

typedef struct kl_ts_event {
    kl_ts_kind  kind;
    uint32_t    index;      /* the call's index (CALL_*, ARGS) */
    const char *id, *name;  /* CALL_BEGIN: NUL-terminated */
    const char *text;       /* CONTENT, ARGS: len bytes (not NUL-terminated) */
    size_t      len;
    int         ok;         /* CALL_END: closed by its end marker */
} kl_ts_event;

/* 0 to go on, or an error code (set in err) to stop. */
typedef int (*kl_ts_emit_fn)(void *user, const kl_ts_event *ev, kl_err *err);

typedef struct kl_toolstream {
    kl_ts_emit_fn emit;
    void         *user;
    int           state;        /* where in the grammar (toolstream.c) */
    char         *pend;         /* bytes not yet decided */
    size_t        n_pend, cap_pend;
    char         *id;           /* the current call's id so far */
    size_t        n_id, cap_id;
    size_t        n_blank;      /* ARGS: blanks held at the end of pend (maybe trailing) */
    int           args_started; /* ARGS: a non-blank byte was emitted */
    uint32_t      n_calls;      /* calls begun */
    int           section_seen; /* a section-begin marker was seen */
} kl_toolstream;

/* A parser reporting through emit(user, ...). */
void kl_toolstream_init(kl_toolstream *ts, kl_ts_emit_fn emit, void *user);
/* The next piece of the reply. */
int  kl_toolstream_feed(kl_toolstream *ts, const char *text, size_t len, kl_err *err);
/* The reply is over: held content is emitted, a call still open ends with ok 0. */
int  kl_toolstream_finish(kl_toolstream *ts, kl_err *err);
void kl_toolstream_free(kl_toolstream *ts);   /* safe on a zeroed struct */

#endif
