/*
 * common/err.h — error values and the error record every library call fills.
 *
 * Contract: a library function returns 0 (or a count >= 0) on success and a negative KL_E_* code
 * on failure.  Details go into a caller-provided kl_err (may be NULL).  The layer that detects a
 * problem sets code + msg with kl_fail(); outer layers add file / tensor / offset / rule with
 * kl_err_context(), which only fills fields that are still empty, so the first error is never
 * overwritten and context accumulates on the way up.
 * Thread safety: a kl_err belongs to one thread.
 */
#ifndef KL_COMMON_ERR_H
#define KL_COMMON_ERR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    KL_OK = 0,
    KL_E_IO = -1,          /* a system call failed (errno in sys_errno) */
    KL_E_FORMAT = -2,      /* a file breaks its format's rules */
    KL_E_SCHEMA = -3,      /* a file is well-formed but does not match the model schema */
    KL_E_NOMEM = -4,       /* allocation failed */
    KL_E_USAGE = -5,       /* bad arguments from the caller or the command line */
    KL_E_UNSUPPORTED = -6, /* valid but not handled (unknown model family, dtype, backend) */
    KL_E_GPU = -7,         /* GPU runtime error */
    KL_E_CANCELLED = -8,   /* a callback asked to stop */
    KL_E_BUG = -9,         /* broken internal invariant */
};

#define KL_NO_OFFSET UINT64_MAX

typedef struct kl_err {
    int      code;         /* KL_E_*, 0 if no error recorded */
    int      sys_errno;    /* errno or GPU runtime status, 0 if none */
    char     file[256];    /* shard or config path, "" if none */
    char     tensor[192];  /* tensor name, "" if none */
    uint64_t offset;       /* byte offset in file, KL_NO_OFFSET if none */
    char     rule[32];     /* rule id such as "ST-OFFSET-GAP", "" if none */
    char     msg[320];     /* one sentence, no newline */
} kl_err;

#if defined(__GNUC__)
#define KL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KL_PRINTF(a, b)
#endif

/* Resets err to "no error" (offset = KL_NO_OFFSET).  err may be NULL. */
void kl_err_clear(kl_err *err);

/* Records code + formatted message unless an error is already recorded; returns code.
 * err may be NULL (then only code is returned). */
int kl_fail(kl_err *err, int code, const char *fmt, ...) KL_PRINTF(3, 4);

/* As kl_fail with a rule id and the errno / runtime status to keep. */
int kl_fail_rule(kl_err *err, int code, const char *rule, const char *fmt, ...) KL_PRINTF(4, 5);
int kl_fail_sys(kl_err *err, int code, int sys_errno, const char *fmt, ...) KL_PRINTF(4, 5);

/* As kl_fail_rule, also recording the tensor (may be NULL) and byte offset (KL_NO_OFFSET if
 * none) of the failure: the form parsers use. */
int kl_fail_at(kl_err *err, int code, const char *rule, const char *tensor, uint64_t offset,
               const char *fmt, ...) KL_PRINTF(6, 7);

/* Adds context to an already recorded error: each non-NULL / non-KL_NO_OFFSET argument is
 * stored only if that field is still empty.  No-op when err is NULL. */
void kl_err_context(kl_err *err, const char *file, const char *tensor, uint64_t offset,
                    const char *rule);

/* Renders "FILE: tensor NAME @ OFFSET: [RULE] message (strerror)" into buf; returns buf. */
char *kl_err_format(const kl_err *err, char *buf, size_t n);

/* Copies src into dst (size n), truncating at a UTF-8 character boundary. */
void kl_copy_text(char *dst, size_t n, const char *src);

/* Copies src into dst (size n) with control bytes escaped (\n, \t, \r, \xNN), so text from
 * files cannot break one-line output or reach a terminal as escape sequences. */
void kl_escape_controls(char *dst, size_t n, const char *src);

/* Name of a KL_E_* code ("io", "format", ...). */
const char *kl_err_code_name(int code);

/* Reports file/line and aborts: only for states our own code cannot reach. */
#define KL_BUG(msg) kl_bug(__FILE__, __LINE__, (msg))
#ifdef __cplusplus /* GPU sources (kernels/) include this header as C++ */
[[noreturn]] void kl_bug(const char *file, int line, const char *msg);
#else
_Noreturn void kl_bug(const char *file, int line, const char *msg);
#endif

#ifdef __cplusplus
}
#endif

#endif
