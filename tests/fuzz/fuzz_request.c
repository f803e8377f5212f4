/*
 * tests/fuzz/fuzz_request.c — libFuzzer target: a chat-completions request body ->
 * kl_req_chat (serve/request.h) -> the chat renderer.
 *
 * Properties checked (abort on violation):
 *   - a refusal is an OpenAI error: status 400 (or 500 out of memory), a type and a message,
 *     and leaves no storage behind;
 *   - an accepted request has at least one message, each with a role the renderer knows,
 *     n_stop within its bound, top_logprobs <= 20, and renders (or is refused by the renderer
 *     with KL_E_USAGE: e.g. a tool call without a name is the renderer's rule too); the
 *     head tool_choice forces exists exactly for "required" and a named tool (tools on),
 *     and a named one carries the name;
 *   - the same bytes as a legacy completions body (kl_req_completion_parse): refusals as
 *     above; an accepted one has a prompt, no messages, max_tokens >= 1, top_logprobs <= 20
 *     only with logprobs, tools off.
 */
#include "common/mem.h"
#include "engine/chat.h"
#include "serve/request.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void require(int cond)
{
    if (!cond)
        abort();
}

/* A refusal's shape: an OpenAI error, nothing left behind. */
static void refused(int rc, const kl_api_error *e, const kl_req_chat *r)
{
    require((e->status == 400 && rc == KL_E_USAGE) || (e->status == 500 && rc == KL_E_NOMEM));
    require(e->type[0] && e->message[0] && !r->msgs && !r->model && !r->strings);
}

/* The forced tool-call head: present for required / named with tools on, naming the tool. */
static void forced_head(const kl_req_chat *r)
{
    char *head = NULL;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_req_tool_prefix(r, &head, &err);
    int want = kl_req_tools_on(r) &&
               (r->tool_choice == KL_TOOL_REQUIRED || r->tool_choice == KL_TOOL_NAMED);
    require(rc == KL_E_NOMEM || (rc == 0 && !head == !want));
    require(!head || r->tool_choice != KL_TOOL_NAMED || strstr(head, r->tool_choice_name));
    kl_free(head);
}

static void completion(const uint8_t *data, size_t size)
{
    kl_req_chat r;
    kl_api_error e;
    int rc = kl_req_completion_parse((const char *)data, size, &r, &e);
    if (rc) {
        refused(rc, &e, &r);
        return;
    }
    require(r.prompt && r.model && !r.msgs && r.max_tokens >= 1 && r.top_logprobs <= 20 &&
            (r.logprobs || !r.top_logprobs) && !kl_req_tools_on(&r));
    kl_req_chat_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    completion(data, size);
    kl_req_chat r;
    kl_api_error e;
    int rc = kl_req_chat_parse((const char *)data, size, &r, &e);
    if (rc) {
        refused(rc, &e, &r);
        return 0;
    }
    require(r.n_msgs > 0 && r.model && r.n_stop <= KL_REQ_MAX_STOP && r.top_logprobs <= 20);
    char *prompt = NULL;
    kl_err err;
    kl_err_clear(&err);
    int rrc = kl_chat_render(r.msgs, r.n_msgs, r.tools_json, 1, &prompt, &err);
    require(rrc == 0 || rrc == KL_E_USAGE || rrc == KL_E_NOMEM);
    kl_free(prompt);
    forced_head(&r);
    kl_req_chat_free(&r);
    return 0;
}
