/*
 * tests/test_convert.c — kl convert: BF16 -> MXFP4 experts.
 *
 * Converts synthetic checkpoints (written by kl_synth_write) and checks the result with the
 * project's own readers: the audit is clean, every non-expert tensor is byte-identical, every
 * quantized expert dequantizes close to its source, refusals name the rule; and a conversion
 * killed with SIGKILL at several points then rerun gives byte-identical output.
 */
#include "tests/testutil.h"

#include "audit/audit.h"
#include "common/fs.h"
#include "common/mem.h"
#include "common/numfmt.h"
#include "convert/converter.h"
#include "convert/mxfp4.h"
#include "convert/out_plan.h"
#include "convert/shard_digest.h"
#include "synth/synth.h"
#include "convert/verify.h"
#include "convert/write_behind.h"
#include "loader/checkpoint.h"

#include <cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char g_root[512], g_src[700];

static void synth_seed(const char *dir, const char *preset, uint64_t seed)
{
    kl_synth_opts o = {.out_dir = dir, .preset = preset, .seed = seed, .threads = 2};
    kl_err err;
    kl_err_clear(&err);
    char msg[1024];
    ck_assert_msg(kl_synth_write(&o, &err) == 0, "synth: %s", kl_err_format(&err, msg, sizeof msg));
}

static void synth(const char *dir, const char *preset)
{
    synth_seed(dir, preset, 11);
}

static int convert(const char *src, const char *dst, kl_err *err)
{
    kl_convert_opts o = {.src = src, .dst = dst, .threads = 2};
    kl_err_clear(err);
    return kl_convert(&o, err);
}

static void setup(void)
{
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_src, sizeof g_src, "%s/src", g_root);
    synth(g_src, "tiny");
}

static void teardown(void)
{
    t_rmrf(g_root);
}

/* Bytes of tensor t (borrowed checkpoint), kl_malloc'd. */
static uint8_t *tensor_bytes(const kl_checkpoint *ck, const kl_ckpt_tensor *t)
{
    uint8_t *buf = kl_malloc(t->t->n_bytes ? t->t->n_bytes : 1);
    int fd = open(ck->shards[t->shard].path, O_RDONLY);
    ck_assert(fd >= 0);
    ck_assert(kl_pread_all(fd, buf, t->t->n_bytes, t->t->file_off, "", NULL) == 0);
    close(fd);
    return buf;
}

START_TEST(converted_tiny_checkpoint_is_clean_exact_and_close)
{
    char dst[700], msg[1024];
    snprintf(dst, sizeof dst, "%s/dst", g_root);
    kl_err err;
    ck_assert_msg(convert(g_src, dst, &err) == 0, "%s", kl_err_format(&err, msg, sizeof msg));

    kl_audit_report r;
    ck_assert(kl_audit_run(&r, dst, NULL, &err) == 0);
    ck_assert_msg(r.n_errors == 0 && r.n_warnings == 0, "audit of the output: %zu errors: %s",
                  r.n_errors, r.n_findings ? r.findings[0].message : "");
    ck_assert_int_eq(r.family, KL_FAMILY_KIMI_LINEAR_MXFP4);
    for (size_t i = 0; i < r.n_regions; i++)
        ck_assert_msg(r.regions[i].contiguous, "layer %u experts not contiguous",
                      r.regions[i].layer);
    kl_audit_report_free(&r);

    kl_checkpoint a, b;
    ck_assert(kl_ckpt_open(&a, g_src, &err) == 0);
    ck_assert(kl_ckpt_open(&b, dst, &err) == 0);
    size_t copied = 0, quantized = 0;
    for (size_t i = 0; i < b.n_tensors; i++) {
        const kl_ckpt_tensor *t = &b.tensors[i];
        size_t len = strlen(t->name);
        if (len > 14 && !strcmp(t->name + len - 14, ".weight_packed")) {
            char src_name[256], scale_name[256];
            snprintf(src_name, sizeof src_name, "%.*s.weight", (int)(len - 14), t->name);
            snprintf(scale_name, sizeof scale_name, "%.*s.weight_scale", (int)(len - 14), t->name);
            const kl_ckpt_tensor *s = kl_ckpt_find(&a, src_name),
                                 *sc = kl_ckpt_find(&b, scale_name);
            ck_assert_msg(s && sc, "%s: source or scale missing", t->name);
            uint8_t *pk = tensor_bytes(&b, t), *scale = tensor_bytes(&b, sc),
                    *src = tensor_bytes(&a, s);
            uint64_t rows = s->t->shape[0], n = s->t->shape[1];
            float *deq = kl_malloc(n * sizeof *deq);
            double se = 0, ss = 0;
            for (uint64_t row = 0; row < rows; row++) {
                kl_mxfp4_dequantize_row(pk + row * n / 2, scale + row * n / 32, n, deq);
                for (uint64_t k = 0; k < n; k++) {
                    uint16_t h;
                    memcpy(&h, src + 2 * (row * n + k), 2);
                    double x = kl_bf16_to_f32(h), d = deq[k] - x;
                    se += d * d;
                    ss += x * x;
                }
            }
            double rel = sqrt(se / ss);
            /* E2M1 with a shared power-of-two scale: about 10-20% RMS on Gaussian data */
            ck_assert_msg(rel < 0.25, "%s: relative RMSE %.3f", t->name, rel);
            kl_free(deq);
            kl_free(pk);
            kl_free(scale);
            kl_free(src);
            quantized++;
        } else if (len > 13 && !strcmp(t->name + len - 13, ".weight_scale")) {
            continue;
        } else {
            const kl_ckpt_tensor *s = kl_ckpt_find(&a, t->name);
            ck_assert_msg(s != NULL, "%s not in the source", t->name);
            ck_assert_int_eq(s->t->dtype, t->t->dtype);
            ck_assert(s->t->n_bytes == t->t->n_bytes);
            uint8_t *x = tensor_bytes(&a, s), *y = tensor_bytes(&b, t);
            ck_assert_msg(!memcmp(x, y, s->t->n_bytes), "%s differs from the source", t->name);
            kl_free(x);
            kl_free(y);
            copied++;
        }
    }
    ck_assert_int_eq(quantized, 3 * 8 * 3); /* 3 MoE layers x 8 experts x w1/w2/w3 */
    ck_assert_int_eq(copied + 2 * quantized, b.n_tensors);
    kl_ckpt_close(&a);
    kl_ckpt_close(&b);
    char tok[800];
    snprintf(tok, sizeof tok, "%s/tiktoken.model", dst);
    ck_assert_msg(access(tok, R_OK) == 0, "tokenizer not copied");
    snprintf(tok, sizeof tok, "%s.partial", dst);
    ck_assert_msg(access(tok, F_OK) != 0, "DST.partial left behind");
}
END_TEST

START_TEST(verify_finds_exact_copies_and_bounded_expert_error)
{
    char dst[700], msg[1024];
    snprintf(dst, sizeof dst, "%s/dst-verify", g_root);
    kl_err err;
    ck_assert_msg(convert(g_src, dst, &err) == 0, "%s", kl_err_format(&err, msg, sizeof msg));
    kl_verify_result v;
    ck_assert(kl_convert_verify(&(kl_verify_opts){.src = g_src, .dst = dst}, &v, &err) == 0);
    ck_assert_int_eq(v.copies_differing, 0);
    ck_assert_int_eq(v.copies_checked, 151 - 72);
    ck_assert_int_eq(v.experts.tensors, 72);
    ck_assert_msg(v.experts.mean_rel_rmse > 0.01 && v.experts.max_rel_rmse < 0.25,
                  "relative RMSE mean %g max %g", v.experts.mean_rel_rmse, v.experts.max_rel_rmse);
    /* a changed copy is found: the shard's last byte belongs to a copied tensor (lm_head or
     * the final norm sort after the expert regions) */
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "f='%s/model-00001-of-00001.safetensors'; printf 'x' | dd of=\"$f\" bs=1 "
             "seek=$(($(stat -c %%s \"$f\") - 1)) conv=notrunc status=none",
             dst);
    ck_assert(system(cmd) == 0);
    ck_assert(kl_convert_verify(&(kl_verify_opts){.src = g_src, .dst = dst}, &v, &err) == 0);
    ck_assert_int_eq(v.copies_differing, 1);
}
END_TEST

START_TEST(compare_rules_reports_every_rule)
{
    kl_quant_stats st[KL_SCALE_RULE_COUNT];
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_convert_compare_rules(g_src, 4, 2, st, &err) == 0);
    for (int r = 0; r < KL_SCALE_RULE_COUNT; r++) {
        ck_assert_int_eq(st[r].tensors, 12);
        ck_assert_msg(st[r].mean_rel_rmse > 0.01 && st[r].mean_rel_rmse < 0.3, "rule %d: %g", r,
                      st[r].mean_rel_rmse);
    }
    /* mse picks, per block, the exponent with the least squared error among the others' */
    ck_assert(st[KL_SCALE_MSE].mean_rel_rmse <= st[KL_SCALE_OCP].mean_rel_rmse + 1e-12);
    ck_assert(st[KL_SCALE_MSE].mean_rel_rmse <= st[KL_SCALE_ROUND].mean_rel_rmse + 1e-12);
    ck_assert(st[KL_SCALE_MSE].mean_rel_rmse <= st[KL_SCALE_CEIL].mean_rel_rmse + 1e-12);
}
END_TEST

START_TEST(leftovers_of_another_plan_are_discarded)
{
    /* a DST.partial from an earlier run with other options: its journal does not match */
    char dst[700], partial[800], path[900], msg[1024];
    snprintf(dst, sizeof dst, "%s/dst-stale", g_root);
    snprintf(partial, sizeof partial, "%s.partial", dst);
    ck_assert(mkdir(partial, 0755) == 0);
    snprintf(path, sizeof path, "%s/model-00007-of-00009.safetensors", partial);
    t_write(path, "stale", 5);
    snprintf(path, sizeof path, "%s/kl-convert.journal", partial);
    const char *j = "kl-convert-journal 1 plan=0000000000000000 rule=ocp\n"
                    "done model-00007-of-00009.safetensors 5 "
                    "0000000000000000000000000000000000000000000000000000000000000000\n";
    t_write(path, j, strlen(j));
    kl_err err;
    ck_assert_msg(convert(g_src, dst, &err) == 0, "%s", kl_err_format(&err, msg, sizeof msg));
    snprintf(path, sizeof path, "%s/model-00007-of-00009.safetensors", dst);
    ck_assert_msg(access(path, F_OK) != 0, "a stale shard of another plan reached DST");
    kl_audit_report r;
    ck_assert(kl_audit_run(&r, dst, NULL, &err) == 0);
    ck_assert_int_eq(r.n_errors + r.n_warnings, 0);
    kl_audit_report_free(&r);
}
END_TEST

START_TEST(destination_inside_the_source_is_refused)
{
    char dst[800];
    snprintf(dst, sizeof dst, "%s/inner", g_src);
    kl_err err;
    ck_assert_int_eq(convert(g_src, dst, &err), KL_E_USAGE);
    ck_assert_msg(strstr(err.msg, "inside the source"), "message: %s", err.msg);
    ck_assert_int_eq(convert(g_src, g_src, &err), KL_E_USAGE);
}
END_TEST

START_TEST(existing_destination_is_refused)
{
    kl_err err;
    ck_assert_int_eq(convert(g_src, g_root, &err), KL_E_USAGE);
    ck_assert_msg(strstr(err.msg, "already exists"), "message: %s", err.msg);
}
END_TEST

START_TEST(broken_source_is_refused_with_the_audit_rule)
{
    char bad[700], dst[700], cmd[2400];
    snprintf(bad, sizeof bad, "%s/bad", g_root);
    snprintf(dst, sizeof dst, "%s/bad-out", g_root);
    snprintf(cmd, sizeof cmd,
             "cp -r '%s' '%s' && truncate -s -10 '%s/model-00001-of-00004.safetensors'", g_src, bad,
             bad);
    ck_assert(system(cmd) == 0);
    kl_err err;
    ck_assert_int_eq(convert(bad, dst, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "ST-FILE-LENGTH");
    ck_assert_msg(strstr(err.file, "model-00001"), "file: %s", err.file);
    ck_assert_msg(access(dst, F_OK) != 0, "output created for a refused source");
}
END_TEST

START_TEST(mxfp4_source_is_refused)
{
    char mx[700], dst[700];
    snprintf(mx, sizeof mx, "%s/mx", g_root);
    snprintf(dst, sizeof dst, "%s/mx-out", g_root);
    kl_synth_opts o = {.out_dir = mx, .preset = "tiny", .format = KL_SYNTH_MXFP4, .threads = 2};
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_synth_write(&o, &err) == 0);
    ck_assert_int_eq(convert(mx, dst, &err), KL_E_UNSUPPORTED);
}
END_TEST

/* 1 if system()'s status says SIGKILL ended the command (sh itself, or its child: 128 + 9). */
static int killed(int st)
{
    return (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) ||
           (WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGKILL);
}

/* Runs a shell command; returns its exit status. */
static int sh(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs `KL_BIN ARGS > g_root/out.txt 2>&1`; returns the exit status, *text the output
 * (kl_free). */
static int kl_run(const char *args, char **text)
{
    const char *kl = getenv("KL_BIN");
    ck_assert_msg(kl && *kl, "KL_BIN must name the kl binary under test");
    char cmd[4000], outf[800];
    snprintf(outf, sizeof outf, "%s/out.txt", g_root);
    snprintf(cmd, sizeof cmd, "'%s' %s > '%s' 2>&1", kl, args, outf);
    int code = sh(cmd);
    size_t len;
    ck_assert(kl_read_file(outf, 1 << 22, text, &len, NULL) == 0);
    return code;
}

/* sha256sum of every file of dir, one string. */
static char *digest_dir(const char *dir)
{
    char cmd[1200], path[800];
    snprintf(path, sizeof path, "%s/../digest.txt", dir);
    snprintf(cmd, sizeof cmd, "cd '%s' && sha256sum * > '%s'", dir, path);
    ck_assert(system(cmd) == 0);
    char *text;
    size_t len;
    ck_assert(kl_read_file(path, 1 << 20, &text, &len, NULL) == 0);
    return text;
}

/* Many small shards (1 MiB), so kills land between and inside shard writes. */
#define KILL_TEST_ARGS "--shard-size 1M --threads 2 -q"

/* The kl binary under test (KL_BIN); a small source in g_root/NAME-src and its uninterrupted
 * conversion in g_root/NAME-ref (paths in src and ref, 700 bytes each). */
static const char *source_and_reference(const char *name, char *src, char *ref)
{
    const char *kl = getenv("KL_BIN");
    ck_assert_msg(kl && *kl, "KL_BIN must name the kl binary under test");
    snprintf(src, 700, "%s/%s-src", g_root, name);
    snprintf(ref, 700, "%s/%s-ref", g_root, name);
    synth(src, "small");
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' " KILL_TEST_ARGS, kl, src, ref);
    ck_assert(system(cmd) == 0);
    return kl;
}

START_TEST(conversion_killed_anywhere_resumes_to_identical_bytes)
{
    char src[700], ref[700], out[700], cmd[3000];
    const char *kl = source_and_reference("killed", src, ref);
    snprintf(out, sizeof out, "%s/killed-out", g_root);
    char *want = digest_dir(ref);
    /* known points first (inside a shard's write, just after a journal line), then kills
     * after a delay, which land wherever this machine's speed puts them */
    static const char *const points[] = {"mid:1", "1", "mid:2", "2"};
    for (size_t i = 0; i < sizeof points / sizeof *points; i++) {
        snprintf(cmd, sizeof cmd,
                 "KL_CONVERT_TEST_KILL=%s '%s' convert '%s' '%s' " KILL_TEST_ARGS
                 " >/dev/null 2>&1",
                 points[i], kl, src, out);
        int st = system(cmd);
        ck_assert_msg(killed(st), "KL_CONVERT_TEST_KILL=%s: not killed (status %d)", points[i],
                      st);
    }
    static const char *const delays[] = {"0.05", "0.15", "0.3", "0.6", "1.0", "1.5"};
    for (size_t i = 0; i < sizeof delays / sizeof *delays; i++) {
        snprintf(cmd, sizeof cmd,
                 "timeout -s KILL %s '%s' convert '%s' '%s' " KILL_TEST_ARGS " >/dev/null 2>&1",
                 delays[i], kl, src, out);
        int st = system(cmd); /* killed or finished: either way the rerun must complete it */
        (void)st;
    }
    snprintf(cmd, sizeof cmd,
             "test -d '%s' || '%s' convert '%s' '%s' " KILL_TEST_ARGS, out, kl, src, out);
    ck_assert_msg(system(cmd) == 0, "final rerun failed");
    char *got = digest_dir(out);
    ck_assert_msg(!strcmp(want, got), "resumed output differs:\n%s\nvs\n%s", want, got);
    kl_free(want);
    kl_free(got);
}
END_TEST

/* 1 when DIR.partial's journal records at least one finished shard and DIR is not complete. */
static int has_journaled_shard(const char *dir)
{
    char path[800];
    snprintf(path, sizeof path, "%s.partial/kl-convert.journal", dir);
    char *text = NULL;
    size_t len = 0;
    int yes = access(dir, F_OK) != 0 && kl_read_file(path, 1 << 20, &text, &len, NULL) == 0 &&
              strstr(text, "\ndone ") != NULL;
    kl_free(text);
    return yes;
}

/* Runs `kl convert src out` with KL_CONVERT_TEST_KILL=when: it must die by SIGKILL at that
 * point, leaving out.partial with at least one journaled shard. */
static void killed_after(const char *kl, const char *src, const char *out, const char *when)
{
    char cmd[3000];
    snprintf(cmd, sizeof cmd,
             "KL_CONVERT_TEST_KILL=%s '%s' convert '%s' '%s' " KILL_TEST_ARGS " >/dev/null 2>&1",
             when, kl, src, out);
    int st = system(cmd);
    ck_assert_msg(killed(st), "KL_CONVERT_TEST_KILL=%s: the run was not killed (status %d)",
                  when, st);
    ck_assert_msg(has_journaled_shard(out), "KL_CONVERT_TEST_KILL=%s: no journaled shard", when);
}

/* kill -9 during an append leaves a line without its end: the lines after it must still count
 * (they were glued to the torn one, and their shards redone on every resume), and a resume
 * past a torn line keeps the journaled shards and ends in the same bytes. */
START_TEST(a_torn_journal_line_does_not_hide_the_next_shards)
{
    char src[700], ref[700], out[700], cmd[3000];
    const char *kl = source_and_reference("torn", src, ref);
    snprintf(out, sizeof out, "%s/torn-out", g_root);
    /* the run kills itself right after its second journaled shard (test-only fault injection) */
    killed_after(kl, src, out, "2");
    char jpath[800];
    snprintf(jpath, sizeof jpath, "%s.partial/kl-convert.journal", out);
    char *text;
    size_t len;
    /* every appended line starts with its own newline, so one torn before it is ended */
    ck_assert(kl_read_file(jpath, 1 << 20, &text, &len, NULL) == 0);
    ck_assert_msg(strstr(text, "\n\ndone "), "journal lines do not start a line: %s", text);
    kl_free(text);
    FILE *f = fopen(jpath, "ab");
    ck_assert(f != NULL);
    fputs("done model-000", f); /* torn mid-line */
    ck_assert(fclose(f) == 0);
    snprintf(cmd, sizeof cmd,
             "'%s' convert '%s' '%s' --shard-size 1M --threads 2 --json > '%s.json'", kl,
             src, out, out);
    ck_assert(system(cmd) == 0);
    char jsonf[800];
    snprintf(jsonf, sizeof jsonf, "%s.json", out);
    ck_assert(kl_read_file(jsonf, 1 << 20, &text, &len, NULL) == 0);
    ck_assert_msg(!strstr(text, "\"shards_resumed\":0"), "nothing resumed: %s", text);
    kl_free(text);
    char *want = digest_dir(ref), *got = digest_dir(out);
    ck_assert_msg(!strcmp(want, got), "resumed output differs:\n%s\nvs\n%s", want, got);
    kl_free(want);
    kl_free(got);
}
END_TEST


START_TEST(memory_stays_within_max_memory)
{
    const char *kl = getenv("KL_BIN");
    ck_assert(kl && *kl);
    char dst[700], cmd[3000], outf[800];
    snprintf(dst, sizeof dst, "%s/dst-mem", g_root);
    snprintf(outf, sizeof outf, "%s/mem.json", g_root);
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' --max-memory 64M --json > '%s'", kl, g_src,
             dst, outf);
    ck_assert_int_eq(sh(cmd), 0);
    char *text;
    size_t len;
    ck_assert(kl_read_file(outf, 1 << 20, &text, &len, NULL) == 0);
    const char *p = strstr(text, "\"peak_counted_bytes\":");
    ck_assert_msg(p != NULL, "%s", text);
    double peak = atof(p + strlen("\"peak_counted_bytes\":"));
    ck_assert_msg(peak > 0 && peak <= 64.0 * 1024 * 1024, "peak %.0f bytes > 64 MiB", peak);
    kl_free(text);
}
END_TEST

START_TEST(a_write_error_leaves_no_complete_looking_output_and_resumes)
{
    /* A file-size limit makes writes fail with EFBIG, as a full disk fails them with ENOSPC. */
    const char *kl = getenv("KL_BIN");
    ck_assert(kl && *kl);
    char dst[700], cmd[3000], errf[800];
    snprintf(dst, sizeof dst, "%s/dst-full", g_root);
    snprintf(errf, sizeof errf, "%s/full.err", g_root);
    snprintf(cmd, sizeof cmd,
             "sh -c \"trap '' XFSZ; ulimit -f 100; exec '%s' convert '%s' '%s' -q\" 2> '%s'", kl,
             g_src, dst, errf);
    int code = sh(cmd);
    char *text;
    size_t len;
    ck_assert(kl_read_file(errf, 1 << 20, &text, &len, NULL) == 0);
    ck_assert_msg(code == 2, "exit %d: %s", code, text);
    ck_assert_msg(strstr(text, "File too large"), "no write error reported: %s", text);
    ck_assert_msg(access(dst, F_OK) != 0, "an output directory exists after a failed write");
    kl_free(text);
    kl_err err;
    ck_assert(convert(g_src, dst, &err) == 0); /* the same command, with room, finishes */
    kl_audit_report r;
    ck_assert(kl_audit_run(&r, dst, NULL, &err) == 0);
    ck_assert_int_eq(r.n_errors, 0);
    kl_audit_report_free(&r);
}
END_TEST

/* ---- issue 9: what a conversion may touch, what a resume may reuse, what verify checks ----- */

START_TEST(a_symlinked_partial_is_refused_and_its_target_kept)
{
    /* cp -a tiny s; ln -s $PWD/s d.partial; kl convert s d */
    char s[700], d[700], cmd[3200], *text;
    snprintf(s, sizeof s, "%s/s", g_root);
    snprintf(d, sizeof d, "%s/d", g_root);
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s' && ln -s '%s' '%s.partial'", g_src, s, s, d);
    ck_assert(system(cmd) == 0);
    char *before = digest_dir(s);
    snprintf(cmd, sizeof cmd, "convert '%s' '%s' -q", s, d);
    int code = kl_run(cmd, &text);
    ck_assert_msg(code == 2, "exit %d, want 2: %s", code, text);
    ck_assert_msg(strstr(text, "d.partial") && strstr(text, "symbolic link"),
                  "the refusal names neither the path nor the rule: %s", text);
    char *after = digest_dir(s);
    ck_assert_msg(!strcmp(before, after), "the source changed:\n%s\nvs\n%s", before, after);
    kl_free(before);
    kl_free(after);
    kl_free(text);
}
END_TEST

/* g_root/NAME.partial holding one file FILE: `kl convert` refuses it (exit 2, the message
 * holding `want` and the path) and keeps the file. */
static void refused_partial_keeps(const char *name, const char *file, const char *want)
{
    char d[700], path[900], cmd[2400], *text;
    snprintf(d, sizeof d, "%s/%s", g_root, name);
    snprintf(path, sizeof path, "%s.partial", d);
    ck_assert(mkdir(path, 0755) == 0);
    snprintf(path, sizeof path, "%s.partial/%s", d, file);
    t_write(path, "mine", 4);
    snprintf(cmd, sizeof cmd, "convert '%s' '%s' -q", g_src, d);
    int code = kl_run(cmd, &text);
    ck_assert_msg(code == 2, "%s: exit %d, want 2: %s", file, code, text);
    ck_assert_msg(strstr(text, want) && strstr(text, name), "%s: %s", file, text);
    ck_assert_msg(access(path, F_OK) == 0, "%s was deleted", path);
    kl_free(text);
}

START_TEST(a_partial_kl_did_not_write_is_refused_and_kept)
{
    refused_partial_keeps("notes-out", "notes.txt", "notes.txt");
    /* a file named like a shard, but no journal of ours: not ours either */
    refused_partial_keeps("nojournal-out", "model-00001-of-00001.safetensors", "journal");
}
END_TEST

/* out: `kl convert SRC OUT` of the changed source, resumed; fresh: a fresh conversion of it. */
static void resumed_equals_fresh(const char *kl, const char *src, const char *out,
                                 const char *fresh)
{
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' " KILL_TEST_ARGS, kl, src, out);
    ck_assert_msg(system(cmd) == 0, "the resumed run failed");
    if (access(fresh, F_OK) != 0) {
        snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' " KILL_TEST_ARGS, kl, src, fresh);
        ck_assert(system(cmd) == 0);
    }
    char *want = digest_dir(fresh), *got = digest_dir(out);
    size_t at = 0; /* the line of the first difference */
    for (size_t i = 0; want[i] && want[i] == got[i]; i++)
        at = got[i] == '\n' ? i + 1 : at;
    ck_assert_msg(!strcmp(want, got), "the resumed output holds shards of the old source: %.100s",
                  got + at);
    kl_free(want);
    kl_free(got);
}

START_TEST(a_resume_never_reuses_shards_of_a_replaced_source)
{
    char src[700], ref[700], other[700], other_ref[700], out[700], cmd[3000];
    const char *kl = source_and_reference("swap", src, ref);
    snprintf(other, sizeof other, "%s/swap-other", g_root);
    snprintf(other_ref, sizeof other_ref, "%s/swap-other-ref", g_root);
    snprintf(out, sizeof out, "%s/swap-out", g_root);
    synth_seed(other, "small", 12); /* same geometry, other values */
    killed_after(kl, src, out, "2");
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -a '%s' '%s'", src, other, src);
    ck_assert(system(cmd) == 0);
    resumed_equals_fresh(kl, src, out, other_ref);
}
END_TEST

START_TEST(a_resume_notices_source_bytes_edited_in_place)
{
    char src[700], ref[700], out[700], fresh[700];
    const char *kl = source_and_reference("edit", src, ref);
    snprintf(out, sizeof out, "%s/edit-out", g_root);
    snprintf(fresh, sizeof fresh, "%s/edit-fresh", g_root);
    killed_after(kl, src, out, "2");
    /* one bit of the embedding (the first output shard), same size, mtime set back */
    kl_checkpoint ck;
    kl_err err;
    ck_assert(kl_ckpt_open(&ck, src, &err) == 0);
    const kl_ckpt_tensor *t = kl_ckpt_find(&ck, "model.embed_tokens.weight");
    ck_assert(t != NULL);
    const char *path = ck.shards[t->shard].path;
    struct stat st;
    ck_assert(stat(path, &st) == 0);
    int fd = open(path, O_RDWR);
    ck_assert(fd >= 0);
    uint8_t b;
    ck_assert(pread(fd, &b, 1, (off_t)t->t->file_off + 1000) == 1);
    b ^= 1; /* the low mantissa bit of a BF16 value: still finite */
    ck_assert(pwrite(fd, &b, 1, (off_t)t->t->file_off + 1000) == 1);
    close(fd);
    struct timespec times[2] = {st.st_atim, st.st_mtim}; /* as touch -r does */
    ck_assert(utimensat(AT_FDCWD, path, times, 0) == 0);
    kl_ckpt_close(&ck);
    resumed_equals_fresh(kl, src, out, fresh);
}
END_TEST

/* A journal of the format before source binding (2: no source digests) proves nothing: the
 * rerun starts over and still ends in the reference bytes. */
START_TEST(an_old_format_journal_starts_the_run_over)
{
    char src[700], ref[700], out[700], cmd[3200], *text;
    const char *kl = source_and_reference("old", src, ref);
    snprintf(out, sizeof out, "%s/old-out", g_root);
    killed_after(kl, src, out, "2");
    snprintf(cmd, sizeof cmd,
             "sed -i -e '1s/^kl-convert-journal 3 /kl-convert-journal 2 /' "
             "-e 's/^\\(done [^ ]* [0-9]* [0-9a-f]*\\) .*/\\1/' '%s.partial/kl-convert.journal'",
             out);
    ck_assert(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "convert '%s' '%s' --shard-size 1M --threads 2 --json", src, out);
    ck_assert_int_eq(kl_run(cmd, &text), 0);
    ck_assert_msg(strstr(text, "\"shards_resumed\":0,"), "an old journal was trusted: %s", text);
    kl_free(text);
    char *want = digest_dir(ref), *got = digest_dir(out);
    ck_assert_msg(!strcmp(want, got), "the output differs from the reference");
    kl_free(want);
    kl_free(got);
}
END_TEST

/* Rewrites dir's shard holding `name` without it, and the index without it. */
static void drop_tensor(const char *dir, const char *name)
{
    kl_checkpoint ck;
    kl_err err;
    ck_assert(kl_ckpt_open(&ck, dir, &err) == 0);
    const kl_ckpt_tensor *gone = kl_ckpt_find(&ck, name);
    ck_assert_msg(gone != NULL, "%s not in %s", name, dir);
    kl_st_wtensor *wt = kl_calloc(ck.n_tensors, sizeof *wt);
    const kl_ckpt_tensor **from = kl_calloc(ck.n_tensors, sizeof *from);
    kl_st_index_entry *ie = kl_calloc(ck.n_tensors, sizeof *ie);
    size_t n = 0, ni = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < ck.n_tensors; i++) {
        const kl_ckpt_tensor *t = &ck.tensors[i];
        if (t == gone)
            continue;
        ie[ni++] = (kl_st_index_entry){t->name, ck.shards[t->shard].name};
        total += t->t->n_bytes;
        if (t->shard != gone->shard)
            continue;
        wt[n] = (kl_st_wtensor){.name = t->name, .dtype = t->t->dtype, .rank = t->t->rank};
        memcpy(wt[n].shape, t->t->shape, sizeof wt[n].shape);
        from[n++] = t;
    }
    kl_st_writer w;
    ck_assert(kl_st_writer_open(&w, ck.shards[gone->shard].path, wt, n, NULL, &err) == 0);
    for (size_t i = 0; i < n; i++) {
        uint8_t *bytes = tensor_bytes(&ck, from[i]);
        ck_assert(kl_st_writer_pwrite(&w, i, 0, bytes, from[i]->t->n_bytes, &err) == 0);
        kl_free(bytes);
    }
    ck_assert(kl_st_writer_commit(&w, &err) == 0);
    kl_st_writer_close(&w);
    ck_assert(kl_st_index_write(dir, ie, ni, total, &err) == 0);
    kl_free(wt);
    kl_free(from);
    kl_free(ie);
    kl_ckpt_close(&ck);
}

START_TEST(verify_reports_a_tensor_missing_from_the_destination)
{
    char dst[700], cmd[2400], msg[1024], *text;
    snprintf(dst, sizeof dst, "%s/dst-missing", g_root);
    kl_err err;
    ck_assert_msg(convert(g_src, dst, &err) == 0, "%s", kl_err_format(&err, msg, sizeof msg));
    drop_tensor(dst, "model.norm.weight");
    snprintf(cmd, sizeof cmd, "convert --verify '%s' '%s'", g_src, dst);
    int code = kl_run(cmd, &text);
    ck_assert_msg(code == 1, "exit %d, want 1: %s", code, text);
    ck_assert_msg(strstr(text, "missing") && strstr(text, "model.norm.weight"), "%s", text);
    kl_free(text);
}
END_TEST

START_TEST(verify_of_a_directory_against_itself_or_inside_it_is_a_usage_error)
{
    char cmd[2400], *text;
    snprintf(cmd, sizeof cmd, "convert --verify '%s' '%s'", g_src, g_src);
    int code = kl_run(cmd, &text);
    ck_assert_msg(code == 2 && strstr(text, "same directory"), "exit %d: %s", code, text);
    kl_free(text);
    snprintf(cmd, sizeof cmd, "convert --verify '%s' '%s'", g_root, g_src); /* DST inside */
    code = kl_run(cmd, &text);
    ck_assert_msg(code == 2 && strstr(text, "inside"), "exit %d: %s", code, text);
    kl_free(text);
}
END_TEST

/* Progress is drawn on a terminal's stderr (script(1) gives the command one), and -q and --json
 * turn it off. */
START_TEST(verify_shows_progress_on_a_terminal_unless_quiet)
{
    char dst[700], cmd[2400], msg[1024], *text;
    snprintf(dst, sizeof dst, "%s/dst-progress", g_root);
    kl_err err;
    ck_assert_msg(convert(g_src, dst, &err) == 0, "%s", kl_err_format(&err, msg, sizeof msg));
    static const char *const flags[] = {"", "-q", "--json"};
    for (int i = 0; i < 3; i++) {
        const char *kl = getenv("KL_BIN");
        snprintf(cmd, sizeof cmd,
                 "script -qec \"'%s' convert --verify '%s' '%s' %s\" /dev/null > '%s/tty.txt'",
                 kl, g_src, dst, flags[i], g_root);
        ck_assert_int_eq(sh(cmd), 0);
        size_t len;
        snprintf(cmd, sizeof cmd, "%s/tty.txt", g_root);
        ck_assert(kl_read_file(cmd, 1 << 20, &text, &len, NULL) == 0);
        int drawn = strstr(text, "\rverify: ") != NULL;
        ck_assert_msg(drawn == (i == 0), "flags '%s': progress %s: %s", flags[i],
                      drawn ? "drawn" : "missing", text);
        kl_free(text);
    }
}
END_TEST

START_TEST(max_memory_is_a_cap_not_an_allocation)
{
    char dst[700], cmd[2400], *text;
    snprintf(dst, sizeof dst, "%s/dst-1t", g_root);
    snprintf(cmd, sizeof cmd, "convert '%s' '%s' --max-memory 1T --json", g_src, dst);
    int code = kl_run(cmd, &text);
    ck_assert_msg(code == 0, "exit %d: %s", code, text);
    const char *p = strstr(text, "\"peak_counted_bytes\":");
    ck_assert_msg(p != NULL, "%s", text);
    double peak = atof(p + strlen("\"peak_counted_bytes\":"));
    ck_assert_msg(peak > 0 && peak <= 64.0 * 1024 * 1024, "peak %.0f bytes for a tiny source",
                  peak);
    kl_free(text);
}
END_TEST

START_TEST(dry_run_writes_nothing_and_plans_the_real_shard_sizes)
{
    char dst[700], cmd[2400], path[900], *text;
    snprintf(dst, sizeof dst, "%s/dst-dry", g_root);
    snprintf(cmd, sizeof cmd, "convert '%s' '%s' --shard-size 256K --dry-run --json", g_src, dst);
    int code = kl_run(cmd, &text);
    ck_assert_msg(code == 0, "exit %d: %s", code, text);
    snprintf(path, sizeof path, "%s.partial", dst);
    ck_assert_msg(access(dst, F_OK) != 0 && access(path, F_OK) != 0, "a dry run wrote %s", dst);
    cJSON *j = cJSON_Parse(text);
    ck_assert_msg(j != NULL, "not JSON: %s", text);
    cJSON *shards = cJSON_GetObjectItem(j, "shards");
    ck_assert(cJSON_GetArraySize(shards) > 1);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "fits")));
    ck_assert(cJSON_GetObjectItem(j, "free_bytes")->valuedouble > 0);
    snprintf(cmd, sizeof cmd, "convert '%s' '%s' --shard-size 256K -q", g_src, dst);
    kl_free(text);
    ck_assert_int_eq(kl_run(cmd, &text), 0);
    double sum = 0;
    for (int k = 0; k < cJSON_GetArraySize(shards); k++) {
        cJSON *s = cJSON_GetArrayItem(shards, k);
        snprintf(path, sizeof path, "%s/%s", dst, cJSON_GetObjectItem(s, "name")->valuestring);
        struct stat st;
        ck_assert_msg(stat(path, &st) == 0, "planned shard %s not written", path);
        double want = cJSON_GetObjectItem(s, "file_bytes")->valuedouble;
        ck_assert_msg((double)st.st_size == want, "%s: planned %.0f bytes, wrote %lld", path,
                      want, (long long)st.st_size);
        sum += want;
    }
    ck_assert(sum == cJSON_GetObjectItem(j, "shard_bytes")->valuedouble);
    cJSON_Delete(j);
    kl_free(text);
}
END_TEST

START_TEST(an_output_larger_than_the_free_space_is_refused_with_the_numbers)
{
    kl_out_plan p = {.needed_bytes = UINT64_MAX / 2};
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_out_plan_check_space(&p, g_root, &err), KL_E_IO);
    ck_assert_str_eq(err.rule, "OUT-NO-SPACE");
    char want[64];
    snprintf(want, sizeof want, "%llu", (unsigned long long)p.needed_bytes);
    ck_assert_msg(strstr(err.msg, want) && p.free_bytes > 0, "%s", err.msg);
}
END_TEST

START_TEST(help_says_shard_size_is_a_soft_limit)
{
    static const char *const cmds[] = {"convert --help", "synth --help"};
    for (size_t i = 0; i < 2; i++) {
        char *text;
        ck_assert_int_eq(kl_run(cmds[i], &text), 0);
        ck_assert_msg(strstr(text, "soft limit"), "kl %s: %s", cmds[i], text);
        kl_free(text);
    }
}
END_TEST

/* ---- building blocks: the shard digest and the write-behind lanes -------------------------- */

/* err rendered for assertion messages (static buffer: one at a time). */
static const char *emsg(const kl_err *err)
{
    static char buf[1024];
    return kl_err_format(err, buf, sizeof buf);
}

/* A made-up shard: a header, an empty tensor, a tensor of two leaves and a bit, a small one. */
static const uint64_t g_pieces[] = {100, 0, 2 * KL_SDIGEST_LEAF + 3, 5};
#define N_PIECES (sizeof g_pieces / sizeof *g_pieces)

static uint8_t *pattern(size_t n)
{
    uint8_t *b = kl_malloc(n);
    ck_assert(b != NULL);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i * 131 + i / 4099);
    return b;
}

/* Feeds bytes [from, to) of piece p in uneven updates. */
static void feed(kl_sdigest *d, size_t p, const uint8_t *piece, uint64_t from, uint64_t to)
{
    kl_err err;
    kl_err_clear(&err);
    for (uint64_t off = from; off < to;) {
        size_t n = (size_t)(to - off < (1u << 20) + 17 ? to - off : (1u << 20) + 17);
        ck_assert_msg(kl_sdigest_update(d, p, off, piece + off, n, &err) == 0, "%s",
                      emsg(&err));
        off += n;
    }
}

START_TEST(shard_digest_fed_leaf_by_leaf_in_any_order_equals_the_file_read_back)
{
    size_t total = 0, at[N_PIECES];
    for (size_t p = 0; p < N_PIECES; p++) {
        at[p] = total;
        total += (size_t)g_pieces[p];
    }
    uint8_t *bytes = pattern(total);
    char path[800];
    snprintf(path, sizeof path, "%s/digest.bin", g_root);
    t_write(path, bytes, total);
    kl_sdigest *d;
    kl_err err;
    ck_assert(kl_sdigest_create(&d, g_pieces, N_PIECES, &err) == 0);
    /* last leaf first; the small tensor before the header; the empty tensor never fed */
    const uint8_t *big = bytes + at[2];
    feed(d, 2, big, 2 * KL_SDIGEST_LEAF, g_pieces[2]);
    feed(d, 3, bytes + at[3], 0, 5);
    feed(d, 2, big, KL_SDIGEST_LEAF, 2 * KL_SDIGEST_LEAF);
    feed(d, 0, bytes, 0, 100);
    feed(d, 2, big, 0, KL_SDIGEST_LEAF);
    unsigned char fed[32], back[32];
    ck_assert_msg(kl_sdigest_final(d, fed, &err) == 0, "%s", emsg(&err));
    kl_sdigest_destroy(d);
    ck_assert_msg(kl_sdigest_file(path, g_pieces, N_PIECES, back, &err) == 0, "%s",
                  emsg(&err));
    ck_assert(!memcmp(fed, back, 32));
    /* one byte changed in the middle leaf: another digest */
    bytes[at[2] + KL_SDIGEST_LEAF + 5] ^= 1;
    t_write(path, bytes, total);
    ck_assert(kl_sdigest_file(path, g_pieces, N_PIECES, back, &err) == 0);
    ck_assert(memcmp(fed, back, 32) != 0);
    /* a file of another size is refused */
    t_write(path, bytes, total - 1);
    ck_assert_int_eq(kl_sdigest_file(path, g_pieces, N_PIECES, back, &err), KL_E_IO);
    kl_free(bytes);
}
END_TEST

START_TEST(shard_digest_refuses_bytes_out_of_order_and_unfinished_leaves)
{
    kl_sdigest *d;
    kl_err err;
    uint8_t b[8] = {0};
    unsigned char out[32];
    ck_assert(kl_sdigest_create(&d, g_pieces, N_PIECES, &err) == 0);
    ck_assert_int_eq(kl_sdigest_update(d, 3, 2, b, 3, &err), KL_E_BUG);  /* a gap */
    ck_assert_int_eq(kl_sdigest_update(d, 3, 0, b, 6, &err), KL_E_BUG);  /* past the end */
    ck_assert_int_eq(kl_sdigest_update(d, 9, 0, b, 1, &err), KL_E_BUG);  /* no such piece */
    ck_assert_int_eq(kl_sdigest_update(d, 3, 0, b, 2, &err), 0);
    ck_assert_int_eq(kl_sdigest_update(d, 3, 0, b, 2, &err), KL_E_BUG);  /* again */
    ck_assert_int_eq(kl_sdigest_final(d, out, &err), KL_E_BUG);          /* unfinished */
    kl_sdigest_destroy(d);
}
END_TEST

/* Write-behind hook that fails on the n-th call. */
typedef struct failing_hook {
    kl_sdigest *d;
    atomic_int  calls;
    int         fail_at;
} failing_hook;

static int probe_hook(void *ctx, size_t tensor, uint64_t off, const uint8_t *data, size_t n,
                      kl_err *err)
{
    failing_hook *h = ctx;
    if (atomic_fetch_add(&h->calls, 1) + 1 == h->fail_at)
        return kl_fail(err, KL_E_IO, "hook failure");
    return kl_sdigest_update(h->d, tensor + 1, off, data, n, err);
}

/* Two tensors written through three lanes in interleaved items (each tensor on its own lane,
 * a two-segment item on a third, one item larger than the queue's 1 MiB arena): the file
 * holds every byte, and the digest the hook fed equals the file's. */
START_TEST(write_behind_lanes_write_everything_in_each_lanes_order)
{
    enum { T = 3 << 20, ITEM = 96 << 10 };
    kl_st_wtensor wt[4] = {{.name = "a", .dtype = KL_DT_U8, .rank = 1, .shape = {T}},
                           {.name = "b", .dtype = KL_DT_U8, .rank = 1, .shape = {T}},
                           {.name = "c", .dtype = KL_DT_U8, .rank = 1, .shape = {2 * ITEM}},
                           {.name = "d", .dtype = KL_DT_U8, .rank = 1, .shape = {T}}};
    char path[800];
    snprintf(path, sizeof path, "%s/wb.safetensors", g_root);
    kl_err err;
    kl_st_writer w;
    ck_assert(kl_st_writer_open(&w, path, wt, 4, NULL, &err) == 0);
    uint8_t *hdr, *src = pattern(T);
    uint64_t pieces[5];
    ck_assert(kl_st_header_build(wt, 4, 0, &hdr, &pieces[0], NULL, pieces + 1, &err) == 0);
    failing_hook h = {.fail_at = 0};
    ck_assert(kl_sdigest_create(&h.d, pieces, 5, &err) == 0);
    ck_assert(kl_sdigest_update(h.d, 0, 0, hdr, (size_t)pieces[0], &err) == 0);
    kl_wb *q;
    ck_assert(kl_wb_create(&q, 1u << 20, 3, &err) == 0);
    kl_wb_target t = {.w = &w, .hook = probe_hook, .ctx = &h};
    for (uint64_t off = 0; off < T; off += ITEM) {
        ck_assert(kl_wb_write(q, &t, 0, 0, off, src + off, ITEM, &err) == 0);
        ck_assert(kl_wb_write(q, &t, 1, 1, off, src + T - ITEM - off, ITEM, &err) == 0);
        if (off == T / 2)
            ck_assert(kl_wb_write(q, &t, 2, 3, 0, src, T, &err) == 0);
    }
    kl_wb_seg seg[2] = {{2, 0, ITEM}, {2, ITEM, ITEM}};
    kl_wb_item *it;
    uint8_t *data;
    ck_assert(kl_wb_reserve(q, &t, kl_wb_pick_lane(q), seg, 2, &it, &data, &err) == 0);
    memcpy(data, src, 2 * ITEM);
    kl_wb_commit(q, it);
    ck_assert_msg(kl_wb_drain(q, &err) == 0, "%s", emsg(&err));
    unsigned char fed[32], back[32];
    ck_assert_msg(kl_sdigest_final(h.d, fed, &err) == 0, "%s", emsg(&err));
    ck_assert(kl_st_writer_commit(&w, &err) == 0);
    kl_st_writer_close(&w);
    ck_assert(kl_sdigest_file(path, pieces, 5, back, &err) == 0);
    ck_assert(!memcmp(fed, back, 32));
    kl_wb_destroy(q);
    kl_sdigest_destroy(h.d);
    kl_free(hdr);
    kl_free(src);
}
END_TEST

START_TEST(write_behind_hook_error_fails_the_queue)
{
    kl_st_wtensor wt = {.name = "a", .dtype = KL_DT_U8, .rank = 1, .shape = {1 << 20}};
    char path[800];
    snprintf(path, sizeof path, "%s/wb-fail.safetensors", g_root);
    kl_err err;
    kl_st_writer w;
    ck_assert(kl_st_writer_open(&w, path, &wt, 1, NULL, &err) == 0);
    uint64_t pieces[2] = {w.data_off, 1 << 20};
    failing_hook h = {.fail_at = 3};
    ck_assert(kl_sdigest_create(&h.d, pieces, 2, &err) == 0);
    kl_wb *q;
    ck_assert(kl_wb_create(&q, 1u << 20, 2, &err) == 0);
    kl_wb_target t = {.w = &w, .hook = probe_hook, .ctx = &h};
    uint8_t *src = pattern(1 << 20);
    int rc = 0;
    for (uint64_t off = 0; off < (1 << 20) && !rc; off += 4096)
        rc = kl_wb_write(q, &t, 0, 0, off, src + off, 4096, &err);
    kl_err derr;
    ck_assert_int_eq(kl_wb_drain(q, &derr), KL_E_IO);
    ck_assert(strstr(derr.msg, "hook failure") != NULL);
    ck_assert_int_eq(kl_wb_write(q, &t, 1, 0, 0, src, 10, &err), KL_E_IO); /* and stays failed */
    kl_wb_destroy(q);
    kl_st_writer_close(&w);
    kl_sdigest_destroy(h.d);
    kl_free(src);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("convert");
    TCase *tc = tcase_create("convert");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, converted_tiny_checkpoint_is_clean_exact_and_close);
    tcase_add_test(tc, verify_finds_exact_copies_and_bounded_expert_error);
    tcase_add_test(tc, compare_rules_reports_every_rule);
    tcase_add_test(tc, leftovers_of_another_plan_are_discarded);
    tcase_add_test(tc, memory_stays_within_max_memory);
    tcase_add_test(tc, a_write_error_leaves_no_complete_looking_output_and_resumes);
    tcase_add_test(tc, destination_inside_the_source_is_refused);
    tcase_add_test(tc, existing_destination_is_refused);
    tcase_add_test(tc, broken_source_is_refused_with_the_audit_rule);
    tcase_add_test(tc, mxfp4_source_is_refused);
    tcase_add_test(tc, conversion_killed_anywhere_resumes_to_identical_bytes);
    tcase_add_test(tc, a_torn_journal_line_does_not_hide_the_next_shards);
    tcase_add_test(tc, a_symlinked_partial_is_refused_and_its_target_kept);
    tcase_add_test(tc, a_partial_kl_did_not_write_is_refused_and_kept);
    tcase_add_test(tc, a_resume_never_reuses_shards_of_a_replaced_source);
    tcase_add_test(tc, a_resume_notices_source_bytes_edited_in_place);
    tcase_add_test(tc, an_old_format_journal_starts_the_run_over);
    tcase_add_test(tc, verify_reports_a_tensor_missing_from_the_destination);
    tcase_add_test(tc, verify_of_a_directory_against_itself_or_inside_it_is_a_usage_error);
    tcase_add_test(tc, verify_shows_progress_on_a_terminal_unless_quiet);
    tcase_add_test(tc, max_memory_is_a_cap_not_an_allocation);
    tcase_add_test(tc, dry_run_writes_nothing_and_plans_the_real_shard_sizes);
    tcase_add_test(tc, an_output_larger_than_the_free_space_is_refused_with_the_numbers);
    tcase_add_test(tc, help_says_shard_size_is_a_soft_limit);
    tcase_add_test(tc, shard_digest_fed_leaf_by_leaf_in_any_order_equals_the_file_read_back);
    tcase_add_test(tc, shard_digest_refuses_bytes_out_of_order_and_unfinished_leaves);
    tcase_add_test(tc, write_behind_lanes_write_everything_in_each_lanes_order);
    tcase_add_test(tc, write_behind_hook_error_fails_the_queue);
    suite_add_tcase(s, tc);
    return t_run_suite(s);
}
