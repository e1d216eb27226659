/* vecadd for scripts/gpu_check: c = a + b over n floats (default 2^22), with
 * 256-thread blocks.  Expected under the Sanitizer backend: 2n thread-level
 * global loads, n stores, n/256 blocks, and 4n/64 KiB pages per array (256 at
 * n = 2^22).  It also measures %globaltimer's resolution and prints it. */
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define GP_PROGRAM "vecadd"
#include "vecadd.cuh"

/* Smallest non-zero step of %globaltimer seen by one thread spinning on it. */
__global__ void timer_res(unsigned long long *out, int iters) {
    unsigned long long prev, now, best = ~0ull;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(prev));
    for (int k = 0; k < iters; ++k) {
        do {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        } while (now == prev);
        if (now - prev < best) best = now - prev;
        prev = now;
    }
    *out = best;
}


int main(int argc, char **argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : (1 << 22);
    const bool timer = argc > 2 && std::atoi(argv[2]);
    float *a, *b, *c;
    CK(cudaMalloc(&a, n * sizeof(float)));
    CK(cudaMalloc(&b, n * sizeof(float)));
    CK(cudaMalloc(&c, n * sizeof(float)));
    float *h = (float *)std::malloc(n * sizeof(float));
    for (int i = 0; i < n; ++i) h[i] = (float)i;
    CK(cudaMemcpy(a, h, n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, h, n * sizeof(float), cudaMemcpyHostToDevice));
    vecadd<<<(n + 255) / 256, 256>>>(a, b, c, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(h, c, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        if (h[i] != 2.0f * (float)i) {
            std::fprintf(stderr, "vecadd: wrong result at %d\n", i);
            return 1;
        }
    std::printf("vecadd n=%d ok a=%p b=%p c=%p\n", n, (void *)a, (void *)b, (void *)c);
    /* argv[3] = R > 1: R - 1 more launches, each timed from the launch to the end of a
     * device sync (an instrumenting tool's own work at launch end included): gpu_check's
     * GPU-side against CPU-side aggregation.  The first launch (module load, patching) is not timed. */
    const int repeat = argc > 3 ? std::atoi(argv[3]) : 1;
    if (repeat > 1) {
        double total_ms = 0;
        for (int r = 1; r < repeat; ++r) {
            auto t0 = std::chrono::steady_clock::now();
            vecadd<<<(n + 255) / 256, 256>>>(a, b, c, n);
            CK(cudaDeviceSynchronize());
            total_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        }
        std::printf("vecadd_launch_ms=%.4f over %d launches\n", total_ms / (repeat - 1), repeat - 1);
    }
    if (timer) {
        unsigned long long *d, res = 0;
        CK(cudaMalloc(&d, sizeof *d));
        timer_res<<<1, 1>>>(d, 1000);
        CK(cudaMemcpy(&res, d, sizeof res, cudaMemcpyDeviceToHost));
        std::printf("globaltimer_resolution_ns=%llu\n", res);
        CK(cudaFree(d));
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    std::free(h);
    return 0;
}
