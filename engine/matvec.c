/*
 * engine/matvec.c — CPU weight kernels (see matvec.h).
 *
 * Divisions, in order: includes and constants; kernel selection; scalar reference; AVX2 path;
 * products over the pool; public API in header order.  Keep new code in its division.
 *
 * Every kernel computes "rows [r0, r1) of W against n activation vectors" (rows_fn).  A row's
 * value for one vector never depends on r0, r1 or n: the AVX2 code keeps its own accumulators
 * per (row, vector) and runs the same sequence of operations for each; only the number of
 * vectors that share one load or decode of the weights (a token tile) changes.
 *
 * Why the dense chains are per row: one token (decode) must stream the weights at memory speed.
 * A thread reading one row at a time is one sequential stream, which the hardware prefetchers
 * follow; interleaving 2-4 rows (more chains per load of x) halved the DRAM rate measured on an
 * AMD EPYC VM.  Four chains per row keep the FMA latency hidden with a single stream.
 */
#include "engine/matvec.h"

#include "common/cpu.h"
#include "common/mxfp4_format.h"
#include "common/numfmt.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define KL_MATVEC_X86 1
#include <immintrin.h>
#else
#define KL_MATVEC_X86 0
#endif

#define BLOCK         32   /* columns per block: the MXFP4 block, and the AVX2 unit for all kinds */
#define ROWS_PER_ITEM 16   /* rows per pool item */
/* Below this many multiply-adds a product runs in the caller: waking the pool costs more. */
#define SERIAL_MACS   (1u << 19)

/* Rows [r0, r1) of w against n vectors x [n, w->cols]; writes y[t * ldy + (r - r0)]. */
typedef struct mm_args {
    const kl_wmat *w;
    const float   *x;     /* [n, w->cols] */
    size_t         n;
    float         *y;     /* output of row r0, vector 0 */
    size_t         ldy;   /* distance between two vectors' outputs */
} mm_args;

typedef void (*rows_fn)(const mm_args *a, uint64_t r0, uint64_t r1);

/* ------------------------------------------------------------------------------------------ */
/* Kernel selection                                                                           */

static atomic_int g_kernels = KL_KERNELS_AUTO;

static kl_cpu_kernels resolve(kl_cpu_kernels want)
{
    if (want == KL_KERNELS_AUTO) {
        const char *e = getenv("KL_CPU_KERNELS");
        want = e && !strcmp(e, "scalar") ? KL_KERNELS_SCALAR : KL_KERNELS_AVX2;
    }
    return want == KL_KERNELS_AVX2 && kl_cpu_has_avx2_fma() ? KL_KERNELS_AVX2 : KL_KERNELS_SCALAR;
}

static kl_cpu_kernels current(void)
{
    int k = atomic_load_explicit(&g_kernels, memory_order_relaxed);
    if (k == KL_KERNELS_AUTO) {
        /* a race here stores the same answer twice */
        k = (int)resolve(KL_KERNELS_AUTO);
        atomic_store_explicit(&g_kernels, k, memory_order_relaxed);
    }
    return (kl_cpu_kernels)k;
}

/* ------------------------------------------------------------------------------------------ */
/* Scalar reference: column order, one vector at a time                                       */

static float dot_scalar(const kl_wmat *w, uint64_t r, const float *x)
{
    uint64_t n = w->cols;
    float acc = 0.0f;
    switch (w->kind) {
    case KL_W_F32: {
        const float *p = (const float *)w->data + r * n;
        for (uint64_t c = 0; c < n; c++)
            acc += p[c] * x[c];
        break;
    }
    case KL_W_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + r * n;
        for (uint64_t c = 0; c < n; c++)
            acc += kl_bf16_to_f32(p[c]) * x[c];
        break;
    }
    case KL_W_MXFP4: {
        /* dequantize one 32-block at a time: no row-sized scratch */
        const uint8_t *pk = w->packed + r * (n / 2);
        const uint8_t *sc = w->scale + r * (n / KL_MXFP4_BLOCK);
        float blk[KL_MXFP4_BLOCK];
        for (uint64_t b = 0; b < n / KL_MXFP4_BLOCK; b++) {
            kl_mxfp4_dequantize_row(pk + b * (KL_MXFP4_BLOCK / 2), sc + b, KL_MXFP4_BLOCK, blk);
            const float *xb = x + b * KL_MXFP4_BLOCK;
            for (int i = 0; i < KL_MXFP4_BLOCK; i++)
                acc += blk[i] * xb[i];
        }
        break;
    }
    default:
        break;
    }
    return acc;
}

static void rows_scalar(const mm_args *a, uint64_t r0, uint64_t r1)
{
    for (uint64_t r = r0; r < r1; r++)
        for (size_t t = 0; t < a->n; t++)
            a->y[t * a->ldy + (r - r0)] = dot_scalar(a->w, r, a->x + t * a->w->cols);
}

static float vdot_scalar(const float *a, const float *b, size_t n)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void axpy_scalar(float *y, float a, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void scale_axpy_scalar(float *x, float s, float *y, float a, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        x[i] *= s;
        y[i] += a * x[i];
    }
}

static void axpy_axpy_scalar(float *x, float a, const float *u, float *y, float b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        x[i] += a * u[i];
        y[i] += b * x[i];
    }
}

/* The row forms on the scalar set: one call per row. */
static void dot_rows_scalar(const float *a, const float *rows, size_t ld, size_t nr, size_t n,
                            float *out)
{
    for (size_t r = 0; r < nr; r++)
        out[r] = vdot_scalar(a, rows + r * ld, n);
}

static void axpy_rows_scalar(float *y, const float *a, const float *rows, size_t ld, size_t nr,
                             size_t n)
{
    for (size_t r = 0; r < nr; r++)
        axpy_scalar(y, a[r], rows + r * ld, n);
}

static void scale_axpy_rows_scalar(float *x, size_t ld, const float *s, float *y,
                                   const float *a, size_t nr, size_t n)
{
    for (size_t r = 0; r < nr; r++)
        scale_axpy_scalar(x + r * ld, s[r], y, a[r], n);
}

static void axpy_axpy_rows_scalar(float *x, size_t ld, const float *a, const float *u, float *y,
                                  const float *b, size_t nr, size_t n)
{
    for (size_t r = 0; r < nr; r++)
        axpy_axpy_scalar(x + r * ld, a[r], u, y, b[r], n);
}

/* The kinds of elementwise activation (kl_vec_silu and the others), one loop for all. */
typedef enum act_kind {
    ACT_SILU, ACT_SILU_MUL, ACT_SIGMOID, ACT_EXP_SHIFT, ACT_EXP_SOFTPLUS
} act_kind;

static float silu_scalar(float z)
{
    return z / (1.0f + expf(-z));
}

static float sigmoid_scalar(float z)
{
    return 1.0f / (1.0f + expf(-z));
}

/* softplus with fla's threshold: z above 20 returns z */
static float softplus_scalar(float z)
{
    return z > 20.0f ? z : log1pf(expf(z));
}

/* ------------------------------------------------------------------------------------------ */
/* AVX2 path                                                                                  */

#if KL_MATVEC_X86

#define AVX2_FN     __attribute__((target("avx2,fma")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma")))
/* the tile loops must become straight code so that the accumulators stay in registers */
#define UNROLL      _Pragma("GCC unroll 4")
#define TILE        4   /* MXFP4: vectors sharing one decode of a weight block (registers: 4
                           weights, 4 accumulators, 2 partials, 1 scale) */

/* Sum of the 8 lanes in a fixed tree: (lo + hi) halves, then pairs, then the last two. */
AVX2_INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Σ of one MXFP4 32-block, w (4 vectors) times x[0..32): two partial chains, then their sum. */
AVX2_INLINE __m256 block_dot(const __m256 *w, const float *x)
{
    __m256 p0 = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
    __m256 p1 = _mm256_mul_ps(w[2], _mm256_loadu_ps(x + 16));
    p0 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), p0);
    p1 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), p1);
    return _mm256_add_ps(p0, p1);
}

/* 32 E2M1 codes (16 bytes) as floats times 2: a 16-entry int8 table looked up by pshufb gives
 * exact small integers (KL_E2M1_X2_CODES); the 1/2 is folded into the block scale
 * (kl_e8m0_half_bits). */
AVX2_INLINE void load_mxfp4(const uint8_t *p, __m256 *w)
{
    const __m128i lut = _mm_setr_epi8(KL_E2M1_X2_CODES);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(b, m4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m4);
    /* interleaving low and high nibbles restores element order: 0..15, then 16..31 */
    __m128i e0 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));
    __m128i e1 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi));
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(e0, e0)));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(e1, e1)));
}

/* ---- dense rows (F32, BF16): micro-tiles of up to 4 rows x 4 tokens ---- */

#define MICRO  3   /* tokens of a micro-tile */
#define CHAINS 4   /* FMA chains per (row, token) */

/* The dense row's pointer (F32 or BF16). */
static inline const void *dense_row(const kl_wmat *w, uint64_t r)
{
    if (w->kind == KL_W_F32)
        return (const float *)w->data + r * w->cols;
    return (const uint16_t *)w->data + r * w->cols;
}

/* 8 weights of a dense row from column c as fp32 (bf16 -> f32 is a 16-bit left shift). */
AVX2_INLINE __m256 load8_dense(kl_wkind kind, const void *row, uint64_t c)
{
    if (kind == KL_W_F32)
        return _mm256_loadu_ps((const float *)row + c);
    const __m128i *p = (const __m128i *)((const uint16_t *)row + c);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p)), 16));
}

/* The last m < 8 weights from column c, zero-padded to 8. */
AVX2_INLINE __m256 load_tail_dense(kl_wkind kind, const void *row, uint64_t c, uint64_t m)
{
    float p[8] = {0};
    for (uint64_t i = 0; i < m; i++)
        p[i] = kind == KL_W_F32 ? ((const float *)row)[c + i]
                                : kl_bf16_to_f32(((const uint16_t *)row)[c + i]);
    return _mm256_loadu_ps(p);
}

/* Lanes [0, m) set: a masked load of a partial chunk of x reads nothing past the row's end
 * and gives zeros in the other lanes. */
AVX2_INLINE __m256i tail_mask(uint64_t m)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* One dense row against G vectors: what the chunk helpers share. */
typedef struct dense_tile {
    const void  *row;    /* the row's weights, F32 or BF16 [cols] */
    const float *x;      /* vector g at x + g * cols */
    uint64_t     cols;
} dense_tile;

/* acc[g][k] += w · x_g[c .. c+8) for the G vectors (chain k of each). */
AVX2_INLINE void fma_chunk(__m256 acc[][CHAINS], int k, __m256 w, const dense_tile *d,
                           uint64_t c, int G)
{
    UNROLL
    for (int g = 0; g < G; g++)
        acc[g][k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(d->x + (size_t)g * d->cols + c),
                                    acc[g][k]);
}

/* The last, partial chunk (columns c .. cols, fewer than 8) into chain k: weights zero-padded,
 * x read with a mask. */
AVX2_INLINE void fma_tail(__m256 acc[][CHAINS], int k, const dense_tile *d, uint64_t c, int G,
                          kl_wkind kind)
{
    __m256 w = load_tail_dense(kind, d->row, c, d->cols - c);
    __m256i mask = tail_mask(d->cols - c);
    UNROLL
    for (int g = 0; g < G; g++)
        acc[g][k] = _mm256_fmadd_ps(
            w, _mm256_maskload_ps(d->x + (size_t)g * d->cols + c, mask), acc[g][k]);
}

/* Row r against vectors t .. t+G (G <= MICRO, a constant after inlining).  Each (row, vector)
 * runs CHAINS 8-lane FMA chains, 8-column chunk c feeding chain c mod CHAINS (the last partial
 * chunk zero-padded), summed as (c0 + c1) + (c2 + c3), then hsum8: the same operations for
 * any G, which only decides how many vectors share each weight load.  The row is one
 * sequential stream (what the hardware prefetchers follow best) and one vector alone still
 * has four independent chains. */
AVX2_INLINE void micro_dense(const mm_args *a, uint64_t r0, uint64_t r, size_t t, int G,
                             kl_wkind kind)
{
    const kl_wmat *w = a->w;
    uint64_t cols = w->cols, nc = cols / 8, nq = nc / CHAINS, rest = nc % CHAINS, m = cols % 8;
    const dense_tile d = {dense_row(w, r), a->x + t * cols, cols};
    __m256 acc[MICRO][CHAINS];
    UNROLL
    for (int g = 0; g < G; g++)
        UNROLL
        for (int k = 0; k < CHAINS; k++)
            acc[g][k] = _mm256_setzero_ps();
    for (uint64_t q = 0; q < nq; q++) {
        uint64_t c = q * CHAINS * 8;
        __m256 w0 = load8_dense(kind, d.row, c), w1 = load8_dense(kind, d.row, c + 8);
        __m256 w2 = load8_dense(kind, d.row, c + 16), w3 = load8_dense(kind, d.row, c + 24);
        fma_chunk(acc, 0, w0, &d, c, G);
        fma_chunk(acc, 1, w1, &d, c + 8, G);
        fma_chunk(acc, 2, w2, &d, c + 16, G);
        fma_chunk(acc, 3, w3, &d, c + 24, G);
    }
    /* whole chunks after the last group of four, then the partial one, each in its chain */
    uint64_t c = nq * CHAINS * 8;
    UNROLL
    for (int k = 0; k < CHAINS - 1; k++) {
        uint64_t ck = c + 8 * (uint64_t)k;
        if ((uint64_t)k < rest)
            fma_chunk(acc, k, load8_dense(kind, d.row, ck), &d, ck, G);
        else if ((uint64_t)k == rest && m)
            fma_tail(acc, k, &d, ck, G, kind);
    }
    if (rest == CHAINS - 1 && m)
        fma_tail(acc, CHAINS - 1, &d, c + 8 * (CHAINS - 1), G, kind);
    UNROLL
    for (int g = 0; g < G; g++) {
        __m256 s = _mm256_add_ps(_mm256_add_ps(acc[g][0], acc[g][1]),
                                 _mm256_add_ps(acc[g][2], acc[g][3]));
        a->y[(t + (size_t)g) * a->ldy + (r - r0)] = hsum8(s);
    }
}

/* Rows [r0, r1) against tokens t .. t+G, rows inner so the G vectors stay in L1. */
AVX2_INLINE void micro_rows(const mm_args *a, uint64_t r0, uint64_t r1, size_t t, int G,
                            kl_wkind kind)
{
    for (uint64_t r = r0; r < r1; r++)
        micro_dense(a, r0, r, t, G, kind);
}

/* ---- dense rows, wide tiles: 2 rows x 4 vectors, one chain at a time ---- */

#define WIDE_R       2            /* rows of a wide tile */
#define WIDE_G       4            /* vectors of a wide tile */
#define WIDE_X_BYTES (16u << 10)  /* the tile's vectors stay in L1 across its four chain passes */
#define WIDE_MIN_COLS 128         /* shorter rows: the four passes' setup costs more than they
                                     save */

/* acc[i][g] += w_i · x_g[c .. c+8) for the tile's R rows and WIDE_G vectors; tail: the last,
 * partial chunk of m columns (weights zero-padded, x read with a mask), as fma_tail does. */
AVX2_INLINE void wide_chunk(__m256 acc[][WIDE_G], const void *const *row, const float *x,
                            uint64_t cols, uint64_t c, uint64_t m, int R, kl_wkind kind)
{
    __m256 w[WIDE_R], xv[WIDE_G];
    __m256i mask = tail_mask(m);
    UNROLL
    for (int i = 0; i < R; i++)
        w[i] = m ? load_tail_dense(kind, row[i], c, m) : load8_dense(kind, row[i], c);
    UNROLL
    for (int g = 0; g < WIDE_G; g++) {
        xv[g] = m ? _mm256_maskload_ps(x + (size_t)g * cols + c, mask)
                  : _mm256_loadu_ps(x + (size_t)g * cols + c);
        __asm__("" : "+x"(xv[g]));   /* one load per chunk: keep it in a register, not folded
                                        into (and repeated by) each row's FMA */
    }
    UNROLL
    for (int i = 0; i < R; i++)
        UNROLL
        for (int g = 0; g < WIDE_G; g++)
            acc[i][g] = _mm256_fmadd_ps(w[i], xv[g], acc[i][g]);
}

/* Rows r .. r+R (R <= WIDE_R) against vectors t .. t+WIDE_G.  Chain k of every (row, vector)
 * takes the chunks micro_dense gives chain k, in the same order (whole chunks c = 4q + k, then
 * the one after the last group of four if k < rest, or the partial one if k == rest), and the
 * chains are summed as there: each value is micro_dense's, bit for bit.  Running one chain at a
 * time keeps R x WIDE_G accumulators in registers, so a weight chunk is converted once for
 * four vectors and a vector chunk loaded once for two rows. */
AVX2_INLINE void wide_tile(const mm_args *a, uint64_t r0, uint64_t r, size_t t, int R,
                           kl_wkind kind)
{
    const kl_wmat *w = a->w;
    uint64_t cols = w->cols, nc = cols / 8, nq = nc / CHAINS, rest = nc % CHAINS, m = cols % 8;
    const void *row[WIDE_R];
    const float *x = a->x + t * cols;
    __m256 part[CHAINS][WIDE_R][WIDE_G];
    UNROLL
    for (int i = 0; i < R; i++)
        row[i] = dense_row(w, r + (uint64_t)i);
    for (int k = 0; k < CHAINS; k++) {
        __m256 acc[WIDE_R][WIDE_G];
        UNROLL
        for (int i = 0; i < R; i++)
            UNROLL
            for (int g = 0; g < WIDE_G; g++)
                acc[i][g] = _mm256_setzero_ps();
        for (uint64_t q = 0; q < nq; q++)
            wide_chunk(acc, row, x, cols, q * CHAINS * 8 + 8 * (uint64_t)k, 0, R, kind);
        uint64_t c = nq * CHAINS * 8 + 8 * (uint64_t)k;
        if ((uint64_t)k < rest)
            wide_chunk(acc, row, x, cols, c, 0, R, kind);
        else if ((uint64_t)k == rest && m)
            wide_chunk(acc, row, x, cols, c, m, R, kind);
        memcpy(part[k], acc, sizeof acc);
    }
    for (int i = 0; i < R; i++)
        for (int g = 0; g < WIDE_G; g++) {
            __m256 s = _mm256_add_ps(_mm256_add_ps(part[0][i][g], part[1][i][g]),
                                     _mm256_add_ps(part[2][i][g], part[3][i][g]));
            a->y[(t + (size_t)g) * a->ldy + (r + (uint64_t)i - r0)] = hsum8(s);
        }
}

/* Rows [r0, r1) against vectors t .. t+WIDE_G in wide tiles (an odd last row alone). */
AVX2_INLINE void wide_rows(const mm_args *a, uint64_t r0, uint64_t r1, size_t t, kl_wkind kind)
{
    uint64_t r = r0;
    for (; r + WIDE_R <= r1; r += WIDE_R)
        wide_tile(a, r0, r, t, WIDE_R, kind);
    if (r < r1)
        wide_tile(a, r0, r, t, 1, kind);
}

/* Tokens in wide tiles of 4 while their vectors fit in L1, the rest in tiles of 3 (12
 * accumulators and 4 weights in the 16 ymm registers; x read from memory by the FMAs). */
AVX2_INLINE void rows_dense(const mm_args *a, uint64_t r0, uint64_t r1, kl_wkind kind)
{
    size_t t = 0;
    if (a->w->cols >= WIDE_MIN_COLS && a->w->cols * WIDE_G * sizeof(float) <= WIDE_X_BYTES)
        for (; t + WIDE_G <= a->n; t += WIDE_G)
            wide_rows(a, r0, r1, t, kind);
    for (; t + MICRO <= a->n; t += MICRO)
        micro_rows(a, r0, r1, t, MICRO, kind);
    switch (a->n - t) {
    case 2: micro_rows(a, r0, r1, t, 2, kind); break;
    case 1: micro_rows(a, r0, r1, t, 1, kind); break;
    default: break;
    }
}

static AVX2_FN void rows_f32_avx2(const mm_args *a, uint64_t r0, uint64_t r1)
{
    rows_dense(a, r0, r1, KL_W_F32);
}

static AVX2_FN void rows_bf16_avx2(const mm_args *a, uint64_t r0, uint64_t r1)
{
    rows_dense(a, r0, r1, KL_W_BF16);
}

/* ---- MXFP4 rows: one row against up to TILE tokens ---- */

/* One MXFP4 row (cols a multiple of 32) against g vectors: Σ_b scale_b · Σ_block code · x. */
AVX2_INLINE void tile_mxfp4(const mm_args *a, uint64_t r, const float *x, int g, float *y)
{
    const kl_wmat *w = a->w;
    uint64_t cols = w->cols, nb = cols / BLOCK;
    const uint8_t *pk = w->packed + r * (cols / 2), *sc = w->scale + r * nb;
    __m256 acc[TILE], wv[4];
    UNROLL
    for (int j = 0; j < g; j++)
        acc[j] = _mm256_setzero_ps();
    for (uint64_t b = 0; b < nb; b++) {
        load_mxfp4(pk + b * (BLOCK / 2), wv);
        __m256 s = _mm256_castsi256_ps(_mm256_set1_epi32((int)kl_e8m0_half_bits(sc[b])));
        UNROLL
        for (int j = 0; j < g; j++)
            acc[j] = _mm256_fmadd_ps(block_dot(wv, x + j * cols + b * BLOCK), s, acc[j]);
    }
    UNROLL
    for (int j = 0; j < g; j++)
        y[j * a->ldy] = hsum8(acc[j]);
}

/* Rows [r0, r1) against tokens [t, t + g): rows inner, so the g vectors stay in cache while
 * the item's rows pass. */
AVX2_INLINE void mxfp4_rows(const mm_args *a, uint64_t r0, uint64_t r1, size_t t, int g)
{
    const float *x = a->x + t * a->w->cols;
    for (uint64_t r = r0; r < r1; r++)
        tile_mxfp4(a, r, x, g, a->y + t * a->ldy + (r - r0));
}

/* Whole tiles of TILE vectors, then the rest as one smaller tile (each g a constant, so the
 * accumulators stay in registers). */
static AVX2_FN void rows_mxfp4_avx2(const mm_args *a, uint64_t r0, uint64_t r1)
{
    size_t t = 0;
    for (; t + TILE <= a->n; t += TILE)
        mxfp4_rows(a, r0, r1, t, TILE);
    switch (a->n - t) {
    case 3: mxfp4_rows(a, r0, r1, t, 3); break;
    case 2: mxfp4_rows(a, r0, r1, t, 2); break;
    case 1: mxfp4_rows(a, r0, r1, t, 1); break;
    default: break;
    }
}

/* bf16 -> f32 of a whole row, 8 at a time (exact, like the scalar loop) */
static AVX2_FN void row_bf16_avx2(const uint16_t *p, uint64_t n, float *out)
{
    uint64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + c)));
        _mm256_storeu_ps(out + c, _mm256_castsi256_ps(_mm256_slli_epi32(u, 16)));
    }
    for (; c < n; c++)
        out[c] = kl_bf16_to_f32(p[c]);
}

/* s plus a[i] · b[i] for the columns i .. n after the last whole chunk, in order. */
static inline float dot_tail(float s, const float *a, const float *b, size_t i, size_t n)
{
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static AVX2_FN float vdot_avx2(const float *a, const float *b, size_t n)
{
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    return dot_tail(hsum8(acc), a, b, i, n);
}

static AVX2_FN void axpy_avx2(float *y, float a, const float *x, size_t n)
{
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static AVX2_FN void scale_axpy_avx2(float *x, float s, float *y, float a, size_t n)
{
    __m256 vs = _mm256_set1_ps(s), va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        _mm256_storeu_ps(x + i, v);
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, v, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) {
        x[i] *= s;
        y[i] += a * x[i];
    }
}

static AVX2_FN void axpy_axpy_avx2(float *x, float a, const float *u, float *y, float b, size_t n)
{
    __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_fmadd_ps(va, _mm256_loadu_ps(u + i), _mm256_loadu_ps(x + i));
        _mm256_storeu_ps(x + i, v);
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vb, v, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) {
        x[i] += a * u[i];
        y[i] += b * x[i];
    }
}

/* ---- row forms: each row's operations exactly those of the one-row primitive ---- */

#define ROW_GROUP 4   /* rows whose updates of one 8-float chunk of y share its load and store */

/* Four rows at a time: four independent FMA chains (one alone waits on the FMA latency). */
static AVX2_FN void dot_rows_avx2(const float *a, const float *rows, size_t ld, size_t nr,
                                  size_t n, float *out)
{
    size_t r = 0;
    for (; r + 4 <= nr; r += 4) {
        const float *p0 = rows + r * ld, *p1 = p0 + ld, *p2 = p1 + ld, *p3 = p2 + ld;
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 va = _mm256_loadu_ps(a + i);
            s0 = _mm256_fmadd_ps(va, _mm256_loadu_ps(p0 + i), s0);
            s1 = _mm256_fmadd_ps(va, _mm256_loadu_ps(p1 + i), s1);
            s2 = _mm256_fmadd_ps(va, _mm256_loadu_ps(p2 + i), s2);
            s3 = _mm256_fmadd_ps(va, _mm256_loadu_ps(p3 + i), s3);
        }
        out[r] = dot_tail(hsum8(s0), a, p0, i, n);
        out[r + 1] = dot_tail(hsum8(s1), a, p1, i, n);
        out[r + 2] = dot_tail(hsum8(s2), a, p2, i, n);
        out[r + 3] = dot_tail(hsum8(s3), a, p3, i, n);
    }
    for (; r < nr; r++)
        out[r] = vdot_avx2(a, rows + r * ld, n);
}

/* The group kernels below take G rows (a constant after inlining: the coefficients stay in
 * registers): each 8-float chunk of y is loaded once, takes the G rows in order and is stored
 * once; the scalar tail runs the same per-element sequence as the one-row primitive. */
AVX2_INLINE void axpy_group(float *y, const float *a, const float *x, size_t ld, size_t n, int G)
{
    __m256 va[ROW_GROUP];
    UNROLL
    for (int k = 0; k < G; k++)
        va[k] = _mm256_set1_ps(a[k]);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 acc = _mm256_loadu_ps(y + i);
        UNROLL
        for (int k = 0; k < G; k++)
            acc = _mm256_fmadd_ps(va[k], _mm256_loadu_ps(x + (size_t)k * ld + i), acc);
        _mm256_storeu_ps(y + i, acc);
    }
    for (; i < n; i++)
        for (int k = 0; k < G; k++)
            y[i] += a[k] * x[(size_t)k * ld + i];
}

/* The delta rule's two updates on G rows: row k becomes x_k · c[k] (u NULL: scale_axpy) or
 * x_k + c[k] · u (axpy_axpy), then y += d[k] · x_k with the new row. */
AVX2_INLINE void update_group(float *x, size_t ld, const float *c, const float *u, float *y,
                              const float *d, size_t n, int G)
{
    __m256 vc[ROW_GROUP], vd[ROW_GROUP];
    UNROLL
    for (int k = 0; k < G; k++) {
        vc[k] = _mm256_set1_ps(c[k]);
        vd[k] = _mm256_set1_ps(d[k]);
    }
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 acc = _mm256_loadu_ps(y + i), uu = u ? _mm256_loadu_ps(u + i) : acc;
        UNROLL
        for (int k = 0; k < G; k++) {
            float *xk = x + (size_t)k * ld + i;
            __m256 v = u ? _mm256_fmadd_ps(vc[k], uu, _mm256_loadu_ps(xk))
                         : _mm256_mul_ps(_mm256_loadu_ps(xk), vc[k]);
            _mm256_storeu_ps(xk, v);
            acc = _mm256_fmadd_ps(vd[k], v, acc);
        }
        _mm256_storeu_ps(y + i, acc);
    }
    for (; i < n; i++)
        for (int k = 0; k < G; k++) {
            float *xk = x + (size_t)k * ld + i;
            if (u)
                *xk += c[k] * u[i];
            else
                *xk *= c[k];
            y[i] += d[k] * *xk;
        }
}

/* Whole groups of ROW_GROUP rows, then the rest one row at a time. */
static AVX2_FN void axpy_rows_avx2(float *y, const float *a, const float *rows, size_t ld,
                                   size_t nr, size_t n)
{
    size_t r = 0;
    for (; r + ROW_GROUP <= nr; r += ROW_GROUP)
        axpy_group(y, a + r, rows + r * ld, ld, n, ROW_GROUP);
    for (; r < nr; r++)
        axpy_group(y, a + r, rows + r * ld, ld, n, 1);
}

static AVX2_FN void scale_axpy_rows_avx2(float *x, size_t ld, const float *s, float *y,
                                         const float *a, size_t nr, size_t n)
{
    size_t r = 0;
    for (; r + ROW_GROUP <= nr; r += ROW_GROUP)
        update_group(x + r * ld, ld, s + r, NULL, y, a + r, n, ROW_GROUP);
    for (; r < nr; r++)
        update_group(x + r * ld, ld, s + r, NULL, y, a + r, n, 1);
}

static AVX2_FN void axpy_axpy_rows_avx2(float *x, size_t ld, const float *a, const float *u,
                                        float *y, const float *b, size_t nr, size_t n)
{
    size_t r = 0;
    for (; r + ROW_GROUP <= nr; r += ROW_GROUP)
        update_group(x + r * ld, ld, a + r, u, y, b + r, n, ROW_GROUP);
    for (; r < nr; r++)
        update_group(x + r * ld, ld, a + r, u, y, b + r, n, 1);
}

/* ---- activations: exp and log by Cephes' polynomials, 8 lanes ---- */

#define EXP_HI 88.0f     /* exp(88) < 2^127: the scale 2^n below stays a normal number */
#define EXP_LO -87.3f    /* exp(-87.3) > 2^-126 */

/* exp(x): x = n ln2 + r (ln2 in two parts), |r| <= ln2/2, degree-6 polynomial, times 2^n;
 * 0 below EXP_LO (a tiny normal there would make every later product with it denormal: slow). */
AVX2_INLINE __m256 exp8(__m256 x)
{
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                                  23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* log(u) for normal u >= 1: u = m 2^e, m in [sqrt(1/2), sqrt(2)), degree-9 polynomial in m-1. */
AVX2_INLINE __m256 log8(__m256 u)
{
    __m256i ui = _mm256_castps_si256(u);
    __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(ui, 23),
                                                   _mm256_set1_epi32(126)));
    __m256i mi = _mm256_and_si256(ui, _mm256_set1_epi32(0x7fffff));
    __m256 m = _mm256_castsi256_ps(_mm256_or_si256(mi, _mm256_set1_epi32(0x3f000000))); /* [.5,1) */
    __m256 small = _mm256_cmp_ps(m, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
    e = _mm256_sub_ps(e, _mm256_and_ps(small, _mm256_set1_ps(1.0f)));
    m = _mm256_add_ps(_mm256_sub_ps(m, _mm256_set1_ps(1.0f)), _mm256_and_ps(small, m));
    __m256 z = _mm256_mul_ps(m, m), y = _mm256_set1_ps(7.0376836292e-2f);
    static const float c[] = {-1.1514610310e-1f, 1.1676998740e-1f, -1.2420140846e-1f,
                              1.4249322787e-1f,  -1.6668057665e-1f, 2.0000714765e-1f,
                              -2.4999993993e-1f, 3.3333331174e-1f};
    for (int i = 0; i < 8; i++)
        y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(c[i]));
    y = _mm256_mul_ps(_mm256_mul_ps(y, m), z);
    y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
    y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
    return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(m, y));
}

/* softplus(z) = log1p(exp(z)) as log(1 + y) plus the rounding of 1 + y, (y - (u - 1)) / u;
 * z above 20 gives z. */
AVX2_INLINE __m256 softplus8(__m256 z)
{
    __m256 one = _mm256_set1_ps(1.0f), y = exp8(z), u = _mm256_add_ps(one, y);
    __m256 fix = _mm256_div_ps(_mm256_sub_ps(y, _mm256_sub_ps(u, one)), u);
    __m256 sp = _mm256_add_ps(log8(u), fix);
    return _mm256_blendv_ps(sp, z, _mm256_cmp_ps(z, _mm256_set1_ps(20.0f), _CMP_GT_OQ));
}

/* 1 + exp(-z), the denominator of sigmoid and silu */
AVX2_INLINE __m256 one_plus_exp_neg(__m256 z)
{
    return _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), z)));
}

typedef struct act_args {
    act_kind     kind;
    const float *y;       /* ACT_SILU_MUL: the other factor; ACT_EXP_SOFTPLUS: the bias */
    float        s;       /* ACT_EXP_SHIFT: the shift; ACT_EXP_SOFTPLUS: the scale */
} act_args;

AVX2_INLINE __m256 act8(const act_args *a, __m256 x, __m256 y)
{
    switch (a->kind) {
    case ACT_SILU: return _mm256_div_ps(x, one_plus_exp_neg(x));
    case ACT_SILU_MUL: return _mm256_mul_ps(_mm256_div_ps(x, one_plus_exp_neg(x)), y);
    case ACT_SIGMOID: return _mm256_div_ps(_mm256_set1_ps(1.0f), one_plus_exp_neg(x));
    case ACT_EXP_SHIFT: return exp8(_mm256_sub_ps(x, _mm256_set1_ps(a->s)));
    default: return exp8(_mm256_mul_ps(_mm256_set1_ps(a->s), softplus8(_mm256_add_ps(x, y))));
    }
}

/* 8 lanes at a time; the tail padded through a buffer (its lanes are independent). */
static AVX2_FN void act_avx2(const act_args *a, float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = a->y ? _mm256_loadu_ps(a->y + i) : _mm256_setzero_ps();
        _mm256_storeu_ps(x + i, act8(a, _mm256_loadu_ps(x + i), y));
    }
    if (i == n)
        return;
    float xt[8] = {0}, yt[8] = {0};
    memcpy(xt, x + i, (n - i) * sizeof *xt);
    if (a->y)
        memcpy(yt, a->y + i, (n - i) * sizeof *yt);
    _mm256_storeu_ps(xt, act8(a, _mm256_loadu_ps(xt), _mm256_loadu_ps(yt)));
    memcpy(x + i, xt, (n - i) * sizeof *xt);
}

#endif /* KL_MATVEC_X86 */

/* ------------------------------------------------------------------------------------------ */
/* Products over the pool                                                                     */

/* The row kernel for w in the current set; MXFP4 rows that are not whole blocks (no valid
 * checkpoint has them) stay on the scalar path. */
static rows_fn pick_rows(const kl_wmat *w)
{
#if KL_MATVEC_X86
    if (current() == KL_KERNELS_AVX2) {
        if (w->kind == KL_W_F32)
            return rows_f32_avx2;
        if (w->kind == KL_W_BF16)
            return rows_bf16_avx2;
        if (w->kind == KL_W_MXFP4 && w->cols % BLOCK == 0)
            return rows_mxfp4_avx2;
    }
#endif
    return rows_scalar;
}

#define BATCH_MAX 64   /* products per pool pass */

/* Pool items of up to BATCH_MAX products: product j owns items [first[j], first[j+1]). */
typedef struct batch_job {
    const kl_matmul *mm;
    size_t           n_mm;
    size_t           first[BATCH_MAX + 1];
    rows_fn          fn[BATCH_MAX];
} batch_job;

static void batch_item(void *ctx, size_t i)
{
    const batch_job *b = ctx;
    size_t lo = 0, hi = b->n_mm;   /* binary search: first[lo] <= i < first[lo + 1] */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (b->first[mid] <= i)
            lo = mid;
        else
            hi = mid;
    }
    const kl_matmul *p = &b->mm[lo];
    uint64_t r0 = (uint64_t)(i - b->first[lo]) * ROWS_PER_ITEM, r1 = r0 + ROWS_PER_ITEM;
    if (r1 > p->w->rows)
        r1 = p->w->rows;
    mm_args a = {p->w, p->x, p->n, p->y + r0, (size_t)p->w->rows};
    b->fn[lo](&a, r0, r1);
}

static void run_batch(const kl_matmul *mm, size_t n_mm, kl_pool *pool)
{
    batch_job b = {.mm = mm, .n_mm = n_mm};
    double macs = 0;
    for (size_t j = 0; j < n_mm; j++) {
        const kl_wmat *w = mm[j].w;
        size_t items = mm[j].n ? (size_t)((w->rows + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM) : 0;
        b.fn[j] = pick_rows(w);
        b.first[j + 1] = b.first[j] + items;
        macs += (double)w->rows * (double)w->cols * (double)mm[j].n;
    }
    size_t items = b.first[n_mm];
    if (!pool || items < 2 || macs < SERIAL_MACS) {
        for (size_t i = 0; i < items; i++)
            batch_item(&b, i);
        return;
    }
    kl_pool_run(pool, items, batch_item, &b);
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                 */

kl_wmat kl_wmat_rows(const kl_wmat *w, uint64_t r0, uint64_t n)
{
    kl_wmat v = *w;
    v.rows = n;
    if (!w->data && !w->packed)   /* a shape without payload (a model opened vectors_only) */
        return v;
    switch (w->kind) {
    case KL_W_F32: v.data = (const float *)w->data + r0 * w->cols; break;
    case KL_W_BF16: v.data = (const uint16_t *)w->data + r0 * w->cols; break;
    case KL_W_MXFP4:
        v.packed = w->packed + r0 * (w->cols / 2);
        v.scale = w->scale + r0 * (w->cols / KL_MXFP4_BLOCK);
        break;
    default: break;
    }
    return v;
}

uint64_t kl_wmat_bytes(const kl_wmat *w)
{
    switch (w->kind) {
    case KL_W_F32: return w->rows * w->cols * 4;
    case KL_W_BF16: return w->rows * w->cols * 2;
    case KL_W_MXFP4: return w->rows * (w->cols / 2 + w->cols / KL_MXFP4_BLOCK);
    default: return 0;
    }
}

kl_cpu_kernels kl_matvec_kernels(void)
{
    return current();
}

kl_cpu_kernels kl_matvec_set_kernels(kl_cpu_kernels want)
{
    kl_cpu_kernels k = resolve(want);
    atomic_store_explicit(&g_kernels, (int)k, memory_order_relaxed);
    return k;
}

const char *kl_matvec_kernels_name(kl_cpu_kernels k)
{
    return k == KL_KERNELS_AVX2 ? "avx2" : "scalar";
}

void kl_wmat_row_f32(const kl_wmat *w, uint64_t r, float *out)
{
    uint64_t n = w->cols;
    switch (w->kind) {
    case KL_W_F32:
        memcpy(out, (const float *)w->data + r * n, n * sizeof *out);
        break;
    case KL_W_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + r * n;
#if KL_MATVEC_X86
        if (current() == KL_KERNELS_AVX2) {
            row_bf16_avx2(p, n, out);
            break;
        }
#endif
        for (uint64_t c = 0; c < n; c++)
            out[c] = kl_bf16_to_f32(p[c]);
        break;
    }
    case KL_W_MXFP4:
        kl_mxfp4_dequantize_row(w->packed + r * (n / 2), w->scale + r * (n / KL_MXFP4_BLOCK), n,
                                out);
        break;
    default:
        memset(out, 0, n * sizeof *out);
    }
}

float kl_wmat_dot(const kl_wmat *w, uint64_t r, const float *x)
{
    float y = 0.0f;
    mm_args a = {w, x, 1, &y, 1};
    pick_rows(w)(&a, r, r + 1);
    return y;
}

void kl_wmat_matvec(const kl_wmat *w, const float *x, float *y, kl_pool *pool)
{
    kl_wmat_matmul(w, x, 1, y, pool);
}

void kl_wmat_matmul(const kl_wmat *w, const float *x, size_t n, float *y, kl_pool *pool)
{
    kl_matmul mm = {w, x, n, y};
    run_batch(&mm, 1, pool);
}

void kl_wmat_matmul_batch(const kl_matmul *mm, size_t n_mm, kl_pool *pool)
{
    for (size_t i = 0; i < n_mm; i += BATCH_MAX)
        run_batch(mm + i, n_mm - i < BATCH_MAX ? n_mm - i : BATCH_MAX, pool);
}

float kl_vec_dot(const float *a, const float *b, size_t n)
{
#if KL_MATVEC_X86
    if (current() == KL_KERNELS_AVX2)
        return vdot_avx2(a, b, n);
#endif
    return vdot_scalar(a, b, n);
}

void kl_vec_axpy(float *y, float a, const float *x, size_t n)
{
#if KL_MATVEC_X86
    if (current() == KL_KERNELS_AVX2) {
        axpy_avx2(y, a, x, n);
        return;
    }
#endif
    axpy_scalar(y, a, x, n);
}

void kl_vec_scale_axpy(float *x, float s, float *y, float a, size_t n)
{
#if KL_MATVEC_X86
    if (current() == KL_KERNELS_AVX2) {
        scale_axpy_avx2(x, s, y, a, n);
        return;
    }
#endif
    scale_axpy_scalar(x, s, y, a, n);
}

void kl_vec_axpy_axpy(float *x, float a, const float *u, float *y, float b, size_t n)
{
#if KL_MATVEC_X86
    if (current() == KL_KERNELS_AVX2) {
        axpy_axpy_avx2(x, a, u, y, b, n);
        return;
    }
#endif
    axpy_axpy_scalar(x, a, u, y, b, n);
}

void kl_vec_dot_rows(const float *a, const float *rows, size_t ld, size_t n_rows, size_t n,
                     float *out)
{
#if KL_MATVEC_X86
    if (current() == KL_KERNELS_AVX2) {
        dot_rows_avx2(a, rows, ld, n_rows, n, out);
        return;
    }
#endif
    dot_rows_scalar(a, rows, ld, n_rows, n, out);
}

void kl_vec_axpy_rows(float *y, const float *a, const float *rows, size_t ld, size_t n_rows,
                      size_t n)
{
#if KL_MATVEC_X86
    if (current() == KL_KERNELS_AVX2) {
        axpy_rows_avx2(y, a, rows, ld, n_rows, n);
        return;
    }
#endif
    axpy_rows_scalar(y, a, rows, ld, n_rows, n);
}

void kl_vec_scale_axpy_rows(float *x, size_t ld, const float *s, float *y, const float *a,
                            size_t n_rows, size_t n)
{
#if KL_MATVEC_X86
    if (current() == KL_KERNELS_AVX2) {
        scale_axpy_rows_avx2(x, ld, s, y, a, n_rows, n);
        return;
    }
#endif
    scale_axpy_rows_scalar(x, ld, s, y, a, n_rows, n);
}

void kl_vec_axpy_axpy_rows(float *x, size_t ld, const float *a, const float *u, float *y,
                           const float *b, size_t n_rows, size_t n)
{
#if KL_MATVEC_X86
    if (current() == KL_KERNELS_AVX2) {
        axpy_axpy_rows_avx2(x, ld, a, u, y, b, n_rows, n);
        return;
    }
#endif
    axpy_axpy_rows_scalar(x, ld, a, u, y, b, n_rows, n);
}

/* The activations on the scalar set: libm, one element at a time. */
static void act_scalar(act_kind kind, float *x, const float *y, float s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
        case ACT_SILU: x[i] = silu_scalar(x[i]); break;
        case ACT_SILU_MUL: x[i] = silu_scalar(x[i]) * y[i]; break;
        case ACT_SIGMOID: x[i] = sigmoid_scalar(x[i]); break;
        case ACT_EXP_SHIFT: x[i] = expf(x[i] - s); break;
        default: x[i] = expf(s * softplus_scalar(x[i] + y[i])); break;
        }
    }
}

static void act(act_kind kind, float *x, const float *y, float s, size_t n)
{
#if KL_MATVEC_X86
    if (current() == KL_KERNELS_AVX2) {
        act_args a = {kind, y, s};
        act_avx2(&a, x, n);
        return;
    }
#endif
    act_scalar(kind, x, y, s, n);
}

void kl_vec_silu(float *x, size_t n)
{
    act(ACT_SILU, x, NULL, 0.0f, n);
}

void kl_vec_silu_mul(float *x, const float *y, size_t n)
{
    act(ACT_SILU_MUL, x, y, 0.0f, n);
}

void kl_vec_sigmoid(float *x, size_t n)
{
    act(ACT_SIGMOID, x, NULL, 0.0f, n);
}

void kl_vec_exp_shift(float *x, float shift, size_t n)
{
    act(ACT_EXP_SHIFT, x, NULL, shift, n);
}

void kl_vec_exp_softplus(float *x, const float *bias, float s, size_t n)
{
    act(ACT_EXP_SOFTPLUS, x, bias, s, n);
}
