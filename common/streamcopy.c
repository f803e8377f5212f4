/* common/streamcopy.c — copies with non-temporal stores (see streamcopy.h). */
#include "common/streamcopy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>

/* Below this the copy stays in the caches anyway: plain memcpy. */
#define STREAM_MIN 4096u

void kl_copy_streaming(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (n < STREAM_MIN) {
        memcpy(d, s, n);
        return;
    }
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;   /* up to dst's first 16-byte boundary */
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {   /* a 64-byte line an iteration */
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence();   /* non-temporal stores are weakly ordered: publish them before returning */
    memcpy(d + i, s + i, n - i);
}

#else

void kl_copy_streaming(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}

#endif
