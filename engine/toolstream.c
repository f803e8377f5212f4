/*
 * engine/toolstream.c — the streaming Kimi tool-call parser (see toolstream.h).
 *
 * Bytes wait in pend until they are decided: each state knows the markers that can end it;
 * text before the first whole marker is handled by the state, and a tail that could still be
 * the start of a marker (or, in arguments, blanks that may turn out to be trailing) stays in
 * pend for the next piece.
 */
#include "engine/toolstream.h"

#include "common/grow.h"
#include "common/mem.h"

#include <string.h>

enum { CONTENT, SECTION, ID, ARGS, SKIP, AFTER };

/* Markers, and which of them end each state (a bit per marker). */
enum { M_SEC_BEGIN, M_SEC_BEGIN_1, M_SEC_END, M_SEC_END_1, M_CALL_BEGIN, M_ARG_BEGIN, M_CALL_END,
       M_COUNT };
static const char *const marker[M_COUNT] = {
    "<|tool_calls_section_begin|>", "<|tool_call_section_begin|>", "<|tool_calls_section_end|>",
    "<|tool_call_section_end|>",    "<|tool_call_begin|>",        "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
};
#define BIT(m) (1u << (m))
#define SEC_END (BIT(M_SEC_END) | BIT(M_SEC_END_1))
static const unsigned ends[] = {
    [CONTENT] = BIT(M_SEC_BEGIN) | BIT(M_SEC_BEGIN_1),
    [SECTION] = BIT(M_CALL_BEGIN) | SEC_END,
    [ID] = BIT(M_ARG_BEGIN) | BIT(M_CALL_BEGIN) | BIT(M_CALL_END) | SEC_END,
    [ARGS] = BIT(M_CALL_END) | BIT(M_CALL_BEGIN) | SEC_END,
    [SKIP] = BIT(M_CALL_END) | BIT(M_CALL_BEGIN) | SEC_END,
    [AFTER] = 0,
};

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* The earliest whole marker of set in s[0..n): its offset, *which; -1 if none. */
static long first_marker(const char *s, size_t n, unsigned set, int *which)
{
    long best = -1;
    for (int m = 0; m < M_COUNT; m++) {
        if (!(set & BIT(m)))
            continue;
        size_t ml = strlen(marker[m]);
        for (size_t i = 0; i + ml <= n && (best < 0 || (long)i < best); i++) {
            if (!memcmp(s + i, marker[m], ml)) {
                best = (long)i;
                *which = m;
                break;
            }
        }
    }
    return best;
}

/* The longest tail of s[0..n) that a marker of set starts with (shorter than the marker). */
static size_t marker_tail(const char *s, size_t n, unsigned set)
{
    size_t best = 0;
    for (int m = 0; m < M_COUNT; m++) {
        if (!(set & BIT(m)))
            continue;
        size_t ml = strlen(marker[m]);
        for (size_t k = ml - 1 < n ? ml - 1 : n; k > best; k--)
            if (!memcmp(s + n - k, marker[m], k)) {
                best = k;
                break;
            }
    }
    return best;
}

static int emit(kl_toolstream *ts, kl_ts_event ev, kl_err *err)
{
    return ts->emit ? ts->emit(ts->user, &ev, err) : 0;
}

/* ID.split(":")[0].split(".")[-1] of a valid id, into name (room for n_id + 1). */
static void name_of(const char *id, char *name)
{
    const char *colon = strchr(id, ':'), *b = colon;
    while (b > id && b[-1] != '.')
        b--;
    memcpy(name, b, (size_t)(colon - b));
    name[colon - b] = '\0';
}

/* The id held so far, trimmed, in place; 1 if it is NAME:DIGITS with no '<' in NAME. */
static int trim_and_check_id(kl_toolstream *ts)
{
    char *s = ts->id;
    size_t n = ts->n_id;
    while (n && is_blank(s[n - 1]))
        n--;
    size_t b = 0;
    while (b < n && is_blank(s[b]))
        b++;
    memmove(s, s + b, n - b);
    n -= b;
    s[n] = '\0';
    ts->n_id = n;
    const char *colon = memrchr(s, ':', n);
    if (!colon || colon == s || colon + 1 == s + n || memchr(s, '<', n))
        return 0;
    for (const char *p = colon + 1; p < s + n; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

/* A call's id is complete: CALL_BEGIN, or SKIP for a malformed one. */
static int begin_call(kl_toolstream *ts, kl_err *err)
{
    if (!trim_and_check_id(ts)) {
        ts->state = SKIP;
        return 0;
    }
    char *name = kl_malloc(ts->n_id + 1);
    if (!name)
        return kl_fail(err, KL_E_NOMEM, "out of memory parsing a tool call");
    name_of(ts->id, name);
    kl_ts_event ev = {.kind = KL_TS_CALL_BEGIN, .index = ts->n_calls++, .id = ts->id,
                      .name = name};
    int rc = emit(ts, ev, err);
    kl_free(name);
    ts->state = ARGS;
    ts->args_started = 0;
    return rc;
}

static int end_call(kl_toolstream *ts, int ok, kl_err *err)
{
    kl_ts_event ev = {.kind = KL_TS_CALL_END, .index = ts->n_calls - 1, .ok = ok};
    return emit(ts, ev, err);
}

/* Argument text: blanks before the first other byte dropped; final: trailing blanks too. */
static int args_text(kl_toolstream *ts, const char *s, size_t n, int final, kl_err *err)
{
    if (!ts->args_started)
        while (n && is_blank(*s))
            s++, n--;
    if (final)
        while (n && is_blank(s[n - 1]))
            n--;
    if (!n)
        return 0;
    ts->args_started = 1;
    kl_ts_event ev = {.kind = KL_TS_ARGS, .index = ts->n_calls - 1, .text = s, .len = n};
    return emit(ts, ev, err);
}

/* Decided text s[0..n) of the current state; final: a marker follows it. */
static int state_text(kl_toolstream *ts, const char *s, size_t n, int final, kl_err *err)
{
    switch (ts->state) {
    case CONTENT: {
        kl_ts_event ev = {.kind = KL_TS_CONTENT, .text = s, .len = n};
        return n ? emit(ts, ev, err) : 0;
    }
    case ID:
        if (kl_grow(&ts->id, &ts->cap_id, ts->n_id + n + 1, 1))
            return kl_fail(err, KL_E_NOMEM, "out of memory parsing a tool call");
        memcpy(ts->id + ts->n_id, s, n);
        ts->n_id += n;
        ts->id[ts->n_id] = '\0';
        return 0;
    case ARGS:
        return args_text(ts, s, n, final, err);
    default:   /* between calls, a malformed call, after the section: dropped */
        return 0;
    }
}

/* The state after marker m. */
static int on_marker(kl_toolstream *ts, int m, kl_err *err)
{
    int st = ts->state, rc = 0;
    if (m == M_SEC_BEGIN || m == M_SEC_BEGIN_1) {
        ts->section_seen = 1;
        ts->state = SECTION;
        return 0;
    }
    if (st == ID && m == M_ARG_BEGIN)
        return begin_call(ts, err);
    if (st == ARGS)   /* ended by its marker, or cut off by another */
        rc = end_call(ts, m == M_CALL_END, err);
    if (m == M_CALL_BEGIN) {
        ts->state = ID;
        ts->n_id = 0;
    } else {
        ts->state = m == M_CALL_END ? SECTION : AFTER;
    }
    return rc;
}

/* Trailing blanks of s[0..n) (arguments hold them until they know whether they trail). */
static size_t blank_tail(const char *s, size_t n)
{
    size_t k = 0;
    while (k < n && is_blank(s[n - 1 - k]))
        k++;
    return k;
}

/* Handles everything in pend that is decided; the undecided tail stays. */
static int drain(kl_toolstream *ts, kl_err *err)
{
    size_t at = 0;
    int rc = 0;
    while (!rc) {
        const char *s = ts->pend + at;
        size_t n = ts->n_pend - at;
        int m = -1;
        long p = first_marker(s, n, ends[ts->state], &m);
        if (p >= 0) {
            rc = state_text(ts, s, (size_t)p, 1, err);
            at += (size_t)p + strlen(marker[m]);
            if (!rc)
                rc = on_marker(ts, m, err);
            continue;
        }
        size_t keep = marker_tail(s, n, ends[ts->state]);
        if (ts->state == ARGS)
            keep += blank_tail(s, n - keep);
        rc = state_text(ts, s, n - keep, 0, err);
        at += n - keep;
        break;
    }
    memmove(ts->pend, ts->pend + at, ts->n_pend - at);
    ts->n_pend -= at;
    return rc;
}

void kl_toolstream_init(kl_toolstream *ts, kl_ts_emit_fn emit_fn, void *user)
{
    memset(ts, 0, sizeof *ts);
    ts->emit = emit_fn;
    ts->user = user;
    ts->state = CONTENT;
}

int kl_toolstream_feed(kl_toolstream *ts, const char *text, size_t len, kl_err *err)
{
    if (!len)
        return 0;
    if (kl_grow(&ts->pend, &ts->cap_pend, ts->n_pend + len, 1))
        return kl_fail(err, KL_E_NOMEM, "out of memory parsing a reply");
    memcpy(ts->pend + ts->n_pend, text, len);
    ts->n_pend += len;
    return drain(ts, err);
}

int kl_toolstream_finish(kl_toolstream *ts, kl_err *err)
{
    int rc = state_text(ts, ts->pend, ts->n_pend, 1, err);
    ts->n_pend = 0;
    if (!rc && ts->state == ARGS)
        rc = end_call(ts, 0, err);
    ts->state = AFTER;
    return rc;
}

void kl_toolstream_free(kl_toolstream *ts)
{
    if (!ts)
        return;
    kl_free(ts->pend);
    kl_free(ts->id);
    memset(ts, 0, sizeof *ts);
}
