/*
 * loader/dtype.h — the 22 safetensors dtypes (safetensors 0.8 enum order).
 */
#ifndef KL_LOADER_DTYPE_H
#define KL_LOADER_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum kl_dtype {
    KL_DT_BOOL, KL_DT_F4, KL_DT_F6_E2M3, KL_DT_F6_E3M2, KL_DT_U8, KL_DT_I8, KL_DT_F8_E5M2,
    KL_DT_F8_E4M3, KL_DT_F8_E8M0, KL_DT_F8_E4M3FNUZ, KL_DT_F8_E5M2FNUZ, KL_DT_I16, KL_DT_U16,
    KL_DT_F16, KL_DT_BF16, KL_DT_I32, KL_DT_U32, KL_DT_F32, KL_DT_C64, KL_DT_F64, KL_DT_I64,
    KL_DT_U64,
    KL_DT_COUNT,
    KL_DT_INVALID = -1
} kl_dtype;

#define KL_DT_BIT(d) (1u << (unsigned)(d))
/* Every real floating dtype a float tensor may be stored in (F4/F6/E8M0 excluded). */
#define KL_DT_MASK_FLOAT                                                                      \
    (KL_DT_BIT(KL_DT_F16) | KL_DT_BIT(KL_DT_BF16) | KL_DT_BIT(KL_DT_F32) |                    \
     KL_DT_BIT(KL_DT_F64) | KL_DT_BIT(KL_DT_F8_E4M3) | KL_DT_BIT(KL_DT_F8_E5M2) |             \
     KL_DT_BIT(KL_DT_F8_E4M3FNUZ) | KL_DT_BIT(KL_DT_F8_E5M2FNUZ))

/* "BF16" -> KL_DT_BF16; KL_DT_INVALID for an unknown string.  len = bytes of s to use. */
kl_dtype kl_dtype_parse(const char *s, size_t len);
const char *kl_dtype_name(kl_dtype d);  /* "?" for an invalid value */
unsigned kl_dtype_bits(kl_dtype d);      /* 0 for an invalid value */
int kl_dtype_is_float(kl_dtype d);       /* member of KL_DT_MASK_FLOAT */

#endif
