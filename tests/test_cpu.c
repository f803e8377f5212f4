/*
 * tests/test_cpu.c — common/cpu: the CPU count follows the affinity mask and the caller's cap;
 * the AVX2/FMA probe is what the CPU says and ignores KL_CPU_KERNELS, which only the engine's
 * kernel choice applies.
 */
#include "common/cpu.h"
#include "engine/matvec.h"
#include "tests/testutil.h"

#include <sched.h>
#include <sys/wait.h>

/* The CPUs of this process's affinity mask, lowest first; returns how many (at most max). */
static int allowed_cpus(int *cpus, int max)
{
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof set, &set), 0);
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    return n;
}

/* kl_cpu_count(cap) in a child restricted to the first k allowed CPUs (the test's own mask is
 * left alone); returns the child's answer. */
static unsigned count_in_child(int k, unsigned cap)
{
    int cpus[CPU_SETSIZE];
    ck_assert_int_ge(allowed_cpus(cpus, CPU_SETSIZE), k);
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int i = 0; i < k; i++)
            CPU_SET(cpus[i], &set);
        unsigned got = 0;
        if (sched_setaffinity(0, sizeof set, &set) == 0)
            got = kl_cpu_count(cap);
        _exit(write(fd[1], &got, sizeof got) == (ssize_t)sizeof got ? 0 : 1);
    }
    close(fd[1]);
    unsigned got = 0;
    ssize_t r = read(fd[0], &got, sizeof got);
    close(fd[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(r == (ssize_t)sizeof got && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "child did not report");
    ck_assert_msg(got != 0, "sched_setaffinity to %d CPUs failed in the child", k);
    return got;
}

START_TEST(count_follows_the_affinity_mask)
{
    /* online CPUs would give the machine's count here, not the process's */
    ck_assert_uint_eq(count_in_child(1, 0), 1);
    int cpus[CPU_SETSIZE];
    if (allowed_cpus(cpus, CPU_SETSIZE) >= 2) {
        ck_assert_uint_eq(count_in_child(2, 0), 2);
        ck_assert_uint_eq(count_in_child(2, 64), 2);
    } else {
        fprintf(stderr, "note: one CPU allowed here: the two-CPU mask is not checked\n");
    }
}
END_TEST

START_TEST(count_is_the_whole_mask_capped_and_never_zero)
{
    int cpus[CPU_SETSIZE];
    unsigned n = (unsigned)allowed_cpus(cpus, CPU_SETSIZE);
    ck_assert_uint_eq(kl_cpu_count(0), n);
    ck_assert_uint_eq(kl_cpu_count(n + 5), n);
    ck_assert_uint_eq(kl_cpu_count(1), 1);
    if (n >= 2)
        ck_assert_uint_eq(count_in_child((int)n, n - 1), n - 1);
}
END_TEST

START_TEST(avx2_probe_is_the_cpu_and_ignores_the_kernel_override)
{
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    int want = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    int want = 0;
#endif
    ck_assert_int_eq(kl_cpu_has_avx2_fma(), want);
    setenv("KL_CPU_KERNELS", "scalar", 1);
    ck_assert_int_eq(kl_cpu_has_avx2_fma(), want);
    /* the engine applies the override on top of the probe, as before */
    ck_assert_int_eq(kl_matvec_set_kernels(KL_KERNELS_AUTO), KL_KERNELS_SCALAR);
    unsetenv("KL_CPU_KERNELS");
    ck_assert_int_eq(kl_matvec_set_kernels(KL_KERNELS_AUTO),
                     want ? KL_KERNELS_AVX2 : KL_KERNELS_SCALAR);
    ck_assert_int_eq(kl_matvec_set_kernels(KL_KERNELS_AVX2),
                     want ? KL_KERNELS_AVX2 : KL_KERNELS_SCALAR);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cpu");
    TCase *tc = tcase_create("cpu");
    tcase_add_test(tc, count_follows_the_affinity_mask);
    tcase_add_test(tc, count_is_the_whole_mask_capped_and_never_zero);
    tcase_add_test(tc, avx2_probe_is_the_cpu_and_ignores_the_kernel_override);
    suite_add_tcase(s, tc);
    return t_run_suite(s);
}
