/*
 * kernel_trace: every kernel a CUDA program runs, with its start and end on the GPU clock,
 * graph replays included, written as text lines.  The GPU machine has no Nsight Systems that
 * can make a report, so this stands in for its kernel timeline.  Built as a shared library
 * and named by CUDA_INJECTION64_PATH, the driver loads it at the program's first CUDA call
 * and calls InitializeInjection; CUPTI's activity buffers are flushed at exit.
 *
 *   CUDA_INJECTION64_PATH=./libkernel_trace.so KL_TRACE_OUT=trace.txt kl bench decode ...
 *
 * One line per kernel: start_ns end_ns stream grid_x grid_y block_x graph_node name
 * (the name mangled; scripts/gpu/trace_step.py reads them).  Build (CUDA's headers and
 * libcupti): make GPU=cuda gpu-trace.
 */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *trace_out;
static uint64_t trace_dropped;

#define BUFFER_BYTES (8u << 20)

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void write_kernel(const CUpti_ActivityKernel10 *k)
{
    fprintf(trace_out, "%llu %llu %u %d %d %d %llu %s\n", (unsigned long long)k->start,
            (unsigned long long)k->end, k->streamId, k->gridX, k->gridY, k->blockX,
            (unsigned long long)k->graphNodeId, k->name ? k->name : "?");
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *record = NULL;
    while (trace_out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            record->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            write_kernel((const CUpti_ActivityKernel10 *)record);
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
        trace_dropped += dropped;
    free(buffer);
}

static void trace_finish(void)
{
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (!trace_out)
        return;
    if (trace_dropped)
        fprintf(stderr, "kernel_trace: %llu records dropped\n", (unsigned long long)trace_dropped);
    fclose(trace_out);
    trace_out = NULL;
}

int InitializeInjection(void)
{
    const char *path = getenv("KL_TRACE_OUT");
    trace_out = fopen(path ? path : "kernel_trace.txt", "w");
    if (!trace_out) {
        perror("kernel_trace: KL_TRACE_OUT");
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity\n");
        fclose(trace_out);
        trace_out = NULL;
        return 0;
    }
    cuptiActivityFlushPeriod(200); /* records flow while the program runs, not only at exit */
    atexit(trace_finish);
    return 1;
}
