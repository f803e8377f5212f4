/*
 * tests/testutil.h — helpers shared by the Check suites: temporary directories and files.
 * Header-only so each test binary stays one file.
 */
#ifndef KL_TESTS_TESTUTIL_H
#define KL_TESTS_TESTUTIL_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Creates a fresh directory under $TMPDIR (or /tmp); writes its path into buf. */
static inline void t_mkdtemp(char *buf, size_t n)
{
    const char *base = getenv("TMPDIR");
    snprintf(buf, n, "%s/kl-test-XXXXXX", base && *base ? base : "/tmp");
    ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp(%s) failed", buf);
}

/* rm -rf path (test scratch only). */
static inline void t_rmrf(const char *path)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", path);
}

static inline void t_write(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    ck_assert_msg(fwrite(data, 1, n, f) == n, "short write to %s", path);
    fclose(f);
}

/* The whole file at path, NUL-terminated (malloc'd: free it); *len its size when len is not
 * NULL.  Fails the test when the file cannot be read. */
static inline char *t_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ck_assert_msg(buf && fread(buf, 1, (size_t)n, f) == (size_t)n, "cannot read %s", path);
    buf[n] = 0;
    fclose(f);
    if (len)
        *len = (size_t)n;
    return buf;
}

/* 1 if s holds a control byte: messages must stay one printable line. */
static inline int t_has_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return 1;
    return 0;
}

/* kl_err rendered for assertion messages (static buffer: one at a time). */
#ifdef KL_COMMON_ERR_H
static inline const char *t_fmt_err(const kl_err *err)
{
    static char buf[1024];
    return kl_err_format(err, buf, sizeof buf);
}
#endif

#ifdef KL_CONVERT_SYNTH_H
/* Synthesizes the tiny preset (BF16) into dir with the given seed; fails the test on error. */
static inline void t_synth_tiny(const char *dir, uint64_t seed)
{
    kl_err err;
    kl_err_clear(&err);
    kl_synth_opts o = {0};
    o.out_dir = dir;
    o.preset = "tiny";
    o.seed = seed;
    o.buffered = 1;
    o.threads = 2;
    int rc = kl_synth_write(&o, &err);
    ck_assert_msg(rc == 0, "kl_synth_write(%s): expected 0, got %d (%s)", dir, rc,
                  t_fmt_err(&err));
}
#endif

/* Relative L2 error of got against want: |got - want| / |want| (|got - want| when want is 0). */
static inline double t_rel_l2(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        num += d * d;
        den += (double)want[i] * (double)want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Runs Check suite s and returns the process exit status. */
static inline int t_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
