/* common/err.c — kl_err helpers (see err.h). */
#include "common/err.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kl_err_clear(kl_err *err)
{
    if (!err)
        return;
    memset(err, 0, sizeof *err);
    err->offset = KL_NO_OFFSET;
}

void kl_copy_text(char *dst, size_t n, const char *src)
{
    if (!n)
        return;
    size_t len = strlen(src);
    if (len >= n) {
        /* Cut before a UTF-8 continuation byte run so the copy stays valid UTF-8 (names end
         * up in JSON output, which strict decoders reject otherwise). */
        len = n - 1;
        while (len && ((unsigned char)src[len] & 0xC0) == 0x80)
            len--;
    }
    memcpy(dst, src, len);
    dst[len] = 0;
}

static void set_text(char *dst, size_t n, const char *src)
{
    if (src && !dst[0])
        kl_copy_text(dst, n, src);
}

/* Copies src into dst (size n) with control bytes escaped (\n, \t, \r, \xNN), cutting only
 * between whole escapes.  Messages and names often carry text from files (tensor names,
 * JSON keys): unescaped, a newline would break the one-line format and an ESC byte would reach
 * the user's terminal. */
void kl_escape_controls(char *dst, size_t n, const char *src)
{
    size_t used = 0;
    for (; *src; src++) {
        unsigned char c = (unsigned char)*src;
        char esc[5];
        if (c == '\n' || c == '\t' || c == '\r')
            snprintf(esc, sizeof esc, "\\%c", c == '\n' ? 'n' : c == '\t' ? 't' : 'r');
        else if (c < 0x20 || c == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", c);
        else
            esc[0] = (char)c, esc[1] = 0;
        size_t k = strlen(esc);
        if (used + k >= n) {
            /* do not leave half a UTF-8 character behind */
            if ((c & 0xC0) == 0x80) {
                while (used && ((unsigned char)dst[used - 1] & 0xC0) == 0x80)
                    used--;
                if (used && ((unsigned char)dst[used - 1] & 0xC0) == 0xC0)
                    used--;
            }
            break;
        }
        memcpy(dst + used, esc, k);
        used += k;
    }
    dst[used] = 0;
}

static int record(kl_err *err, int code, int sys_errno, const char *rule, const char *fmt,
                  va_list ap)
{
    if (!err || err->code)
        return code;
    /* A fresh kl_err might not have been cleared; keep the caller's context fields only if
     * they were set on purpose (kl_err_context before kl_fail is not a supported order). */
    err->code = code;
    err->sys_errno = sys_errno;
    if (rule)
        set_text(err->rule, sizeof err->rule, rule);
    char raw[sizeof err->msg];
    vsnprintf(raw, sizeof raw, fmt, ap);
    kl_escape_controls(err->msg, sizeof err->msg, raw);
    return code;
}

int kl_fail(kl_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(err, code, 0, NULL, fmt, ap);
    va_end(ap);
    return code;
}

int kl_fail_rule(kl_err *err, int code, const char *rule, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(err, code, 0, rule, fmt, ap);
    va_end(ap);
    return code;
}

int kl_fail_sys(kl_err *err, int code, int sys_errno, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(err, code, sys_errno, NULL, fmt, ap);
    va_end(ap);
    return code;
}

int kl_fail_at(kl_err *err, int code, const char *rule, const char *tensor, uint64_t offset,
               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(err, code, 0, rule, fmt, ap);
    va_end(ap);
    kl_err_context(err, NULL, tensor, offset, NULL);
    return code;
}

void kl_err_context(kl_err *err, const char *file, const char *tensor, uint64_t offset,
                    const char *rule)
{
    if (!err)
        return;
    set_text(err->file, sizeof err->file, file);
    set_text(err->tensor, sizeof err->tensor, tensor);
    set_text(err->rule, sizeof err->rule, rule);
    if (offset != KL_NO_OFFSET && err->offset == KL_NO_OFFSET)
        err->offset = offset;
}

char *kl_err_format(const kl_err *err, char *buf, size_t n)
{
    size_t used = 0;
    if (!n)
        return buf;
    buf[0] = 0;
#define PUT(...)                                                                              \
    do {                                                                                      \
        int k_ = snprintf(buf + used, n - used, __VA_ARGS__);                                 \
        if (k_ > 0)                                                                           \
            used = (size_t)k_ >= n - used ? n - 1 : used + (size_t)k_;                        \
    } while (0)
    /* file and tensor are stored raw (JSON output escapes them itself); escape for text. */
    char safe[4 * sizeof err->file];
    if (err->file[0]) {
        kl_escape_controls(safe, sizeof safe, err->file);
        PUT("%s: ", safe);
    }
    if (err->tensor[0]) {
        kl_escape_controls(safe, sizeof safe, err->tensor);
        PUT("tensor %s", safe);
    }
    if (err->offset != KL_NO_OFFSET)
        PUT("%s@ %" PRIu64, err->tensor[0] ? " " : "", err->offset);
    if (err->tensor[0] || err->offset != KL_NO_OFFSET)
        PUT(": ");
    if (err->rule[0])
        PUT("[%s] ", err->rule);
    PUT("%s", err->msg[0] ? err->msg : kl_err_code_name(err->code));
    if (err->sys_errno > 0)
        PUT(" (%s)", strerror(err->sys_errno));
#undef PUT
    return buf;
}

const char *kl_err_code_name(int code)
{
    switch (code) {
    case KL_OK: return "ok";
    case KL_E_IO: return "io";
    case KL_E_FORMAT: return "format";
    case KL_E_SCHEMA: return "schema";
    case KL_E_NOMEM: return "out of memory";
    case KL_E_USAGE: return "usage";
    case KL_E_UNSUPPORTED: return "unsupported";
    case KL_E_GPU: return "gpu";
    case KL_E_CANCELLED: return "cancelled";
    case KL_E_BUG: return "internal bug";
    default: return "unknown error";
    }
}

void kl_bug(const char *file, int line, const char *msg)
{
    fprintf(stderr, "kl: internal bug at %s:%d: %s\n", file, line, msg);
    abort();
}
