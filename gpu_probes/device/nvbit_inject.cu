/* NVBit device functions.  host/nvbit_tool.cu inserts calls to them before
 * instructions; they aggregate into a gp_slot through agg.cuh, exactly like
 * the Sanitizer patches.  No NVBit header is needed here, so this file
 * compiles (-Xptxas -astoolspatch --keep-device-functions) on every build.
 *
 * Arguments are what the tool passes with nvbit_add_call_arg_*: the guard
 * predicate first, then constants, then `pcell`, the address of a cell that
 * holds the current launch's gp_slot (calls are inserted once per function,
 * while the slot may move between launches when the allocation table grows). */
#include <stdint.h>

#include "gpu_probes/agg.cuh"

static __device__ __forceinline__ gp_slot *gp_nv_slot(uint64_t pcell) { return *(gp_slot *volatile *)pcell; }

/* Every instrumented instruction: warp- and thread-level counts (threads whose
 * guard predicate is true) and the opcode histogram, one atomic each. */
extern "C" __device__ __noinline__ void gp_nv_instr(int pred, uint32_t opcode_id, uint64_t pcell,
                                                    uint64_t popcodes) {
    const uint32_t active = __activemask();
    const uint32_t on = __ballot_sync(active, pred);
    if (gp_lane_id() != (uint32_t)(__ffs(active) - 1) || on == 0) return;
    gp_count_instr(gp_nv_slot(pcell), __popc(on));
    gp_add((uint64_t *)popcodes + opcode_id, 1);
}

/* Memory instructions: one call per lane with its own address. */
extern "C" __device__ __noinline__ void gp_nv_mem(int pred, uint64_t addr, uint32_t size, uint32_t space,
                                                  uint32_t flags, uint64_t pcell) {
    if (!pred) return;
    gp_warp_access(gp_nv_slot(pcell), addr, size, space, flags);
}

static __device__ __forceinline__ bool gp_nv_first_thread() { return (threadIdx.x | threadIdx.y | threadIdx.z) == 0; }

/* Before the kernel's first instruction and before each EXIT: once per block. */
extern "C" __device__ __noinline__ void gp_nv_block_enter(uint64_t pcell) {
    if (gp_nv_first_thread()) gp_block_enter(gp_nv_slot(pcell), gp_globaltimer());
}

extern "C" __device__ __noinline__ void gp_nv_block_exit(int pred, uint64_t pcell) {
    if (pred && gp_nv_first_thread()) gp_block_exit(gp_nv_slot(pcell), gp_globaltimer());
}
