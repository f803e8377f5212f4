/* cli/loadmodel.c — plan, memory check and timed loading of a model (see loadmodel.h). */
#include "cli/loadmodel.h"

#include "cli/progress.h"
#include "common/clock.h"
#include "engine/backend.h"
#include "engine/backend_tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether the model runs on the CPU: --device cpu, or auto without a GPU. */
static int cpu_only(const kl_cli_load *l)
{
    return l->device == KL_DEVICE_CPU ||
           (l->device == KL_DEVICE_AUTO && !kl_backend_gpu_available());
}

/* Whether the model goes to the GPU read from its files there (its matrices never in host
 * memory), rather than read whole first ($KL_GPU_LOAD=host). */
static int gpu_streams(const kl_cli_load *l)
{
    const char *how = getenv("KL_GPU_LOAD");
    /* tensor parallel too: each rank's cut is made from the files (engine/tp_model.h) */
    return !cpu_only(l) && !(how && !strcmp(how, "host"));
}

int kl_cli_plan_model(kl_cli_load *l, kl_err *err)
{
    /* --device gpu that cannot be met fails before anything is read */
    if (l->device == KL_DEVICE_GPU && kl_backend_gpu_check(err))
        return err->code = KL_E_USAGE;
    int rc = kl_cost_plan_read(l->model, &l->plan, err);
    /* streamed to the GPU: its device and load buffers made from now on, in a thread (a
     * refusal here only means they are made at creation, which reports any real error) */
    if (!rc && gpu_streams(l) && l->opts.tp <= 1 && !l->prep &&
        kl_backend_gpu_prepare(&l->prep, NULL))
        l->prep = NULL;
    if (rc || l->ignore_memory || gpu_streams(l))   /* streamed: the host holds vectors only */
        return rc;
    uint64_t avail;
    kl_err merr;
    kl_err_clear(&merr);
    const char *meminfo = getenv("KL_MEMINFO");
    if (kl_cost_mem_available(meminfo && *meminfo ? meminfo : NULL, &avail, &merr)) {
        char buf[512];
        fprintf(stderr, "kl %s: warning: memory check skipped: %s\n", l->cmd,
                kl_err_format(&merr, buf, sizeof buf));
        return 0;
    }
    if ((rc = kl_cost_check_memory(l->plan.weight_bytes, avail, err)))
        kl_err_context(err, l->model, NULL, KL_NO_OFFSET, NULL);
    return rc;
}

static void show_load(void *user, uint64_t done, uint64_t total)
{
    kl_progress_show(user, done, total);
}

/* Moves m to the GPU when l->device asks for it (or auto finds one), with what prep made
 * ahead (NULL: nothing; freed here either way). */
static int use_device(kl_cli_load *l, kl_model *m, kl_gpu_prep *prep, kl_err *err)
{
    l->device_used = "cpu";
    if (cpu_only(l)) {
        kl_backend_gpu_prepare_free(prep);
        return 0;
    }
    kl_backend *be = NULL;
    double t0 = kl_now_s();
    int rc;
    if (l->opts.tp > 1) {   /* GPU ranks of the cut models (engine/backend_tp.h) */
        kl_backend_gpu_prepare_free(prep);
        rc = kl_backend_tp_create_on(&be, m, l->opts.tp, l->opts.expert_parallel, 1, err);
    } else {
        rc = kl_backend_gpu_create_prepared(&be, m, prep, err);
    }
    if (!rc && (rc = kl_model_use_backend(m, be, err)))
        kl_backend_free(be);
    if (rc)
        return rc;
    l->device_used = "gpu";
    l->upload_s = kl_now_s() - t0;
    kl_backend_gpu_load_info(be, &l->gpu_load);
    if (!m->matrices_read) {   /* streamed: the load is the upload */
        l->load_s += l->upload_s;
        l->load_gbps = l->load_s > 0 ? (double)m->weight_bytes / l->load_s / 1e9 : 0;
    }
    if (!l->quiet)
        fprintf(stderr, "kl %s: on the GPU: weights uploaded in %.3f s (%s, %llu of %llu "
                "windows page-locked, %llu staged); loaded %.3f GB in %.3f s (%.2f GB/s)\n",
                l->cmd, l->upload_s, l->gpu_load.how, (unsigned long long)l->gpu_load.pinned,
                (unsigned long long)l->gpu_load.windows, (unsigned long long)l->gpu_load.staged,
                (double)m->weight_bytes / 1e9, l->load_s, l->load_gbps);
    if (!l->quiet && l->opts.tp > 1)
        fprintf(stderr, "kl %s: %u tensor-parallel ranks on %d GPU(s); their sums: %s\n", l->cmd,
                l->opts.tp, kl_backend_gpu_devices(), kl_backend_gpu_tp_sums(be));
    return 0;
}

void kl_cli_load_release(kl_cli_load *l)
{
    kl_backend_gpu_prepare_free(l->prep);
    l->prep = NULL;
}

int kl_cli_open_model(kl_cli_load *l, kl_model **m, kl_err *err)
{
    kl_progress p;
    char label[64];
    snprintf(label, sizeof label, "kl %s: loading", l->cmd);
    kl_progress_init(&p, label, l->quiet);
    kl_model_opts mo = l->opts;
    if (!cpu_only(l))   /* GPU ranks, if any, come from the model as one (use_device) */
        mo.tp = 1;
    mo.progress = show_load;
    mo.progress_user = &p;
    mo.vectors_only = gpu_streams(l);
    double t0 = kl_now_s();
    /* streamed to the GPU: the device and load buffers started by kl_cli_plan_model, else
     * started now, made while the model opens */
    kl_gpu_prep *prep = l->prep;
    l->prep = NULL;
    if (mo.vectors_only && l->opts.tp <= 1 && !prep && kl_backend_gpu_prepare(&prep, NULL))
        prep = NULL;
    int rc = kl_model_open(m, l->model, &mo, err);
    l->load_s = l->open_s = kl_now_s() - t0;
    kl_progress_end(&p);
    if (rc) {
        kl_backend_gpu_prepare_free(prep);
        return rc;
    }
    l->load_gbps = l->load_s > 0 ? (double)(*m)->weight_bytes / l->load_s / 1e9 : 0;
    if (!l->quiet && (*m)->matrices_read)
        fprintf(stderr, "kl %s: loaded %.3f GB in %.3f s (%.2f GB/s)\n", l->cmd,
                (double)(*m)->weight_bytes / 1e9, l->load_s, l->load_gbps);
    return use_device(l, *m, prep, err);
}
