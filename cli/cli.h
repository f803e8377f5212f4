/*
 * cli/cli.h — the kl subcommands.  Each is `int cmd_<name>(int argc, char **argv)` where
 * argv[0] is the subcommand name; returns the process exit status:
 *   0 clean, 1 the command ran and found problems, 2 usage or I/O error, 3 internal bug.
 * Results go to stdout, everything else to stderr.
 *
 * The contract every command keeps (tests/test_cli.c): its options are one table of kl_opt
 * rows (KL_FLAG, KL_VALUE) given to kl_args_parse, which also writes the options part of its
 * --help; a new option is one row.  After parsing, errors go through kl_cli_usage (bad command
 * line), kl_cli_report / kl_cli_report_as (a kl_err) or kl_cli_fail, and JSON results through
 * kl_cli_json_head + kl_cli_print_json: with --json exactly one object reaches stdout on every
 * path.  main.c ends with kl_cli_finish, which reports a stdout that could not be written.
 */
#ifndef KL_CLI_CLI_H
#define KL_CLI_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "engine/token.h"

#define KL_VERSION "0.1.0"

enum { KL_EXIT_OK = 0, KL_EXIT_PROBLEMS = 1, KL_EXIT_USAGE = 2, KL_EXIT_BUG = 3 };

int cmd_audit(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_read(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* ---- options: one table per command, one parser (cli/args.c) ------------------------------ */

typedef enum kl_opt_kind {
    KL_OPT_FLAG,   /* no value: *(int *)target = flag_value (1 when 0) */
    KL_OPT_STR,    /* *(const char **)target = the value (borrowed from argv) */
    KL_OPT_U64,    /* *(unsigned long long *)target, an integer in [lo, hi] */
    KL_OPT_BYTES,  /* *(unsigned long long *)target, a byte count ("8M", "5G") in [lo, hi] */
    KL_OPT_TOKENS, /* *(unsigned long long *)target, a token count ("128K", "1M") in [lo, hi] */
    KL_OPT_FLOAT,  /* *(float *)target, a finite number in [lo, hi] */
    KL_OPT_CHOICE, /* *(int *)target = index of the value in choices ("a|b|c") */
    KL_OPT_FN,     /* fn(target, value): 0, or -1 for a bad value */
} kl_opt_kind;

typedef struct kl_opt {
    const char *name;     /* "--threads"; NULL ends a table */
    char short_name;      /* 'n' for -n, 0 for none */
    kl_opt_kind kind;
    void *target;         /* see kl_opt_kind */
    const char *metavar;  /* the value's name in help ("N", "BYTES"); NULL for flags */
    const char *help;     /* help text; '\n' starts a continuation line */
    double lo, hi;        /* U64, BYTES, TOKENS, FLOAT bounds (inclusive); hi 0 = no upper
                             bound */
    const char *choices;  /* CHOICE: "ocp|round|ceil|mse" */
    const char *wants;    /* what a bad value is told it wants ("a count in 1..4096");
                             NULL: said from the kind and bounds */
    int (*fn)(void *target, const char *value); /* FN */
    int flag_value;       /* FLAG: the value stored (0 stores 1) */
    int group;            /* nonzero: at most one option of the group per command line */
    int multi;            /* may be given more than once (the last value wins, FN sees each) */
} kl_opt;

/* Table rows: KL_FLAG("--json", 0, &json, "help"), KL_VALUE("--threads", 0, KL_OPT_U64,
 * &threads, "N", "help", .lo = 1, .hi = 1024); further fields as designators. */
#define KL_FLAG(nm, sh, tgt, hlp, ...)                                                             \
    {.name = (nm), .short_name = (sh), .kind = KL_OPT_FLAG, .target = (tgt), .help = (hlp),        \
     __VA_ARGS__}
#define KL_VALUE(nm, sh, k, tgt, mv, hlp, ...)                                                     \
    {.name = (nm), .short_name = (sh), .kind = (k), .target = (tgt), .metavar = (mv),              \
     .help = (hlp), __VA_ARGS__}

/* One command's interface: its help is synopsis, about, the options from the table, footer. */
typedef struct kl_cmd_spec {
    const char *name;     /* "audit", "bench decode" */
    const char *synopsis; /* "usage: kl audit DIR [...]\n" lines */
    const char *about;    /* paragraph(s) before the options, or NULL */
    const kl_opt *opts;   /* ends with an entry whose name is NULL */
    const char *footer;   /* text after the options, or NULL */
    unsigned min_pos;     /* positional arguments wanted at least */
    unsigned max_pos;     /* at most; 0 = any number */
    const char *pos_name; /* "DIR", "SRC DST": named in "missing ..." errors */
} kl_cmd_spec;

/* The positional arguments of a parsed command line (borrowed from argv). */
typedef struct kl_args {
    const char **pos; /* [n_pos], kl_malloc'd: kl_args_free */
    size_t n_pos;
} kl_args;

#define KL_ARGS_RUN (-1)

/* Parses argv[1..argc) against spec: "--name VALUE", "--name=VALUE", "-x VALUE", flags,
 * positionals ("-" is one, and everything after "--").  Sets the output state (command name,
 * --json).  Returns KL_ARGS_RUN to go on, else the exit status to return: 0 after --help
 * (printed on stdout, or as a JSON object with --json), 2 after a usage error (one line and
 * "try 'kl CMD --help'" on stderr, with a did-you-mean for a misspelt option; the JSON error
 * object with --json).  Refuses unknown options, missing or bad values, an option given twice
 * (unless multi), two options of one group, and a positional count outside the spec. */
int kl_args_parse(const kl_cmd_spec *spec, int argc, char **argv, kl_args *out);
void kl_args_free(kl_args *a);
/* kl_args_parse for commands of at most n positionals (spec->max_pos <= n): they go into
 * pos[0..n), NULL where not given. */
int kl_args_parse_into(const kl_cmd_spec *spec, int argc, char **argv, const char **pos,
                       size_t n);
/* Prints the whole help of spec on f. */
void kl_args_help(const kl_cmd_spec *spec, FILE *f);
/* The candidate closest to word by edit distance when it is close enough to be a likely typo,
 * else NULL. */
const char *kl_cli_nearest(const char *word, const char *const *cands, size_t n);

/* ---- output: one contract for every command (cli/output.c) -------------------------------- */
/* The state of this invocation: the command's name and whether --json was given.  With
 * --json, exactly one JSON object goes to stdout on every exit path. */

struct kl_err;
struct cJSON;

void kl_cli_begin(const char *cmd, int json);
const char *kl_cli_cmd(void);
int kl_cli_json(void);
/* {"kl_version", "command", "ok"}: the head of every object. */
struct cJSON *kl_cli_json_head(int ok);
/* Adds "error": {code, message, file, tensor, offset, rule} (err may be NULL). */
void kl_cli_json_add_error(struct cJSON *root, const char *code, const char *message,
                           const struct kl_err *err);
/* Prints root (one line) on stdout, frees it, flushes: KL_EXIT_OK, or KL_EXIT_USAGE with a
 * message when stdout cannot be written, KL_EXIT_BUG when out of memory or a second object. */
int kl_cli_print_json(struct cJSON *root);
/* Prints "kl CMD: <message>" on stderr and, with --json when no object went out yet, the error
 * object; returns status. */
int kl_cli_fail(int status, const char *code, const char *message, const struct kl_err *err);
/* A usage error: one line, then "try 'kl CMD --help'" (stderr); the JSON error object with
 * --json.  Returns KL_EXIT_USAGE. */
int kl_cli_usage(const char *fmt, ...) KL_PRINTF(1, 2);
/* Prints "kl CMD: <err>" on stderr (and the JSON error object) and returns its exit status: a
 * broken checkpoint or tokenizer (FORMAT, SCHEMA, UNSUPPORTED) is a problem found (1), an
 * internal bug 3, bad input from the command line, I/O and memory 2. */
int kl_cli_report(const char *cmd, const struct kl_err *err);
/* As kl_cli_report with the exit status given. */
int kl_cli_report_as(int status, const struct kl_err *err);
/* The end of every invocation (main.c): with --json and no object printed, the error object;
 * then stdout is flushed and closed: a write error is reported and gives exit 2. */
int kl_cli_finish(int status);

/* Resolves a MODEL/DIR argument (a checkpoint directory, a Hugging Face cache repository folder
 * models--ORG--NAME, or ORG/NAME in the local cache: kl_model_dir_resolve) into out (size n).
 * 0, or prints "kl CMD: <why>" and returns the exit status (2). */
int kl_cli_model_dir(const char *cmd, const char *arg, char *out, size_t n);

/* Parses a byte count such as "4096", "8M", "5G", "2GiB" into *out; 0 or -1. */
int kl_cli_parse_bytes(const char *s, unsigned long long *out);
/* Parses a token count such as "131072", "128K", "1M", "2G" into *out: the suffixes are powers
 * of 1024 (1M = 1048576, the 1M context of Kimi-Linear), case-insensitive; 0 or -1. */
int kl_cli_parse_tokens(const char *s, unsigned long long *out);
/* Parses a strict id list into a kl_malloc'd array of *n >= 1 ids <= max (and < 2^32):
 * decimal ids separated by commas, blanks (space, tab, CR, LF) allowed around each id
 * ("1, 2,3" is fine).  -1 (nothing allocated) on an empty list, an empty item ("1,,2", "1,2,",
 * ",1"), ids separated by blanks only ("1 2"), a sign, a non-digit, a too large id, or no
 * memory.  The one parser of every --ids / --force-ids. */
int kl_cli_parse_ids(const char *s, uint64_t max, kl_token **out, size_t *n);
/* Parses a finite float; 0 or -1. */
int kl_cli_parse_float(const char *s, float *out);
/* KL_OPT_FN parser of a scale rule name into *(int *)target; 0 or -1. */
int kl_cli_parse_scale_rule(void *target, const char *v);
/* Parses a non-negative integer; 0 or -1. */
int kl_cli_parse_u64(const char *s, unsigned long long *out);

#endif
