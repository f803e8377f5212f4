/*
 * common/fmt.h — numbers for people: byte counts in binary units.
 */
#ifndef KL_COMMON_FMT_H
#define KL_COMMON_FMT_H

#include <stddef.h>
#include <stdint.h>

/* "512 B", "12.0 KiB", "3.52 MiB", "91.50 GiB", "1.20 TiB" into buf; returns buf. */
char *kl_fmt_bytes(char *buf, size_t n, uint64_t bytes);

#endif
