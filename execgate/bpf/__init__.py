"""Kernel side of the growth gate: the sched_ext scheduler (gate.bpf.c) and its loader and
map client (gate.py), with the cgroup.freeze fallback."""
