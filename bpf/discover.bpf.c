/* Late-loaded libraries and process lifetimes (pasta_trace/capture/late_load.py).
 *
 * Raw tracepoints only: they need no tracefs mount, and every value here comes
 * from a helper or a syscall register, never from a kernel struct whose
 * layout would have to match the running kernel's.
 *
 * - open/openat/openat2 of a file named libcuda.so* or libamdhip64.so*, by a
 *   traced process, that succeeded, and whose path is not in `known`: the
 *   process is stopped (SIGSTOP) before the open returns to user space and
 *   user space is told; it attaches the probes, adds the path to `known` and
 *   sends SIGCONT.  So the library's first call is traced.
 * - fork: a child of a traced process joins pid_filter in its own context, at
 *   its first return to user space, before it can run any code of its own.
 * - exec and exit of traced processes are reported for processes.parquet.
 *
 * PT_DISCOVER_FILTER (1: only processes in pid_filter, 0: every process) and
 * the struct pt_discover layout are prepended by late_load.py.
 */

#include <uapi/linux/ptrace.h>

#define PT_SIGSTOP 19
#define PT_NR_OPEN 2
#define PT_NR_OPENAT 257
#define PT_NR_OPENAT2 437

struct pt_path_key {
    char path[PT_PATH_LEN];
};

BPF_RINGBUF_OUTPUT(discover_events, 16);
BPF_HASH(known_paths, struct pt_path_key, u8, 1024);
BPF_HASH(open_args, u32, u64, 16384);       /* tid -> user pointer to the file name */
BPF_HASH(pending_children, u64, u32, 16384); /* child task pointer -> parent tgid */
BPF_PERCPU_ARRAY(discover_scratch, struct pt_path_key, 1);
/* [0] the tracer's own tgid: never stop it; [1] 1 while the tracer is there to resume
 * what it stops (cleared before it stops polling, so a process that opens a library
 * while the probes are being removed is never left stopped) */
BPF_ARRAY(discover_cfg, u32, 2);

static __always_inline int pt_traced(u32 tgid)
{
    int k = 0;
    u32 *self = discover_cfg.lookup(&k);
    if (self && *self == tgid)
        return 0;
#if PT_DISCOVER_FILTER
    return pid_filter.lookup(&tgid) != NULL;
#else
    return 1;
#endif
}

static __always_inline int pt_armed(void)
{
    int k = 1;
    u32 *armed = discover_cfg.lookup(&k);
    return armed && *armed;
}

/* returns 1 when user space will see the notification */
static __always_inline int pt_notify(u32 type, u32 pid, u32 tid, u32 ppid, s32 fd, struct pt_path_key *key)
{
    struct pt_discover *e = discover_events.ringbuf_reserve(sizeof(struct pt_discover));
    if (!e)
        return 0;
    e->ts_ns = bpf_ktime_get_ns();
    e->pid = pid;
    e->tid = tid;
    e->ppid = ppid;
    e->type = type;
    e->fd = fd;
    e->pad = 0;
    /* the cgroup at this moment: a short-lived process may be gone before
     * user space can read /proc/PID/cgroup */
    e->cgroup_id = bpf_get_current_cgroup_id();
    if (key)
        __builtin_memcpy(e->path, key->path, PT_PATH_LEN);
    else
        e->path[0] = 0;
    discover_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    return 1;
}

/* a path component that starts with `libcuda.so` or `libamdhip64.so`, then
 * NUL or '.'.  No state besides the index, so the verifier walks the loop
 * once per iteration; user space re-checks that it is the last component. */
static __always_inline int pt_is_gpu_library(const char *p)
{
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < PT_PATH_LEN - 16; i++) {
        const char *b = p + i;
        if (b[0] == 0)
            return 0;
        if (b[0] != 'l' || (i > 0 && p[i - 1] != '/'))
            continue;
        if (b[1] == 'i' && b[2] == 'b' && b[3] == 'c' && b[4] == 'u' && b[5] == 'd' && b[6] == 'a' &&
            b[7] == '.' && b[8] == 's' && b[9] == 'o' && (b[10] == 0 || b[10] == '.'))
            return 1;
        if (b[1] == 'i' && b[2] == 'b' && b[3] == 'a' && b[4] == 'm' && b[5] == 'd' && b[6] == 'h' &&
            b[7] == 'i' && b[8] == 'p' && b[9] == '6' && b[10] == '4' && b[11] == '.' && b[12] == 's' &&
            b[13] == 'o' && (b[14] == 0 || b[14] == '.'))
            return 2;
    }
    return 0;
}

RAW_TRACEPOINT_PROBE(sys_enter)
{
    long nr = ctx->args[1];
    if (nr != PT_NR_OPENAT && nr != PT_NR_OPEN && nr != PT_NR_OPENAT2)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    if (!pt_traced(id >> 32))
        return 0;
    struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
    u64 name = 0;
    if (nr == PT_NR_OPEN)
        bpf_probe_read_kernel(&name, sizeof(name), &PT_REGS_PARM1(regs));
    else
        bpf_probe_read_kernel(&name, sizeof(name), &PT_REGS_PARM2(regs));
    u32 tid = (u32)id;
    open_args.update(&tid, &name);
    return 0;
}

RAW_TRACEPOINT_PROBE(sys_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id, tgid = id >> 32;

    /* a new child's first return to user space: join its parent's filter */
    u64 task = bpf_get_current_task();
    u32 *parent = pending_children.lookup(&task);
    if (parent) {
        u32 ppid = *parent;
        pending_children.delete(&task);
#if PT_DISCOVER_FILTER
        u8 one = 1;
        pid_filter.update(&tgid, &one);
#endif
        pt_notify(PT_DISCOVER_FORK, tgid, tid, ppid, -1, NULL);
    }

    u64 *name = open_args.lookup(&tid);
    if (!name)
        return 0;
    u64 uname = *name;
    open_args.delete(&tid);
    long ret = ctx->args[1];
    if (ret < 0)
        return 0;
    int k = 0;
    struct pt_path_key *key = discover_scratch.lookup(&k);
    if (!key)
        return 0;
    __builtin_memset(key, 0, sizeof(*key));
    if (bpf_probe_read_user_str(key->path, sizeof(key->path), (void *)uname) <= 0)
        return 0;
    if (!pt_is_gpu_library(key->path))
        return 0;
    if (known_paths.lookup(key))
        return 0;
    /* stop only a process that user space will hear about and resume */
    if (pt_armed() && pt_notify(PT_DISCOVER_OPEN, tgid, tid, 0, (s32)ret, key))
        bpf_send_signal(PT_SIGSTOP);
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_process_fork)
{
    /* runs in the parent; args[1] is the child's task_struct, used only as a key */
    u32 ptgid = bpf_get_current_pid_tgid() >> 32;
    if (!pt_traced(ptgid))
        return 0;
    u64 child = ctx->args[1];
    pending_children.update(&child, &ptgid);
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_process_exec)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!pt_traced(id >> 32))
        return 0;
    pt_notify(PT_DISCOVER_EXEC, id >> 32, (u32)id, 0, -1, NULL);
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    /* the group leader's exit stands for the process's */
    if ((u32)id != tgid || !pt_traced(tgid))
        return 0;
    pt_notify(PT_DISCOVER_EXIT, tgid, (u32)id, 0, -1, NULL);
#if PT_DISCOVER_FILTER
    pid_filter.delete(&tgid);
#endif
    return 0;
}
