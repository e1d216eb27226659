/* PyTorch's libc10.so: tensor memory (family c10, layer framework).
 * Concatenated after pasta.h by pasta_trace/probes/program.py.
 *
 * Events are kind tensor_alloc / tensor_free and carry, in the record's
 * generic slots (schema.KIND_PAYLOAD): ptr, size (bytes, positive for both),
 * dst = the allocator's allocated total, src = its reserved total, aux = the
 * c10::Device (type in bits 0-7, index in bits 8-15).
 *
 * ProfiledCPUMemoryReporter::Delete passes only the pointer: its size is the
 * size of that pointer's last allocation, filled in when the events are
 * written (capture/output/tensor_sizes.py).  A BPF map kept here cost more per
 * tensor than its two events (scripts/bench_probe.py). */

#define PT_C10_CPU 0 /* c10::DeviceType::CPU */

/* Processes whose Python interpreter is finalizing: tgid -> when it began
 * (the entry of Py_FinalizeEx / Py_Finalize, capture/procs/finalize_probe.py).
 * CPython frees every tensor left at exit then; their events are marked
 * PT_FLAG_AT_EXIT so that the tools count them as never freed.  Entries go
 * at exec and exit (discover.bpf.c); an LRU, so a full table forgets the
 * oldest instead of failing. */
#define PT_FINALIZING_MAX 8192
BPF_TABLE("lru_hash", u32, u64, py_finalizing, PT_FINALIZING_MAX);

int pt_py_finalize(struct pt_regs *ctx)
{
    if (pt_skip())
        return 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u64 ts = bpf_ktime_get_ns();
    py_finalizing.insert(&tgid, &ts); /* the first entry: Py_Finalize may call Py_FinalizeEx */
    return 0;
}

/* One hash lookup per tensor event. */
static __always_inline void pt_tensor_at_exit(struct pt_event *e)
{
    u32 tgid = e->pid;
    if (py_finalizing.lookup(&tgid))
        e->flags |= PT_FLAG_AT_EXIT;
}

/* A negative size is a free.  (A function: `kind` is a parameter of the
 * handler macros, so the field cannot be named inside them.) */
static __always_inline u64 pt_tensor_signed(struct pt_event *e, s64 n)
{
    e->kind = n < 0 ? PT_KIND_TENSOR_FREE : PT_KIND_TENSOR_ALLOC;
    return n < 0 ? -n : n;
}

/* c10::reportMemoryUsageToProfiler(void *ptr, int64_t alloc_size,
 * size_t total_allocated, size_t total_reserved, c10::Device device): the
 * CUDA/ROCm caching allocator's every block handed out (size > 0) and taken
 * back (size < 0); the 2-byte Device arrives packed in r8.  The CPU reporter
 * calls it too, with a reserved total of 0 that means "none". */
#define PT_H_TENSOR_REPORT(name, id, kind, arg)                                  \
    PT_ENTRY(name, id, kind, {                                                 \
        u64 dev = PT_P5;                                                       \
        E->ptr = PT_P1;                                                        \
        E->size = pt_tensor_signed(E, (s64)PT_P2);                             \
        E->dst = PT_P3;                                                        \
        E->src = PT_P4;                                                        \
        E->aux = dev & 0xffff;                                                 \
        E->valid = PT_V_PTR | PT_V_SIZE | PT_V_DST | PT_V_AUX;                 \
        if ((dev & 0xff) != PT_C10_CPU)                                        \
            E->valid |= PT_V_SRC;                                              \
        pt_tensor_at_exit(E);                                                  \
    })

/* CPU reporter events: ptr and size (none for a Delete), on the CPU device (index -1). */
#define PT_TENSOR_CPU(e, p, n)                                                 \
    do {                                                                       \
        e->ptr = p;                                                            \
        e->size = n;                                                           \
        e->aux = PT_C10_CPU | (0xff << 8);                                     \
        e->valid = PT_V_PTR | PT_V_AUX | (n ? PT_V_SIZE : 0);                  \
        pt_tensor_at_exit(e);                                                  \
    } while (0)

/* c10::ProfiledCPUMemoryReporter::New(this, void *ptr, size_t nbytes): every
 * CPU tensor's memory, profiler or not; New returns at once for 0 bytes. */
#define PT_H_TENSOR_NEW(name, id, kind, arg)                                     \
    int pt_e_##name(struct pt_regs *ctx)                                       \
    {                                                                          \
        u64 p = PT_P2, n = PT_P3;                                              \
        if (n == 0 || pt_skip())                                               \
            return 0;                                                          \
        struct pt_event *E = pt_open(id, kind, bpf_ktime_get_ns(), 1);         \
        if (!E)                                                                \
            return 0;                                                          \
        PT_TENSOR_CPU(E, p, n);                                                \
        pt_close(ctx, E);                                                      \
        return 0;                                                              \
    }

/* c10::ProfiledCPUMemoryReporter::Delete(this, void *ptr) */
#define PT_H_TENSOR_DELETE(name, id, kind, arg)                                  \
    int pt_e_##name(struct pt_regs *ctx)                                       \
    {                                                                          \
        u64 p = PT_P2;                                                         \
        if (p == 0 || pt_skip())                                               \
            return 0;                                                          \
        struct pt_event *E = pt_open(id, kind, bpf_ktime_get_ns(), 1);         \
        if (!E)                                                                \
            return 0;                                                          \
        PT_TENSOR_CPU(E, p, 0);                                                \
        pt_close(ctx, E);                                                      \
        return 0;                                                              \
    }
