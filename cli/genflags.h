/*
 * cli/genflags.h — the generation flags `kl run` and `kl chat` share: -n, --temp, --top-k,
 * --top-p, --min-p, --seed, --threads, --route-weights, -q, --ignore-memory-check, as rows of
 * their option tables.
 */
#ifndef KL_CLI_GENFLAGS_H
#define KL_CLI_GENFLAGS_H

#include "cli/cli.h"
#include "engine/model.h"
#include "engine/sampler.h"

typedef struct kl_gen_flags {
    unsigned long long n_predict; /* -n */
    kl_sampler_opts samp;
    unsigned threads; /* 0 = online CPUs */
    kl_route_weights route;
    int quiet;         /* -q: errors only on stderr (no progress, load line or timings) */
    int ignore_memory; /* --ignore-memory-check */
} kl_gen_flags;

#define KL_GEN_FLAG_ROWS 10

/* Writes the KL_GEN_FLAG_ROWS option rows of the flags above, targeting f, into rows; n_help
 * is the help of -n (its default differs between run and chat). */
void kl_gen_flag_rows(kl_gen_flags *f, const char *n_help, kl_opt *rows);

#endif
