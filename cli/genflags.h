/*
 * cli/genflags.h — the generation flags `kl run` and `kl chat` share: -n, --temp, --top-k,
 * --top-p, --min-p, --seed, --threads, --route-weights, -q, --ignore-memory-check, --device,
 * --tp, --expert-parallel, as rows of their option tables (kl serve takes them from --threads
 * on; --device, --tp and --expert-parallel also in kl bench decode: KL_DEVICE_ROW, KL_TP_ROW,
 * KL_EP_ROW).
 */
#ifndef KL_CLI_GENFLAGS_H
#define KL_CLI_GENFLAGS_H

#include "cli/cli.h"
#include "cli/loadmodel.h"
#include "engine/model.h"
#include "engine/sampler.h"

typedef struct kl_gen_flags {
    unsigned long long n_predict; /* -n */
    kl_sampler_opts samp;
    unsigned threads; /* 0 = online CPUs */
    kl_route_weights route;
    int quiet;         /* -q: errors only on stderr (no progress, load line or timings) */
    int ignore_memory; /* --ignore-memory-check */
    kl_cli_device device; /* --device */
    unsigned long long tp; /* --tp: tensor-parallel ranks (0 or 1: none) */
    int expert_parallel;   /* --expert-parallel */
} kl_gen_flags;

#define KL_GEN_FLAG_ROWS 13

/* --device auto|cpu|gpu into a kl_cli_device (an option-table parser: 0 or -1). */
int kl_cli_parse_device(void *target, const char *v);
#define KL_DEVICE_ROW(tgt)                                                                       \
    KL_VALUE("--device", 0, KL_OPT_FN, (tgt), "D",                                               \
             "where to run: auto (default: the GPU if there is one), cpu or gpu",               \
             .fn = kl_cli_parse_device, .wants = "auto, cpu or gpu")

#define KL_TP_ROW(tgt)                                                                           \
    KL_VALUE("--tp", 0, KL_OPT_U64, (tgt), "N",                                                  \
             "tensor-parallel ranks (default 1): every block runs as N rank parts\n"             \
             "in this process, partial sums added in rank order; N must split the\n"             \
             "model (kl audit --tp; an error lists the valid sizes). N > 1 needs\n"              \
             "--device cpu or gpu: N backends of the ranks' cuts of the model (on\n"            \
             "GPUs: rank r on GPU r % the GPUs, sums through the host, a check of\n"           \
             "the cut, not yet a speed-up)", .lo = 1, .hi = 64)

#define KL_EP_ROW(tgt)                                                                           \
    KL_FLAG("--expert-parallel", 0, (tgt),                                                       \
            "with --tp: each routed expert whole on one rank (expert parallel)\n"                \
            "instead of cut by its intermediate width on every rank")

/* NULL, or why --tp tp (with --expert-parallel: ep) cannot run on device d: N > 1 names its
 * device (cpu or gpu), expert parallelism needs N > 1. */
const char *kl_cli_tp_problem(unsigned long long tp, int ep, kl_cli_device d);

/* Writes the KL_GEN_FLAG_ROWS option rows of the flags above, targeting f, into rows; n_help
 * is the help of -n (its default differs between run and chat). */
void kl_gen_flag_rows(kl_gen_flags *f, const char *n_help, kl_opt *rows);

#endif
