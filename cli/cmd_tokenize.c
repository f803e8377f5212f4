/*
 * cli/cmd_tokenize.c — `kl tokenize` (text -> ids) and `kl detokenize` (ids -> text) with the
 * tokenizer of a checkpoint directory (tiktoken.model + tokenizer_config.json).
 * Results on stdout, errors and --stats on stderr.
 */
#include "cli/cli.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/fs.h"
#include "common/mem.h"
#include "common/utf8.h"
#include "engine/tokenizer.h"
#include "loader/locate.h"

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char tokenize_synopsis[] =
    "usage: kl tokenize DIR (--text T | --file F)... [--json] [--stats]\n";

static const char tokenize_about[] =
    "Encodes text with the tokenizer in DIR (tiktoken.model, tokenizer_config.json) exactly as\n"
    "Kimi's tokenizer does: special-token text becomes its id, no BOS/EOS is added.  Prints the\n"
    "ids separated by spaces, one line per input (inputs are encoded separately).\n";

static const char tokenize_footer[] =
    "Exit status: 0 ok, 1 a broken tokenizer or input that is not UTF-8, 2 usage or I/O error\n"
    "(an input that cannot be read: missing, a directory, not a regular file).\n";

static const char detokenize_synopsis[] =
    "usage: kl detokenize DIR --ids 1,2,3 [--skip-special] [--json]\n";

static const char detokenize_about[] =
    "Decodes token ids with the tokenizer in DIR and prints the text exactly (no newline added).\n";

static const char detokenize_footer[] =
    "Exit status: 0 ok, 1 a broken tokenizer or an id outside the vocabulary, 2 usage or I/O "
    "error.\n";

#define MAX_INPUT_BYTES ((size_t)1 << 30)

typedef struct tok_input {
    const char *text; /* borrowed from argv, or NULL when path is set */
    const char *path; /* borrowed from argv */
} tok_input;

static int exit_for(int code)
{
    return code == KL_E_FORMAT || code == KL_E_USAGE ? KL_EXIT_PROBLEMS
           : code == KL_E_BUG                        ? KL_EXIT_BUG
                                                     : KL_EXIT_USAGE;
}

static int read_stdin(char **out, size_t *len, kl_err *err)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = kl_malloc(cap);
    while (buf) {
        if (n == cap) {
            char *nb = cap < MAX_INPUT_BYTES ? kl_realloc(buf, cap * 2) : NULL;
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) {
            if (ferror(stdin)) {
                kl_free(buf);
                return kl_fail_sys(err, KL_E_IO, errno, "cannot read standard input");
            }
            *out = buf;
            *len = n;
            return 0;
        }
    }
    kl_free(buf);
    return kl_fail(err, KL_E_NOMEM, "standard input too large or out of memory");
}

/* The ids as a JSON array of numbers; NULL when out of memory. */
static cJSON *ids_json(const kl_token *ids, size_t n)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < n; i++) {
        cJSON *num = cJSON_CreateNumber((double)ids[i]);
        if (!num || !cJSON_AddItemToArray(arr, num)) {
            cJSON_Delete(num);
            cJSON_Delete(arr);
            arr = NULL;
        }
    }
    return arr;
}

/* One input's ids: a line of text, or an entry of the JSON "inputs" array. */
static int print_ids(const tok_input *in, const kl_token *ids, size_t n, cJSON *inputs)
{
    if (inputs) {
        cJSON *o = cJSON_CreateObject(), *arr = ids_json(ids, n);
        if (!o || !arr || !cJSON_AddItemToArray(inputs, o)) {
            cJSON_Delete(o);
            cJSON_Delete(arr);
            return -1;
        }
        cJSON_AddStringToObject(o, "source", in->path ? in->path : "--text");
        cJSON_AddItemToObject(o, "ids", arr);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        printf(i ? " %u" : "%u", (unsigned)ids[i]);
    putchar('\n');
    return 0;
}

/* Reads the input of --file (or takes --text): 0, or the exit status after the message. */
static int load_input(const tok_input *in, char **owned, const char **text, size_t *len)
{
    kl_err err;
    kl_err_clear(&err);
    *text = in->text;
    *len = in->text ? strlen(in->text) : 0;
    if (in->text)
        return 0;
    int rc = !strcmp(in->path, "-") ? read_stdin(owned, len, &err)
                                    : kl_read_file(in->path, MAX_INPUT_BYTES, owned, len, &err);
    if (!rc) {
        *text = *owned;
        return 0;
    }
    /* an input that cannot be read is an I/O error (2), whatever the reason: missing, a
     * directory, a FIFO or a device (kl reads regular files only), too large */
    char buf[1024], msg[1300];
    snprintf(msg, sizeof msg, "--file %s: cannot read the input: %s%s", in->path,
             kl_err_format(&err, buf, sizeof buf),
             strcmp(err.rule, "FILE-NOT-REGULAR") ? ""
                                                  : " (--file wants a regular file, or '-' for "
                                                    "standard input)");
    return kl_cli_fail(KL_EXIT_USAGE, kl_err_code_name(err.code), msg, &err);
}

/* Encodes one input and prints its ids; adds to the byte/token/second totals.  0 or the exit
 * status after the message. */
static int tokenize_one(const kl_tokenizer *tok, const tok_input *in, cJSON *inputs,
                        double *secs, size_t *n_bytes, size_t *n_tokens)
{
    char *owned = NULL;
    const char *text;
    size_t len;
    int rc = load_input(in, &owned, &text, &len);
    if (rc)
        return rc;
    kl_err err;
    kl_err_clear(&err);
    kl_token *ids = NULL;
    size_t n = 0;
    double t0 = kl_now_s();
    int krc = kl_tok_encode(tok, text, len, &ids, &n, &err);
    *secs += kl_now_s() - t0;
    if (krc) {
        kl_err_context(&err, in->path ? in->path : "--text", NULL, KL_NO_OFFSET, NULL);
        rc = kl_cli_report_as(exit_for(err.code), &err);
    } else if (print_ids(in, ids, n, inputs)) {
        rc = kl_cli_fail(KL_EXIT_BUG, "nomem", "out of memory printing the ids", NULL);
    }
    *n_bytes += len;
    *n_tokens += n;
    kl_free(ids);
    kl_free(owned);
    return rc;
}

/* The tokenizer of a model directory, a Hugging Face cache folder or ORG/NAME. */
static int open_tok(const char *arg, kl_tokenizer **tok, kl_err *err)
{
    char dir[4096];
    int rc = kl_model_dir_resolve(arg, dir, sizeof dir, err);
    return rc ? rc : kl_tok_open(dir, tok, err);
}

/* KL_OPT_FN of --text and --file: appends to the list of inputs. */
typedef struct tok_inputs {
    tok_input *in; /* [argc] */
    int n;
} tok_inputs;

static int add_text(void *target, const char *v)
{
    tok_inputs *l = target;
    l->in[l->n++].text = v;
    return 0;
}

static int add_file(void *target, const char *v)
{
    tok_inputs *l = target;
    l->in[l->n++].path = v;
    return 0;
}

/* Encodes every input with the tokenizer of dir; prints text lines or one JSON object. */
static int tokenize_all(const char *dir, const tok_inputs *l, int json, int stats)
{
    kl_err err;
    kl_err_clear(&err);
    kl_tokenizer *tok = NULL;
    double t0 = kl_now_s();
    if (open_tok(dir, &tok, &err))
        return kl_cli_report_as(exit_for(err.code), &err);
    double load_s = kl_now_s() - t0, enc_s = 0;
    size_t n_bytes = 0, n_tokens = 0;
    cJSON *root = json ? kl_cli_json_head(1) : NULL;
    cJSON *inputs = root ? cJSON_AddArrayToObject(root, "inputs") : NULL;
    int rc = json && !inputs ? kl_cli_fail(KL_EXIT_BUG, "nomem", "out of memory", NULL) : 0;
    for (int k = 0; k < l->n && !rc; k++)
        rc = tokenize_one(tok, &l->in[k], inputs, &enc_s, &n_bytes, &n_tokens);
    if (json && !rc)
        rc = kl_cli_print_json(root);
    else
        cJSON_Delete(root);
    if (stats)
        fprintf(stderr,
                "kl tokenize: load %.3f s (%u ids); encode %zu bytes -> %zu tokens in %.3f s "
                "(%.2f MB/s, %.0f tokens/s)\n",
                load_s, (unsigned)kl_tok_n_vocab(tok), n_bytes, n_tokens, enc_s,
                enc_s > 0 ? (double)n_bytes / enc_s / 1e6 : 0.0,
                enc_s > 0 ? (double)n_tokens / enc_s : 0.0);
    kl_tok_close(tok);
    return rc;
}

int cmd_tokenize(int argc, char **argv)
{
    int json = 0, stats = 0;
    tok_inputs l = {kl_calloc((size_t)argc, sizeof *l.in), 0};
    if (!l.in)
        return KL_EXIT_USAGE;
    const kl_opt opts[] = {
        KL_VALUE("--text", 0, KL_OPT_FN, &l, "T", "encode the string T", .fn = add_text,
                 .multi = 1),
        KL_VALUE("--file", 0, KL_OPT_FN, &l, "F",
                 "encode the contents of file F (UTF-8; '-' reads standard input)",
                 .fn = add_file, .multi = 1),
        KL_FLAG("--json", 0, &json,
                "print one JSON object: \"inputs\", one {source, ids} per input"),
        KL_FLAG("--stats", 0, &stats, "report load time and encode throughput on stderr"),
        {0}};
    const kl_cmd_spec spec = {"tokenize", tokenize_synopsis, tokenize_about, opts,
                              tokenize_footer, 1, 1, "DIR"};
    const char *dir;
    int rc = kl_args_parse_into(&spec, argc, argv, &dir, 1);
    if (rc == KL_ARGS_RUN)
        rc = l.n ? tokenize_all(dir, &l, json, stats) : kl_cli_usage("no --text or --file given");
    kl_free(l.in);
    return rc;
}

/* The decoded text on stdout, or inside the JSON object (invalid UTF-8 as U+FFFD there). */
static int print_text(const char *text, size_t len, size_t n_ids, int json)
{
    if (!json) {
        fwrite(text, 1, len, stdout);
        return KL_EXIT_OK;
    }
    char *clean = kl_utf8_sanitize(text, len);
    if (!clean)
        return kl_cli_fail(KL_EXIT_BUG, "nomem", "out of memory", NULL);
    cJSON *root = kl_cli_json_head(1);
    cJSON_AddNumberToObject(root, "ids", (double)n_ids);
    cJSON_AddStringToObject(root, "text", clean);
    kl_free(clean);
    return kl_cli_print_json(root);
}

int cmd_detokenize(int argc, char **argv)
{
    const char *ids_text = NULL;
    int skip = 0, json = 0;
    const kl_opt opts[] = {
        KL_VALUE("--ids", 0, KL_OPT_STR, &ids_text, "LIST",
                 "decimal ids separated by commas (no empty items)"),
        KL_FLAG("--skip-special", 0, &skip,
                "leave out control tokens (specials marked \"special\": true)"),
        KL_FLAG("--json", 0, &json, "one JSON object: the text (invalid UTF-8 as U+FFFD)"),
        {0}};
    const kl_cmd_spec spec = {"detokenize", detokenize_synopsis, detokenize_about, opts,
                              detokenize_footer, 1, 1, "DIR"};
    const char *dir;
    int rc = kl_args_parse_into(&spec, argc, argv, &dir, 1);
    if (rc != KL_ARGS_RUN)
        return rc;
    if (!ids_text)
        return kl_cli_usage("no --ids given");
    kl_token *ids = NULL;
    size_t n = 0;
    if (kl_cli_parse_ids(ids_text, UINT32_MAX, &ids, &n))
        return kl_cli_usage("--ids wants numbers, not '%s'", ids_text);
    kl_err err;
    kl_err_clear(&err);
    kl_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    if (open_tok(dir, &tok, &err) ||
        kl_tok_decode(tok, ids, n, skip ? KL_TOK_SKIP_CONTROL : 0, &text, &len, &err))
        rc = kl_cli_report_as(exit_for(err.code), &err);
    else
        rc = print_text(text, len, n, json);
    kl_free(text);
    kl_tok_close(tok);
    kl_free(ids);
    return rc;
}
