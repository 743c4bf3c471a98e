// execgate's observation probes, in bcc's C dialect (compiled by bcc at daemon start; see
// probes.py). Nothing here changes what the kernel does: it only reports.
//
// 1. OOM kills: oom:mark_victim fires once per victim, in the context of the task that ran
//    the OOM killer (often, but not always, a task of the victim's cgroup). The tracepoint's
//    fields give pid, comm and the victim's RSS; the raw tracepoint gets the victim's
//    task_struct, whose cgroup id (task->cgroups->dfl_cgrp->kn->id = the inode of its cgroup2
//    directory) is the attribution. The raw program parks it in `victims` keyed by pid; the
//    userspace reader joins the two when the perf event arrives (both programs have run by then).
// 2. Page faults: exceptions:page_fault_user counted per cgroup of the faulting task, plus the
//    busiest 10 ms window since the reader last bumped `epoch` (bursts between 100 ms samples).
//
// probes.py prepends #defines: HAS_<field> for every oom:mark_victim field this kernel has,
// RAW_VICTIM when the raw tracepoint passes a task_struct, FAULTS when page_fault_user exists.

#include <uapi/linux/ptrace.h>
#ifdef RAW_VICTIM
// task_struct -> css_set -> cgroup -> kernfs_node. Kernel >= 7.x headers embed anonymous
// structs (-fms-extensions); probes.py passes that flag and, should these headers still not
// compile, builds again without RAW_VICTIM.
#include <linux/sched.h>
#include <linux/cgroup.h>
#include <linux/kernfs.h>
#endif

#define FAULT_WINDOW_NS (10 * 1000 * 1000ULL)

struct oom_event {
    u64 ts_ns;            // bpf_ktime_get_ns(): CLOCK_MONOTONIC
    u64 trigger_cgroup;   // cgroup of the task that ran the OOM killer (not the victim)
    u64 total_vm_kb;
    u64 anon_rss_kb;
    u64 file_rss_kb;
    u64 shmem_rss_kb;
    u64 pgtables_kb;
    u32 pid;
    u32 trigger_pid;
    u32 uid;
    s32 oom_score_adj;
    char comm[16];
};

struct victim {
    u64 cgroup_id;
    u32 tgid;
    u32 pad;
};

BPF_PERF_OUTPUT(ooms);
BPF_TABLE("lru_hash", u32, struct victim, victims, 1024);

TRACEPOINT_PROBE(oom, mark_victim) {
    struct oom_event ev = {};
    ev.ts_ns = bpf_ktime_get_ns();
    ev.trigger_cgroup = bpf_get_current_cgroup_id();
    ev.trigger_pid = bpf_get_current_pid_tgid() >> 32;
    ev.pid = args->pid;
#ifdef HAS_comm
    TP_DATA_LOC_READ_STR(ev.comm, comm, sizeof(ev.comm));
#endif
#ifdef HAS_total_vm
    ev.total_vm_kb = args->total_vm;
#endif
#ifdef HAS_anon_rss
    ev.anon_rss_kb = args->anon_rss;
#endif
#ifdef HAS_file_rss
    ev.file_rss_kb = args->file_rss;
#endif
#ifdef HAS_shmem_rss
    ev.shmem_rss_kb = args->shmem_rss;
#endif
#ifdef HAS_pgtables
    ev.pgtables_kb = args->pgtables;
#endif
#ifdef HAS_uid
    ev.uid = args->uid;
#endif
#ifdef HAS_oom_score_adj
    ev.oom_score_adj = args->oom_score_adj;
#endif
    ooms.perf_submit(args, &ev, sizeof(ev));
    return 0;
}

#ifdef RAW_VICTIM
RAW_TRACEPOINT_PROBE(mark_victim) {
    struct task_struct *task = (struct task_struct *)ctx->args[0];
    struct css_set *cset = NULL;
    struct cgroup *cgrp = NULL;
    struct kernfs_node *kn = NULL;
    struct victim v = {};
    u32 pid = 0;
    bpf_probe_read_kernel(&pid, sizeof(pid), &task->pid);
    bpf_probe_read_kernel(&v.tgid, sizeof(v.tgid), &task->tgid);
    bpf_probe_read_kernel(&cset, sizeof(cset), &task->cgroups);
    if (cset)
        bpf_probe_read_kernel(&cgrp, sizeof(cgrp), &cset->dfl_cgrp);
    if (cgrp)
        bpf_probe_read_kernel(&kn, sizeof(kn), &cgrp->kn);
    if (kn)
        bpf_probe_read_kernel(&v.cgroup_id, sizeof(v.cgroup_id), &kn->id);
    victims.update(&pid, &v);
    return 0;
}
#endif

#ifdef FAULTS
struct faults_val {
    u64 count;      // every user page fault of the cgroup on this CPU
    u64 win_start;  // current 10 ms window
    u64 win_count;
    u64 peak;       // busiest window since `epoch` last changed
    u64 epoch;
};

BPF_TABLE("lru_percpu_hash", u64, struct faults_val, faults, 16384);
BPF_ARRAY(epoch, u64, 1);

TRACEPOINT_PROBE(exceptions, page_fault_user) {
    u64 cg = bpf_get_current_cgroup_id();
    struct faults_val zero = {};
    struct faults_val *v = faults.lookup_or_try_init(&cg, &zero);
    if (!v)
        return 0;
    int k = 0;
    u64 *ep = epoch.lookup(&k);
    u64 e = ep ? *ep : 0;
    if (v->epoch != e) {
        v->epoch = e;
        v->peak = 0;
    }
    u64 now = bpf_ktime_get_ns();
    if (now - v->win_start > FAULT_WINDOW_NS) {
        v->win_start = now;
        v->win_count = 0;
    }
    v->count++;
    v->win_count++;
    if (v->win_count > v->peak)
        v->peak = v->win_count;
    return 0;
}
#endif
