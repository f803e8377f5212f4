/*
 * kernels/collective.cu — sums across GPUs through NCCL/RCCL loaded at run time (see
 * collective.h).  The few declarations used are written here rather than taken from nccl.h,
 * which a build machine may lack: an opaque communicator, int results (0: success), and the
 * two enum values of the library's stable ABI this needs (float32 = 7, sum = 0); where the
 * header is present they are checked against it.
 */
#include "kernels/collective.h"
#include "kernels/gpu.h"

#include <dlfcn.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct nccl_comm_s *nccl_comm;   /* ncclComm_t */
enum { NCCL_OK = 0, NCCL_FLOAT32 = 7, NCCL_SUM = 0 };

#if !defined(__HIP_PLATFORM_AMD__) && __has_include(<nccl.h>)
#include <nccl.h>
static_assert((int)ncclSuccess == (int)NCCL_OK && (int)ncclFloat32 == (int)NCCL_FLOAT32 &&
                  (int)ncclSum == (int)NCCL_SUM,
              "NCCL's ABI values");
#endif

/* The library's functions this uses. */
static struct {
    void *lib;
    char  name[256];
    int (*init_all)(nccl_comm *comms, int n, const int *devs);
    int (*all_reduce)(const void *send, void *recv, size_t count, int type, int op,
                      nccl_comm comm, hipStream_t st);
    int (*group_start)(void);
    int (*group_end)(void);
    int (*destroy)(nccl_comm comm);
    const char *(*error_string)(int result);
} lib;

static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static char lib_tried[512];   /* what was tried, for the error */

static void load_library(void)
{
    const char *env = getenv("KL_NCCL_LIB");
#if defined(__HIP_PLATFORM_AMD__)
    const char *names[] = {env, "librccl.so.1", "librccl.so"};
#else
    const char *names[] = {env, "libnccl.so.2", "libnccl.so"};
#endif
    for (size_t i = 0; i < sizeof names / sizeof *names && !lib.lib; i++) {
        if (!names[i] || !*names[i])
            continue;
        lib.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        size_t used = strlen(lib_tried);
        snprintf(lib_tried + used, sizeof lib_tried - used, "%s%s", used ? ", " : "", names[i]);
        if (lib.lib)
            snprintf(lib.name, sizeof lib.name, "%s", names[i]);
    }
    if (!lib.lib)
        return;
    /* RCCL exports NCCL's names */
    *(void **)&lib.init_all = dlsym(lib.lib, "ncclCommInitAll");
    *(void **)&lib.all_reduce = dlsym(lib.lib, "ncclAllReduce");
    *(void **)&lib.group_start = dlsym(lib.lib, "ncclGroupStart");
    *(void **)&lib.group_end = dlsym(lib.lib, "ncclGroupEnd");
    *(void **)&lib.destroy = dlsym(lib.lib, "ncclCommDestroy");
    *(void **)&lib.error_string = dlsym(lib.lib, "ncclGetErrorString");
}

/* The library loaded with every function, else KL_E_UNSUPPORTED naming what was tried. */
static int need_library(kl_err *err)
{
    pthread_once(&lib_once, load_library);
    if (!lib.lib)
        return kl_fail(err, KL_E_UNSUPPORTED, "no collective library for tensor parallel across "
                       "GPUs (tried %s; $KL_NCCL_LIB names one)", lib_tried);
    if (!lib.init_all || !lib.all_reduce || !lib.group_start || !lib.group_end ||
        !lib.destroy || !lib.error_string)
        return kl_fail(err, KL_E_UNSUPPORTED, "%s lacks a function kl needs (ncclCommInitAll, "
                       "ncclAllReduce, ncclGroupStart/End, ncclCommDestroy)", lib.name);
    return 0;
}

static int nccl_fail(kl_err *err, int result, const char *what)
{
    return kl_fail(err, KL_E_GPU, "%s: %s (%s)", what, lib.error_string(result), lib.name);
}

struct kl_gpu_comm {
    unsigned  n;
    nccl_comm comm[8];
};

extern "C" int kl_gpu_comm_create(kl_gpu_comm **out, const int *devs, unsigned n, kl_err *err)
{
    *out = NULL;
    if (!devs || n < 1 || n > 8)
        return kl_fail(err, KL_E_USAGE, "communicators over %u devices (1 to 8)", n);
    int rc = need_library(err);
    if (rc)
        return rc;
    kl_gpu_comm *c = (kl_gpu_comm *)calloc(1, sizeof *c);
    if (!c)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    c->n = n;
    /* never NVLink multicast (NVLS): kl's sums are small, and on a shared host a program using
     * it can take every GPU out of service (the issue's "no multicast/NVLS") */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    const int r = lib.init_all(c->comm, (int)n, devs);
    if (r != NCCL_OK) {
        free(c);
        return nccl_fail(err, r, "ncclCommInitAll");
    }
    *out = c;
    return 0;
}

extern "C" void kl_gpu_comm_free(kl_gpu_comm *c)
{
    for (unsigned r = 0; c && r < c->n; r++)
        lib.destroy(c->comm[r]);
    free(c);
}

extern "C" int kl_gpu_comm_sum(kl_gpu_comm *c, float *const *bufs, size_t count,
                               const kl_gpu_stream *st, kl_err *err)
{
    if (!c || !bufs || !st || !count)
        return kl_fail(err, KL_E_USAGE, "comm_sum: no communicator, buffers or streams");
    int r = lib.group_start();
    for (unsigned i = 0; r == NCCL_OK && i < c->n; i++)
        r = lib.all_reduce(bufs[i], bufs[i], count, NCCL_FLOAT32, NCCL_SUM, c->comm[i],
                           (hipStream_t)st[i]);
    const int end = lib.group_end();   /* closes the group even after a failed call */
    r = r != NCCL_OK ? r : end;
    return r == NCCL_OK ? 0 : nccl_fail(err, r, "ncclAllReduce");
}

extern "C" const char *kl_gpu_comm_library(void)
{
    return lib.name;
}
