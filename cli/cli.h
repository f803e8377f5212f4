/*
 * cli/cli.h — the kl subcommands.  Each is `int cmd_<name>(int argc, char **argv)` where
 * argv[0] is the subcommand name; returns the process exit status:
 *   0 clean, 1 the command ran and found problems, 2 usage or I/O error, 3 internal bug.
 * Results go to stdout, everything else to stderr.
 */
#ifndef KL_CLI_CLI_H
#define KL_CLI_CLI_H

#include <stddef.h>
#include <stdint.h>

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

struct kl_err;
/* Prints "kl CMD: <err>" on stderr and returns its exit status: a broken checkpoint or
 * tokenizer (FORMAT, SCHEMA, UNSUPPORTED) is a problem found (1), an internal bug 3, bad input
 * from the command line, I/O and memory 2. */
int kl_cli_report(const char *cmd, const struct kl_err *err);

/* Resolves a MODEL/DIR argument (a checkpoint directory, a Hugging Face cache repository folder
 * models--ORG--NAME, or ORG/NAME in the local cache: kl_model_dir_resolve) into out (size n).
 * 0, or prints "kl CMD: <why>" and returns the exit status (2). */
int kl_cli_model_dir(const char *cmd, const char *arg, char *out, size_t n);

/* Parses a byte count such as "4096", "8M", "5G", "2GiB" into *out; 0 or -1. */
int kl_cli_parse_bytes(const char *s, unsigned long long *out);
/* Parses a token count such as "131072", "128K", "1M", "2G" into *out: the suffixes are powers
 * of 1024 (1M = 1048576, the 1M context of Kimi-Linear), case-insensitive; 0 or -1. */
int kl_cli_parse_tokens(const char *s, unsigned long long *out);
/* Matches "--name VALUE" or "--name=VALUE" at argv[*i]: 1 and *val set (NULL when the value is
 * missing), advancing *i past a separate value; 0 if argv[*i] is another option. */
int kl_cli_opt_value(int argc, char **argv, int *i, const char *name, const char **val);
/* Parses a strict id list into a kl_malloc'd array of *n >= 1 ids <= max (and < 2^32):
 * decimal ids separated by commas, blanks (space, tab, CR, LF) allowed around each id
 * ("1, 2,3" is fine).  -1 (nothing allocated) on an empty list, an empty item ("1,,2", "1,2,",
 * ",1"), ids separated by blanks only ("1 2"), a sign, a non-digit, a too large id, or no
 * memory.  The one parser of every --ids / --force-ids. */
int kl_cli_parse_ids(const char *s, uint64_t max, uint32_t **out, size_t *n);
/* Parses a finite float; 0 or -1. */
int kl_cli_parse_float(const char *s, float *out);
/* Parses a non-negative integer; 0 or -1. */
int kl_cli_parse_u64(const char *s, unsigned long long *out);

#endif
