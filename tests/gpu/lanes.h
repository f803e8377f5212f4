/*
 * tests/gpu/lanes.h — what the CPU runs of kernels at lane level share (mla_lanes.cpp,
 * skinny_lanes.cpp): the thread and block indices, a barrier over the block (__syncthreads)
 * and one per group of 32 lanes (for the harness's shuffles and MMAs), and the grid run block
 * after block, each block's threads all started before any is joined (their barriers need
 * every one running).
 */
#ifndef KL_TESTS_GPU_LANES_H
#define KL_TESTS_GPU_LANES_H

#include <pthread.h>
#include <stdint.h>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x, y, z;
};

static thread_local dim3 threadIdx;
static dim3 blockIdx, gridDim, blockDim;
static pthread_barrier_t block_bar, group_bar[8]; /* group_bar[threadIdx.x / 32] */

static void __syncthreads() { pthread_barrier_wait(&block_bar); }

/* kernel() as the blocks of grid, `threads` (<= 256) threads each, one block after another;
 * before_block() before each. */
template <class K, class B>
static void lanes_grid(dim3 grid, unsigned threads, K kernel, B before_block)
{
    gridDim = grid, blockDim = {threads, 1, 1};
    pthread_barrier_init(&block_bar, NULL, threads);
    for (unsigned g = 0; g < threads / 32; g++)
        pthread_barrier_init(&group_bar[g], NULL, 32);
    for (uint32_t y = 0; y < grid.y; y++)
        for (uint32_t x = 0; x < grid.x; x++) {
            blockIdx = {x, y, 0};
            before_block();
            std::vector<std::thread> th;
            for (unsigned i = 0; i < threads; i++)
                th.emplace_back([&, i] {
                    threadIdx = {i, 0, 0};
                    kernel();
                });
            for (std::thread &h : th)
                h.join();
        }
    pthread_barrier_destroy(&block_bar);
    for (unsigned g = 0; g < threads / 32; g++)
        pthread_barrier_destroy(&group_bar[g]);
}

#endif
