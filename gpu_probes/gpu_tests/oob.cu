/* One out-of-bounds global load, for `compute-sanitizer --tool memcheck`
 * (scripts/gpu_check's control): thread 0 reads a[n], one past the end of a
 * cudaMalloc'd array of n ints.  memcheck must report exactly one
 * "Invalid __global__ read of size 4". */
#include <cstdio>

__global__ void oob_read(const int *a, int *out, int n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = a[n];
}

int main() {
    const int n = 256;
    int *a = nullptr, *out = nullptr;
    if (cudaMalloc(&a, n * sizeof(int)) != cudaSuccess || cudaMalloc(&out, sizeof(int)) != cudaSuccess) {
        std::printf("cudaMalloc failed\n");
        return 2;
    }
    oob_read<<<1, 32>>>(a, out, n);
    cudaError_t e = cudaDeviceSynchronize();
    std::printf("oob_read done: %s\n", cudaGetErrorString(e));
    return 0;
}
