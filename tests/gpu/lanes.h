/*
 * tests/gpu/lanes.h — what the CPU runs of kernels at lane level share (mla_lanes.cpp,
 * skinny_lanes.cpp): a block's threads, all started before any is joined (their barriers need
 * every one running).
 */
#ifndef KL_TESTS_GPU_LANES_H
#define KL_TESTS_GPU_LANES_H

#include <thread>
#include <vector>

/* body(i) on `threads` threads at once, i = 0 .. threads - 1; returns when all have. */
template <class F> static void lanes_block(unsigned threads, F body)
{
    std::vector<std::thread> th;
    for (unsigned i = 0; i < threads; i++)
        th.emplace_back([&, i] { body(i); });
    for (std::thread &h : th)
        h.join();
}

#endif
