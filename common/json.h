/*
 * common/json.h — the one strict JSON reader of kl.
 *
 * Every JSON text kl reads (safetensors headers, model.safetensors.index.json, config.json,
 * tokenizer_config.json, the converter's copy of config.json, the tools JSON of a chat) goes
 * through kl_json_parse, which accepts exactly RFC 8259 JSON: one value with only JSON
 * whitespace around it, valid UTF-8 (no byte-order mark, no NUL byte, no escaped NUL since kl
 * keeps strings as C strings), no raw control characters, numbers by the strict grammar ("01",
 * "1.", ".5", "-" refused).  cJSON alone would skip a BOM, stop after the first value and
 * take any bytes inside strings.
 *
 * cJSON keeps numbers as doubles, which cannot tell 64 from 64.0 or 6.4e1.  kl_json_parse
 * therefore stores the source text of every number in the node's valuestring (unused by cJSON
 * for numbers and freed by cJSON_Delete), and kl_json_get_u64 reads integers from that text:
 * exact to 2^64-1, and 64.0, 6.4e1, -0 are not integers.  Everything here is thread-safe except
 * that cJSON records its last parse error in a process-wide variable, which kl never reads.
 */
#ifndef KL_COMMON_JSON_H
#define KL_COMMON_JSON_H

#include "common/err.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Parses text[0..len) into *out (owned: cJSON_Delete).  rules is the rule prefix of the file
 * kind ("ST", "IDX", "CFG", "TOK"): invalid UTF-8 fails with rule "<rules>-UTF8", anything else
 * with "<rules>-JSON"; kl_err.offset is the byte offset in text (the caller shifts it when text
 * starts later in its file) and the message names the line when the text has several.  Returns
 * 0, KL_E_FORMAT, or KL_E_NOMEM; *out is written only on success.  text may be NULL when len
 * is 0.  The root may be any JSON value: callers check its type. */
int kl_json_parse(const char *text, size_t len, const char *rules, cJSON **out, kl_err *err);

/* Result of reading an integer. */
typedef enum kl_json_int {
    KL_JSON_INT_OK = 0,
    KL_JSON_INT_NOT_NUMBER,  /* not a JSON number (string, null, array, ...) */
    KL_JSON_INT_NOT_INTEGER, /* a fraction or exponent in the source: 64.0, 6.4e1, 1.5 */
    KL_JSON_INT_NEGATIVE,    /* -1, -0 */
    KL_JSON_INT_TOO_LARGE,   /* above the caller's max */
} kl_json_int;

/* Reads v as an integer in 0..max into *out (written only on KL_JSON_INT_OK).  v should come
 * from kl_json_parse; a number built in memory is read as if written with "%.17g".  NULL v is
 * KL_JSON_INT_NOT_NUMBER.  Cannot fail otherwise. */
kl_json_int kl_json_get_u64(const cJSON *v, uint64_t max, uint64_t *out);

/* Why a read failed, for messages: "is not a number", "is not an integer (it is written with a
 * fraction or an exponent)", "is negative", "is too large"; "" for KL_JSON_INT_OK.  Static. */
const char *kl_json_int_why(kl_json_int r);

/* The source text of number v as written in the parsed file ("64.0"), or NULL when v is not a
 * number from kl_json_parse.  Borrowed: valid until the tree is deleted. */
const char *kl_json_number_text(const cJSON *v);

/* ---- the plain subset, scanned without a tree ------------------------------------------------
 * Machine-written headers and indexes (safetensors headers, model.safetensors.index.json) use a
 * plain subset of JSON: strings of printable ASCII without escapes, non-negative integers.  A
 * kl_json_scan reads such text token by token, straight into the caller's tables, about ten
 * times faster than a tree.  Each function skips JSON whitespace first and returns 1 when it
 * read what was asked, 0 when the text is anything else (other bytes, an escape, a non-ASCII
 * byte, a fraction): the caller then gives up and parses with kl_json_parse, which accepts or
 * reports exactly.  Whatever the scanner accepts kl_json_parse accepts with the same values. */
typedef struct kl_json_scan {
    const char *p, *end;      /* next byte to read, end of the text */
} kl_json_scan;

/* Consumes the character c. */
int kl_json_scan_char(kl_json_scan *s, char c);
/* Consumes a plain string: *at points at its first byte (in the text), *len bytes long. */
int kl_json_scan_str(kl_json_scan *s, const char **at, size_t *len);
/* Consumes an integer written as digits only ("0" or no leading zero) and at most max. */
int kl_json_scan_u64(kl_json_scan *s, uint64_t max, uint64_t *out);
/* A whole object or array: the character open, then each member or element read by
 * item(ctx, s) (1: read, 0: decline), commas between them, then close.  1 when all was read
 * (an empty one too), 0 when anything declined. */
typedef int (*kl_json_scan_item_fn)(void *ctx, kl_json_scan *s);
int kl_json_scan_list(kl_json_scan *s, char open, char close, kl_json_scan_item_fn item,
                      void *ctx);
/* 1 when only whitespace is left. */
int kl_json_scan_at_end(kl_json_scan *s);

#endif
