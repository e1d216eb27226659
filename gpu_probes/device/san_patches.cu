/* Compute Sanitizer patch functions.  The injection library loads these (as
 * an embedded fatbin) with sanitizerAddPatches and hands each launch its
 * gp_slot as userdata (sanitizerSetCallbackData on the function, as NVIDIA's
 * samples do, and sanitizerSetLaunchCallbackData on the launch).  All
 * aggregation is agg.cuh, shared with the NVBit tool and the CPU tests.
 *
 * A patch that gets NULL userdata returns at once, which from the slot alone
 * looks exactly like a patch that never ran.  So every patch also counts, in
 * a __device__ global it reaches without any pointer, the calls that got no
 * buffer (null_calls) and the block entries that got one (data_calls).  A
 * patch with its buffer writes the global's address into the slot; the host
 * reads the counters from there after each launch (san_inject.cpp). */
#include <sanitizer_patching.h>

#include "gpu_probes/agg.cuh"

struct gp_san_fallback_counters {
    unsigned long long null_calls;
    unsigned long long data_calls;
};

/* One per context (the patches are added to each context as a module). */
__device__ gp_san_fallback_counters gp_san_fallback;

static __device__ __forceinline__ gp_slot *gp_san_slot(void *userdata) {
    if (!userdata) atomicAdd(&gp_san_fallback.null_calls, 1ull);
    return (gp_slot *)userdata;
}

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
    if (gp_slot *s = gp_san_slot(userdata)) gp_warp_access(s, (uint64_t)ptr, size, GP_SPACE_GLOBAL, gp_san_flags(flags));
    return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult gp_san_shared_access(void *userdata, uint64_t pc, void *ptr,
                                                                             uint32_t size, uint32_t flags,
                                                                             const void *value) {
    if (gp_slot *s = gp_san_slot(userdata)) gp_warp_access(s, (uint64_t)ptr, size, GP_SPACE_SHARED, gp_san_flags(flags));
    return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult gp_san_local_access(void *userdata, uint64_t pc, void *ptr,
                                                                            uint32_t size, uint32_t flags,
                                                                            const void *value) {
    if (gp_slot *s = gp_san_slot(userdata)) gp_warp_access(s, (uint64_t)ptr, size, GP_SPACE_LOCAL, gp_san_flags(flags));
    return SANITIZER_PATCH_SUCCESS;
}

/* Block enter/exit run on every thread: only thread 0 of the block counts. */
static __device__ __forceinline__ bool gp_first_thread() { return (threadIdx.x | threadIdx.y | threadIdx.z) == 0; }

extern "C" __device__ __noinline__ SanitizerPatchResult gp_san_block_enter(void *userdata, uint64_t pc) {
    if (!gp_first_thread()) return SANITIZER_PATCH_SUCCESS;
    if (gp_slot *s = gp_san_slot(userdata)) {
        atomicAdd(&gp_san_fallback.data_calls, 1ull);
        s->fallback = (uint64_t)(uintptr_t)&gp_san_fallback; /* the same value from every block */
        gp_block_enter(s, gp_globaltimer());
    }
    return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult gp_san_block_exit(void *userdata, uint64_t pc) {
    if (!gp_first_thread()) return SANITIZER_PATCH_SUCCESS;
    if (gp_slot *s = gp_san_slot(userdata)) gp_block_exit(s, gp_globaltimer());
    return SANITIZER_PATCH_SUCCESS;
}
