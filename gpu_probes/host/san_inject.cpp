/* Compute Sanitizer injection library: libgpu_probes_sanitizer.so.
 *
 * Load with LD_PRELOAD=<lib> or CUDA_INJECTION64_PATH=<lib>.  Either way a
 * static initializer subscribes when the library is loaded, as NVIDIA's
 * samples do, and InitializeInjection (the driver's call from cuInit) returns
 * what that did: 1 subscribed, 0 not, however often it is called.  The
 * library pins itself (RTLD_NODELETE) so that no callback can ever point into
 * an unloaded image.  Per launch it binds one slot of
 * device memory (agg.cuh's gp_slot) to the launch, lets the patch functions in
 * device/san_patches.cu aggregate into it, and at LAUNCH_END copies it back
 * and queues KERNEL_SUMMARY, PAGE_HIST, ALLOC_TOUCH, WS_BITMAP, LAUNCH and
 * CLOCK_SYNC records for the writer thread.  Callbacks never touch the file.
 *
 * Mode: strict.  LAUNCH_END synchronises the launch's stream before reading
 * the slot, so launches are serialised per stream (the overhead class of
 * compute-sanitizer itself).  Slots come from a per-context pool and return to
 * it after the copy-back.
 *
 * Environment:
 *   GPU_PROBES_DIR          output directory (default: the working directory)
 *   GPU_PROBES_PAGE_SHIFT   log2 of the page size of histogram and bitmaps (default 16 = 64 KiB)
 *   GPU_PROBES_HASH_SLOTS   page-hash slots per launch, rounded up to a power of two (default 4096)
 *   GPU_PROBES_SAMPLE       off | warp:N | cta:K   raw access samples (default off)
 *   GPU_PROBES_SAMPLE_CAP   samples kept per launch (default 4096)
 *   GPU_PROBES_VERBOSE      1: log each module patched and each launch to stderr
 *   GPU_PROBES_KEEP_STATUS  1: write the final TOOL_STATUS even when no CUDA callback came (then the
 *                           file says "loaded and subscribed, never called"; gpu_check sets it)
 *
 * What every set-up call returned (subscribe, add-patches, patch-instructions,
 * patch-module, loaded-status, set-callback-data), the modules patched, the
 * loading mode and the patches' own fallback counters go into the record file
 * itself as TOOL_STATUS records (device format 1.1), after the subscribe,
 * after each module and at exit: a failed run says why where it is kept.
 */
#include <dlfcn.h>
#include <limits.h>
#include <sanitizer.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "slot.h"
#include "injection.h"
#include "writer.h"

extern "C" const unsigned char gp_san_patches_fatbin[];

namespace {

struct DeviceSlot {
    void *dev = nullptr;
    size_t capacity = 0;
    uint64_t alloc_version = ~0ull;
    std::unique_ptr<gp::SlotImage> img;
};

struct Inflight {
    DeviceSlot *slot;
    CUcontext ctx;
    uint64_t launch_id;
    gp_launch rec;
};

struct Allocation {
    uint64_t size;
    uint32_t kind;
};

/* All state of the injection library.  One per process, by nature of the
 * driver's injection hook. */
struct Tool {
    uint64_t pid; /* a forked child inherits this state but none of its threads: it stays out */
    gp::SlotConfig cfg;
    std::unique_ptr<gp::Writer> writer;
    Sanitizer_SubscriberHandle sub = nullptr;
    std::atomic<uint64_t> next_launch{1};

    std::mutex mu; /* guards everything below; held for map updates only, never across I/O */
    std::map<uint64_t, Allocation> live;
    uint64_t alloc_version = 0;
    gp::AllocTable table;
    uint64_t table_version = ~0ull;
    std::unordered_map<CUcontext, std::vector<DeviceSlot *>> free_slots;
    std::unordered_map<CUcontext, std::vector<DeviceSlot *>> all_slots;
    std::unordered_map<Sanitizer_LaunchHandle, Inflight> inflight;
    std::unordered_map<std::string, uint32_t> strings;

    /* The patching API must be serialised, and it may call back (a module or
     * functions loaded): its own lock, never held with `mu`. */
    std::recursive_mutex patch_mu;
    std::unordered_map<CUcontext, bool> patches_loaded;
    std::unordered_map<CUmodule, bool> patched; /* modules instrumented (sanitizerPatchModule succeeded) */
    std::unordered_map<CUmodule, bool> failed;  /* modules whose patching failed: not retried at every launch */

    /* TOOL_STATUS: guarded by status_mu (taken alone, never with mu or patch_mu held... except
     * patch_mu, which is always taken first). */
    std::mutex status_mu;
    gp_tool_status status{};
    std::unordered_map<CUcontext, uint64_t> fallback_addr; /* the patches' counters, per context */
    std::atomic<bool> used{false}; /* a CUDA callback came: this process uses CUDA */
};

Tool *g_tool = nullptr;

/* Set while this thread is inside our own callback work: any callback that our
 * sanitizerAlloc/Memcpy/Free calls trigger is ours, not the program's, and
 * must not take t.mu again. */
thread_local bool in_tool = false;

/* Set while this thread is inside a patching call: a load it triggers is
 * patched at its module's first launch instead (the API is not re-entrant). */
thread_local bool in_patching = false;

bool g_verbose = false;

#define GP_LOG(...)                                                                                                    \
    do {                                                                                                               \
        if (g_verbose) {                                                                                               \
            std::fprintf(stderr, "gpu_probes[%d]: ", (int)getpid());                                                   \
            std::fprintf(stderr, __VA_ARGS__);                                                                         \
            std::fputc('\n', stderr);                                                                                  \
        }                                                                                                              \
    } while (0)

void warn(const char *what, SanitizerResult r) {
    const char *s = "?";
    sanitizerGetResultString(r, &s);
    std::fprintf(stderr, "gpu_probes: %s failed: %s\n", what, s);
}

/* A call's result, warned about when it failed. */
SanitizerResult check(const char *what, SanitizerResult r) {
    if (r != SANITIZER_SUCCESS) warn(what, r);
    return r;
}

#define GP_CALL(call) check(#call, (call))

/* Keeps the first failure of a call in its TOOL_STATUS field (success only replaces "not called"). */
void note(Tool &t, int32_t gp_tool_status::*field, SanitizerResult r) {
    std::lock_guard<std::mutex> g(t.status_mu);
    int32_t &f = t.status.*field;
    if (f == GP_RC_NOT_CALLED || (f == 0 && r != SANITIZER_SUCCESS)) f = (int32_t)r;
}

void submit_status(Tool &t, uint32_t stage) {
    gp_tool_status st;
    {
        std::lock_guard<std::mutex> g(t.status_mu);
        t.status.host_mono = gp::mono_ns();
        t.status.stage = stage;
        st = t.status;
    }
    t.writer->submit(gp::Rec(GP_REC_TOOL_STATUS, 0).put(st));
}

uint32_t loading_mode() {
    const char *m = std::getenv("CUDA_MODULE_LOADING");
    if (!m || !*m) return GP_LOADING_UNSET;
    if (!strcasecmp(m, "LAZY")) return GP_LOADING_LAZY;
    if (!strcasecmp(m, "EAGER")) return GP_LOADING_EAGER;
    return GP_LOADING_OTHER;
}

uint32_t env_u32(const char *name, uint32_t dflt) {
    const char *v = std::getenv(name);
    if (!v || !*v) return dflt;
    char *end = nullptr;
    unsigned long x = std::strtoul(v, &end, 0);
    if (*end) {
        std::fprintf(stderr, "gpu_probes: ignoring %s=%s (not a number)\n", name, v);
        return dflt;
    }
    return (uint32_t)x;
}

gp::SlotConfig config_from_env() {
    gp::SlotConfig c;
    c.page_shift = env_u32("GPU_PROBES_PAGE_SHIFT", GP_DEFAULT_PAGE_SHIFT);
    if (c.page_shift < 8 || c.page_shift > 30) c.page_shift = GP_DEFAULT_PAGE_SHIFT;
    uint32_t slots = env_u32("GPU_PROBES_HASH_SLOTS", 4096);
    c.hash_capacity = 8;
    while (c.hash_capacity < slots && c.hash_capacity < (1u << 24)) c.hash_capacity <<= 1;
    const char *s = std::getenv("GPU_PROBES_SAMPLE");
    if (s && !std::strncmp(s, "warp:", 5)) {
        c.sample_mode = GP_SAMPLE_WARP_INSTR;
        c.sample_every = (uint32_t)std::strtoul(s + 5, nullptr, 10);
    } else if (s && !std::strncmp(s, "cta:", 4)) {
        c.sample_mode = GP_SAMPLE_CTA;
        c.sample_every = (uint32_t)std::strtoul(s + 4, nullptr, 10);
    }
    if (c.sample_every == 0) c.sample_mode = GP_SAMPLE_OFF;
    c.sample_cap = c.sample_mode == GP_SAMPLE_OFF ? 0 : env_u32("GPU_PROBES_SAMPLE_CAP", 4096);
    return c;
}

uint32_t intern(Tool &t, const char *name, uint64_t launch_id) {
    if (!name) name = "";
    std::string key(name);
    uint32_t id;
    {
        std::lock_guard<std::mutex> g(t.mu);
        auto it = t.strings.find(key);
        if (it != t.strings.end()) return it->second;
        id = (uint32_t)t.strings.size() + 1;
        t.strings.emplace(key, id);
    }
    gp_string_header h{id, (uint32_t)key.size()};
    t.writer->submit(gp::Rec(GP_REC_STRING, launch_id).put(h).bytes(key.data(), key.size()));
    return id;
}

void load_patches(Tool &t, CUcontext ctx, CUmodule module, const char *why) {
    std::lock_guard<std::recursive_mutex> g(t.patch_mu);
    if (in_patching) {
        GP_LOG("%s during patching: module %p is patched at its first launch", why, (void *)module);
        return;
    }
    if (t.patched.count(module) || t.failed.count(module)) return;
    in_patching = true;
    bool ok = true;
    if (!t.patches_loaded[ctx]) {
        SanitizerResult r = GP_CALL(sanitizerAddPatches(gp_san_patches_fatbin, ctx));
        note(t, &gp_tool_status::rc_add_patches, r);
        ok = r == SANITIZER_SUCCESS;
        t.patches_loaded[ctx] = ok;
        GP_LOG("patches added to context %p: %s", (void *)ctx, ok ? "ok" : "FAILED");
    }
    if (ok) {
        /* Every call is made and noted, even after one failed: the record then has them all. */
        static const struct {
            Sanitizer_InstructionId id;
            const char *patch;
        } kPatches[] = {
            {SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, "gp_san_global_access"},
            {SANITIZER_INSTRUCTION_SHARED_MEMORY_ACCESS, "gp_san_shared_access"},
            {SANITIZER_INSTRUCTION_LOCAL_MEMORY_ACCESS, "gp_san_local_access"},
            {SANITIZER_INSTRUCTION_BLOCK_ENTER, "gp_san_block_enter"},
            {SANITIZER_INSTRUCTION_BLOCK_EXIT, "gp_san_block_exit"},
        };
        for (const auto &p : kPatches) {
            SanitizerResult r = check(p.patch, sanitizerPatchInstructions(p.id, module, p.patch));
            note(t, &gp_tool_status::rc_patch_instructions, r);
            ok = ok && r == SANITIZER_SUCCESS;
        }
        SanitizerResult r = GP_CALL(sanitizerPatchModule(module));
        note(t, &gp_tool_status::rc_patch_module, r);
        ok = ok && r == SANITIZER_SUCCESS;
    }
    (ok ? t.patched : t.failed)[module] = true;
    in_patching = false;
    {
        std::lock_guard<std::mutex> s(t.status_mu);
        ++(ok ? t.status.modules_patched : t.status.modules_failed);
    }
    submit_status(t, GP_STAGE_MODULE);
    GP_LOG("%s: module %p of context %p patched: %s", why, (void *)module, (void *)ctx, ok ? "ok" : "FAILED");
}

/* A module launched before it was patched (its load was missed, or came
 * during patching) is patched now, before this launch runs. */
void ensure_patched(Tool &t, CUcontext ctx, CUmodule module) {
    if (!module) return;
    {
        std::lock_guard<std::recursive_mutex> g(t.patch_mu);
        if (t.patched.count(module) || t.failed.count(module)) return;
    }
    load_patches(t, ctx, module, "first launch of an unpatched module");
}

void on_alloc(Tool &t, int type, uint64_t addr, uint64_t size, uint32_t kind, CUcontext ctx, CUstream stream) {
    {
        std::lock_guard<std::mutex> g(t.mu);
        if (type == GP_REC_ALLOC)
            t.live[addr] = Allocation{size, kind};
        else {
            auto it = t.live.find(addr);
            if (it == t.live.end()) return;
            size = it->second.size;
            kind = it->second.kind;
            t.live.erase(it);
        }
        ++t.alloc_version;
    }
    gp_alloc a{gp::mono_ns(), addr, size, (uint64_t)(uintptr_t)ctx, (uint64_t)(uintptr_t)stream, kind, 0};
    t.writer->submit(gp::Rec((uint16_t)type, 0).put(a));
}

uint32_t alloc_kind(uint32_t cbid, uint32_t flags) {
    if (cbid == SANITIZER_CBID_RESOURCE_MEMORY_ALLOC_ASYNC) return GP_ALLOC_ASYNC;
    if (cbid == SANITIZER_CBID_RESOURCE_HOST_MEMORY_ALLOC) return GP_ALLOC_HOST;
    if (flags & SANITIZER_MEMORY_FLAG_MANAGED) return GP_ALLOC_MANAGED;
    if (flags & (SANITIZER_MEMORY_FLAG_HOST_PINNED | SANITIZER_MEMORY_FLAG_HOST_MAPPED)) return GP_ALLOC_HOST;
    return GP_ALLOC_DEVICE;
}

/* A slot sized for the current allocation table, with its image reset and
 * pointing at its device memory.  Called with t.mu held. */
DeviceSlot *take_slot(Tool &t, CUcontext ctx) {
    if (t.table_version != t.alloc_version) {
        std::vector<gp::Range> v;
        v.reserve(t.live.size());
        for (const auto &kv : t.live) v.push_back({kv.first, kv.second.size, kv.second.kind == GP_ALLOC_VIRTUAL});
        t.table = gp::AllocTable::build(std::move(v), t.cfg.page_shift);
        t.table_version = t.alloc_version;
    }
    std::vector<DeviceSlot *> &pool = t.free_slots[ctx];
    DeviceSlot *s;
    if (pool.empty()) {
        s = new DeviceSlot();
        t.all_slots[ctx].push_back(s);
    } else {
        s = pool.back();
        pool.pop_back();
    }
    if (s->alloc_version != t.table_version) {
        s->img.reset(new gp::SlotImage(t.cfg, t.table));
        s->alloc_version = t.table_version;
    }
    const size_t need = s->img->layout().total;
    if (need > s->capacity) {
        if (s->dev) sanitizerFree(ctx, s->dev);
        s->dev = nullptr;
        s->capacity = 0;
        if (GP_CALL(sanitizerAlloc(ctx, &s->dev, need)) != SANITIZER_SUCCESS) {
            pool.push_back(s);
            return nullptr;
        }
        s->capacity = need;
    }
    s->img->reset((uint64_t)(uintptr_t)s->dev);
    return s;
}

void on_launch_begin(Tool &t, const Sanitizer_LaunchData *d) {
    /* Before any other Sanitizer call of this launch: a module whose load was
     * missed (or came during patching) is patched now.  Lazily loaded
     * functions of a patched module are patched by the API itself
     * (FUNCTIONS_LAZY_PATCHED); they are never patched from here. */
    ensure_patched(t, d->context, d->module);
    {
        std::lock_guard<std::mutex> g(t.status_mu);
        ++t.status.launches;
    }
    Sanitizer_FunctionLoadedStatus loaded = SANITIZER_FUNCTION_NOT_LOADED;
    SanitizerResult lr = GP_CALL(sanitizerGetFunctionLoadedStatus(d->function, &loaded));
    note(t, &gp_tool_status::rc_loaded_status, lr);
    if (lr == SANITIZER_SUCCESS && loaded != SANITIZER_FUNCTION_LOADED) {
        std::lock_guard<std::mutex> g(t.status_mu);
        ++t.status.functions_not_loaded;
    }
    const uint64_t now = gp::mono_ns();
    const uint64_t id = t.next_launch.fetch_add(1);
    DeviceSlot *slot;
    {
        std::lock_guard<std::mutex> g(t.mu);
        slot = take_slot(t, d->context);
    }
    if (!slot) return;
    /* The whole image (header, zeroed hash and counters, allocation table) in one copy. */
    bool given = GP_CALL(sanitizerMemcpyHostToDeviceAsync(slot->dev, slot->img->bytes().data(),
                                                          slot->img->layout().total, d->hStream)) == SANITIZER_SUCCESS;
    if (given) {
        /* Both routes to the same slot: per function as the samples do, and per
         * launch, which wins for this launch where the driver supports it
         * (the same function may run on two streams at once). */
        SanitizerResult rf = GP_CALL(sanitizerSetCallbackData(d->function, slot->dev));
        SanitizerResult rl = GP_CALL(sanitizerSetLaunchCallbackData(d->hLaunch, d->function, d->hStream, slot->dev));
        note(t, &gp_tool_status::rc_set_callback_data, rf);
        note(t, &gp_tool_status::rc_set_launch_data, rl);
        given = rf == SANITIZER_SUCCESS || rl == SANITIZER_SUCCESS;
    }
    if (!given) {
        std::lock_guard<std::mutex> g(t.mu);
        t.free_slots[d->context].push_back(slot);
        return;
    }
    {
        std::lock_guard<std::mutex> g(t.status_mu);
        ++t.status.launches_with_data;
    }
    Inflight f{slot, d->context, id, {}};
    gp_launch &r = f.rec;
    r.host_mono_begin = now;
    r.ctx = (uint64_t)(uintptr_t)d->context;
    r.stream = (uint64_t)(uintptr_t)d->stream;
    r.func = (uint64_t)(uintptr_t)d->function;
    r.grid_id = (int64_t)d->gridId;
    r.grid_x = d->gridDim_x;
    r.grid_y = d->gridDim_y;
    r.grid_z = d->gridDim_z;
    r.block_x = d->blockDim_x;
    r.block_y = d->blockDim_y;
    r.block_z = d->blockDim_z;
    r.device = (uint32_t)d->device;
    r.name_id = intern(t, d->functionName, id);
    r.tid = (uint32_t)gettid();
    GP_LOG("launch %llu begins: %s, grid %u, slot %p (%zu B, %u allocations in its table)", (unsigned long long)id,
           d->functionName ? d->functionName : "?", d->gridDim_x, slot->dev, slot->img->layout().total,
           slot->img->header()->n_allocs);
    std::lock_guard<std::mutex> g(t.mu);
    t.inflight[d->hLaunch] = f;
}

/* The patches' fallback counters of `ctx` (their address as a patch with its
 * buffer wrote it into the slot; 0: this launch's patches did not), read
 * after the launch's stream is synchronised.  They count every launch of the
 * context so far, those that got no buffer included. */
void read_fallback(Tool &t, CUcontext ctx, uint64_t published, Sanitizer_StreamHandle stream) {
    uint64_t addr;
    {
        std::lock_guard<std::mutex> g(t.status_mu);
        if (published) t.fallback_addr[ctx] = published;
        auto it = t.fallback_addr.find(ctx);
        if (it == t.fallback_addr.end()) return;
        addr = it->second;
    }
    uint64_t c[2] = {0, 0};
    SanitizerResult r = GP_CALL(sanitizerMemcpyDeviceToHost(c, (void *)(uintptr_t)addr, sizeof c, stream));
    note(t, &gp_tool_status::rc_fallback_read, r);
    if (r != SANITIZER_SUCCESS) return;
    std::lock_guard<std::mutex> g(t.status_mu);
    t.status.patch_null_calls = c[0];
    t.status.patch_data_calls = c[1];
}

void on_launch_end(Tool &t, const Sanitizer_LaunchData *d) {
    Inflight f;
    {
        std::lock_guard<std::mutex> g(t.mu);
        auto it = t.inflight.find(d->hLaunch);
        if (it == t.inflight.end()) return;
        f = it->second;
        t.inflight.erase(it);
    }
    f.rec.host_mono_end = gp::mono_ns();
    gp::SlotImage &img = *f.slot->img;
    bool ok = GP_CALL(sanitizerStreamSynchronize(d->hStream)) == SANITIZER_SUCCESS;
    ok = ok && GP_CALL(sanitizerMemcpyDeviceToHost(img.bytes().data(), f.slot->dev, img.layout().total,
                                                   d->hStream)) == SANITIZER_SUCCESS;
    const uint64_t after = gp::mono_ns();
    read_fallback(t, f.ctx, ok ? img.header()->fallback : 0, d->hStream);
    {
        std::lock_guard<std::mutex> g(t.mu);
        t.free_slots[f.ctx].push_back(f.slot);
    }
    t.writer->submit(gp::Rec(GP_REC_LAUNCH, f.launch_id).put(f.rec));
    GP_LOG("launch %llu ended: copied back %s, blocks entered %llu, global loads %llu",
           (unsigned long long)f.launch_id, ok ? "ok" : "FAILED", (unsigned long long)img.header()->sum.blocks_in,
           (unsigned long long)img.header()->sum.gld);
    if (!ok) return;
    /* The kernel ran between the launch call and the end of the sync: a loose
     * but honest clock bracket around its first %globaltimer reading. */
    if (img.header()->sum.blocks_in) {
        gp_clock_sync cs{f.rec.host_mono_begin, img.header()->sum.gpu_t_first, after, f.rec.device, 0};
        t.writer->submit(gp::Rec(GP_REC_CLOCK_SYNC, f.launch_id).put(cs));
    }
    for (auto &r : img.records(f.launch_id)) t.writer->submit(std::move(r));
}

void on_context_destroy(Tool &t, CUcontext ctx) {
    std::lock_guard<std::mutex> g(t.mu);
    for (DeviceSlot *s : t.all_slots[ctx]) {
        if (s->dev) sanitizerFree(ctx, s->dev);
        delete s;
    }
    t.all_slots.erase(ctx);
    t.free_slots.erase(ctx);
    std::lock_guard<std::recursive_mutex> p(t.patch_mu);
    t.patches_loaded.erase(ctx);
    std::lock_guard<std::mutex> st(t.status_mu);
    t.fallback_addr.erase(ctx);
}

void dispatch(Tool &t, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId cbid, const void *cbdata) {
    if (domain == SANITIZER_CB_DOMAIN_LAUNCH) {
        const auto *d = static_cast<const Sanitizer_LaunchData *>(cbdata);
        if (cbid == SANITIZER_CBID_LAUNCH_BEGIN) on_launch_begin(t, d);
        if (cbid == SANITIZER_CBID_LAUNCH_END) on_launch_end(t, d);
        return;
    }
    if (domain != SANITIZER_CB_DOMAIN_RESOURCE) return;
    switch (cbid) {
    case SANITIZER_CBID_RESOURCE_MODULE_LOADED: {
        const auto *m = static_cast<const Sanitizer_ResourceModuleData *>(cbdata);
        load_patches(t, m->context, m->module, "module loaded");
        break;
    }
    case SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_LOADED: {
        /* Never patched from here: the API patches lazily loaded functions of a
         * patched module itself and says so with FUNCTIONS_LAZY_PATCHED. */
        const auto *m = static_cast<const Sanitizer_ResourceFunctionsLazyLoadedData *>(cbdata);
        GP_LOG("%u functions of module %p lazily loaded", m->numFunctions, (void *)m->module);
        break;
    }
    case SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_PATCHED: {
        const auto *m = static_cast<const Sanitizer_ResourceFunctionsLazyLoadedData *>(cbdata);
        GP_LOG("%u lazily loaded functions of module %p patched", m->numFunctions, (void *)m->module);
        break;
    }
    case SANITIZER_CBID_RESOURCE_MODULE_UNLOAD_STARTING: {
        const auto *m = static_cast<const Sanitizer_ResourceModuleData *>(cbdata);
        std::lock_guard<std::recursive_mutex> g(t.patch_mu);
        t.patched.erase(m->module); /* the handle may be reused by a later load */
        t.failed.erase(m->module);
        break;
    }
    case SANITIZER_CBID_RESOURCE_CONTEXT_DESTROY_STARTING:
        on_context_destroy(t, static_cast<const Sanitizer_ResourceContextData *>(cbdata)->context);
        break;
    case SANITIZER_CBID_RESOURCE_DEVICE_MEMORY_ALLOC:
    case SANITIZER_CBID_RESOURCE_HOST_MEMORY_ALLOC:
    case SANITIZER_CBID_RESOURCE_MEMORY_ALLOC_ASYNC: {
        const auto *m = static_cast<const Sanitizer_ResourceMemoryData *>(cbdata);
        on_alloc(t, GP_REC_ALLOC, m->address, m->size, alloc_kind(cbid, m->flags), m->context, m->stream);
        break;
    }
    case SANITIZER_CBID_RESOURCE_DEVICE_MEMORY_FREE:
    case SANITIZER_CBID_RESOURCE_HOST_MEMORY_FREE:
    case SANITIZER_CBID_RESOURCE_MEMORY_FREE_ASYNC: {
        const auto *m = static_cast<const Sanitizer_ResourceMemoryData *>(cbdata);
        on_alloc(t, GP_REC_FREE, m->address, 0, 0, m->context, m->stream);
        break;
    }
    case SANITIZER_CBID_RESOURCE_VIRTUAL_RESERVE: {
        const auto *v = static_cast<const Sanitizer_ResourceVirtualRange *>(cbdata);
        on_alloc(t, GP_REC_ALLOC, v->address, v->size, GP_ALLOC_VIRTUAL, nullptr, nullptr);
        break;
    }
    case SANITIZER_CBID_RESOURCE_VIRTUAL_RELEASE: {
        const auto *v = static_cast<const Sanitizer_ResourceVirtualRange *>(cbdata);
        on_alloc(t, GP_REC_FREE, v->address, 0, 0, nullptr, nullptr);
        break;
    }
    default:
        break;
    }
}

void SANITIZERAPI callback(void *userdata, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId cbid,
                           const void *cbdata) {
    Tool &t = *static_cast<Tool *>(userdata);
    if ((uint64_t)getpid() != t.pid) return;
    /* The first callback of a process that uses CUDA: from here its record file is kept. */
    if (!t.used.exchange(true)) submit_status(t, GP_STAGE_INIT);
    /* Inside our own work, callbacks are ours (our allocations, copies), except
     * a module loaded meanwhile: it must be patched. */
    const bool load = domain == SANITIZER_CB_DOMAIN_RESOURCE && cbid == SANITIZER_CBID_RESOURCE_MODULE_LOADED;
    if (in_tool && !load) return;
    if (in_tool) {
        dispatch(t, domain, cbid, cbdata);
        return;
    }
    in_tool = true;
    dispatch(t, domain, cbid, cbdata);
    in_tool = false;
}

void finish() {
    if (!g_tool || (uint64_t)getpid() != g_tool->pid) return;
    if (g_tool->sub) sanitizerUnsubscribe(g_tool->sub);
    /* Under LD_PRELOAD every process the command starts loads the library: one
     * that never reached CUDA leaves no file behind. */
    const char *k = std::getenv("GPU_PROBES_KEEP_STATUS");
    const bool keep = k && *k && std::strcmp(k, "0") != 0;
    if (g_tool->used.load() || keep) submit_status(*g_tool, GP_STAGE_FINAL);
    g_tool->writer->close(/*remove_if_empty=*/true);
}

/* Keeps this library mapped for the life of the process, whatever unloads it:
 * the driver may dlclose an injection library, and our callbacks must never
 * point into an unmapped image. */
void pin_self() {
    Dl_info info{};
    if (!dladdr((const void *)&pin_self, &info) || !info.dli_fname) return;
    if (!dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE))
        std::fprintf(stderr, "gpu_probes: cannot pin %s: %s\n", info.dli_fname, dlerror());
}

/* true: subscribed.  Runs once (gp_init_once). */
bool init() {
    const char *v = std::getenv("GPU_PROBES_VERBOSE");
    g_verbose = v && *v && std::strcmp(v, "0") != 0;
    pin_self();
    Tool *t = new Tool();
    t->pid = (uint64_t)getpid();
    t->cfg = config_from_env();
    std::memset(&t->status, 0, sizeof t->status);
    for (int32_t gp_tool_status::*f :
         {&gp_tool_status::rc_subscribe, &gp_tool_status::rc_add_patches, &gp_tool_status::rc_patch_instructions,
          &gp_tool_status::rc_patch_module, &gp_tool_status::rc_set_callback_data,
          &gp_tool_status::rc_set_launch_data, &gp_tool_status::rc_loaded_status, &gp_tool_status::rc_fallback_read})
        t->status.*f = GP_RC_NOT_CALLED;
    t->status.injection_mode =
        gp::loaded_as_injection((const void *)&pin_self) ? GP_INJECTION_INJECTION : GP_INJECTION_PRELOAD;
    t->status.loading_mode = loading_mode();
    gp::Writer::Options o;
    o.backend = GP_BACKEND_SANITIZER;
    o.page_shift = t->cfg.page_shift;
    o.pid = (uint64_t)getpid();
    std::string err;
    t->writer = gp::Writer::open(gp::default_path(o.pid, "sanitizer"), o, gp::Clocks::now(), &err);
    if (!t->writer) {
        std::fprintf(stderr, "gpu_probes: cannot write the device record file: %s\n", err.c_str());
        delete t;
        return false;
    }
    SanitizerResult r = GP_CALL(sanitizerSubscribe(&t->sub, callback, t));
    note(*t, &gp_tool_status::rc_subscribe, r);
    if (r != SANITIZER_SUCCESS) {
        /* Kept where the run is kept: the file holds why nothing was recorded. */
        submit_status(*t, GP_STAGE_FINAL);
        t->writer->close();
        delete t;
        return false;
    }
    GP_CALL(sanitizerEnableDomain(1, t->sub, SANITIZER_CB_DOMAIN_RESOURCE));
    GP_CALL(sanitizerEnableDomain(1, t->sub, SANITIZER_CB_DOMAIN_LAUNCH));
    GP_LOG("subscribed (%s)", t->status.injection_mode == GP_INJECTION_INJECTION ? "CUDA_INJECTION64_PATH" : "preloaded");
    g_tool = t;
    std::atexit(finish);
    return true;
}

bool gp_init_once() {
    static std::once_flag once;
    static bool ok = false;
    std::call_once(once, [] { ok = init(); });
    return ok;
}

/* Subscribes at load in both modes (LD_PRELOAD and CUDA_INJECTION64_PATH), as
 * NVIDIA's samples and AccelProf do: before cuInit, so that no module load is missed. */
__attribute__((constructor)) void gp_static_init() { gp_init_once(); }

} // namespace

/* The driver's entry point under CUDA_INJECTION64_PATH: 1 when the tool is
 * subscribed, 0 when it is not (the static initializer already tried; this
 * only reports, however often it is called). */
extern "C" __attribute__((visibility("default"))) int InitializeInjection() { return gp_init_once() ? 1 : 0; }
