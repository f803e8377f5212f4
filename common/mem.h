/*
 * common/mem.h — counted host allocations.
 *
 * Every host allocation of kl goes through these wrappers so the bytes in use and the peak are
 * known (peak RSS targets are checked in tests and printed by --stats).  The counters are
 * process-wide atomics; the functions are thread-safe.  kl_free(NULL) is a no-op.
 * Memory from kl_malloc must be released with kl_free (a size header precedes the block).
 * kl_aligned_alloc/kl_aligned_free are the pair for O_DIRECT buffers.
 */
#ifndef KL_COMMON_MEM_H
#define KL_COMMON_MEM_H

#include <stddef.h>
#include <stdint.h>

void *kl_malloc(size_t n);
void *kl_calloc(size_t count, size_t size);  /* NULL on overflow of count * size */
void *kl_realloc(void *p, size_t n);         /* like realloc: on failure p stays valid */
void  kl_free(void *p);
char *kl_strdup(const char *s);
char *kl_strndup(const char *s, size_t n);
void *kl_memdup(const void *p, size_t n);  /* a copy of n bytes (n 0: a non-NULL empty block) */

/* Block aligned to `align` (a power of two >= sizeof(void *)), counted; NULL on failure. */
void *kl_aligned_alloc(size_t align, size_t n);
void  kl_aligned_free(void *p);

size_t kl_mem_in_use(void);  /* bytes currently allocated through these functions */
size_t kl_mem_peak(void);    /* high-water mark of kl_mem_in_use */

#endif
