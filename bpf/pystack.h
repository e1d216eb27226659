/* The caller's Python stack on every event.  With stacks on, a handler
 * builds its event in `scratch` and tail-calls pt_stack_event (pasta.h's
 * pt_close), which walks the CPython frames of the current thread, sets the
 * event's stack_id (0: none) and writes the event.
 *
 * pasta_trace/probes/program.py puts this file after pasta.h, cuda.bpf.c and
 * hip.bpf.c; the generated header of pasta_trace/schema/ (stacks_c_header:
 * struct pt_py_proc, struct pt_pystack, PT_STACK_DEPTH, the py_stats
 * indices) comes first.
 *
 * User space (pasta_trace/stacks/interpreter.py) finds _PyRuntime and the
 * interpreter's layout and stores them in py_procs for each traced Python
 * process.  Here:
 *   1. the thread's PyThreadState, found by native thread id: a tid -> tstate
 *      LRU cache checked with one read, else a walk of the interpreters'
 *      thread lists;
 *   2. the frames, one user read per frame, recording (code, instr, owner)
 *      only: names and lines are read from the process offline, once per
 *      code object (pasta_trace/stacks/pycode.py);
 *   3. a 64-bit hash of the frames is the stack id; a stack is written into
 *      the pystacks ring only the first time (py_seen), so identical stacks
 *      cost one hash lookup.  That write wakes the tracer's drain loop.
 * A stack that cannot be written or read is counted in py_stats, and the
 * events of a process not registered yet in py_unregistered: never silently
 * dropped.  C-stack shim frames are kept and filtered offline: a
 * branchy filter here made the unrolled program too large for the verifier.
 */

#define PT_PY_TSTATES_MAX 16384
#define PT_PY_SEEN_MAX 65536
#define PT_PY_INTERPS 2   /* sub-interpreters walked to find a thread */
#define PT_PY_THREADS 256 /* threads walked per interpreter */
#define PT_PY_FRAME_READ 80 /* bytes read per frame: every field we use lies below */
#define PT_PY_FRAME_BUF 128 /* offsets are masked into this buffer for the verifier */

/* PT_PY_PROCS_MAX (program.PY_PROCS_MAX): user space deletes a process's entry when it
 * exits or execs (so does discover.bpf.c); one it cannot add is counted
 * (counts.stacks.unregistered_python_processes), never an error */
BPF_HASH(py_procs, u32, struct pt_py_proc, PT_PY_PROCS_MAX);
/* Events of each process not in py_procs (yet): they carry no stack.  When
 * user space registers the process as Python (just exec'd or forked, or first
 * seen in the events) it adds its count to counts.stacks.unregistered_python;
 * a process that is no Python leaves its count here.  Reset at exec
 * (discover.bpf.c): the new image starts from 0. */
BPF_TABLE("lru_hash", u32, u64, py_unregistered, 4096);
BPF_TABLE("lru_hash", u32, u64, py_tstate, PT_PY_TSTATES_MAX);
BPF_TABLE("lru_hash", u64, u8, py_seen, PT_PY_SEEN_MAX);
BPF_RINGBUF_OUTPUT(pystacks, PT_PYSTACK_PAGES);
BPF_PERCPU_ARRAY(py_stats, u64, PT_PY_NSTATS);

struct pt_py_scratch {
    struct pt_pystack s;
    u8 frame[PT_PY_FRAME_BUF];
};
BPF_PERCPU_ARRAY(py_scratch, struct pt_py_scratch, 1);

static __always_inline void pt_py_count(u32 idx)
{
    u64 *v = py_stats.lookup(&idx);
    if (v)
        (*v)++;
}

static __always_inline u64 pt_py_ptr(u64 addr)
{
    u64 v = 0;
    if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
        return 0;
    return v;
}

static __always_inline void pt_py_tstate_put(u32 tid, u64 ts)
{
    py_tstate.update(&tid, &ts);
}

/* The PyThreadState of native thread `tid`, or 0. */
static __always_inline u64 pt_py_tstate(struct pt_py_proc *p, u32 tid)
{
    u64 *cached = py_tstate.lookup(&tid);
    if (cached && pt_py_ptr(*cached + p->tstate_native_tid) == tid)
        return *cached;
    u64 interp = pt_py_ptr(p->runtime + p->runtime_interp_head);
    for (int i = 0; i < PT_PY_INTERPS; i++) {
        if (!interp)
            break;
        u64 ts = pt_py_ptr(interp + p->interp_threads_head);
        for (int j = 0; j < PT_PY_THREADS; j++) {
            if (!ts)
                break;
            if (pt_py_ptr(ts + p->tstate_native_tid) == tid) {
                pt_py_tstate_put(tid, ts);
                return ts;
            }
            ts = pt_py_ptr(ts + p->tstate_next);
        }
        interp = pt_py_ptr(interp + p->interp_next);
    }
    return 0;
}

static __always_inline u64 pt_py_mix(u64 h, u64 v)
{
    h ^= v;
    h *= 0x100000001b3ull; /* FNV-1a prime */
    return h;
}

static __always_inline int pt_py_seen(u64 id)
{
    return py_seen.lookup(&id) != 0;
}

static __always_inline void pt_py_mark(u64 id)
{
    u8 one = 1;
    py_seen.update(&id, &one);
}

/* A new stack wakes the tracer at once: its code objects are read from the
 * process while they exist (a module's code object is freed as soon as the
 * module finishes).  Each distinct stack is sent once, so wake-ups are rare. */
static __always_inline int pt_py_emit(struct pt_pystack *s)
{
    return pystacks.ringbuf_output(s, sizeof(*s), BPF_RB_FORCE_WAKEUP);
}

static __always_inline void pt_py_unregistered(u32 tgid)
{
    u64 *n = py_unregistered.lookup(&tgid);
    if (n) {
        __sync_fetch_and_add(n, 1);
        return;
    }
    u64 one = 1;
    py_unregistered.insert(&tgid, &one);
}

/* Stack id of the calling thread's Python stack; 0 when the process is not a
 * registered Python process (counted per process), the thread runs no Python,
 * or the stack was lost (counted). */
static __always_inline u64 pt_pystack_id(u64 pid_tgid)
{
    u32 tgid = pid_tgid >> 32, tid = (u32)pid_tgid;
    struct pt_py_proc *p = py_procs.lookup(&tgid);
    if (!p) {
        pt_py_unregistered(tgid);
        return 0;
    }
    u64 ts = pt_py_tstate(p, tid);
    if (!ts) {
        pt_py_count(PT_PY_NO_PYTHON_THREAD);
        return 0;
    }
    u64 f = pt_py_ptr(ts + p->tstate_frame);
    if (f && p->cframe_frame != PT_PY_NO_OFFSET)
        f = pt_py_ptr(f + p->cframe_frame);
    if (!f) {
        pt_py_count(PT_PY_NO_PYTHON_THREAD); /* a Python thread between calls: no frames, nothing lost */
        return 0;
    }
    u32 zero = 0;
    struct pt_py_scratch *sc = py_scratch.lookup(&zero);
    if (!sc)
        return 0;
    struct pt_pystack *s = &sc->s;
    u64 mask = ~(u64)p->code_tag;
    u32 oc = p->frame_code & (PT_PY_FRAME_BUF - 8), op = p->frame_previous & (PT_PY_FRAME_BUF - 8);
    u32 oi = p->frame_instr & (PT_PY_FRAME_BUF - 8), oo = p->frame_owner & (PT_PY_FRAME_BUF - 1);
    u64 h = 0xcbf29ce484222325ull ^ tgid; /* FNV offset basis, seeded by the process */
    u32 n = 0;
    for (int i = 0; i < PT_STACK_DEPTH; i++) {
        if (!f)
            break;
        if (bpf_probe_read_user(sc->frame, PT_PY_FRAME_READ, (void *)f)) {
            pt_py_count(PT_PY_UNREADABLE_STACKS);
            return 0;
        }
        u64 code = *(u64 *)(sc->frame + oc) & mask;
        u64 instr = *(u64 *)(sc->frame + oi);
        u8 owner = sc->frame[oo];
        s->code[i] = code;
        s->instr[i] = instr;
        s->owner[i] = owner;
        h = pt_py_mix(pt_py_mix(h, code), instr ^ ((u64)owner << 56));
        f = *(u64 *)(sc->frame + op);
        n = i + 1;
    }
    u16 flags = 0;
    if (f) {
        flags = PT_STACK_FLAG_TRUNCATED;
        pt_py_count(PT_PY_TRUNCATED_STACKS);
    }
    h = pt_py_mix(h, ((u64)n << 16) | flags);
    h ^= h >> 33; /* murmur3 finalizer: spread the FNV state over all bits */
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    if (!h)
        h = 1; /* 0 means "no stack" */
    if (pt_py_seen(h))
        return h;
    s->stack_id = h;
    s->pid = tgid;
    s->tid = tid;
    s->depth = n;
    s->flags = flags;
    if (pt_py_emit(s)) {
        pt_py_count(PT_PY_LOST_STACKS);
        return 0;
    }
    pt_py_mark(h);
    return h;
}

/* Tail-called by every handler (pt_close) with its event in `scratch`. */
int pt_stack_event(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct pt_event *e = scratch.lookup(&zero);
    if (!e)
        return 0;
    e->stack_id = pt_pystack_id(bpf_get_current_pid_tgid());
#ifdef PT_NATIVESTACKS
    pt_stack_tail.call(ctx, PT_TAIL_NATIVE); /* nativestack.h: copies the user stack too, writes the event */
#endif
    pt_event_out(e);
    return 0;
}
