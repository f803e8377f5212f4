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
#include "engine/tokenizer.h"
#include "loader/locate.h"

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char tokenize_usage[] =
    "usage: kl tokenize DIR (--text T | --file F)... [--json] [--stats]\n"
    "\n"
    "Encodes text with the tokenizer in DIR (tiktoken.model, tokenizer_config.json) exactly as\n"
    "Kimi's tokenizer does: special-token text becomes its id, no BOS/EOS is added.  Prints the\n"
    "ids separated by spaces, one line per input (inputs are encoded separately).\n"
    "\n"
    "  --text T     encode the string T\n"
    "  --file F     encode the contents of file F (UTF-8; '-' reads standard input)\n"
    "  --json       print each input's ids as a JSON array of integers (one per line)\n"
    "  --stats      report load time and encode throughput on stderr\n"
    "  -h, --help   this text\n"
    "\n"
    "Exit status: 0 ok, 1 a broken tokenizer or input that is not UTF-8, 2 usage or I/O error.\n";

static const char detokenize_usage[] =
    "usage: kl detokenize DIR --ids 1,2,3 [--skip-special]\n"
    "\n"
    "Decodes token ids with the tokenizer in DIR and prints the text exactly (no newline added).\n"
    "\n"
    "  --ids LIST       ids separated by commas or spaces\n"
    "  --skip-special   leave out control tokens (specials marked \"special\": true)\n"
    "  -h, --help       this text\n"
    "\n"
    "Exit status: 0 ok, 1 a broken tokenizer or an id outside the vocabulary, 2 usage or I/O "
    "error.\n";

#define MAX_INPUT_BYTES ((size_t)1 << 30)

typedef struct tok_input {
    const char *text; /* borrowed from argv, or NULL when path is set */
    const char *path; /* borrowed from argv */
} tok_input;

static int usage_error(const char *cmd, const char *usage, const char *what, const char *arg)
{
    fprintf(stderr, "kl %s: %s%s\n\n%s", cmd, what, arg, usage);
    return KL_EXIT_USAGE;
}

static int exit_for(int code)
{
    return code == KL_E_FORMAT || code == KL_E_USAGE ? KL_EXIT_PROBLEMS
           : code == KL_E_BUG                        ? KL_EXIT_BUG
                                                     : KL_EXIT_USAGE;
}

static int report(const char *cmd, const kl_err *err)
{
    char buf[1024];
    fprintf(stderr, "kl %s: %s\n", cmd, kl_err_format(err, buf, sizeof buf));
    return exit_for(err->code);
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

static int print_ids(const uint32_t *ids, size_t n, int json)
{
    if (json) {
        cJSON *arr = cJSON_CreateArray();
        for (size_t i = 0; arr && i < n; i++) {
            cJSON *num = cJSON_CreateNumber((double)ids[i]);
            if (!num || !cJSON_AddItemToArray(arr, num)) {
                cJSON_Delete(num);
                cJSON_Delete(arr);
                arr = NULL;
            }
        }
        char *s = arr ? cJSON_PrintUnformatted(arr) : NULL;
        cJSON_Delete(arr);
        if (!s)
            return -1;
        puts(s);
        cJSON_free(s);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        printf(i ? " %u" : "%u", (unsigned)ids[i]);
    putchar('\n');
    return 0;
}

/* Encodes one input and prints its ids; adds to the byte/token/second totals. */
static int tokenize_one(const kl_tokenizer *tok, const tok_input *in, int json, double *secs,
                        size_t *n_bytes, size_t *n_tokens, kl_err *err)
{
    char *owned = NULL;
    const char *text = in->text;
    size_t len = text ? strlen(text) : 0;
    int rc = 0;
    if (!text) {
        rc = !strcmp(in->path, "-") ? read_stdin(&owned, &len, err)
                                    : kl_read_file(in->path, MAX_INPUT_BYTES, &owned, &len, err);
        if (rc)
            return rc;
        text = owned;
    }
    uint32_t *ids = NULL;
    size_t n = 0;
    double t0 = kl_now_s();
    rc = kl_tok_encode(tok, text, len, &ids, &n, err);
    *secs += kl_now_s() - t0;
    if (rc) {
        kl_err_context(err, in->path ? in->path : "--text", NULL, KL_NO_OFFSET, NULL);
    } else if (print_ids(ids, n, json)) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory printing %zu ids", n);
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

int cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL;
    int json = 0, stats = 0, n_in = 0;
    tok_input *in = kl_calloc((size_t)argc, sizeof *in);
    if (!in)
        return KL_EXIT_USAGE;
    int rc = KL_EXIT_OK;
    for (int i = 1; i < argc && rc == KL_EXIT_OK; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(tokenize_usage, stdout);
            kl_free(in);
            return KL_EXIT_OK;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--stats")) {
            stats = 1;
        } else if (kl_cli_opt_value(argc, argv, &i, "--text", &v)) {
            if (!v)
                rc = usage_error("tokenize", tokenize_usage, "--text wants a value", "");
            in[n_in++].text = v;
        } else if (kl_cli_opt_value(argc, argv, &i, "--file", &v)) {
            if (!v)
                rc = usage_error("tokenize", tokenize_usage, "--file wants a path", "");
            in[n_in++].path = v;
        } else if (a[0] == '-' && a[1]) {
            rc = usage_error("tokenize", tokenize_usage, "unknown option ", a);
        } else if (dir) {
            rc = usage_error("tokenize", tokenize_usage, "more than one directory: ", a);
        } else {
            dir = a;
        }
    }
    if (rc == KL_EXIT_OK && (!dir || !n_in))
        rc = usage_error("tokenize", tokenize_usage,
                         !dir ? "no tokenizer directory given" : "no --text or --file given", "");
    if (rc != KL_EXIT_OK) {
        kl_free(in);
        return rc;
    }
    kl_err err;
    kl_err_clear(&err);
    kl_tokenizer *tok = NULL;
    double t0 = kl_now_s();
    if (open_tok(dir, &tok, &err)) {
        kl_free(in);
        return report("tokenize", &err);
    }
    double load_s = kl_now_s() - t0, enc_s = 0;
    size_t n_bytes = 0, n_tokens = 0;
    for (int k = 0; k < n_in && rc == KL_EXIT_OK; k++)
        if (tokenize_one(tok, &in[k], json, &enc_s, &n_bytes, &n_tokens, &err))
            rc = report("tokenize", &err);
    if (fflush(stdout) != 0 && rc == KL_EXIT_OK) {
        fprintf(stderr, "kl tokenize: cannot write standard output: %s\n", strerror(errno));
        rc = KL_EXIT_USAGE;
    }
    if (stats)
        fprintf(stderr,
                "kl tokenize: load %.3f s (%u ids); encode %zu bytes -> %zu tokens in %.3f s "
                "(%.2f MB/s, %.0f tokens/s)\n",
                load_s, (unsigned)kl_tok_n_vocab(tok), n_bytes, n_tokens, enc_s,
                enc_s > 0 ? (double)n_bytes / enc_s / 1e6 : 0.0,
                enc_s > 0 ? (double)n_tokens / enc_s : 0.0);
    kl_tok_close(tok);
    kl_free(in);
    return rc;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *dir = NULL, *ids_text = NULL;
    unsigned flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(detokenize_usage, stdout);
            return KL_EXIT_OK;
        } else if (!strcmp(a, "--skip-special")) {
            flags |= KL_TOK_SKIP_CONTROL;
        } else if (kl_cli_opt_value(argc, argv, &i, "--ids", &v)) {
            if (!v)
                return usage_error("detokenize", detokenize_usage, "--ids wants a list", "");
            ids_text = v;
        } else if (a[0] == '-' && a[1]) {
            return usage_error("detokenize", detokenize_usage, "unknown option ", a);
        } else if (dir) {
            return usage_error("detokenize", detokenize_usage, "more than one directory: ", a);
        } else {
            dir = a;
        }
    }
    if (!dir || !ids_text)
        return usage_error("detokenize", detokenize_usage,
                           !dir ? "no tokenizer directory given" : "no --ids given", "");
    uint32_t *ids = NULL;
    size_t n = 0;
    if (kl_cli_parse_ids(ids_text, UINT32_MAX, &ids, &n))
        return usage_error("detokenize", detokenize_usage, "--ids wants numbers, not ", ids_text);
    kl_err err;
    kl_err_clear(&err);
    kl_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = KL_EXIT_OK;
    if (open_tok(dir, &tok, &err) || kl_tok_decode(tok, ids, n, flags, &text, &len, &err)) {
        rc = report("detokenize", &err);
    } else if (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0) {
        fprintf(stderr, "kl detokenize: cannot write standard output: %s\n", strerror(errno));
        rc = KL_EXIT_USAGE;
    }
    kl_free(text);
    kl_tok_close(tok);
    kl_free(ids);
    return rc;
}
