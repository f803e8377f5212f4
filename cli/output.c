/* cli/output.c — the output contract of every command (see cli.h): the command's name and
 * --json for this invocation, the JSON head and error object, usage errors, and the check of
 * standard output at the end. */
#include "cli/cli.h"

#include "common/err.h"
#include "common/jsonout.h"

#include <cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One invocation of kl runs one command: its output state lives here. */
static struct {
    const char *cmd; /* "audit", "bench decode" */
    int json;        /* --json given */
    int printed;     /* the one JSON object went out */
} g_out = {"kl", 0, 0};

void kl_cli_begin(const char *cmd, int json)
{
    g_out.cmd = cmd;
    g_out.json = json;
    g_out.printed = 0;
}

const char *kl_cli_cmd(void)
{
    return g_out.cmd;
}

int kl_cli_json(void)
{
    return g_out.json;
}

cJSON *kl_cli_json_head(int ok)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "kl_version", KL_VERSION);
    cJSON_AddStringToObject(root, "command", g_out.cmd);
    cJSON_AddBoolToObject(root, "ok", ok);
    return root;
}

void kl_cli_json_add_error(cJSON *root, const char *code, const char *message, const kl_err *err)
{
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", message);
    if (!err)
        return;
    cJSON_AddStringToObject(e, "file", err->file);
    cJSON_AddStringToObject(e, "tensor", err->tensor);
    if (err->offset != KL_NO_OFFSET)
        kl_json_add_u64(e, "offset", err->offset);
    else
        cJSON_AddNullToObject(e, "offset");
    cJSON_AddStringToObject(e, "rule", err->rule);
}

/* Flushes stdout: 0, or -1 with the message on stderr. */
static int flush_stdout(void)
{
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout))
        return 0;
    fprintf(stderr, "kl %s: cannot write standard output: %s\n", g_out.cmd,
            errno ? strerror(errno) : "write error");
    clearerr(stdout);
    return -1;
}

int kl_cli_print_json(cJSON *root)
{
    if (g_out.printed) {
        cJSON_Delete(root);
        fprintf(stderr, "kl %s: bug: a second JSON object\n", g_out.cmd);
        return KL_EXIT_BUG;
    }
    char *text = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        fprintf(stderr, "kl %s: out of memory rendering JSON\n", g_out.cmd);
        return KL_EXIT_BUG;
    }
    g_out.printed = 1;
    int bad = fputs(text, stdout) == EOF || fputc('\n', stdout) == EOF;
    cJSON_free(text);
    return flush_stdout() || bad ? KL_EXIT_USAGE : KL_EXIT_OK;
}

/* With --json and no object out yet, the error object; the exit status it leaves. */
static int print_error_object(int status, const char *code, const char *message,
                              const kl_err *err)
{
    if (!g_out.json || g_out.printed)
        return status;
    cJSON *root = kl_cli_json_head(0);
    kl_cli_json_add_error(root, code, message, err);
    int rc = kl_cli_print_json(root);
    return rc > status ? rc : status;
}

int kl_cli_fail(int status, const char *code, const char *message, const kl_err *err)
{
    fprintf(stderr, "kl %s: %s\n", g_out.cmd, message);
    return print_error_object(status, code, message, err);
}

int kl_cli_usage(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kl %s: %s\ntry 'kl %s --help'\n", g_out.cmd, msg, g_out.cmd);
    return print_error_object(KL_EXIT_USAGE, "usage", msg, NULL);
}

int kl_cli_report_as(int status, const kl_err *err)
{
    char buf[1024];
    return kl_cli_fail(status, kl_err_code_name(err->code), kl_err_format(err, buf, sizeof buf),
                       err);
}

int kl_cli_report(const char *cmd, const kl_err *err)
{
    (void)cmd;
    switch (err->code) {
    case KL_E_FORMAT:
    case KL_E_SCHEMA:
    case KL_E_UNSUPPORTED: return kl_cli_report_as(KL_EXIT_PROBLEMS, err);
    case KL_E_BUG: return kl_cli_report_as(KL_EXIT_BUG, err);
    default: return kl_cli_report_as(KL_EXIT_USAGE, err);
    }
}

int kl_cli_finish(int status)
{
    /* every path of every command prints its object; this is the net under them */
    if (status == KL_EXIT_OK && g_out.json && !g_out.printed)
        kl_cli_print_json(kl_cli_json_head(1));
    status = print_error_object(status, "failed", "the command failed (see standard error)",
                                NULL);
    int bad = flush_stdout();
    errno = 0;
    if (fclose(stdout) != 0 && !bad) {
        fprintf(stderr, "kl %s: cannot write standard output: %s\n", g_out.cmd,
                strerror(errno));
        bad = 1;
    }
    if (bad && status != KL_EXIT_BUG)
        status = KL_EXIT_USAGE;
    return status;
}
