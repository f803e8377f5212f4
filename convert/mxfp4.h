/*
 * convert/mxfp4.h — OCP MXFP4 quantizer and dequantizer (E2M1 elements, E8M0 scale per 32).
 *
 * Layout (compressed-tensors "mxfp4-pack-quantized", as gpt-oss and OCP-based converters):
 *   packed[i/2]: element 2i in the LOW nibble, element 2i+1 in the HIGH nibble;
 *   scale[b]:    E8M0 byte e, block value 2^(e-127), one per 32 consecutive elements of a row.
 * E2M1 codes: 0..7 = {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign.  Elements round to nearest,
 * ties to the even mantissa; magnitudes above 6·X saturate to 6; a value that rounds to zero
 * gets code 0 (never -0).  All-zero block: scale 127, codes 0.  Scale byte 255 (NaN) is never
 * produced.
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
 * AVX2 and FMA) produces identical bytes.  All functions are thread-safe (no state).
 */
#ifndef KL_CONVERT_MXFP4_H
#define KL_CONVERT_MXFP4_H

#include "common/err.h"

#include <stddef.h>
#include <stdint.h>

#define KL_MXFP4_BLOCK 32

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

/* Dequantizes one row: out[n] = E2M1(code) * 2^(scale - 127); scale 255 gives NaN. */
void kl_mxfp4_dequantize_row(const uint8_t *packed, const uint8_t *scale, size_t n, float *out);

/* E2M1 code -> value (codes 0..15). */
float kl_e2m1_value(unsigned code);

/* 1 if the AVX2 path is compiled in and the CPU supports it. */
int kl_mxfp4_have_avx2(void);

#endif
