/* Which processes may be traced (pasta_trace/capture/procs/reach.py).
 *
 * Under sudo, pasta_trace/probes/program.py (reach_text) defines
 * PT_ALLOWED_UID, the invoking user's uid, and the offsets of the task's
 * credentials in the running kernel (PT_OFF_*, from its BTF).  A task is
 * foreign unless its real, effective, saved and file-system uids are all that
 * uid: another user's process, a setuid program, and a process of the user's
 * that became another uid are all foreign from that moment on.  Every event
 * handler (pt_skip, pasta.h) and every stop and notification of the discover
 * program (pt_traced, discover.bpf.c) asks here.  Without PT_ALLOWED_UID
 * (root's own use) no task is foreign.
 *
 * Included twice (probes program, then discover program): guarded.
 */
#ifndef PT_REACH_H
#define PT_REACH_H

#ifdef PT_ALLOWED_UID
/* Loads through the task's BTF pointer (as pt_comm's): task->cred, then the
 * uids.  Two bpf_probe_read_kernel copies instead cost ~45 ns a call on our
 * VM, ~5% of a launch probe. */
static __always_inline int pt_foreign(void)
{
    u8 *task = (u8 *)bpf_get_current_task_btf();
    u8 *cred = *(u8 **)(task + PT_OFF_TASK_STRUCT_CRED);
    if (!cred)
        return 1;
    return *(u32 *)(cred + PT_OFF_CRED_UID) != PT_ALLOWED_UID ||
           *(u32 *)(cred + PT_OFF_CRED_EUID) != PT_ALLOWED_UID ||
           *(u32 *)(cred + PT_OFF_CRED_SUID) != PT_ALLOWED_UID ||
           *(u32 *)(cred + PT_OFF_CRED_FSUID) != PT_ALLOWED_UID;
}
#else
static __always_inline int pt_foreign(void)
{
    return 0;
}
#endif

#endif /* PT_REACH_H */
