/*
 * tests/test_cli.c — the contract every kl command keeps (through the binary in $KL_BIN, the
 * ASan/UBSan build, on a tiny synthetic checkpoint):
 * - with --json, a usage error prints exactly one JSON object on stdout (ok false, error code
 *   "usage") and exits 2; without it, one line plus "try 'kl CMD --help'" on stderr;
 * - a misspelt option or command gets a did-you-mean;
 * - stdout on /dev/full or closed: exit 2 and a message, never a silent 0;
 * - options parse one way: --name=VALUE, missing values, repeated and conflicting options;
 * - `kl tokenize --json` prints one object; `tokenize --file DIR` exits 2 like a missing file;
 * - --device gpu in a build without GPU support is a clear error; --device tpu a usage error.
 */
#include "common/err.h"
#include "synth/synth.h"
#include "tests/testutil.h"

#include <cJSON.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char g_root[512], g_tiny[600], g_mx[600];
static const char *g_kl;
static unsigned g_serial; /* fresh output directories for synth and convert (with the pid:
                             each test runs in its own process) */

/* ------------------------------------------------------------------------------------------ */
/* Fixture and helpers                                                                         */

static void setup(void)
{
    g_kl = getenv("KL_BIN");
    ck_assert_msg(g_kl && *g_kl, "KL_BIN must name the kl binary under test");
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_tiny, sizeof g_tiny, "%s/tiny", g_root);
    snprintf(g_mx, sizeof g_mx, "%s/tiny-mx", g_root);
    t_synth_tiny(g_tiny, 5);
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' -q", g_kl, g_tiny, g_mx);
    ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
}

static void teardown(void)
{
    if (g_root[0])
        t_rmrf(g_root);
}

/* Expands T (the tiny checkpoint), M (its MXFP4 conversion) and N (a new directory) in args. */
static void expand(const char *args, char *out, size_t n)
{
    size_t k = 0;
    for (const char *p = args; *p && k + 700 < n; p++) {
        if ((*p == 'T' || *p == 'M' || *p == 'N') && (p == args || p[-1] == ' ') &&
            (p[1] == ' ' || !p[1])) {
            if (*p == 'N')
                k += (size_t)snprintf(out + k, n - k, "'%s/new%d-%u'", g_root, (int)getpid(),
                                      ++g_serial);
            else
                k += (size_t)snprintf(out + k, n - k, "'%s'", *p == 'T' ? g_tiny : g_mx);
        } else {
            out[k++] = *p;
        }
    }
    out[k] = 0;
}

/* Runs `printf 'hi\n' | $KL_BIN ARGS STDOUT 2> g_root/err` (STDOUT: a redirection such as
 * "> FILE", "> /dev/full" or ">&-"); the exit status. */
static int kl(const char *args, const char *stdout_to)
{
    char ex[4000], cmd[8192];
    expand(args, ex, sizeof ex);
    snprintf(cmd, sizeof cmd, "printf 'hi\\n' | '%s' %s %s 2> '%s/err'", g_kl, ex, stdout_to,
             g_root);
    int st = system(cmd);
    ck_assert_msg(st != -1 && WIFEXITED(st), "`%s` did not exit normally", cmd);
    return WEXITSTATUS(st);
}

/* As kl() with stdout into g_root/out; *out and *err the texts (free them). */
static int kl_capture(const char *args, char **out, char **err)
{
    char to[700], path[700];
    snprintf(to, sizeof to, "> '%s/out'", g_root);
    int rc = kl(args, to);
    snprintf(path, sizeof path, "%s/out", g_root);
    *out = t_slurp(path, NULL);
    snprintf(path, sizeof path, "%s/err", g_root);
    *err = t_slurp(path, NULL);
    return rc;
}

/* out is exactly one JSON object and a newline; returns it parsed (cJSON_Delete it). */
static cJSON *one_object(const char *what, const char *out)
{
    size_t n = strlen(out);
    ck_assert_msg(n > 1 && out[n - 1] == '\n' && !memchr(out, '\n', n - 1),
                  "%s: stdout is not one line ending in a newline: '%s'", what, out);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(out, &end, 0);
    ck_assert_msg(j && cJSON_IsObject(j) && end == out + n - 1,
                  "%s: stdout is not exactly one JSON object: '%s'", what, out);
    return j;
}

/* ------------------------------------------------------------------------------------------ */
/* Every command                                                                               */

typedef struct cli_case {
    const char *name;    /* the command as kl_version's "command" names it */
    const char *ok;      /* a run that succeeds and prints on stdout */
    const char *typo;    /* the same command with a misspelt option */
    const char *meant;   /* the option it should suggest */
} cli_case;

static const cli_case cases[] = {
    {"audit", "audit T", "audit T --hahs", "--hash"},
    {"audit", "audit T --json", "audit T --contxt 5", "--context"},
    {"audit", "audit T --hash", "audit T --thread 2", "--threads"},
    {"synth", "synth N", "synth N --presett tiny", "--preset"},
    {"synth", "synth N --json", "synth N --sparce", "--sparse"},
    {"convert", "convert T N", "convert T N --scale-rul mse", "--scale-rule"},
    {"convert --verify", "convert --verify T M", "convert --verfy T M", "--verify"},
    {"convert --compare-rules", "convert --compare-rules T --sample 1",
     "convert --compare-rules T --sampel 1", "--sample"},
    {"bench mxfp4", "bench mxfp4 --mib 1 --threads 1", "bench mxfp4 --mibs 1", "--mib"},
    {"bench rules", "bench rules --rows 1", "bench rules --rowz 1", "--rows"},
    {"bench decode", "bench decode T --prompt-tokens 2 --tokens 1",
     "bench decode T --tokenz 1", "--tokens"},
    {"read", "read T", "read T --hsah", "--hash"},
    {"read", "read T --hash", "read T --bufferd", "--buffered"},
    {"read", "read T --json", "read T --chunck 1M", "--chunk"},
    {"tokenize", "tokenize T --text hi", "tokenize T --txt hi", "--text"},
    {"tokenize", "tokenize T --text hi --json", "tokenize T --text hi --jsn", "--json"},
    {"detokenize", "detokenize T --ids 72,105", "detokenize T --ids 72 --skip-specail",
     "--skip-special"},
    {"run", "run T --ids 1,2 -n 2", "run T --ids 1 --tmep 1", "--temp"},
    {"run", "run T --ids 1,2 -n 2 --json", "run T --ids 1 --top_p 0.5", "--top-p"},
    {"chat", "chat T -n 2", "chat T --sytem hello", "--system"},
    {"chat", "chat T -n 2 --json", "chat T --seeed 1", "--seed"},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* The command words of a case's typo line ("convert --verify" stays "convert"). */
static void command_words(const cli_case *c, char *buf, size_t n)
{
    snprintf(buf, n, "%s", c->name);
    char *sp = strstr(buf, " --");
    if (sp)
        *sp = 0;
}

START_TEST(json_usage_error_is_one_object_and_exit_2)
{
    const cli_case *c = &cases[_i];
    char words[64], args[400];
    command_words(c, words, sizeof words);
    /* --json before the bad option and after it: either way one object */
    for (int after = 0; after < 2; after++) {
        snprintf(args, sizeof args, after ? "%s --no-such-option --json" : "%s --json --no-such-option",
                 c->typo);
        char *out, *err;
        int rc = kl_capture(args, &out, &err);
        ck_assert_msg(rc == 2, "`kl %s`: expected exit 2, got %d (stderr: %s)", args, rc, err);
        cJSON *j = one_object(args, out);
        cJSON *e = cJSON_GetObjectItem(j, "error");
        ck_assert_msg(cJSON_IsFalse(cJSON_GetObjectItem(j, "ok")) && cJSON_IsObject(e) &&
                          !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "code")), "usage") &&
                          cJSON_GetStringValue(cJSON_GetObjectItem(e, "message")) &&
                          !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "command")), words) &&
                          cJSON_GetStringValue(cJSON_GetObjectItem(j, "kl_version")),
                      "`kl %s`: object '%s'", args, out);
        cJSON_Delete(j);
        free(out);
        free(err);
    }
}
END_TEST

START_TEST(misspelt_option_gets_one_line_and_a_did_you_mean)
{
    const cli_case *c = &cases[_i];
    char words[64], want[300];
    command_words(c, words, sizeof words);
    char *out, *err;
    int rc = kl_capture(c->typo, &out, &err);
    ck_assert_msg(rc == 2, "`kl %s`: expected exit 2, got %d", c->typo, rc);
    snprintf(want, sizeof want, "did you mean '%s'?", c->meant);
    ck_assert_msg(strstr(err, want) != NULL, "`kl %s`: stderr lacks \"%s\": %s", c->typo, want,
                  err);
    snprintf(want, sizeof want, "try 'kl %s --help'\n", words);
    char *nl = strchr(err, '\n');
    ck_assert_msg(nl && !strcmp(nl + 1, want),
                  "`kl %s`: stderr should be one line and \"%s\", got: %s", c->typo, want, err);
    ck_assert_msg(!*out, "`kl %s`: nothing on stdout without --json, got: %s", c->typo, out);
    free(out);
    free(err);
}
END_TEST

START_TEST(stdout_on_dev_full_or_closed_exits_2)
{
    const cli_case *c = &cases[_i];
    static const char *const to[] = {"> /dev/full", ">&-"};
    for (int k = 0; k < 2; k++) {
        int rc = kl(c->ok, to[k]);
        char path[700];
        snprintf(path, sizeof path, "%s/err", g_root);
        char *err = t_slurp(path, NULL);
        ck_assert_msg(rc == 2, "`kl %s %s`: expected exit 2, got %d (stderr: %s)", c->ok, to[k],
                      rc, err);
        ck_assert_msg(strstr(err, "cannot write standard output") != NULL,
                      "`kl %s %s`: no message on stderr: %s", c->ok, to[k], err);
        free(err);
    }
    /* and the same run to a file works (the case is a real success) */
    char *out, *err;
    int rc = kl_capture(c->ok, &out, &err);
    ck_assert_msg(rc == 0 && *out, "`kl %s`: expected exit 0 and output, got %d: %s", c->ok, rc,
                  err);
    free(out);
    free(err);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* The parser                                                                                  */

START_TEST(misspelt_command_gets_a_did_you_mean)
{
    char *out, *err;
    ck_assert_int_eq(kl_capture("audti T", &out, &err), 2);
    ck_assert_msg(strstr(err, "did you mean 'audit'?") != NULL, "stderr: %s", err);
    free(out);
    free(err);
    ck_assert_int_eq(kl_capture("tokenise T --json", &out, &err), 2);
    cJSON *j = one_object("tokenise --json", out);
    cJSON_Delete(j);
    free(out);
    free(err);
    ck_assert_int_eq(kl_capture("bench rule", &out, &err), 2);
    ck_assert_msg(strstr(err, "did you mean 'rules'?") != NULL, "stderr: %s", err);
    free(out);
    free(err);
}
END_TEST

START_TEST(options_parse_one_way_in_every_command)
{
    static const struct {
        const char *args;
        int rc;
        const char *err; /* expected on stderr, or NULL */
    } rows[] = {
        {"audit T --tp=2 --json", 0, NULL},
        {"audit T --tp 2 --tp 4", 2, "--tp given more than once"},
        {"audit T --tp", 2, "--tp needs a value"},
        {"audit T --tp 0", 2, "--tp wants an integer from 1 to 4096, not '0'"},
        {"audit T --json=1", 2, "--json takes no value"},
        {"audit", 2, "missing MODEL"},
        {"audit T T", 2, "unexpected argument"},
        {"read T --direct --buffered", 2, "--direct and --buffered cannot be used together"},
        {"read T --buffered --buffered --io=pread", 0, NULL},
        {"convert --verify --compare-rules T", 2, "cannot be used together"},
        {"run T -p hi --ids 1", 2, "cannot be used together"},
        {"synth N --preset=huge", 2, "--preset wants one of tiny, small, full, not 'huge'"},
        {"tokenize T --text a --file", 2, "--file needs a value"},
        {"detokenize T --ids 1 --ids 2", 2, "--ids given more than once"},
        /* --tp: one flag in every command that loads a model, its device named above 1 */
        {"chat T --tp 2", 2, "--tp above 1 needs --device cpu"},
        {"serve T --tp 3 --device cpu --expert-parallel", 2, "valid sizes (expert parallel)"},
        {"bench decode T --tp 4", 2, "--tp above 1 needs --device cpu"},
        {"run T --ids 1 --tp 0 --device cpu", 2, "--tp wants an integer from 1 to 64"},
        {"run T --ids 1 --expert-parallel --device cpu", 2, "add --tp 2 or more"},
        {"bench decode T --expert-parallel", 2, "add --tp 2 or more"},
        {"audit T --tp 2 --expert-parallel --json", 0, NULL},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char *out, *err;
        int rc = kl_capture(rows[i].args, &out, &err);
        ck_assert_msg(rc == rows[i].rc, "`kl %s`: expected exit %d, got %d (stderr: %s)",
                      rows[i].args, rows[i].rc, rc, err);
        ck_assert_msg(!rows[i].err || strstr(err, rows[i].err), "`kl %s`: stderr lacks \"%s\": %s",
                      rows[i].args, rows[i].err, err);
        free(out);
        free(err);
    }
}
END_TEST

START_TEST(help_lists_every_option_of_the_table)
{
    char *out, *err;
    ck_assert_int_eq(kl_capture("read --help", &out, &err), 0);
    static const char *const want[] = {"usage: kl read", "  --io B", "  --direct", "--mapped",
                                       "  --ceiling-size BYTES", "  --repeat N", "  -h, --help",
                                       "Exit status:"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        ck_assert_msg(strstr(out, want[i]) != NULL, "help lacks \"%s\": %s", want[i], out);
    free(out);
    free(err);
    /* with --json the help is one object too */
    ck_assert_int_eq(kl_capture("run --help --json", &out, &err), 0);
    cJSON *j = one_object("run --help --json", out);
    const char *h = cJSON_GetStringValue(cJSON_GetObjectItem(j, "help"));
    ck_assert_msg(h && strstr(h, "--logits-out FILE") && strstr(h, "--route-weights W"),
                  "help object: %s", out);
    cJSON_Delete(j);
    free(out);
    free(err);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* tokenize                                                                                    */

START_TEST(tokenize_json_prints_one_object_for_all_inputs)
{
    char *out, *err;
    ck_assert_int_eq(kl_capture("tokenize T --text Hi --file - --text 'Hello<|im_end|>' --json",
                                &out, &err),
                     0);
    cJSON *j = one_object("tokenize --json", out);
    cJSON *in = cJSON_GetObjectItem(j, "inputs");
    ck_assert_msg(cJSON_GetArraySize(in) == 3, "three inputs: %s", out);
    char *ids = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(in, 2), "ids"));
    ck_assert_msg(!strcmp(ids, "[72,101,108,108,111,770]"), "ids of the third input: %s", ids);
    ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(in, 1),
                                                              "source")),
                     "-");
    cJSON_free(ids);
    cJSON_Delete(j);
    free(out);
    free(err);
}
END_TEST

START_TEST(tokenize_file_that_is_not_a_regular_file_exits_2)
{
    char fifo[700], args[2000];
    snprintf(fifo, sizeof fifo, "%s/fifo", g_root);
    unlink(fifo);
    ck_assert(mkfifo(fifo, 0600) == 0);
    const char *paths[] = {g_root, fifo, "/dev/null", "/no/such/file"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        snprintf(args, sizeof args, "tokenize T --file '%s'", paths[i]);
        char *out, *err;
        int rc = kl_capture(args, &out, &err);
        ck_assert_msg(rc == 2, "`kl %s`: expected exit 2, got %d (%s)", args, rc, err);
        ck_assert_msg(strstr(err, "cannot read the input") && strstr(err, paths[i]),
                      "`kl %s`: unclear message: %s", args, err);
        free(out);
        free(err);
    }
    unlink(fifo);
}
END_TEST

/* --device: gpu where this build has no GPU support (the CPU build make test uses) is one clear
 * error naming the way out, in every command that takes it; auto and cpu run on the CPU; an
 * unknown device is a usage error. */
START_TEST(device_choice_is_checked_and_gpu_refused_clearly_without_support)
{
    const char *gpu[] = {"run T --ids 1,2 -n 1 --device gpu", "chat T -n 1 --device gpu",
                         "bench decode T --prompt-tokens 2 --tokens 1 --device gpu"};
    for (size_t i = 0; i < sizeof gpu / sizeof *gpu; i++) {
        char *out, *err;
        int rc = kl_capture(gpu[i], &out, &err);
        ck_assert_msg(rc == 2, "`kl %s`: expected exit 2 without a GPU, got %d", gpu[i], rc);
        ck_assert_msg(strstr(err, "without GPU support") && strstr(err, "GPU=cuda"),
                      "`kl %s`: unclear message: %s", gpu[i], err);
        free(out);
        free(err);
    }
    ck_assert_int_eq(kl("run T --ids 1,2 -n 1 --device cpu", "> /dev/null"), 0);
    ck_assert_int_eq(kl("run T --ids 1,2 -n 1 --device auto", "> /dev/null"), 0);
    char *out, *err;
    ck_assert_int_eq(kl_capture("run T --ids 1,2 -n 1 --device tpu", &out, &err), 2);
    ck_assert_msg(strstr(err, "auto, cpu or gpu"), "unclear message: %s", err);
    free(out);
    free(err);
}
END_TEST

/* bench decode --decode-at: one row per listed context in the JSON; a malformed list is a
 * usage error (exit 2) before anything is loaded. */
START_TEST(bench_decode_at_lists_each_context)
{
    char *out, *err;
    int rc = kl_capture("bench decode T --prompt-tokens 2 --tokens 2 --decode-at 0,40 --json -q",
                        &out, &err);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
    cJSON *j = one_object("bench decode --decode-at", out);
    cJSON *at = cJSON_GetObjectItem(j, "decode_at_context");
    ck_assert_msg(cJSON_GetArraySize(at) == 2, "decode_at_context: %s", out);
    cJSON *second = cJSON_GetArrayItem(at, 1);
    ck_assert_int_eq((int)cJSON_GetObjectItem(second, "context")->valuedouble, 40);
    ck_assert(cJSON_GetObjectItem(second, "decode_tok_s")->valuedouble > 0);
    cJSON_Delete(j);
    free(out);
    free(err);
    const char *bad[] = {"1,,2", ",1", "1,", "x", "1,2,3,4,5,6,7,8,9", "99999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[200];
        snprintf(args, sizeof args, "bench decode T --decode-at %s", bad[i]);
        ck_assert_msg(kl_capture(args, &out, &err) == 2, "`kl %s` is not a usage error", args);
        ck_assert_msg(strstr(err, "--decode-at wants"), "`kl %s`: %s", args, err);
        free(out);
        free(err);
    }
}
END_TEST

/* bench decode --batch-at: one row per number of sequences decoding together; a malformed
 * list is a usage error. */
START_TEST(bench_decode_batch_at_lists_each_batch)
{
    char *out, *err;
    int rc = kl_capture("bench decode T --prompt-tokens 2 --tokens 3 --batch-at 1,3 --json -q",
                        &out, &err);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
    cJSON *j = one_object("bench decode --batch-at", out);
    cJSON *bt = cJSON_GetObjectItem(j, "batch_at");
    ck_assert_msg(cJSON_GetArraySize(bt) == 2, "batch_at: %s", out);
    cJSON *second = cJSON_GetArrayItem(bt, 1);
    ck_assert_int_eq((int)cJSON_GetObjectItem(second, "sequences")->valuedouble, 3);
    ck_assert(cJSON_GetObjectItem(second, "decode_tok_s")->valuedouble > 0);
    ck_assert(cJSON_GetObjectItem(second, "ms_per_step")->valuedouble > 0);
    cJSON_Delete(j);
    free(out);
    free(err);
    ck_assert_int_eq(kl_capture("bench decode T --batch-at 0", &out, &err), 2);
    ck_assert_msg(strstr(err, "--batch-at wants"), "%s", err);
    free(out);
    free(err);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *cli_suite(void)
{
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("contract");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, json_usage_error_is_one_object_and_exit_2, 0, N_CASES);
    tcase_add_loop_test(tc, misspelt_option_gets_one_line_and_a_did_you_mean, 0, N_CASES);
    tcase_add_loop_test(tc, stdout_on_dev_full_or_closed_exits_2, 0, N_CASES);
    tcase_add_test(tc, misspelt_command_gets_a_did_you_mean);
    tcase_add_test(tc, options_parse_one_way_in_every_command);
    tcase_add_test(tc, help_lists_every_option_of_the_table);
    tcase_add_test(tc, tokenize_json_prints_one_object_for_all_inputs);
    tcase_add_test(tc, tokenize_file_that_is_not_a_regular_file_exits_2);
    tcase_add_test(tc, device_choice_is_checked_and_gpu_refused_clearly_without_support);
    tcase_add_test(tc, bench_decode_batch_at_lists_each_batch);
    tcase_add_test(tc, bench_decode_at_lists_each_context);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(cli_suite());
}
