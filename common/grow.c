/* common/grow.c — doubling array growth with overflow checks (see grow.h). */
#include "common/grow.h"

#include "common/err.h"
#include "common/mem.h"

#include <string.h>

int kl_grow(void *arrp, size_t *capp, size_t need, size_t elem_size)
{
    if (need <= *capp)
        return 0;
    size_t cap = *capp ? *capp : KL_GROW_MIN;
    while (cap < need) {
        if (cap > (size_t)-1 / 2)
            return KL_E_NOMEM;
        cap *= 2;
    }
    size_t bytes;
    if (elem_size == 0 || __builtin_mul_overflow(cap, elem_size, &bytes))
        return KL_E_NOMEM;
    void *old;
    memcpy(&old, arrp, sizeof old); /* arrp points at a pointer of any object type */
    void *p = kl_realloc(old, bytes);
    if (!p)
        return KL_E_NOMEM;
    memcpy(arrp, &p, sizeof p);
    *capp = cap;
    return 0;
}
