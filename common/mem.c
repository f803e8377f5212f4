/* common/mem.c — counted allocations (see mem.h). */
#include "common/mem.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* 16-byte header keeps the returned pointer aligned for any scalar type. */
#define HDR 16

static atomic_size_t in_use;
static atomic_size_t peak;

static void count_add(size_t n)
{
    size_t now = atomic_fetch_add(&in_use, n) + n;
    size_t p = atomic_load(&peak);
    while (now > p && !atomic_compare_exchange_weak(&peak, &p, now))
        ;
}

void *kl_malloc(size_t n)
{
    if (n > SIZE_MAX - HDR)
        return NULL;
    unsigned char *b = malloc(n + HDR);
    if (!b)
        return NULL;
    memcpy(b, &n, sizeof n);
    count_add(n);
    return b + HDR;
}

void *kl_calloc(size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    void *p = kl_malloc(count * size);
    if (p)
        memset(p, 0, count * size);
    return p;
}

void *kl_realloc(void *p, size_t n)
{
    if (!p)
        return kl_malloc(n);
    if (n > SIZE_MAX - HDR)
        return NULL;
    unsigned char *b = (unsigned char *)p - HDR;
    size_t old;
    memcpy(&old, b, sizeof old);
    unsigned char *nb = realloc(b, n + HDR);
    if (!nb)
        return NULL;
    memcpy(nb, &n, sizeof n);
    atomic_fetch_sub(&in_use, old);
    count_add(n);
    return nb + HDR;
}

void kl_free(void *p)
{
    if (!p)
        return;
    unsigned char *b = (unsigned char *)p - HDR;
    size_t n;
    memcpy(&n, b, sizeof n);
    atomic_fetch_sub(&in_use, n);
    free(b);
}

char *kl_strndup(const char *s, size_t n)
{
    char *d = kl_malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

void *kl_memdup(const void *p, size_t n)
{
    void *d = kl_malloc(n ? n : 1);
    if (d && n)
        memcpy(d, p, n);
    return d;
}

char *kl_strdup(const char *s)
{
    return kl_strndup(s, strlen(s));
}

void *kl_aligned_alloc(size_t align, size_t n)
{
    /* Store the size just before the aligned block: allocate one extra alignment unit. */
    if (align < HDR || (align & (align - 1)) || n > SIZE_MAX - align)
        return NULL;
    void *raw = NULL;
    if (posix_memalign(&raw, align, n + align))
        return NULL;
    unsigned char *p = (unsigned char *)raw + align;
    memcpy(p - HDR, &n, sizeof n);
    memcpy(p - HDR + sizeof n, &align, sizeof align);
    count_add(n);
    return p;
}

void kl_aligned_free(void *p)
{
    if (!p)
        return;
    size_t n, align;
    memcpy(&n, (unsigned char *)p - HDR, sizeof n);
    memcpy(&align, (unsigned char *)p - HDR + sizeof n, sizeof align);
    atomic_fetch_sub(&in_use, n);
    free((unsigned char *)p - align);
}

size_t kl_mem_in_use(void) { return atomic_load(&in_use); }
size_t kl_mem_peak(void) { return atomic_load(&peak); }
