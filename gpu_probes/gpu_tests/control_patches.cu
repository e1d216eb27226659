/* Patch of the control tool (control_tool.cpp): counts global loads and
 * stores, and with a trace buffer records each access's address, in the
 * documented pattern of NVIDIA's compute-sanitizer-samples (MemoryTracker):
 * the buffer comes as userdata from sanitizerSetCallbackData. */
#include <sanitizer_patching.h>
#include <stdint.h>

struct gp_control_counters {
    unsigned long long loads;
    unsigned long long stores;
    unsigned long long traced; /* addresses offered to the trace (may exceed cap) */
    unsigned long long cap;    /* trace entries; 0: no trace */
    unsigned long long *trace;
};

extern "C" __device__ __noinline__ SanitizerPatchResult gp_control_global(void *userdata, uint64_t pc, void *ptr,
                                                                          uint32_t size, uint32_t flags,
                                                                          const void *value) {
    gp_control_counters *c = (gp_control_counters *)userdata;
    if (!c) return SANITIZER_PATCH_SUCCESS;
    if (flags & SANITIZER_MEMORY_DEVICE_FLAG_WRITE)
        atomicAdd(&c->stores, 1ull);
    else
        atomicAdd(&c->loads, 1ull);
    if (c->cap) {
        unsigned long long i = atomicAdd(&c->traced, 1ull);
        if (i < c->cap) c->trace[i] = (unsigned long long)(uintptr_t)ptr;
    }
    return SANITIZER_PATCH_SUCCESS;
}
