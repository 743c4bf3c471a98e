"""A policy simulator on execgate's real decision code (issue 16 part 2): the replay's
workloads and schemes in simulated time, with a memory model and a control-plane cost model
fitted to the VM. `python3 -m bench.sim validate|sweep|fit` (see bench/sim/__main__.py)."""
