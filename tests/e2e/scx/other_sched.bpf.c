/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Another sched_ext scheduler, for tests/e2e/test_bpf_gate.py (coexistence): loaded
 * before execgate, it must be left loaded (execgate then uses cgroup.freeze). A partial switch
 * with one global FIFO: only SCHED_EXT tasks run here, and the test makes none.
 */
#define BPF_NO_KFUNC_PROTOTYPES
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char _license[] SEC("license") = "GPL";

extern void scx_bpf_dsq_insert(struct task_struct *p, u64 dsq_id, u64 slice,
			       u64 enq_flags) __ksym;

SEC("struct_ops/other_enqueue")
void BPF_PROG(other_enqueue, struct task_struct *p, u64 enq_flags)
{
	scx_bpf_dsq_insert(p, SCX_DSQ_GLOBAL, SCX_SLICE_DFL, enq_flags);
}

SEC(".struct_ops.link")
struct sched_ext_ops other_ops = {
	.enqueue	= (void *)other_enqueue,
	.flags		= SCX_OPS_SWITCH_PARTIAL,
	.name		= "eg_other",
};
