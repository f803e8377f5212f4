/* common/clock.h — monotonic wall-clock seconds, and the age of this process. */
#ifndef KL_COMMON_CLOCK_H
#define KL_COMMON_CLOCK_H

#include <time.h>

static inline double kl_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds since this process started (the kernel's start time in /proc/self/stat against
 * CLOCK_BOOTTIME, to a clock tick: 10 ms), or -1 when it cannot be read.  For "time to first
 * token from process start". */
double kl_process_age_s(void);

#endif
