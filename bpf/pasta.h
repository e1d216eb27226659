/* Shared maps, helpers and argument shapes of pasta-trace's host probes.
 *
 * pasta_trace/probes/program.py concatenates: the generated schema header
 * (struct pt_event, pt_name, pt_agg_*), the configuration and struct-offset
 * #defines, this file, cuda.bpf.c, hip.bpf.c, then one PT_H_<SHAPE>(symbol, id,
 * kind, arg) line per probed API generated from pasta_trace/probes/catalog.py,
 * preceded by one PT_ROLE_<id> #define per API (its part in nesting, below).
 *
 * Map calls live only in the static helpers below: BCC rewrites
 * `map.method()` by source location and does not see through macros.
 *
 * Argument registers at entry (x86-64 SysV): PARM1..6 = rdi, rsi, rdx, rcx,
 * r8, r9; argument 7+ at [sp+8], [sp+16], ...  The probe may sit after a
 * leading cmp/test (see placement.py), which leaves all of these intact.
 */
#include <uapi/linux/ptrace.h>

/* Loss counters: PT_LOST_* slots and PT_LOST_N from schema.LOSSES. */
BPF_RINGBUF_OUTPUT(events, PT_RING_PAGES);
BPF_RINGBUF_OUTPUT(names, PT_NAMES_PAGES);
BPF_PERCPU_ARRAY(lost, u64, PT_LOST_N);
/* Calls handled without an event of their own, on purpose (schema.TALLIES) */
BPF_PERCPU_ARRAY(tally, u64, PT_TALLY_N);
BPF_HASH(pid_filter, u32, u8, PT_PID_FILTER_MAX);

/* Entry -> return state of the calls a uretprobe completes: a small stack of
 * frames per thread in task-local storage (freed with the thread).  A hash
 * keyed by thread and api cost 300-400 ns more per paired call on our VM. */
/* PT_DEPTH (schema.INFLIGHT_DEPTH): nested probed calls kept per thread; a power of two */
struct pt_frame {
    u64 api;
    u64 ts;
    u64 outer; /* pt_nest at entry: the outer call's entry time, or 0 */
    u64 a[4];
};
struct pt_frames {
    u64 depth;
    struct pt_frame f[PT_DEPTH];
};
BPF_TASK_STORAGE(inflight, struct pt_frames);

/* Nesting: a CUDA runtime call (cudaLaunchKernel) reaches the driver through
 * its exported entry points (cuLaunchKernel), so both are probed for one
 * launch.  An "outer" call (PT_ROLE_OUTER: libcudart) leaves this mark on its
 * thread; a call of the same kind of an "inner" layer (PT_ROLE_INNER:
 * libcuda) made while the outer call still runs is its nested part: kind
 * PT_KIND_NESTED, outer_ts = the outer call's entry time (its ts_ns), so a
 * launch counts once and keeps both layers.  "Still runs": the inner call is
 * on the same stack at or below the outer call's entry sp, and either the
 * outer call has a return probe, which clears the mark (its uretprobe also
 * replaced the return address in the slot), or, without one, the outer
 * call's return address is still in its slot (any frame built there after
 * the outer call returned overwrites it).
 *
 * Folding: a driver launch nested in a runtime launch is written only the
 * first time its thread sees its pair (the runtime launch's function, the
 * driver's handle), which is what names the handle offline
 * (capture/naming/pairing.py); each later one is counted in
 * tally[PT_TALLY_FOLDED_LAUNCHES] and costs no event (nor stack walk).  The
 * thread keeps the pairs in a direct-mapped table of PT_FOLD_N slots, by the
 * runtime function: a pair that lost its slot is written again.  The same
 * table keeps, per runtime function, the return address whose caller_fp was
 * read last (pt_rt_caller), so that read is made once per call site. */
#define PT_ROLE_NONE 0
#define PT_ROLE_OUTER 1
#define PT_ROLE_INNER 2
/* PT_FOLD_N (schema.FOLD_SLOTS): slots of the table below */
#define PT_FOLDED (~0ULL) /* pt_inner: write no event */
struct pt_outer {
    u64 ts;  /* entry time of the outer call; 0: none, or already paired */
    u64 sp;  /* its stack pointer at entry */
    u64 ret; /* its return address, [sp] at entry */
    u32 kind;
    u32 api;
    u32 paired; /* the outer call has a return probe: it clears the mark */
    u32 pad;
    u64 func;   /* the outer call's function (a launch's host stub or kernel), or 0 */
    struct {
        u64 outer; /* func of a runtime launch */
        u64 inner; /* the handle of the driver launch nested in it */
        u64 site;  /* a return address of that runtime launch whose caller_fp was read */
        u64 pad;
    } seen[PT_FOLD_N];
};
BPF_TASK_STORAGE(outer_call, struct pt_outer);

#ifdef PT_AGGREGATE
BPF_HASH(agg, struct pt_agg_key, struct pt_agg_val, PT_AGG_MAX);
#endif
#if defined(PT_PYSTACKS) || defined(PT_NATIVESTACKS)
#define PT_STACKS 1
#endif
#if defined(PT_AGGREGATE) || defined(PT_STACKS)
/* The event is built here; --aggregate folds it into agg, stacks hand it to
 * the programs that record the caller's stack and write it (pystack.h,
 * nativestack.h). */
BPF_PERCPU_ARRAY(scratch, struct pt_event, 1);
#endif
#ifdef PT_STACKS
/* A tail call keeps a single copy of the stack walker: inlined into every
 * handler it made the program take 20 s more to compile and load.  Slot 0:
 * the first stack program (Python's, else the native one); slot
 * PT_TAIL_NATIVE: the native one, tail-called by the Python one. */
#define PT_TAIL_NATIVE 1
BPF_PROG_ARRAY(pt_stack_tail, 2);
#endif

static __always_inline void pt_lost(u32 idx)
{
    u64 *v = lost.lookup(&idx);
    if (v)
        (*v)++;
}

/* Not traced: outside the pid filter (-p, a launched command), or under sudo
 * not the invoking user's (bpf/reach.h: checked at every call, so a process
 * that becomes another uid stops being traced at once) */
static __always_inline int pt_skip(void)
{
#ifdef PT_FILTER_PIDS
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (pid_filter.lookup(&tgid) == 0)
        return 1;
#endif
    return pt_foreign();
}

/* Two loads from the task (BTF pointer, offset from the running kernel's
 * BTF, see program.task_comm_offset) instead of bpf_get_current_comm's
 * strscpy_pad: ~50 ns less per event.  comm[] is NUL-padded in the task. */
static __always_inline void pt_comm(char *dst)
{
#ifdef PT_TASK_COMM_OFF
    u8 *t = (u8 *)bpf_get_current_task_btf();
    *(u64 *)dst = *(u64 *)(t + PT_TASK_COMM_OFF);
    *(u64 *)(dst + 8) = *(u64 *)(t + PT_TASK_COMM_OFF + 8);
#else
    bpf_get_current_comm(dst, 16);
#endif
}

/* clear: zero the event first; 0 where the handler writes every field
 * itself (ring memory holds older records). */
static __always_inline void pt_fill(struct pt_event *e, u16 api, u8 kind, u64 ts, int clear)
{
    if (clear)
        __builtin_memset(e, 0, sizeof(*e));
    u64 id = bpf_get_current_pid_tgid();
    e->ts_ns = ts;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->api = api;
    e->kind = kind;
#ifndef PT_AGGREGATE
    pt_comm(e->comm);
#endif
    e->stack_id = 0; /* handlers that skip the memset rely on it */
    e->outer_ts = 0;
    e->caller = 0;
    e->caller_fp = 0;
}

static __always_inline struct pt_event *pt_open(u16 api, u8 kind, u64 ts, int clear)
{
#if defined(PT_AGGREGATE) || defined(PT_STACKS)
    u32 zero = 0;
    struct pt_event *e = scratch.lookup(&zero);
    if (!e)
        return 0;
#else
    struct pt_event *e = events.ringbuf_reserve(sizeof(struct pt_event));
    if (!e) {
        pt_lost(PT_LOST_EVENTS);
        return 0;
    }
#endif
    pt_fill(e, api, kind, ts, clear);
    return e;
}

/* Entry-built events of the calls whose return code is taken at return
 * (PT_SAVE_<id>, catalog.Api.saved: launches, copies, memsets, frees): the
 * entry handler builds its event here, on the thread's small stack, and the
 * uretprobe (PT_RET_SAVED) adds the return code and duration and writes it,
 * so a failed copy is one event with its `ret`, never a copy of its bytes.
 * PT_SAVED_DEPTH: a runtime call, the driver call inside it, and a wrapper. */
#define PT_SAVED_DEPTH 4
struct pt_saved {
    u64 depth;
    struct pt_event e[PT_SAVED_DEPTH];
};
BPF_TASK_STORAGE(saved_calls, struct pt_saved);

static __always_inline struct pt_event *pt_open_saved(u16 api, u8 kind, u64 ts, int clear)
{
    struct pt_saved *s = saved_calls.task_storage_get(bpf_get_current_task_btf(), 0,
                                                      BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!s || s->depth >= PT_SAVED_DEPTH) {
        pt_lost(PT_LOST_INFLIGHT);
        return 0;
    }
    struct pt_event *e = &s->e[s->depth & (PT_SAVED_DEPTH - 1)];
    s->depth++;
    pt_fill(e, api, kind, ts, clear);
    return e;
}

/* The event saved for this api, popped with any left above it (calls that
 * unwound without returning); 0 if none (the entry was folded, filtered or
 * lost).  The slot stays intact until the thread's next saved call. */
static __always_inline struct pt_event *pt_take_saved(u32 api)
{
    struct pt_saved *s = saved_calls.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    if (!s)
        return 0;
    u64 depth = s->depth;
#pragma unroll
    for (int i = PT_SAVED_DEPTH - 1; i >= 0; i--) {
        if (i < depth && s->e[i].api == api) {
            s->depth = i;
            return &s->e[i];
        }
    }
    return 0;
}

#ifdef PT_AGGREGATE
static __always_inline void pt_aggregate(struct pt_event *e)
{
    struct pt_agg_key k = {};
    k.pid = e->pid;
    k.api = e->api;
    k.kind = e->kind;
    /* only what the call set: NCCL calls keep their own values in these slots */
    if (e->valid & PT_V_FUNC)
        k.func = e->func;
    if (e->valid & PT_V_GRID) {
        k.grid_x = e->grid_x;
        k.grid_y = e->grid_y;
        k.grid_z = e->grid_z;
    }
    if (e->valid & PT_V_BLOCK) {
        k.block_x = e->block_x;
        k.block_y = e->block_y;
        k.block_z = e->block_z;
    }
    /* a failed call is its own row, and moved no bytes */
    k.flags = e->flags & PT_FLAG_HAS_RET;
    k.ret = k.flags ? e->ret : 0;
    struct pt_agg_val init = {};
    init.first_ts = e->ts_ns;
    struct pt_agg_val *v = agg.lookup_or_try_init(&k, &init);
    if (!v) {
        pt_lost(PT_LOST_AGG);
        return;
    }
    __sync_fetch_and_add(&v->count, 1);
    if ((e->valid & PT_V_SIZE) && k.ret == 0)
        __sync_fetch_and_add(&v->bytes, e->size);
    v->last_ts = e->ts_ns;
}
#endif

/* Write an event built in `scratch` (the stack programs' last step). */
static __always_inline void pt_event_out(struct pt_event *e)
{
    if (events.ringbuf_output(e, sizeof(*e), BPF_RB_NO_WAKEUP))
        pt_lost(PT_LOST_EVENTS);
}

/* Per-process tables of (key, id) slots: a process's streams under capture,
 * its NCCL communicators (nccl.bpf.c).  id 0: a free slot; the key
 * PT_NO_KEY matches nothing (a slot being taken or freed).  Threads of one
 * process may take slots at once: a slot is taken by compare-and-swap of its
 * id, then given its key. */
#define PT_NO_KEY (~0ULL)

/* The id of key's slot; 0: none. */
static __always_inline u64 pt_slot_get(u64 *keys, u64 *ids, int n, u64 key)
{
#pragma unroll
    for (int i = 0; i < n; i++) {
        u64 id = ids[i];
        if (id && keys[i] == key)
            return id;
    }
    return 0;
}

/* Give key the id (not 0), in its slot (1: a begin after an end the probes
 * missed, a handle made again after a destroy they missed) or a free one
 * (0); -1: none is free. */
static __always_inline int pt_slot_set(u64 *keys, u64 *ids, int n, u64 key, u64 id)
{
#pragma unroll
    for (int i = 0; i < n; i++) {
        if (ids[i] && keys[i] == key) {
            ids[i] = id;
            return 1;
        }
    }
#pragma unroll
    for (int i = 0; i < n; i++) {
        if (!ids[i] && __sync_val_compare_and_swap(&ids[i], 0, id) == 0) {
            keys[i] = key;
            return 0;
        }
    }
    return -1;
}

/* Free key's slot: the id it had; 0: none. */
static __always_inline u64 pt_slot_clear(u64 *keys, u64 *ids, int n, u64 key)
{
#pragma unroll
    for (int i = 0; i < n; i++) {
        if (ids[i] && keys[i] == key) {
            keys[i] = PT_NO_KEY;
            return __sync_lock_test_and_set(&ids[i], 0);
        }
    }
    return 0;
}

/* Free every slot that holds id: how many were freed. */
static __always_inline int pt_slot_clear_id(u64 *keys, u64 *ids, int n, u64 id)
{
    int freed = 0;
#pragma unroll
    for (int i = 0; i < n; i++) {
        if (ids[i] == id) {
            keys[i] = PT_NO_KEY;
            if (__sync_val_compare_and_swap(&ids[i], id, 0) == id)
                freed++;
        }
    }
    return freed;
}

/* CUDA stream capture: per process, the streams under capture and each
 * capture's id (the entry time of the begin call that started it), set by a
 * successful begin and cleared by the end.  A launch, copy or memset on a
 * stream under capture is recorded into a graph, not run: its event becomes
 * kind captured, dst = the capture id (pt_capture_mark).  Only the outermost
 * layer's begin/end (a runtime call, else the driver's) keeps the table, so
 * the runtime's begin and the driver's inside it give one id.  capture_n
 * counts the streams under capture: with none (nearly always) a launch, copy,
 * memset, event record or event wait pays one array lookup and no hash
 * lookup.
 *
 * Cross-stream capture (a fork/join inside torch.cuda.graph, NCCL under
 * capture): an event recorded on a capturing stream takes that capture's id
 * (capture_events), and a stream that waits on it is capturing into the same
 * graph from then on (a slot of its own, the origin's id).  The origin's end
 * clears every stream and event of its id: CUDA requires the joined streams
 * to have rejoined the origin by then, and none is capturing after it.  An
 * event recorded again on a stream not capturing leaves its capture.  Event
 * record and wait are idempotent here, so a runtime call and the driver call
 * nested in it may both apply them.
 *
 * Keyed by the process, so its exit (or exec) drops every capture it left
 * open in one delete (discover.bpf.c, pt_captures_gone): a process killed
 * mid-capture would otherwise keep capture_n up, and every launch of every
 * process would pay the hash lookup until the tracer ends.  A begin or a
 * join the table cannot hold (PT_CAPTURE_MAX processes, or PT_CAPTURE_SLOTS
 * streams of one process), or an event recorded under capture that
 * capture_events cannot hold (PT_CAPTURE_EVENTS per process), is counted in
 * lost[PT_LOST_CAPTURES]. */
#define PT_CAPTURE_SLOTS 8
#define PT_CAPTURE_EVENTS 16
struct pt_captures {
    u64 stream[PT_CAPTURE_SLOTS];
    u64 id[PT_CAPTURE_SLOTS];
};
BPF_HASH(capturing, u32, struct pt_captures, PT_CAPTURE_MAX);
BPF_ARRAY(capture_n, u64, 1);
/* events recorded on a capturing stream, and their capture's id: apart from
 * `capturing` so that neither table's initial value overflows a handler's
 * 512-byte stack */
struct pt_capture_events {
    u64 event[PT_CAPTURE_EVENTS];
    u64 id[PT_CAPTURE_EVENTS];
};
BPF_HASH(capture_events, u32, struct pt_capture_events, PT_CAPTURE_MAX);

static __always_inline void pt_capture_count(s64 d)
{
    u32 z = 0;
    u64 *n = capture_n.lookup(&z);
    if (n)
        __sync_fetch_and_add(n, d);
}

/* The process's streams under capture; 0 (after one array lookup) when no
 * stream of any process is. */
static __always_inline struct pt_captures *pt_captures_live(u32 pid)
{
    u32 z = 0;
    u64 *n = capture_n.lookup(&z);
    if (!n || !*n)
        return 0;
    return capturing.lookup(&pid);
}

/* Put the stream under capture id: a begin on it, or a wait that joins it. */
static __always_inline void pt_capture_join(u32 pid, u64 stream, u64 id)
{
    struct pt_captures init;
    __builtin_memset(init.stream, 0xff, sizeof(init.stream)); /* PT_NO_KEY until taken */
    __builtin_memset(init.id, 0, sizeof(init.id));
    struct pt_captures *c = capturing.lookup_or_try_init(&pid, &init);
    int got = c ? pt_slot_set(c->stream, c->id, PT_CAPTURE_SLOTS, stream, id) : -1;
    if (got == 0)
        pt_capture_count(1);
    else if (got < 0)
        pt_lost(PT_LOST_CAPTURES);
}

/* The capture id of the stream's capture, cleared with every stream joined
 * to it and every event recorded in it; 0: none was seen begin. */
static __always_inline u64 pt_capture_end(u32 pid, u64 stream)
{
    struct pt_captures *c = capturing.lookup(&pid);
    u64 id = c ? pt_slot_clear(c->stream, c->id, PT_CAPTURE_SLOTS, stream) : 0;
    if (!id)
        return 0;
    pt_capture_count(-1 - pt_slot_clear_id(c->stream, c->id, PT_CAPTURE_SLOTS, id));
    struct pt_capture_events *v = capture_events.lookup(&pid);
    if (v)
        pt_slot_clear_id(v->event, v->id, PT_CAPTURE_EVENTS, id);
    return id;
}

/* The process exited or exec'd: its captures are gone, open or not. */
static __always_inline void pt_captures_gone(u32 pid)
{
    capture_events.delete(&pid);
    struct pt_captures *c = capturing.lookup(&pid);
    if (!c)
        return;
#pragma unroll
    for (int i = 0; i < PT_CAPTURE_SLOTS; i++) {
        if (c->id[i] && __sync_lock_test_and_set(&c->id[i], 0))
            pt_capture_count(-1);
    }
    capturing.delete(&pid);
}

/* cuEventRecord(event, stream): recorded on a capturing stream, the event
 * takes its capture (dst = the capture id); recorded on another stream, it
 * leaves the capture it had. */
static __always_inline void pt_capture_record(struct pt_event *e, u64 event, u64 stream)
{
    u32 pid = e->pid; /* a key from the stack: e may be ring memory */
    struct pt_captures *c = pt_captures_live(pid);
    if (!c)
        return;
    u64 id = pt_slot_get(c->stream, c->id, PT_CAPTURE_SLOTS, stream);
    struct pt_capture_events *v = capture_events.lookup(&pid);
    if (!id) {
        if (v)
            pt_slot_clear(v->event, v->id, PT_CAPTURE_EVENTS, event);
        return;
    }
    if (!v) {
        struct pt_capture_events init;
        __builtin_memset(init.event, 0xff, sizeof(init.event)); /* PT_NO_KEY until taken */
        __builtin_memset(init.id, 0, sizeof(init.id));
        v = capture_events.lookup_or_try_init(&pid, &init);
    }
    if (!v || pt_slot_set(v->event, v->id, PT_CAPTURE_EVENTS, event, id) < 0)
        pt_lost(PT_LOST_CAPTURES);
    e->dst = id;
    e->valid |= PT_V_DST;
}

/* cuStreamWaitEvent(stream, event): a wait on an event recorded under
 * capture joins the stream to that capture (dst = the capture id). */
static __always_inline void pt_capture_wait(struct pt_event *e, u64 stream, u64 event)
{
    u32 pid = e->pid;
    if (!pt_captures_live(pid))
        return;
    struct pt_capture_events *v = capture_events.lookup(&pid);
    u64 id = v ? pt_slot_get(v->event, v->id, PT_CAPTURE_EVENTS, event) : 0;
    if (!id)
        return;
    pt_capture_join(pid, stream, id);
    e->dst = id;
    e->valid |= PT_V_DST;
}

/* A launch, copy or memset (not nested: the outer call holds the capture)
 * on a capturing stream.  A copy's destination moves to ptr, where a
 * memset's is, so that dst is the capture id for every captured event. */
static __always_inline void pt_capture_mark(struct pt_event *e)
{
    u8 k = e->kind;
    if ((k != PT_KIND_LAUNCH && k != PT_KIND_MEMCPY && k != PT_KIND_MEMSET) || !(e->valid & PT_V_STREAM))
        return;
    u32 pid = e->pid;
    struct pt_captures *c = pt_captures_live(pid);
    u64 id = c ? pt_slot_get(c->stream, c->id, PT_CAPTURE_SLOTS, e->stream) : 0;
    if (!id)
        return;
    if (k == PT_KIND_MEMCPY) {
        e->ptr = e->dst;
        if (e->valid & PT_V_DST)
            e->valid |= PT_V_PTR;
    }
    e->kind = PT_KIND_CAPTURED;
    e->dst = id;
    e->valid |= PT_V_DST;
}

static __always_inline void pt_close(struct pt_regs *ctx, struct pt_event *e)
{
    pt_capture_mark(e);
#ifdef PT_AGGREGATE
    pt_aggregate(e);
#elif defined(PT_STACKS)
    pt_stack_tail.call(ctx, 0);
    /* reached only if the tail call failed: the event without its stack */
    pt_event_out(e);
#else
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
#endif
}

/* Write a saved event, completed at its call's return. */
static __always_inline void pt_emit_saved(struct pt_regs *ctx, struct pt_event *e)
{
    pt_capture_mark(e);
#ifdef PT_AGGREGATE
    pt_aggregate(e);
#elif defined(PT_STACKS)
    u32 zero = 0;
    struct pt_event *s = scratch.lookup(&zero);
    if (!s)
        return;
    __builtin_memcpy(s, e, sizeof(*s));
    pt_stack_tail.call(ctx, 0);
    pt_event_out(s);
#else
    if (events.ringbuf_output(e, sizeof(*e), BPF_RB_NO_WAKEUP))
        pt_lost(PT_LOST_EVENTS);
#endif
}

static __always_inline void pt_tally(u32 idx)
{
    u64 *v = tally.lookup(&idx);
    if (v)
        (*v)++;
}

/* schema.fold_slot */
static __always_inline u32 pt_fold_slot(u64 func)
{
    return ((func >> 4) ^ (func >> 12)) & (PT_FOLD_N - 1);
}

/* The thread's outer-call mark, made on first use. */
static __always_inline struct pt_outer *pt_outer_get(void)
{
    return outer_call.task_storage_get(bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
}

static __always_inline int pt_still_in(struct pt_outer *o, u64 sp)
{
    u64 v = 0;
    if (sp > o->sp)
        return 0;
    return o->paired || (!bpf_probe_read_user(&v, sizeof(v), (void *)o->sp) && v == o->ret);
}

/* An inner-layer call: the entry time of the outer call it is nested in, or
 * 0; PT_FOLDED when it is a launch (fold: its handle, else 0) whose pair with
 * the outer launch's function this thread has recorded already. */
static __always_inline u64 pt_inner(struct pt_regs *ctx, u32 kind, u64 fold)
{
    struct pt_outer *o = outer_call.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    if (!o || !o->ts || o->kind != kind || !pt_still_in(o, PT_REGS_SP(ctx)))
        return 0;
    u64 t = o->ts;
    o->ts = 0; /* one inner call per outer call: a later one is its own */
    if (!fold || !o->func)
        return t;
    u32 i = pt_fold_slot(o->func);
    if (o->seen[i].outer == o->func && o->seen[i].inner == fold) {
        pt_tally(PT_TALLY_FOLDED_LAUNCHES);
        return PT_FOLDED;
    }
    if (o->seen[i].outer != o->func)
        o->seen[i].site = 0;
    o->seen[i].outer = o->func;
    o->seen[i].inner = fold;
    return t;
}

/* The entry time of the outer call this one is nested in, or 0; an outer
 * call that is not nested marks its thread (o: pt_outer_get()).  role is a
 * constant (PT_ROLE_<id>): the branches not taken compile away.  ret: the
 * return address if the handler read it already, else 0; func: the outer
 * call's function (a launch's), else 0. */
static __always_inline u64 pt_nest(struct pt_regs *ctx, int role, struct pt_outer *o, u32 api, u32 kind,
                                   u64 ts, u32 paired, u64 ret, u64 func)
{
    if (role == PT_ROLE_NONE)
        return 0;
    u64 sp = PT_REGS_SP(ctx);
    if (role == PT_ROLE_INNER)
        return pt_inner(ctx, kind, 0);
    if (!o)
        return 0;
    /* an outer call inside another of the same kind (a wrapper of the same
     * library); the same api at the same sp is the next call of a loop */
    if (o->ts && o->kind == kind && !(sp == o->sp && o->api == api) && pt_still_in(o, sp))
        return o->ts;
    if (!ret)
        bpf_probe_read_user(&ret, sizeof(ret), (void *)sp);
    o->ts = ts;
    o->sp = sp;
    o->ret = ret;
    o->kind = kind;
    o->api = api;
    o->paired = paired;
    o->func = func;
    return 0;
}

/* An entry-only call made inside the outer call that began at ``outer``
 * (0: none).  A function, not macro text: the handler macros have a
 * parameter named `kind`. */
static __always_inline void pt_nested(struct pt_event *e, u64 outer)
{
    if (outer) {
        e->kind = PT_KIND_NESTED;
        e->outer_ts = outer;
    }
}

/* The return of an outer call with a return probe: its mark goes. */
static __always_inline void pt_outer_end(int role, u64 ts)
{
    if (role != PT_ROLE_OUTER)
        return;
    struct pt_outer *o = outer_call.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    if (o && o->ts == ts)
        o->ts = 0;
}

static __always_inline void pt_save(u32 api, u64 ts, u64 outer, u64 a0, u64 a1, u64 a2, u64 a3)
{
    struct pt_frames *s = inflight.task_storage_get(bpf_get_current_task_btf(), 0,
                                                    BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!s || s->depth >= PT_DEPTH) {
        pt_lost(PT_LOST_INFLIGHT);
        return;
    }
    struct pt_frame *f = &s->f[s->depth & (PT_DEPTH - 1)];
    f->api = api;
    f->ts = ts;
    f->outer = outer;
    f->a[0] = a0;
    f->a[1] = a1;
    f->a[2] = a2;
    f->a[3] = a3;
    s->depth++;
}

/* The frame pt_save pushed for this api, popped with any left above it (a
 * call that unwound without returning); -1 if the entry was not seen (probes
 * attached while the call was in flight, filtered out, or dropped). */
static __always_inline int pt_take(u32 api, struct pt_frame *out)
{
    struct pt_frames *s = inflight.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    if (!s)
        return -1;
    u64 depth = s->depth;
#pragma unroll
    for (int i = PT_DEPTH - 1; i >= 0; i--) {
        if (i < depth && s->f[i].api == api) {
            *out = s->f[i];
            s->depth = i;
            return 0;
        }
    }
    return -1;
}

static __always_inline struct pt_event *pt_open_ret(struct pt_regs *ctx, u16 api, u8 kind,
                                                    struct pt_frame *in)
{
    struct pt_event *e = pt_open(api, in->outer ? PT_KIND_NESTED : kind, in->ts, 1);
    if (!e)
        return 0;
    e->outer_ts = in->outer;
    e->dur_ns = bpf_ktime_get_ns() - in->ts;
    e->ret = (int)PT_REGS_RC(ctx);
    e->flags = PT_FLAG_HAS_RET | PT_FLAG_HAS_DUR;
    return e;
}

/* *out of a successful call; on failure the out-parameter holds nothing. */
static __always_inline int pt_read_out(struct pt_event *e, u64 out, u64 *val)
{
    if (e->ret != 0)
        return -1;
    if (bpf_probe_read_user(val, sizeof(*val), (void *)out)) {
        e->flags |= PT_FLAG_OUTPTR_FAULT;
        return -1;
    }
    return 0;
}

static __always_inline void pt_name_emit(u16 api, u16 source, int ret, u64 handle, u64 alias,
                                         u64 str)
{
    struct pt_name *n = names.ringbuf_reserve(sizeof(struct pt_name));
    if (!n) {
        pt_lost(PT_LOST_NAMES);
        return;
    }
    __builtin_memset(n, 0, sizeof(*n));
    u64 id = bpf_get_current_pid_tgid();
    n->ts_ns = bpf_ktime_get_ns();
    n->pid = id >> 32;
    n->tid = (u32)id;
    n->handle = handle;
    n->alias = alias;
    n->api = api;
    n->source = source;
    n->ret = ret;
    if (str)
        bpf_probe_read_user_str(n->name, sizeof(n->name), (void *)str);
    names.ringbuf_submit(n, BPF_RB_NO_WAKEUP);
}

static __always_inline int pt_stack(struct pt_regs *ctx, u64 *dst, u32 size)
{
    return bpf_probe_read_user(dst, size, (void *)(PT_REGS_SP(ctx) + 8));
}

#define PT_P1 PT_REGS_PARM1(ctx)
#define PT_P2 PT_REGS_PARM2(ctx)
#define PT_P3 PT_REGS_PARM3(ctx)
#define PT_P4 PT_REGS_PARM4(ctx)
#define PT_P5 PT_REGS_PARM5(ctx)
#define PT_P6 PT_REGS_PARM6(ctx)

#define PT_LAUNCH_V (PT_V_FUNC | PT_V_GRID | PT_V_BLOCK | PT_V_SHMEM | PT_V_STREAM)

/* Entry-only handler: E is the event, already stamped; zeroed unless
 * PT_ENTRY_ALL, whose body writes every field past pid/tid/api/kind/comm.
 * fold: an expression of the registers giving a launch's handle, for an
 * inner-layer launch to be folded (pt_inner), else 0.  O: an outer-layer
 * call's mark (pt_outer_get; null for other layers or if it failed). */
#define PT_ENTRY_Z(clear, fold, name, id, kind, ...)                           \
    int pt_e_##name(struct pt_regs *ctx)                                       \
    {                                                                          \
        if (pt_skip())                                                         \
            return 0;                                                          \
        u64 in_ = 0;                                                           \
        /* before the event (and its clock read): a folded launch has none */  \
        if (PT_ROLE_##id == PT_ROLE_INNER) {                                   \
            in_ = pt_inner(ctx, kind, fold);                                   \
            if (in_ == PT_FOLDED)                                              \
                return 0;                                                      \
        }                                                                      \
        u64 ts_ = bpf_ktime_get_ns();                                          \
        struct pt_event *E = PT_SAVE_##id ? pt_open_saved(id, kind, ts_, clear) \
                                          : pt_open(id, kind, ts_, clear);     \
        if (!E)                                                                \
            return 0;                                                          \
        struct pt_outer *O = 0;                                                \
        if (PT_ROLE_##id == PT_ROLE_OUTER)                                     \
            O = pt_outer_get();                                                \
        __VA_ARGS__;                                                           \
        /* after the body: a runtime launch has read its return address */    \
        if (PT_ROLE_##id != PT_ROLE_INNER)                                     \
            in_ = pt_nest(ctx, PT_ROLE_##id, O, id, kind, ts_, PT_SAVE_##id,   \
                          (E->valid & PT_V_CALLER) ? E->caller : 0,            \
                          (E->valid & PT_V_FUNC) ? E->func : 0);               \
        pt_nested(E, in_);                                                     \
        if (!PT_SAVE_##id)                                                     \
            pt_close(ctx, E);                                                  \
        return 0;                                                              \
    }
#define PT_ENTRY(...) PT_ENTRY_Z(1, 0, __VA_ARGS__)
#define PT_ENTRY_ALL(...) PT_ENTRY_Z(0, 0, __VA_ARGS__)
/* a launch whose handle is in a register: nested in a runtime launch, it folds */
#define PT_ENTRY_FOLD(fold, ...) PT_ENTRY_Z(0, fold, __VA_ARGS__)

/* The fields no launch carries (launch handlers skip the memset). */
#define PT_LAUNCH_ZERO(e)                                                      \
    do {                                                                       \
        e->dur_ns = 0;                                                         \
        e->flags = 0;                                                          \
        e->ret = 0;                                                            \
        e->copy_kind = 0;                                                      \
        e->ptr = 0;                                                            \
        e->size = 0;                                                           \
        e->dst = 0;                                                            \
        e->src = 0;                                                            \
        e->aux = 0;                                                            \
    } while (0)

/* The return of a call whose event its entry handler saved (PT_SAVE_<id>):
 * the event gets the return code and the time in the call, and is written. */
#define PT_RET_SAVED(name, id, kind)                                           \
    int pt_r_##name(struct pt_regs *ctx)                                       \
    {                                                                          \
        struct pt_event *E = pt_take_saved(id);                                \
        if (!E)                                                                \
            return 0;                                                          \
        pt_outer_end(PT_ROLE_##id, E->ts_ns);                                  \
        E->dur_ns = bpf_ktime_get_ns() - E->ts_ns;                             \
        E->ret = (int)PT_REGS_RC(ctx);                                         \
        E->flags |= PT_FLAG_HAS_RET | PT_FLAG_HAS_DUR;                         \
        pt_emit_saved(ctx, E);                                                 \
        return 0;                                                              \
    }

/* Entry saves up to four values; the return handler builds the event from
 * them (IN.a[0..3]) with duration and return code. */
#define PT_PAIR(name, id, kind, a0, a1, a2, a3, ...)                           \
    int pt_e_##name(struct pt_regs *ctx)                                       \
    {                                                                          \
        if (pt_skip())                                                         \
            return 0;                                                          \
        u64 ts_ = bpf_ktime_get_ns();                                          \
        pt_save(id, ts_, pt_nest(ctx, PT_ROLE_##id,                            \
                                 PT_ROLE_##id == PT_ROLE_OUTER ? pt_outer_get() : 0, \
                                 id, kind, ts_, 1, 0, 0), a0, a1, a2, a3);     \
        return 0;                                                              \
    }                                                                          \
    int pt_r_##name(struct pt_regs *ctx)                                       \
    {                                                                          \
        struct pt_frame IN;                                                    \
        if (pt_take(id, &IN))                                                  \
            return 0;                                                          \
        pt_outer_end(PT_ROLE_##id, IN.ts);                                     \
        struct pt_event *E = pt_open_ret(ctx, id, kind, &IN);                  \
        if (!E)                                                                \
            return 0;                                                          \
        __VA_ARGS__;                                                           \
        pt_close(ctx, E);                                                           \
        return 0;                                                              \
    }

/* ---------------------------------------------------------------- launches */

/* cuLaunchKernel layout: (f, gx, gy, gz, bx, by, [bz, shmem, stream]) */
#define PT_H_LAUNCH_CU(name, id, kind, arg)                                      \
    PT_ENTRY_FOLD(PT_P1, name, id, kind, {                                             \
        u64 st[3];                                                             \
        PT_LAUNCH_ZERO(E);                                                     \
        E->valid = PT_V_FUNC | PT_V_GRID;                                      \
        if (!pt_stack(ctx, st, sizeof(st)))                                    \
            E->valid = PT_LAUNCH_V;                                            \
        E->func = PT_P1;                                                       \
        E->grid_x = PT_P2;                                                     \
        E->grid_y = PT_P3;                                                     \
        E->grid_z = PT_P4;                                                     \
        E->block_x = PT_P5;                                                    \
        E->block_y = PT_P6;                                                    \
        E->block_z = st[0];                                                    \
        E->shmem = st[1];                                                      \
        E->stream = st[2];                                                     \
    })

/* runtime layout, dim3 by value: (f, grid x|y<<32, grid z, block x|y<<32,
 * block z, args, [shmem, stream]) */
/* (f, grid x|y<<32, grid z, block x|y<<32, block z, ...): dim3 by value */
static __always_inline void pt_launch_rt_regs(struct pt_regs *ctx, struct pt_event *e)
{
    u64 g = PT_REGS_PARM2(ctx), b = PT_REGS_PARM4(ctx);
    e->func = PT_REGS_PARM1(ctx);
    e->grid_x = (u32)g;
    e->grid_y = g >> 32;
    e->grid_z = PT_REGS_PARM3(ctx);
    e->block_x = (u32)b;
    e->block_y = b >> 32;
    e->block_z = PT_REGS_PARM5(ctx);
}

#define PT_H_LAUNCH_RT(name, id, kind, arg)                                      \
    PT_ENTRY_ALL(name, id, kind, {                                             \
        u64 st[2];                                                             \
        PT_LAUNCH_ZERO(E);                                                     \
        E->valid = PT_V_FUNC | PT_V_GRID | PT_V_BLOCK;                         \
        if (!pt_stack(ctx, st, sizeof(st)))                                    \
            E->valid = PT_LAUNCH_V;                                            \
        pt_launch_rt_regs(ctx, E);                                             \
        E->shmem = (u32)st[0];                                                 \
        E->stream = st[1];                                                     \
    })

/* CUlaunchConfig / HIP_LAUNCH_CONFIG at PARM1, function at PARM2 */
#define PT_H_LAUNCH_CFG_CU(name, id, kind, arg)                                  \
    PT_ENTRY(name, id, kind, {                                                 \
        u64 c[5] = {};                                                         \
        E->func = PT_P2;                                                       \
        E->valid = PT_V_FUNC;                                                  \
        if (!bpf_probe_read_user(c, sizeof(c), (void *)PT_P1)) {               \
            u8 *b = (u8 *)c;                                                   \
            E->grid_x = *(u32 *)(b + PT_OFF_CFGCU_GRIDDIMX);                   \
            E->grid_y = *(u32 *)(b + PT_OFF_CFGCU_GRIDDIMY);                   \
            E->grid_z = *(u32 *)(b + PT_OFF_CFGCU_GRIDDIMZ);                   \
            E->block_x = *(u32 *)(b + PT_OFF_CFGCU_BLOCKDIMX);                 \
            E->block_y = *(u32 *)(b + PT_OFF_CFGCU_BLOCKDIMY);                 \
            E->block_z = *(u32 *)(b + PT_OFF_CFGCU_BLOCKDIMZ);                 \
            E->shmem = *(u32 *)(b + PT_OFF_CFGCU_SHAREDMEMBYTES);              \
            E->stream = *(u64 *)(b + PT_OFF_CFGCU_HSTREAM);                    \
            E->valid = PT_LAUNCH_V;                                            \
        }                                                                      \
    })

/* cudaLaunchConfig_t / hipLaunchConfig_t at cfg; the function is set by the caller */
static __always_inline void pt_launch_cfg_rt(struct pt_event *e, u64 cfg)
{
    u64 c[5] = {};
    e->valid = PT_V_FUNC;
    if (bpf_probe_read_user(c, sizeof(c), (void *)cfg))
        return;
    u8 *b = (u8 *)c;
    e->grid_x = *(u32 *)(b + PT_OFF_CFGRT_GRIDDIM);
    e->grid_y = *(u32 *)(b + PT_OFF_CFGRT_GRIDDIM + 4);
    e->grid_z = *(u32 *)(b + PT_OFF_CFGRT_GRIDDIM + 8);
    e->block_x = *(u32 *)(b + PT_OFF_CFGRT_BLOCKDIM);
    e->block_y = *(u32 *)(b + PT_OFF_CFGRT_BLOCKDIM + 4);
    e->block_z = *(u32 *)(b + PT_OFF_CFGRT_BLOCKDIM + 8);
    e->shmem = *(u32 *)(b + PT_OFF_CFGRT_DYNAMICSMEMBYTES);
    e->stream = *(u64 *)(b + PT_OFF_CFGRT_STREAM);
    e->valid = PT_LAUNCH_V;
}

/* (const cudaLaunchConfig_t / hipLaunchConfig_t *, function, args) */
#define PT_H_LAUNCH_CFG_RT(name, id, kind, arg)                                  \
    PT_ENTRY(name, id, kind, {                                                 \
        E->func = PT_P2;                                                       \
        pt_launch_cfg_rt(E, PT_P1);                                            \
    })

/* (graphExec, stream): the kernels inside are not seen one by one */
#define PT_H_GRAPH_LAUNCH(name, id, kind, arg)                                   \
    PT_ENTRY(name, id, kind, {                                                 \
        E->func = PT_P1;                                                       \
        E->stream = PT_P2;                                                     \
        E->valid = PT_V_FUNC | PT_V_STREAM;                                    \
    })

/* ------------------------------------------------------------ CUDA graphs */

/* (stream, ...): dst = the capture id (this call's entry time) */
#define PT_H_CAPTURE_BEGIN(name, id, kind, arg)                                  \
    PT_PAIR(name, id, kind, PT_P1, 0, 0, 0, {                                  \
        E->stream = IN.a[0];                                                   \
        E->dst = IN.ts;                                                        \
        E->valid = PT_V_STREAM | PT_V_DST;                                     \
        if (E->ret == 0 && !IN.outer)                                          \
            pt_capture_join(E->pid, IN.a[0], IN.ts);                           \
    })

/* (stream, CUgraph *out): ptr = the graph made, dst = the capture id (null:
 * the capture began before the probes, or is kept by the outer call).  A
 * failed end (an invalidated capture) ends the capture too. */
#define PT_H_CAPTURE_END(name, id, kind, arg)                                    \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, 0, 0, {                              \
        u64 g = 0, cap = 0;                                                    \
        E->stream = IN.a[0];                                                   \
        E->valid = PT_V_STREAM;                                                \
        if (!IN.outer)                                                         \
            cap = pt_capture_end(E->pid, IN.a[0]);                             \
        if (cap) {                                                             \
            E->dst = cap;                                                      \
            E->valid |= PT_V_DST;                                              \
        }                                                                      \
        if (!pt_read_out(E, IN.a[1], &g)) {                                    \
            E->ptr = g;                                                        \
            E->valid |= PT_V_PTR;                                              \
        }                                                                      \
    })

/* (exec *out, graph, ...): func = the exec, ptr = its graph */
#define PT_H_GRAPH_INSTANTIATE(name, id, kind, arg)                              \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, 0, 0, {                              \
        u64 x = 0;                                                             \
        E->ptr = IN.a[1];                                                      \
        E->valid = PT_V_PTR;                                                   \
        if (!pt_read_out(E, IN.a[0], &x)) {                                    \
            E->func = x;                                                       \
            E->valid |= PT_V_FUNC;                                             \
        }                                                                      \
    })

/* (exec): func = the exec */
#define PT_H_GRAPH_EXEC(name, id, kind, arg)                                     \
    PT_ENTRY(name, id, kind, {                                                 \
        E->func = PT_P1;                                                       \
        E->valid = PT_V_FUNC;                                                  \
    })

/* (graph *out, flags): ptr = the graph made */
#define PT_H_GRAPH_CREATE(name, id, kind, arg)                                   \
    PT_PAIR(name, id, kind, PT_P1, 0, 0, 0, {                                  \
        u64 g = 0;                                                             \
        if (!pt_read_out(E, IN.a[0], &g)) {                                    \
            E->ptr = g;                                                        \
            E->valid = PT_V_PTR;                                               \
        }                                                                      \
    })

/* (graph): ptr = the graph */
#define PT_H_GRAPH_DESTROY(name, id, kind, arg)                                  \
    PT_ENTRY(name, id, kind, {                                                 \
        E->ptr = PT_P1;                                                        \
        E->valid = PT_V_PTR;                                                   \
    })

/* (node *out, graph, deps, numDeps, const CUDA_KERNEL_NODE_PARAMS *): the
 * kernel and its shape read at return (the caller's struct); arg 1: the _v2
 * struct, whose func may be null with a CUkernel in kern (offset 56) */
#define PT_H_GRAPH_KERNEL_NODE(name, id, kind, arg)                              \
    PT_PAIR(name, id, kind, PT_P2, PT_P5, 0, 0, {                              \
        u64 c[8] = {};                                                         \
        E->ptr = IN.a[0];                                                      \
        E->valid = PT_V_PTR;                                                   \
        if (!bpf_probe_read_user(c, arg ? 64 : 40, (void *)IN.a[1])) {         \
            u32 *d = (u32 *)&c[1];                                             \
            E->func = (arg && !c[0]) ? c[7] : c[0];                            \
            E->grid_x = d[0];                                                  \
            E->grid_y = d[1];                                                  \
            E->grid_z = d[2];                                                  \
            E->block_x = d[3];                                                 \
            E->block_y = d[4];                                                 \
            E->block_z = d[5];                                                 \
            E->shmem = d[6];                                                   \
            E->valid |= PT_V_FUNC | PT_V_GRID | PT_V_BLOCK | PT_V_SHMEM;       \
        }                                                                      \
    })

/* (node *out, graph, ...): ptr = the graph */
#define PT_H_GRAPH_NODE(name, id, kind, arg)                                     \
    PT_PAIR(name, id, kind, PT_P2, 0, 0, 0, {                                  \
        E->ptr = IN.a[0];                                                      \
        E->valid = PT_V_PTR;                                                   \
    })

/* (node *out, graph, deps, numDeps, child): ptr = the graph, src = the
 * child graph, whose nodes are copied into it now */
#define PT_H_GRAPH_CHILD_NODE(name, id, kind, arg)                               \
    PT_PAIR(name, id, kind, PT_P2, PT_P5, 0, 0, {                              \
        E->ptr = IN.a[0];                                                      \
        E->src = IN.a[1];                                                      \
        E->valid = PT_V_PTR | PT_V_SRC;                                        \
    })

/* (stream, fn, userData) */
#define PT_H_HOST_FUNC(name, id, kind, arg)                                      \
    PT_ENTRY(name, id, kind, {                                                 \
        E->stream = PT_P1;                                                     \
        E->func = PT_P2;                                                       \
        E->valid = PT_V_FUNC | PT_V_STREAM;                                    \
    })

/* ------------------------------------------------------ stream ordering
 * Event record and stream wait: the host does not wait in them (no sync).
 * Under stream capture they fork and join streams (pt_capture_record,
 * pt_capture_wait): dst = the capture id the call recorded into or joined. */

/* (event, stream[, flags]): ptr = the event; arg 1 (the WithFlags form): aux = flags */
#define PT_H_EVENT_RECORD(name, id, kind, arg)                                   \
    PT_ENTRY(name, id, kind, {                                                 \
        E->ptr = PT_P1;                                                        \
        E->stream = PT_P2;                                                     \
        E->valid = PT_V_PTR | PT_V_STREAM;                                     \
        if (arg) {                                                             \
            E->aux = (u32)PT_P3;                                               \
            E->valid |= PT_V_AUX;                                              \
        }                                                                      \
        pt_capture_record(E, PT_P1, PT_P2);                                    \
    })

/* (stream, event, flags): ptr = the event waited on, aux = flags */
#define PT_H_STREAM_WAIT_EVENT(name, id, kind, arg)                              \
    PT_ENTRY(name, id, kind, {                                                 \
        E->stream = PT_P1;                                                     \
        E->ptr = PT_P2;                                                        \
        E->aux = (u32)PT_P3;                                                   \
        E->valid = PT_V_STREAM | PT_V_PTR | PT_V_AUX;                          \
        pt_capture_wait(E, PT_P1, PT_P2);                                      \
    })

/* ------------------------------------------------------------- allocations */

/* (T **out, size_t size, ...): ptr = *out at return */
#define PT_ALLOC_BODY(...)                                                     \
    {                                                                          \
        u64 p;                                                                 \
        E->size = IN.a[1];                                                     \
        E->valid = PT_V_SIZE;                                                  \
        if (!pt_read_out(E, IN.a[0], &p)) {                                    \
            E->ptr = p;                                                        \
            E->valid |= PT_V_PTR;                                              \
        }                                                                      \
        __VA_ARGS__;                                                           \
    }

#define PT_H_ALLOC(name, id, kind, arg)                                          \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, 0, 0, PT_ALLOC_BODY({}))

/* (out, size, unsigned flags): aux = flags */
#define PT_H_ALLOC_FLAGS(name, id, kind, arg)                                    \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, PT_P3, 0, PT_ALLOC_BODY({            \
        E->aux = IN.a[2];                                                      \
        E->valid |= PT_V_AUX;                                                  \
    }))

/* (out, size, stream) */
#define PT_H_ALLOC_STREAM(name, id, kind, arg)                                   \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, PT_P3, 0, PT_ALLOC_BODY({            \
        E->stream = IN.a[2];                                                   \
        E->valid |= PT_V_STREAM;                                               \
    }))

/* (out, size, pool, stream) */
#define PT_H_ALLOC_POOL(name, id, kind, arg)                                     \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, PT_P4, 0, PT_ALLOC_BODY({            \
        E->stream = IN.a[2];                                                   \
        E->valid |= PT_V_STREAM;                                               \
    }))

/* (out, size_t *pitch, width, height[, elemsize]): size = *pitch x height */
#define PT_H_ALLOC_PITCH(name, id, kind, arg)                                    \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, PT_P4, 0, {                          \
        u64 p, pitch;                                                          \
        if (!pt_read_out(E, IN.a[0], &p)) {                                    \
            E->ptr = p;                                                        \
            E->valid |= PT_V_PTR;                                              \
        }                                                                      \
        if (!pt_read_out(E, IN.a[1], &pitch)) {                                \
            E->size = pitch * IN.a[2];                                         \
            E->valid |= PT_V_SIZE;                                             \
        }                                                                      \
    })

/* VMM address ranges: (ptr, size, ...) */
#define PT_H_RANGE(name, id, kind, arg)                                          \
    PT_ENTRY(name, id, kind, {                                                 \
        E->ptr = PT_P1;                                                        \
        E->size = PT_P2;                                                       \
        E->valid = PT_V_PTR | PT_V_SIZE;                                       \
    })

/* (ptr, size, offset, handle, flags): src = the physical handle mapped */
#define PT_H_VMM_MAP(name, id, kind, arg)                                        \
    PT_ENTRY(name, id, kind, {                                                 \
        E->ptr = PT_P1;                                                        \
        E->size = PT_P2;                                                       \
        E->src = PT_P4;                                                        \
        E->valid = PT_V_PTR | PT_V_SIZE | PT_V_SRC;                            \
    })

#define PT_H_FREE(name, id, kind, arg)                                           \
    PT_ENTRY(name, id, kind, {                                                 \
        E->ptr = PT_P1;                                                        \
        E->valid = PT_V_PTR;                                                   \
    })

#define PT_H_FREE_STREAM(name, id, kind, arg)                                    \
    PT_ENTRY(name, id, kind, {                                                 \
        E->ptr = PT_P1;                                                        \
        E->stream = PT_P2;                                                     \
        E->valid = PT_V_PTR | PT_V_STREAM;                                     \
    })

/* ------------------------------------------------------------------ copies */

/* (dst, src, size[, stream]); arg = CopyKind from the API name */
#define PT_H_COPY(name, id, kind, arg)                                           \
    PT_ENTRY(name, id, kind, {                                                 \
        E->dst = PT_P1;                                                        \
        E->src = PT_P2;                                                        \
        E->size = PT_P3;                                                       \
        E->copy_kind = arg;                                                    \
        E->valid = PT_V_DST | PT_V_SRC | PT_V_SIZE | PT_V_COPY_KIND;           \
    })

#define PT_H_COPY_ASYNC(name, id, kind, arg)                                     \
    PT_ENTRY(name, id, kind, {                                                 \
        E->dst = PT_P1;                                                        \
        E->src = PT_P2;                                                        \
        E->size = PT_P3;                                                       \
        E->stream = PT_P4;                                                     \
        E->copy_kind = arg;                                                    \
        E->valid = PT_V_DST | PT_V_SRC | PT_V_SIZE | PT_V_COPY_KIND | PT_V_STREAM; \
    })

/* (dst, dstCtx, src, srcCtx, size[, stream]) */
#define PT_H_COPY_PEER(name, id, kind, arg)                                      \
    PT_ENTRY(name, id, kind, {                                                 \
        E->dst = PT_P1;                                                        \
        E->src = PT_P3;                                                        \
        E->size = PT_P5;                                                       \
        E->copy_kind = arg;                                                    \
        E->valid = PT_V_DST | PT_V_SRC | PT_V_SIZE | PT_V_COPY_KIND;           \
    })

#define PT_H_COPY_PEER_ASYNC(name, id, kind, arg)                                \
    PT_ENTRY(name, id, kind, {                                                 \
        E->dst = PT_P1;                                                        \
        E->src = PT_P3;                                                        \
        E->size = PT_P5;                                                       \
        E->stream = PT_P6;                                                     \
        E->copy_kind = arg;                                                    \
        E->valid = PT_V_DST | PT_V_SRC | PT_V_SIZE | PT_V_COPY_KIND | PT_V_STREAM; \
    })

/* ----------------------------------------------------------------- memsets */

/* (dst, value, count[, stream]); arg = element size, size in bytes */
#define PT_H_MEMSET(name, id, kind, arg)                                         \
    PT_ENTRY(name, id, kind, {                                                 \
        E->ptr = PT_P1;                                                        \
        E->aux = PT_P2;                                                        \
        E->size = PT_P3 * arg;                                                 \
        E->valid = PT_V_PTR | PT_V_AUX | PT_V_SIZE;                            \
    })

#define PT_H_MEMSET_ASYNC(name, id, kind, arg)                                   \
    PT_ENTRY(name, id, kind, {                                                 \
        E->ptr = PT_P1;                                                        \
        E->aux = PT_P2;                                                        \
        E->size = PT_P3 * arg;                                                 \
        E->stream = PT_P4;                                                     \
        E->valid = PT_V_PTR | PT_V_AUX | PT_V_SIZE | PT_V_STREAM;              \
    })

/* (dst, pitch, value, width, height[, stream]) */
#define PT_H_MEMSET2D(name, id, kind, arg)                                       \
    PT_ENTRY(name, id, kind, {                                                 \
        E->ptr = PT_P1;                                                        \
        E->aux = PT_P3;                                                        \
        E->size = PT_P4 * PT_P5 * arg;                                         \
        E->valid = PT_V_PTR | PT_V_AUX | PT_V_SIZE;                            \
    })

#define PT_H_MEMSET2D_ASYNC(name, id, kind, arg)                                 \
    PT_ENTRY(name, id, kind, {                                                 \
        E->ptr = PT_P1;                                                        \
        E->aux = PT_P3;                                                        \
        E->size = PT_P4 * PT_P5 * arg;                                         \
        E->stream = PT_P6;                                                     \
        E->valid = PT_V_PTR | PT_V_AUX | PT_V_SIZE | PT_V_STREAM;              \
    })

/* ------------------------------------------------------------------- syncs */

#define PT_H_SYNC_STREAM(name, id, kind, arg)                                    \
    PT_PAIR(name, id, kind, PT_P1, 0, 0, 0, {                                  \
        E->stream = IN.a[0];                                                   \
        E->valid = PT_V_STREAM;                                                \
    })

/* (event or context): ptr = the handle waited on */
#define PT_H_SYNC_HANDLE(name, id, kind, arg)                                    \
    PT_PAIR(name, id, kind, PT_P1, 0, 0, 0, {                                  \
        E->ptr = IN.a[0];                                                      \
        E->valid = PT_V_PTR;                                                   \
    })

#define PT_H_SYNC_NONE(name, id, kind, arg) PT_PAIR(name, id, kind, 0, 0, 0, 0, {})

/* ---------------------------------------------------- names and modules */

/* (T *out, module, const char *name): func = *out; a name record */
#define PT_H_NAME_LOOKUP(name, id, kind, arg)                                    \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, PT_P3, 0, {                          \
        u64 h = 0;                                                             \
        if (!pt_read_out(E, IN.a[0], &h)) {                                    \
            E->func = h;                                                       \
            E->valid = PT_V_FUNC;                                              \
        }                                                                      \
        E->src = IN.a[1];                                                      \
        E->valid |= PT_V_SRC;                                                  \
        pt_name_emit(id, arg, E->ret, h, 0, IN.a[2]);                          \
    })

/* (T *out, kernel or host symbol): the returned handle aliases PARM2 */
#define PT_H_KERNEL_GET_FUNCTION(name, id, kind, arg)                            \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, 0, 0, {                              \
        u64 h = 0;                                                             \
        if (!pt_read_out(E, IN.a[0], &h)) {                                    \
            E->func = h;                                                       \
            E->valid = PT_V_FUNC;                                              \
        }                                                                      \
        E->src = IN.a[1];                                                      \
        E->valid |= PT_V_SRC;                                                  \
        pt_name_emit(id, arg, E->ret, h, IN.a[1], 0);                          \
    })

/* (const char **name, handle) */
#define PT_H_FUNC_GET_NAME(name, id, kind, arg)                                  \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, 0, 0, {                              \
        u64 s = 0;                                                             \
        E->func = IN.a[1];                                                     \
        E->valid = PT_V_FUNC;                                                  \
        pt_read_out(E, IN.a[0], &s);                                           \
        pt_name_emit(id, arg, E->ret, IN.a[1], 0, s);                          \
    })

/* __hipRegisterFunction / __cudaRegisterFunction(modules, hostFunction,
 * deviceFunction, deviceName, ...): run from static constructors; names the
 * host stub a runtime launch receives. */
#define PT_H_REGISTER_FUNCTION(name, id, kind, arg)                              \
    PT_ENTRY(name, id, kind, {                                                 \
        E->func = PT_P2;                                                       \
        E->valid = PT_V_FUNC;                                                  \
        pt_name_emit(id, arg, 0, PT_P2, 0, PT_P4);                             \
    })

/* (T *out, image or path, ...): ptr = the module/library handle, src = image */
#define PT_H_MODULE_LOAD(name, id, kind, arg)                                    \
    PT_PAIR(name, id, kind, PT_P1, PT_P2, 0, 0, {                              \
        u64 h;                                                                 \
        E->src = IN.a[1];                                                      \
        E->valid = PT_V_SRC;                                                   \
        if (!pt_read_out(E, IN.a[0], &h)) {                                    \
            E->ptr = h;                                                        \
            E->valid |= PT_V_PTR;                                              \
        }                                                                      \
    })
