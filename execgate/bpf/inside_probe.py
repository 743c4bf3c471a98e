"""Loader and client of inside.bpf.c: an inside agent's commands, followed in the kernel.

The daemon (daemon/inside.py) writes the agents it finds into ``inside_agents`` and reads
events from the ring buffer; the kernel keeps everything about commands that end within their
first slice, which is most of them. Only rule ``child`` is followed here (the command is exec'd
by the agent itself); other rules use the proc connector.

Lifetime: ``bpftool prog loadall`` loads the object and pins its programs and maps; ``load()``
opens them, attaches both programs (one link fd each) and removes every pin at once. The daemon's
fds are then the only references: when it exits — ``kill -9`` included — the links, the maps and
the timers go with it and nothing is left attached. Stdlib + ctypes; bpftool and clang to build
and load (as for the growth gate).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from execgate.bpf import loader
from execgate.bpf.syscall import BpfMap, RingBuffer, obj_get, raw_tracepoint_open

SRC = Path(__file__).resolve().with_name("inside.bpf.c")
PROGRAMS = ("inside_exec", "inside_exit")
MAPS = ("inside_agents", "inside_calls", "inside_events", "inside_cfg", "inside_stat",
        "inside_eager")

# Mirrors of inside.bpf.c.
AGENT, WRAPPER = 1, 2
EV_CALL, EV_EXIT, EV_AGENT, EV_AGENT_EXEC, EV_AGENT_EXIT = 1, 2, 3, 4, 5
STATS = ("short", "reported", "exits", "lost", "full", "execs", "at_exec")
AT_EXEC = 1  # EV_CALL status: reported at its exec (an eager program), without a slice
EVENT = struct.Struct("=IIIIQi4x16s")
_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")
_AGENT = struct.Struct("=II")
_CALL_TAIL = struct.Struct("=QIIII")  # struct call after its 16-byte struct bpf_timer
_TIMER_SIZE = 16


class Event(NamedTuple):
    kind: int
    tgid: int
    parent: int
    box: int
    ns: int  # CLOCK_MONOTONIC: the exec (EV_CALL), else when it happened
    status: int  # EV_EXIT / EV_AGENT_EXIT: the wait status
    comm: str = ""  # EV_CALL: the program it exec'd; EV_EXIT: the one it ran last


def comm_key(comm: str) -> bytes:
    """A task's comm as the kernel keeps it: at most 15 bytes, NUL-padded to 16."""
    return os.fsencode(comm)[:15].ljust(16, b"\0")


def parse(raw: bytes) -> Event | None:
    if len(raw) < EVENT.size:
        return None
    kind, tgid, parent, box, ns, status, comm = EVENT.unpack_from(raw, 0)
    return Event(kind, tgid, parent, box, ns, status,
                 comm.split(b"\0", 1)[0].decode("utf-8", "replace"))


@dataclass
class InsideProbe:
    """The attached programs and their maps (see the module doc)."""

    maps: dict[str, BpfMap]
    links: list[int]
    ring: RingBuffer

    def fileno(self) -> int:
        """Readable (poll/epoll) when events are waiting."""
        return self.ring.fd

    def read(self) -> list[Event]:
        return [ev for raw in self.ring.read() if (ev := parse(raw)) is not None]

    def add_agent(self, tgid: int, box: int, *, wrapper: bool = False) -> None:
        self.maps["inside_agents"].update(_U32.pack(tgid),
                                          _AGENT.pack(box, WRAPPER if wrapper else AGENT))

    def remove_agent(self, tgid: int) -> bool:
        return self.maps["inside_agents"].delete(_U32.pack(tgid))

    def adopt_call(self, tgid: int, parent: int, box: int) -> None:
        """A call placed without the kernel's report (found late by a scan): its exit is told
        like a reported call's."""
        m = self.maps["inside_calls"]
        value = bytes(_TIMER_SIZE) + _CALL_TAIL.pack(0, parent, box, 1, 0)
        m.update(_U32.pack(tgid), value.ljust(m.info.value_size, b"\0"))

    def add_eager(self, comm: str) -> None:
        """Processes exec'ing this program (its first 15 bytes, as the kernel names tasks)
        are reported at once, without a slice."""
        self.maps["inside_eager"].update(comm_key(comm), _U32.pack(1))

    def set_slice(self, ns: int) -> None:
        self.maps["inside_cfg"].update(_U32.pack(0), _U64.pack(max(1, int(ns))))

    def stats(self) -> dict[str, int]:
        m = self.maps["inside_stat"]
        out = {}
        for i, name in enumerate(STATS):
            raw = m.lookup(_U32.pack(i))
            out[name] = _U64.unpack_from(raw, 0)[0] if raw else 0
        return out

    def close(self) -> None:
        for fd in self.links:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.links.clear()
        self.ring.close()
        for m in self.maps.values():
            m.close()


def build(out_dir: str | os.PathLike[str] = loader.DEFAULT_BUILD_DIR, *, force: bool = False,
          timeout: float = 600.0) -> Path:
    """``inside.bpf.o`` for the running kernel (cached like the gate's; see loader.build)."""
    return loader.build(out_dir, src=SRC, force=force, timeout=timeout)


def load(obj: str | os.PathLike[str], *, slice_ns: int, bpftool: str = "bpftool",
         timeout: float = 120.0) -> InsideProbe:
    """Loads, attaches and returns the probe; raises BpfUnavailable/BpfError/OSError."""
    loader.ensure_bpffs()
    pins = tempfile.mkdtemp(prefix="execgate-inside-", dir=loader.BPFFS)
    maps: dict[str, BpfMap] = {}
    links: list[int] = []
    try:
        loader.run([bpftool, "prog", "loadall", os.fspath(obj), os.path.join(pins, "progs"),
                   "pinmaps", os.path.join(pins, "maps")], timeout=timeout)
        for name in MAPS:
            maps[name] = BpfMap.open(os.path.join(pins, "maps", name))
        for name in PROGRAMS:
            prog = obj_get(os.path.join(pins, "progs", name))
            try:
                links.append(raw_tracepoint_open(prog))
            finally:
                os.close(prog)
        ring = RingBuffer(maps["inside_events"].fd, maps["inside_events"].info.max_entries)
    except BaseException:
        for fd in links:
            os.close(fd)
        for m in maps.values():
            m.close()
        raise
    finally:
        shutil.rmtree(pins, ignore_errors=True)  # bpffs: unlinking a pin drops its reference
    probe = InsideProbe(maps, links, ring)
    probe.set_slice(slice_ns)
    return probe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m execgate.bpf.inside_probe",
                                 description="build or try the inside-agent probe")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build inside.bpf.o for this kernel; prints its path")
    b.add_argument("out_dir", nargs="?", default=loader.DEFAULT_BUILD_DIR)
    b.add_argument("--force", action="store_true")
    w = sub.add_parser("watch", help="follow one agent's commands, one JSON line per event")
    w.add_argument("pid", type=int)
    w.add_argument("--slice-ms", type=float, default=5.0)
    w.add_argument("--obj", help="a built object (default: build it)")
    w.add_argument("--at-exec", action="append", default=[], metavar="COMM",
                   help="a program reported at its exec, without a slice (repeatable)")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        print(build(args.out_dir, force=args.force))
        return 0
    import select

    probe = load(args.obj or build(), slice_ns=int(args.slice_ms * 1e6))
    probe.add_agent(args.pid, 0)
    for name in args.at_exec:
        probe.add_eager(name)
    poller = select.poll()
    poller.register(probe.fileno(), select.POLLIN)
    try:
        while True:
            poller.poll(1000)
            for ev in probe.read():
                print(json.dumps(ev._asdict()), flush=True)
    except KeyboardInterrupt:
        print(json.dumps(probe.stats()), file=sys.stderr)
        return 0
    finally:
        probe.close()


if __name__ == "__main__":
    sys.exit(main())
