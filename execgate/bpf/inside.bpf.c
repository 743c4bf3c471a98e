/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Follows the commands an inside agent runs, in the kernel, so that the daemon
 * hears of a command only when it becomes a tool call.
 *
 * An agent that runs in its sandbox spawns hundreds of short commands (ls, cat,
 * git status) for every one that may burst. The daemon places a command in its
 * own cgroup only once it has outlived its first slice (place_after_ms); with
 * the proc connector it still had to read three events per command (fork, exec,
 * exit) to learn that most of them never got that far. Here the kernel keeps
 * that bookkeeping and wakes the daemon only for commands that outlive their
 * slice, and for the few events about the agents themselves:
 *
 *   exec, parent is an agent    the command's first slice starts: an entry in
 *                               `calls` with a BPF timer armed for the slice
 *   exit within the slice       entry deleted (timer cancelled), `short` += 1
 *   timer fires, still alive    EV_CALL to the ring buffer; the entry stays,
 *                               marked reported, so its exit is told too
 *   exit of a reported call     EV_EXIT with the wait status and the program it
 *                               ran last (the daemon learns which ones burst)
 *   exec of a program listed    EV_CALL at once, no slice: programs known to grow
 *   in inside_eager             fast (python, pytest, node, ...; set and learned by
 *                               the daemon); also when a call in its slice execs
 *                               one (sh -c 'pytest' execs pytest)
 *   exec, parent is a wrapper   (tini, docker-init) the child is the agent:
 *                               added to `agents`, EV_AGENT
 *   exec / exit of an agent     EV_AGENT_EXEC / EV_AGENT_EXIT (agent deleted)
 *
 * `agents` (tgid -> box number, kind) is written by the daemon (daemon/inside.py,
 * through bpf/inside_probe.py) as it finds the agents of opted-in containers. Every
 * other process costs one hash lookup per exec and exit; with no container
 * opted in the daemon does not load this at all. `calls` is bounded: when it is
 * full a command is reported at once (EV_CALL without a slice), never lost; when
 * the ring buffer is full the timer retries one slice later.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char _license[] SEC("license") = "GPL";

#define CLOCK_MONOTONIC 1

enum { INSIDE_AGENT = 1, INSIDE_WRAPPER = 2 };                   /* struct agent.kind */
enum { EV_CALL = 1, EV_EXIT, EV_AGENT, EV_AGENT_EXEC, EV_AGENT_EXIT };
enum { ST_SHORT, ST_REPORTED, ST_EXITS, ST_LOST, ST_FULL, ST_EXECS, ST_AT_EXEC,
       NR_INSIDE_STATS };
#define AT_EXEC 1		/* EV_CALL status: reported at its exec, without a slice */
enum { CFG_SLICE_NS, NR_INSIDE_CFG };

#define DEFAULT_SLICE_NS (5ULL * 1000 * 1000)

struct agent {
	u32 box;	/* the daemon's number for the container */
	u32 kind;	/* INSIDE_AGENT or INSIDE_WRAPPER */
};

struct call {
	struct bpf_timer timer;
	u64 exec_ns;
	u32 parent;
	u32 box;
	u32 reported;		/* 0, REPORTED or EXITED: claimed atomically (timer vs exit) */
	u32 pad;
	char comm[16];		/* the program it exec'd, for a call gone before it is read */
};

/*
 * call.reported. The slice's timer and the call's exit run on different CPUs: each claims
 * the entry with one atomic operation, so a call whose EV_CALL is sent always gets its
 * EV_EXIT (a plain read let an exit see 0 while the timer was sending EV_CALL: the daemon
 * placed a call whose end it never heard of). The two events may then reach the ring in
 * either order; the daemon keeps an early EV_EXIT for the EV_CALL behind it.
 */
#define REPORTED 1
#define EXITED 2

struct event {			/* bpf/inside_probe.py: EVENT = struct.Struct("=IIIIQi4x16s") */
	u32 kind;
	u32 tgid;
	u32 parent;
	u32 box;
	u64 ns;			/* exec time (EV_CALL), else now; CLOCK_MONOTONIC */
	s32 status;		/* EV_EXIT: the wait status */
	u32 pad;
	char comm[16];		/* EV_CALL: the program it exec'd; EV_EXIT: ran last */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct agent);
} inside_agents SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, struct call);
} inside_calls SEC(".maps");

/* Programs that are placed at their exec, without a slice (key: comm, NUL-padded). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, char[16]);
	__type(value, u32);
} inside_eager SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} inside_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NR_INSIDE_CFG);
	__type(key, u32);
	__type(value, u64);
} inside_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NR_INSIDE_STATS);
	__type(key, u32);
	__type(value, u64);
} inside_stat SEC(".maps");

static __always_inline void count(u32 which)
{
	u64 *v = bpf_map_lookup_elem(&inside_stat, &which);

	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline u64 slice_ns(void)
{
	u32 key = CFG_SLICE_NS;
	u64 *v = bpf_map_lookup_elem(&inside_cfg, &key);

	return v && *v ? *v : DEFAULT_SLICE_NS;
}

static __always_inline bool emit(u32 kind, u32 tgid, u32 parent, u32 box, u64 ns, s32 status,
				 const char *comm)
{
	struct event *e = bpf_ringbuf_reserve(&inside_events, sizeof(*e), 0);

	if (!e) {
		count(ST_LOST);
		return false;
	}
	e->kind = kind;
	e->tgid = tgid;
	e->parent = parent;
	e->box = box;
	e->ns = ns;
	e->status = status;
	e->pad = 0;
	if (comm)
		__builtin_memcpy(e->comm, comm, sizeof(e->comm));
	else
		__builtin_memset(e->comm, 0, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
	return true;
}

/* The first slice is over and the command still runs: tell the daemon. */
static int slice_over(void *map, u32 *key, struct call *c)
{
	if (__sync_val_compare_and_swap(&c->reported, 0, REPORTED) != 0)
		return 0;	/* reported already, or it exited */
	if (!emit(EV_CALL, *key, c->parent, c->box, c->exec_ns, 0, c->comm)) {
		/* ring full: retry a slice later, unless it exited meanwhile */
		if (__sync_val_compare_and_swap(&c->reported, REPORTED, 0) == REPORTED)
			bpf_timer_start(&c->timer, slice_ns(), 0);
		return 0;
	}
	count(ST_REPORTED);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(inside_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	u32 tgid = BPF_CORE_READ(p, tgid);
	u32 parent = BPF_CORE_READ(p, real_parent, tgid);
	u64 now = bpf_ktime_get_ns();
	struct agent *a;
	struct call *c;

	a = bpf_map_lookup_elem(&inside_agents, &tgid);
	if (a) {		/* an agent exec'd: maybe init became a wrapper */
		emit(EV_AGENT_EXEC, tgid, parent, a->box, now, 0, NULL);
		return 0;
	}
	a = bpf_map_lookup_elem(&inside_agents, &parent);
	if (!a)
		return 0;
	if (a->kind == INSIDE_WRAPPER) {	/* the wrapper's child is the agent */
		struct agent child = { .box = a->box, .kind = INSIDE_AGENT };

		bpf_map_update_elem(&inside_agents, &tgid, &child, BPF_ANY);
		emit(EV_AGENT, tgid, parent, a->box, now, 0, NULL);
		return 0;
	}
	struct call init = { .exec_ns = now, .parent = parent, .box = a->box };
	bool eager;

	bpf_get_current_comm(init.comm, sizeof(init.comm));
	eager = bpf_map_lookup_elem(&inside_eager, init.comm) != NULL;
	c = bpf_map_lookup_elem(&inside_calls, &tgid);
	if (c) {	/* a call exec'd again (sh -c 'pytest' execs pytest): same call */
		/* ... now running a program to place at once (its timer finds it reported) */
		if (eager && __sync_val_compare_and_swap(&c->reported, 0, REPORTED) == 0) {
			__builtin_memcpy(c->comm, init.comm, sizeof(c->comm));
			if (emit(EV_CALL, tgid, parent, c->box, c->exec_ns, AT_EXEC, c->comm)) {
				count(ST_REPORTED);
				count(ST_AT_EXEC);
			} else {
				__sync_val_compare_and_swap(&c->reported, REPORTED, 0);
			}
		}
		return 0;
	}
	count(ST_EXECS);
	if (eager)
		init.reported = REPORTED;
	if (bpf_map_update_elem(&inside_calls, &tgid, &init, BPF_NOEXIST)) {
		count(ST_FULL);	/* no room to wait out its slice: report it now */
		emit(EV_CALL, tgid, parent, a->box, now, 0, init.comm);
		return 0;
	}
	if (eager) {		/* known to grow fast: no slice */
		if (emit(EV_CALL, tgid, parent, a->box, now, AT_EXEC, init.comm)) {
			count(ST_REPORTED);
			count(ST_AT_EXEC);
			return 0;
		}
		c = bpf_map_lookup_elem(&inside_calls, &tgid);
		if (c)
			c->reported = 0;	/* ring full: the slice's timer reports it */
	}
	c = bpf_map_lookup_elem(&inside_calls, &tgid);
	if (!c)
		return 0;
	if (bpf_timer_init(&c->timer, &inside_calls, CLOCK_MONOTONIC) ||
	    bpf_timer_set_callback(&c->timer, slice_over) ||
	    bpf_timer_start(&c->timer, slice_ns(), 0)) {
		c->reported = REPORTED;	/* no timer: report it now */
		count(ST_FULL);
		emit(EV_CALL, tgid, parent, a->box, now, 0, c->comm);
	}
	return 0;
}

/*
 * The wait status. This tracepoint may fire before do_exit() stores it in
 * task->exit_code; an exit_group() or a fatal signal has already put it in
 * signal->group_exit_code (code << 8, or the signal number).
 */
static __always_inline s32 exit_status(struct task_struct *p)
{
	s32 code = BPF_CORE_READ(p, exit_code);

	return code ? code : BPF_CORE_READ(p, signal, group_exit_code);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(inside_exit, struct task_struct *p)
{
	u32 tgid = BPF_CORE_READ(p, tgid);
	struct agent *a;
	struct call *c;

	if (BPF_CORE_READ(p, pid) != tgid)
		return 0;	/* a thread, not the process */
	c = bpf_map_lookup_elem(&inside_calls, &tgid);
	if (c) {
		if (__sync_lock_test_and_set(&c->reported, EXITED) == REPORTED) {
			char comm[16];	/* what it runs at the end (it may have exec'd again) */

			bpf_get_current_comm(comm, sizeof(comm));
			count(ST_EXITS);
			emit(EV_EXIT, tgid, c->parent, c->box, bpf_ktime_get_ns(),
			     exit_status(p), comm);
		} else {
			count(ST_SHORT);
		}
		bpf_map_delete_elem(&inside_calls, &tgid);
		return 0;
	}
	a = bpf_map_lookup_elem(&inside_agents, &tgid);
	if (a) {
		emit(EV_AGENT_EXIT, tgid, 0, a->box, bpf_ktime_get_ns(), exit_status(p), NULL);
		bpf_map_delete_elem(&inside_agents, &tgid);
	}
	return 0;
}
