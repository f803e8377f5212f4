/*
 * convert/mxfp4.h — OCP MXFP4 quantizer: the block scale rules and whole rows.
 *
 * The format itself (layout, E2M1/E8M0 encode and decode, kl_mxfp4_dequantize_row) is
 * common/mxfp4_format.h, included here.  Elements round to nearest, ties to the even mantissa;
 * magnitudes above 6·X saturate to 6; a value that rounds to zero gets code 0 (never -0).
 * All-zero block: scale 127, codes 0.  Scale byte 255 (NaN) is never produced.
 *
 * Scale rules (X = block scale, amax = largest |value| of the block):
 *   KL_SCALE_OCP    X = 2^(floor(log2 amax) - 2)          the spec's rule
 *   KL_SCALE_ROUND  X = 2^round(log2(amax / 6))            the seed's rule
 *   KL_SCALE_CEIL   X = 2^ceil(log2(amax / 6))             never clips
 *   KL_SCALE_MSE    per block, the exponent among the candidates of the three rules above (and
 *                   their neighbours) with the least squared error after quantization
 * Exponents are clamped to the E8M0 range [-127, 127].
 *
 * Inputs are BF16 rows (the official checkpoint's dtype) or F32 rows; n (elements per row) must
 * be a multiple of 32.  NaN or Inf input is an error (KL_E_FORMAT, rule "MXFP4-NONFINITE")
 * whose message names the element's block; callers add tensor and row.
 * The scalar functions are the reference; the AVX2 path (used automatically when the CPU has
 * AVX2 and FMA: kl_cpu_has_avx2_fma) produces identical bytes.  All functions are thread-safe
 * (no state).
 */
#ifndef KL_CONVERT_MXFP4_H
#define KL_CONVERT_MXFP4_H

#include "common/err.h"
#include "common/mxfp4_format.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kl_scale_rule {
    KL_SCALE_OCP = 0,
    KL_SCALE_ROUND,
    KL_SCALE_CEIL,
    KL_SCALE_MSE,
    KL_SCALE_RULE_COUNT
} kl_scale_rule;

/* "ocp" | "round" | "ceil" | "mse" -> rule, or -1. */
int kl_scale_rule_parse(const char *s);
const char *kl_scale_rule_name(kl_scale_rule r);

/* Quantizes one row of n BF16 values (n % 32 == 0) into packed[n/2] and scale[n/32].
 * On NaN/Inf returns KL_E_FORMAT and sets *bad_block (if non-NULL) to the block index. */
int kl_mxfp4_quantize_row_bf16(const uint16_t *in, size_t n, kl_scale_rule rule, uint8_t *packed,
                               uint8_t *scale, size_t *bad_block, kl_err *err);
int kl_mxfp4_quantize_row_f32(const float *in, size_t n, kl_scale_rule rule, uint8_t *packed,
                              uint8_t *scale, size_t *bad_block, kl_err *err);

/* The scalar reference of the above (the public functions may use AVX2). */
int kl_mxfp4_quantize_row_bf16_scalar(const uint16_t *in, size_t n, kl_scale_rule rule,
                                      uint8_t *packed, uint8_t *scale, size_t *bad_block,
                                      kl_err *err);
int kl_mxfp4_quantize_row_f32_scalar(const float *in, size_t n, kl_scale_rule rule,
                                     uint8_t *packed, uint8_t *scale, size_t *bad_block,
                                     kl_err *err);

#endif
