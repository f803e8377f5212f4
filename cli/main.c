/*
 * cli/main.c — `kl`: dispatches to the subcommands.
 */
#include "cli/cli.h"

#include "common/log.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
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
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with continuous batching"},
};

#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fprintf(out,
            "kl %s — audit, convert, load and serve Kimi-Linear checkpoints\n\n"
            "usage: kl COMMAND [ARGS]\n\ncommands:\n",
            KL_VERSION);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "  %-10s %s\n", "help", "this text; `kl COMMAND --help` for one command");
    fprintf(out,
            "\nExit status: 0 clean, 1 problems found, 2 usage or I/O error, 3 internal bug.\n");
}

/* A closed standard descriptor would be taken by the next open(2): a checkpoint or output file
 * would receive what is printed.  Hold each closed one with /dev/null opened read-only, so
 * writes to a closed stdout fail (and are reported) instead. */
static void hold_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDONLY) != fd)
            return;
}

static const command *find_command(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i].name))
            return &commands[i];
    return NULL;
}

static int unknown_command(int argc, char **argv)
{
    const char *names[N_COMMANDS + 2];
    for (size_t i = 0; i < N_COMMANDS; i++)
        names[i] = commands[i].name;
    names[N_COMMANDS] = "help";
    names[N_COMMANDS + 1] = "version";
    int json = 0;
    for (int i = 1; i < argc; i++)
        json |= !strcmp(argv[i], "--json");
    kl_cli_begin("kl", json);
    const char *near = kl_cli_nearest(argv[1], names, N_COMMANDS + 2);
    char msg[256];
    snprintf(msg, sizeof msg, "unknown command '%.64s'%s%s%s", argv[1],
             near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
    fprintf(stderr, "kl: %s\ntry 'kl help'\n", msg);
    if (json) {
        cJSON *root = kl_cli_json_head(0);
        kl_cli_json_add_error(root, "usage", msg, NULL);
        kl_cli_print_json(root);
    }
    return KL_EXIT_USAGE;
}

static int dispatch(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return KL_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "help") || !strcmp(name, "--help") || !strcmp(name, "-h")) {
        const command *c = argc > 2 ? find_command(argv[2]) : NULL;
        if (c) {
            char *help_argv[] = {argv[2], "--help", NULL};
            return c->run(2, help_argv);
        }
        usage(stdout);
        return KL_EXIT_OK;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "version")) {
        printf("kl %s\n", KL_VERSION);
        return KL_EXIT_OK;
    }
    const command *c = find_command(name);
    if (c)
        return c->run(argc - 1, argv + 1);
    return unknown_command(argc, argv);
}

int main(int argc, char **argv)
{
    hold_std_fds();
    return kl_cli_finish(dispatch(argc, argv));
}
