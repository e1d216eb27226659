/* NVBit tool: libgpu_probes_nvbit.so, loaded with LD_PRELOAD.  Built only
 * where NVBIT_HOME points at an NVBit release (scripts/build_gpu_probes.sh);
 * NVBit is never vendored.
 *
 * Each launched function (and the functions it calls) is instrumented once:
 *   - every instruction -> gp_nv_instr: warp/thread instruction counts and the
 *     opcode histogram (opcode ids are STRING ids, interned here);
 *   - every memory instruction -> gp_nv_mem: the same agg.cuh aggregation as
 *     the Sanitizer backend (counters, page hash, allocation touches, bitmaps);
 *   - the kernel's first instruction and its EXITs -> block enter/exit.
 * Launches are serialised (cudaDeviceSynchronize at launch exit, as NVBit's own
 * counting tools do): the slot is then read back and its records queued for
 * the writer thread, with LAUNCH, OPCODE_HIST and a CLOCK_SYNC bracket.
 *
 * Environment: the same GPU_PROBES_* variables as the Sanitizer backend. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "nvbit.h"
#include "nvbit_tool.h" /* exactly once per tool: NVBit's entry points */

#include "slot.h"
#include "writer.h"

namespace {

constexpr uint32_t kMaxOpcodes = 1024;

struct Launch {
    uint64_t id;
    gp_launch rec;
};

/* The tool's state: one per process, by nature of LD_PRELOAD. */
struct NvTool {
    gp::SlotConfig cfg;
    std::unique_ptr<gp::Writer> writer;
    std::mutex mu;
    std::unordered_set<CUfunction> instrumented;
    std::map<std::string, uint32_t> opcode_ids; /* opcode -> STRING id */
    std::map<std::string, uint32_t> names;      /* kernel name -> STRING id */
    uint32_t next_string = 1;
    std::map<uint64_t, uint64_t> live; /* base -> size */
    uint64_t next_launch = 1;
    /* Device-visible (managed) memory: the cell the inserted calls read, the
     * slot image, and the opcode counters. */
    gp_slot **cell = nullptr;
    uint8_t *slot_mem = nullptr;
    size_t slot_cap = 0;
    uint64_t *opcodes = nullptr;
    std::unique_ptr<gp::SlotImage> img;
    Launch current{};
};

NvTool *g = nullptr;
thread_local bool in_tool = false; /* our own CUDA calls must not re-enter the callback */

uint32_t env_u32(const char *name, uint32_t dflt) {
    const char *v = std::getenv(name);
    return v && *v ? (uint32_t)std::strtoul(v, nullptr, 0) : dflt;
}

uint32_t intern(std::map<std::string, uint32_t> &ids, const std::string &s) {
    auto it = ids.find(s);
    if (it != ids.end()) return it->second;
    const uint32_t id = g->next_string++;
    ids.emplace(s, id);
    gp_string_header h{id, (uint32_t)s.size()};
    g->writer->submit(gp::Rec(GP_REC_STRING, 0).put(h).bytes(s.data(), s.size()));
    return id;
}

uint32_t space_of(InstrType::MemorySpace m) {
    switch (m) {
    case InstrType::MemorySpace::SHARED:
        return GP_SPACE_SHARED;
    case InstrType::MemorySpace::LOCAL:
        return GP_SPACE_LOCAL;
    default:
        return GP_SPACE_GLOBAL; /* GLOBAL and GENERIC (generic addresses are mostly global) */
    }
}

bool is_memory(InstrType::MemorySpace m) {
    return m == InstrType::MemorySpace::GLOBAL || m == InstrType::MemorySpace::GENERIC ||
           m == InstrType::MemorySpace::SHARED || m == InstrType::MemorySpace::LOCAL;
}

void instrument(CUcontext ctx, CUfunction kernel) {
    std::vector<CUfunction> fs = nvbit_get_related_functions(ctx, kernel);
    fs.push_back(kernel);
    for (CUfunction f : fs) {
        if (!g->instrumented.insert(f).second) continue;
        const std::vector<Instr *> &instrs = nvbit_get_instrs(ctx, f);
        for (size_t k = 0; k < instrs.size(); ++k) {
            Instr *i = instrs[k];
            const uint32_t op = intern(g->opcode_ids, i->getOpcode());
            if (op >= kMaxOpcodes) continue; /* counted nowhere rather than out of bounds */
            nvbit_insert_call(i, "gp_nv_instr", IPOINT_BEFORE);
            nvbit_add_call_arg_guard_pred_val(i);
            nvbit_add_call_arg_const_val32(i, op);
            nvbit_add_call_arg_const_val64(i, (uint64_t)(uintptr_t)g->cell);
            nvbit_add_call_arg_const_val64(i, (uint64_t)(uintptr_t)g->opcodes);

            if (f == kernel && k == 0) {
                nvbit_insert_call(i, "gp_nv_block_enter", IPOINT_BEFORE);
                nvbit_add_call_arg_const_val64(i, (uint64_t)(uintptr_t)g->cell);
            }
            if (f == kernel && std::strcmp(i->getOpcodeShort(), "EXIT") == 0) {
                nvbit_insert_call(i, "gp_nv_block_exit", IPOINT_BEFORE);
                nvbit_add_call_arg_guard_pred_val(i);
                nvbit_add_call_arg_const_val64(i, (uint64_t)(uintptr_t)g->cell);
            }
            if (!is_memory(i->getMemorySpace())) continue;
            bool has_mref = false;
            for (int o = 0; o < i->getNumOperands(); ++o)
                has_mref |= i->getOperand(o)->type == InstrType::OperandType::MREF;
            if (!has_mref) continue;
            const std::string opc = i->getOpcodeShort();
            uint32_t flags = 0;
            if (i->isLoad()) flags |= GP_ACC_READ;
            if (i->isStore()) flags |= GP_ACC_WRITE;
            if (opc.rfind("ATOM", 0) == 0 || opc.rfind("RED", 0) == 0) flags |= GP_ACC_ATOMIC;
            nvbit_insert_call(i, "gp_nv_mem", IPOINT_BEFORE);
            nvbit_add_call_arg_guard_pred_val(i);
            nvbit_add_call_arg_mref_addr64(i, 0); /* the first MREF operand */
            nvbit_add_call_arg_const_val32(i, (uint32_t)i->getSize());
            nvbit_add_call_arg_const_val32(i, space_of(i->getMemorySpace()));
            nvbit_add_call_arg_const_val32(i, flags);
            nvbit_add_call_arg_const_val64(i, (uint64_t)(uintptr_t)g->cell);
        }
    }
}

/* Fresh slot for the launch about to start: current allocation table, zeroed counters. */
bool prepare_slot() {
    std::vector<std::pair<uint64_t, uint64_t>> v(g->live.begin(), g->live.end());
    g->img.reset(new gp::SlotImage(g->cfg, gp::AllocTable::build(std::move(v), g->cfg.page_shift)));
    const size_t need = g->img->layout().total;
    if (need > g->slot_cap) {
        if (g->slot_mem) cudaFree(g->slot_mem);
        g->slot_mem = nullptr;
        g->slot_cap = 0;
        if (cudaMallocManaged(&g->slot_mem, need) != cudaSuccess) {
            std::fprintf(stderr, "gpu_probes: cannot allocate %zu bytes of managed memory for a slot\n", need);
            return false;
        }
        g->slot_cap = need;
    }
    g->img->reset((uint64_t)(uintptr_t)g->slot_mem);
    std::memcpy(g->slot_mem, g->img->bytes().data(), need);
    std::memset(g->opcodes, 0, kMaxOpcodes * sizeof(uint64_t));
    *g->cell = reinterpret_cast<gp_slot *>(g->slot_mem);
    return true;
}

void finish_launch(uint64_t after) {
    gp::SlotImage &img = *g->img;
    std::memcpy(img.bytes().data(), g->slot_mem, img.layout().total);
    const uint64_t id = g->current.id;
    g->writer->submit(gp::Rec(GP_REC_LAUNCH, id).put(g->current.rec));
    if (img.header()->sum.blocks_in) {
        gp_clock_sync cs{g->current.rec.host_mono_begin, img.header()->sum.gpu_t_first, after, 0, 0};
        g->writer->submit(gp::Rec(GP_REC_CLOCK_SYNC, id).put(cs));
    }
    for (auto &r : img.records(id)) g->writer->submit(std::move(r));
    std::vector<gp_opcode_hist_entry> hist;
    for (const auto &kv : g->opcode_ids)
        if (kv.second < kMaxOpcodes && g->opcodes[kv.second]) hist.push_back({kv.second, 0, g->opcodes[kv.second]});
    gp_opcode_hist_header hh{(uint32_t)hist.size(), 0};
    g->writer->submit(
        gp::Rec(GP_REC_OPCODE_HIST, id).put(hh).bytes(hist.data(), hist.size() * sizeof(gp_opcode_hist_entry)));
}

void on_alloc(int type, uint64_t addr, uint64_t size, uint32_t kind) {
    if (type == GP_REC_ALLOC) {
        g->live[addr] = size;
    } else {
        auto it = g->live.find(addr);
        if (it == g->live.end()) return;
        size = it->second;
        g->live.erase(it);
    }
    gp_alloc a{gp::mono_ns(), addr, size, 0, 0, kind, 0};
    g->writer->submit(gp::Rec((uint16_t)type, 0).put(a));
}

} // namespace

void nvbit_at_init() {
    g = new NvTool();
    g->cfg.page_shift = env_u32("GPU_PROBES_PAGE_SHIFT", GP_DEFAULT_PAGE_SHIFT);
    uint32_t slots = env_u32("GPU_PROBES_HASH_SLOTS", 4096);
    g->cfg.hash_capacity = 8;
    while (g->cfg.hash_capacity < slots && g->cfg.hash_capacity < (1u << 24)) g->cfg.hash_capacity <<= 1;
    gp::Writer::Options o;
    o.backend = GP_BACKEND_NVBIT;
    o.page_shift = g->cfg.page_shift;
    o.pid = (uint64_t)getpid();
    std::string err;
    g->writer = gp::Writer::open(gp::default_path(o.pid, "nvbit"), o, gp::Clocks::now(), &err);
    if (!g->writer) std::fprintf(stderr, "gpu_probes: cannot write the device record file: %s\n", err.c_str());
}

void nvbit_at_term() {
    if (g && g->writer) g->writer->close();
}

void nvbit_at_cuda_event(CUcontext ctx, int is_exit, nvbit_api_cuda_t cbid, const char * /*name*/, void *params,
                         CUresult *pStatus) {
    if (!g || !g->writer || in_tool) return;
    std::lock_guard<std::mutex> lock(g->mu);
    in_tool = true;
    const bool ok = !is_exit || *pStatus == CUDA_SUCCESS;
    switch (cbid) {
    case API_CUDA_cuMemAlloc_v2:
        if (is_exit && ok) {
            auto *p = (cuMemAlloc_v2_params *)params;
            on_alloc(GP_REC_ALLOC, *p->dptr, p->bytesize, 0);
        }
        break;
    case API_CUDA_cuMemAllocManaged:
        if (is_exit && ok) {
            auto *p = (cuMemAllocManaged_params *)params;
            on_alloc(GP_REC_ALLOC, *p->dptr, p->bytesize, 1);
        }
        break;
    case API_CUDA_cuMemAllocAsync:
        if (is_exit && ok) {
            auto *p = (cuMemAllocAsync_params *)params;
            on_alloc(GP_REC_ALLOC, *p->dptr, p->bytesize, 3);
        }
        break;
    case API_CUDA_cuMemFree_v2:
        if (is_exit && ok) on_alloc(GP_REC_FREE, ((cuMemFree_v2_params *)params)->dptr, 0, 0);
        break;
    case API_CUDA_cuMemFreeAsync:
        if (is_exit && ok) on_alloc(GP_REC_FREE, ((cuMemFreeAsync_params *)params)->dptr, 0, 0);
        break;
    case API_CUDA_cuLaunchKernel:
    case API_CUDA_cuLaunchKernel_ptsz:
    case API_CUDA_cuLaunchKernelEx:
    case API_CUDA_cuLaunchKernelEx_ptsz: {
        const bool ex = cbid == API_CUDA_cuLaunchKernelEx || cbid == API_CUDA_cuLaunchKernelEx_ptsz;
        CUfunction f;
        gp_launch r{};
        if (ex) {
            auto *p = (cuLaunchKernelEx_params *)params;
            f = p->f;
            r.grid_x = p->config->gridDimX, r.grid_y = p->config->gridDimY, r.grid_z = p->config->gridDimZ;
            r.block_x = p->config->blockDimX, r.block_y = p->config->blockDimY, r.block_z = p->config->blockDimZ;
            r.stream = (uint64_t)(uintptr_t)p->config->hStream;
        } else {
            auto *p = (cuLaunchKernel_params *)params;
            f = p->f;
            r.grid_x = p->gridDimX, r.grid_y = p->gridDimY, r.grid_z = p->gridDimZ;
            r.block_x = p->blockDimX, r.block_y = p->blockDimY, r.block_z = p->blockDimZ;
            r.stream = (uint64_t)(uintptr_t)p->hStream;
        }
        if (!is_exit) {
            if (!g->cell) {
                cudaMallocManaged(&g->cell, sizeof(gp_slot *));
                cudaMallocManaged(&g->opcodes, kMaxOpcodes * sizeof(uint64_t));
            }
            instrument(ctx, f);
            const bool ready = prepare_slot();
            nvbit_enable_instrumented(ctx, f, ready);
            r.host_mono_begin = gp::mono_ns();
            r.ctx = (uint64_t)(uintptr_t)ctx;
            r.func = (uint64_t)(uintptr_t)f;
            r.grid_id = -1; /* NVBit has no grid id; launch_id orders launches */
            r.name_id = intern(g->names, nvbit_get_func_name(ctx, f, true));
            r.tid = (uint32_t)gettid();
            g->current = Launch{g->next_launch++, r};
        } else {
            g->current.rec.host_mono_end = gp::mono_ns();
            const bool done = cudaDeviceSynchronize() == cudaSuccess;
            if (done && ok) finish_launch(gp::mono_ns());
        }
        break;
    }
    default:
        break;
    }
    in_tool = false;
}
