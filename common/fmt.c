/* common/fmt.c — numbers for people (see fmt.h). */
#include "common/fmt.h"

#include <stdio.h>

char *kl_fmt_bytes(char *buf, size_t n, uint64_t bytes)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, n, v < 10 ? "%.2f %s" : "%.1f %s", v, unit[u]);
    return buf;
}
