/*
 * engine/tokenizer.h — Kimi's tiktoken tokenizer: byte-level BPE over tiktoken.model ranks, the
 * special tokens of tokenizer_config.json, Kimi's pre-tokenizer pattern, and a streaming
 * UTF-8-safe detokenizer.  Reference: tokenizer-and-api.md Part A (tokenization_kimi.py).
 *
 * Files (both read from one directory):
 *   tiktoken.model         one "base64(bytes) rank" line per regular token; ranks must be exactly
 *                          0..R-1 (no holes, no duplicates), every token distinct and non-empty,
 *                          and the 256 single bytes must all be tokens.  Empty lines are skipped.
 *   tokenizer_config.json  added_tokens_decoder {"ID": {"content": NAME, "special": BOOL}} for
 *                          ids R..R+255 (Kimi's num_reserved_special_tokens); ids it does not
 *                          name are "<|reserved_token_ID|>".  Vocabulary = R + 256 ids.
 *
 * Encoding = tokenization_kimi.py's encode(text) with allow_special_tokens=True:
 *   1. cut the text into 400,000-code-point chunks, then cut each chunk wherever a run of
 *      whitespace or of non-whitespace (Python str.isspace) would exceed 25,000 code points;
 *   2. each piece is encoded like tiktoken's encode(piece, allowed_special="all"): special-token
 *      text becomes its id; the text between specials is split by Kimi's pattern (PCRE2, JIT)
 *      and each regex piece is one token if it is one, else byte-pair merged by rank (lowest
 *      rank first, leftmost on ties).
 *   No BOS/EOS is added.  Input must be valid UTF-8 (Python strings cannot hold anything else).
 * Decoding = plain byte concatenation of the tokens' bytes (special ids give their name).
 *
 * Ownership: kl_tok_open returns a heap object the caller releases with kl_tok_close; id arrays
 * from kl_tok_encode and byte buffers from kl_tok_decode are kl_malloc'd and owned by the
 * caller (kl_free).  Strings returned by kl_tok_token_bytes / kl_tok_special_name are borrowed
 * until kl_tok_close.
 * Errors: KL_E_IO (file unreadable), KL_E_FORMAT (file breaks the rules; err->file names the
 * file, the message names the line, err->offset is the line's byte offset), KL_E_USAGE (input
 * not UTF-8, id out of range), KL_E_NOMEM.
 * Thread safety: after kl_tok_open the tokenizer is read-only; any number of threads may encode
 * and decode with it at once.  A kl_tok_stream belongs to one thread.
 */
#ifndef KL_ENGINE_TOKENIZER_H
#define KL_ENGINE_TOKENIZER_H

#include "common/err.h"
#include "engine/token.h"

#include <stddef.h>
#include <stdint.h>

#define KL_TOK_N_SPECIAL 256u              /* Kimi's num_reserved_special_tokens */
#define KL_TOK_MAX_ENCODE_CHARS 400000u    /* Kimi's TIKTOKEN_MAX_ENCODE_CHARS */
#define KL_TOK_MAX_RUN_CHARS 25000u        /* Kimi's MAX_NO_WHITESPACES_CHARS */

typedef struct kl_tokenizer kl_tokenizer;

/* ---- lifecycle ---- */

/* Loads dir/tiktoken.model and dir/tokenizer_config.json and compiles the pattern.
 * *out is owned by the caller (kl_tok_close).  KL_E_IO, KL_E_FORMAT, KL_E_NOMEM. */
int kl_tok_open(const char *dir, kl_tokenizer **out, kl_err *err);

/* Releases everything; NULL ok. */
void kl_tok_close(kl_tokenizer *tok);

/* ---- vocabulary ---- */

uint32_t kl_tok_n_vocab(const kl_tokenizer *tok);  /* regular + special ids */
uint32_t kl_tok_n_ranks(const kl_tokenizer *tok);  /* regular tokens = first special id */

/* Bytes of id (a special id gives its name); NULL if id >= n_vocab.  Borrowed. */
const uint8_t *kl_tok_token_bytes(const kl_tokenizer *tok, kl_token id, size_t *len);

/* Looks up a special token by name ("<|im_end|>"): 1 and *id set if found, 0 if not. */
int kl_tok_special_id(const kl_tokenizer *tok, const char *name, kl_token *id);

/* 1 if id is a special id whose tokenizer_config entry says "special": true (or an unnamed
 * reserved slot), 0 otherwise (regular tokens, Kimi's tool-call markers, ids out of range). */
int kl_tok_is_control(const kl_tokenizer *tok, kl_token id);

/* ---- encode / decode ---- */

/* Encodes n bytes of UTF-8 text.  *ids (kl_malloc'd, caller frees with kl_free; NULL when
 * *n_ids is 0) receives the ids.  KL_E_USAGE if text is not valid UTF-8 (err->offset is the
 * byte offset of the bad sequence), KL_E_NOMEM. */
int kl_tok_encode(const kl_tokenizer *tok, const char *text, size_t n, kl_token **ids,
                  size_t *n_ids, kl_err *err);

enum { KL_TOK_SKIP_CONTROL = 1 };          /* decode flag: leave out kl_tok_is_control ids */

/* Decodes ids into *out (kl_malloc'd, NUL-terminated for convenience; *len excludes the NUL).
 * The bytes may be invalid UTF-8 when the ids split a character.  KL_E_USAGE if an id is
 * >= n_vocab, KL_E_NOMEM. */
int kl_tok_decode(const kl_tokenizer *tok, const kl_token *ids, size_t n_ids, unsigned flags,
                  char **out, size_t *len, kl_err *err);

/* ---- streaming detokenizer ---- */

/* Turns ids into text one at a time without ever emitting part of a UTF-8 character: a trailing
 * prefix of a valid multi-byte sequence is held back until the next id completes it.  Bytes that
 * can never become valid UTF-8 are passed through unchanged, so the concatenation of everything
 * push and flush return equals kl_tok_decode of the same ids. */
typedef struct kl_tok_stream {
    const kl_tokenizer *tok;   /* borrowed */
    unsigned            flags; /* KL_TOK_SKIP_CONTROL or 0 */
    uint8_t            *buf;      /* [cap] text of the last call, then the held-back bytes */
    size_t              cap;      /* longest token + 4 */
    size_t              held_off; /* where the held-back bytes start in buf */
    size_t              held;     /* held-back bytes (at most 3) */
} kl_tok_stream;

/* Zeroes s and allocates its buffer.  0 or KL_E_NOMEM. */
int kl_tok_stream_init(kl_tok_stream *s, const kl_tokenizer *tok, unsigned flags, kl_err *err);

/* Appends id; *text and *len receive the bytes now safe to emit (borrowed, valid until the next
 * call on s; *len may be 0).  KL_E_USAGE if id >= n_vocab (the stream is unchanged). */
int kl_tok_stream_push(kl_tok_stream *s, kl_token id, const char **text, size_t *len,
                       kl_err *err);

/* Returns the held-back bytes (an incomplete character at the end of the output) and resets. */
void kl_tok_stream_flush(kl_tok_stream *s, const char **text, size_t *len);

/* Releases the buffer; safe on a zeroed or already freed stream. */
void kl_tok_stream_free(kl_tok_stream *s);

#endif
