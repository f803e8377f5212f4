/*
 * common/grow.h — one way to grow an array kept as (pointer, count, capacity).
 *
 * kl_grow(&arr, &cap, need, sizeof *arr) makes room for at least `need` elements: when the
 * capacity is short it doubles it (starting at `KL_GROW_MIN` elements, or `need` if larger),
 * reallocates through kl_realloc and updates *arrp and *capp.  The byte size is checked for
 * overflow.  Returns 0, or KL_E_NOMEM (negative) with *arrp and *capp unchanged, so the old
 * array stays valid and owned by the caller.  Elements past the old capacity are not zeroed.
 *
 *     if (kl_grow(&r->findings, &r->cap_findings, r->n_findings + 1, sizeof *r->findings))
 *         return KL_E_NOMEM;
 *     r->findings[r->n_findings++] = f;
 */
#ifndef KL_COMMON_GROW_H
#define KL_COMMON_GROW_H

#include <stddef.h>

#define KL_GROW_MIN 16

/* arrp is the address of the array pointer (any element type), as `&arr`. */
int kl_grow(void *arrp, size_t *capp, size_t need, size_t elem_size);

#endif
