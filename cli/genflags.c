/* cli/genflags.c — generation flags shared by run and chat (see genflags.h). */
#include "cli/genflags.h"

#include <stdint.h>
#include <string.h>

static int parse_top_p(void *target, const char *v)
{
    float p;
    if (kl_cli_parse_float(v, &p) || !(p > 0 && p <= 1))
        return -1;
    *(float *)target = p;
    return 0;
}

static int parse_top_k(void *target, const char *v)
{
    unsigned long long u;
    if (kl_cli_parse_u64(v, &u) || u > UINT32_MAX)
        return -1;
    *(uint32_t *)target = (uint32_t)u;
    return 0;
}

static int parse_seed(void *target, const char *v)
{
    unsigned long long u;
    if (kl_cli_parse_u64(v, &u))
        return -1;
    *(uint64_t *)target = u;
    return 0;
}

static int parse_threads(void *target, const char *v)
{
    unsigned long long u;
    if (kl_cli_parse_u64(v, &u) || u == 0 || u > 4096)
        return -1;
    *(unsigned *)target = (unsigned)u;
    return 0;
}

static int parse_route(void *target, const char *v)
{
    if (!strcmp(v, "unbiased"))
        *(kl_route_weights *)target = KL_ROUTE_UNBIASED;
    else if (!strcmp(v, "biased"))
        *(kl_route_weights *)target = KL_ROUTE_BIASED;
    else
        return -1;
    return 0;
}

int kl_cli_parse_device(void *target, const char *v)
{
    static const char *const names[] = {"auto", "cpu", "gpu"};
    for (int i = 0; i < 3; i++) {
        if (!strcmp(v, names[i])) {
            *(kl_cli_device *)target = (kl_cli_device)i;
            return 0;
        }
    }
    return -1;
}

void kl_gen_flag_rows(kl_gen_flags *f, const char *n_help, kl_opt *rows)
{
    const kl_opt r[KL_GEN_FLAG_ROWS] = {
        KL_VALUE(NULL, 'n', KL_OPT_U64, &f->n_predict, "N", n_help, .hi = (double)(SIZE_MAX / 8),
                 .wants = "a count"),
        KL_VALUE("--temp", 0, KL_OPT_FLOAT, &f->samp.temperature, "T",
                 "temperature (default 0 = greedy)", .wants = "a number >= 0"),
        KL_VALUE("--top-k", 0, KL_OPT_FN, &f->samp.top_k, "K",
                 "keep the K most likely tokens (default 0 = off)", .fn = parse_top_k,
                 .wants = "a count"),
        KL_VALUE("--top-p", 0, KL_OPT_FN, &f->samp.top_p, "P",
                 "keep the smallest set of mass >= P (default 1 = off)", .fn = parse_top_p,
                 .wants = "a number in (0, 1]"),
        KL_VALUE("--min-p", 0, KL_OPT_FLOAT, &f->samp.min_p, "M",
                 "keep tokens with p >= M * p_max (default 0 = off)", .hi = 1,
                 .wants = "a number in [0, 1]"),
        KL_VALUE("--seed", 0, KL_OPT_FN, &f->samp.seed, "S",
                 "sampling seed (default 0); order: temp, top-k, top-p, min-p, sample",
                 .fn = parse_seed, .wants = "a non-negative integer"),
        KL_VALUE("--threads", 0, KL_OPT_FN, &f->threads, "N",
                 "worker threads (default: online CPUs)", .fn = parse_threads,
                 .wants = "a count in 1..4096"),
        KL_VALUE("--route-weights", 0, KL_OPT_FN, &f->route, "W",
                 "MoE weights unbiased (default) or biased (HF remote code)", .fn = parse_route,
                 .wants = "unbiased or biased"),
        KL_FLAG("--quiet", 'q', &f->quiet, "errors only on stderr (no progress, load time or "
                "timings)"),
        KL_FLAG("--ignore-memory-check", 0, &f->ignore_memory,
                "load even when the model is larger than the available memory"),
        KL_DEVICE_ROW(&f->device),
        KL_TP_ROW(&f->tp),
        KL_EP_ROW(&f->expert_parallel),
    };
    memcpy(rows, r, sizeof r);
}

const char *kl_cli_tp_problem(unsigned long long tp, int ep, kl_cli_device d)
{
    if (ep && tp <= 1)
        return "--expert-parallel places experts on --tp ranks: add --tp 2 or more";
    return tp > 1 && d == KL_DEVICE_AUTO
               ? "--tp above 1 needs --device cpu (CPU ranks) or --device gpu (GPU ranks)"
               : NULL;
}
