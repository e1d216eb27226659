/* vecadd_graph for scripts/gpu_check: N launches of vecadd captured on a
 * stream into one CUDA graph, instantiated once and launched M times
 * (`vecadd_graph N M`, default 3 4).  Under `pasta-trace record --device cupti`
 * CUPTI must give N*M vecadd kernel records with a graph id, and each must join
 * one of the M host graph launches; vecadd never runs outside the graph. */
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <numeric>
#include <vector>

#define GP_PROGRAM "vecadd_graph"
#include "vecadd.cuh"

int main(int argc, char **argv) {
    const int nodes = argc > 1 ? std::atoi(argv[1]) : 3;
    const int launches = argc > 2 ? std::atoi(argv[2]) : 4;
    const int n = 1 << 16;
    std::vector<float> h(n);
    std::iota(h.begin(), h.end(), 0.0f);
    float *a; /* one allocation: a, then b, then c */
    CK(cudaMalloc(&a, 3 * n * sizeof(float)));
    float *b = a + n, *c = a + 2 * n;
    CK(cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, a, n * sizeof(float), cudaMemcpyDeviceToDevice));
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CK(cudaStreamCreate(&s));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < nodes; ++k) vecadd<<<n / 256, 256, 0, s>>>(a, b, c, n);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
    for (int k = 0; k < launches; ++k) {
        CK(cudaGraphLaunch(exec, s));
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h.data(), c, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        if (h[i] != 2.0f * (float)i) {
            std::fprintf(stderr, "vecadd_graph: wrong result at %d\n", i);
            return 1;
        }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(g));
    CK(cudaFree(a));
    std::printf("vecadd_graph nodes=%d launches=%d ok\n", nodes, launches);
    return 0;
}
