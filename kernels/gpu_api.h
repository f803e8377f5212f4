/*
 * kernels/gpu_api.h — the types every kernel launcher's C interface shares.  Plain C, no GPU
 * runtime header: engine/ includes this (and the launchers' headers), never kernels/gpu.h.
 *
 * Conventions of every launcher (kl_gpu_*): all data pointers are device memory unless a
 * comment says host; sizes are element counts; the launcher checks its arguments (KL_E_USAGE),
 * enqueues its kernels on the stream (NULL: the default stream) and returns without waiting;
 * launch failures are KL_E_GPU.  Results are deterministic: the same inputs give the same bits
 * (no floating-point atomics), though not the CPU engine's bits (other summation orders).
 */
#ifndef KL_KERNELS_GPU_API_H
#define KL_KERNELS_GPU_API_H

#include "common/err.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kl_gpu_stream_s *kl_gpu_stream; /* a hipStream_t / cudaStream_t */

/* How a weight matrix is stored on the device (the same forms as the CPU engine's kl_wmat). */
typedef enum kl_gpu_wkind {
    KL_GPU_W_NONE = 0,
    KL_GPU_W_F32,    /* data: [rows, cols] fp32 row-major */
    KL_GPU_W_BF16,   /* data: [rows, cols] bf16 (uint16 bit patterns) row-major */
    KL_GPU_W_MXFP4,  /* packed: [rows, cols/2] E2M1 pairs, low nibble first;
                        scale: [rows, cols/32] E8M0 (kl convert's layout, cols % 32 == 0) */
} kl_gpu_wkind;

/* One weight matrix [rows, cols] in device memory (16-byte aligned payloads). */
typedef struct kl_gpu_mat {
    kl_gpu_wkind   kind;
    uint32_t       rows, cols;
    const void    *data;
    const uint8_t *packed;
    const uint8_t *scale;
} kl_gpu_mat;

/* E matrices of one shape stacked (a layer's routed experts of one role: w1, w2 or w3):
 * expert e's matrix starts at row e * rows of the stacked payloads. */
typedef struct kl_gpu_stack {
    kl_gpu_mat     m;         /* rows, cols: one expert's; payload pointers: expert 0's */
    uint32_t       n;         /* experts */
} kl_gpu_stack;

/* The tokens of one chunk, grouped in runs of one sequence each (engine/backend.h): run r is
 * tokens [start[r], start[r+1]) of slot slot[r], the first at position pos0[r].  Device copies
 * of every array, plus the host counts the launchers size their grids by. */
typedef struct kl_gpu_tokens {
    uint32_t        n;         /* tokens */
    uint32_t        n_runs;
    uint32_t        max_run;   /* host: the longest run */
    uint32_t        max_span;  /* host: the largest position + 1 of any token */
    const uint32_t *tok_slot;  /* [n] slot of each token */
    const uint32_t *tok_pos;   /* [n] position of each token in its sequence */
    const uint32_t *run_start; /* [n_runs + 1] */
    const uint32_t *run_slot;  /* [n_runs] */
} kl_gpu_tokens;

#ifdef __cplusplus
}
#endif

#endif
