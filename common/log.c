/* common/log.c — leveled logging (see log.h). */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>

static kl_log_level current = KL_LOG_WARN;

void kl_log_set_level(kl_log_level level) { current = level; }
kl_log_level kl_log_get_level(void) { return current; }

void kl_log(kl_log_level level, const char *fmt, ...)
{
    static const char *const prefix[] = {"error", "warning", "info", "debug"};
    if (level > current)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kl: %s: %s\n", prefix[level], line);
}
