/*
 * common/log.h — leveled logging to stderr.
 *
 * Library code never prints to stdout; it logs here.  The CLI sets the level (-q keeps errors,
 * -v adds debug).  Thread-safe: each message is written with one fprintf call.
 */
#ifndef KL_COMMON_LOG_H
#define KL_COMMON_LOG_H

#include "common/err.h"

typedef enum { KL_LOG_ERROR = 0, KL_LOG_WARN = 1, KL_LOG_INFO = 2, KL_LOG_DEBUG = 3 } kl_log_level;

void kl_log_set_level(kl_log_level level);
kl_log_level kl_log_get_level(void);
void kl_log(kl_log_level level, const char *fmt, ...) KL_PRINTF(2, 3);

#endif
