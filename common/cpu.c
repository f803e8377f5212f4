/* common/cpu.c — CPU count and vector-extension probe (see cpu.h). */
#include "common/cpu.h"

#include <sched.h>
#include <unistd.h>

unsigned kl_cpu_count(unsigned cap)
{
    long n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    if (n < 1) /* more CPUs than a cpu_set_t holds, or no affinity call */
        n = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned u = n > 0 ? (unsigned)n : 1;
    return cap && u > cap ? cap : u;
}

int kl_cpu_has_avx2_fma(void)
{
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}
