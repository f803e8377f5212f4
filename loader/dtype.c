/*
 * loader/dtype.c — the 22 safetensors dtypes (see dtype.h).
 *
 * Divisions: the table, public API.
 */
#include "loader/dtype.h"

#include <stddef.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* The table: strings and bit widths as the safetensors crate's Dtype Display / bitsize().    */

typedef struct dtype_info {
    const char *name;
    unsigned    bits;
} dtype_info;

/* Indexed by kl_dtype; the order is the enum's (increasing alignment, safetensors 0.8). */
static const dtype_info dtypes[KL_DT_COUNT] = {
    [KL_DT_BOOL] = {"BOOL", 8},
    [KL_DT_F4] = {"F4", 4},
    [KL_DT_F6_E2M3] = {"F6_E2M3", 6},
    [KL_DT_F6_E3M2] = {"F6_E3M2", 6},
    [KL_DT_U8] = {"U8", 8},
    [KL_DT_I8] = {"I8", 8},
    [KL_DT_F8_E5M2] = {"F8_E5M2", 8},
    [KL_DT_F8_E4M3] = {"F8_E4M3", 8},
    [KL_DT_F8_E8M0] = {"F8_E8M0", 8},
    [KL_DT_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [KL_DT_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [KL_DT_I16] = {"I16", 16},
    [KL_DT_U16] = {"U16", 16},
    [KL_DT_F16] = {"F16", 16},
    [KL_DT_BF16] = {"BF16", 16},
    [KL_DT_I32] = {"I32", 32},
    [KL_DT_U32] = {"U32", 32},
    [KL_DT_F32] = {"F32", 32},
    [KL_DT_C64] = {"C64", 64},
    [KL_DT_F64] = {"F64", 64},
    [KL_DT_I64] = {"I64", 64},
    [KL_DT_U64] = {"U64", 64},
};

static int valid(kl_dtype d)
{
    return (int)d >= 0 && (int)d < KL_DT_COUNT;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                 */

kl_dtype kl_dtype_parse(const char *s, size_t len)
{
    /* A linear scan over 22 short strings is cheaper than hashing; the length test rejects
     * most candidates before memcmp.  Matching is exact (case-sensitive), as in the crate. */
    if (!s)
        return KL_DT_INVALID;
    for (int d = 0; d < KL_DT_COUNT; d++) {
        const char *name = dtypes[d].name;
        if (strlen(name) == len && memcmp(name, s, len) == 0)
            return (kl_dtype)d;
    }
    return KL_DT_INVALID;
}

const char *kl_dtype_name(kl_dtype d)
{
    return valid(d) ? dtypes[d].name : "?";
}

unsigned kl_dtype_bits(kl_dtype d)
{
    return valid(d) ? dtypes[d].bits : 0;
}

int kl_dtype_is_float(kl_dtype d)
{
    return valid(d) && (KL_DT_MASK_FLOAT & KL_DT_BIT(d)) != 0;
}
