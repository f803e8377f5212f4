/*
 * kernels/dense.h — the products and elementwise steps of a forward chunk on the GPU:
 * Y = X Wᵀ for every weight kind, embedding rows, residual add + RMSNorm, SiLU gating and the
 * argmax of logits.  Conventions: kernels/gpu_api.h.
 *
 * Products are fp32 in and out, weights in their stored kind; each output element is summed in
 * fp32.  For few tokens (decode: n <= 8) each weight row is read once for all n tokens, which is
 * the byte-bound regime of decode; larger n is still correct (tokens in groups).
 */
#ifndef KL_KERNELS_DENSE_H
#define KL_KERNELS_DENSE_H

#include "kernels/gpu_api.h"
#include "kernels/kda.h" /* kl_gpu_kda_conv_args */
#include "kernels/moe.h" /* kl_gpu_route_args */

#ifdef __cplusplus
extern "C" {
#endif

/* y [n, w->rows] = x [n, w->cols] Wᵀ (row-major, leading dimensions cols and rows); for
 * 2 <= n < KL_GPU_GEMM_MIN_N by kl_gpu_skinny (skinny.h) where kl_gpu_skinny_takes. */
int kl_gpu_matmul(const kl_gpu_mat *w, const float *x, uint32_t n, float *y, kl_gpu_stream s,
                  kl_err *err);

/* Kernel versions kept side by side, chosen by an environment variable of value "vN", read
 * once per process (anything else: the newest): KL_GPU_MX (MXFP4 at n = 1: kl_gpu_matmul,
 * kl_gpu_experts; 1 or 2), KL_GPU_BF16 (BF16 at n = 1: kl_gpu_matmul and the fused forms;
 * 3 streams rows through shared memory where the device has room (plain products and the
 * norm inside; riders, gating and pairs take 2), 2 or 1), KL_GPU_ARGMAX (kl_gpu_argmax; 1
 * or 2).  kl_gpu_version_set overrides the environment (the device tests run each). */
typedef enum kl_gpu_kernels { KL_GPU_K_MX, KL_GPU_K_BF16, KL_GPU_K_ARGMAX } kl_gpu_kernels;

int  kl_gpu_version(kl_gpu_kernels which);
void kl_gpu_version_set(kl_gpu_kernels which, int version);

/* x [n, table->cols] = rows ids[0..n) of table (F32 or BF16), as fp32; the table holds the
 * vocabulary rows [row0, row0 + table->rows) (row0 0: all of them).  An id outside: zeros
 * when part (a tensor-parallel rank's vocabulary part: the ranks' rows are summed after), else
 * NaN (visible). */
int kl_gpu_embed(const kl_gpu_mat *table, uint32_t row0, int part, const uint32_t *ids,
                 uint32_t n, float *x, kl_gpu_stream s, kl_err *err);

/* For each of n rows of width h: x += y (skipped when y is NULL), then
 * xn = w ⊙ x · 1/sqrt(mean(x²) + eps) (w [h] fp32).  xn may not alias x. */
int kl_gpu_add_rmsnorm(float *x, const float *y, const float *w, uint32_t n, uint32_t h,
                       float eps, float *xn, kl_gpu_stream s, kl_err *err);

/* kl_gpu_add_rmsnorm adding the sum of ny buffers (0 .. KL_GPU_SUM_MAX, each [n, h] on this
 * device): x += ((y[0] + y[1]) + ... + y[ny-1]), bit for bit what summing them first with
 * kl_gpu_add in that order and then adding would give — the tensor-parallel ranks' partial
 * block outputs summed inside the next norm, one launch instead of 2 (ny - 1) + 1. */
#define KL_GPU_SUM_MAX 8
int kl_gpu_sum_add_rmsnorm(float *x, const float *const *y, unsigned ny, const float *w,
                           uint32_t n, uint32_t h, float eps, float *xn, kl_gpu_stream s,
                           kl_err *err);

/* Two independent products, ya = xa Waᵀ and yb = xb Wbᵀ (n tokens each): one launch where
 * both take the one-token BF16 kernel with the same layout (KDA's f_b and g_b), else two
 * kl_gpu_matmul calls. */
int kl_gpu_matmul_pair(const kl_gpu_mat *wa, const float *xa, float *ya, const kl_gpu_mat *wb,
                       const float *xb, float *yb, uint32_t n, kl_gpu_stream s, kl_err *err);

/* y [n, w->rows] = (SiLU(a) ⊙ b) Wᵀ for a, b [n, w->cols]: the end of a gated MLP.  One
 * launch where the one-token BF16 kernel applies (the gating made as x is staged); otherwise
 * a is overwritten with SiLU(a) ⊙ b and kl_gpu_matmul runs. */
int kl_gpu_matmul_glu(const kl_gpu_mat *w, float *a, const float *b, uint32_t n, float *y,
                      kl_gpu_stream s, kl_err *err);

/* Riders: a small job independent of a one-token product, done by groups of 32 lanes in
 * blocks ahead of the product's in its launch.  At decode that saves the job's own launch and
 * its wait on the critical path; otherwise (or when the product takes another kernel) the
 * job gets its own launch first.  Either way the same outputs as the separate calls.
 *
 * kl_gpu_route (kernels/moe.h) of route->n tokens with kl_gpu_matmul_glu: rides when the
 * scores fit in registers (E <= 256), as the router with the shared expert's down product. */
int kl_gpu_matmul_glu_route(const kl_gpu_mat *w, float *a, const float *b, uint32_t n,
                            float *y, const kl_gpu_route_args *route, kl_gpu_stream s,
                            kl_err *err);

/* kl_gpu_kda_conv (kernels/kda.h) with kl_gpu_matmul_pair of t->n tokens: rides when every
 * run is one token, as KDA's conv with its two low-rank gate expansions. */
int kl_gpu_matmul_pair_conv(const kl_gpu_mat *wa, const float *xa, float *ya,
                            const kl_gpu_mat *wb, const float *xb, float *yb,
                            const kl_gpu_kda_conv_args *conv, const kl_gpu_tokens *t,
                            kl_gpu_stream s, kl_err *err);

/* One token: y = xn Wᵀ with xn = nw ⊙ rmsnorm(x + r) made inside the product's launch (the
 * residual add and norm of kl_gpu_add_rmsnorm, h = w->cols floats; every block stages it, so
 * the norm's own launch and its wait leave the decode step's critical path); x + r is also
 * written to x_out (which must not alias x: every block reads x) and xn to xn_out for the
 * kernels after.  Only where kl_gpu_matmul_norm_takes (the one-token BF16 kernel, 16-byte
 * aligned vectors); the sums of the norm in another order than kl_gpu_add_rmsnorm's (~1 ulp). */
int kl_gpu_matmul_norm_takes(const kl_gpu_mat *w, const float *x, const float *r,
                             const float *nw, float *x_out, float *xn_out);
int kl_gpu_matmul_norm(const kl_gpu_mat *w, const float *x, const float *r, const float *nw,
                       float eps, float *x_out, float *xn_out, float *y, kl_gpu_stream s,
                       kl_err *err);

/* Two dependent one-token products in one launch: ya = Wa xa, then v = r + ya (written to
 * x_out), xn = nw ⊙ v / rms(v) (to xn_out), yb = Wb xn: a block's output product, its residual
 * add and norm, and the next block's first product (version 3 of the one-token BF16 kernel:
 * its blocks, one an SM, meet at a grid-wide barrier between the two, and Wb's first stages
 * stream in while the first product finishes).  Only where kl_gpu_matmul_chain_takes (version
 * 3 takes both, wa->rows == wb->cols, the vectors 16-byte aligned, x_out not r); one launch
 * on a device at a time (its barrier's counter is the device's).  yb equals
 * kl_gpu_matmul_norm(wb, r, ya, ...) after kl_gpu_matmul(wa, xa) to the bit. */
int kl_gpu_matmul_chain_takes(const kl_gpu_mat *wa, const float *xa, const kl_gpu_mat *wb,
                              const float *r, const float *nw, float *x_out, float *xn_out);
int kl_gpu_matmul_chain(const kl_gpu_mat *wa, const float *xa, float *ya, const float *r,
                        const float *nw, float eps, float *x_out, float *xn_out,
                        const kl_gpu_mat *wb, float *yb, kl_gpu_stream s, kl_err *err);

/* x[i] += y[i] for i < count (fp32, one rounding: what a host loop adds). */
int kl_gpu_add(float *x, const float *y, size_t count, kl_gpu_stream s, kl_err *err);

/* a[i] = SiLU(a[i]) · b[i] for i < count. */
int kl_gpu_silu_mul(float *a, const float *b, size_t count, kl_gpu_stream s, kl_err *err);

/* out[t] = the index of the largest of logits[t][0..vocab) (ties: the lowest index), t < n. */
int kl_gpu_argmax(const float *logits, uint32_t n, uint32_t vocab, uint32_t *out,
                  kl_gpu_stream s, kl_err *err);

#ifdef __cplusplus
}
#endif

#endif
