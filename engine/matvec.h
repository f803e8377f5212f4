/*
 * engine/matvec.h — weight matrices in their stored form and the CPU kernels that multiply
 * them with fp32 activations: row dots, matrix x vector, matrix x token-chunk, plus the few
 * fp32 vector primitives the attention recurrences use.
 *
 * Weight kinds (kl_wmat): F32 and BF16 row-major [rows, cols]; MXFP4 as packed E2M1 codes
 * [rows, cols/2] (element 2i in the low nibble) plus one E8M0 scale byte per 32 elements,
 * value = E2M1(code) * 2^(byte - 127) (convert/mxfp4.h).
 *
 * Kernels: a scalar reference and an AVX2/FMA set, picked at run time: AVX2 when the CPU has
 * AVX2 and FMA, unless the environment holds KL_CPU_KERNELS=scalar (read at the first use) or
 * kl_matvec_set_kernels() forced a set.  The two sets agree to fp32 rounding (they sum in
 * different orders), not bit for bit.
 *
 * Order of summation (the contract the forward pass builds on): within one kernel set, the
 * value of row r against vector x is computed by one thread in a fixed order that depends only
 * on the row's length, never on the thread count, on which other rows or how many vectors are
 * processed in the same call.  So kl_wmat_dot, kl_wmat_matvec and every token of
 * kl_wmat_matmul give bit-identical results for the same row and vector, and a prompt fed in
 * any split gives identical logits.  AVX2, F32/BF16: four 8-lane FMA chains, 8-column chunk c
 * feeding chain c mod 4 (a last partial chunk zero-padded), summed (c0 + c1) + (c2 + c3);
 * MXFP4: per 32-column block, two 8-lane partial products summed, then times the block scale
 * into one 8-lane accumulator (fused); then the 8 lanes in a fixed tree.  Scalar: column order.
 * The vector primitives follow the same rule (their order depends only on n).
 *
 * Ownership: kl_wmat only borrows its payloads (engine/model.h owns them).  Thread safety: all
 * functions are thread-safe; kl_matvec_set_kernels must not race with running kernels (call it
 * between forward passes).
 */
#ifndef KL_ENGINE_MATVEC_H
#define KL_ENGINE_MATVEC_H

#include "common/pool.h"
#include "loader/arena.h"

#include <stddef.h>
#include <stdint.h>

/* ---- weight matrices ---------------------------------------------------------------------- */

/* kl_wkind (KL_W_NONE, F32, BF16, MXFP4): loader/arena.h, shared with the GPU layout. */

/* One weight matrix [rows, cols] in its stored form (a vector is rows = 1). */
typedef struct kl_wmat {
    kl_wkind       kind;
    uint64_t       rows, cols;
    const void    *data;       /* F32 / BF16: [rows, cols] row-major */
    const uint8_t *packed;     /* MXFP4: [rows, cols/2] u8, element 2i in the low nibble */
    const uint8_t *scale;      /* MXFP4: [rows, cols/32] E8M0 bytes */
} kl_wmat;

/* Rows [r0, r0 + n) of w as a matrix of its own (borrowing w's payload; a shape alone when w
 * has none); r0 + n <= w->rows. */
kl_wmat  kl_wmat_rows(const kl_wmat *w, uint64_t r0, uint64_t n);
/* Payload bytes of w as stored (MXFP4: packed codes plus scales). */
uint64_t kl_wmat_bytes(const kl_wmat *w);

/* ---- kernel selection --------------------------------------------------------------------- */

typedef enum kl_cpu_kernels {
    KL_KERNELS_AUTO = -1,   /* AVX2 if the CPU has it, unless KL_CPU_KERNELS=scalar */
    KL_KERNELS_SCALAR = 0,
    KL_KERNELS_AVX2 = 1,
} kl_cpu_kernels;

/* The set in use (never KL_KERNELS_AUTO). */
kl_cpu_kernels kl_matvec_kernels(void);
/* Selects a set for the whole process and returns the one now in use: asking for AVX2 on a CPU
 * without AVX2 and FMA gives scalar; AUTO re-reads the environment. */
kl_cpu_kernels kl_matvec_set_kernels(kl_cpu_kernels want);
/* "scalar" or "avx2". */
const char    *kl_matvec_kernels_name(kl_cpu_kernels k);

/* ---- products ----------------------------------------------------------------------------- */

/* Row r of w as fp32 into out[w->cols] (exact: every stored value is an fp32). */
void  kl_wmat_row_f32(const kl_wmat *w, uint64_t r, float *out);
/* Σ_c w[r][c] · x[c] in fp32, in the fixed order of the kernel set in use. */
float kl_wmat_dot(const kl_wmat *w, uint64_t r, const float *x);
/* y[rows] = W x; rows split over the pool (NULL: serial). */
void  kl_wmat_matvec(const kl_wmat *w, const float *x, float *y, kl_pool *pool);
/* Y = X Wᵀ for n vectors: x [n, cols] row-major, y [n, rows] row-major.  Each weight row is
 * read once per call for all n vectors; rows are split over the pool (NULL: serial).  Every
 * y[t][r] equals kl_wmat_dot(w, r, x + t * cols) bit for bit. */
void  kl_wmat_matmul(const kl_wmat *w, const float *x, size_t n, float *y, kl_pool *pool);

/* One product of a batch: y [n, w->rows] = x [n, w->cols] Wᵀ. */
typedef struct kl_matmul {
    const kl_wmat *w;
    const float   *x;
    size_t         n;
    float         *y;
} kl_matmul;

/* Runs the products mm[0..n_mm) (independent: no y may overlap another's x or y) in one pass
 * over the pool per 64 products: the rows of all of them are split together, so small
 * matrices do not each pay for waking the pool.  Each result is that of kl_wmat_matmul. */
void  kl_wmat_matmul_batch(const kl_matmul *mm, size_t n_mm, kl_pool *pool);

/* ---- fp32 vector primitives (same kernel set; fixed order for a given n) ------------------ */

/* Σ a[i] · b[i] */
float kl_vec_dot(const float *a, const float *b, size_t n);
/* y += a · x */
void  kl_vec_axpy(float *y, float a, const float *x, size_t n);
/* x *= s, then y += a · x (with the scaled x) */
void  kl_vec_scale_axpy(float *x, float s, float *y, float a, size_t n);
/* x += a · u, then y += b · x (with the updated x) */
void  kl_vec_axpy_axpy(float *x, float a, const float *u, float *y, float b, size_t n);

/* The same primitives over n_rows rows of n floats, row r at rows + r * ld (attention over a
 * cache, the delta rule over a state).  Each equals the loop of one call per row, in row order,
 * bit for bit; they only share loads: several rows' chains run side by side (dot), and y's
 * chunk stays in a register across a group of rows (the others). */
/* out[r] = kl_vec_dot(a, rows_r, n) */
void  kl_vec_dot_rows(const float *a, const float *rows, size_t ld, size_t n_rows, size_t n,
                      float *out);
/* for r in order: kl_vec_axpy(y, a[r], rows_r, n) */
void  kl_vec_axpy_rows(float *y, const float *a, const float *rows, size_t ld, size_t n_rows,
                       size_t n);
/* for r in order: kl_vec_scale_axpy(x_r, s[r], y, a[r], n), x_r = x + r * ld */
void  kl_vec_scale_axpy_rows(float *x, size_t ld, const float *s, float *y, const float *a,
                             size_t n_rows, size_t n);
/* for r in order: kl_vec_axpy_axpy(x_r, a[r], u, y, b[r], n), x_r = x + r * ld */
void  kl_vec_axpy_axpy_rows(float *x, size_t ld, const float *a, const float *u, float *y,
                            const float *b, size_t n_rows, size_t n);

/* ---- elementwise activations, in place (fp32) ---------------------------------------------- */

/* The scalar set evaluates them with libm (expf, log1pf) as written; the AVX2 set 8 lanes at a
 * time with polynomial exp and log (Cephes' coefficients, within a few ulp of libm: the sets
 * differ, each is deterministic and its result for an element depends only on that element).
 * There exp(z) saturates near 2^127 for z above 88 and is 0 for z below -87.3 (libm's
 * denormals down to -103.9 would make every later product with them slow). */
/* x = x / (1 + exp(-x)) */
void  kl_vec_silu(float *x, size_t n);
/* x = silu(x) · y */
void  kl_vec_silu_mul(float *x, const float *y, size_t n);
/* x = 1 / (1 + exp(-x)) */
void  kl_vec_sigmoid(float *x, size_t n);
/* x = exp(x - shift) (softmax numerators) */
void  kl_vec_exp_shift(float *x, float shift, size_t n);
/* x = exp(s · softplus(x + bias)), softplus(z) = log(1 + exp(z)), z above 20 giving z (the KDA
 * forget gate's decay factors) */
void  kl_vec_exp_softplus(float *x, const float *bias, float s, size_t n);

#endif
