/* common/utf8.c — UTF-8 validity (see utf8.h). */
#include "common/utf8.h"

#include "common/mem.h"

#include <string.h>

size_t kl_utf8_seq(const unsigned char *s, size_t n)
{
    if (!n)
        return 0;
    unsigned char b = s[0];
    size_t len = b < 0x80                 ? 1
                 : b >= 0xc2 && b <= 0xdf ? 2
                 : b >= 0xe0 && b <= 0xef ? 3
                 : b >= 0xf0 && b <= 0xf4 ? 4
                                          : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t k = 1; k < len; k++)
        if ((s[k] & 0xc0) != 0x80)
            return 0;
    if ((b == 0xe0 && s[1] < 0xa0) || (b == 0xed && s[1] > 0x9f) || /* overlong, surrogate */
        (b == 0xf0 && s[1] < 0x90) || (b == 0xf4 && s[1] > 0x8f))   /* overlong, > U+10FFFF */
        return 0;
    return len;
}

char *kl_utf8_sanitize(const char *text, size_t n)
{
    char *out = kl_malloc(n * 3 + 1);
    if (!out)
        return NULL;
    const unsigned char *s = (const unsigned char *)text;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len = kl_utf8_seq(s + i, n - i);
        if (len && s[i] != 0) {
            memcpy(out + o, s + i, len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    out[o] = 0;
    return out;
}
