/* SPDX-License-Identifier: GPL-2.0 */
/*
 * execgate's growth-gate scheduler: a minimal sched_ext scheduler that parks
 * the tasks of *denied* cgroups until userspace allows them again.
 *
 * A partial switch (SCX_OPS_SWITCH_PARTIAL): it schedules only SCHED_EXT tasks;
 * every other task on the host stays on the fair class, untouched. Userspace
 * (bpf/gate.py, cgroups/sched_policy.py) gives a denied cgroup's tasks
 * SCHED_EXT after writing its id into the deny map, and their own policy back
 * when it allows the cgroup: a running tool call is an ordinary fair task (its
 * cpu.max and cpu.weight apply), a held one is here, parked. What a held task
 * forks inherits SCHED_EXT. The FIFO below serves what is not parked: tasks
 * released by the hold cap or SIGKILL, and ones between an allow and their
 * policy's restore.
 *
 * The daemon (execgated) decides every 100 ms which tool-call cgroups may run.
 * It writes its verdicts into the hash map execgate_deny, keyed by cgroup id
 * (the inode number of the cgroup's directory on cgroup2 == cgroup->kn->id):
 * a cgroup is denied while its id is in the map, allowed when it is not. A task
 * is held when its own cgroup or any ancestor (below the root) is in the map,
 * so every process of a tool call, in whatever sub-cgroup it created, is held.
 * Anything not under a denied cgroup - the host, dockerd, the daemon - never
 * reaches this scheduler at all (not SCHED_EXT).
 *
 * Dispatch queues:
 *
 *   SHARED_DSQ  every runnable task that may run, FIFO; each CPU pulls from it
 *               in ops.dispatch() (as scx_simple does). Waking tasks that find
 *               an idle CPU go straight to that CPU's local DSQ.
 *   HELD_DSQ    the parked tasks of denied cgroups, ordered by park time (a
 *               priority queue keyed on vtime = when the task was parked).
 *
 * A task is checked when it is enqueued (wakeup, slice expiry, preemption):
 * denied -> HELD_DSQ. A task running when its cgroup gets denied finishes its
 * slice (at most SCX_SLICE_DFL = 20 ms) and is parked at its next enqueue;
 * SCX_OPS_ENQ_LAST makes the kernel call ops.enqueue() even when it is the
 * last runnable task on its CPU (otherwise it would just keep running).
 *
 * Release: ops.dispatch() walks HELD_DSQ (bpf_iter_scx_dsq + scx_bpf_dsq_move,
 * at most once per scan period across all CPUs) and moves to SHARED_DSQ every
 * task that
 *   - is no longer under a denied cgroup (allowed again, or moved elsewhere),
 *   - has SIGKILL pending or is exiting (so kill -9 of a held call works, and
 *     a dying task can free its memory), or
 *   - has been parked for the hold cap (default 20 s): the sched_ext watchdog
 *     ejects the whole scheduler when a runnable task waits longer than its
 *     timeout (at most 30 s), so no task is ever parked longer than the cap.
 *     A capped task runs one slice and is parked again at its next enqueue.
 * ops.dispatch() only runs on CPUs looking for work; when every CPU is idle
 * nothing would look at HELD_DSQ, so a BPF timer (every scan period) kicks an
 * idle CPU while tasks are parked, and that CPU's ops.dispatch() does the scan.
 *
 * Settings come from the array map execgate_cfg (hold cap, scan period; zero
 * means the default below), counters and the exit reason go to execgate_stat.
 * All maps are pinned by name so the loader (bpf/gate.py) can find them after
 * `bpftool struct_ops register`; it moves them under its own pin directory.
 */
#define BPF_NO_KFUNC_PROTOTYPES	/* the kfuncs this file uses are declared below */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char _license[] SEC("license") = "GPL";

/* sched_ext kfuncs (signatures as in the 6.13+ / 7.x kernels' BTF) */
extern s32 scx_bpf_create_dsq(u64 dsq_id, s32 node) __ksym;
extern s32 scx_bpf_select_cpu_dfl(struct task_struct *p, s32 prev_cpu, u64 wake_flags,
				  bool *is_idle) __ksym;
extern void scx_bpf_dsq_insert(struct task_struct *p, u64 dsq_id, u64 slice,
			       u64 enq_flags) __ksym;
extern void scx_bpf_dsq_insert_vtime(struct task_struct *p, u64 dsq_id, u64 slice, u64 vtime,
				     u64 enq_flags) __ksym;
extern bool scx_bpf_dsq_move_to_local(u64 dsq_id) __ksym;
extern bool scx_bpf_dsq_move(struct bpf_iter_scx_dsq *it__iter, struct task_struct *p,
			     u64 dsq_id, u64 enq_flags) __ksym;
extern s32 scx_bpf_dsq_nr_queued(u64 dsq_id) __ksym;
extern s32 scx_bpf_pick_idle_cpu(const struct cpumask *cpus_allowed, u64 flags) __ksym;
extern void scx_bpf_kick_cpu(s32 cpu, u64 flags) __ksym;
extern int bpf_iter_scx_dsq_new(struct bpf_iter_scx_dsq *it, u64 dsq_id, u64 flags) __ksym;
extern struct task_struct *bpf_iter_scx_dsq_next(struct bpf_iter_scx_dsq *it) __ksym;
extern void bpf_iter_scx_dsq_destroy(struct bpf_iter_scx_dsq *it) __ksym;

#define SHARED_DSQ	0
#define HELD_DSQ	1

#define NSEC_PER_MSEC	1000000ULL
#define NSEC_PER_SEC	1000000000ULL

/*
 * Defaults, used while execgate_cfg holds 0. The hold cap is clamped to
 * HOLD_CAP_MAX_NS whatever userspace writes: the watchdog timeout is 30 s (the
 * kernel's maximum, ops.timeout_ms = 0), and a released task needs a moment to
 * actually get a CPU.
 */
const volatile u64 hold_cap_dfl_ns = 20 * NSEC_PER_SEC;
const volatile u64 scan_dfl_ns = 10 * NSEC_PER_MSEC;
#define HOLD_CAP_MAX_NS	(25 * NSEC_PER_SEC)
#define SCAN_MIN_NS	(1 * NSEC_PER_MSEC)
#define SCAN_MAX_NS	(1000 * NSEC_PER_MSEC)

/* How far up the cgroup tree a task's ancestors are checked. */
#define MAX_CGROUP_DEPTH 16

/* task_struct->flags and signals (macros are not in vmlinux.h) */
#define PF_EXITING	0x00000004
#define PF_KTHREAD	0x00200000
#define SIGKILL		9

#define CLOCK_MONOTONIC	1

/* ---- maps shared with userspace (layouts mirrored in bpf/gate.py) ---- */

/* cgroup id -> GATE_DENY. Present = denied; absent = allowed. */
#define GATE_DENY 1
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u64);
	__type(value, u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} execgate_deny SEC(".maps");

struct gate_cfg {
	u64 hold_cap_ns;	/* 0: hold_cap_dfl_ns */
	u64 scan_ns;		/* 0: scan_dfl_ns */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct gate_cfg);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} execgate_cfg SEC(".maps");

struct gate_stat {
	u64 parked;		/* enqueues into HELD_DSQ (a re-park counts again) */
	u64 released;		/* moved back: cgroup allowed again */
	u64 capped;		/* moved back: parked for the hold cap */
	u64 killed;		/* moved back: SIGKILL pending or exiting */
	u64 scans;		/* walks of HELD_DSQ */
	u64 held;		/* tasks in HELD_DSQ after the last park or scan */
	u64 exited;		/* 1 once ops.exit() ran */
	s64 exit_kind;		/* enum scx_exit_kind */
	s64 exit_code;
	char exit_reason[128];
	char exit_msg[256];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct gate_stat);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} execgate_stat SEC(".maps");

/*
 * The scan timer. Pinned like the others: the kernel cancels a map's timers
 * when its last user reference goes away, and bpftool exits right after
 * registering the scheduler.
 */
struct gate_timer {
	struct bpf_timer timer;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct gate_timer);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} execgate_timer SEC(".maps");

/* ---- helpers ---- */

u64 last_scan_ns;	/* when a CPU last walked HELD_DSQ */
bool exiting;		/* set by ops.exit(): the timer stops re-arming */

static __always_inline struct gate_stat *stats(void)
{
	u32 zero = 0;

	return bpf_map_lookup_elem(&execgate_stat, &zero);
}

static __always_inline u64 hold_cap_ns(void)
{
	u32 zero = 0;
	struct gate_cfg *cfg = bpf_map_lookup_elem(&execgate_cfg, &zero);
	u64 cap = cfg ? cfg->hold_cap_ns : 0;

	if (!cap)
		cap = hold_cap_dfl_ns;
	return cap < HOLD_CAP_MAX_NS ? cap : HOLD_CAP_MAX_NS;
}

static __always_inline u64 scan_ns(void)
{
	u32 zero = 0;
	struct gate_cfg *cfg = bpf_map_lookup_elem(&execgate_cfg, &zero);
	u64 period = cfg ? cfg->scan_ns : 0;

	if (!period)
		period = scan_dfl_ns;
	if (period < SCAN_MIN_NS)
		period = SCAN_MIN_NS;
	return period < SCAN_MAX_NS ? period : SCAN_MAX_NS;
}

/*
 * Is @p under a denied cgroup? Walks from the task's cgroup2 cgroup up to (not
 * including) the root, looking each cgroup id up in execgate_deny. The reads go
 * through BPF_CORE_READ (probe reads), which is safe on any task pointer.
 */
static bool in_denied_cgroup(struct task_struct *p)
{
	struct cgroup *cgrp = BPF_CORE_READ(p, cgroups, dfl_cgrp);
	int i;

	for (i = 0; i < MAX_CGROUP_DEPTH && cgrp; i++) {
		u64 id;

		if (BPF_CORE_READ(cgrp, level) <= 0)
			break;	/* the root cgroup is never held */
		id = BPF_CORE_READ(cgrp, kn, id);
		if (bpf_map_lookup_elem(&execgate_deny, &id))
			return true;
		cgrp = BPF_CORE_READ(cgrp, self.parent, cgroup);
	}
	return false;
}

/* Tasks that are never held, whatever their cgroup. */
static bool never_hold(struct task_struct *p)
{
	u32 flags = BPF_CORE_READ(p, flags);
	unsigned long pending = BPF_CORE_READ(p, pending.signal.sig[0]);

	if (flags & (PF_KTHREAD | PF_EXITING))
		return true;
	/* kill -9 of a held call must work: a dying task runs (and frees memory) */
	return pending & (1UL << (SIGKILL - 1));
}

static bool should_hold(struct task_struct *p)
{
	return !never_hold(p) && in_denied_cgroup(p);
}

/* Why a parked task leaves HELD_DSQ. */
enum release_why {
	KEEP,		/* still denied: stays parked */
	KILLED,		/* SIGKILL pending or exiting */
	ALLOWED,	/* no longer under a denied cgroup */
	CAPPED,		/* parked for the hold cap */
};

static enum release_why release_why(struct task_struct *p, u64 now, u64 cap)
{
	if (never_hold(p))
		return KILLED;
	if (!in_denied_cgroup(p))
		return ALLOWED;
	/* dsq_vtime is the park time (see gate_enqueue) */
	if (now - BPF_CORE_READ(p, scx.dsq_vtime) >= cap)
		return CAPPED;
	return KEEP;
}

/*
 * Walks HELD_DSQ and moves every task that may run again to SHARED_DSQ. Called
 * from ops.dispatch() on any CPU; one CPU per scan period does the work.
 */
static void release_held(void)
{
	struct bpf_iter_scx_dsq it;
	struct task_struct *p;
	struct gate_stat *st;
	u64 now, last, cap;

	if (scx_bpf_dsq_nr_queued(HELD_DSQ) <= 0)
		return;

	now = bpf_ktime_get_ns();
	last = last_scan_ns;
	if (now - last < scan_ns())
		return;
	if (__sync_val_compare_and_swap(&last_scan_ns, last, now) != last)
		return;	/* another CPU is scanning */

	st = stats();
	cap = hold_cap_ns();

	bpf_iter_scx_dsq_new(&it, HELD_DSQ, 0);
	while ((p = bpf_iter_scx_dsq_next(&it))) {
		enum release_why why = release_why(p, now, cap);
		s32 cpu;

		if (why == KEEP)
			continue;
		if (!scx_bpf_dsq_move(&it, p, SHARED_DSQ, 0))
			continue;	/* dequeued meanwhile */
		if (st) {
			if (why == KILLED)
				__sync_fetch_and_add(&st->killed, 1);
			else if (why == ALLOWED)
				__sync_fetch_and_add(&st->released, 1);
			else
				__sync_fetch_and_add(&st->capped, 1);
		}
		/* This CPU pulls from SHARED_DSQ next; wake an idle one for the rest. */
		cpu = scx_bpf_pick_idle_cpu(p->cpus_ptr, 0);
		if (cpu >= 0)
			scx_bpf_kick_cpu(cpu, SCX_KICK_IDLE);
	}
	bpf_iter_scx_dsq_destroy(&it);

	if (st) {
		__sync_fetch_and_add(&st->scans, 1);
		st->held = scx_bpf_dsq_nr_queued(HELD_DSQ);
	}
}

/* ---- sched_ext ops ---- */

#define GATE_OP(name, args...) SEC("struct_ops/" #name) BPF_PROG(name, ##args)
#define GATE_OP_SLEEPABLE(name, args...) SEC("struct_ops.s/" #name) BPF_PROG(name, ##args)

s32 GATE_OP(gate_select_cpu, struct task_struct *p, s32 prev_cpu, u64 wake_flags)
{
	bool is_idle = false;
	s32 cpu;

	/* A task to hold must reach ops.enqueue(): no direct dispatch. */
	if (should_hold(p))
		return prev_cpu;

	cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &is_idle);
	if (is_idle)
		scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, SCX_SLICE_DFL, 0);
	return cpu;
}

void GATE_OP(gate_enqueue, struct task_struct *p, u64 enq_flags)
{
	if (should_hold(p)) {
		struct gate_stat *st = stats();

		/* vtime = park time: the held DSQ is ordered oldest first */
		scx_bpf_dsq_insert_vtime(p, HELD_DSQ, SCX_SLICE_DFL, bpf_ktime_get_ns(),
					 enq_flags);
		if (st) {
			__sync_fetch_and_add(&st->parked, 1);
			st->held = scx_bpf_dsq_nr_queued(HELD_DSQ);
		}
		return;
	}
	scx_bpf_dsq_insert(p, SHARED_DSQ, SCX_SLICE_DFL, enq_flags);
}

void GATE_OP(gate_dispatch, s32 cpu, struct task_struct *prev)
{
	release_held();
	scx_bpf_dsq_move_to_local(SHARED_DSQ);
}

/* Every scan period: if tasks are parked, make sure some CPU looks at them. */
static int gate_timer_fn(void *map, int *key, struct bpf_timer *timer)
{
	if (exiting)
		return 0;
	if (scx_bpf_dsq_nr_queued(HELD_DSQ) > 0)
		scx_bpf_kick_cpu(bpf_get_smp_processor_id(), SCX_KICK_IDLE);
	bpf_timer_start(timer, scan_ns(), 0);
	return 0;
}

s32 GATE_OP_SLEEPABLE(gate_init)
{
	u32 zero = 0;
	struct gate_timer *t;
	s32 ret;

	ret = scx_bpf_create_dsq(SHARED_DSQ, -1);
	if (ret)
		return ret;
	ret = scx_bpf_create_dsq(HELD_DSQ, -1);
	if (ret)
		return ret;

	t = bpf_map_lookup_elem(&execgate_timer, &zero);
	if (!t)
		return -2;	/* -ENOENT */
	bpf_timer_init(&t->timer, &execgate_timer, CLOCK_MONOTONIC);
	bpf_timer_set_callback(&t->timer, gate_timer_fn);
	return bpf_timer_start(&t->timer, scan_dfl_ns, 0);
}

void GATE_OP(gate_exit, struct scx_exit_info *ei)
{
	struct gate_stat *st = stats();
	u32 zero = 0;
	struct gate_timer *t;

	exiting = true;
	if (st) {
		st->exit_kind = BPF_CORE_READ(ei, kind);
		st->exit_code = BPF_CORE_READ(ei, exit_code);
		bpf_probe_read_kernel_str(st->exit_reason, sizeof(st->exit_reason),
					  BPF_CORE_READ(ei, reason));
		bpf_probe_read_kernel_str(st->exit_msg, sizeof(st->exit_msg),
					  BPF_CORE_READ(ei, msg));
		st->exited = 1;
	}
	t = bpf_map_lookup_elem(&execgate_timer, &zero);
	if (t)
		bpf_timer_cancel(&t->timer);
}

/*
 * A task leaves sched_ext: the daemon gave it its own policy back (the call was
 * allowed again: the partial switch releases a held call that way, the kernel
 * taking it off HELD_DSQ) or it exited. Keep `held` true, and count what left
 * HELD_DSQ that way as released, as a scan's move would have been.
 */
void GATE_OP(gate_disable, struct task_struct *p)
{
	struct gate_stat *st = stats();
	s32 now;

	if (!st)
		return;
	now = scx_bpf_dsq_nr_queued(HELD_DSQ);
	if (now < 0)
		return;
	if ((u64)now < st->held)
		__sync_fetch_and_add(&st->released, st->held - now);
	st->held = now;
}

SEC(".struct_ops.link")
struct sched_ext_ops gate_ops = {
	.select_cpu	= (void *)gate_select_cpu,
	.enqueue	= (void *)gate_enqueue,
	.dispatch	= (void *)gate_dispatch,
	.init		= (void *)gate_init,
	.exit		= (void *)gate_exit,
	.disable	= (void *)gate_disable,
	/* only SCHED_EXT tasks (held calls'); ops.enqueue() also for the last
	 * runnable task on a CPU, or it never parks */
	.flags		= SCX_OPS_SWITCH_PARTIAL | SCX_OPS_ENQ_LAST,
	/* timeout_ms = 0: the kernel's maximum watchdog timeout (30 s) */
	.name		= "execgate",
};
