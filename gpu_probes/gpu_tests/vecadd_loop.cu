/* vecadd_loop for scripts/gpu_check's attach row: a running CUDA program that
 * pasta-trace attaches to mid-run (`record -p PID --device cupti`).
 *
 *     vecadd_loop N RATE CTL
 *
 * Launches vecadd over N floats about RATE times a second, copying c back and
 * checking every element after each launch, and sleeps in between (the main
 * thread is then in an idle system call: the one the collector call is made
 * on, so no launch falls between the collector's file opening and its
 * activity kinds being enabled).  Files named CTL.pause, CTL.resume and
 * CTL.quit steer it: while CTL.pause exists and CTL.resume does not it makes
 * no launch (so that the capture can end with no launch in flight) and says
 * "paused launches=K" once; CTL.quit ends it with "done launches=T ok" and
 * exit 0.  A wrong result ends it with exit 1. */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <unistd.h>
#include <cuda_runtime.h>

#define GP_PROGRAM "vecadd_loop"
#include "vecadd.cuh"

static bool exists(const std::string &p) { return access(p.c_str(), F_OK) == 0; }

int main(int argc, char **argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: vecadd_loop N RATE CTL\n");
        return 2;
    }
    const int n = std::atoi(argv[1]);
    const double rate = std::atof(argv[2]);
    const std::string ctl = argv[3];
    if (n <= 0 || rate <= 0) {
        std::fprintf(stderr, "vecadd_loop: N and RATE must be positive\n");
        return 2;
    }
    const long period_ns = (long)(1e9 / rate);
    const timespec period = {period_ns / 1000000000L, period_ns % 1000000000L};
    float *a, *b, *c;
    CK(cudaMalloc(&a, n * sizeof(float)));
    CK(cudaMalloc(&b, n * sizeof(float)));
    CK(cudaMalloc(&c, n * sizeof(float)));
    float *h = (float *)std::malloc(n * sizeof(float));
    for (int i = 0; i < n; ++i) h[i] = (float)i;
    CK(cudaMemcpy(a, h, n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, h, n * sizeof(float), cudaMemcpyHostToDevice));
    std::printf("vecadd_loop ready pid=%d n=%d\n", (int)getpid(), n);
    std::fflush(stdout);
    long launches = 0;
    bool paused = false;
    while (!exists(ctl + ".quit")) {
        if (exists(ctl + ".pause") && !exists(ctl + ".resume")) {
            if (!paused) {
                std::printf("paused launches=%ld\n", launches);
                std::fflush(stdout);
                paused = true;
            }
            nanosleep(&period, nullptr);
            continue;
        }
        if (paused) {
            std::printf("resumed\n");
            std::fflush(stdout);
            paused = false;
        }
        std::memset(h, 0, n * sizeof(float));
        vecadd<<<(n + 255) / 256, 256>>>(a, b, c, n);
        CK(cudaGetLastError());
        CK(cudaMemcpy(h, c, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; ++i)
            if (h[i] != 2.0f * (float)i) {
                std::printf("vecadd_loop: wrong result at %d after %ld launches\n", i, launches);
                return 1;
            }
        ++launches;
        nanosleep(&period, nullptr);
    }
    std::printf("done launches=%ld ok\n", launches);
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    std::free(h);
    return 0;
}
