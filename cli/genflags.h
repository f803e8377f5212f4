/*
 * cli/genflags.h — the generation flags `kl run` and `kl chat` share: -n, --temp, --top-p,
 * --top-k, --min-p, --seed, --threads, --route-weights, -q, --ignore-memory-check.
 */
#ifndef KL_CLI_GENFLAGS_H
#define KL_CLI_GENFLAGS_H

#include "engine/model.h"
#include "engine/sampler.h"

typedef struct kl_gen_flags {
    unsigned long long n_predict; /* -n */
    kl_sampler_opts samp;
    unsigned threads; /* 0 = online CPUs */
    kl_route_weights route;
    int quiet;        /* -q: errors only on stderr (no progress, load line or timings) */
    int ignore_memory; /* --ignore-memory-check */
} kl_gen_flags;

/* Looks at argv[*i]: 1 if it was one of the flags above (value consumed, *i advanced), 0 if it
 * is something else, -1 on a bad value with *why and *val describing it for the usage error. */
int kl_gen_flag(int argc, char **argv, int *i, kl_gen_flags *f, const char **why, const char **val);

#endif
