/* What gpu_check's vecadd programs share: the kernel (its name and body are
 * what the expected counts are written for) and the check that ends the
 * program at the first failed CUDA call, naming the call.  Define GP_PROGRAM
 * (the program's name, a string literal) before including this. */
#pragma once
#include <cstdio>
#include <cuda_runtime.h>

__global__ void vecadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e = (x);                                                                                           \
        if (e != cudaSuccess) {                                                                                        \
            std::fprintf(stderr, GP_PROGRAM ": %s: %s\n", #x, cudaGetErrorString(e));                                  \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)
