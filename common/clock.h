/* common/clock.h — monotonic wall-clock seconds. */
#ifndef KL_COMMON_CLOCK_H
#define KL_COMMON_CLOCK_H

#include <time.h>

static inline double kl_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
