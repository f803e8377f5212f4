/*
 * kernels/place.h — pieces placed from a span of a checkpoint file staged whole in device
 * memory (the load's ring copies each filled buffer to the device in one copy, then this puts
 * every tensor's bytes of it where the engine keeps them: one copy a span instead of one a
 * tensor, so the link's copies stay large).
 *
 * A place: width bytes at offset off of the staged span go to dst; with rows > 1, rows such
 * runs pitch bytes apart in the span (a tensor-parallel column cut) packed at dst.  The
 * engine's fill (engine/gpu_plan.h) records them; kl_gpu_place_span reads places[first,
 * first + n) from device memory.  Conventions: kernels/gpu_api.h.
 */
#ifndef KL_KERNELS_PLACE_H
#define KL_KERNELS_PLACE_H

#include "kernels/gpu_api.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kl_gpu_place {
    uint64_t off;        /* in the span */
    void    *dst;
    uint64_t width;      /* bytes a row */
    uint64_t pitch;      /* rows apart in the span (rows > 1) */
    uint64_t rows;       /* >= 1 */
} kl_gpu_place;

int kl_gpu_place_span(const void *span, const kl_gpu_place *places, uint32_t first,
                      uint32_t n, kl_gpu_stream s, kl_err *err);

#ifdef __cplusplus
}
#endif

#endif
