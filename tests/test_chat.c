/*
 * tests/test_chat.c — engine/chat: Kimi chat rendering against the transformers test vector
 * (kimi-linear.md §4.3) and every rendering in tokenizer-and-api.md B4, tool-call parsing
 * (vLLM kimi_k2 rules) with a render → parse round trip, stop ids, and errors for bad input.
 */
#include "common/mem.h"
#include "synth/synth.h"
#include "engine/chat.h"
#include "engine/tokenizer.h"
#include "tests/testutil.h"

#include <stdint.h>

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

#define GEN "<|im_assistant|>assistant<|im_middle|>"

static char *render_ok(const kl_chat_msg *m, size_t n, const char *tools, int gen,
                       const kl_chat_opts *o)
{
    kl_err err;
    kl_err_clear(&err);
    char *out = NULL;
    int rc = kl_chat_render_opts(m, n, tools, gen, o, &out, &err);
    ck_assert_msg(rc == 0, "render failed: %s", t_fmt_err(&err));
    ck_assert_ptr_nonnull(out);
    return out;
}

static void expect_render(const kl_chat_msg *m, size_t n, const char *tools, int gen,
                          const kl_chat_opts *o, const char *want)
{
    char *got = render_ok(m, n, tools, gen, o);
    ck_assert_msg(!strcmp(got, want), "rendering differs\nwant: %s\ngot:  %s", want, got);
    kl_free(got);
}

static void expect_render_error(const kl_chat_msg *m, size_t n, const char *tools,
                                const char *needle)
{
    kl_err err;
    kl_err_clear(&err);
    char *out = NULL;
    int rc = kl_chat_render(m, n, tools, 1, &out, &err);
    ck_assert_msg(rc == KL_E_USAGE, "expected KL_E_USAGE, got %d (%s)", rc, t_fmt_err(&err));
    ck_assert_ptr_null(out);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
    ck_assert_msg(!t_has_control(err.msg), "message has control bytes: %s", err.msg);
}

/* ------------------------------------------------------------------------------------------ */
/* Rendering                                                                                  */

START_TEST(chat_transformers_test_vector_is_reproduced_exactly)
{
    /* kimi-linear.md §4.3 / tokenizer-and-api.md A8 */
    kl_chat_msg m[] = {{.role = "user", .content = "Tell me about the french revolution."}};
    expect_render(m, 1, NULL, 1, NULL,
                  "<|im_user|>user<|im_middle|>Tell me about the french revolution.<|im_end|>"
                  "<|im_assistant|>assistant<|im_middle|>");
    /* no tools turn for an empty tools array, and the plain entry point agrees */
    char *out = NULL;
    ck_assert_int_eq(kl_chat_render(m, 1, "[]", 1, &out, NULL), 0);
    ck_assert_str_eq(out, "<|im_user|>user<|im_middle|>Tell me about the french revolution."
                          "<|im_end|><|im_assistant|>assistant<|im_middle|>");
    kl_free(out);
}
END_TEST

START_TEST(chat_readme_system_example_is_reproduced_exactly)
{
    kl_chat_msg m[] = {
        {.role = "system", .content = "You are a helpful assistant provided by Moonshot-AI."},
        {.role = "user", .content = "Is 123 a prime?"},
    };
    expect_render(m, 2, NULL, 1, NULL,
                  "<|im_system|>system<|im_middle|>You are a helpful assistant provided by "
                  "Moonshot-AI.<|im_end|><|im_user|>user<|im_middle|>Is 123 a prime?<|im_end|>"
                  "<|im_assistant|>assistant<|im_middle|>");
}
END_TEST

START_TEST(chat_no_generation_prompt_and_empty_list)
{
    kl_chat_msg m[] = {{.role = "user", .content = "hi"}, {.role = "assistant", .content = "yo"}};
    expect_render(m, 2, NULL, 0, NULL,
                  "<|im_user|>user<|im_middle|>hi<|im_end|>"
                  "<|im_assistant|>assistant<|im_middle|>yo<|im_end|>");
    expect_render(NULL, 0, NULL, 1, NULL, GEN);
    expect_render(NULL, 0, NULL, 0, NULL, "");
}
END_TEST

START_TEST(chat_name_replaces_role_name)
{
    kl_chat_msg m[] = {{.role = "user", .content = "hello", .name = "alice"},
                       {.role = "system", .content = "s", .name = "ops"}};
    expect_render(m, 2, NULL, 0, NULL,
                  "<|im_user|>alice<|im_middle|>hello<|im_end|>"
                  "<|im_system|>ops<|im_middle|>s<|im_end|>");
}
END_TEST

START_TEST(chat_assistant_turn_with_calls_matches_doc)
{
    /* tokenizer-and-api.md B4 "Assistant turn with calls", without and with optional text,
     * with the id given and with the id left to the default functions.{name}:{index} */
    kl_chat_tool_call given = {"functions.get_weather:0", "get_weather", "{\"city\": \"Paris\"}"};
    kl_chat_tool_call dflt = {NULL, "get_weather", "{\"city\": \"Paris\"}"};
    const char *want =
        "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>"
        "functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}"
        "<|tool_call_end|><|tool_calls_section_end|><|im_end|>";
    kl_chat_msg m = {.role = "assistant", .tool_calls = &given, .n_tool_calls = 1};
    expect_render(&m, 1, NULL, 0, NULL, want);
    m.tool_calls = &dflt;
    expect_render(&m, 1, NULL, 0, NULL, want);
    m.content = "Let me check.";
    expect_render(&m, 1, NULL, 0, NULL,
                  "<|im_assistant|>assistant<|im_middle|>Let me check."
                  "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                  "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"
                  "<|tool_calls_section_end|><|im_end|>");
}
END_TEST

START_TEST(chat_several_calls_share_a_section_and_count_globally)
{
    kl_chat_tool_call a[] = {{NULL, "f", "{}"}, {NULL, "g", "{\"x\":1}"}};
    kl_chat_tool_call b[] = {{NULL, "f", "{}"}};
    kl_chat_msg m[] = {
        {.role = "assistant", .tool_calls = a, .n_tool_calls = 2},
        {.role = "tool", .content = "1", .tool_call_id = "functions.f:0"},
        {.role = "assistant", .tool_calls = b, .n_tool_calls = 1},
    };
    expect_render(m, 3, NULL, 0, NULL,
                  "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|>"
                  "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
                  "<|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{\"x\":1}"
                  "<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
                  "<|im_system|>tool<|im_middle|>## Return of functions.f:0\n1<|im_end|>"
                  "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|>"
                  "<|tool_call_begin|>functions.f:2<|tool_call_argument_begin|>{}<|tool_call_end|>"
                  "<|tool_calls_section_end|><|im_end|>");
}
END_TEST

START_TEST(chat_tool_result_turn_matches_doc)
{
    /* <|im_system|>{name or "tool"}<|im_middle|>## Return of {tool_call_id}\n{content}<|im_end|> */
    kl_chat_msg m = {.role = "tool", .content = "{\"temp_c\": 18}",
                     .tool_call_id = "functions.get_weather:0"};
    expect_render(&m, 1, NULL, 0, NULL,
                  "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n"
                  "{\"temp_c\": 18}<|im_end|>");
    m.name = "get_weather";
    expect_render(&m, 1, NULL, 0, NULL,
                  "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n"
                  "{\"temp_c\": 18}<|im_end|>");
}
END_TEST

/* The tools of the B4 oracle; the doc elides the declaration after "name" with "…". */
static const char TOOLS[] =
    "[ {\"type\":\"function\", \"function\": {\"name\":\"get_weather\",\n"
    "   \"description\":\"Get weather \\u00e9 \\\"now\\\"\\n\", "
    "\"parameters\": {\"type\":\"object\","
    " \"properties\":{\"city\":{\"type\":\"string\"}}, \"required\":[\"city\"],"
    " \"additionalProperties\":false, \"x\":1.50e+2}}} ]";

START_TEST(chat_oracle_rendering_with_tools_is_reproduced_exactly)
{
    /* tokenizer-and-api.md B4 "Rendering oracle": K2 template through @huggingface/jinja,
     * `tools | tojson` (Python separators, no key sorting), K2's default system prompt given
     * here explicitly (Kimi-Linear adds none). */
    kl_chat_tool_call call = {"functions.get_weather:0", "get_weather", "{\"city\": \"Paris\"}"};
    kl_chat_msg m[] = {
        {.role = "system", .content = "You are Kimi, an AI assistant created by Moonshot AI."},
        {.role = "user", .content = "Weather in Paris?"},
        {.role = "assistant", .content = "", .tool_calls = &call, .n_tool_calls = 1},
        {.role = "tool", .content = "{\"temp_c\": 18}", .tool_call_id = "functions.get_weather:0"},
    };
    const char *doc_prefix = "<|im_system|>tool_declare<|im_middle|>[{\"type\": \"function\", "
                             "\"function\": {\"name\": \"get_weather\", ";
    const char *doc_suffix =
        "}]<|im_end|><|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by "
        "Moonshot AI.<|im_end|><|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>"
        "functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}"
        "<|tool_call_end|><|tool_calls_section_end|><|im_end|><|im_system|>tool<|im_middle|>"
        "## Return of functions.get_weather:0\n{\"temp_c\": 18}<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>";
    kl_chat_opts py = {KL_CHAT_JSON_PYTHON, 1};
    char *got = render_ok(m, 4, TOOLS, 1, &py);
    ck_assert_msg(!strncmp(got, doc_prefix, strlen(doc_prefix)), "prefix differs: %s", got);
    ck_assert_msg(strlen(got) > strlen(doc_suffix) &&
                      !strcmp(got + strlen(got) - strlen(doc_suffix), doc_suffix),
                  "suffix differs: %s", got);
    /* the whole text, including the elided declaration, as json.dumps writes it */
    char want[4096];
    snprintf(want, sizeof want, "%s%s%s", doc_prefix,
             "\"description\": \"Get weather \xc3\xa9 \\\"now\\\"\\n\", \"parameters\": "
             "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
             "\"required\": [\"city\"], \"additionalProperties\": false, \"x\": 1.50e+2}}",
             doc_suffix);
    ck_assert_msg(!strcmp(got, want), "want: %s\ngot:  %s", want, got);
    kl_free(got);
}
END_TEST

START_TEST(chat_default_tools_json_is_sorted_and_compact)
{
    kl_chat_msg m[] = {{.role = "user", .content = "hi"}};
    expect_render(m, 1, TOOLS, 1, NULL,
                  "<|im_system|>tool_declare<|im_middle|>[{\"function\":{\"description\":"
                  "\"Get weather \xc3\xa9 \\\"now\\\"\\n\",\"name\":\"get_weather\",\"parameters\":"
                  "{\"additionalProperties\":false,\"properties\":{\"city\":{\"type\":\"string\"}},"
                  "\"required\":[\"city\"],\"type\":\"object\",\"x\":1.50e+2}},"
                  "\"type\":\"function\"}]"
                  "<|im_end|><|im_user|>user<|im_middle|>hi<|im_end|>" GEN);
    kl_chat_opts verb = {KL_CHAT_JSON_VERBATIM, 0};
    char want[2048];
    snprintf(want, sizeof want, "<|im_system|>tool_declare<|im_middle|>%s<|im_end|>"
             "<|im_user|>user<|im_middle|>hi<|im_end|>" GEN, TOOLS);
    expect_render(m, 1, TOOLS, 1, &verb, want);
    /* a repeated key keeps its first place and its last value, as a Python dict does */
    kl_chat_opts compact_unsorted = {KL_CHAT_JSON_COMPACT, 1};
    expect_render(NULL, 0, "[{\"b\":1,\"a\":[],\"b\":\"\\u0001\\ud83d\\ude00\"}]", 0,
                  &compact_unsorted,
                  "<|im_system|>tool_declare<|im_middle|>[{\"b\":\"\\u0001\xf0\x9f\x98\x80\","
                  "\"a\":[]}]<|im_end|>");
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                     */

START_TEST(chat_bad_input_is_rejected_with_clear_messages)
{
    kl_chat_msg unknown[] = {{.role = "user", .content = "a"},
                             {.role = "developer", .content = "b"}};
    expect_render_error(unknown, 2, NULL, "message 1: unknown role 'developer'");
    kl_chat_msg null_role[] = {{.content = "b"}};
    expect_render_error(null_role, 1, NULL, "unknown role");
    kl_chat_msg ctl[] = {{.role = "us\ner"}};
    expect_render_error(ctl, 1, NULL, "unknown role 'us\\ner'");
    kl_chat_msg tool[] = {{.role = "tool", .content = "42"}};
    expect_render_error(tool, 1, NULL, "message 0: tool message without tool_call_id");
    kl_chat_tool_call c = {NULL, "f", "{}"};
    kl_chat_msg user_calls[] = {{.role = "user", .tool_calls = &c, .n_tool_calls = 1}};
    expect_render_error(user_calls, 1, NULL, "only assistant messages carry tool calls");
    kl_chat_tool_call noname = {NULL, NULL, "{}"};
    kl_chat_msg bad_call[] = {{.role = "assistant", .tool_calls = &noname, .n_tool_calls = 1}};
    expect_render_error(bad_call, 1, NULL, "tool call 0 has no name");
    kl_chat_msg ok[] = {{.role = "user", .content = "a"}};
    expect_render_error(ok, 1, "{\"type\":\"function\"}", "must be an array");
    expect_render_error(ok, 1, "[{\"a\":1,}]", "tools JSON: not valid JSON at byte 9");
    expect_render_error(ok, 1, "[1] x", "tools JSON: unexpected bytes after the JSON value at byte 4");
    expect_render_error(ok, 1, "[\"\\ud800\"]", "tools JSON: not valid JSON at byte 2");
    expect_render_error(ok, 1, "[01]", "tools JSON: not valid JSON: malformed number at byte 1");
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Parsing                                                                                    */

static void parse_ok(const char *text, kl_chat_parsed *p)
{
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_chat_parse_tool_calls(text, strlen(text), p, &err) == 0, "%s",
                  t_fmt_err(&err));
}

static void expect_call(const kl_chat_parsed *p, size_t i, const char *id, const char *name,
                        const char *args)
{
    ck_assert_msg(i < p->n_calls, "call %zu missing (have %zu)", i, p->n_calls);
    ck_assert_str_eq(p->calls[i].id, id);
    ck_assert_str_eq(p->calls[i].name, name);
    ck_assert_str_eq(p->calls[i].arguments, args);
}

START_TEST(chat_parse_round_trips_rendered_calls)
{
    kl_chat_tool_call calls[] = {{NULL, "get_weather", "{\"city\": \"Paris\"}"},
                                 {"functions.get_time:1", "get_time", "{\"tz\":\"CET\"}"}};
    kl_chat_msg m = {.role = "assistant", .content = "Checking.", .tool_calls = calls,
                     .n_tool_calls = 2};
    char *text = render_ok(&m, 1, NULL, 0, NULL);
    /* the model generates what follows the generation prompt, up to <|im_end|> */
    ck_assert(!strncmp(text, GEN, strlen(GEN)));
    const char *gen = text + strlen(GEN);
    kl_chat_parsed p;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_chat_parse_tool_calls(gen, strlen(gen) - strlen("<|im_end|>"), &p, &err),
                     0);
    ck_assert_int_eq(p.tools_called, 1);
    ck_assert_str_eq(p.content, "Checking.");
    ck_assert_uint_eq(p.n_calls, 2);
    expect_call(&p, 0, "functions.get_weather:0", "get_weather", "{\"city\": \"Paris\"}");
    expect_call(&p, 1, "functions.get_time:1", "get_time", "{\"tz\":\"CET\"}");
    /* the parsed calls render back to the same text */
    kl_chat_msg back = {.role = "assistant", .content = p.content, .tool_calls = p.calls,
                        .n_tool_calls = p.n_calls};
    char *again = render_ok(&back, 1, NULL, 0, NULL);
    ck_assert_str_eq(again, text);
    kl_free(again);
    kl_chat_parsed_free(&p);
    kl_chat_parsed_free(&p); /* idempotent */
    kl_free(text);
}
END_TEST

START_TEST(chat_parse_follows_vllm_rules)
{
    kl_chat_parsed p;
    /* no section marker: everything is content, even a stray call */
    parse_ok("Hello <|tool_call_begin|>f:0<|tool_call_argument_begin|>{}<|tool_call_end|>", &p);
    ck_assert_int_eq(p.tools_called, 0);
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert_str_eq(p.content, "Hello <|tool_call_begin|>f:0<|tool_call_argument_begin|>{}"
                                "<|tool_call_end|>");
    kl_chat_parsed_free(&p);
    /* empty content is NULL; whitespace around id and arguments is dropped; bare ids work */
    parse_ok("<|tool_calls_section_begin|> <|tool_call_begin|> get_weather:3 \n"
             "<|tool_call_argument_begin|>\n {\"a\": 1}\n <|tool_call_end|>"
             "<|tool_call_begin|>functions.x.y.lookup:12<|tool_call_argument_begin|>"
             "<|tool_call_end|><|tool_calls_section_end|>", &p);
    ck_assert_ptr_null(p.content);
    ck_assert_uint_eq(p.n_calls, 2);
    expect_call(&p, 0, "get_weather:3", "get_weather", "{\"a\": 1}");
    expect_call(&p, 1, "functions.x.y.lookup:12", "lookup", "");
    kl_chat_parsed_free(&p);
    /* singular section variant; malformed ids (no :digits, '<' inside) are skipped; a call whose
     * arguments would run into the next <|tool_call_begin|> is skipped */
    parse_ok("Sure.<|tool_call_section_begin|>"
             "<|tool_call_begin|>noindex<|tool_call_argument_begin|>{}<|tool_call_end|>"
             "<|tool_call_begin|>a:1<|tool_call_argument_begin|>{\"q\":"
             "<|tool_call_begin|>b:2<|tool_call_argument_begin|>{\"r\":2}<|tool_call_end|>"
             "<|tool_call_section_end|>", &p);
    ck_assert_int_eq(p.tools_called, 1);
    ck_assert_str_eq(p.content, "Sure.");
    ck_assert_uint_eq(p.n_calls, 1);
    expect_call(&p, 0, "b:2", "b", "{\"r\":2}");
    kl_chat_parsed_free(&p);
    /* id with a colon inside the name part: name is taken before the first colon */
    parse_ok("<|tool_calls_section_begin|><|tool_call_begin|>ns.f:x:7"
             "<|tool_call_argument_begin|>[1]<|tool_call_end|>", &p);
    ck_assert_uint_eq(p.n_calls, 1);
    expect_call(&p, 0, "ns.f:x:7", "f", "[1]");
    kl_chat_parsed_free(&p);
    /* section begun but unterminated call: tools_called, no calls, content before marker */
    parse_ok("Hm<|tool_calls_section_begin|><|tool_call_begin|>f:0<|tool_call_argument_begin|>{",
             &p);
    ck_assert_int_eq(p.tools_called, 1);
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert_str_eq(p.content, "Hm");
    kl_chat_parsed_free(&p);
    parse_ok("", &p);
    ck_assert_ptr_null(p.content);
    ck_assert_uint_eq(p.n_calls, 0);
    kl_chat_parsed_free(&p);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Stop ids and tokenization of the rendered vector (synthetic Kimi-layout tokenizer)        */

#define VOCAB 4096u
#define R (VOCAB - KL_TOK_N_SPECIAL)

START_TEST(chat_stop_ids_and_vector_specials_use_the_tokenizer)
{
    char dir[4096];
    kl_err err;
    kl_err_clear(&err);
    t_mkdtemp(dir, sizeof dir);
    kl_tokenizer *tok = NULL;
    ck_assert_msg(kl_synth_write_tokenizer(dir, VOCAB, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_msg(kl_tok_open(dir, &tok, &err) == 0, "%s", t_fmt_err(&err));
    uint32_t ids[KL_CHAT_MAX_STOP];
    size_t n = 0;
    ck_assert_msg(kl_chat_stop_ids(tok, ids, &n, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(ids[0], R + 2); /* <|im_end|>  = 163586 in Kimi's layout */
    ck_assert_uint_eq(ids[1], R + 1); /* [EOS]       = 163585 */
    ck_assert_uint_eq(ids[2], R + 9); /* [EOT]       = 163593 */

    kl_chat_msg m[] = {{.role = "user", .content = "Tell me about the french revolution."}};
    char *text = render_ok(m, 1, NULL, 1, NULL);
    uint32_t *tids = NULL;
    size_t nt = 0;
    ck_assert_msg(kl_tok_encode(tok, text, strlen(text), &tids, &nt, &err) == 0, "%s",
                  t_fmt_err(&err));
    /* [im_user, "user"..., im_middle, ..., im_end, im_assistant, "assistant"..., im_middle] */
    ck_assert_uint_ge(nt, 7);
    ck_assert_uint_eq(tids[0], R + 3);
    ck_assert_uint_eq(tids[nt - 1], R + 17);
    int seen_end = 0, seen_asst = 0;
    for (size_t i = 0; i < nt; i++) {
        seen_end |= tids[i] == R + 2;
        seen_asst |= tids[i] == R + 4;
    }
    ck_assert(seen_end && seen_asst);
    kl_free(tids);
    kl_free(text);
    kl_tok_close(tok);
    t_rmrf(dir);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *chat_suite(void)
{
    Suite *s = suite_create("chat");
    TCase *tr = tcase_create("render");
    tcase_add_test(tr, chat_transformers_test_vector_is_reproduced_exactly);
    tcase_add_test(tr, chat_readme_system_example_is_reproduced_exactly);
    tcase_add_test(tr, chat_no_generation_prompt_and_empty_list);
    tcase_add_test(tr, chat_name_replaces_role_name);
    tcase_add_test(tr, chat_assistant_turn_with_calls_matches_doc);
    tcase_add_test(tr, chat_several_calls_share_a_section_and_count_globally);
    tcase_add_test(tr, chat_tool_result_turn_matches_doc);
    tcase_add_test(tr, chat_oracle_rendering_with_tools_is_reproduced_exactly);
    tcase_add_test(tr, chat_default_tools_json_is_sorted_and_compact);
    suite_add_tcase(s, tr);
    TCase *te = tcase_create("errors");
    tcase_add_test(te, chat_bad_input_is_rejected_with_clear_messages);
    suite_add_tcase(s, te);
    TCase *tp = tcase_create("parse");
    tcase_add_test(tp, chat_parse_round_trips_rendered_calls);
    tcase_add_test(tp, chat_parse_follows_vllm_rules);
    suite_add_tcase(s, tp);
    TCase *tt = tcase_create("tokenizer");
    tcase_add_test(tt, chat_stop_ids_and_vector_specials_use_the_tokenizer);
    suite_add_tcase(s, tt);
    return s;
}

int main(void)
{
    return t_run_suite(chat_suite());
}
