/*
 * tests/test_toolstream.c — the streaming tool-call parser (engine/toolstream.h).
 *
 * Every reply is fed whole, byte by byte, at every two-piece split and in random pieces; the
 * events, assembled, must be the same each time and (for well-formed replies) equal what the
 * whole-reply parser kl_chat_parse_tool_calls finds.  Cases: plain text, several calls with the
 * plural and the singular section markers, blanks around ids and arguments, text that looks
 * like a marker but is not, a malformed id (skipped, the next call keeps index 0), a call cut
 * off by another call and one left open at the end (ok 0), no marker text in any event, and a
 * callback error that stops the parse.
 */
#include "common/err.h"
#include "common/mem.h"
#include "common/rng.h"
#include "engine/chat.h"
#include "engine/toolstream.h"
#include "tests/testutil.h"

#include <string.h>

#define MAX_CALLS 8
#define BUF 4096

typedef struct got_call {
    char id[256], name[256], args[BUF];
    int  ended, ok;
} got_call;

typedef struct got {
    char     content[BUF];
    got_call calls[MAX_CALLS];
    uint32_t n_calls;
    int      events_after_end;   /* an ARGS or CALL_END for a call already ended */
    int      marker_leak;        /* "<|tool" in an ARGS event, or in CONTENT after a section */
    int      fail_at_call;       /* > 0: the callback fails at this CALL_BEGIN (1-based) */
} got;

static void append(char *dst, const char *s, size_t n)
{
    size_t l = strlen(dst);
    ck_assert_msg(l + n < BUF, "event text overflows the test buffer");
    memcpy(dst + l, s, n);
    dst[l + n] = '\0';
}

static int collect(void *user, const kl_ts_event *ev, kl_err *err)
{
    got *g = user;
    switch (ev->kind) {
    case KL_TS_CONTENT:
        append(g->content, ev->text, ev->len);
        break;
    case KL_TS_CALL_BEGIN:
        ck_assert_uint_eq(ev->index, g->n_calls);
        ck_assert(g->n_calls < MAX_CALLS);
        if (g->fail_at_call && (int)g->n_calls + 1 == g->fail_at_call)
            return kl_fail(err, KL_E_CANCELLED, "stop at call %u", ev->index);
        snprintf(g->calls[g->n_calls].id, 256, "%s", ev->id);
        snprintf(g->calls[g->n_calls].name, 256, "%s", ev->name);
        g->n_calls++;
        break;
    case KL_TS_ARGS:
        ck_assert(ev->index < g->n_calls);
        g->events_after_end |= g->calls[ev->index].ended;
        if (memmem(ev->text, ev->len, "<|tool", 6))
            g->marker_leak = 1;
        append(g->calls[ev->index].args, ev->text, ev->len);
        break;
    case KL_TS_CALL_END:
        ck_assert(ev->index < g->n_calls);
        g->events_after_end |= g->calls[ev->index].ended;
        g->calls[ev->index].ended = 1;
        g->calls[ev->index].ok = ev->ok;
        break;
    }
    return 0;
}

/* Feeds text in pieces ending at cuts[0..n_cuts) (increasing), then the rest; finishes. */
static void parse_cut(const char *text, const size_t *cuts, size_t n_cuts, got *g)
{
    kl_toolstream ts;
    kl_toolstream_init(&ts, collect, g);
    kl_err err;
    kl_err_clear(&err);
    size_t at = 0, len = strlen(text);
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        ck_assert_msg(kl_toolstream_feed(&ts, text + at, to - at, &err) == 0, "%s", err.msg);
        at = to;
    }
    ck_assert_msg(kl_toolstream_finish(&ts, &err) == 0, "%s", err.msg);
    kl_toolstream_free(&ts);
}

static void same(const got *a, const got *b, const char *how)
{
    ck_assert_msg(!strcmp(a->content, b->content), "%s: content '%s' vs '%s'", how, a->content,
                  b->content);
    ck_assert_msg(a->n_calls == b->n_calls, "%s: %u vs %u calls", how, a->n_calls, b->n_calls);
    for (uint32_t i = 0; i < a->n_calls; i++) {
        const got_call *x = &a->calls[i], *y = &b->calls[i];
        ck_assert_msg(!strcmp(x->id, y->id) && !strcmp(x->name, y->name) &&
                          !strcmp(x->args, y->args) && x->ended == y->ended && x->ok == y->ok,
                      "%s: call %u differs ('%s' '%s' '%s' %d vs '%s' '%s' '%s' %d)", how, i,
                      x->id, x->name, x->args, x->ok, y->id, y->name, y->args, y->ok);
    }
}

/* Parses text whole, byte by byte, at every two-piece split and in random pieces: the same
 * events each time, every call ended once, no marker text leaking; the whole parse into *out. */
static void parse_all_ways(const char *text, got *out)
{
    memset(out, 0, sizeof *out);
    parse_cut(text, NULL, 0, out);
    ck_assert(!out->events_after_end && !out->marker_leak);
    size_t len = strlen(text);
    size_t *cuts = kl_calloc(len + 1, sizeof *cuts);
    for (size_t i = 0; i + 1 < len; i++)
        cuts[i] = i + 1;
    got *g = kl_calloc(1, sizeof *g);
    parse_cut(text, cuts, len ? len - 1 : 0, g);
    same(out, g, "byte by byte");
    for (size_t c = 1; c < len; c++) {
        memset(g, 0, sizeof *g);
        parse_cut(text, &c, 1, g);
        char how[64];
        snprintf(how, sizeof how, "split at %zu", c);
        same(out, g, how);
    }
    kl_rng r;
    kl_rng_seed(&r, 9, len);
    for (int rep = 0; rep < 50; rep++) {
        size_t n = 0;
        for (size_t at = 0; at + 1 < len;) {
            at += 1 + (size_t)(kl_rng_next(&r) % 9);
            if (at < len)
                cuts[n++] = at;
        }
        memset(g, 0, sizeof *g);
        parse_cut(text, cuts, n, g);
        same(out, g, "random pieces");
        ck_assert(!g->events_after_end && !g->marker_leak);
    }
    kl_free(g);
    kl_free(cuts);
}

/* The whole-reply parser finds the same content and calls (well-formed replies). */
static void agrees_with_whole_parser(const char *text, const got *g)
{
    kl_chat_parsed p;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_chat_parse_tool_calls(text, strlen(text), &p, &err) == 0);
    ck_assert_msg(!strcmp(p.content ? p.content : "", g->content), "content '%s' vs '%s'",
                  p.content ? p.content : "", g->content);
    ck_assert_uint_eq(p.n_calls, g->n_calls);
    for (size_t i = 0; i < p.n_calls; i++) {
        ck_assert_str_eq(p.calls[i].id, g->calls[i].id);
        ck_assert_str_eq(p.calls[i].name, g->calls[i].name);
        ck_assert_str_eq(p.calls[i].arguments, g->calls[i].args);
        ck_assert(g->calls[i].ended && g->calls[i].ok);
    }
    kl_chat_parsed_free(&p);
}

#define SB "<|tool_calls_section_begin|>"
#define SE "<|tool_calls_section_end|>"
#define CB "<|tool_call_begin|>"
#define AB "<|tool_call_argument_begin|>"
#define CE "<|tool_call_end|>"

START_TEST(plain_text_is_all_content)
{
    const char *t = "Paris is 18 C <| not a marker |> and <|tool_calls_section_begi";
    got g;
    parse_all_ways(t, &g);
    ck_assert_str_eq(g.content, t);
    ck_assert_uint_eq(g.n_calls, 0);
    agrees_with_whole_parser(t, &g);
}
END_TEST

START_TEST(several_calls_plural_markers)
{
    const char *t = "Let me check." SB CB "functions.get_weather:0" AB "{\"city\": \"Paris\"}" CE
                    CB "functions.get_time:1" AB "{\"tz\": \"CET\"}" CE SE;
    got g;
    parse_all_ways(t, &g);
    ck_assert_str_eq(g.content, "Let me check.");
    ck_assert_uint_eq(g.n_calls, 2);
    ck_assert_str_eq(g.calls[0].name, "get_weather");
    ck_assert_str_eq(g.calls[1].id, "functions.get_time:1");
    ck_assert_str_eq(g.calls[1].args, "{\"tz\": \"CET\"}");
    agrees_with_whole_parser(t, &g);
}
END_TEST

START_TEST(singular_section_markers_and_blanks)
{
    const char *t = "<|tool_call_section_begin|>" CB " \n search:0 \t" AB "  {\"q\": \"a b\"} \n"
                    CE " " CB "x.y.lookup:12" AB "[1, 2]" CE "<|tool_call_section_end|>tail";
    got g;
    parse_all_ways(t, &g);
    ck_assert_str_eq(g.content, "");
    ck_assert_uint_eq(g.n_calls, 2);
    ck_assert_str_eq(g.calls[0].id, "search:0");
    ck_assert_str_eq(g.calls[0].name, "search");
    ck_assert_str_eq(g.calls[0].args, "{\"q\": \"a b\"}");
    ck_assert_str_eq(g.calls[1].name, "lookup");
    agrees_with_whole_parser(t, &g);
}
END_TEST

START_TEST(malformed_id_is_skipped_and_cut_calls_end_not_ok)
{
    /* a bad id (no index) yields nothing; the next call is index 0; a call cut by another
     * begin ends with ok 0; the last is still open at the end of the reply */
    const char *t = "hi" SB CB "functions.nope" AB "{\"a\":1}" CE CB "f:0" AB "{\"b\":" CB
                    "g:1" AB "{\"c\": 3} ";
    got g;
    parse_all_ways(t, &g);
    ck_assert_str_eq(g.content, "hi");
    ck_assert_uint_eq(g.n_calls, 2);
    ck_assert_str_eq(g.calls[0].id, "f:0");
    ck_assert_str_eq(g.calls[0].args, "{\"b\":");
    ck_assert(g.calls[0].ended && !g.calls[0].ok);
    ck_assert_str_eq(g.calls[1].args, "{\"c\": 3}");
    ck_assert(g.calls[1].ended && !g.calls[1].ok);
}
END_TEST

START_TEST(callback_error_stops_the_parse)
{
    const char *t = SB CB "a:0" AB "{}" CE CB "b:1" AB "{}" CE SE;
    got g;
    memset(&g, 0, sizeof g);
    g.fail_at_call = 2;
    kl_toolstream ts;
    kl_toolstream_init(&ts, collect, &g);
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_toolstream_feed(&ts, t, strlen(t), &err);
    ck_assert_int_eq(rc, KL_E_CANCELLED);
    ck_assert_uint_eq(g.n_calls, 1);
    kl_toolstream_free(&ts);
    kl_toolstream_free(&ts);   /* idempotent */
}
END_TEST

static Suite *toolstream_suite(void)
{
    Suite *s = suite_create("toolstream");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, plain_text_is_all_content);
    tcase_add_test(tc, several_calls_plural_markers);
    tcase_add_test(tc, singular_section_markers_and_blanks);
    tcase_add_test(tc, malformed_id_is_skipped_and_cut_calls_end_not_ok);
    tcase_add_test(tc, callback_error_stops_the_parse);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(toolstream_suite());
}
