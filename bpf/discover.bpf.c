/* Late-loaded libraries and process lifetimes (pasta_trace/capture/procs/late_load.py).
 *
 * Raw tracepoints only: they need no tracefs mount.  The few kernel struct
 * members read (to find the file behind a descriptor) are read at offsets
 * taken from the running kernel's BTF (PT_OFF_*, capture/bpf/kernel_offsets.py),
 * never from the installed headers, which may be another kernel's.
 *
 * - open/openat/openat2 for reading, of a file named libcuda.so*,
 *   libcudart.so*, libamdhip64.so*, libc10.so* (PyTorch) or libnccl.so*, by a
 *   traced process, that succeeded, and whose file (device, inode) is not in
 *   `known_files`: the process is stopped (SIGSTOP)
 *   before the open returns to user space, and recorded in `pt_stops`.  User
 *   space attaches the probes, adds the file to `known_files`, deletes the
 *   record and sends SIGCONT, so the library's first call is traced.  If the
 *   tracer dies, its guardian (capture/procs/guardian.py), which holds pt_stops and
 *   discover_cfg, disarms and resumes every process still recorded.
 * - mmap with PROT_EXEC of a file by a traced process, that succeeded, whose
 *   file is in neither `known_files` nor `plain_files`: the process is stopped
 *   the same way (pt_stops record with the mapped fd and an empty path).  A
 *   library with the CUDA runtime linked into it (its .symtab, not its name,
 *   says so) is caught there, before any of its code ran (ld.so maps its code
 *   before it relocates it or runs its constructors); user space probes it
 *   and makes it known, or puts a file with nothing to probe in `plain_files`
 *   (an LRU: a file it forgets costs one more stop).  With a pid filter every
 *   such mapping is also reported (a MAP record): a process that exits before
 *   its maps are read again still has its libraries named offline.
 * - every stop also writes a STOP record that wakes the tracer: a program
 *   loading a hundred libraries waits for each only as long as its look.
 * - pasta-trace's own processes (the tracer, its events writer, its guardian:
 *   their tgids in `pt_own`, added by user space as each starts) are never
 *   stopped.  By tgid, not by name: a user's program may be named anything,
 *   `pasta-trace` included, and is traced all the same.  Without a pid filter
 *   (-a) a child of the tracer or of one of its own processes is one of its own
 *   from its first instruction: the tracer may wait for a helper it starts,
 *   and a helper stopped at its first mapping would wait for the tracer.
 * - under sudo only the invoking user's processes are traced (bpf/reach.h):
 *   another user's process is never stopped and none of its forks, execs or
 *   exits are reported, so user space never reads its maps or cmdline.
 * - fork: a child of a traced process joins pid_filter in its own context, at
 *   its first return to user space, before it can run any code of its own.
 *   A child that finds pid_filter (or pending_children) full is counted
 *   (PT_UNTRACED_CHILDREN), never dropped silently.
 * - exit: every per-process entry (pid_filter, pt_own, py_procs, the thread's
 *   open_args, pt_stops and pending_children; with the probes, py_finalizing,
 *   the streams under capture and the NCCL comm_ids) is deleted, traced or
 *   not, so no table fills with the dead over a long capture.
 * - exec and exit of traced processes are reported for processes.parquet; an
 *   exec also forgets the process's Python interpreter (pystack.h, with stacks).
 *   With a pid filter (a launched command, -p), a process that execs is
 *   stopped too, before its first instruction (a pt_stops record with fd -1),
 *   until user space has read its new maps: a program that runs a few ms is
 *   otherwise gone, with its maps, before the next drain, and the launches it
 *   made could not be named offline.
 *
 * PT_DISCOVER_FILTER (1: only processes in pid_filter, 0: every process), the
 * ring and table sizes, the offsets and the struct layouts are prepended by late_load.py;
 * PT_DISCOVER_ALONE: loaded without the probes program (its tables are not there).
 */

#include <uapi/linux/ptrace.h>

#define PT_SIGSTOP 19
#define PT_NR_OPEN 2
#define PT_NR_OPENAT 257
#define PT_NR_OPENAT2 437
#define PT_O_ACCMODE 3
#define PT_O_RDONLY 0
#define PT_NR_MMAP 9
#define PT_PROT_EXEC 4
#define PT_MAP_ANONYMOUS 0x20
#define PT_MAX_ERRNO 4095
/* pending_children value: the parent is the tracer or one of its own (-a) */
#define PT_OWN_CHILD 0x80000000u

struct pt_path_key {
    char path[PT_PATH_LEN];
};

struct pt_open_args {
    u64 name;  /* user pointer to the file name */
    u64 flags;
};

struct pt_mmap_args {
    u64 len;
    u64 pgoff;
    s64 fd;
};

BPF_RINGBUF_OUTPUT(discover_events, PT_DISCOVER_PAGES);
BPF_HASH(known_files, struct pt_file, u8, PT_KNOWN_MAX);
BPF_HASH(pt_stops, u32, struct pt_stop, PT_STOPS_MAX); /* opener's tid -> why it is stopped */
BPF_HASH(open_args, u32, struct pt_open_args, 16384);
BPF_HASH(mmap_args, u32, struct pt_mmap_args, 16384); /* tid -> its executable file mapping being made */
/* files mapped executable that have nothing to probe: their mappings stop nobody */
BPF_TABLE("lru_hash", struct pt_file, u8, plain_files, PT_PLAIN_MAX);
BPF_HASH(pending_children, u64, u32, 16384); /* child task pointer -> parent tgid */
BPF_HASH(pt_own, u32, u8, PT_OWN_MAX); /* pasta-trace's own tgids: never stopped */
BPF_PERCPU_ARRAY(discover_scratch, struct pt_stop, 1);
/* [0] the tracer's own tgid: never stop it; [1] 1 while the tracer (or its guardian)
 * is there to resume what it stops: cleared before the tracer stops polling, so a
 * process that opens a library while the probes are being removed is never left stopped;
 * [2] 1 once the tracer's set-up is done (LateLoadWatcher.arm_mappings): a mapping stops
 * nobody before (under -a every new process of the machine would wait for the scan) */
BPF_ARRAY(discover_cfg, u32, 3);
/* [PT_UNPAUSED_OPENS] opens not paused because pt_stops was full;
 * [PT_LOST_NOTIFICATIONS] fork/exec/exit notifications dropped because the ring was full;
 * [PT_UNTRACED_CHILDREN] children of traced processes that pid_filter or pending_children
 * could not hold (slots from schema.LOSSES) */
BPF_PERCPU_ARRAY(discover_lost, u64, PT_DISCOVER_LOST_N);

static __always_inline void pt_dlost(int i)
{
    u64 *n = discover_lost.lookup(&i);
    if (n)
        (*n)++;
}

/* tgid is the current task's */
static __always_inline int pt_traced(u32 tgid)
{
    int k = 0;
    u32 *self = discover_cfg.lookup(&k);
    if (self && *self == tgid)
        return 0;
    if (pt_foreign())
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

static __always_inline int pt_maps_armed(void)
{
    int k = 2;
    u32 *armed = discover_cfg.lookup(&k);
    return armed && *armed;
}

static __always_inline int pt_own_process(u32 tgid)
{
    return pt_own.lookup(&tgid) != NULL;
}

static __always_inline void pt_notify(u32 type, u32 pid, u32 tid, u32 ppid)
{
    struct pt_discover *e = discover_events.ringbuf_reserve(sizeof(struct pt_discover));
    if (!e) {
        pt_dlost(PT_LOST_NOTIFICATIONS);
        return;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->pid = pid;
    e->tid = tid;
    e->ppid = ppid;
    e->type = type;
    /* the cgroup at this moment: a short-lived process may be gone before
     * user space can read /proc/PID/cgroup */
    e->cgroup_id = bpf_get_current_cgroup_id();
    e->addr = e->len = e->pgoff = e->dev = e->ino = 0;
    e->exit_code = e->pad = 0;
    /* the exit status, set by do_exit before this tracepoint: the daemon fires on
     * a process killed by a signal or exiting non-zero */
    if (type == PT_DISCOVER_EXIT)
        bpf_probe_read_kernel(&e->exit_code, sizeof(e->exit_code),
                              (char *)bpf_get_current_task() + PT_OFF_TASK_EXIT_CODE);
    /* an exec wakes the tracer: a short program must have its maps read
     * (runtime launches are named through them) before it exits; a stop, so
     * that the stopped process waits only for its own handling */
    discover_events.ringbuf_submit(e, type == PT_DISCOVER_EXEC || type == PT_DISCOVER_STOP
                                          ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

#if PT_DISCOVER_FILTER
/* A MAP record: where a traced process mapped which file, executable. */
static __always_inline void pt_notify_map(u32 tgid, u32 tid, u64 addr, struct pt_mmap_args *m, struct pt_file *f)
{
    struct pt_discover *e = discover_events.ringbuf_reserve(sizeof(struct pt_discover));
    if (!e) {
        pt_dlost(PT_LOST_NOTIFICATIONS);
        return;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->pid = tgid;
    e->tid = tid;
    e->ppid = 0;
    e->type = PT_DISCOVER_MAP;
    e->cgroup_id = 0;
    e->addr = addr;
    e->len = m->len;
    e->pgoff = m->pgoff;
    e->dev = f->dev;
    e->ino = f->ino;
    e->exit_code = e->pad = 0;
    discover_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}
#endif

/* (device, inode) of the current task's descriptor fd: task->files->fdt->fd[fd]->f_inode */
static __always_inline int pt_fd_file(long fd, struct pt_file *out)
{
    char *p = (char *)bpf_get_current_task();
    if (bpf_probe_read_kernel(&p, sizeof(p), p + PT_OFF_TASK_FILES) || !p)
        return -1;
    if (bpf_probe_read_kernel(&p, sizeof(p), p + PT_OFF_FILES_FDT) || !p)
        return -1;
    if (bpf_probe_read_kernel(&p, sizeof(p), p + PT_OFF_FDT_FD) || !p)
        return -1;
    if (bpf_probe_read_kernel(&p, sizeof(p), p + fd * sizeof(void *)) || !p)
        return -1;
    if (bpf_probe_read_kernel(&p, sizeof(p), p + PT_OFF_FILE_INODE) || !p)
        return -1;
    u64 ino = 0;
    if (bpf_probe_read_kernel(&ino, sizeof(ino), p + PT_OFF_INODE_INO))
        return -1;
    if (bpf_probe_read_kernel(&p, sizeof(p), p + PT_OFF_INODE_SB) || !p)
        return -1;
    u32 dev = 0;
    if (bpf_probe_read_kernel(&dev, sizeof(dev), p + PT_OFF_SB_DEV))
        return -1;
    out->dev = dev;
    out->ino = ino;
    return 0;
}

/* a path component that starts with `libcuda.so` (1), `libamdhip64.so` (2),
 * `libc10.so` (3), `libnccl.so` (4) or `libcudart.so` (5), then NUL or '.'.
 * No state besides the index, so the verifier walks the loop once per
 * iteration; user space re-checks that it is the last component. */
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
        if (b[1] == 'i' && b[2] == 'b' && b[3] == 'c' && b[4] == 'u' && b[5] == 'd' && b[6] == 'a' &&
            b[7] == 'r' && b[8] == 't' && b[9] == '.' && b[10] == 's' && b[11] == 'o' &&
            (b[12] == 0 || b[12] == '.'))
            return 5;
        if (b[1] == 'i' && b[2] == 'b' && b[3] == 'a' && b[4] == 'm' && b[5] == 'd' && b[6] == 'h' &&
            b[7] == 'i' && b[8] == 'p' && b[9] == '6' && b[10] == '4' && b[11] == '.' && b[12] == 's' &&
            b[13] == 'o' && (b[14] == 0 || b[14] == '.'))
            return 2;
        if (b[1] == 'i' && b[2] == 'b' && b[3] == 'c' && b[4] == '1' && b[5] == '0' && b[6] == '.' &&
            b[7] == 's' && b[8] == 'o' && (b[9] == 0 || b[9] == '.'))
            return 3;
        if (b[1] == 'i' && b[2] == 'b' && b[3] == 'n' && b[4] == 'c' && b[5] == 'c' && b[6] == 'l' &&
            b[7] == '.' && b[8] == 's' && b[9] == 'o' && (b[10] == 0 || b[10] == '.'))
            return 4;
    }
    return 0;
}

RAW_TRACEPOINT_PROBE(sys_enter)
{
    long nr = ctx->args[1];
    if (nr != PT_NR_OPENAT && nr != PT_NR_OPEN && nr != PT_NR_OPENAT2 && nr != PT_NR_MMAP)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    if (!pt_traced(id >> 32))
        return 0;
    struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
    if (nr == PT_NR_MMAP) {
        u64 prot = 0, flags = 0, fd = 0;
        struct pt_mmap_args m = {};
        bpf_probe_read_kernel(&prot, sizeof(prot), &PT_REGS_PARM3(regs));
        bpf_probe_read_kernel(&flags, sizeof(flags), &regs->r10); /* a syscall's 4th argument */
        bpf_probe_read_kernel(&fd, sizeof(fd), &PT_REGS_PARM5(regs));
        if (!(prot & PT_PROT_EXEC) || (flags & PT_MAP_ANONYMOUS) || (s32)fd < 0)
            return 0;
        bpf_probe_read_kernel(&m.len, sizeof(m.len), &PT_REGS_PARM2(regs));
        bpf_probe_read_kernel(&m.pgoff, sizeof(m.pgoff), &PT_REGS_PARM6(regs));
        m.fd = (s32)fd;
        u32 mtid = (u32)id;
        mmap_args.update(&mtid, &m);
        return 0;
    }
    struct pt_open_args a = {};
    if (nr == PT_NR_OPEN) {
        bpf_probe_read_kernel(&a.name, sizeof(a.name), &PT_REGS_PARM1(regs));
        bpf_probe_read_kernel(&a.flags, sizeof(a.flags), &PT_REGS_PARM2(regs));
    } else {
        bpf_probe_read_kernel(&a.name, sizeof(a.name), &PT_REGS_PARM2(regs));
        bpf_probe_read_kernel(&a.flags, sizeof(a.flags), &PT_REGS_PARM3(regs));
        if (nr == PT_NR_OPENAT2) { /* a pointer to struct open_how, whose first member is the flags */
            u64 how = a.flags;
            a.flags = 0;
            bpf_probe_read_user(&a.flags, sizeof(a.flags), (void *)how);
        }
    }
    if ((a.flags & PT_O_ACCMODE) != PT_O_RDONLY)
        return 0; /* written, not loaded (cp, an installer): its content may not be there yet */
    u32 tid = (u32)id;
    open_args.update(&tid, &a);
    return 0;
}

/* This CPU's pt_stop, zeroed (a pause's record is too large for the stack). */
static __always_inline struct pt_stop *pt_stop_scratch(void)
{
    int k = 0;
    struct pt_stop *st = discover_scratch.lookup(&k);
    if (st)
        __builtin_memset(st, 0, sizeof(*st));
    return st;
}

/* Stop the calling thread (SIGSTOP, taken on its way back to user space),
 * recorded first in pt_stops with why (st: path, dev, ino already set):
 * whoever resumes it learns of it there.  A full pt_stops pauses nobody. */
static __always_inline void pt_stop_current(struct pt_stop *st, u32 tid, u32 tgid, s32 fd)
{
    st->ts_ns = bpf_ktime_get_ns();
    st->tgid = tgid;
    st->fd = fd;
    if (pt_stops.update(&tid, st)) {
        pt_dlost(PT_UNPAUSED_OPENS);
        return;
    }
    bpf_send_signal(PT_SIGSTOP);
    pt_notify(PT_DISCOVER_STOP, tgid, tid, 0);
}

/* The return of a traced thread's mmap of a file, executable (mmap_args). */
static __always_inline void pt_mapped(long ret, struct pt_mmap_args *args, u32 tid, u32 tgid)
{
    struct pt_mmap_args m = *args;
    mmap_args.delete(&tid);
    if (ret < 0 && ret >= -PT_MAX_ERRNO)
        return;
    struct pt_file f = {};
    if (pt_fd_file(m.fd, &f))
        return;
#if PT_DISCOVER_FILTER
    pt_notify_map(tgid, tid, (u64)ret, &m, &f);
#endif
    if (known_files.lookup(&f) || plain_files.lookup(&f))
        return;
    if (!pt_armed() || !pt_maps_armed() || pt_own_process(tgid))
        return;
    struct pt_stop *st = pt_stop_scratch();
    if (!st)
        return;
    st->dev = f.dev;
    st->ino = f.ino;
    pt_stop_current(st, tid, tgid, (s32)m.fd);
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
        u8 one = 1;
        if (ppid & PT_OWN_CHILD) {
            pt_own.update(&tgid, &one);
        } else {
#if PT_DISCOVER_FILTER
            if (pid_filter.update(&tgid, &one))
                pt_dlost(PT_UNTRACED_CHILDREN); /* its calls go untraced: said, not hidden */
#endif
            pt_notify(PT_DISCOVER_FORK, tgid, tid, ppid);
        }
    }

    struct pt_mmap_args *m = mmap_args.lookup(&tid);
    if (m) {
        pt_mapped(ctx->args[1], m, tid, tgid);
        return 0;
    }

    struct pt_open_args *a = open_args.lookup(&tid);
    if (!a)
        return 0;
    u64 uname = a->name;
    open_args.delete(&tid);
    long ret = ctx->args[1];
    if (ret < 0)
        return 0;
    struct pt_stop *st = pt_stop_scratch();
    if (!st)
        return 0;
    if (bpf_probe_read_user_str(st->path, sizeof(st->path), (void *)uname) <= 0)
        return 0;
    if (!pt_is_gpu_library(st->path))
        return 0;
    struct pt_file f = {};
    if (pt_fd_file(ret, &f) == 0 && known_files.lookup(&f))
        return 0;
    /* stop only a process that someone is there to resume, and that is not ours */
    if (!pt_armed() || pt_own_process(tgid))
        return 0;
    st->dev = f.dev;
    st->ino = f.ino;
    pt_stop_current(st, tid, tgid, (s32)ret);
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_process_fork)
{
    /* runs in the parent; args[1] is the child's task_struct, used only as a key */
    u32 ptgid = bpf_get_current_pid_tgid() >> 32;
    u64 child = ctx->args[1];
#if !PT_DISCOVER_FILTER
    int k = 0;
    u32 *self = discover_cfg.lookup(&k);
    if ((self && *self == ptgid) || pt_own_process(ptgid)) {
        u32 own = ptgid | PT_OWN_CHILD;
        if (pending_children.update(&child, &own))
            pt_dlost(PT_UNTRACED_CHILDREN);
        return 0;
    }
#endif
    if (!pt_traced(ptgid))
        return 0;
    if (pending_children.update(&child, &ptgid))
        pt_dlost(PT_UNTRACED_CHILDREN);
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_process_exec)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
#ifdef PT_PYSTACKS
    /* the old image's interpreter addresses mean nothing now, traced or not
     * (a setuid program may become the user's again): until user space looks
     * at the new one, its events count as not registered (pystack.h) */
    py_procs.delete(&tgid);
    py_unregistered.delete(&tgid);
#endif
#ifndef PT_DISCOVER_ALONE
    py_finalizing.delete(&tgid); /* c10.bpf.c: a new image is not finalizing */
    /* the old image's streams and communicators: addresses the new one may reuse */
    pt_captures_gone(tgid);
    pt_nccl_gone(tgid);
#endif
    if (!pt_traced(tgid))
        return 0;
    pt_notify(PT_DISCOVER_EXEC, id >> 32, (u32)id, 0);
#if PT_DISCOVER_FILTER
    if (!pt_armed() || pt_own_process(tgid))
        return 0;
    struct pt_stop *st = pt_stop_scratch();
    if (!st)
        return 0;
    pt_stop_current(st, (u32)id, tgid, -1); /* fd -1: no library, an exec */
#endif
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id, tgid = id >> 32;
    /* a stopped thread that was killed needs no resuming */
    pt_stops.delete(&tid);
    open_args.delete(&tid);
    mmap_args.delete(&tid);
    u64 task = bpf_get_current_task();
    pending_children.delete(&task); /* killed before its first return to user space */
    /* the group leader's exit stands for the process's */
    if (tid != tgid)
        return 0;
    /* notified only if traced (a process that became another uid is not any more);
     * its entries go either way */
    if (pt_traced(tgid))
        pt_notify(PT_DISCOVER_EXIT, tgid, tid, 0);
#if PT_DISCOVER_FILTER
    pid_filter.delete(&tgid);
#endif
#ifdef PT_PYSTACKS
    py_procs.delete(&tgid);
#endif
#ifndef PT_DISCOVER_ALONE
    py_finalizing.delete(&tgid); /* c10.bpf.c: a pid used again is another process */
    pt_captures_gone(tgid); /* pasta.h: captures left open, capture_n back down */
    pt_nccl_gone(tgid);     /* nccl.bpf.c: its communicators' comm_ids */
#endif
    pt_own.delete(&tgid);
    return 0;
}

#if defined(PT_PYSTACKS) && !defined(PT_DISCOVER_ALONE)
/* pt_stops fd of a process held at its interpreter's finalization */
#define PT_STOP_FINALIZING -2

/* The entry of Py_FinalizeEx / Py_Finalize / Py_Exit (capture/procs/finalize_probe.py),
 * in place of c10.bpf.c's pt_py_finalize: marks the process finalizing (its
 * first entry: Py_Exit enters Py_FinalizeEx too), and a Python process whose
 * stacks are walked is stopped there (a pt_stops record, as an open is) until
 * user space has drained the stacks ring and read the code objects its stacks
 * name.  A short program otherwise exits, its memory with it, before the
 * tracer's drain reads them, and its frames stay `?`.  Once per process; one
 * pt_stops cannot hold is counted in py_stats (unheld_exits). */
int pt_py_finalize_hold(struct pt_regs *ctx)
{
    if (pt_skip())
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id, tgid = id >> 32;
    u64 now = bpf_ktime_get_ns();
    if (py_finalizing.insert(&tgid, &now))
        return 0; /* finalizing already: held at its first entry */
    if (!py_procs.lookup(&tgid) || !pt_traced(tgid) || !pt_armed() || pt_own_process(tgid))
        return 0;
    struct pt_stop *st = pt_stop_scratch();
    if (!st)
        return 0;
    st->ts_ns = now;
    st->tgid = tgid;
    st->fd = PT_STOP_FINALIZING;
    if (pt_stops.update(&tid, st)) {
        pt_py_count(PT_PY_UNHELD_EXITS);
        return 0;
    }
    bpf_send_signal(PT_SIGSTOP);
    pt_notify(PT_DISCOVER_STOP, tgid, tid, 0);
    return 0;
}
#endif
