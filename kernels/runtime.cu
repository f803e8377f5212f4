/*
 * kernels/runtime.cu — kernels/runtime.h over the HIP / CUDA runtime (names mapped by gpu.h).
 */
#include "kernels/gpu.h"
#include "kernels/runtime.h"

#include <stdlib.h>
#include <string.h>

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
    if (hipHostMalloc(p, bytes ? bytes : 1, hipHostMallocDefault) == hipSuccess)
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

extern "C" int kl_gpu_h2d(void *dst, const void *src, size_t bytes, kl_gpu_stream s, kl_err *err)
{
    return KL_GPU_CHECK(err, hipMemcpyAsync(dst, src, bytes, hipMemcpyHostToDevice, STREAM(s)));
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

extern "C" int kl_gpu_capture_end(kl_gpu_stream s, kl_gpu_graph *g, kl_err *err)
{
    hipGraph_t graph = NULL;
    hipGraphExec_t exec = NULL;
    *g = NULL;
    int rc = KL_GPU_CHECK(err, hipStreamEndCapture(STREAM(s), &graph));
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
