/*
 * tests/test_reply.c — chat-completion replies in OpenAI's wire format (serve/reply.h): the
 * server-sent events of a streamed reply (every event "data: " + one JSON object + a blank
 * line, one id/created/model, the role chunk first, content deltas, tool-call deltas with the
 * id and name once then arguments by index, the finish chunk, the usage chunk, [DONE]) fed in
 * pieces; tools off keeps marker text as content; the whole-reply object (a call cut off by
 * the limit kept, as the stream has it); a sink error stops; which ids reach a reply's text
 * (serve/answer.h: special ids never, tool-call markers with tools on inside a section).
 */
#include "common/err.h"
#include "common/json.h"
#include "common/mem.h"
#include "serve/answer.h"
#include "serve/reply.h"
#include "synth/synth.h"
#include "tests/testutil.h"

#include <string.h>

#define MAX_EV 256

typedef struct sink {
    cJSON *ev[MAX_EV];
    int    n, done, fail_at;
} sink;

static int take(void *user, const char *event, size_t len, kl_err *err)
{
    sink *k = user;
    if (k->fail_at && k->n + 1 == k->fail_at)
        return kl_fail(err, KL_E_IO, "client gone");
    ck_assert_msg(len > 8 && !memcmp(event, "data: ", 6) && !memcmp(event + len - 2, "\n\n", 2),
                  "not one SSE event: '%.*s'", (int)len, event);
    ck_assert_msg(!memchr(event, '\n', len - 2), "event spans lines: '%.*s'", (int)len, event);
    ck_assert_msg(!k->done, "an event after [DONE]");
    if (len == 14 && !memcmp(event, "data: [DONE]\n\n", 14)) {
        k->done = 1;
        return 0;
    }
    ck_assert(k->n < MAX_EV);
    kl_err jerr;
    kl_err_clear(&jerr);
    ck_assert_msg(kl_json_parse(event + 6, len - 8, "T", &k->ev[k->n], &jerr) == 0,
                  "event %d is not JSON: %s", k->n, jerr.msg);
    k->n++;
    return 0;
}

static void sink_free(sink *k)
{
    for (int i = 0; i < k->n; i++)
        cJSON_Delete(k->ev[i]);
}

static const cJSON *path(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    return b ? cJSON_GetObjectItemCaseSensitive(x, b) : x;
}

/* The only choice's delta of chunk i (NULL for the usage chunk). */
static const cJSON *delta(const sink *k, int i)
{
    const cJSON *ch = cJSON_GetArrayItem(path(k->ev[i], "choices", NULL), 0);
    return ch ? path(ch, "delta", NULL) : NULL;
}

static void stream(const char *text, int tools_on, size_t piece, sink *k)
{
    memset(k, 0, sizeof *k);
    kl_chat_stream s;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_chat_stream_begin(&s, "chatcmpl-1", "kimi", 1764400000, tools_on, take, k,
                                   &err) == 0);
    for (size_t at = 0, n = strlen(text); at < n; at += piece)
        ck_assert(kl_chat_stream_text(&s, text + at, n - at < piece ? n - at : piece, &err) == 0);
    kl_usage u = {14, 9, 3};
    ck_assert(kl_chat_stream_end(&s, "stop", &u, &err) == 0);
    kl_chat_stream_free(&s);
    ck_assert(k->done);
    for (int i = 0; i < k->n; i++) {   /* the same head everywhere */
        ck_assert_str_eq(path(k->ev[i], "id", NULL)->valuestring, "chatcmpl-1");
        ck_assert_str_eq(path(k->ev[i], "object", NULL)->valuestring, "chat.completion.chunk");
        ck_assert_str_eq(path(k->ev[i], "model", NULL)->valuestring, "kimi");
    }
}

#define CALLS "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0" \
              "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"       \
              "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}"    \
              "<|tool_call_end|><|tool_calls_section_end|>"

START_TEST(streamed_tool_calls_become_deltas)
{
    for (size_t piece = 1; piece <= 40; piece += 13) {
        sink k;
        stream("Checking." CALLS, 1, piece, &k);
        ck_assert_str_eq(path(delta(&k, 0), "role", NULL)->valuestring, "assistant");
        char content[256] = "", args[2][256] = {"", ""};
        const char *ids[2] = {NULL, NULL}, *names[2] = {NULL, NULL};
        const char *finish = NULL;
        for (int i = 1; i < k.n; i++) {
            const cJSON *d = delta(&k, i);
            if (!d) {   /* usage */
                ck_assert_int_eq(cJSON_GetArraySize(path(k.ev[i], "choices", NULL)), 0);
                ck_assert_int_eq((int)path(path(k.ev[i], "usage", NULL), "total_tokens",
                                           NULL)->valuedouble, 23);
                ck_assert_int_eq((int)path(path(path(k.ev[i], "usage", NULL),
                                                "prompt_tokens_details", NULL),
                                           "cached_tokens", NULL)->valuedouble, 3);
                continue;
            }
            const cJSON *ch = cJSON_GetArrayItem(path(k.ev[i], "choices", NULL), 0);
            if (cJSON_IsString(path(ch, "finish_reason", NULL)))
                finish = path(ch, "finish_reason", NULL)->valuestring;
            if (path(d, "content", NULL))
                strcat(content, path(d, "content", NULL)->valuestring);
            const cJSON *tc = cJSON_GetArrayItem(path(d, "tool_calls", NULL), 0);
            if (!tc)
                continue;
            int ix = (int)path(tc, "index", NULL)->valuedouble;
            ck_assert(ix == 0 || ix == 1);
            if (path(tc, "id", NULL)) {
                ck_assert_msg(!ids[ix], "call %d introduced twice", ix);
                ids[ix] = path(tc, "id", NULL)->valuestring;
                names[ix] = path(tc, "function", "name")->valuestring;
                ck_assert_str_eq(path(tc, "type", NULL)->valuestring, "function");
            } else {
                ck_assert_msg(ids[ix] && !path(tc, "function", "name"), "arguments before id");
            }
            strcat(args[ix], path(tc, "function", "arguments")->valuestring);
        }
        ck_assert_str_eq(content, "Checking.");
        ck_assert_str_eq(ids[0], "functions.get_weather:0");
        ck_assert_str_eq(names[1], "get_time");
        ck_assert_str_eq(args[0], "{\"city\": \"Paris\"}");
        ck_assert_str_eq(args[1], "{}");
        ck_assert_str_eq(finish, "tool_calls");
        sink_free(&k);
    }
}
END_TEST

START_TEST(tools_off_keeps_the_text_as_content)
{
    sink k;
    stream("a" CALLS, 0, 7, &k);
    char content[512] = "";
    for (int i = 0; i < k.n; i++)
        if (delta(&k, i) && path(delta(&k, i), "content", NULL))
            strcat(content, path(delta(&k, i), "content", NULL)->valuestring);
    ck_assert_str_eq(content, "a" CALLS);
    const cJSON *last = cJSON_GetArrayItem(path(k.ev[k.n - 2], "choices", NULL), 0);
    ck_assert_str_eq(path(last, "finish_reason", NULL)->valuestring, "stop");
    sink_free(&k);
}
END_TEST

START_TEST(whole_reply_object)
{
    char *json = NULL;
    kl_err err;
    kl_err_clear(&err);
    kl_usage u = {5, 7, 0};
    ck_assert(kl_chat_reply_json("chatcmpl-2", "kimi", 7, 1, "Sure." CALLS,
                                 strlen("Sure." CALLS), "stop", &u, &json, &err) == 0);
    cJSON *o = NULL;
    ck_assert(kl_json_parse(json, strlen(json), "T", &o, &err) == 0);
    const cJSON *ch = cJSON_GetArrayItem(path(o, "choices", NULL), 0);
    ck_assert_str_eq(path(o, "object", NULL)->valuestring, "chat.completion");
    ck_assert_str_eq(path(ch, "finish_reason", NULL)->valuestring, "tool_calls");
    ck_assert_str_eq(path(path(ch, "message", NULL), "content", NULL)->valuestring, "Sure.");
    const cJSON *calls = path(path(ch, "message", NULL), "tool_calls", NULL);
    ck_assert_int_eq(cJSON_GetArraySize(calls), 2);
    ck_assert_str_eq(path(cJSON_GetArrayItem(calls, 1), "function", "name")->valuestring,
                     "get_time");
    ck_assert_int_eq((int)path(path(o, "usage", NULL), "total_tokens", NULL)->valuedouble, 12);
    cJSON_Delete(o);
    kl_free(json);
    /* tools off: the text as content; no calls: finish as given */
    ck_assert(kl_chat_reply_json("c", "m", 7, 0, "hi <|x|>", 8, "length", NULL, &json, &err) ==
              0);
    ck_assert(kl_json_parse(json, strlen(json), "T", &o, &err) == 0);
    ch = cJSON_GetArrayItem(path(o, "choices", NULL), 0);
    ck_assert_str_eq(path(path(ch, "message", NULL), "content", NULL)->valuestring, "hi <|x|>");
    ck_assert_str_eq(path(ch, "finish_reason", NULL)->valuestring, "length");
    ck_assert(!path(o, "usage", NULL));
    cJSON_Delete(o);
    kl_free(json);
}
END_TEST

/* A reply cut off inside a call's arguments still reports the call, as the stream does. */
START_TEST(whole_reply_keeps_a_call_cut_off)
{
    const char *t = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
                    "<|tool_call_argument_begin|>{\"a\": 1";
    char *json = NULL;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_chat_reply_json("c", "m", 7, 1, t, strlen(t), "length", NULL, &json, &err) ==
              0);
    cJSON *o = NULL;
    ck_assert(kl_json_parse(json, strlen(json), "T", &o, &err) == 0);
    const cJSON *msg = path(cJSON_GetArrayItem(path(o, "choices", NULL), 0), "message", NULL);
    const cJSON *call = cJSON_GetArrayItem(path(msg, "tool_calls", NULL), 0);
    ck_assert(cJSON_IsNull(path(msg, "content", NULL)));
    ck_assert_str_eq(path(call, "id", NULL)->valuestring, "functions.f:0");
    ck_assert_str_eq(path(call, "function", "arguments")->valuestring, "{\"a\": 1");
    cJSON_Delete(o);
    kl_free(json);
}
END_TEST

START_TEST(a_sink_error_stops_the_stream)
{
    sink k;
    memset(&k, 0, sizeof k);
    k.fail_at = 3;
    kl_chat_stream s;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_chat_stream_begin(&s, "c", "m", 1, 0, take, &k, &err) == 0);
    ck_assert(kl_chat_stream_text(&s, "a", 1, &err) == 0);
    ck_assert_int_eq(kl_chat_stream_text(&s, "b", 1, &err), KL_E_IO);
    kl_chat_stream_free(&s);
    sink_free(&k);
}
END_TEST

/* The ids of a tiny synthetic tokenizer by name. */
static kl_token special(const kl_tokenizer *tok, const char *name)
{
    kl_token id = 0;
    ck_assert_msg(kl_tok_special_id(tok, name, &id), "no %s", name);
    return id;
}

START_TEST(special_ids_never_reach_the_text)
{
    char dir[512];
    t_mkdtemp(dir, sizeof dir);
    t_synth_tiny(dir, 3);
    kl_tokenizer *tok = NULL;
    kl_err err;
    ck_assert(kl_tok_open(dir, &tok, &err) == 0);
    kl_token reserved = kl_tok_n_vocab(tok) - 3, im_end = special(tok, "<|im_end|>");
    kl_token begin = special(tok, "<|tool_calls_section_begin|>");
    kl_token call = special(tok, "<|tool_call_begin|>"), end = special(tok, "<|tool_call_end|>");
    kl_id_rule r;
    for (int tools = 0; tools < 2; tools++) {
        kl_answer_id_rule_init(&r, tok, tools, 0);
        ck_assert(kl_answer_id_shown(&r, 65) && kl_answer_id_shown(&r, kl_tok_n_ranks(tok) - 1));
        ck_assert(!kl_answer_id_shown(&r, reserved) && !kl_answer_id_shown(&r, im_end));
        ck_assert_msg(!kl_answer_id_shown(&r, end) && !kl_answer_id_shown(&r, call),
                      "a stray marker before the section (tools %d)", tools);
        ck_assert_int_eq(kl_answer_id_shown(&r, begin), tools);
        ck_assert_int_eq(kl_answer_id_shown(&r, call), tools);   /* inside the section */
        ck_assert(!kl_answer_id_shown(&r, reserved));
    }
    kl_answer_id_rule_init(&r, tok, 1, 1);           /* the prompt opened the section */
    ck_assert(kl_answer_id_shown(&r, end));
    kl_tok_close(tok);
    t_rmrf(dir);
}
END_TEST

static Suite *reply_suite(void)
{
    Suite *s = suite_create("reply");
    TCase *tc = tcase_create("chat");
    tcase_add_test(tc, streamed_tool_calls_become_deltas);
    tcase_add_test(tc, tools_off_keeps_the_text_as_content);
    tcase_add_test(tc, whole_reply_object);
    tcase_add_test(tc, whole_reply_keeps_a_call_cut_off);
    tcase_add_test(tc, a_sink_error_stops_the_stream);
    suite_add_tcase(s, tc);
    tc = tcase_create("ids");
    tcase_add_test(tc, special_ids_never_reach_the_text);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(reply_suite());
}
