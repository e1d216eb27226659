/* Compute Sanitizer patch functions.  The injection library loads these (as
 * an embedded fatbin) with sanitizerAddPatches and points each launch's
 * userdata at that launch's gp_slot.  All aggregation is agg.cuh, shared with
 * the NVBit tool and the CPU tests. */
#include <sanitizer_patching.h>

#include "gpu_probes/agg.cuh"

static __device__ __forceinline__ uint32_t gp_san_flags(uint32_t f) {
    uint32_t out = 0;
    if (f & SANITIZER_MEMORY_DEVICE_FLAG_READ) out |= GP_ACC_READ;
    if (f & SANITIZER_MEMORY_DEVICE_FLAG_WRITE) out |= GP_ACC_WRITE;
    if (f & SANITIZER_MEMORY_DEVICE_FLAG_ATOMSYS) out |= GP_ACC_ATOMIC;
    return out;
}

extern "C" __device__ __noinline__ SanitizerPatchResult gp_san_global_access(void *userdata, uint64_t pc, void *ptr,
                                                                             uint32_t size, uint32_t flags,
                                                                             const void *value) {
    if (userdata) gp_warp_access((gp_slot *)userdata, (uint64_t)ptr, size, GP_SPACE_GLOBAL, gp_san_flags(flags));
    return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult gp_san_shared_access(void *userdata, uint64_t pc, void *ptr,
                                                                             uint32_t size, uint32_t flags,
                                                                             const void *value) {
    if (userdata) gp_warp_access((gp_slot *)userdata, (uint64_t)ptr, size, GP_SPACE_SHARED, gp_san_flags(flags));
    return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult gp_san_local_access(void *userdata, uint64_t pc, void *ptr,
                                                                            uint32_t size, uint32_t flags,
                                                                            const void *value) {
    if (userdata) gp_warp_access((gp_slot *)userdata, (uint64_t)ptr, size, GP_SPACE_LOCAL, gp_san_flags(flags));
    return SANITIZER_PATCH_SUCCESS;
}

/* Block enter/exit run on every thread: only thread 0 of the block counts. */
static __device__ __forceinline__ bool gp_first_thread() { return (threadIdx.x | threadIdx.y | threadIdx.z) == 0; }

extern "C" __device__ __noinline__ SanitizerPatchResult gp_san_block_enter(void *userdata, uint64_t pc) {
    if (userdata && gp_first_thread()) gp_block_enter((gp_slot *)userdata, gp_globaltimer());
    return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult gp_san_block_exit(void *userdata, uint64_t pc) {
    if (userdata && gp_first_thread()) gp_block_exit((gp_slot *)userdata, gp_globaltimer());
    return SANITIZER_PATCH_SUCCESS;
}
