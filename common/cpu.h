/*
 * common/cpu.h — what the CPU offers this process: how many cores, which vector extensions.
 *
 * kl_cpu_count: the usable CPUs, those this process may run on (its affinity mask, as taskset,
 * cgroup cpusets and container runtimes set it), else the online CPUs, else 1; then at most cap
 * (0: no cap).  Never 0.  Each caller passes the cap of its own pool.
 * kl_cpu_has_avx2_fma: 1 when the CPU (x86-64, GCC or clang build) supports AVX2 and FMA, the
 * extensions of every AVX2 path in kl; 0 elsewhere.  It does not read KL_CPU_KERNELS: the
 * engine's kernel choice (engine/matvec.h) applies that override on top.
 * Both are thread-safe.
 */
#ifndef KL_COMMON_CPU_H
#define KL_COMMON_CPU_H

unsigned kl_cpu_count(unsigned cap);
int kl_cpu_has_avx2_fma(void);

#endif
