/*
 * common/utf8.h — UTF-8 validity for text that came out of a model or a file.
 */
#ifndef KL_COMMON_UTF8_H
#define KL_COMMON_UTF8_H

#include <stddef.h>

/* Length (1..4) of the valid UTF-8 sequence at s[0..n), 0 if the bytes there are not one
 * (overlong forms, surrogates and code points above U+10FFFF are invalid). */
size_t kl_utf8_seq(const unsigned char *s, size_t n);

/* Copy of s[0..n) with every byte that is not part of valid UTF-8 (and every NUL) replaced by
 * U+FFFD; NUL-terminated, kl_malloc'd (caller kl_free's it); NULL when out of memory. */
char *kl_utf8_sanitize(const char *s, size_t n);

#endif
