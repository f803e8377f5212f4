/*
 * tests/test_mxfp4.c — convert/mxfp4: OCP MXFP4 quantizer and dequantizer.
 *
 * Known answers for every rule (codes, ties, saturation, zero blocks, subnormal and extreme
 * scales, nibble order, no -0, the seed's vectors for `round`), NaN/Inf errors with the block
 * index, error bounds of dequantize(quantize(x)), an independent oracle written from the
 * definitions (long double, brute-force nearest value, all nine mse candidates) against the
 * scalar reference, and AVX2 == scalar on 10^7 BF16 values under every rule.
 */
#include "common/cpu.h"
#include "common/numfmt.h"
#include "common/rng.h"
#include "convert/mxfp4.h"
#include "kernels/mx_bf16.h"
#include "tests/testutil.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

#define BLK KL_MXFP4_BLOCK

/* ck_assert_msg for hot loops: Check records a mark point (a pipe write under fork) on every
 * passing ck_assert, which would dominate the run time of the 10^7-value tests. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ck_assert_msg(cond, __VA_ARGS__);                                                      \
    } while (0)

static const kl_scale_rule k_rules[] = {KL_SCALE_OCP, KL_SCALE_ROUND, KL_SCALE_CEIL, KL_SCALE_MSE};
#define N_RULES 4

static const double k_mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

static unsigned code_at(const uint8_t *packed, size_t i)
{
    return (packed[i / 2] >> (4 * (i & 1))) & 15u;
}

/* f rounded to the nearest BF16 value. */
static float bf(float f)
{
    return kl_bf16_to_f32(kl_f32_to_bf16(f));
}

static uint16_t bf16_exact(float f)
{
    uint16_t h = kl_f32_to_bf16(f);
    CHECK(kl_bf16_to_f32(h) == f || isnan(f), "test value %.9g is not BF16-exact", f);
    return h;
}

/* Quantizes n BF16-exact floats through the public function and the scalar reference; checks
 * they agree byte for byte and succeed.  packed[n/2], scale[n/32]. */
static void quant_bf16(const float *x, size_t n, kl_scale_rule rule, uint8_t *packed,
                       uint8_t *scale)
{
    uint16_t *h = malloc(n * sizeof *h);
    uint8_t *p2 = malloc(n / 2), *s2 = malloc(n / BLK);
    CHECK(h && p2 && s2, "out of memory");
    for (size_t i = 0; i < n; i++)
        h[i] = bf16_exact(x[i]);
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_mxfp4_quantize_row_bf16(h, n, rule, packed, scale, NULL, &err);
    CHECK(rc == 0, "rule %s: rc %d (%s)", kl_scale_rule_name(rule), rc, err.msg);
    rc = kl_mxfp4_quantize_row_bf16_scalar(h, n, rule, p2, s2, NULL, &err);
    CHECK(rc == 0, "rule %s scalar: rc %d (%s)", kl_scale_rule_name(rule), rc, err.msg);
    CHECK(memcmp(packed, p2, n / 2) == 0 && memcmp(scale, s2, n / BLK) == 0,
          "rule %s: public and scalar paths differ", kl_scale_rule_name(rule));
    free(h);
    free(p2);
    free(s2);
}

static void quant_f32(const float *x, size_t n, kl_scale_rule rule, uint8_t *packed, uint8_t *scale)
{
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_mxfp4_quantize_row_f32(x, n, rule, packed, scale, NULL, &err);
    CHECK(rc == 0, "rule %s: rc %d (%s)", kl_scale_rule_name(rule), rc, err.msg);
}

/* Dequantized element i computed in double (no float overflow at extreme scales). */
static double deq_at(const uint8_t *packed, const uint8_t *scale, size_t i)
{
    unsigned c = code_at(packed, i);
    double v = k_mag[c & 7] * ldexp(1.0, (int)scale[i / BLK] - 127);
    return c & 8 ? -v : v;
}

/* ------------------------------------------------------------------------------------------ */
/* Oracle: the definitions, written independently of the implementation                       */

/* Exponent of a rule for amax > 0 (long double log2; frexp for floor). */
static int oracle_rule_exp(long double amax, kl_scale_rule rule)
{
    int e;
    switch (rule) {
    case KL_SCALE_OCP:
        frexpl(amax, &e);
        e = e - 1 - 2;
        break;
    case KL_SCALE_ROUND: e = (int)roundl(log2l(amax / 6.0L)); break;
    default: e = (int)ceill(log2l(amax / 6.0L)); break;
    }
    return e < -127 ? -127 : e > 127 ? 127 : e;
}

/* Nearest E2M1 code to value x at scale 2^e by exhaustive search; ties to the even code. */
static unsigned oracle_code(long double x, int e)
{
    long double q = fabsl(x) / ldexpl(1.0L, e);
    unsigned best = 0;
    for (unsigned c = 1; c < 8; c++) {
        long double dc = fabsl(q - k_mag[c]), db = fabsl(q - k_mag[best]);
        if (dc < db || (dc == db && (c & 1) == 0))
            best = c;
    }
    return best && x < 0 ? best | 8 : best;
}

/* Squared error at scale 2^e over the elements in mask (exact for BF16 inputs). */
static long double oracle_sse(const float *x, int e, const int *mask)
{
    long double s = 0;
    for (int i = 0; i < BLK; i++) {
        if (!mask[i])
            continue;
        unsigned c = oracle_code(x[i], e);
        long double v = ldexpl(k_mag[c & 7], e) * (c & 8 ? -1 : 1);
        s += (x[i] - v) * (x[i] - v);
    }
    return s;
}

/* Quantizes one block of floats: codes[32], returns the scale byte. */
static int oracle_block(const float *x, kl_scale_rule rule, unsigned *codes)
{
    long double amax = 0;
    for (int i = 0; i < BLK; i++)
        amax = fabsl(x[i]) > amax ? fabsl(x[i]) : amax;
    int e = 0;
    if (amax > 0 && rule != KL_SCALE_MSE) {
        e = oracle_rule_exp(amax, rule);
    } else if (amax > 0) {
        /* all nine candidates, deduplicated by the scan; ties keep the smaller exponent */
        int cand[9], nc = 0, lo = 1000, hi = -1000;
        for (int r = 0; r < 3; r++)
            for (int d = -1; d <= 1; d++) {
                int c = oracle_rule_exp(amax, k_rules[r]) + d;
                cand[nc++] = c < -127 ? -127 : c > 127 ? 127 : c;
            }
        for (int i = 0; i < nc; i++) {
            lo = cand[i] < lo ? cand[i] : lo;
            hi = cand[i] > hi ? cand[i] : hi;
        }
        /* elements coding 0 under every candidate add the same x^2 everywhere: leave them out
         * so that the long double sums stay exact and ties are real ties */
        int mask[BLK];
        for (int i = 0; i < BLK; i++) {
            mask[i] = 0;
            for (int j = 0; j < nc; j++)
                mask[i] |= oracle_code(x[i], cand[j]) != 0;
        }
        long double best = 0;
        for (int c = lo; c <= hi; c++) {
            int present = 0;
            for (int j = 0; j < nc; j++)
                present |= cand[j] == c;
            if (!present)
                continue;
            long double s = oracle_sse(x, c, mask);
            if (c == lo || s < best) {
                best = s;
                e = c;
            }
        }
    }
    for (int i = 0; i < BLK; i++)
        codes[i] = amax > 0 ? oracle_code(x[i], e) : 0;
    return e + 127;
}

/* ------------------------------------------------------------------------------------------ */
/* Random blocks with mixed magnitudes, ties, zeros, subnormals, thresholds                   */

static float rand_normal(kl_rng *r)
{
    float a, b;
    kl_rng_normal2(r, &a, &b);
    return a;
}

/* Fills one block of BF16 bit patterns (all finite) of a randomly chosen kind. */
static void gen_block_bf16(kl_rng *r, uint16_t *h)
{
    static const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    unsigned kind = (unsigned)(kl_rng_next(r) % 10);
    int s = (int)(kl_rng_next(r) % 60) - 30;
    uint64_t z = kl_rng_next(r); /* zero mask for some kinds */
    for (int i = 0; i < BLK; i++) {
        uint64_t u = kl_rng_next(r);
        float f;
        switch (kind) {
        case 0: /* Gaussian weights */
        case 1: f = ldexpf(rand_normal(r), s); break;
        case 2: /* random bit patterns, exponents within a window of a random base */
        case 3: {
            unsigned base = (unsigned)(kl_rng_next(r) % 255);
            unsigned be = (unsigned)(u % 16);
            be = base > be ? base - be : 0;
            h[i] = (uint16_t)((u >> 8 & 0x8000) | (be << 7) | (u >> 20 & 0x7f));
            continue;
        }
        case 4: /* ties and grid values at scale 2^s, with 6 * 2^s or 4 * 2^s as amax */
            if (i == 0)
                f = ldexpf(u & 1 ? 6.0f : 4.0f, s);
            else if (u & 2)
                f = ldexpf(mids[(u >> 8) % 7], s);
            else
                f = ldexpf((float)k_mag[(u >> 8) % 8], s);
            f = u & 4 ? -f : f;
            break;
        case 5: /* sparse: mostly +-0 */
            f = (z >> i & 1) ? ldexpf(rand_normal(r), s) : (u & 1 ? -0.0f : 0.0f);
            break;
        case 6: /* amax mantissa near the round (1.0607) and ceil (1.5) thresholds */
            if (i == 0) {
                static const float m[] = {1.0546875f, 1.0625f, 1.5f, 1.5078125f, 1.0f, 1.9921875f};
                f = ldexpf(m[(u >> 8) % 6], s);
            } else {
                f = ldexpf(rand_normal(r) * 0.5f, s);
            }
            break;
        case 8: /* an outlier ~4 * 2^s over values exact on the grid of 2^(s-1) (or 2^(s-2)):
                 * 3/4 are 0.5 or 1.5 there, which the ocp scale 2^s cannot code, so a
                 * smaller mse candidate that clips the outlier often wins or
                 * ties; kind 8 has round = ocp - 1 (m < 1.0607), kind 9 round = ocp */
        case 9:
            if (i == 0) {
                f = ldexpf(1.0f + (float)((kind - 8) * 8 + (u >> 8) % 8) / 128.0f, s + 2);
            } else {
                static const float odd[2] = {0.5f, 1.5f}, even[6] = {0, 1, 2, 3, 4, 6};
                float v = (u & 3) != 0 ? odd[(u >> 8) & 1] : even[(u >> 8) % 6];
                f = ldexpf(v, s - 1 - (int)(kind == 8 && (u & 24) == 24));
            }
            f = u & 4 ? -f : f;
            break;
        default: /* subnormal and tiny normal BF16 */
            h[i] = (uint16_t)((u >> 8 & 0x8000) | (u % 2 ? 0 : 0x80) | (u >> 20 & 0x7f));
            continue;
        }
        if (kind == 5 && (z >> 40 & 7) == 0)
            f = 0.0f; /* now and then an all-zero block */
        h[i] = kl_f32_to_bf16(f);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Names and the code table                                                                   */

START_TEST(scale_rule_names_round_trip)
{
    for (int r = 0; r < KL_SCALE_RULE_COUNT; r++)
        ck_assert_int_eq(kl_scale_rule_parse(kl_scale_rule_name((kl_scale_rule)r)), r);
    ck_assert_int_eq(kl_scale_rule_parse("ocp"), KL_SCALE_OCP);
    ck_assert_int_eq(kl_scale_rule_parse("mse"), KL_SCALE_MSE);
    ck_assert_int_eq(kl_scale_rule_parse("floor"), -1);
    ck_assert_int_eq(kl_scale_rule_parse(""), -1);
    ck_assert_int_eq(kl_scale_rule_parse(NULL), -1);
}
END_TEST

START_TEST(e2m1_value_table_matches_the_spec)
{
    static const float want[16] = {0,     0.5f,  1,  1.5f,  2,  3,  4,  6,
                                   -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (unsigned c = 0; c < 16; c++) {
        ck_assert_msg(kl_e2m1_value(c) == want[c], "code %u: want %g got %g", c, want[c],
                      kl_e2m1_value(c));
        ck_assert_msg(signbit(kl_e2m1_value(c)) == signbit(want[c]), "code %u sign", c);
    }
    ck_assert(isnan(kl_e2m1_value(16)));
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Element rounding                                                                           */

START_TEST(every_e2m1_value_round_trips_under_every_rule)
{
    /* 6 in the block makes X = 1 for ocp, round and ceil; mse has zero error at X = 1 */
    float x[BLK];
    for (int i = 0; i < BLK; i++)
        x[i] = kl_e2m1_value((unsigned)i % 16);
    uint8_t packed[BLK / 2], scale[1];
    for (int r = 0; r < N_RULES; r++) {
        quant_bf16(x, BLK, k_rules[r], packed, scale);
        ck_assert_msg(scale[0] == 127, "rule %s: scale %u", kl_scale_rule_name(k_rules[r]),
                      scale[0]);
        for (int i = 0; i < BLK; i++) {
            unsigned want = (unsigned)i % 16 == 8 ? 0 : (unsigned)i % 16; /* -0 -> code 0 */
            ck_assert_msg(code_at(packed, (size_t)i) == want, "rule %s element %d: want %u got %u",
                          kl_scale_rule_name(k_rules[r]), i, want, code_at(packed, (size_t)i));
        }
    }
}
END_TEST

START_TEST(ties_round_to_the_even_mantissa)
{
    /* issue 3: 0.25 .. 5.0 -> 0, 1, 1, 2, 2, 4, 4 (X = 1, fixed by 6 in element 0) */
    static const float tie[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const float want[7] = {0, 1, 1, 2, 2, 4, 4};
    for (int sc = -20; sc <= 20; sc += 5) /* the same at other block scales */
        for (int r = 0; r < 3; r++) {
            float x[BLK] = {0};
            x[0] = ldexpf(6.0f, sc);
            for (int i = 0; i < 7; i++) {
                x[1 + i] = ldexpf(tie[i], sc);
                x[9 + i] = -ldexpf(tie[i], sc);
            }
            uint8_t packed[BLK / 2], scale[1];
            quant_bf16(x, BLK, k_rules[r], packed, scale);
            ck_assert_int_eq(scale[0], 127 + sc);
            for (int i = 0; i < 7; i++) {
                double got = deq_at(packed, scale, (size_t)(1 + i));
                double gotn = deq_at(packed, scale, (size_t)(9 + i));
                ck_assert_msg(got == ldexp(want[i], sc) && gotn == -ldexp(want[i], sc),
                              "rule %s, X=2^%d: %g -> want %g got %g / %g",
                              kl_scale_rule_name(k_rules[r]), sc, tie[i], want[i], ldexp(got, -sc),
                              ldexp(gotn, -sc));
            }
            ck_assert_msg(code_at(packed, 9) == 0, "-0.25 must give code 0, not -0");
        }
}
END_TEST

START_TEST(values_next_to_ties_round_to_the_nearest)
{
    static const float tie[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const float below[7] = {0, 0.5f, 1, 1.5f, 2, 3, 4};
    static const float above[7] = {0.5f, 1, 1.5f, 2, 3, 4, 6};
    float x[BLK] = {6.0f};
    for (int i = 0; i < 7; i++) {
        x[1 + 2 * i] = nextafterf(tie[i], 0.0f);
        x[2 + 2 * i] = nextafterf(tie[i], 10.0f);
        x[16 + 2 * i] = -nextafterf(tie[i], 0.0f);
        x[17 + 2 * i] = -nextafterf(tie[i], 10.0f);
    }
    uint8_t packed[BLK / 2], scale[1];
    for (int r = 0; r < 3; r++) {
        quant_f32(x, BLK, k_rules[r], packed, scale);
        ck_assert_int_eq(scale[0], 127);
        for (int i = 0; i < 7; i++) {
            ck_assert_msg(deq_at(packed, scale, (size_t)(1 + 2 * i)) == below[i] &&
                              deq_at(packed, scale, (size_t)(2 + 2 * i)) == above[i] &&
                              deq_at(packed, scale, (size_t)(16 + 2 * i)) == -below[i] &&
                              deq_at(packed, scale, (size_t)(17 + 2 * i)) == -above[i],
                          "rule %s: neighbours of the tie %g", kl_scale_rule_name(k_rules[r]),
                          tie[i]);
        }
    }
}
END_TEST

START_TEST(every_bf16_mantissa_codes_as_the_oracle_at_every_scale_offset)
{
    /* all 128 mantissas x 2 signs at exponents 2^-24 .. 2^3 next to a fixed amax, so q = x/X
     * takes every BF16 value from far below 0.25 to 8 (saturation); both paths, every rule */
    static const float amax[3] = {7.9375f, 6.0f, 4.0f};
    float x[BLK];
    uint8_t packed[BLK / 2], scale[1];
    for (int a = 0; a < 3; a++)
        for (int r = 0; r < N_RULES; r++) {
            int n = 0;
            for (int ex = -24; ex <= 3; ex++)
                for (int m = 0; m < 256; m++) {
                    x[1 + n++] =
                        ldexpf((1.0f + (float)(m & 127) / 128.0f) * (m & 128 ? -1 : 1), ex) *
                        (ex == 3 ? 0.5f : 1.0f); /* 2^3 row: [4, 8) next to amax */
                    if (n < BLK - 1 && !(ex == 3 && m == 255))
                        continue;
                    x[0] = amax[a];
                    for (int i = 1 + n; i < BLK; i++)
                        x[i] = 0;
                    for (int i = 1; i <= n; i++) /* keep |x| <= amax */
                        if (fabsf(x[i]) > amax[a])
                            x[i] = copysignf(amax[a], x[i]);
                    quant_bf16(x, BLK, k_rules[r], packed, scale);
                    for (int i = 0; i < BLK; i++)
                        CHECK(code_at(packed, (size_t)i) == oracle_code(x[i], scale[0] - 127),
                              "rule %s amax %g: %a at X 2^%d -> %u, oracle %u",
                              kl_scale_rule_name(k_rules[r]), amax[a], (double)x[i], scale[0] - 127,
                              code_at(packed, (size_t)i), oracle_code(x[i], scale[0] - 127));
                    n = 0;
                }
        }
}
END_TEST

START_TEST(magnitudes_above_six_x_saturate)
{
    /* ocp: amax 7.5 -> X = 1, 7.5 and -7.9 -> +-6; round: 8 -> X = 1 -> 6; ceil never clips */
    float x[BLK] = {7.5f, -7.875f, 6.5f, 0.5f};
    uint8_t packed[BLK / 2], scale[1];
    quant_bf16(x, BLK, KL_SCALE_OCP, packed, scale);
    ck_assert_int_eq(scale[0], 127);
    ck_assert_uint_eq(code_at(packed, 0), 7);
    ck_assert_uint_eq(code_at(packed, 1), 15);
    ck_assert_uint_eq(code_at(packed, 2), 7);
    ck_assert_uint_eq(code_at(packed, 3), 1);

    quant_bf16(x, BLK, KL_SCALE_CEIL, packed, scale);
    ck_assert_int_eq(scale[0], 128);          /* 7.875 / 6 -> 2^1 */
    ck_assert_uint_eq(code_at(packed, 0), 6); /* 3.75 -> 4 */
    ck_assert_uint_eq(code_at(packed, 1), 14);
    /* largest finite BF16 saturates to 6 * 2^125 under ocp and round */
    float big[BLK] = {kl_bf16_to_f32(0x7f7f), -kl_bf16_to_f32(0x7f7f)};
    for (int r = 0; r < 2; r++) {
        quant_bf16(big, BLK, k_rules[r], packed, scale);
        ck_assert_int_eq(scale[0], 252);
        ck_assert_uint_eq(code_at(packed, 0), 7);
        ck_assert_uint_eq(code_at(packed, 1), 15);
    }
}
END_TEST

START_TEST(nibble_order_puts_element_zero_low)
{
    float x[BLK] = {0};
    for (int i = 0; i < 16; i++) /* codes 1..7 then sign flipped, element order visible */
        x[i] = kl_e2m1_value((unsigned)(i % 7) + 1) * (i < 8 ? 1.0f : -1.0f);
    x[16] = 6.0f;
    uint8_t packed[BLK / 2], scale[1];
    for (int r = 0; r < N_RULES; r++) {
        quant_bf16(x, BLK, k_rules[r], packed, scale);
        ck_assert_int_eq(scale[0], 127);
        ck_assert_msg(packed[0] == 0x21, "rule %s: byte 0 = 0x%02x, want 0x21",
                      kl_scale_rule_name(k_rules[r]), packed[0]);
        ck_assert_uint_eq(packed[1], 0x43);
        ck_assert_uint_eq(packed[3], 0x17); /* element 6: code 7, element 7: code 1 */
        ck_assert_uint_eq(packed[4], 0xba); /* elements 8, 9: -1 (10), -1.5 (11) */
        ck_assert_uint_eq(packed[8], 0x07);
    }
}
END_TEST

START_TEST(small_negative_values_get_code_zero_never_minus_zero)
{
    float x[BLK] = {6.0f, -0.25f, -0.125f, -0x1p-60f, -0.0f, -0.2578125f};
    uint8_t packed[BLK / 2], scale[1];
    for (int r = 0; r < N_RULES; r++) {
        quant_bf16(x, BLK, k_rules[r], packed, scale);
        for (int i = 1; i < 5; i++)
            ck_assert_msg(code_at(packed, (size_t)i) == 0, "rule %s element %d: code %u",
                          kl_scale_rule_name(k_rules[r]), i, code_at(packed, (size_t)i));
        ck_assert_uint_eq(code_at(packed, 5), 9); /* -0.2578 -> -0.5 */
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Scale rules                                                                                */

/* amax -> expected exponent under ocp, round, ceil (BF16-exact amax). */
static const struct {
    float amax;
    int e[3];
} k_scale_cases[] = {
    {6.0f, {0, 0, 0}},
    {4.0f, {0, -1, 0}},
    {8.0f, {1, 0, 1}},
    {1.0f, {-2, -3, -2}},
    {12.0f, {1, 1, 1}},
    {6.0625f, {0, 0, 1}},
    {7.9375f, {0, 0, 1}},
    {3.0f, {-1, -1, -1}},
    {0.5f, {-3, -4, -3}},
    {4.25f, {0, 0, 0}},
    {4.21875f, {0, -1, 0}}, /* 1.0547 * 4: m^2 < 9/8 */
    {0x1p-120f, {-122, -123, -122}},
    {0x1.8p-120f, {-122, -122, -122}},
    {0x1p-124f, {-126, -127, -126}},
    {0x1p-125f, {-127, -127, -127}},
    {0x1p-126f, {-127, -127, -127}},
    {1e-38f, {-127, -127, -127}},    /* subnormal */
    {0x1p-133f, {-127, -127, -127}}, /* smallest BF16 subnormal */
    {0x1p127f, {125, 124, 125}},
    {0x1.8p127f, {125, 125, 125}},
    {0x1.9p127f, {125, 125, 126}},
    {0x1.fep127f, {125, 125, 126}},
};

START_TEST(scale_rules_give_the_exact_exponent)
{
    for (size_t t = 0; t < sizeof k_scale_cases / sizeof k_scale_cases[0]; t++) {
        float a = kl_bf16_to_f32(kl_f32_to_bf16(k_scale_cases[t].amax)); /* 1e-38 -> BF16 */
        float x[2 * BLK] = {0};
        x[5] = -a; /* block 0: amax as a negative value */
        x[BLK] = a;
        x[BLK + 7] = bf(a / 4);
        for (int r = 0; r < 3; r++) {
            uint8_t packed[BLK], scale[2];
            quant_bf16(x, 2 * BLK, k_rules[r], packed, scale);
            int want = 127 + k_scale_cases[t].e[r];
            ck_assert_msg(scale[0] == want && scale[1] == want,
                          "amax %a rule %s: want scale %d got %u, %u", (double)a,
                          kl_scale_rule_name(k_rules[r]), want, scale[0], scale[1]);
            /* the value of the largest element, exactly as the oracle rounds it */
            ck_assert_uint_eq(code_at(packed, 5), oracle_code(-a, want - 127));
            ck_assert_uint_eq(code_at(packed, BLK), oracle_code(a, want - 127));
        }
    }
}
END_TEST

START_TEST(round_rule_threshold_is_exact_for_f32_amax)
{
    /* m >= 1.5 / sqrt 2 = 1.0606601717... -> round = floor - 2, below -> floor - 3 */
    float lo = 1.0f + 0x7c3b6p-23f, hi = 1.0f + 0x7c3b7p-23f;
    ck_assert((double)lo * lo < 1.125 && (double)hi * hi >= 1.125);
    for (int k = -100; k <= 120; k += 11) {
        float x[2 * BLK] = {0};
        x[0] = ldexpf(lo, k);
        x[BLK] = ldexpf(hi, k);
        uint8_t packed[BLK], scale[2];
        quant_f32(x, 2 * BLK, KL_SCALE_ROUND, packed, scale);
        ck_assert_msg(scale[0] == 127 + k - 3 && scale[1] == 127 + k - 2, "k %d: scales %u %u", k,
                      scale[0], scale[1]);
        /* ceil: 1.5 * 2^k stays, the next float goes up */
        x[0] = ldexpf(1.5f, k);
        x[BLK] = ldexpf(nextafterf(1.5f, 2.0f), k);
        quant_f32(x, 2 * BLK, KL_SCALE_CEIL, packed, scale);
        ck_assert_msg(scale[0] == 127 + k - 2 && scale[1] == 127 + k - 1, "ceil k %d: %u %u", k,
                      scale[0], scale[1]);
    }
}
END_TEST

START_TEST(round_rule_matches_the_seed_vectors)
{
    uint8_t packed[BLK], scale[2];
    float out[2 * BLK];
    /* the 16 E2M1 values round trip */
    float x[2 * BLK] = {0};
    for (int i = 0; i < BLK; i++)
        x[i] = kl_e2m1_value((unsigned)i % 16);
    quant_bf16(x, BLK, KL_SCALE_ROUND, packed, scale);
    kl_mxfp4_dequantize_row(packed, scale, BLK, out);
    for (int i = 0; i < BLK; i++)
        ck_assert_msg(out[i] == x[i], "element %d: want %g got %g", i, x[i], out[i]);
    /* [8.0, 0, ...] -> scale 127 and 6.0; [12, -12] in a second block -> scales [127, 128] */
    memset(x, 0, sizeof x);
    x[0] = 8.0f;
    x[BLK] = 12.0f;
    x[BLK + 1] = -12.0f;
    quant_bf16(x, 2 * BLK, KL_SCALE_ROUND, packed, scale);
    ck_assert_uint_eq(scale[0], 127);
    ck_assert_uint_eq(scale[1], 128);
    kl_mxfp4_dequantize_row(packed, scale, 2 * BLK, out);
    ck_assert_msg(out[0] == 6.0f, "8.0 -> want 6 got %g", out[0]);
    ck_assert_msg(out[BLK] == 12.0f && out[BLK + 1] == -12.0f, "12, -12 -> %g, %g", out[BLK],
                  out[BLK + 1]);
    for (int i = 1; i < 2 * BLK; i++)
        ck_assert(i == BLK || i == BLK + 1 || (out[i] == 0.0f && !signbit(out[i])));
}
END_TEST

START_TEST(zero_blocks_get_scale_127_and_code_zero)
{
    float x[3 * BLK] = {0};
    for (int i = 0; i < BLK; i++)
        x[BLK + i] = -0.0f; /* block 1: all -0 */
    x[2 * BLK + 3] = 1.0f;  /* block 2 is not zero */
    for (int r = 0; r < N_RULES; r++) {
        uint8_t packed[3 * BLK / 2], scale[3];
        memset(packed, 0xee, sizeof packed);
        quant_bf16(x, 3 * BLK, k_rules[r], packed, scale);
        ck_assert_uint_eq(scale[0], 127);
        ck_assert_uint_eq(scale[1], 127);
        for (int i = 0; i < BLK; i++)
            ck_assert_msg(packed[i] == 0, "rule %s byte %d: 0x%02x", kl_scale_rule_name(k_rules[r]),
                          i, packed[i]);
        ck_assert_uint_ne(scale[2], 127);
    }
}
END_TEST

START_TEST(tiny_and_huge_blocks_use_extreme_scales)
{
    /* amax 1e-38 (subnormal): scale byte 0 = 2^-127 under every rule, values kept */
    float x[BLK] = {0};
    x[0] = bf(1e-38f);
    x[1] = bf(-x[0] / 4);
    x[2] = kl_bf16_to_f32(0x0001); /* smallest BF16 subnormal, 2^-133 */
    uint8_t packed[BLK / 2], scale[1];
    for (int r = 0; r < N_RULES; r++) {
        quant_bf16(x, BLK, k_rules[r], packed, scale);
        ck_assert_uint_eq(scale[0], 0);
        for (int i = 0; i < 3; i++) {
            double got = deq_at(packed, scale, (size_t)i);
            ck_assert_msg(fabs(got - x[i]) <= ldexp(1.0, -127 - 2) + fabs(x[i]) / 4,
                          "rule %s element %d: %g -> %g", kl_scale_rule_name(k_rules[r]), i,
                          (double)x[i], got);
        }
        ck_assert_uint_eq(code_at(packed, 2), 0); /* 2^-133 / 2^-127 = 1/64 -> 0 */
    }
    /* amax 3e38: ocp/round 2^125 (byte 252), ceil 2^126 (253); never 254 or 255 */
    float y[BLK] = {3e38f, -3e38f, 1e38f, 1.0f};
    for (int r = 0; r < N_RULES; r++) {
        quant_f32(y, BLK, k_rules[r], packed, scale);
        unsigned codes[BLK];
        int want = k_rules[r] == KL_SCALE_CEIL  ? 253
                   : k_rules[r] == KL_SCALE_MSE ? oracle_block(y, KL_SCALE_MSE, codes)
                                                : 252;
        ck_assert_msg(scale[0] == want, "rule %s: scale %u, want %d",
                      kl_scale_rule_name(k_rules[r]), scale[0], want);
        for (int i = 0; i < 3; i++) {
            double got = deq_at(packed, scale, (size_t)i);
            double X = ldexp(1.0, scale[0] - 127);
            double bound = fmax(X / 4, fabs(y[i]) / 4) + fmax(0, fabs(y[i]) - 6 * X);
            ck_assert_msg(fabs(got - y[i]) <= bound, "rule %s element %d: %g -> %g",
                          kl_scale_rule_name(k_rules[r]), i, (double)y[i], got);
        }
        ck_assert_uint_eq(code_at(packed, 3), 0);
    }
}
END_TEST

START_TEST(mse_picks_the_least_squared_error)
{
    /* one outlier 1.0 and 31 values +-0.1875: at X = 2^-2 (ocp, ceil) each small value is a
     * tie 0.75 -> 1, error 0.0625 each, SSE 31/256 = 0.121; X = 2^-3 clips 1.0 to 0.75 (SSE
     * 0.0625) but codes 1.5 exactly; X = 2^-4 clips 1.0 to 0.375 (SSE 0.39).  mse: 2^-3. */
    float x[BLK];
    for (int i = 0; i < BLK; i++)
        x[i] = i & 2 ? -0.1875f : 0.1875f;
    x[0] = 1.0f;
    uint8_t packed[BLK / 2], scale[1], ps[BLK / 2], ss[1];
    quant_bf16(x, BLK, KL_SCALE_MSE, packed, scale);
    unsigned codes[BLK];
    int want = oracle_block(x, KL_SCALE_MSE, codes);
    ck_assert_int_eq(scale[0], want);
    /* mse's error is <= that of each other rule */
    double err_mse = 0;
    for (int i = 0; i < BLK; i++)
        err_mse += pow(deq_at(packed, scale, (size_t)i) - x[i], 2);
    for (int r = 0; r < 3; r++) {
        quant_bf16(x, BLK, k_rules[r], ps, ss);
        double e = 0;
        for (int i = 0; i < BLK; i++)
            e += pow(deq_at(ps, ss, (size_t)i) - x[i], 2);
        ck_assert_msg(err_mse <= e, "mse %g > %s %g", err_mse, kl_scale_rule_name(k_rules[r]), e);
    }
    ck_assert_uint_eq(scale[0], 124);
    ck_assert_uint_eq(code_at(packed, 0), 7);
    ck_assert_uint_eq(code_at(packed, 2), 11);
    /* a three-way tie: [4.25, 0.75 x 24, 0 x 7] has SSE 25/16 at X = 1/2 (4.25 -> 3, the rest
     * exact), X = 1 (4.25 -> 4, 0.75 -> 1) and X = 2 (4.25 -> 4, 0.75 -> 1); ties keep the
     * smaller exponent */
    float y[BLK] = {4.25f};
    for (int i = 1; i <= 24; i++)
        y[i] = 0.75f;
    quant_bf16(y, BLK, KL_SCALE_MSE, packed, scale);
    ck_assert_uint_eq(scale[0], 126);
    ck_assert_uint_eq(oracle_block(y, KL_SCALE_MSE, codes), 126);
    ck_assert_uint_eq(code_at(packed, 0), 7); /* 8.5 saturates: 6 * 1/2 */
    ck_assert_uint_eq(code_at(packed, 1), 3);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                     */

START_TEST(nonfinite_input_names_the_block)
{
    static const uint16_t bad16[] = {0x7fc0, 0xffc0, 0x7f80, 0xff80, 0x7f81};
    static const size_t where[] = {0, 31, 32, 70, 127};
    for (size_t b = 0; b < sizeof bad16 / sizeof bad16[0]; b++)
        for (size_t w = 0; w < sizeof where / sizeof where[0]; w++)
            for (int path = 0; path < 3; path++) {
                uint16_t h[4 * BLK];
                float f[4 * BLK];
                for (int i = 0; i < 4 * BLK; i++) {
                    h[i] = kl_f32_to_bf16((float)(i % 7) - 3.0f);
                    f[i] = kl_bf16_to_f32(h[i]);
                }
                h[where[w]] = bad16[b];
                f[where[w]] = kl_bf16_to_f32(bad16[b]);
                if (where[w] == 70)
                    h[100] = 0x7fc0, f[100] = NAN; /* a later one does not matter */
                uint8_t packed[2 * BLK], scale[4];
                size_t bad = 999;
                kl_err err;
                kl_err_clear(&err);
                int rc = path == 0   ? kl_mxfp4_quantize_row_bf16(h, 4 * BLK, KL_SCALE_MSE, packed,
                                                                  scale, &bad, &err)
                         : path == 1 ? kl_mxfp4_quantize_row_bf16_scalar(h, 4 * BLK, KL_SCALE_OCP,
                                                                         packed, scale, &bad, &err)
                                     : kl_mxfp4_quantize_row_f32(f, 4 * BLK, KL_SCALE_ROUND, packed,
                                                                 scale, &bad, &err);
                ck_assert_int_eq(rc, KL_E_FORMAT);
                ck_assert_msg(bad == where[w] / BLK, "path %d value 0x%04x at %zu: block %zu", path,
                              bad16[b], where[w], bad);
                ck_assert_str_eq(err.rule, "MXFP4-NONFINITE");
                char want[64];
                snprintf(want, sizeof want, "element %zu of the row (block %zu)", where[w],
                         where[w] / BLK);
                ck_assert_msg(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg,
                              want);
                ck_assert(strstr(err.msg, (bad16[b] & 0x7f) ? "NaN" : "Inf") != NULL);
            }
}
END_TEST

START_TEST(bad_arguments_are_usage_errors)
{
    uint16_t h[64] = {0};
    uint8_t packed[32], scale[2];
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_mxfp4_quantize_row_bf16(h, 33, KL_SCALE_OCP, packed, scale, NULL, &err),
                     KL_E_USAGE);
    kl_err_clear(&err);
    ck_assert_int_eq(
        kl_mxfp4_quantize_row_bf16(h, 64, KL_SCALE_RULE_COUNT, packed, scale, NULL, &err),
        KL_E_USAGE);
    ck_assert_int_eq(kl_mxfp4_quantize_row_f32(NULL, 32, KL_SCALE_OCP, packed, scale, NULL, NULL),
                     KL_E_USAGE);
    ck_assert_int_eq(kl_mxfp4_quantize_row_bf16_scalar(h, 0, KL_SCALE_OCP, NULL, NULL, NULL, NULL),
                     0);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Dequantizer                                                                                */

START_TEST(dequantize_applies_e8m0_scales)
{
    uint8_t packed[BLK * 2] = {0}, scale[4] = {127, 0, 254, 255};
    packed[0] = 0xf1;       /* block 0: 0.5, -6 */
    packed[BLK / 2] = 0x17; /* block 1: 6 * 2^-127, 0.5 * 2^-127 */
    packed[BLK] = 0x82;     /* block 2: 2^127, -0 */
    float out[4 * BLK];
    kl_mxfp4_dequantize_row(packed, scale, 4 * BLK, out);
    ck_assert(out[0] == 0.5f && out[1] == -6.0f);
    ck_assert(out[BLK] == 0x1.8p-125f && out[BLK + 1] == 0x1p-128f);
    ck_assert(out[2 * BLK] == 0x1p127f && out[2 * BLK + 1] == 0.0f);
    for (int i = 0; i < BLK; i++)
        ck_assert(isnan(out[3 * BLK + i]));
    /* a row that ends inside a block (n = 40) stops at n, nibbles in element order */
    uint8_t pk[20], sc[2] = {127, 128};
    for (int i = 0; i < 20; i++)
        pk[i] = (uint8_t)(i * 0x13 + 5);
    float part[41];
    part[40] = 123.0f;
    kl_mxfp4_dequantize_row(pk, sc, 40, part);
    for (int i = 0; i < 40; i++)
        ck_assert_msg(part[i] == (float)deq_at(pk, sc, (size_t)i), "element %d: %g", i, part[i]);
    ck_assert(part[40] == 123.0f);
}
END_TEST

START_TEST(dequantized_error_is_bounded)
{
    enum { N = 32 * 2048, NB = N / 32 };
    uint16_t *h = malloc(N * sizeof *h);
    float *x = malloc(N * sizeof *x), *out = malloc(N * sizeof *out);
    uint8_t *packed = malloc(N / 2), *scale = malloc(NB);
    long double(*sse)[NB] = malloc(sizeof(long double[N_RULES][NB]));
    ck_assert(h && x && packed && scale && out && sse);
    kl_rng r;
    kl_rng_seed(&r, 3, 0);
    for (size_t b = 0; b < NB; b++)
        gen_block_bf16(&r, h + b * BLK);
    for (size_t i = 0; i < N; i++)
        x[i] = kl_bf16_to_f32(h[i]);
    for (int ri = 0; ri < N_RULES; ri++) {
        kl_scale_rule rule = k_rules[ri];
        quant_bf16(x, N, rule, packed, scale);
        kl_mxfp4_dequantize_row(packed, scale, N, out);
        for (size_t b = 0; b < NB; b++)
            sse[ri][b] = 0;
        for (size_t i = 0; i < N; i++) {
            double X = ldexp(1.0, scale[i / BLK] - 127), ax = fabs(x[i]);
            double v = deq_at(packed, scale, i); /* in double: 4 * 2^126 does not fit a float */
            CHECK((float)v == out[i] || (isinf(out[i]) && fabs(v) >= 0x1p128),
                  "rule %s element %zu: dequantize_row %a, want %a", kl_scale_rule_name(rule), i,
                  (double)out[i], v);
            /* RNE on the E2M1 grid: half a step, <= max(X/4, |x|/4); plus clipping above 6X */
            double bound = fmax(X / 4, ax / 4) + fmax(0.0, ax - 6 * X);
            double err = fabs(v - x[i]);
            CHECK(err <= bound, "rule %s element %zu: %a -> %a (X %a)", kl_scale_rule_name(rule), i,
                  (double)x[i], v, X);
            CHECK(scale[i / BLK] != 255 && code_at(packed, i) != 8,
                  "rule %s element %zu: NaN scale or -0 code", kl_scale_rule_name(rule), i);
            if (rule == KL_SCALE_CEIL)
                CHECK(ax <= 6 * X, "rule ceil element %zu clips", i);
            sse[ri][i / BLK] += (long double)err * err;
        }
    }
    /* per block, mse's error is <= each other rule's */
    for (size_t b = 0; b < NB; b++)
        for (int ri = 0; ri < 3; ri++)
            CHECK(sse[3][b] <= sse[ri][b] * (1 + 1e-12L), "block %zu: mse %Lg > %s %Lg", b,
                  sse[3][b], kl_scale_rule_name(k_rules[ri]), sse[ri][b]);
    free(h);
    free(x);
    free(out);
    free(packed);
    free(scale);
    free(sse);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Reference against the oracle, AVX2 against the reference                                   */

START_TEST(scalar_reference_matches_the_oracle)
{
    enum { NB = 32768 };
    kl_rng r;
    kl_rng_seed(&r, 11, 0);
    uint16_t h[BLK];
    float x[BLK];
    unsigned codes[BLK];
    uint8_t packed[BLK / 2], scale[1];
    for (int b = 0; b < NB; b++) {
        gen_block_bf16(&r, h);
        for (int i = 0; i < BLK; i++)
            x[i] = kl_bf16_to_f32(h[i]);
        for (int ri = 0; ri < N_RULES; ri++) {
            int rc =
                kl_mxfp4_quantize_row_bf16_scalar(h, BLK, k_rules[ri], packed, scale, NULL, NULL);
            CHECK(rc == 0, "rc %d", rc);
            int want = oracle_block(x, k_rules[ri], codes);
            CHECK(scale[0] == want, "block %d rule %s: scale want %d got %u", b,
                  kl_scale_rule_name(k_rules[ri]), want, scale[0]);
            for (int i = 0; i < BLK; i++)
                CHECK(code_at(packed, (size_t)i) == codes[i],
                      "block %d rule %s element %d (%a): want %u got %u", b,
                      kl_scale_rule_name(k_rules[ri]), i, (double)x[i], codes[i],
                      code_at(packed, (size_t)i));
        }
    }
}
END_TEST

START_TEST(f32_path_matches_the_oracle)
{
    /* full 24-bit mantissas; mse sums are rounded here, so only ocp/round/ceil are exact
     * claims; mse must still pick a scale with error <= the three rules' */
    enum { NB = 16384 };
    kl_rng r;
    kl_rng_seed(&r, 12, 0);
    float x[BLK];
    unsigned codes[BLK];
    uint8_t packed[BLK / 2], scale[1];
    for (int b = 0; b < NB; b++) {
        int s = (int)(kl_rng_next(&r) % 250) - 125;
        for (int i = 0; i < BLK; i++)
            x[i] = ldexpf(rand_normal(&r), s) * (kl_rng_next(&r) % 5 == 0 ? 1e-3f : 1.0f);
        double best_rule = INFINITY, err_mse = 0;
        for (int ri = 0; ri < N_RULES; ri++) {
            quant_f32(x, BLK, k_rules[ri], packed, scale);
            double e = 0;
            for (int i = 0; i < BLK; i++)
                e += pow(ldexp(deq_at(packed, scale, (size_t)i) - x[i], -s), 2);
            if (k_rules[ri] == KL_SCALE_MSE) {
                err_mse = e;
                continue;
            }
            best_rule = fmin(best_rule, e);
            int want = oracle_block(x, k_rules[ri], codes);
            CHECK(scale[0] == want, "block %d rule %s: scale want %d got %u", b,
                  kl_scale_rule_name(k_rules[ri]), want, scale[0]);
            for (int i = 0; i < BLK; i++)
                CHECK(code_at(packed, (size_t)i) == codes[i],
                      "block %d rule %s element %d (%a): want %u got %u", b,
                      kl_scale_rule_name(k_rules[ri]), i, (double)x[i], codes[i],
                      code_at(packed, (size_t)i));
        }
        CHECK(err_mse <= best_rule * (1 + 1e-9), "block %d: mse %g > %g", b, err_mse, best_rule);
    }
}
END_TEST

START_TEST(avx2_matches_scalar_on_ten_million_values)
{
    if (!kl_cpu_has_avx2_fma()) {
        fprintf(stderr, "avx2_matches_scalar_on_ten_million_values: SKIPPED (CPU lacks AVX2)\n");
        return;
    }
    enum { ROW = 32 * 320, ROWS = 1000 }; /* 10,240,000 values */
    uint16_t *h = malloc(ROW * sizeof *h);
    float *f = malloc(ROW * sizeof *f);
    uint8_t *pa = malloc(ROW / 2), *ps = malloc(ROW / 2), *sa = malloc(ROW / BLK),
            *ss = malloc(ROW / BLK);
    ck_assert(h && f && pa && ps && sa && ss);
    kl_rng r;
    kl_rng_seed(&r, 7, 0);
    for (int row = 0; row < ROWS; row++) {
        for (size_t b = 0; b < ROW / BLK; b++)
            gen_block_bf16(&r, h + b * BLK);
        for (int ri = 0; ri < N_RULES; ri++) {
            kl_scale_rule rule = k_rules[ri];
            int rc = kl_mxfp4_quantize_row_bf16(h, ROW, rule, pa, sa, NULL, NULL);
            CHECK(rc == 0, "rc %d", rc);
            rc = kl_mxfp4_quantize_row_bf16_scalar(h, ROW, rule, ps, ss, NULL, NULL);
            CHECK(rc == 0, "rc %d", rc);
            if (memcmp(pa, ps, ROW / 2) != 0 || memcmp(sa, ss, ROW / BLK) != 0) {
                for (size_t i = 0; i < ROW; i++)
                    CHECK(code_at(pa, i) == code_at(ps, i) && sa[i / BLK] == ss[i / BLK],
                          "row %d rule %s element %zu (bf16 0x%04x): avx2 %u/%u scalar "
                          "%u/%u",
                          row, kl_scale_rule_name(rule), i, h[i], code_at(pa, i), sa[i / BLK],
                          code_at(ps, i), ss[i / BLK]);
            }
            /* every 8th row: the F32 AVX2 path on the same values gives the same bytes; then
             * on full 24-bit mantissas (random low bits), F32 AVX2 == F32 scalar */
            if (row % 8 == 0) {
                for (size_t i = 0; i < ROW; i++)
                    f[i] = kl_bf16_to_f32(h[i]);
                ck_assert_int_eq(kl_mxfp4_quantize_row_f32(f, ROW, rule, pa, sa, NULL, NULL), 0);
                CHECK(memcmp(pa, ps, ROW / 2) == 0 && memcmp(sa, ss, ROW / BLK) == 0,
                      "row %d rule %s: f32 path differs", row, kl_scale_rule_name(rule));
                for (size_t i = 0; i < ROW; i++) {
                    uint32_t u = (uint32_t)h[i] << 16 | (uint32_t)(kl_rng_next(&r) & 0xffff);
                    memcpy(&f[i], &u, sizeof u);
                }
                ck_assert_int_eq(kl_mxfp4_quantize_row_f32(f, ROW, rule, pa, sa, NULL, NULL), 0);
                ck_assert_int_eq(kl_mxfp4_quantize_row_f32_scalar(f, ROW, rule, ps, ss, NULL, NULL),
                                 0);
                for (size_t i = 0; i < ROW; i++)
                    CHECK(code_at(pa, i) == code_at(ps, i) && sa[i / BLK] == ss[i / BLK],
                          "row %d rule %s element %zu (f32 %a): avx2 %u/%u scalar %u/%u", row,
                          kl_scale_rule_name(rule), i, (double)f[i], code_at(pa, i), sa[i / BLK],
                          code_at(ps, i), ss[i / BLK]);
            }
        }
    }
    free(h);
    free(f);
    free(pa);
    free(ps);
    free(sa);
    free(ss);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* The format header (common/mxfp4_format.h) on its own                                       */

START_TEST(header_e2m1_codes_round_trip_and_match_the_doubled_table)
{
    static const signed char x2[16] = {KL_E2M1_X2_CODES};
    for (unsigned c = 0; c < 16; c++) {
        float v = kl_e2m1_value(c);
        ck_assert_msg(0.5f * (float)x2[c] == v, "code %u: doubled table %d, value %g", c, x2[c],
                      (double)v);
        /* every code but -0 encodes back to itself; -0 encodes as 0 */
        ck_assert_msg(kl_e2m1_encode(v) == (c == KL_E2M1_SIGN ? 0 : c), "code %u -> %u", c,
                      kl_e2m1_encode(v));
        ck_assert_uint_eq(kl_e2m1_magnitude_code(fabsf(v)), c & 7);
    }
}
END_TEST

START_TEST(header_encode_gives_the_quantizers_codes)
{
    /* element 0 = 6 sets X = 1 under ocp; element 1 takes each value in turn */
    static const struct {
        float x;
        unsigned code;
    } cases[] = {
        {0.0f, 0},      {-0.0f, 0},      {0.25f, 0},     {0.2578125f, 1}, {-0.25f, 0},
        {-0.125f, 0},   {0.5f, 1},       {0.75f, 2},     {-0.75f, 10},    {1.25f, 2},
        {1.2578125f, 3}, {1.75f, 4},     {2.5f, 4},      {2.515625f, 5},  {3.5f, 6},
        {-3.5f, 14},    {5.0f, 6},       {5.03125f, 7},  {6.0f, 7},       {-6.0f, 15},
        {7.9375f / 2, 6}, {-1.0f, 10},   {3.0f, 5},      {-0x1p-60f, 0},  {4.0f, 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float x[BLK] = {6.0f, cases[i].x};
        uint8_t packed[BLK / 2], scale[1];
        quant_bf16(x, BLK, KL_SCALE_OCP, packed, scale);
        ck_assert_uint_eq(scale[0], KL_E8M0_BIAS);
        ck_assert_msg(code_at(packed, 1) == cases[i].code, "%g: quantizer %u, want %u",
                      (double)cases[i].x, code_at(packed, 1), cases[i].code);
        ck_assert_msg(kl_e2m1_encode(cases[i].x) == cases[i].code, "%g: header %u, want %u",
                      (double)cases[i].x, kl_e2m1_encode(cases[i].x), cases[i].code);
    }
}
END_TEST

START_TEST(header_e8m0_edge_values)
{
    ck_assert(kl_e8m0_value(0) == 0x1p-127f);
    ck_assert(kl_e8m0_value(1) == 0x1p-126f);
    ck_assert(kl_e8m0_value(127) == 1.0f);
    ck_assert(kl_e8m0_value(254) == 0x1p127f);
    ck_assert(isnan(kl_e8m0_value(255)));
    ck_assert(isnan(kl_mxfp4_f32_from_bits(kl_e8m0_half_bits(255))));
    for (unsigned s = 0; s < 255; s++) {
        ck_assert_msg(kl_mxfp4_f32_from_bits(kl_e8m0_half_bits((uint8_t)s)) ==
                          kl_e8m0_value((uint8_t)s) / 2,
                      "half of scale %u", s);
        ck_assert_uint_eq(kl_e8m0_encode((int)s - KL_E8M0_BIAS), s);
    }
    /* exponents outside the byte clamp; the NaN byte is never produced */
    ck_assert_uint_eq(kl_e8m0_encode(-128), 0);
    ck_assert_uint_eq(kl_e8m0_encode(-1000), 0);
    ck_assert_uint_eq(kl_e8m0_encode(128), 254);
    ck_assert_uint_eq(kl_e8m0_encode(1000), 254);
}
END_TEST

START_TEST(header_e8m0_encode_gives_the_quantizers_scales)
{
    /* block amax 6 * 2^e: the ocp exponent is e, clamped to the byte's range */
    static const int exps[] = {-140, -127, -126, -3, -1, 0, 1, 3, 100, 125};
    for (size_t i = 0; i < sizeof exps / sizeof exps[0]; i++) {
        float x[BLK] = {ldexpf(6.0f, exps[i])};
        uint8_t packed[BLK / 2], scale[1];
        quant_f32(x, BLK, KL_SCALE_OCP, packed, scale);
        ck_assert_msg(scale[0] == kl_e8m0_encode(exps[i]), "2^%d: quantizer %u, header %u",
                      exps[i], scale[0], kl_e8m0_encode(exps[i]));
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

/* kernels/mx_bf16.h: every scale, every code in every nibble of a word, and random words: the
 * integer decode (table scales) and the float one both give the top half of e2m1 · e8m0. */
static void mx_decode_check(uint32_t q, uint8_t s)
{
    uint32_t out[16], words[4] = {q, ~q, q * 2654435761u, q ^ 0x88888888u};
    kl_mx_decode32(words, s, out);
    for (unsigned i = 0; i < 32; i++) {
        const unsigned code = (words[i / 8] >> 4 * (i % 8)) & 15u;
        const float v = kl_e2m1_value(code) * kl_e8m0_value(s);
        uint32_t want;
        memcpy(&want, &v, 4);
        const uint32_t got = out[i / 2] >> 16 * (i % 2) & 0xffffu;
        ck_assert_msg(got == want >> 16, "scale %u code %u: 0x%04x, want 0x%04x", s, code, got,
                      want >> 16);
    }
}

START_TEST(mx_bf16_decode_matches_the_float_product)
{
    kl_rng r;
    kl_rng_seed(&r, 11, 0);
    for (unsigned s = 0; s < 256; s++) {
        for (uint32_t c = 0; c < 16; c++)
            mx_decode_check(c * 0x11111111u, (uint8_t)s);
        mx_decode_check(0x76543210u, (uint8_t)s);
        mx_decode_check(0xfedcba98u, (uint8_t)s);
        for (unsigned k = 0; k < 64; k++)
            mx_decode_check((uint32_t)kl_rng_next(&r), (uint8_t)s);
    }
    ck_assert(kl_mx_tab_ok(2) && kl_mx_tab_ok(252) && !kl_mx_tab_ok(1) && !kl_mx_tab_ok(253));
}
END_TEST

/* An fp16 bit pattern's value (normal, subnormal or zero; the pairs never hold more). */
static double f16_value(uint32_t h)
{
    const unsigned e = h >> 10 & 31u, m = h & 1023u;
    const double v = e ? ldexp(1024 + m, (int)e - 25) : ldexp(m, -24);
    return h & 0x8000u ? -v : v;
}

/* kernels/mx_bf16.h kl_mx_f16_pairs: every code in every nibble, and random words: pair i
 * holds codes i and i + 4, each its E2M1 value times 2^-14 exactly. */
START_TEST(mx_f16_pairs_hold_the_codes_times_two_to_minus_14)
{
    kl_rng r;
    kl_rng_seed(&r, 12, 0);
    for (unsigned n = 0; n < 4096; n++) {
        const uint32_t q = n < 16 ? n * 0x11111111u : n < 32 ? 0x76543210u << (n % 16)
                                                             : (uint32_t)kl_rng_next(&r);
        uint32_t out[4];
        kl_mx_f16_pairs(q, out);
        for (unsigned i = 0; i < 8; i++) {
            const unsigned code = q >> 4 * i & 15u;
            const uint32_t h = out[i % 4] >> 16 * (i / 4) & 0xffffu;
            const double want = ldexp(kl_e2m1_value(code), -14);
            ck_assert_msg(f16_value(h) == want && (h >> 15) == (code >> 3),
                          "word 0x%08x code %u: fp16 0x%04x", q, i, h);
        }
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("mxfp4");
    TCase *tc = tcase_create("codes");
    tcase_add_test(tc, scale_rule_names_round_trip);
    tcase_add_test(tc, e2m1_value_table_matches_the_spec);
    tcase_add_test(tc, every_e2m1_value_round_trips_under_every_rule);
    tcase_add_test(tc, ties_round_to_the_even_mantissa);
    tcase_add_test(tc, values_next_to_ties_round_to_the_nearest);
    tcase_add_test(tc, every_bf16_mantissa_codes_as_the_oracle_at_every_scale_offset);
    tcase_add_test(tc, magnitudes_above_six_x_saturate);
    tcase_add_test(tc, nibble_order_puts_element_zero_low);
    tcase_add_test(tc, small_negative_values_get_code_zero_never_minus_zero);
    suite_add_tcase(s, tc);

    tc = tcase_create("scales");
    tcase_add_test(tc, scale_rules_give_the_exact_exponent);
    tcase_add_test(tc, round_rule_threshold_is_exact_for_f32_amax);
    tcase_add_test(tc, round_rule_matches_the_seed_vectors);
    tcase_add_test(tc, zero_blocks_get_scale_127_and_code_zero);
    tcase_add_test(tc, tiny_and_huge_blocks_use_extreme_scales);
    tcase_add_test(tc, mse_picks_the_least_squared_error);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_test(tc, nonfinite_input_names_the_block);
    tcase_add_test(tc, bad_arguments_are_usage_errors);
    suite_add_tcase(s, tc);

    tc = tcase_create("dequantize");
    tcase_add_test(tc, dequantize_applies_e8m0_scales);
    tcase_add_test(tc, dequantized_error_is_bounded);
    suite_add_tcase(s, tc);

    tc = tcase_create("format");
    tcase_add_test(tc, header_e2m1_codes_round_trip_and_match_the_doubled_table);
    tcase_add_test(tc, header_encode_gives_the_quantizers_codes);
    tcase_add_test(tc, header_e8m0_edge_values);
    tcase_add_test(tc, header_e8m0_encode_gives_the_quantizers_scales);
    tcase_add_test(tc, mx_bf16_decode_matches_the_float_product);
    tcase_add_test(tc, mx_f16_pairs_hold_the_codes_times_two_to_minus_14);
    suite_add_tcase(s, tc);

    tc = tcase_create("paths");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, scalar_reference_matches_the_oracle);
    tcase_add_test(tc, f32_path_matches_the_oracle);
    tcase_add_test(tc, avx2_matches_scalar_on_ten_million_values);
    suite_add_tcase(s, tc);
    return t_run_suite(s);
}
