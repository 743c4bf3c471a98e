"""``python3 -m execgate.bpf.gate {build,status,load,unload,recover,set,hold}``: build the gate,
inspect a running one, and drive it by hand (the e2e tests and install.sh use it)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import asdict

from execgate.bpf import gate
from execgate.bpf.gate import DEFAULT_BUILD_DIR, DEFAULT_HOLD_CAP_S, DEFAULT_PIN_DIR, LINK_PIN


def _status(pin_dir: str) -> dict[str, object]:
    out: dict[str, object] = {"state": gate.state(), "scheduler": gate.scheduler_name(),
                              "pin_dir": pin_dir,
                              "link_pinned": os.path.exists(os.path.join(pin_dir, LINK_PIN))}
    try:
        g = gate.Gate.open(pin_dir)
    except (gate.GateError, OSError) as e:
        out["gate"] = f"not pinned ({e})"
        return out
    try:
        out["denied"] = g.denied()
        out["stats"] = asdict(g.stats())
        out["attached"] = g.attached()
    finally:
        g.detach()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="execgate-bpf-gate",
                                 description=(gate.__doc__ or "").split("\n")[0])
    ap.add_argument("--pin-dir", default=DEFAULT_PIN_DIR)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build gate.bpf.o for this kernel, print its path")
    b.add_argument("out_dir", nargs="?", default=DEFAULT_BUILD_DIR)
    b.add_argument("--force", action="store_true")
    sub.add_parser("status", help="sched_ext state, pins, deny entries, counters (JSON)")
    ld = sub.add_parser("load", help="load persistently (link pinned) and exit")
    ld.add_argument("obj")
    ld.add_argument("--hold-cap", type=float, default=DEFAULT_HOLD_CAP_S)
    sub.add_parser("unload", help="unload a persistent gate (same as recover)")
    rc = sub.add_parser("recover", help="clear deny entries, unload, thaw tool-* cgroups")
    rc.add_argument("--keep", action="store_true", help="only clear the map, keep it loaded")
    st = sub.add_parser("set", help="allow/deny a cgroup on a persistent gate")
    st.add_argument("cgroup")
    st.add_argument("verdict", choices=["allow", "deny"])
    h = sub.add_parser("hold", help="load (owned), deny cgroups, print 'ready', wait for a "
                                    "signal, unload")
    h.add_argument("obj")
    h.add_argument("--deny", action="append", default=[], metavar="CGROUP")
    h.add_argument("--persist", action="store_true")
    h.add_argument("--hold-cap", type=float, default=DEFAULT_HOLD_CAP_S)
    args = ap.parse_args(argv)

    if args.cmd == "build":
        print(gate.build(args.out_dir, force=args.force))
    elif args.cmd == "status":
        print(json.dumps(_status(args.pin_dir), indent=2))
    elif args.cmd == "load":
        g = gate.load(args.obj, args.pin_dir, persist=True, hold_cap_s=args.hold_cap)
        print(f"loaded: {g!r}")
    elif args.cmd in ("unload", "recover"):
        print(gate.recover(args.pin_dir, unload=not getattr(args, "keep", False)))
    elif args.cmd == "set":
        g = gate.Gate.open(args.pin_dir)
        g.set(args.cgroup, allow=args.verdict == "allow")
        g.detach()
        print(f"{args.verdict} {args.cgroup}")
    elif args.cmd == "hold":
        g = gate.load(args.obj, args.pin_dir, persist=args.persist, hold_cap_s=args.hold_cap)
        for cg in args.deny:
            g.deny(cg)
        stop = False

        def _stop(*_: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        print("ready", flush=True)
        while not stop:
            time.sleep(0.2)
        g.unload()
    return 0


if __name__ == "__main__":
    sys.exit(main())
