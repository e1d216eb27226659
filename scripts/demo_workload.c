/* The README's sample workload: a small vector add through the CUDA driver API.
 *
 * With an NVIDIA GPU (driver present: /proc/driver/nvidia/version) it dlopens
 * the real libcuda.so.1 and runs, ITERS times: allocate three buffers, copy two
 * in, load an embedded PTX module, look the kernel up by name, launch it,
 * synchronise, copy the result back, check it, free.  With an AMD GPU
 * (/dev/kfd) it does the same memory traffic through libamdhip64 (no kernel:
 * that would need a code object for the exact GPU).  Otherwise it dlopens
 * pasta-trace's stand-in libcuda (argv[1]) and says clearly that this is a
 * simulation.  Prototypes are declared here so it builds without vendor headers.
 *
 *   demo_workload STAND_IN_LIBCUDA [ITERS]                           */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;

/* vecadd(const float *a, const float *b, float *c, int n); PTX 6.0 / sm_50 so any
 * driver since CUDA 9 can JIT it for its GPU. */
static const char vecadd_ptx[] =
    ".version 6.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry vecadd(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 n)\n{\n"
    "  .reg .pred p;\n  .reg .b32 r<5>;\n  .reg .f32 f<4>;\n  .reg .b64 rd<11>;\n"
    "  ld.param.u64 rd1, [a];\n  ld.param.u64 rd2, [b];\n  ld.param.u64 rd3, [c];\n  ld.param.u32 r1, [n];\n"
    "  mov.u32 r2, %ctaid.x;\n  mov.u32 r3, %ntid.x;\n  mov.u32 r4, %tid.x;\n  mad.lo.s32 r2, r2, r3, r4;\n"
    "  setp.ge.s32 p, r2, r1;\n  @p bra DONE;\n"
    "  cvta.to.global.u64 rd4, rd1;\n  cvta.to.global.u64 rd5, rd2;\n  cvta.to.global.u64 rd6, rd3;\n"
    "  mul.wide.s32 rd7, r2, 4;\n  add.s64 rd8, rd4, rd7;\n  add.s64 rd9, rd5, rd7;\n  add.s64 rd10, rd6, rd7;\n"
    "  ld.global.f32 f1, [rd8];\n  ld.global.f32 f2, [rd9];\n  add.f32 f3, f1, f2;\n  st.global.f32 [rd10], f3;\n"
    "DONE:\n  ret;\n}\n";

static void *lib;

static void *need(const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "demo: the library has no %s\n", name);
        exit(1);
    }
    return p;
}

#define CHECK(call)                                                                 \
    do {                                                                            \
        int rc_ = (call);                                                           \
        if (rc_ != 0) {                                                             \
            fprintf(stderr, "demo: %s failed with %d\n", #call, rc_);               \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

static int run_cuda(int iters, int real)
{
    CUresult (*cuInit)(unsigned) = need("cuInit");
    CUresult (*cuDeviceGet)(int *, int) = need("cuDeviceGet");
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int) = need("cuDevicePrimaryCtxRetain");
    CUresult (*cuCtxSetCurrent)(CUcontext) = need("cuCtxSetCurrent");
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = need("cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) = need("cuModuleGetFunction");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = need("cuMemAlloc_v2");
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t) = need("cuMemcpyHtoD_v2");
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = need("cuMemcpyDtoH_v2");
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void **, void **) = need("cuLaunchKernel");
    CUresult (*cuCtxSynchronize)(void) = need("cuCtxSynchronize");
    CUresult (*cuMemFree)(CUdeviceptr) = need("cuMemFree_v2");

    enum { N = 1 << 20 };
    static float a[N], b[N], c[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)i;
        b[i] = 2.0f * (float)i;
    }
    int dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, vecadd_ptx));
    CHECK(cuModuleGetFunction(&fn, mod, "vecadd"));
    for (int it = 0; it < iters; it++) {
        CUdeviceptr da, db, dc;
        int n = N;
        CHECK(cuMemAlloc(&da, sizeof a));
        CHECK(cuMemAlloc(&db, sizeof b));
        CHECK(cuMemAlloc(&dc, sizeof c));
        CHECK(cuMemcpyHtoD(da, a, sizeof a));
        CHECK(cuMemcpyHtoD(db, b, sizeof b));
        void *args[] = {&da, &db, &dc, &n};
        CHECK(cuLaunchKernel(fn, N / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
        CHECK(cuCtxSynchronize());
        CHECK(cuMemcpyDtoH(c, dc, sizeof c));
        CHECK(cuMemFree(da));
        CHECK(cuMemFree(db));
        CHECK(cuMemFree(dc));
        if (real && (c[12345] != 3.0f * 12345 || c[N - 1] != 3.0f * (N - 1))) {
            fprintf(stderr, "demo: wrong result %f at 12345\n", (double)c[12345]);
            return 1;
        }
    }
    printf("demo: %d x vecadd of %d floats %s\n", iters, N, real ? "checked on the GPU" : "(simulated, not computed)");
    return 0;
}

static int run_hip(int iters)
{
    int (*hipMalloc)(void **, size_t) = need("hipMalloc");
    int (*hipMemcpy)(void *, const void *, size_t, int) = need("hipMemcpy");
    int (*hipMemset)(void *, int, size_t) = need("hipMemset");
    int (*hipDeviceSynchronize)(void) = need("hipDeviceSynchronize");
    int (*hipFree)(void *) = need("hipFree");
    enum { N = 1 << 20 };
    static float a[N], c[N];
    for (int i = 0; i < N; i++)
        a[i] = (float)i;
    for (int it = 0; it < iters; it++) {
        void *d;
        CHECK(hipMalloc(&d, sizeof a));
        CHECK(hipMemset(d, 0, sizeof a));
        CHECK(hipMemcpy(d, a, sizeof a, 1 /* hipMemcpyHostToDevice */));
        CHECK(hipDeviceSynchronize());
        CHECK(hipMemcpy(c, d, sizeof c, 2 /* hipMemcpyDeviceToHost */));
        CHECK(hipFree(d));
        if (c[N - 1] != (float)(N - 1)) {
            fprintf(stderr, "demo: wrong copy back\n");
            return 1;
        }
    }
    printf("demo: %d x alloc/memset/copy round trip of %d floats on the AMD GPU\n", iters, N);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s STAND_IN_LIBCUDA [ITERS]\n", argv[0]);
        return 2;
    }
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    if (access("/proc/driver/nvidia/version", F_OK) == 0 && (lib = dlopen("libcuda.so.1", RTLD_NOW))) {
        printf("demo: NVIDIA driver found, running on the GPU\n");
        return run_cuda(iters, 1);
    }
    if (access("/dev/kfd", F_OK) == 0 && ((lib = dlopen("libamdhip64.so", RTLD_NOW)) ||
                                          (lib = dlopen("libamdhip64.so.5", RTLD_NOW)))) {
        printf("demo: AMD GPU found, running on it through HIP\n");
        return run_hip(iters);
    }
    lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "demo: no GPU driver and no stand-in library: %s\n", dlerror());
        return 1;
    }
    printf("SIMULATION: no GPU driver, using pasta-trace's stand-in libcuda with the real exported names\n");
    fflush(stdout);
    return run_cuda(iters, 0);
}
