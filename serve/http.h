/*
 * serve/http.h — the OpenAI-compatible HTTP front of `kl serve` (libmicrohttpd), over the
 * engine thread (serve/engine.h).
 *
 * Threads: one thread per connection (MHD_USE_THREAD_PER_CONNECTION).  A handler blocks on its
 * job's channel while the engine works: per-connection threads make that wait plain (no
 * suspend/resume dance), cost nothing but a stack while the engine thread does the compute, and
 * a slow client stalls only its own thread.  Connections are capped (max_conns).
 *
 * Routes: GET /health (no key needed), GET /v1/models, POST
 * /v1/chat/completions (serve/request.h; stream or not), GET /metrics (Prometheus text).  Every
 * /v1 route wants "Authorization: Bearer KEY" when a key is set (401 otherwise).  Errors are
 * OpenAI error objects {"error": {"message", "type", "param", "code"}}: 400 bad request, 401,
 * 404 unknown route or model, 405, 413 body over max_body, 429 queue full, 500; once stopping
 * (kl_http_quiesce), 503 to every new request on any route.
 * Streams are server-sent events written as the engine produces ids (no whole-reply buffer);
 * while none comes for a second an SSE comment line goes out, so a client that went away is
 * noticed and its job cancelled (its slot freed) within about a second; a client waiting for
 * a whole reply is checked each second the same way (EOF on its socket).
 *
 * Errors: KL_E_IO (the port cannot be opened: in use, bad host), KL_E_USAGE, KL_E_NOMEM.
 * Library code: prints nothing (libmicrohttpd's error log is off).
 */
#ifndef KL_SERVE_HTTP_H
#define KL_SERVE_HTTP_H

#include "common/err.h"
#include "engine/tokenizer.h"
#include "serve/engine.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_http_opts {
    const char *host;          /* numeric address or "localhost"; NULL = 127.0.0.1 */
    uint16_t    port;          /* 0 = any free port (kl_http_port says which) */
    const char *api_key;       /* NULL or "": no key */
    const char *model_name;    /* the one model served (/v1/models, request "model") */
    size_t      max_body;      /* bytes; 0 = 4 MiB */
    size_t      ctx;           /* tokens per sequence, prompt and reply (>= 2) */
    unsigned    max_conns;     /* 0 = 256 */
    unsigned    keepalive_ms;  /* a stream's keep-alive comment after this long without ids;
                                  0 = 1000 */
} kl_http_opts;

typedef struct kl_http kl_http;

/* Opens the port and serves until kl_http_stop.  e and tok are borrowed. */
int      kl_http_start(kl_http **out, kl_engine *e, const kl_tokenizer *tok,
                       const kl_http_opts *o, kl_err *err);
uint16_t kl_http_port(const kl_http *h);
/* Refuses new requests: from now on each one is answered 503 (an OpenAI error object) at once;
 * the port stays open until kl_http_stop, so a client that connects while in-flight requests
 * finish gets that answer, not a wait in the listen queue.  In-flight requests go on. */
void     kl_http_quiesce(kl_http *h);
/* Stops serving (waits for the connection threads) and frees h.  NULL ok. */
void     kl_http_stop(kl_http *h);

#endif
