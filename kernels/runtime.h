/*
 * kernels/runtime.h — the GPU runtime as engine/ and cli/ see it: devices, memory, copies,
 * streams, timing and graphs, behind plain C names (no runtime header needed to include this).
 * Conventions: kernels/gpu_api.h (0 or a KL_E_GPU / KL_E_NOMEM error with the runtime's
 * message).  In a build without GPU support (no GPU=cuda|hip) none of this is linked: callers
 * are compiled only under KL_GPU.
 */
#ifndef KL_KERNELS_RUNTIME_H
#define KL_KERNELS_RUNTIME_H

#include "kernels/gpu_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kl_gpu_graph_s *kl_gpu_graph;   /* an instantiated (executable) graph */

/* Devices visible to this process (0 when there is no driver or no device: not an error). */
int  kl_gpu_device_count(void);
/* Makes dev current for this thread; name (may be NULL) receives its name. */
int  kl_gpu_device_open(int dev, char *name, size_t name_len, kl_err *err);
int  kl_gpu_mem_info(size_t *free_bytes, size_t *total_bytes, kl_err *err);
/* The current device's multiprocessors and the shared memory a block may opt in to, read once
 * per process (132 and 227 KiB, an H200's, where the runtime does not say). */
unsigned kl_gpu_sm_count(void);
size_t   kl_gpu_shared_optin(void);

/* Device memory: KL_E_NOMEM names the bytes asked and what the device has free. */
int  kl_gpu_alloc(void **p, size_t bytes, kl_err *err);
void kl_gpu_free(void *p);                         /* NULL ok */
/* Page-locked host memory (copies from it run at the link's rate and asynchronously). */
int  kl_gpu_host_alloc(void **p, size_t bytes, kl_err *err);
void kl_gpu_host_free(void *p);                    /* NULL ok */

/* Page-locked host memory for large staging buffers (the load's ring): an anonymous mapping
 * of bytes rounded up to 2 MiB, 2 MiB aligned, on 2 MiB pages where the kernel gives them
 * (hugetlbfs pages: *huge = 1; else transparent huge pages advised: *huge = 0), registered
 * once (fewer pages to pin and map than kl_gpu_host_alloc's).  Free with
 * kl_gpu_host_free_mapped(p, bytes).  KL_E_NOMEM (no mapping) or KL_E_GPU (not registered:
 * the mapping is gone again). */
int  kl_gpu_host_alloc_mapped(void **p, size_t bytes, int *huge, kl_err *err);
void kl_gpu_host_free_mapped(void *p, size_t bytes);   /* NULL ok */
/* Its two steps apart, so that the host's part runs while the device starts: the mapping with
 * its pages made (no device call; KL_E_NOMEM), then the registration (KL_E_GPU; the mapping
 * left to the caller: kl_gpu_host_unmap). */
int  kl_gpu_host_map(void **p, size_t bytes, int *huge, kl_err *err);
int  kl_gpu_host_register_mapped(void *p, size_t bytes, kl_err *err);
void kl_gpu_host_unmap(void *p, size_t bytes);        /* NULL ok */

/* Page-locks host memory the process already has (e.g. a window of a file mapped PROT_READ:
 * read_only, where the runtime has that flag) so copies from it run asynchronously at the
 * link's rate; KL_E_GPU when the runtime refuses (the caller then copies plainly).  Unregister
 * only after every copy from it is done. */
int  kl_gpu_host_register(void *p, size_t bytes, int read_only, kl_err *err);
void kl_gpu_host_unregister(void *p);              /* NULL ok */

/* Events: a point of a stream that the host can wait for. */
typedef struct kl_gpu_event_s *kl_gpu_event;
int  kl_gpu_event_create(kl_gpu_event *e, kl_err *err);
void kl_gpu_event_destroy(kl_gpu_event e);         /* NULL ok */
int  kl_gpu_event_record(kl_gpu_event e, kl_gpu_stream s, kl_err *err);
int  kl_gpu_event_sync(kl_gpu_event e, kl_err *err);
/* Work enqueued on s after this call waits until e's point of its stream has run. */
int  kl_gpu_stream_wait(kl_gpu_stream s, kl_gpu_event e, kl_err *err);

/* Copies on a stream (h2d / d2h / d2d); asynchronous only when the host side is pinned. */
int  kl_gpu_h2d(void *dst, const void *src, size_t bytes, kl_gpu_stream s, kl_err *err);
int  kl_gpu_d2h(void *dst, const void *src, size_t bytes, kl_gpu_stream s, kl_err *err);
/* rows of width bytes each, pitch bytes apart in host memory, packed together at dst */
int  kl_gpu_h2d_rows(void *dst, const void *src, size_t width, size_t pitch, size_t rows,
                     kl_gpu_stream s, kl_err *err);
int  kl_gpu_d2d(void *dst, const void *src, size_t bytes, kl_gpu_stream s, kl_err *err);
int  kl_gpu_memset(void *dst, int byte, size_t bytes, kl_gpu_stream s, kl_err *err);

int  kl_gpu_stream_create(kl_gpu_stream *s, kl_err *err);
void kl_gpu_stream_destroy(kl_gpu_stream s);       /* NULL ok */
int  kl_gpu_stream_sync(kl_gpu_stream s, kl_err *err);

/* Milliseconds between two points of a stream: begin, enqueue work, then end (waits). */
typedef struct kl_gpu_timer_s *kl_gpu_timer;
int  kl_gpu_timer_begin(kl_gpu_timer *t, kl_gpu_stream s, kl_err *err);
int  kl_gpu_timer_end(kl_gpu_timer t, kl_gpu_stream s, double *ms, kl_err *err); /* frees t */

/* Copy rates of the current device, each the best of reps copies of bytes: device-to-device in
 * bytes read plus written per second (the HBM ceiling a kernel's bytes compare with), and
 * pinned host-to-device in bytes per second (the ceiling of uploading weights). */
int  kl_gpu_measure_rates(size_t bytes, int reps, double *d2d_gbps, double *h2d_gbps,
                          kl_err *err);

/* Graphs: everything enqueued on s between capture_begin and capture_end is recorded (not
 * run) and instantiated into *g; kl_gpu_graph_launch replays it on s.  nodes (NULL: not
 * wanted) receives how many kernels and copies the graph holds.  programmatic: kernel-to-kernel
 * edges made programmatic (unless $KL_GPU_PDL=0); only for graphs of kl's own kernels, which
 * wait for the kernel before them (KL_GPU_GRID_WAIT) — a library's kernel (NCCL's) would not. */
int  kl_gpu_capture_begin(kl_gpu_stream s, kl_err *err);
int  kl_gpu_capture_end(kl_gpu_stream s, kl_gpu_graph *g, size_t *nodes, int programmatic,
                        kl_err *err);
int  kl_gpu_graph_launch(kl_gpu_graph g, kl_gpu_stream s, kl_err *err);
void kl_gpu_graph_destroy(kl_gpu_graph g);         /* NULL ok */

#ifdef __cplusplus
}
#endif

#endif
