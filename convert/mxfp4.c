/*
 * convert/mxfp4.c — OCP MXFP4 quantizer (scalar reference + AVX2); the format's encode and
 * decode are common/mxfp4_format.h.
 *
 * Divisions, in order: includes and constants; exact scale exponents (shared by both paths);
 * scalar reference; AVX2 path; public API in header order.  Keep new code in its division.
 *
 * Exactness.  Every decision is made on exact quantities, so the scalar and AVX2 paths agree bit
 * for bit and the result does not depend on libm:
 *   - scale exponents come from the bit pattern of amax (integer max of |x| bits), never log2f;
 *   - the block scale X = 2^e is a power of two, so q = |x| * 2^-e is one exact float multiply
 *     (2^-e is a normal float because e <= 126; a q below 2^-126 can lose bits to underflow,
 *     but such a q is far below the first rounding threshold 0.25 and codes 0 either way);
 *   - the scalar element code counts the E2M1 midpoints q lies above (float compares:
 *     kl_e2m1_magnitude_code); the AVX2 code gets the same count from two float roundings
 *     (mag_code8), which relies on the default round-to-nearest-even MXCSR mode, as all of kl
 *     does.
 *
 * Rules, with amax = m * 2^k, m in [1, 2) (k = ilogb(amax)):
 *   ocp    e = floor(log2 amax) - 2                 = k - 2
 *   ceil   e = ceil(log2(amax / 6))                 = k - 2 + (m > 1.5)
 *   round  e = round(log2(amax / 6))                = k - 2 - (m < 1.5 / sqrt 2)
 *          log2(amax / 6) = k - 2 + log2(m / 1.5) and log2(m / 1.5) lies in [-0.585, 0.415), so
 *          round() is -1 exactly when m / 1.5 < 2^-0.5, i.e. m^2 < 9/8.  A half-way case would
 *          need amax = 6 * 2^(n + 1/2), which is irrational: no tie can occur, so no tie rule is
 *          needed (the implementation is exact; see ROUND_FRAC_MIN).
 *   mse    candidates = {ocp, round, ceil} and +-1 around each, clamped to [-127, 127]; that set
 *          is the contiguous range [round - 1, ceil + 1].  ceil + 1 is never evaluated: with no
 *          element above 6 * 2^ceil, the finer grid of ceil contains every coarse grid point below
 *          6 * 2^ceil, so each element's error at ceil is <= its error at ceil + 1; it can at most
 *          tie, and ties go to the smaller exponent (the finer grid).  So 2 or 3 candidates.
 *          Squared error is compared exactly for BF16 input: elements that code 0 at the smallest
 *          candidate code 0 at all of them (same error x^2), so they are left out; the remaining
 *          errors are multiples of 2^(e_min - 9) below 2^(e_min + 6), their squares and sums are
 *          integers below 2^35 in that unit, exact in double whatever the order.  For F32 input the
 *          sum is rounded, in a fixed order (8 lanes, then a fixed tree) that both paths follow.
 *          The scalar path scans the candidates in increasing order; the AVX2 path visits them
 *          most-likely-first and prunes with an exact lower bound, reaching the same argmin.
 * Exponents below -127 (amax < 2^-125, BF16 subnormals included) clamp to -127; none exceeds 126
 * for finite input, so byte 255 (NaN) cannot be produced.
 *
 * On a NaN/Inf, blocks before the bad one have been written and the rest of packed/scale is
 * untouched; callers treat the outputs as garbage on any error.
 */
#include "convert/mxfp4.h"

#include "common/cpu.h"
#include "common/numfmt.h"

#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define KL_MXFP4_X86 1
#include <immintrin.h>
#else
#define KL_MXFP4_X86 0
#endif

/* ------------------------------------------------------------------------------------------------
 * Constants
 * ----------------------------------------------------------------------------------------------*/

#define F32_ABS   0x7fffffffu
#define F32_INF   0x7f800000u

/* Smallest 23-bit fraction f with (1 + f/2^23)^2 >= 9/8, i.e. m >= 1.5/sqrt(2) = 1.06066017...:
 * below it, round(log2(amax/6)) is one less than floor(log2 amax) - 2. */
#define ROUND_FRAC_MIN 0x7c3b7u
/* m > 1.5 <=> fraction > 0x400000 (ceil rounds up). */
#define CEIL_FRAC_HALF 0x400000u

static const char *const k_rule_names[KL_SCALE_RULE_COUNT] = {"ocp", "round", "ceil", "mse"};

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* 2^-e as a float, for e in [-127, 126] (biased exponent 127 - e lies in [1, 254]). */
static inline float pow2_neg(int e)
{
    return kl_mxfp4_f32_from_bits((uint32_t)(KL_E8M0_BIAS - e) << 23);
}

/* ------------------------------------------------------------------------------------------------
 * Scale exponents (exact, from the bit pattern of amax; shared by both paths)
 * ----------------------------------------------------------------------------------------------*/

/* Range of exponents to evaluate for a block whose largest magnitude has f32 bits a (finite,
 * nonzero): [*lo, *hi], both clamped.  Single-exponent rules give lo == hi. */
static inline void rule_exponents(uint32_t a, kl_scale_rule rule, int *lo, int *hi)
{
    int biased = (int)(a >> 23);
    uint32_t frac = a & 0x7fffffu;
    if (biased == 0) {
        /* subnormal amax < 2^-126: every rule and candidate is below -127 */
        *lo = *hi = KL_E8M0_EXP_MIN;
        return;
    }
    int k = biased - 127; /* floor(log2 amax) */
    int e_ocp = k - 2;
    int e_round = k - 2 - (frac < ROUND_FRAC_MIN);
    int e_ceil = k - 2 + (frac > CEIL_FRAC_HALF);
    switch (rule) {
    case KL_SCALE_OCP: *lo = *hi = kl_e8m0_clamp_exp(e_ocp); break;
    case KL_SCALE_ROUND: *lo = *hi = kl_e8m0_clamp_exp(e_round); break;
    case KL_SCALE_CEIL: *lo = *hi = kl_e8m0_clamp_exp(e_ceil); break;
    default: /* KL_SCALE_MSE: [round - 1, ceil]; ceil + 1 can never win, see the file comment */
        *lo = kl_e8m0_clamp_exp(e_round - 1);
        *hi = kl_e8m0_clamp_exp(e_ceil);
        break;
    }
}

/* ------------------------------------------------------------------------------------------------
 * Scalar reference
 * ----------------------------------------------------------------------------------------------*/

/* Sum of squared errors (in units of X^2) of the block at scale 2^-e = s, masked elements
 * only, in the fixed order the AVX2 path uses: lane i % 8, then ((0+4)+(2+6)) + ((1+5)+(3+7)).
 * Writes the magnitude codes into mag. */
static double block_sse_scalar(const float *ax, const unsigned char *keep, float s, unsigned *mag)
{
    double acc[8] = {0};
    for (int i = 0; i < KL_MXFP4_BLOCK; i++) {
        float q = ax[i] * s;
        mag[i] = kl_e2m1_magnitude_code(q);
        float d = keep[i] ? q - kl_e2m1_value(mag[i]) : 0.0f;
        acc[i & 7] += (double)d * (double)d;
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* Quantizes one block of 32 finite floats (bits in xb) into packed[16], *scale. */
static void block_scalar(const uint32_t *xb, kl_scale_rule rule, uint8_t *packed, uint8_t *scale)
{
    uint32_t amax = 0;
    float ax[KL_MXFP4_BLOCK];
    for (int i = 0; i < KL_MXFP4_BLOCK; i++) {
        uint32_t a = xb[i] & F32_ABS;
        ax[i] = kl_mxfp4_f32_from_bits(a);
        amax = a > amax ? a : amax;
    }
    if (amax == 0) { /* all-zero block (+-0 only) */
        *scale = KL_E8M0_BIAS;
        memset(packed, 0, KL_MXFP4_BLOCK / 2);
        return;
    }
    int lo, hi;
    rule_exponents(amax, rule, &lo, &hi);

    unsigned mag[KL_MXFP4_BLOCK], best_mag[KL_MXFP4_BLOCK];
    int best_e = lo;
    if (lo == hi) {
        float s = pow2_neg(lo);
        for (int i = 0; i < KL_MXFP4_BLOCK; i++)
            best_mag[i] = kl_e2m1_magnitude_code(ax[i] * s);
    } else {
        /* mse: elements coding 0 at the smallest candidate have the same error everywhere */
        unsigned char keep[KL_MXFP4_BLOCK];
        float s = pow2_neg(lo);
        for (int i = 0; i < KL_MXFP4_BLOCK; i++)
            keep[i] = kl_e2m1_magnitude_code(ax[i] * s) != 0;
        double best = 0.0;
        for (int e = lo; e <= hi; e++) {
            /* absolute error = sse * 4^e; compare at 4^(e - lo) (exact, <= 2^6) */
            double sse =
                block_sse_scalar(ax, keep, pow2_neg(e), mag) * (double)(1u << (2 * (e - lo)));
            if (e == lo || sse < best) { /* strict: ties keep the smaller exponent */
                best = sse;
                best_e = e;
                memcpy(best_mag, mag, sizeof mag);
            }
        }
    }
    for (int i = 0; i < KL_MXFP4_BLOCK; i += 2) {
        unsigned c0 = best_mag[i], c1 = best_mag[i + 1];
        c0 |= c0 ? (xb[i] >> 31) * KL_E2M1_SIGN : 0; /* sign only on a nonzero code: never -0 */
        c1 |= c1 ? (xb[i + 1] >> 31) * KL_E2M1_SIGN : 0;
        packed[i / 2] = (uint8_t)(c0 | c1 << 4);
    }
    *scale = kl_e8m0_encode(best_e);
}

/* Index of the first NaN/Inf among 32 f32 bit patterns (one is known to be there). */
static int first_nonfinite(const uint32_t *xb)
{
    for (int i = 0; i < KL_MXFP4_BLOCK; i++)
        if ((xb[i] & F32_ABS) >= F32_INF)
            return i;
    return 0;
}

static int fail_nonfinite(const uint32_t *xb, size_t block, size_t *bad_block, kl_err *err)
{
    int i = first_nonfinite(xb);
    if (bad_block)
        *bad_block = block;
    return kl_fail_rule(err, KL_E_FORMAT, "MXFP4-NONFINITE",
                        "%s at element %zu of the row (block %zu); MXFP4 cannot encode it",
                        (xb[i] & F32_ABS) > F32_INF ? "NaN" : "Inf",
                        block * KL_MXFP4_BLOCK + (size_t)i, block);
}

/* Loads block b of a BF16 or F32 row as f32 bit patterns; returns the largest |x| bits. */
static inline uint32_t load_block(const uint16_t *in16, const float *in32, size_t b, uint32_t *xb)
{
    uint32_t amax = 0;
    for (int i = 0; i < KL_MXFP4_BLOCK; i++) {
        size_t j = b * KL_MXFP4_BLOCK + (size_t)i;
        xb[i] = in16 ? (uint32_t)in16[j] << 16 : f32_bits(in32[j]);
        uint32_t a = xb[i] & F32_ABS;
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* One row through the scalar reference; exactly one of in16/in32 is non-NULL. */
static int row_scalar(const uint16_t *in16, const float *in32, size_t n, kl_scale_rule rule,
                      uint8_t *packed, uint8_t *scale, size_t *bad_block, kl_err *err)
{
    uint32_t xb[KL_MXFP4_BLOCK];
    for (size_t b = 0; b < n / KL_MXFP4_BLOCK; b++) {
        if (load_block(in16, in32, b, xb) >= F32_INF)
            return fail_nonfinite(xb, b, bad_block, err);
        block_scalar(xb, rule, packed + b * (KL_MXFP4_BLOCK / 2), scale + b);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * AVX2 path (same decisions as the scalar reference, 8 lanes at a time)
 * ----------------------------------------------------------------------------------------------*/
#if KL_MXFP4_X86

#define AVX2_FN     __attribute__((target("avx2,fma")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma")))
/* the 4-vector loops must become straight code so that the vectors stay in registers */
#define UNROLL4 _Pragma("GCC unroll 4")

/* Magnitude codes of 8 values 0 <= q < 2^22, the same as kl_e2m1_magnitude_code (ties to even),
 * from two float roundings instead of seven compares:
 *   halves = RNE(2q): q + 2^22 (whose ulp is 0.5) rounds q to halves, ties to the even count,
 *            and the bit difference is that count; it is the code for q < 2 (step 0.5);
 *   norm   = the code for q >= 1, where the grid is a float with one mantissa bit: round the
 *            f32 mantissa of max(q, 1) to one bit (add 0x1fffff plus the kept bit: ties to
 *            even) and read 2 * (exp - 127) + m + 2 = (bits >> 22) - 252, saturated at 7.
 * code = min(norm, halves): for q < 1, halves <= 2 = norm(1); on [1, 2) both are RNE(2q); for
 * q >= 2, norm <= halves (a code 2 + v for a value v <= q + 1/2 on [2, 4), at most 7 from
 * there on, while halves >= 2q - 1/2).  No blend: one uop fewer on Intel. */
AVX2_INLINE __m256i mag_code8(__m256 q)
{
    const __m256 magic = _mm256_set1_ps(0x1p22f);
    __m256i halves =
        _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(q, magic)), _mm256_castps_si256(magic));
    __m256i u = _mm256_castps_si256(_mm256_max_ps(q, _mm256_set1_ps(1.0f)));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 22), _mm256_set1_epi32(1));
    /* 252 << 22 folded into the rounding constant; u >= 1.0 keeps the sum positive */
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, odd),
                                 _mm256_set1_epi32((int32_t)(0x1fffffu - (252u << 22))));
    __m256i norm = _mm256_min_epi32(_mm256_srli_epi32(r, 22), _mm256_set1_epi32(7));
    return _mm256_min_epi32(norm, halves);
}

/* Largest of 8 non-negative int32 lanes. */
AVX2_INLINE uint32_t hmax8(__m256i v)
{
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(m);
}

/* Squared error of 8 lanes added to acc[0] (lanes 0-3) and acc[1] (lanes 4-7) in double. */
AVX2_INLINE void sse_acc8(__m256 d, __m256d *acc)
{
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(d));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(d, 1));
    /* d*d is exact in double (24-bit d), so the fused form rounds exactly like mul + add */
    acc[0] = _mm256_fmadd_pd(lo, lo, acc[0]);
    acc[1] = _mm256_fmadd_pd(hi, hi, acc[1]);
}

/* ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), as block_sse_scalar. */
AVX2_INLINE double sse_reduce(const __m256d *acc)
{
    __m256d s = _mm256_add_pd(acc[0], acc[1]);
    __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(t) + _mm_cvtsd_f64(_mm_unpackhi_pd(t, t));
}

/* 32 codes (4 x 8 int32, each < 16, element order) -> 16 bytes, element 2i in the low nibble. */
AVX2_INLINE void pack_codes(const __m256i *c, uint8_t *out)
{
    /* lane-wise packs: p01 = c0[0:4] c1[0:4] | c0[4:8] c1[4:8] as 16-bit */
    __m256i p01 = _mm256_packus_epi32(c[0], c[1]);
    __m256i p23 = _mm256_packus_epi32(c[2], c[3]);
    __m256i b = _mm256_packus_epi16(p01, p23); /* dwords: c0a c1a c2a c3a | c0b c1b c2b c3b */
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    /* byte pairs (even, odd) -> even + 16 * odd in each 16-bit lane */
    __m256i w = _mm256_maddubs_epi16(b, _mm256_set1_epi16(0x1001));
    __m256i n = _mm256_packus_epi16(w, w);
    n = _mm256_permute4x64_epi64(n, 0x08); /* qwords 0 and 2 hold the 16 bytes */
    _mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(n));
}

/* The AVX2 mse search visits the candidates in the order most likely to win first (on Gaussian
 * weights the ocp exponent wins ~90% of blocks, ceil the rest) and skips a candidate whose lower
 * bound exceeds the best error found: the same argmin as the scalar scan, because the bound
 * never exceeds the candidate's computed error (see mse_bound).  First: ocp's exponent. */
static inline int mse_first(uint32_t a, int lo, int hi)
{
    int e = kl_e8m0_clamp_exp((int)(a >> 23) - 129);
    return e < lo ? lo : e > hi ? hi : e;
}

/* Lower bound of a candidate's error in the units of block_sse_* * 4^(e - lo): the clipping
 * error of amax alone, (amax/X - 6)^2 when amax > 6X.  It is exact (q is an exact scaling, q - 6
 * and its square are exact in double) and it is one of the non-negative terms of the computed
 * sum (amax is always kept), which rounding cannot push below it. */
static inline double mse_bound(uint32_t a, int e, int lo)
{
    double q = (double)(kl_mxfp4_f32_from_bits(a) * pow2_neg(e));
    return q > 6.0 ? (q - 6.0) * (q - 6.0) * (double)(1u << (2 * (e - lo))) : 0.0;
}

/* Squared error of the block at scale 2^e (units of 4^e), over the elements with |x| > keep
 * (= 0.25 * 2^lo: nonzero code at the smallest candidate, as the scalar keep[]), summed in the
 * order of block_sse_scalar.  Codes are not kept: holding them for several candidates spills
 * registers, and recomputing the winner's is cheaper. */
AVX2_INLINE double block_sse_avx2(const __m256 *ax, __m256 keep, int e)
{
    /* the E2M1 magnitudes by code 0..7: the format's doubled codes, halved (exact) */
    const __m256 table = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_setr_epi8(KL_E2M1_X2_CODES))),
        _mm256_set1_ps(0.5f));
    const __m256 s = _mm256_set1_ps(pow2_neg(e));
    __m256d acc[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    UNROLL4
    for (int j = 0; j < 4; j++) {
        __m256 q = _mm256_mul_ps(ax[j], s);
        __m256 d = _mm256_sub_ps(q, _mm256_permutevar8x32_ps(table, mag_code8(q)));
        sse_acc8(_mm256_and_ps(d, _mm256_cmp_ps(ax[j], keep, _CMP_GT_OQ)), acc);
    }
    return sse_reduce(acc);
}

/* The mse exponent of a block (candidates [lo, hi], lo < hi): the scalar scan's argmin. */
AVX2_INLINE int mse_exponent_avx2(const __m256 *ax, uint32_t a, int lo, int hi)
{
    /* 0.25 * 2^lo = 2^(lo - 2) >= 2^-129, a subnormal float below 2^-126 */
    int k = lo - 2;
    const uint32_t keep_bits = k >= -126 ? (uint32_t)(k + 127) << 23 : 1u << (k + 149);
    const __m256 keep = _mm256_set1_ps(kl_mxfp4_f32_from_bits(keep_bits));
    /* first ocp's exponent, then ceil's when it is the one above */
    const int e0 = mse_first(a, lo, hi);
    double best = block_sse_avx2(ax, keep, e0) * (double)(1u << (2 * (e0 - lo)));
    int best_e = e0;
    if (e0 < hi) {
        double sse = block_sse_avx2(ax, keep, e0 + 1) * (double)(1u << (2 * (e0 + 1 - lo)));
        if (sse < best) { /* strict: ties keep the smaller exponent */
            best = sse;
            best_e = e0 + 1;
        }
    }
    /* below: the bound grows as e falls, so the first pruned candidate ends the search */
    for (int e = e0 - 1; e >= lo && mse_bound(a, e, lo) <= best; e--) {
        double sse = block_sse_avx2(ax, keep, e) * (double)(1u << (2 * (e - lo)));
        if (sse <= best) { /* e is smaller than best_e: it wins ties */
            best = sse;
            best_e = e;
        }
    }
    return best_e;
}

/* Quantizes one block given as 4 x 8 f32 bit patterns (finite) with amax bits a (nonzero). */
AVX2_INLINE void block_avx2(const __m256i *xb, uint32_t a, kl_scale_rule rule, uint8_t *packed,
                            uint8_t *scale)
{
    const __m256i absmask = _mm256_set1_epi32((int)F32_ABS);
    __m256 ax[4];
    UNROLL4
    for (int j = 0; j < 4; j++)
        ax[j] = _mm256_castsi256_ps(_mm256_and_si256(xb[j], absmask));
    int lo, hi;
    rule_exponents(a, rule, &lo, &hi);
    int e = lo == hi ? lo : mse_exponent_avx2(ax, a, lo, hi);

    /* codes; the sign bit (8) only where the magnitude code is nonzero: never -0 */
    const __m256 s = _mm256_set1_ps(pow2_neg(e));
    const __m256i eight = _mm256_set1_epi32(8), zero = _mm256_setzero_si256();
    __m256i code[4];
    UNROLL4
    for (int j = 0; j < 4; j++) {
        __m256i mag = mag_code8(_mm256_mul_ps(ax[j], s));
        __m256i sgn = _mm256_and_si256(_mm256_srai_epi32(xb[j], 31), eight);
        __m256i nz = _mm256_cmpgt_epi32(mag, zero);
        code[j] = _mm256_or_si256(mag, _mm256_and_si256(sgn, nz));
    }
    pack_codes(code, packed);
    *scale = kl_e8m0_encode(e);
}

/* Handles a loaded block: zero block, NaN/Inf, or quantize.  Returns 0 or the error. */
AVX2_INLINE int block_dispatch_avx2(const __m256i *xb, size_t b, kl_scale_rule rule,
                                    uint8_t *packed, uint8_t *scale, size_t *bad_block, kl_err *err)
{
    const __m256i absmask = _mm256_set1_epi32((int)F32_ABS);
    __m256i m = _mm256_max_epi32(
        _mm256_max_epi32(_mm256_and_si256(xb[0], absmask), _mm256_and_si256(xb[1], absmask)),
        _mm256_max_epi32(_mm256_and_si256(xb[2], absmask), _mm256_and_si256(xb[3], absmask)));
    uint32_t a = hmax8(m);
    uint8_t *pk = packed + b * (KL_MXFP4_BLOCK / 2);
    if (a == 0) {
        scale[b] = KL_E8M0_BIAS;
        memset(pk, 0, KL_MXFP4_BLOCK / 2);
        return 0;
    }
    if (a >= F32_INF) {
        uint32_t tmp[KL_MXFP4_BLOCK];
        UNROLL4
        for (int j = 0; j < 4; j++)
            _mm256_storeu_si256((__m256i *)(tmp + 8 * j), xb[j]);
        return fail_nonfinite(tmp, b, bad_block, err);
    }
    block_avx2(xb, a, rule, pk, scale + b);
    return 0;
}

static AVX2_FN int row_bf16_avx2(const uint16_t *in, size_t n, kl_scale_rule rule, uint8_t *packed,
                                 uint8_t *scale, size_t *bad_block, kl_err *err)
{
    for (size_t b = 0; b < n / KL_MXFP4_BLOCK; b++) {
        const uint16_t *p = in + b * KL_MXFP4_BLOCK;
        __m256i xb[4];
        UNROLL4
        for (int j = 0; j < 4; j++) /* bf16 -> f32 bits: widen and shift into the top half */
            xb[j] = _mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 8 * j))), 16);
        int rc = block_dispatch_avx2(xb, b, rule, packed, scale, bad_block, err);
        if (rc)
            return rc;
    }
    return 0;
}

static AVX2_FN int row_f32_avx2(const float *in, size_t n, kl_scale_rule rule, uint8_t *packed,
                                uint8_t *scale, size_t *bad_block, kl_err *err)
{
    for (size_t b = 0; b < n / KL_MXFP4_BLOCK; b++) {
        const float *p = in + b * KL_MXFP4_BLOCK;
        __m256i xb[4];
        UNROLL4
        for (int j = 0; j < 4; j++)
            xb[j] = _mm256_castps_si256(_mm256_loadu_ps(p + 8 * j));
        int rc = block_dispatch_avx2(xb, b, rule, packed, scale, bad_block, err);
        if (rc)
            return rc;
    }
    return 0;
}

#endif /* KL_MXFP4_X86 */

/* ------------------------------------------------------------------------------------------------
 * Public API
 * ----------------------------------------------------------------------------------------------*/

int kl_scale_rule_parse(const char *s)
{
    for (int r = 0; s && r < KL_SCALE_RULE_COUNT; r++)
        if (strcmp(s, k_rule_names[r]) == 0)
            return r;
    return -1;
}

const char *kl_scale_rule_name(kl_scale_rule r)
{
    return (unsigned)r < KL_SCALE_RULE_COUNT ? k_rule_names[r] : "?";
}

static int check_args(const void *in, size_t n, kl_scale_rule rule, const uint8_t *packed,
                      const uint8_t *scale, kl_err *err)
{
    if (n % KL_MXFP4_BLOCK != 0)
        return kl_fail(err, KL_E_USAGE, "MXFP4 row length %zu is not a multiple of %d", n,
                       KL_MXFP4_BLOCK);
    if ((unsigned)rule >= KL_SCALE_RULE_COUNT)
        return kl_fail(err, KL_E_USAGE, "unknown MXFP4 scale rule %d", (int)rule);
    if (n > 0 && (!in || !packed || !scale))
        return kl_fail(err, KL_E_USAGE, "MXFP4 quantizer called with a NULL buffer");
    return 0;
}

int kl_mxfp4_quantize_row_bf16(const uint16_t *in, size_t n, kl_scale_rule rule, uint8_t *packed,
                               uint8_t *scale, size_t *bad_block, kl_err *err)
{
    int rc = check_args(in, n, rule, packed, scale, err);
    if (rc)
        return rc;
#if KL_MXFP4_X86
    if (kl_cpu_has_avx2_fma())
        return row_bf16_avx2(in, n, rule, packed, scale, bad_block, err);
#endif
    return row_scalar(in, NULL, n, rule, packed, scale, bad_block, err);
}

int kl_mxfp4_quantize_row_f32(const float *in, size_t n, kl_scale_rule rule, uint8_t *packed,
                              uint8_t *scale, size_t *bad_block, kl_err *err)
{
    int rc = check_args(in, n, rule, packed, scale, err);
    if (rc)
        return rc;
#if KL_MXFP4_X86
    if (kl_cpu_has_avx2_fma())
        return row_f32_avx2(in, n, rule, packed, scale, bad_block, err);
#endif
    return row_scalar(NULL, in, n, rule, packed, scale, bad_block, err);
}

int kl_mxfp4_quantize_row_bf16_scalar(const uint16_t *in, size_t n, kl_scale_rule rule,
                                      uint8_t *packed, uint8_t *scale, size_t *bad_block,
                                      kl_err *err)
{
    int rc = check_args(in, n, rule, packed, scale, err);
    if (rc)
        return rc;
    return row_scalar(in, NULL, n, rule, packed, scale, bad_block, err);
}

int kl_mxfp4_quantize_row_f32_scalar(const float *in, size_t n, kl_scale_rule rule, uint8_t *packed,
                                     uint8_t *scale, size_t *bad_block, kl_err *err)
{
    int rc = check_args(in, n, rule, packed, scale, err);
    if (rc)
        return rc;
    return row_scalar(NULL, in, n, rule, packed, scale, bad_block, err);
}
