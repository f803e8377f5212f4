/*
 * tests/test_generate.c — state snapshots (kl_state_copy), the shared sampling loop
 * (kl_generate) and `kl chat`'s prefix reuse.
 *
 * Engine (on a tiny synthetic checkpoint): a second chat turn fed from the snapshot taken at the
 * end of the first prompt gives the same logits (≤ 1e-5 relative L2; in practice bit-identical)
 * as a fresh state fed the whole rendered conversation, even after the live state went on
 * generating; continuing the live state after kl_generate matches a fresh prefill of the same
 * ids.  CLI (through $KL_BIN): `kl chat` with two lines on stdin exits 0, prints two replies
 * and reports reused tokens on turn 2; bad flags exit 2.
 */
#include "common/err.h"
#include "common/mem.h"
#include "synth/synth.h"
#include "engine/chat.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdint.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_root[512], g_model[600];
static const char *g_kl;

/* ------------------------------------------------------------------------------------------ */
/* Fixture and helpers                                                                         */

static void setup_model(void)
{
    g_kl = getenv("KL_BIN");
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_model, sizeof g_model, "%s/tiny", g_root);
    t_synth_tiny(g_model, 5);
}

static void teardown_model(void)
{
    if (g_root[0])
        t_rmrf(g_root);
}

/* The model and tokenizer of the fixture, opened per test. */
typedef struct eng {
    kl_model     *m;
    kl_tokenizer *tok;
    uint32_t      vocab;
} eng;

static void eng_open(eng *e)
{
    kl_err err;
    kl_err_clear(&err);
    kl_model_opts mo = {.threads = 2};
    int rc = kl_tok_open(g_model, &e->tok, &err);
    ck_assert_msg(rc == 0, "kl_tok_open: %s", t_fmt_err(&err));
    rc = kl_model_open(&e->m, g_model, &mo, &err);
    ck_assert_msg(rc == 0, "kl_model_open: %s", t_fmt_err(&err));
    e->vocab = e->m->cfg.vocab_size;
}

static void eng_close(eng *e)
{
    kl_model_close(e->m);
    kl_tok_close(e->tok);
}

/* Renders msgs[0..n) with the generation prompt and encodes it; *ids kl_malloc'd. */
static size_t render_ids(const eng *e, const kl_chat_msg *msgs, size_t n, uint32_t **ids)
{
    kl_err err;
    kl_err_clear(&err);
    char *text = NULL;
    size_t n_ids = 0;
    int rc = kl_chat_render(msgs, n, NULL, 1, &text, &err);
    ck_assert_msg(rc == 0, "kl_chat_render: %s", t_fmt_err(&err));
    rc = kl_tok_encode(e->tok, text, strlen(text), ids, &n_ids, &err);
    ck_assert_msg(rc == 0, "kl_tok_encode(\"%s\"): %s", text, t_fmt_err(&err));
    kl_free(text);
    return n_ids;
}

/* Feeds ids[0..n) to s; logits after the last into out (may be NULL). */
static void feed(eng *e, kl_state *s, const kl_token *ids, size_t n, float *out)
{
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_forward(e->m, s, ids, n, out, &err);
    ck_assert_msg(rc == 0, "kl_forward of %zu ids: %s", n, t_fmt_err(&err));
}

/* ||a - b|| / ||b|| over n floats. */

static void state_init(eng *e, kl_state *s)
{
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_state_init(s, e->m, &err);
    ck_assert_msg(rc == 0, "kl_state_init: %s", t_fmt_err(&err));
}

/* ------------------------------------------------------------------------------------------ */
/* Engine                                                                                      */

START_TEST(resumed_turn_from_snapshot_matches_fresh_prefill)
{
    eng e;
    eng_open(&e);
    kl_err err;
    kl_err_clear(&err);
    kl_chat_msg conv[4] = {
        {.role = "system", .content = "You are terse."},
        {.role = "user", .content = "What is the capital of France?"},
        {.role = "assistant", .content = "Paris."},
        {.role = "user", .content = "And of Italy?"},
    };
    uint32_t *t1, *t2;
    size_t n1 = render_ids(&e, conv, 2, &t1), n2 = render_ids(&e, conv, 4, &t2);
    ck_assert_msg(n1 > 0 && n2 > n1 && !memcmp(t1, t2, n1 * sizeof *t1),
                  "turn 2's ids (%zu) must extend turn 1's (%zu)", n2, n1);

    kl_state live, snap, fresh;
    state_init(&e, &live);
    state_init(&e, &snap);
    state_init(&e, &fresh);
    float *lg = calloc(e.vocab, sizeof *lg), *resumed = calloc(e.vocab, sizeof *resumed);
    float *ref = calloc(e.vocab, sizeof *ref);
    feed(&e, &live, t1, n1, lg);
    int rc = kl_state_copy(&snap, &live, &err);
    ck_assert_msg(rc == 0, "kl_state_copy (snapshot): %s", t_fmt_err(&err));
    ck_assert_msg(snap.pos == n1, "snapshot position: expected %zu, got %zu", n1, snap.pos);

    /* the live state moves on (a reply of other ids), then is restored from the snapshot */
    feed(&e, &live, t2 + n1, n2 - n1, NULL);
    feed(&e, &live, t1, n1, NULL);
    rc = kl_state_copy(&live, &snap, &err);
    ck_assert_msg(rc == 0, "kl_state_copy (restore): %s", t_fmt_err(&err));
    feed(&e, &live, t2 + n1, n2 - n1, resumed);
    feed(&e, &fresh, t2, n2, ref);

    double rel = t_rel_l2(resumed, ref, e.vocab);
    ck_assert_msg(rel <= 1e-5, "resumed vs fresh logits (%zu + %zu ids): expected rel L2 <= 1e-5, "
                  "got %g", n1, n2 - n1, rel);
    ck_assert_msg(!memcmp(resumed, ref, e.vocab * sizeof *ref),
                  "resumed vs fresh logits: expected bit-identical (rel L2 %g)", rel);

    free(lg);
    free(resumed);
    free(ref);
    kl_free(t1);
    kl_free(t2);
    kl_state_free(&live);
    kl_state_free(&snap);
    kl_state_free(&fresh);
    eng_close(&e);
}
END_TEST

START_TEST(live_state_after_generate_matches_fresh_prefill)
{
    eng e;
    eng_open(&e);
    kl_err err;
    kl_err_clear(&err);
    kl_chat_msg msg = {.role = "user", .content = "Count to five."};
    uint32_t *t1;
    size_t n1 = render_ids(&e, &msg, 1, &t1);

    kl_state live, fresh;
    state_init(&e, &live);
    state_init(&e, &fresh);
    kl_sampler samp;
    kl_sampler_opts so = {.top_p = 1};
    ck_assert(kl_sampler_init(&samp, e.vocab, &so, &err) == 0);
    float *lg = calloc(e.vocab, sizeof *lg), *ref = calloc(e.vocab, sizeof *ref);
    uint32_t gen[8];
    feed(&e, &live, t1, n1, lg);
    kl_gen g = {.m = e.m, .st = &live, .samp = &samp, .tok = e.tok, .logits = lg,
                .n_predict = 8, .ids = gen};
    int rc = kl_generate(&g, &err);
    ck_assert_msg(rc == 0, "kl_generate: %s", t_fmt_err(&err));
    ck_assert_msg(g.n_ids <= 8 && (g.n_fed == g.n_ids || g.n_fed + 1 == g.n_ids),
                  "kl_generate: %zu ids, %zu fed (n_predict 8, stopped %d)", g.n_ids, g.n_fed,
                  g.stopped);
    ck_assert_msg(live.pos == n1 + g.n_fed, "live position: expected %zu, got %zu",
                  n1 + g.n_fed, live.pos);

    /* the next prompt extends prompt + fed ids: only the tail is new */
    uint32_t tail[3] = {7, 11, 13};
    size_t n_all = n1 + g.n_fed + 3;
    uint32_t *all = malloc(n_all * sizeof *all);
    memcpy(all, t1, n1 * sizeof *all);
    memcpy(all + n1, gen, g.n_fed * sizeof *all);
    memcpy(all + n1 + g.n_fed, tail, sizeof tail);
    feed(&e, &live, tail, 3, lg);
    feed(&e, &fresh, all, n_all, ref);
    double rel = t_rel_l2(lg, ref, e.vocab);
    ck_assert_msg(rel <= 1e-5, "live continuation vs fresh (%zu ids): expected rel L2 <= 1e-5, "
                  "got %g", n_all, rel);

    free(all);
    free(lg);
    free(ref);
    kl_free(t1);
    kl_sampler_free(&samp);
    kl_state_free(&live);
    kl_state_free(&fresh);
    eng_close(&e);
}
END_TEST

/* Counts on_fed calls, and those that got a row of logits. */
typedef struct fed_count {
    size_t calls, with_logits;
} fed_count;

static int count_fed(void *user, const float *logits, kl_err *err)
{
    (void)err;
    fed_count *f = user;
    f->calls++;
    f->with_logits += logits != NULL;
    return 0;
}

/* Greedy: the same ids whether each fed id's logits come back or only its argmax; without
 * keep_logits on_fed gets NULL and the logits are marked stale, with it they follow the last
 * fed id (as a fresh feed gives them). */
START_TEST(greedy_generation_needs_only_the_argmax)
{
    eng e;
    eng_open(&e);
    kl_err err;
    kl_err_clear(&err);
    kl_chat_msg msg = {.role = "user", .content = "Name three colours."};
    uint32_t *t1;
    size_t n1 = render_ids(&e, &msg, 1, &t1);
    kl_sampler samp;
    kl_sampler_opts so = {.top_p = 1};
    ck_assert(kl_sampler_init(&samp, e.vocab, &so, &err) == 0);
    float *lg = calloc(e.vocab, sizeof *lg), *ref = calloc(e.vocab, sizeof *ref);
    uint32_t gen[2][8];
    size_t n_ids[2];
    for (int keep = 0; keep < 2; keep++) {
        kl_state st;
        state_init(&e, &st);
        feed(&e, &st, t1, n1, lg);
        fed_count fc = {0};
        kl_gen g = {.m = e.m, .st = &st, .samp = &samp, .tok = e.tok, .logits = lg,
                    .n_predict = 8, .ids = gen[keep], .on_fed = count_fed, .user = &fc,
                    .keep_logits = keep};
        int rc = kl_generate(&g, &err);
        ck_assert_msg(rc == 0, "kl_generate (keep_logits %d): %s", keep, t_fmt_err(&err));
        n_ids[keep] = g.n_ids;
        ck_assert_msg(g.n_fed > 0, "nothing fed (%zu ids, stopped %d)", g.n_ids, g.stopped);
        ck_assert_msg(fc.calls == g.n_fed && fc.with_logits == (keep ? g.n_fed : 0),
                      "keep_logits %d: %zu on_fed calls (%zu with logits) for %zu fed ids",
                      keep, fc.calls, fc.with_logits, g.n_fed);
        ck_assert_msg(g.logits_stale == !keep, "keep_logits %d: logits_stale %d", keep,
                      g.logits_stale);
        if (keep) {   /* the logits after the last fed id, as a fresh feed gives them */
            kl_state fresh;
            state_init(&e, &fresh);
            feed(&e, &fresh, t1, n1, NULL);
            feed(&e, &fresh, gen[keep], g.n_fed, ref);
            double rel = t_rel_l2(lg, ref, e.vocab);
            ck_assert_msg(rel <= 1e-5, "logits after generate vs fresh: rel L2 %g", rel);
            kl_state_free(&fresh);
        }
        kl_state_free(&st);
    }
    ck_assert_msg(n_ids[0] == n_ids[1] && !memcmp(gen[0], gen[1], n_ids[0] * sizeof gen[0][0]),
                  "greedy ids differ with and without the logits (%zu and %zu ids)", n_ids[0],
                  n_ids[1]);
    free(lg);
    free(ref);
    kl_free(t1);
    kl_sampler_free(&samp);
    eng_close(&e);
}
END_TEST

/* kl_sampler_sample_best without logits: greedy takes best; anything else, or a best outside
 * the vocabulary, is refused. */
START_TEST(sample_best_without_logits)
{
    kl_err err;
    kl_err_clear(&err);
    kl_sampler s;
    kl_sampler_opts greedy = {.top_p = 1}, hot = {.temperature = 0.7f, .top_p = 1};
    kl_token id = 0;
    ck_assert(kl_sampler_init(&s, 100, &greedy, &err) == 0);
    ck_assert(kl_sampler_greedy(&s));
    ck_assert_int_eq(kl_sampler_sample_best(&s, NULL, 42, &id, &err), 0);
    ck_assert_uint_eq(id, 42);
    ck_assert_int_eq(kl_sampler_sample_best(&s, NULL, 100, &id, &err), KL_E_USAGE);
    ck_assert_msg(strstr(err.msg, "outside the vocabulary"), "message: %s", err.msg);
    kl_sampler_free(&s);
    kl_err_clear(&err);
    ck_assert(kl_sampler_init(&s, 100, &hot, &err) == 0);
    ck_assert(!kl_sampler_greedy(&s));
    ck_assert_int_eq(kl_sampler_sample_best(&s, NULL, 42, &id, &err), KL_E_USAGE);
    ck_assert_msg(strstr(err.msg, "needs the logits"), "message: %s", err.msg);
    kl_sampler_free(&s);
}
END_TEST

START_TEST(state_copy_onto_itself_is_a_no_op)
{
    eng e;
    eng_open(&e);
    kl_err err;
    kl_err_clear(&err);
    kl_state s;
    state_init(&e, &s);
    uint32_t ids[2] = {3, 4};
    feed(&e, &s, ids, 2, NULL);
    ck_assert_msg(kl_state_copy(&s, &s, &err) == 0 && s.pos == 2,
                  "copy onto itself: expected 0 and pos 2, got pos %zu", s.pos);
    kl_state_free(&s);
    eng_close(&e);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* CLI                                                                                         */

/* Runs `printf INPUT | $KL_BIN chat MODEL args`, stdout/stderr into g_root/out, g_root/err. */
static int kl_chat(const char *input, const char *args)
{
    ck_assert_msg(g_kl && *g_kl, "KL_BIN must name the kl binary under test");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "printf '%s' | '%s' chat '%s' %s > '%s/out' 2> '%s/err'", input,
             g_kl, g_model, args, g_root, g_root);
    int st = system(cmd);
    ck_assert_msg(st != -1 && WIFEXITED(st), "`%s` did not exit normally", cmd);
    return WEXITSTATUS(st);
}

static char *slurp(const char *name)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", g_root, name);
    return t_slurp(path, NULL);
}

START_TEST(chat_two_turns_exit_0_and_reuse_the_prefix)
{
    int rc = kl_chat("hello there\\nand once more\\n", "-n 6 --threads 2 --system 'be brief'");
    char *err = slurp("err"), *out = slurp("out");
    ck_assert_msg(rc == 0, "kl chat: expected exit 0, got %d; stderr: %s", rc, err);
    size_t lines = 0;
    for (const char *p = out; *p; p++)
        lines += *p == '\n';
    ck_assert_msg(lines >= 2, "stdout: expected two replies (newline-terminated), got %zu: %s",
                  lines, out);
    const char *t1 = strstr(err, "in: "), *t2 = t1 ? strstr(t1 + 4, "in: ") : NULL;
    ck_assert_msg(t1 && t2, "stderr: expected an \"in: R + N\" line per turn, got: %s", err);
    unsigned long r1, n1, r2, n2;
    ck_assert_msg(sscanf(t1, "in: %lu + %lu", &r1, &n1) == 2 &&
                      sscanf(t2, "in: %lu + %lu", &r2, &n2) == 2,
                  "stderr: unparsable counts: %s", err);
    ck_assert_msg(r1 == 0 && n1 > 0, "turn 1: expected 0 + N>0, got %lu + %lu", r1, n1);
    ck_assert_msg(r2 >= n1 && n2 > 0, "turn 2: expected >= %lu reused and new ids, got %lu + %lu",
                  n1, r2, n2);
    free(err);
    free(out);
}
END_TEST

START_TEST(chat_bad_flags_exit_2)
{
    const char *bad[] = {"--temp -1", "--top-p 0", "-n x", "--bogus", "--threads 0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = kl_chat("hi\\n", bad[i]);
        ck_assert_msg(rc == 2, "kl chat %s: expected exit 2, got %d", bad[i], rc);
    }
}
END_TEST


START_TEST(chat_exit_ends_and_reset_starts_a_new_conversation)
{
    int rc = kl_chat("hello there\\n/reset\\nhello there\\n/exit\\nnever read\\n", "-n 4 --threads 2");
    char *err = slurp("err"), *out = slurp("out");
    ck_assert_msg(rc == 0, "kl chat: expected exit 0, got %d; stderr: %s", rc, err);
    ck_assert_msg(strstr(err, "new conversation") != NULL, "no /reset notice: %s", err);
    const char *t1 = strstr(err, "in: "), *t2 = t1 ? strstr(t1 + 4, "in: ") : NULL;
    ck_assert_msg(t1 && t2 && !strstr(t2 + 4, "in: "), "expected exactly two turns: %s", err);
    unsigned long r1, n1, r2, n2;
    ck_assert_msg(sscanf(t1, "in: %lu + %lu", &r1, &n1) == 2 &&
                      sscanf(t2, "in: %lu + %lu", &r2, &n2) == 2,
                  "stderr: unparsable counts: %s", err);
    ck_assert_msg(r1 == 0 && r2 == 0 && n1 == n2 && n1 > 0,
                  "after /reset the same line is a fresh prompt: got %lu + %lu, then %lu + %lu",
                  r1, n1, r2, n2);
    free(err);
    free(out);
}
END_TEST

START_TEST(chat_turn_over_the_context_is_refused_and_the_chat_goes_on)
{
    char model[700], cmd[8192];
    snprintf(model, sizeof model, "%s/short", g_root);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s' && sed -i "
             "'s/\"model_max_length\": *[0-9]*/\"model_max_length\": 40/' '%s/config.json'",
             model, g_model, model, model);
    ck_assert(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "printf 'hi\\nthis line is a good deal longer than forty tokens of "
             "context, so it is refused\\n/exit\\n' | '%s' chat '%s' -n 4 > '%s/out' 2> '%s/err'",
             g_kl, model, g_root, g_root);
    int st = system(cmd);
    ck_assert(st != -1 && WIFEXITED(st));
    char *err = slurp("err");
    ck_assert_msg(WEXITSTATUS(st) == 2, "expected exit 2 after a refused turn, got %d: %s",
                  WEXITSTATUS(st), err);
    ck_assert_msg(strstr(err, "to generate exceed the model's context of 40 tokens") &&
                      strstr(err, "in: 0 + "),
                  "expected one turn and one refusal naming 40: %s", err);
    const char *in2 = strstr(strstr(err, "in: ") + 4, "in: ");
    ck_assert_msg(!in2, "the refused turn was fed: %s", err);
    free(err);
}
END_TEST

/* Reads what is available on fd into buf (appending, NUL-terminated); 0 at EOF. */
static ssize_t drain(int fd, char *buf, size_t cap, size_t *len)
{
    char tmp[4096];
    ssize_t k = read(fd, tmp, sizeof tmp);
    if (k > 0 && *len + 1 < cap) {
        size_t c = (size_t)k < cap - 1 - *len ? (size_t)k : cap - 1 - *len;
        memcpy(buf + *len, tmp, c);
        *len += c;
        buf[*len] = 0;
    }
    return k;
}

/* Polls the child's stdout and stderr (reading both) until stderr holds want, or until both
 * end when want is NULL; fails the test after limit_s seconds without progress (a hang). */
static void pump(int out, int err, char *ebuf, size_t ecap, size_t *elen, const char *want,
                 int limit_s)
{
    static char obuf[1 << 16];
    size_t olen = 0;
    int open_out = 1, open_err = 1;
    while (open_out || open_err) {
        if (want && strstr(ebuf, want))
            return;
        struct pollfd p[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
        int k = poll(p, 2, limit_s * 1000);
        ck_assert_msg(k > 0, "kl chat: no output for %d s (waiting for \"%s\"); stderr: %s",
                      limit_s, want ? want : "EOF", ebuf);
        if (open_out && p[0].revents && drain(out, obuf, sizeof obuf, &olen) <= 0)
            open_out = 0, p[0].fd = -1;
        if (olen > sizeof obuf / 2)
            olen = 0;
        if (open_err && p[1].revents && drain(err, ebuf, ecap, elen) <= 0)
            open_err = 0;
        if (!open_out)
            out = -1;
        if (!open_err)
            err = -1;
    }
    ck_assert_msg(!want, "kl chat ended before \"%s\": %s", want, ebuf);
}

START_TEST(chat_ctrl_c_stops_the_reply_only)
{
    int in[2], out[2], err[2];
    ck_assert(pipe(in) == 0 && pipe(out) == 0 && pipe(err) == 0);
    /* a small stdout pipe that nobody reads yet: the reply (tens of KiB for this line) blocks
     * in it, so it is still running whenever the signal comes */
    fcntl(out[1], F_SETPIPE_SZ, 4096);
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(in[1]);
        close(out[0]);
        close(err[0]);
        execl(g_kl, "kl", "chat", g_model, "-n", "1000000", "--threads", "1", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    ck_assert(write(in[1], "g\n", 2) == 2);
    /* the reply has started once stdout is readable: the line was read, the turn is on */
    struct pollfd p = {out[0], POLLIN, 0};
    ck_assert_msg(poll(&p, 1, 120000) == 1, "kl chat: no reply within 120 s");
    ck_assert(kill(pid, SIGINT) == 0);
    static char ebuf[1 << 16];
    size_t elen = 0;
    ebuf[0] = 0;
    pump(out[0], err[0], ebuf, sizeof ebuf, &elen, "reply interrupted", 120);
    int st;
    ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "kl chat exited after one Ctrl-C: %s", ebuf);
    ck_assert(write(in[1], "/exit\n", 6) == 6);
    close(in[1]);
    pump(out[0], err[0], ebuf, sizeof ebuf, &elen, NULL, 120);
    ck_assert(waitpid(pid, &st, 0) == pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "after /exit: expected exit 0, got status %d; stderr: %s", st, ebuf);
    ck_assert_msg(strstr(ebuf, "in: 0 + ") != NULL, "no turn line: %s", ebuf);
    close(out[0]);
    close(err[0]);
}
END_TEST

static Suite *generate_suite(void)
{
    Suite *s = suite_create("generate");
    TCase *tc = tcase_create("engine");
    tcase_add_unchecked_fixture(tc, setup_model, teardown_model);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, resumed_turn_from_snapshot_matches_fresh_prefill);
    tcase_add_test(tc, live_state_after_generate_matches_fresh_prefill);
    tcase_add_test(tc, state_copy_onto_itself_is_a_no_op);
    tcase_add_test(tc, greedy_generation_needs_only_the_argmax);
    tcase_add_test(tc, sample_best_without_logits);
    suite_add_tcase(s, tc);
    tc = tcase_create("cli");
    tcase_add_unchecked_fixture(tc, setup_model, teardown_model);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, chat_two_turns_exit_0_and_reuse_the_prefix);
    tcase_add_test(tc, chat_bad_flags_exit_2);
    tcase_add_test(tc, chat_exit_ends_and_reset_starts_a_new_conversation);
    tcase_add_test(tc, chat_turn_over_the_context_is_refused_and_the_chat_goes_on);
    tcase_add_test(tc, chat_ctrl_c_stops_the_reply_only);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(generate_suite());
}
