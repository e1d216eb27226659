/* The caller's native (C/C++) stack, for --native-stacks.
 *
 * Debian's user space keeps almost no frame pointers, so nothing is unwound
 * here: the program copies the registers an unwinder starts from (ip, sp,
 * bp) and the user stack from sp up, PT_NATIVE_STACK_BYTES at most, into the
 * nativestacks ring.  The tracer unwinds it with each library's .eh_frame
 * (pasta_trace/stacks/native.py) and replaces the event's stack_id.
 *
 * pasta_trace/probes/program.py puts this file after pasta.h, cuda.bpf.c,
 * hip.bpf.c and pystack.h (when Python stacks are on); the generated header
 * of pasta_trace/schema/ (native_stacks_c_header: struct pt_native,
 * PT_NATIVE_KINDS, the native_stats indices) comes before them.
 *
 * pt_native_event runs where the event is complete: at the function's entry
 * for entry-only probes, at its return for the calls a uretprobe completes
 * (allocations, syncs), whose return code decides whether a failed call is
 * recorded.  Both see an intact caller stack: at entry [sp] is the return
 * address; at return ip is the return address and sp the caller's.
 *
 * Linking: the event's stack_id becomes the sample number (flag
 * PT_FLAG_NATIVE_STACK) and the sample carries the event's Python stack id.
 * The sample is committed before the event, so a drained event's sample is
 * always in the ring already.  A sample that does not fit is counted in
 * native_stats and the event keeps its Python stack only.
 *
 * The first sample of a process wakes the tracer, which reads the process's
 * maps at once: a short-lived process may be gone by the next drain.  The
 * others do not (a wake-up per event cost several microseconds more).
 */

BPF_RINGBUF_OUTPUT(nativestacks, PT_NATIVE_PAGES);
BPF_PERCPU_ARRAY(native_stats, u64, PT_NATIVE_NSTATS);
BPF_PERCPU_ARRAY(native_seq, u64, 1);
BPF_TABLE("lru_hash", u32, u8, native_pids, 4096); /* processes whose maps the tracer has read */

#define PT_NATIVE_PAGE 4096

static __always_inline void pt_native_count(u32 idx)
{
    u64 *v = native_stats.lookup(&idx);
    if (v)
        (*v)++;
}

static __always_inline int pt_native_wanted(struct pt_event *e)
{
    if ((e->flags & PT_FLAG_HAS_RET) && e->ret != 0)
        return 1; /* a failed call, whatever its kind */
    return e->kind < 32 && ((PT_NATIVE_KINDS >> e->kind) & 1);
}

/* Bytes of the user stack copied to dst from sp up.  One read covers the
 * usual case; a read that crosses the top of the stack fails whole, so near
 * the top the copy ends at the last page that could be read. */
static __always_inline u32 pt_native_copy(u8 *dst, u64 sp)
{
    if (!bpf_probe_read_user(dst, PT_NATIVE_STACK_BYTES, (void *)sp))
        return PT_NATIVE_STACK_BYTES;
    u32 first = PT_NATIVE_PAGE - (sp & (PT_NATIVE_PAGE - 1)); /* to the end of sp's page */
#pragma unroll
    for (int pages = PT_NATIVE_STACK_BYTES / PT_NATIVE_PAGE; pages > 0; pages--) {
        u32 n = first + (pages - 1) * PT_NATIVE_PAGE;
        if (n >= PT_NATIVE_STACK_BYTES)
            continue;
        if (!bpf_probe_read_user(dst, n, (void *)sp))
            return n;
    }
    return 0;
}

static __always_inline u64 pt_native_next(void)
{
    u32 zero = 0;
    u64 *seq = native_seq.lookup(&zero);
    if (!seq)
        return 0;
    *seq += 1;
    /* per CPU: no atomic; the CPU in the top bits keeps the numbers unique */
    return ((u64)bpf_get_smp_processor_id() << 48) | (*seq & 0xFFFFFFFFFFFFull);
}

static __always_inline u64 pt_native_wakeup(u32 pid)
{
    if (native_pids.lookup(&pid))
        return BPF_RB_NO_WAKEUP;
    u8 one = 1;
    native_pids.update(&pid, &one);
    return BPF_RB_FORCE_WAKEUP;
}

static __always_inline void pt_native_sample(struct pt_regs *ctx, struct pt_event *e)
{
    struct pt_native *n = nativestacks.ringbuf_reserve(sizeof(struct pt_native));
    if (!n) {
        pt_native_count(PT_NATIVE_LOST_NATIVE_STACKS);
        return;
    }
    u64 sp = PT_REGS_SP(ctx);
    u32 size = pt_native_copy(n->stack, sp);
    if (!size) {
        nativestacks.ringbuf_discard(n, 0);
        pt_native_count(PT_NATIVE_UNREADABLE_NATIVE_STACKS);
        return;
    }
    if (size < PT_NATIVE_STACK_BYTES)
        pt_native_count(PT_NATIVE_SHORT_NATIVE_STACKS);
    u64 sample = pt_native_next();
    n->sample = sample;
    n->py_stack_id = e->stack_id;
    n->pid = e->pid;
    n->tid = e->tid;
    n->ip = PT_REGS_IP(ctx);
    n->sp = sp;
    n->bp = PT_REGS_FP(ctx);
    n->size = size;
    n->flags = (e->flags & PT_FLAG_HAS_RET) ? 0 : PT_NATIVE_AT_ENTRY;
    nativestacks.ringbuf_submit(n, pt_native_wakeup(e->pid));
    e->stack_id = sample;
    e->flags |= PT_FLAG_NATIVE_STACK;
}

/* Tail-called with the event in `scratch`: by pt_close, or by pt_stack_event
 * once the Python stack is known. */
int pt_native_event(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct pt_event *e = scratch.lookup(&zero);
    if (!e)
        return 0;
    if (pt_native_wanted(e))
        pt_native_sample(ctx, e);
    pt_event_out(e);
    return 0;
}
