/*
 * cli/main.c — `kl`: dispatches to the subcommands.
 */
#include "cli/cli.h"

#include "common/log.h"

#include <stdio.h>
#include <string.h>

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"audit", cmd_audit, "check a checkpoint: headers, index, schema, layout, memory, hashes"},
    {"synth", cmd_synth, "write a synthetic checkpoint (tiny, small or the full 48B geometry)"},
    {"convert", cmd_convert, "BF16 checkpoint -> MXFP4 routed experts (compressed-tensors)"},
    {"bench", cmd_bench, "measured figures beside their ceilings (mxfp4, rules, decode)"},
    {"read", cmd_read, "stream a checkpoint through the staged reader and report GB/s"},
    {"tokenize", cmd_tokenize, "text -> token ids with a checkpoint's tokenizer"},
    {"detokenize", cmd_detokenize, "token ids -> text with a checkpoint's tokenizer"},
    {"run", cmd_run, "generate from a prompt on the CPU (or teacher-force and dump logits)"},
    {"chat", cmd_chat, "interactive multi-turn chat on the CPU, reusing the shared prefix"},
};

static void usage(FILE *out)
{
    fprintf(out,
            "kl %s — audit, convert, load and serve Kimi-Linear checkpoints\n\n"
            "usage: kl COMMAND [ARGS]\n\ncommands:\n",
            KL_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "  %-10s %s\n", "help", "this text; `kl COMMAND --help` for one command");
    fprintf(out,
            "\nExit status: 0 clean, 1 problems found, 2 usage or I/O error, 3 internal bug.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return KL_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "help") || !strcmp(name, "--help") || !strcmp(name, "-h")) {
        if (argc > 2) {
            for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
                if (!strcmp(argv[2], commands[i].name)) {
                    char *help_argv[] = {argv[2], "--help", NULL};
                    return commands[i].run(2, help_argv);
                }
            }
        }
        usage(stdout);
        return KL_EXIT_OK;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "version")) {
        printf("kl %s\n", KL_VERSION);
        return KL_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(name, commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kl: unknown command '%s'\n\n", name);
    usage(stderr);
    return KL_EXIT_USAGE;
}
