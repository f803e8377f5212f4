/* common/clock.c — the age of this process (see clock.h). */
#include "common/clock.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

double kl_process_age_s(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* fields after the command name (which may hold spaces) start past its last ')';
     * starttime is field 22, the 20th after it */
    const char *p = strrchr(buf, ')');
    unsigned long long start = 0;
    if (!p)
        return -1;
    for (int field = 3; field <= 22 && p; field++) {
        p = strchr(p + 1, ' ');
        if (p && field == 22 && sscanf(p + 1, "%llu", &start) != 1)
            return -1;
    }
    long hz = sysconf(_SC_CLK_TCK);
    struct timespec ts;
    if (!p || hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &ts))
        return -1;
    double now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    return now - (double)start / (double)hz;
}
