/*
 * convert/verify.h — checking a conversion, and choosing a scale rule.
 *
 * kl_convert_verify re-reads SRC (BF16) and DST (MXFP4 experts).  DST must pass the metadata
 * check audit runs (loader/ckcheck.h: every tensor of its schema present under its name or
 * alias with the schema's shape and dtype, nothing extra); every copy must be byte-identical;
 * every quantized expert is dequantized and compared with its source (relative RMSE =
 * sqrt(sum (q - x)^2 / sum x^2), and max |q - x|).  SRC and DST must be different
 * directories, neither inside the other (KL_E_USAGE).
 * kl_convert_compare_rules quantizes a sample of SRC's routed experts with every scale rule and
 * reports the same statistics per rule.  Both read with pread in bounded chunks, never write,
 * and never hold more than a few tensors in memory.
 */
#ifndef KL_CONVERT_VERIFY_H
#define KL_CONVERT_VERIFY_H

#include "common/err.h"
#include "convert/converter.h"
#include "convert/mxfp4.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_quant_stats {
    size_t tensors;
    double mean_rel_rmse;       /* mean over tensors */
    double max_rel_rmse;
    double max_abs_err;
    char   worst[192];          /* tensor with the largest relative RMSE */
} kl_quant_stats;

typedef struct kl_verify_result {
    size_t         schema_errors;                  /* error findings of DST's metadata check */
    char           first_schema_error[560];        /* "[RULE] tensor: message" */
    size_t         tensors_missing, tensors_extra; /* of them: against DST's schema */
    char           first_missing[192], first_extra[192];
    size_t         copies_checked, copies_differing;
    char           first_differing[192];
    kl_quant_stats experts;
} kl_verify_result;

typedef struct kl_verify_opts {
    const char            *src, *dst;
    unsigned               threads;       /* reserved; 0 */
    kl_convert_progress_fn progress;      /* may be NULL: DST tensor bytes checked / total */
    void                  *progress_ctx;
} kl_verify_opts;

/* 0 when the comparison ran (differences are in *res); KL_E_* when it could not. */
int kl_convert_verify(const kl_verify_opts *o, kl_verify_result *res, kl_err *err);

/* stats[r] for every rule r < KL_SCALE_RULE_COUNT, over `sample` experts' w1/w2/w3 spread
 * evenly over SRC's MoE layers (0 = 16 experts). */
int kl_convert_compare_rules(const char *src, size_t sample, unsigned threads,
                             kl_quant_stats stats[KL_SCALE_RULE_COUNT], kl_err *err);

/* Quantizes rows (BF16) with rule and accumulates the error of one tensor. */
int kl_quant_error_bf16(const uint16_t *rows, size_t n_rows, size_t n_in, kl_scale_rule rule,
                        double *rel_rmse, double *max_abs, kl_err *err);

#endif
