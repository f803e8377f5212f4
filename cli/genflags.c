/* cli/genflags.c — generation flags shared by run and chat (see genflags.h). */
#include "cli/genflags.h"

#include "cli/cli.h"

#include <stdint.h>
#include <string.h>

#define BAD(msg)                                                                                   \
    do {                                                                                           \
        *why = (msg);                                                                              \
        *val = v ? v : "nothing";                                                                  \
        return -1;                                                                                 \
    } while (0)

int kl_gen_flag(int argc, char **argv, int *i, kl_gen_flags *f, const char **why, const char **val)
{
    const char *v = NULL;
    unsigned long long u;
    if (!strcmp(argv[*i], "-q") || !strcmp(argv[*i], "--quiet")) {
        f->quiet = 1;
    } else if (!strcmp(argv[*i], "--ignore-memory-check")) {
        f->ignore_memory = 1;
    } else if (kl_cli_opt_value(argc, argv, i, "-n", &v)) {
        if (kl_cli_parse_u64(v, &f->n_predict) || f->n_predict > ((size_t)-1) / 8)
            BAD("-n wants a count, not ");
    } else if (kl_cli_opt_value(argc, argv, i, "--temp", &v)) {
        if (kl_cli_parse_float(v, &f->samp.temperature) || f->samp.temperature < 0)
            BAD("--temp wants a number >= 0, not ");
    } else if (kl_cli_opt_value(argc, argv, i, "--top-p", &v)) {
        if (kl_cli_parse_float(v, &f->samp.top_p) || !(f->samp.top_p > 0 && f->samp.top_p <= 1))
            BAD("--top-p wants a number in (0, 1], not ");
    } else if (kl_cli_opt_value(argc, argv, i, "--min-p", &v)) {
        if (kl_cli_parse_float(v, &f->samp.min_p) || !(f->samp.min_p >= 0 && f->samp.min_p <= 1))
            BAD("--min-p wants a number in [0, 1], not ");
    } else if (kl_cli_opt_value(argc, argv, i, "--top-k", &v)) {
        if (kl_cli_parse_u64(v, &u) || u > UINT32_MAX)
            BAD("--top-k wants a count, not ");
        f->samp.top_k = (uint32_t)u;
    } else if (kl_cli_opt_value(argc, argv, i, "--seed", &v)) {
        if (kl_cli_parse_u64(v, &u))
            BAD("--seed wants a non-negative integer, not ");
        f->samp.seed = u;
    } else if (kl_cli_opt_value(argc, argv, i, "--threads", &v)) {
        if (kl_cli_parse_u64(v, &u) || u == 0 || u > 4096)
            BAD("--threads wants a count in 1..4096, not ");
        f->threads = (unsigned)u;
    } else if (kl_cli_opt_value(argc, argv, i, "--route-weights", &v)) {
        if (v && !strcmp(v, "unbiased"))
            f->route = KL_ROUTE_UNBIASED;
        else if (v && !strcmp(v, "biased"))
            f->route = KL_ROUTE_BIASED;
        else
            BAD("--route-weights wants unbiased or biased, not ");
    } else {
        return 0;
    }
    return 1;
}
