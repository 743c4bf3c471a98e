"""Agents that run inside their sandbox: every tool process they spawn is a gated tool call.

Many agents never `docker exec`: they run in the container and spawn `bash -c "pytest ..."`
themselves. For a container that opts in (OCI annotation `execgate.agent=inside`, or
`[inside] default = true`) the daemon follows the agent's commands — in the kernel
(bpf/inside.bpf.c, which tells only of commands that outlive their first slice) or through the
kernel's process events (proc_events.py, the flow below) — and turns each tool process into a
call exactly like a `docker exec` one — its own `tool-<hex>` cgroup, hint,
admission, growth gate, journal line and `[execgate]` feedback — with the image and the agent
unmodified:

    agent forks C ──fork event──▶ C is pending (a child of the agent that has not exec'd yet)
    C execs      ──exec event──▶ C is a call in its first slice (place_after_ms)
    C exits      ──exit event──▶ ... within the slice: nothing else happens (most commands)
    slice over   ──────────────▶ C (and what it forked meanwhile) moves into a prepared
                                 tool-<hex> (one write to cgroup.procs each); its hint
                                 (/proc/C/environ) and a handle on its stderr are taken;
                                 the engine admits it (C is frozen only while it waits)
    tool-<hex> empties ─────────▶ outcome, feedback on the kept stderr, journal, rmdir, done

Events are read in batches half a slice apart: following an agent that runs hundreds of short
commands a second then costs the daemon a few wake-ups per slice, not several per command. In
the kernel it costs nothing: the timer, the exit within the slice and the counting happen there,
and programs known (or learned) to grow fast are reported at their exec, without a slice.

Only the agent's own exec'd children match (rule "child"; "first-exec" also follows children
that only forked, e.g. subshells); descendants follow by cgroup inheritance. The agent itself is
never moved or stopped, and anything that goes wrong leaves the process running where it was.
The agent is the container's init, or the processes named by `execgate.agent.command=<comm>`
(e.g. a shell server started later), or the child of an init wrapper (tini, docker-init).
Containers without the opt-in cost nothing but the event filter (a hash lookup per exec and
exit in the kernel, a dict lookup per fork through the connector); with no opted-in container at
all, nothing is loaded and nothing listens.

The parts, one job each: tracker.py (which exec is a call), proc_events.py and sources.py
(where events come from), procfs.py (what is read of a process), discovery.py (containers and
their agents), placement.py, admission.py, end_watcher.py and ending.py (a call's life),
recovery.py (after a restart), state.py (what they share) and agents.py (InsideAgents).
"""
