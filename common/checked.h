/*
 * common/checked.h — overflow-checked size arithmetic for numbers that come from files.
 * Each returns 0 and stores the result, or -1 (and leaves *out unchanged) on overflow.
 */
#ifndef KL_COMMON_CHECKED_H
#define KL_COMMON_CHECKED_H

#include <stdint.h>

static inline int kl_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return -1;
    *out = r;
    return 0;
}

static inline int kl_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return -1;
    *out = r;
    return 0;
}

static inline uint64_t kl_round_up_u64(uint64_t v, uint64_t align)
{
    return (v + align - 1) / align * align;
}

#endif
