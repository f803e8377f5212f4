/*
 * kernels/runtime.cu — kernels/runtime.h over the HIP / CUDA runtime (names mapped by gpu.h).
 */
#include "kernels/gpu.h"
#include "kernels/runtime.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define STREAM(s) ((hipStream_t)(s))

extern "C" int kl_gpu_device_count(void)
{
    int n = 0;
    if (hipGetDeviceCount(&n) != hipSuccess) {
        (void)hipGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return n;
}

/* Attribute a of the current device, or fallback when the runtime does not say. */
static int device_attribute(hipDeviceAttribute_t a, int fallback)
{
    int dev = 0, v = 0;
    if (hipGetDevice(&dev) != hipSuccess || hipDeviceGetAttribute(&v, a, dev) != hipSuccess ||
        v <= 0) {
        (void)hipGetLastError();
        return fallback;
    }
    return v;
}

extern "C" unsigned kl_gpu_sm_count(void)
{
    static unsigned n;
    if (!n)
        n = (unsigned)device_attribute(hipDeviceAttributeMultiprocessorCount, 132);
    return n;
}

extern "C" size_t kl_gpu_shared_optin(void)
{
    static size_t n;
    if (!n)
        n = (size_t)device_attribute(hipDeviceAttributeSharedMemPerBlockOptin, 227 * 1024);
    return n;
}

extern "C" int kl_gpu_device_open(int dev, char *name, size_t name_len, kl_err *err)
{
    int rc = KL_GPU_CHECK(err, hipSetDevice(dev));
    if (rc || !name || !name_len)
        return rc;
    hipDeviceProp_t p;
    if ((rc = KL_GPU_CHECK(err, hipGetDeviceProperties(&p, dev))))
        return rc;
    strncpy(name, p.name, name_len - 1);
    name[name_len - 1] = '\0';
    return 0;
}

extern "C" int kl_gpu_mem_info(size_t *free_bytes, size_t *total_bytes, kl_err *err)
{
    return KL_GPU_CHECK(err, hipMemGetInfo(free_bytes, total_bytes));
}

extern "C" int kl_gpu_alloc(void **p, size_t bytes, kl_err *err)
{
    *p = NULL;
    if (hipMalloc(p, bytes ? bytes : 1) == hipSuccess)
        return 0;
    (void)hipGetLastError();
    *p = NULL;
    size_t fr = 0, tot = 0;
    (void)hipMemGetInfo(&fr, &tot);
    return kl_fail(err, KL_E_NOMEM, "GPU memory: %zu bytes asked, %zu of %zu free", bytes, fr,
                   tot);
}

extern "C" void kl_gpu_free(void *p)
{
    if (p)
        (void)hipFree(p);
}

extern "C" int kl_gpu_host_alloc(void **p, size_t bytes, kl_err *err)
{
    *p = NULL;
    /* portable: tensor-parallel ranks on other devices copy from it too */
    if (hipHostMalloc(p, bytes ? bytes : 1, hipHostMallocPortable) == hipSuccess)
        return 0;
    (void)hipGetLastError();
    *p = NULL;
    return kl_fail(err, KL_E_NOMEM, "pinned host memory: %zu bytes", bytes);
}

extern "C" void kl_gpu_host_free(void *p)
{
    if (p)
        (void)hipHostFree(p);
}

/* HIP headers without the read-only flag: register plainly (a read-only mapping may then be
 * refused, and the caller copies without pinning). */
#if defined(__HIPCC__) && !defined(hipHostRegisterReadOnly)
#define KL_HOST_REGISTER_RO hipHostRegisterDefault
#else
#define KL_HOST_REGISTER_RO hipHostRegisterReadOnly
#endif

extern "C" int kl_gpu_host_register(void *p, size_t bytes, int read_only, kl_err *err)
{
    unsigned flags = (read_only ? KL_HOST_REGISTER_RO : hipHostRegisterDefault) |
                     hipHostRegisterPortable;
    int rc = KL_GPU_CHECK(err, hipHostRegister(p, bytes, flags));
    if (rc)
        (void)hipGetLastError();   /* not sticky: later calls must not see it */
    return rc;
}

extern "C" void kl_gpu_host_unregister(void *p)
{
    if (p)
        (void)hipHostUnregister(p);
}

#define HUGE_PAGE ((size_t)2 << 20)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static size_t huge_round(size_t bytes)
{
    return (bytes ? bytes + HUGE_PAGE - 1 : HUGE_PAGE) / HUGE_PAGE * HUGE_PAGE;
}

/* len bytes (a multiple of HUGE_PAGE) of anonymous memory at a 2 MiB boundary: hugetlbfs pages
 * when the system has them reserved, else a larger mapping trimmed to the boundary and advised
 * onto transparent huge pages.  NULL when there is no memory. */
static void *map_huge(size_t len, int *huge)
{
    const int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS;
    void *m = mmap(NULL, len, prot, flags | MAP_HUGETLB, -1, 0);
    *huge = m != MAP_FAILED;
    if (*huge)
        return m;
    m = mmap(NULL, len + HUGE_PAGE, prot, flags, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    uintptr_t at = (uintptr_t)m, up = (at + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    if (up > at)   /* the slack before the boundary and after the end */
        munmap(m, up - at);
    if (at + HUGE_PAGE > up)
        munmap((void *)(up + len), at + HUGE_PAGE - up);
    (void)madvise((void *)up, len, MADV_HUGEPAGE);
    return (void *)up;
}

extern "C" int kl_gpu_host_map(void **p, size_t bytes, int *huge, kl_err *err)
{
    *huge = 0;
    size_t len = huge_round(bytes);
    void *m = map_huge(len, huge);
    *p = m;
    if (!m)
        return kl_fail_sys(err, KL_E_NOMEM, errno, "mapping %zu bytes of load buffers", len);
    /* the pages made now (zeroed by the kernel), not inside the registration */
    if (madvise(m, len, MADV_POPULATE_WRITE))
        for (size_t at = 0; at < len; at += 4096)
            ((volatile uint8_t *)m)[at] = 0;
    return 0;
}

extern "C" int kl_gpu_host_register_mapped(void *p, size_t bytes, kl_err *err)
{
    int rc = KL_GPU_CHECK(err, hipHostRegister(p, huge_round(bytes), hipHostRegisterPortable));
    if (rc)
        (void)hipGetLastError();
    return rc;
}

extern "C" void kl_gpu_host_unmap(void *p, size_t bytes)
{
    if (p)
        munmap(p, huge_round(bytes));
}

extern "C" int kl_gpu_host_alloc_mapped(void **p, size_t bytes, int *huge, kl_err *err)
{
    int rc = kl_gpu_host_map(p, bytes, huge, err);
    if (!rc && (rc = kl_gpu_host_register_mapped(*p, bytes, err))) {
        kl_gpu_host_unmap(*p, bytes);
        *p = NULL;
    }
    return rc;
}

extern "C" void kl_gpu_host_free_mapped(void *p, size_t bytes)
{
    if (!p)
        return;
    (void)hipHostUnregister(p);
    kl_gpu_host_unmap(p, bytes);
}

extern "C" int kl_gpu_event_create(kl_gpu_event *e, kl_err *err)
{
    hipEvent_t ev = NULL;
    int rc = KL_GPU_CHECK(err, hipEventCreateWithFlags(&ev, hipEventDisableTiming));
    *e = rc ? NULL : (kl_gpu_event)ev;
    return rc;
}

extern "C" void kl_gpu_event_destroy(kl_gpu_event e)
{
    if (e)
        (void)hipEventDestroy((hipEvent_t)e);
}

extern "C" int kl_gpu_event_record(kl_gpu_event e, kl_gpu_stream s, kl_err *err)
{
    return KL_GPU_CHECK(err, hipEventRecord((hipEvent_t)e, STREAM(s)));
}

extern "C" int kl_gpu_event_sync(kl_gpu_event e, kl_err *err)
{
    return KL_GPU_CHECK(err, hipEventSynchronize((hipEvent_t)e));
}

extern "C" int kl_gpu_stream_wait(kl_gpu_stream s, kl_gpu_event e, kl_err *err)
{
    return KL_GPU_CHECK(err, hipStreamWaitEvent(STREAM(s), (hipEvent_t)e, 0));
}

extern "C" int kl_gpu_h2d(void *dst, const void *src, size_t bytes, kl_gpu_stream s, kl_err *err)
{
    return KL_GPU_CHECK(err, hipMemcpyAsync(dst, src, bytes, hipMemcpyHostToDevice, STREAM(s)));
}

extern "C" int kl_gpu_h2d_rows(void *dst, const void *src, size_t width, size_t pitch,
                               size_t rows, kl_gpu_stream s, kl_err *err)
{
    return KL_GPU_CHECK(err, hipMemcpy2DAsync(dst, width, src, pitch, width, rows,
                                              hipMemcpyHostToDevice, STREAM(s)));
}

extern "C" int kl_gpu_d2h(void *dst, const void *src, size_t bytes, kl_gpu_stream s, kl_err *err)
{
    return KL_GPU_CHECK(err, hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToHost, STREAM(s)));
}

extern "C" int kl_gpu_d2d(void *dst, const void *src, size_t bytes, kl_gpu_stream s, kl_err *err)
{
    return KL_GPU_CHECK(err,
                        hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToDevice, STREAM(s)));
}

extern "C" int kl_gpu_memset(void *dst, int byte, size_t bytes, kl_gpu_stream s, kl_err *err)
{
    return KL_GPU_CHECK(err, hipMemsetAsync(dst, byte, bytes, STREAM(s)));
}

extern "C" int kl_gpu_stream_create(kl_gpu_stream *s, kl_err *err)
{
    hipStream_t st = NULL;
    int rc = KL_GPU_CHECK(err, hipStreamCreateWithFlags(&st, hipStreamNonBlocking));
    *s = rc ? NULL : (kl_gpu_stream)st;
    return rc;
}

extern "C" void kl_gpu_stream_destroy(kl_gpu_stream s)
{
    if (s)
        (void)hipStreamDestroy(STREAM(s));
}

extern "C" int kl_gpu_stream_sync(kl_gpu_stream s, kl_err *err)
{
    return KL_GPU_CHECK(err, hipStreamSynchronize(STREAM(s)));
}

struct kl_gpu_timer_s {
    hipEvent_t a, b;
};

extern "C" int kl_gpu_timer_begin(kl_gpu_timer *t, kl_gpu_stream s, kl_err *err)
{
    *t = (kl_gpu_timer)calloc(1, sizeof **t);
    if (!*t)
        return kl_fail(err, KL_E_NOMEM, "out of memory for a GPU timer");
    int rc = KL_GPU_CHECK(err, hipEventCreate(&(*t)->a));
    if (!rc && !(rc = KL_GPU_CHECK(err, hipEventCreate(&(*t)->b))))
        rc = KL_GPU_CHECK(err, hipEventRecord((*t)->a, STREAM(s)));
    if (rc) {
        free(*t);
        *t = NULL;
    }
    return rc;
}

extern "C" int kl_gpu_timer_end(kl_gpu_timer t, kl_gpu_stream s, double *ms, kl_err *err)
{
    float f = 0.0f;
    int rc = KL_GPU_CHECK(err, hipEventRecord(t->b, STREAM(s)));
    if (!rc)
        rc = KL_GPU_CHECK(err, hipEventSynchronize(t->b));
    if (!rc)
        rc = KL_GPU_CHECK(err, hipEventElapsedTime(&f, t->a, t->b));
    *ms = f;
    (void)hipEventDestroy(t->a);
    (void)hipEventDestroy(t->b);
    free(t);
    return rc;
}

extern "C" int kl_gpu_capture_begin(kl_gpu_stream s, kl_err *err)
{
    return KL_GPU_CHECK(err, hipStreamBeginCapture(STREAM(s), hipStreamCaptureModeThreadLocal));
}

/* 1 unless $name is "0", read once into *cached (-1: not read yet). */
static int env_on(const char *name, int *cached)
{
    if (*cached < 0) {
        const char *e = getenv(name);
        *cached = !(e && !strcmp(e, "0"));
    }
    return *cached;
}

/* Whether captured graphs get programmatic kernel-to-kernel edges: yes unless $KL_GPU_PDL=0
 * (read once).  On the H200 they change no bit of the logits and save ~1% of a decode step
 * (docs/PERFORMANCE.md). */
static int pdl_wanted(void)
{
    static int wanted = -1;
    return env_on("KL_GPU_PDL", &wanted);
}

int kl_gpu_early_dependents(dim3 grid, unsigned block)
{
    static int wanted = -1;
    const size_t threads = (size_t)grid.x * grid.y * grid.z * block;
    return env_on("KL_GPU_EARLY", &wanted) && threads <= KL_GPU_EARLY_MAX_THREADS;
}

#if defined(__HIP_PLATFORM_AMD__)
static int programmatic_edges(hipGraph_t graph, kl_err *err)
{
    (void)graph;
    (void)err;
    return 0;   /* no programmatic launches on HIP: the graph stays as captured */
}
#else
/* The edge from[i] -> to[i] made programmatic when both ends are kernels: the second kernel's
 * blocks are scheduled as the first one's last warps finish, and wait in KL_GPU_GRID_WAIT
 * (kernels/gpu.h: the first statement of every kl kernel) until its memory is visible.  What
 * it saves is the gap between dependent launches, which dominates a decode step of ~400 small
 * kernels. */
static int make_programmatic(cudaGraph_t graph, cudaGraphNode_t from, cudaGraphNode_t to,
                             cudaGraphEdgeData *old, kl_err *err)
{
    cudaGraphNodeType a, b;
    int rc = KL_GPU_CHECK(err, cudaGraphNodeGetType(from, &a));
    if (!rc)
        rc = KL_GPU_CHECK(err, cudaGraphNodeGetType(to, &b));
    if (rc || a != cudaGraphNodeTypeKernel || b != cudaGraphNodeTypeKernel || old->type)
        return rc;
    cudaGraphEdgeData e;
    memset(&e, 0, sizeof e);
    e.from_port = cudaGraphKernelNodePortProgrammatic;
    e.type = cudaGraphDependencyTypeProgrammatic;
    rc = KL_GPU_CHECK(err, cudaGraphRemoveDependencies(graph, &from, &to, old, 1));
    return rc ? rc : KL_GPU_CHECK(err, cudaGraphAddDependencies(graph, &from, &to, &e, 1));
}

static int programmatic_edges(cudaGraph_t graph, kl_err *err)
{
    size_t n = 0;
    int rc = KL_GPU_CHECK(err, cudaGraphGetEdges(graph, NULL, NULL, NULL, &n));
    if (rc || !n)
        return rc;
    cudaGraphNode_t *from = (cudaGraphNode_t *)malloc(n * sizeof *from);
    cudaGraphNode_t *to = (cudaGraphNode_t *)malloc(n * sizeof *to);
    cudaGraphEdgeData *ed = (cudaGraphEdgeData *)calloc(n, sizeof *ed);
    if (!from || !to || !ed)
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for %zu graph edges", n);
    if (!rc)
        rc = KL_GPU_CHECK(err, cudaGraphGetEdges(graph, from, to, ed, &n));
    for (size_t i = 0; !rc && i < n; i++)
        rc = make_programmatic(graph, from[i], to[i], &ed[i], err);
    free(from);
    free(to);
    free(ed);
    return rc;
}
#endif

extern "C" int kl_gpu_capture_end(kl_gpu_stream s, kl_gpu_graph *g, size_t *nodes,
                                  int programmatic, kl_err *err)
{
    hipGraph_t graph = NULL;
    hipGraphExec_t exec = NULL;
    *g = NULL;
    int rc = KL_GPU_CHECK(err, hipStreamEndCapture(STREAM(s), &graph));
    if (!rc && nodes)
        rc = KL_GPU_CHECK(err, hipGraphGetNodes(graph, NULL, nodes));
    if (!rc && programmatic && pdl_wanted())
        rc = programmatic_edges(graph, err);
    if (!rc)
        rc = KL_GPU_CHECK(err, hipGraphInstantiateWithFlags(&exec, graph, 0));
    if (graph)
        (void)hipGraphDestroy(graph);
    if (!rc)
        *g = (kl_gpu_graph)exec;
    return rc;
}

extern "C" int kl_gpu_graph_launch(kl_gpu_graph g, kl_gpu_stream s, kl_err *err)
{
    return KL_GPU_CHECK(err, hipGraphLaunch((hipGraphExec_t)g, STREAM(s)));
}

extern "C" void kl_gpu_graph_destroy(kl_gpu_graph g)
{
    if (g)
        (void)hipGraphExecDestroy((hipGraphExec_t)g);
}

/* Best time of reps copies src -> dst on the default stream, in seconds. */
static int best_copy(void *dst, const void *src, size_t bytes, hipMemcpyKind kind, int reps,
                     double *best, kl_err *err)
{
    *best = 0;
    for (int i = 0; i < reps; i++) {
        kl_gpu_timer t;
        double ms;
        int rc = kl_gpu_timer_begin(&t, NULL, err);
        if (!rc && (rc = KL_GPU_CHECK(err, hipMemcpyAsync(dst, src, bytes, kind, 0)))) {
            (void)kl_gpu_timer_end(t, NULL, &ms, NULL);
            return rc;
        }
        if (!rc)
            rc = kl_gpu_timer_end(t, NULL, &ms, err);
        if (rc)
            return rc;
        if (!*best || ms / 1e3 < *best)
            *best = ms / 1e3;
    }
    return 0;
}

extern "C" int kl_gpu_measure_rates(size_t bytes, int reps, double *d2d_gbps, double *h2d_gbps,
                                    kl_err *err)
{
    void *a = NULL, *b = NULL, *h = NULL;
    double d2d = 0, h2d = 0;
    int rc = kl_gpu_alloc(&a, bytes, err);
    if (!rc)
        rc = kl_gpu_alloc(&b, bytes, err);
    if (!rc)
        rc = kl_gpu_host_alloc(&h, bytes, err);
    if (!rc)
        rc = KL_GPU_CHECK(err, hipMemsetAsync(a, 1, bytes, 0));
    if (!rc)
        memset(h, 1, bytes);   /* touch every page before timing */
    if (!rc)
        rc = best_copy(b, a, bytes, hipMemcpyDeviceToDevice, reps, &d2d, err);
    if (!rc)
        rc = best_copy(a, h, bytes, hipMemcpyHostToDevice, reps, &h2d, err);
    *d2d_gbps = !rc && d2d > 0 ? 2.0 * (double)bytes / d2d / 1e9 : 0;
    *h2d_gbps = !rc && h2d > 0 ? (double)bytes / h2d / 1e9 : 0;
    kl_gpu_free(a);
    kl_gpu_free(b);
    kl_gpu_host_free(h);
    return rc;
}
