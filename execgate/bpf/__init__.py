"""The daemon's kernel side: the growth gate's sched_ext scheduler (gate.bpf.c; gate.py, scx.py,
gate_cli.py), the inside-agent probe (inside.bpf.c; inside_probe.py), the bcc observation probes
(probes.bcc.c; probes.py), with loader.py building and loading both BPF C programs and syscall.py
talking bpf(2). Choosing an actuator (and the cgroup.freeze fallback) is the daemon's
(daemon/actuator.py); nothing here imports the daemon. See README.md."""
