/*
 * cli/loadmodel.h — what run, chat and bench decode do before and while loading a model:
 * read its plan (size, context) from metadata, refuse it when it does not fit in the memory
 * available (MemAvailable; `--ignore-memory-check` skips this; $KL_MEMINFO names another
 * meminfo file, for tests), then load it with a progress line on stderr (terminal only, off
 * with -q) and report the load time and rate ("kl CMD: loaded X GB in S s (R GB/s)", off with -q);
 * then put it on the device --device names (engine/backend.h).  For the GPU the host reads
 * only the small vectors (kl_model_opts.vectors_only) and the GPU backend streams the matrices
 * from the files (no host memory check then: the host never holds them); load_s and load_gbps
 * then count the whole load, upload included; $KL_GPU_LOAD=host reads the whole model into
 * host memory first, as the CPU does, then copies it.
 */
#ifndef KL_CLI_LOADMODEL_H
#define KL_CLI_LOADMODEL_H

#include "common/err.h"
#include "engine/backend.h"
#include "engine/cost.h"
#include "engine/model.h"

/* --device: where the forward pass runs (auto: the GPU when this build has GPU support and a
 * device is visible, else the CPU). */
typedef enum kl_cli_device { KL_DEVICE_AUTO = 0, KL_DEVICE_CPU, KL_DEVICE_GPU } kl_cli_device;

typedef struct kl_cli_load {
    const char   *cmd;            /* "run", "chat", "bench decode": the message prefix */
    const char   *model;          /* checkpoint directory */
    kl_model_opts opts;           /* threads, route weights (progress is set here) */
    int           quiet;          /* -q: no progress, no load line */
    int           ignore_memory;  /* --ignore-memory-check */
    kl_cli_device device;         /* --device */
    /* outputs */
    kl_cost_plan  plan;           /* from kl_cli_plan_model */
    double        load_s;         /* from kl_cli_open_model */
    double        load_gbps;      /* weight bytes / load_s / 1e9 */
    const char   *device_used;    /* "cpu" or "gpu" */
    double        open_s;         /* kl_model_open (GPU: vectors only; the device and the
                                     load buffers prepared meanwhile) */
    double        upload_s;       /* GPU: seconds to put the weights on the device */
    kl_gpu_load_info gpu_load;    /* GPU: how they came (engine/backend.h) */
    kl_gpu_prep  *prep;           /* GPU: the device and load buffers being made since
                                     kl_cli_plan_model (taken by kl_cli_open_model) */
} kl_cli_load;

/* Reads l->plan and checks it against the available memory (unless ignored); 0 or an error.
 * When the model will stream to the GPU, the device and its load buffers start being made
 * here, in a thread, while the caller opens its tokenizer and the model (kl_cli_open_model
 * takes them; kl_cli_load_release frees them on paths that never get there). */
int kl_cli_plan_model(kl_cli_load *l, kl_err *err);

/* Frees what kl_cli_plan_model started and kl_cli_open_model did not take (safe to repeat). */
void kl_cli_load_release(kl_cli_load *l);
/* Loads the model into *m (owned: kl_model_close) with progress, timing it, then moves it to
 * the device l->device names (KL_E_UNSUPPORTED: --device gpu without a GPU or GPU support). */
int kl_cli_open_model(kl_cli_load *l, kl_model **m, kl_err *err);

#endif
