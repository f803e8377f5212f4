/*
 * tests/test_request.c — chat-completions request bodies (serve/request.h): a full request with
 * every supported field, the messages the chat renderer gets (roles, joined text parts,
 * developer as system, tool calls and tool results), OpenAI's defaults, and a refusal with
 * status 400, the offending parameter and a clear message for each rule; the reply head each
 * tool_choice forces; a legacy completion's logprobs.
 */
#include "common/err.h"
#include "common/mem.h"
#include "serve/request.h"
#include "tests/testutil.h"

#include <string.h>

static int parse(const char *body, kl_req_chat *r, kl_api_error *e)
{
    return kl_req_chat_parse(body, strlen(body), r, e);
}

START_TEST(a_full_request_is_read_whole)
{
    const char *body =
        "{\"model\": \"kimi\", \"messages\": ["
        "{\"role\": \"developer\", \"content\": \"Be brief.\"},"
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Weather \"},"
        " {\"type\": \"text\", \"text\": \"in Paris?\"}], \"name\": \"ann\"},"
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": "
        "\"functions.get_weather:0\", \"type\": \"function\", \"function\": {\"name\": "
        "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
        "{\"role\": \"tool\", \"tool_call_id\": \"functions.get_weather:0\", \"content\": "
        "\"18 C\"}],"
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"parameters\": {\"type\": \"object\"}}}],"
        "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}},"
        "\"max_completion_tokens\": 64, \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 40,"
        "\"min_p\": 0.05, \"seed\": -1, \"stop\": [\"END\", \"\\n\\n\"], \"n\": 1,"
        "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"logprobs\": true,"
        "\"top_logprobs\": 3, \"user\": \"ignored\", \"frequency_penalty\": 0}";
    kl_req_chat r;
    kl_api_error e;
    ck_assert_msg(parse(body, &r, &e) == 0, "%s: %s", e.param, e.message);
    ck_assert_str_eq(r.model, "kimi");
    ck_assert_uint_eq(r.n_msgs, 4);
    ck_assert_str_eq(r.msgs[0].role, "system");
    ck_assert_str_eq(r.msgs[1].content, "Weather in Paris?");
    ck_assert_str_eq(r.msgs[1].name, "ann");
    ck_assert(r.msgs[2].content == NULL);
    ck_assert_uint_eq(r.msgs[2].n_tool_calls, 1);
    ck_assert_str_eq(r.msgs[2].tool_calls[0].name, "get_weather");
    ck_assert_str_eq(r.msgs[2].tool_calls[0].arguments, "{\"city\": \"Paris\"}");
    ck_assert_str_eq(r.msgs[3].tool_call_id, "functions.get_weather:0");
    ck_assert_uint_eq(r.n_tools, 1);
    ck_assert(r.tools_json && strstr(r.tools_json, "\"get_weather\""));
    ck_assert_int_eq(r.tool_choice, KL_TOOL_NAMED);
    ck_assert_str_eq(r.tool_choice_name, "get_weather");
    ck_assert_uint_eq(r.max_tokens, 64);
    ck_assert(r.samp.temperature == 0.5f && r.samp.top_p == 0.9f && r.samp.top_k == 40);
    ck_assert(r.samp.min_p == 0.05f && r.has_seed && r.samp.seed == UINT64_MAX);
    ck_assert_uint_eq(r.n_stop, 2);
    ck_assert_str_eq(r.stop[1], "\n\n");
    ck_assert(r.stream && r.include_usage && r.logprobs && r.top_logprobs == 3);
    /* what the engine's chat renderer makes of it */
    char *prompt = NULL;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_chat_render(r.msgs, r.n_msgs, r.tools_json, 1, &prompt, &err) == 0, "%s",
                  err.msg);
    ck_assert(strstr(prompt, "<|im_system|>tool_declare<|im_middle|>[{\"function\":"));
    ck_assert(strstr(prompt, "<|im_user|>ann<|im_middle|>Weather in Paris?<|im_end|>"));
    ck_assert(strstr(prompt, "## Return of functions.get_weather:0\n18 C"));
    kl_free(prompt);
    kl_req_chat_free(&r);
    kl_req_chat_free(&r);   /* idempotent */
}
END_TEST

START_TEST(defaults_follow_openai)
{
    kl_req_chat r;
    kl_api_error e;
    ck_assert(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                    &r, &e) == 0);
    ck_assert(r.samp.temperature == 1.0f && r.samp.top_p == 1.0f && r.samp.top_k == 0);
    ck_assert(!r.stream && !r.has_seed && !r.max_tokens && !r.n_stop && !r.tools_json);
    ck_assert_int_eq(r.tool_choice, KL_TOOL_NONE);
    kl_req_chat_free(&r);
    ck_assert(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                    "\"max_tokens\":5,\"max_completion_tokens\":5,\"stop\":\"x\"}", &r, &e) == 0);
    ck_assert_int_eq(r.tool_choice, KL_TOOL_AUTO);
    ck_assert(r.max_tokens == 5 && r.n_stop == 1);
    kl_req_chat_free(&r);
}
END_TEST

/* Each body is refused with status 400, naming param, with want in the message. */
START_TEST(every_rule_is_a_400_naming_the_parameter)
{
    static const struct { const char *body, *param, *want; } cases[] = {
        {"{\"model\":\"m\",", "", "not valid JSON"},
        {"[1]", "", "JSON object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "model", "required"},
        {"{\"model\":\"m\"}", "messages", "non-empty array"},
        {"{\"model\":\"m\",\"messages\":[]}", "messages", "non-empty array"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"robot\"}]}", "messages[0]", "robot"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
         "\"image_url\"}]}]}", "messages[0].content", "text"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
         "messages[0].tool_call_id", "required"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":"
         "[]}]}", "messages[0].tool_calls", "assistant"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":"
         "\"function\",\"function\":{\"name\":\"f\"}}]}]}",
         "messages[0].tool_calls[0].function.arguments", "required"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":"
         "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\","
         "\"function\":{\"name\":\"f\"}}]}", "tools[1]", "twice"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":"
         "\"required\"}", "tool_choice", "needs tools"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":"
         "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":"
         "\"function\",\"function\":{\"name\":\"g\"}}}", "tool_choice", "not among"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"temperature\":3}", "temperature", "[0, 2]"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":0}",
         "top_p", "(0, 1]"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"max_tokens\":0}", "max_tokens", "1.."},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"max_tokens\":5.0}", "max_tokens", "not an integer"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"max_tokens\":5,\"max_completion_tokens\":6}", "max_completion_tokens", "disagree"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", "n",
         "must be 1"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\"]}",
         "stop", "non-empty"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":1}",
         "stream", "true or false"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"stream_options\":{\"include_usage\":true}}", "stream_options", "with stream"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"top_logprobs\":2}", "top_logprobs", "needs logprobs"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"presence_penalty\":0.5}", "presence_penalty", "not supported"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":1.5}",
         "seed", "integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kl_req_chat r;
        kl_api_error e;
        int rc = parse(cases[i].body, &r, &e);
        ck_assert_msg(rc == KL_E_USAGE && e.status == 400, "case %zu accepted: %s", i,
                      cases[i].body);
        ck_assert_str_eq(e.type, "invalid_request_error");
        ck_assert_msg(!strcmp(e.param, cases[i].param), "case %zu: param '%s', wanted '%s'", i,
                      e.param, cases[i].param);
        ck_assert_msg(strstr(e.message, cases[i].want), "case %zu: '%s' lacks '%s'", i,
                      e.message, cases[i].want);
        ck_assert_msg(r.model == NULL && r.msgs == NULL, "case %zu left storage", i);
    }
}
END_TEST

#define TOOL_F "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"
#define TOOL_T "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}"

/* The tool-call head tool_choice forces (NULL: none) with tools (JSON array items), whether
 * tools are on, and the choices of call heads after it, joined by '|' into choices. */
static char *head_with(const char *tools, const char *choice, int *tools_on, char *choices,
                       size_t cap)
{
    char body[1024];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":"
             "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":"
             "\"tool\",\"tool_call_id\":\"functions.f:0\",\"content\":\"ok\"}],\"tools\":[%s],"
             "\"tool_choice\":%s}", tools, choice);
    kl_req_chat r;
    kl_api_error e;
    ck_assert_msg(parse(body, &r, &e) == 0, "%s: %s", choice, e.message);
    char *head = NULL;
    kl_err err;
    ck_assert(kl_req_tool_prefix(&r, &head, &err) == 0);
    *tools_on = kl_req_tools_on(&r);
    choices[0] = 0;
    for (size_t k = 0; k < kl_req_tool_choices(&r); k++) {
        char *way = NULL;
        ck_assert(kl_req_tool_choice(&r, k, &way, &err) == 0);
        snprintf(choices + strlen(choices), cap - strlen(choices), "%s%s", k ? "|" : "", way);
        kl_free(way);
    }
    kl_req_chat_free(&r);
    return head;
}

static char *head_of(const char *choice, int *tools_on)
{
    char choices[512];
    return head_with(TOOL_F "," TOOL_T, choice, tools_on, choices, sizeof choices);
}

START_TEST(tool_choice_forces_the_reply_head)
{
    int on = -1;
    ck_assert(head_of("\"none\"", &on) == NULL && on == 0);
    ck_assert(head_of("\"auto\"", &on) == NULL && on == 1);
    /* "required" with two tools: the section, then the model chooses one of the call heads */
    char choices[512];
    char *h = head_with(TOOL_F "," TOOL_T, "\"required\"", &on, choices, sizeof choices);
    ck_assert(on == 1);
    ck_assert_str_eq(h, "<|tool_calls_section_begin|><|tool_call_begin|>");
    ck_assert_str_eq(choices, "functions.f:1<|tool_call_argument_begin|>|"
                              "functions.get_time:1<|tool_call_argument_begin|>");
    kl_free(h);
    /* with one tool, its whole head, and no choice left */
    h = head_with(TOOL_T, "\"required\"", &on, choices, sizeof choices);
    ck_assert_str_eq(h, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:1"
                        "<|tool_call_argument_begin|>");
    ck_assert_str_eq(choices, "");
    kl_free(h);
    h = head_with(TOOL_F "," TOOL_T, "\"auto\"", &on, choices, sizeof choices);
    ck_assert(h == NULL && !strcmp(choices, ""));
    /* the index counts the conversation's one earlier call */
    h = head_of("{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}", &on);
    ck_assert_str_eq(h, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:1"
                        "<|tool_call_argument_begin|>");
    kl_free(h);
}
END_TEST

/* A legacy completion's logprobs: null, false or N alternatives; anything else is a 400. */
START_TEST(completion_logprobs_are_a_count)
{
    static const struct { const char *lp; int ok, on; uint32_t top; } cases[] = {
        {"null", 1, 0, 0}, {"false", 1, 0, 0}, {"0", 1, 1, 0}, {"5", 1, 1, 5},
        {"20", 1, 1, 20},  {"21", 0, 0, 0},    {"true", 0, 0, 0}, {"-1", 0, 0, 0},
        {"2.5", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":%s}",
                 cases[i].lp);
        kl_req_chat r;
        kl_api_error e;
        int rc = kl_req_completion_parse(body, strlen(body), &r, &e);
        ck_assert_msg((rc == 0) == cases[i].ok, "logprobs %s: rc %d", cases[i].lp, rc);
        if (rc) {
            ck_assert_str_eq(e.param, "logprobs");
            continue;
        }
        ck_assert_msg(r.logprobs == cases[i].on && r.top_logprobs == cases[i].top,
                      "logprobs %s: %d %u", cases[i].lp, r.logprobs, r.top_logprobs);
        ck_assert(!kl_req_tools_on(&r));
        kl_req_chat_free(&r);
    }
}
END_TEST

static Suite *request_suite(void)
{
    Suite *s = suite_create("request");
    TCase *tc = tcase_create("chat");
    tcase_add_test(tc, a_full_request_is_read_whole);
    tcase_add_test(tc, defaults_follow_openai);
    tcase_add_test(tc, every_rule_is_a_400_naming_the_parameter);
    tcase_add_test(tc, tool_choice_forces_the_reply_head);
    tcase_add_test(tc, completion_logprobs_are_a_count);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(request_suite());
}
