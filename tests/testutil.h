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
    ck_assert(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    ck_assert(n >= 0 && fseek(f, 0, SEEK_SET) == 0);
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

/* One strictness case of a JSON file kind: the file's base text with the first occurrence of
 * from replaced by to (to_len bytes, 0 for strlen(to), so that a NUL can be spliced in). */
typedef struct t_json_case {
    const char *what;
    const char *from, *to;
    size_t      to_len;
    const char *rule; /* expected kl_err.rule; NULL: the text is accepted */
} t_json_case;

/* base with c's splice applied: malloc'd (caller frees), its length in *len. */
static inline char *t_json_splice(const char *base, const t_json_case *c, size_t *len)
{
    const char *at = strstr(base, c->from);
    ck_assert_msg(at != NULL, "%s: \"%s\" not in the base text", c->what, c->from);
    size_t head = (size_t)(at - base), from = strlen(c->from);
    size_t to = c->to_len ? c->to_len : strlen(c->to), tail = strlen(at + from);
    char *out = malloc(head + to + tail + 1);
    ck_assert(out != NULL);
    memcpy(out, base, head);
    memcpy(out + head, c->to, to);
    memcpy(out + head + to, at + from, tail + 1);
    *len = head + to + tail;
    return out;
}

/* kl_err rendered for assertion messages (static buffer: one at a time). */
#ifdef KL_COMMON_ERR_H
static inline const char *t_fmt_err(const kl_err *err)
{
    static char buf[1024];
    return kl_err_format(err, buf, sizeof buf);
}
#endif

#ifdef KL_COMMON_ERR_H
/* Asserts the outcome of case c: success when c->rule is NULL, else a failure with rule c->rule,
 * kl_err.tensor equal to tensor unless that is NULL, and a one-line message. */
static inline void t_json_case_check(const t_json_case *c, int rc, const kl_err *err,
                                     const char *tensor)
{
    if (!c->rule) {
        ck_assert_msg(rc == 0, "%s: expected success, got %s", c->what, t_fmt_err(err));
        return;
    }
    ck_assert_msg(rc < 0 && strcmp(err->rule, c->rule) == 0 &&
                      (!tensor || strcmp(err->tensor, tensor) == 0),
                  "%s: expected [%s] tensor/key \"%s\", got %d: %s", c->what, c->rule,
                  tensor ? tensor : "(any)", rc, t_fmt_err(err));
    ck_assert_msg(!t_has_control(err->msg), "%s: message not one line: %s", c->what, err->msg);
}
#endif

#ifdef KL_SYNTH_SYNTH_H
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

#ifdef KL_ENGINE_MODEL_H
/* kl_model_open of dir on one thread (vectors_only as given); fails the test on error. */
static inline kl_model *t_open_model(const char *dir, int vectors_only)
{
    kl_err err;
    kl_err_clear(&err);
    kl_model *m = NULL;
    kl_model_opts mo = {.threads = 1, .vectors_only = vectors_only};
    int rc = kl_model_open(&m, dir, &mo, &err);
    ck_assert_msg(rc == 0, "kl_model_open(%s): %s", dir, t_fmt_err(&err));
    return m;
}
#endif

/* The kl binary under test, $KL_BIN (set by `make test`); fails the test when unset. */
static inline const char *t_kl_bin(void)
{
    const char *kl = getenv("KL_BIN");
    ck_assert_msg(kl && *kl, "KL_BIN must name the kl binary under test");
    return kl;
}

/* Synthesizes the tiny preset into dir with `kl synth` of the binary under test. */
static inline void t_kl_synth_tiny(const char *dir, unsigned seed)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "'%s' synth '%s' --preset tiny --seed %u -q > /dev/null",
             t_kl_bin(), dir, seed);
    ck_assert_msg(system(cmd) == 0, "kl synth failed: %s", cmd);
}

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
