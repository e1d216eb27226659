// A CUDA graph with known contents: NODES launches of graphk captured on a stream, the graph instantiated and
// launched LAUNCHES times (graphk never runs outside the graph).  NODES and LAUNCHES come from the command
// line (scripts/gpu_check: -DNODES=GRAPH_NODES -DLAUNCHES=GRAPH_LAUNCHES).
#include <cstdio>
#include <cuda_runtime.h>
__global__ void graphk(float *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
int main() {
    const int n = 1 << 16;
    float *x; cudaStream_t s; cudaGraph_t g; cudaGraphExec_t e;
    if (cudaMalloc(&x, n * sizeof(float)) || cudaStreamCreate(&s)) return 1;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    for (int i = 0; i < NODES; i++) graphk<<<n / 256, 256, 0, s>>>(x, n);
    if (cudaStreamEndCapture(s, &g) || cudaGraphInstantiate(&e, g, 0)) return 1;
    for (int i = 0; i < LAUNCHES; i++) if (cudaGraphLaunch(e, s)) return 1;
    if (cudaStreamSynchronize(s)) return 1;
    cudaGraphExecDestroy(e); cudaGraphDestroy(g); cudaFree(x);
    return 0;
}
