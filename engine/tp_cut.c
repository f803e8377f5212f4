/*
 * engine/tp_cut.c — rank r's cut of a weight matrix (engine/tp_cut.h).
 */
#include "engine/tp_cut.h"

#include "common/mem.h"
#include "common/mxfp4_format.h"

#include <string.h>

/* Columns [c0, c0 + n) of w (n > 0; MXFP4: whole 32-value blocks) as a matrix of its own, its
 * payload in *buf: 0 or KL_E_NOMEM. */
static int cols_copy(const kl_wmat *w, uint64_t c0, uint64_t n, kl_wmat *out, void **buf)
{
    const uint64_t B = KL_MXFP4_BLOCK, rows = w->rows;
    *out = *w;
    out->cols = n;
    if (w->kind == KL_W_MXFP4) {
        uint8_t *p = kl_malloc(rows * (n / 2 + n / B));
        if (!(*buf = p))
            return KL_E_NOMEM;
        for (uint64_t r = 0; r < rows; r++) {
            memcpy(p + r * (n / 2), w->packed + r * (w->cols / 2) + c0 / 2, n / 2);
            memcpy(p + rows * (n / 2) + r * (n / B), w->scale + r * (w->cols / B) + c0 / B, n / B);
        }
        out->packed = p;
        out->scale = p + rows * (n / 2);
        return 0;
    }
    size_t es = w->kind == KL_W_F32 ? 4 : 2;
    uint8_t *p = kl_malloc(rows * n * es);
    if (!(*buf = p))
        return KL_E_NOMEM;
    for (uint64_t r = 0; r < rows; r++)
        memcpy(p + r * n * es, (const uint8_t *)w->data + (r * w->cols + c0) * es, n * es);
    out->data = p;
    return 0;
}

int kl_tp_cut(const kl_wmat *w, kl_tp_split s, unsigned tp, unsigned r, uint32_t expert,
              uint32_t n_experts, kl_wmat *out, void **copy, kl_err *err)
{
    uint64_t start, len;
    *out = *w;
    *copy = NULL;
    if (w->kind == KL_W_NONE || tp <= 1 || s.kind == KL_TP_WHOLE)
        return 0;
    if (s.kind == KL_TP_OWNER) {
        if (kl_tp_expert_owner(expert, n_experts, tp) != r)
            *out = (kl_wmat){.kind = KL_W_NONE};
        return 0;
    }
    if (s.kind == KL_TP_OUT) {
        kl_tp_part(w->rows, tp, r, &start, &len);
        *out = kl_wmat_rows(w, start, len);
        return 0;
    }
    kl_tp_part(w->cols, tp, r, &start, &len);
    const int blocks = w->kind != KL_W_MXFP4 || (start % KL_MXFP4_BLOCK == 0 &&
                                                  len % KL_MXFP4_BLOCK == 0);
    int rc = !blocks ? -1 : w->data || w->packed ? cols_copy(w, start, len, out, copy) : 0;
    if (!rc && !w->data && !w->packed)   /* a shape alone: nothing to copy */
        out->cols = len;
    if (rc < 0)
        return kl_fail(err, KL_E_UNSUPPORTED, "an MXFP4 matrix of %llu columns does not cut "
                       "into %u parts of whole 32-value blocks", (unsigned long long)w->cols, tp);
    if (rc)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the tensor-parallel cuts");
    return 0;
}
