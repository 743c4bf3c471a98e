"""Where execgated's main thread spends its CPU: stack samples weighted by the CPU the thread
used since the last one. cProfile cannot say it under Python 3.12+: it follows every thread, with
wall clocks, and under TCG the wall clock is mostly other processes' time.

Run execgated under it (a systemd drop-in's ExecStart):
    python3 -m bench.daemon_profile OUT.json [INTERVAL_MS] [-- DAEMON ARGS...]
OUT.json is rewritten every WRITE_S: CPU seconds by function (self: the frame running; cum: any
frame on the stack) and by the loop's stage or request handler it ran under. A sample takes
the GIL: at 5 ms under TCG the sampler cost as much CPU as the daemon; the default is 20 ms.
CPU used between two samples goes to the second one's stack: work that ends in a wait shows as
the wait (selectors.select), so read the stage and cum columns, not select's self time.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from collections import Counter
from types import FrameType

WRITE_S = 10.0
TOP = 80
# Frames that name what the main thread was doing: the loop's stages and the request ops.
ROOTS = ("tick", "submit", "submit_sandbox", "done", "handle", "_handle", "_serve")


def _where(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename
    short = path.split("/execgate/", 1)[-1] if "/execgate/" in path else os.path.basename(path)
    return f"{short}:{code.co_firstlineno} {code.co_name}"


class Sampler:
    def __init__(self, out: str, interval_s: float) -> None:
        self.out, self.interval_s = out, interval_s
        self.main = threading.main_thread().ident
        assert self.main is not None
        self.clock = time.pthread_getcpuclockid(self.main)
        self.self_s: Counter[str] = Counter()
        self.cum_s: Counter[str] = Counter()
        self.stage_s: Counter[str] = Counter()  # the outermost stage/handler frame on the stack
        self.total_s = 0.0
        self.samples = 0
        self.own_s = 0.0  # the sampler's own CPU (its thread's)

    def run(self) -> None:
        last = time.clock_gettime(self.clock)
        written = time.monotonic()
        while True:
            time.sleep(self.interval_s)
            now = time.clock_gettime(self.clock)
            spent, last = now - last, now
            frame = sys._current_frames().get(self.main)
            if spent > 0 and frame is not None:
                self._add(frame, spent)
            self.own_s = time.thread_time()
            if time.monotonic() - written > WRITE_S:
                self.write()
                written = time.monotonic()

    def _add(self, frame: FrameType | None, spent: float) -> None:
        self.total_s += spent
        self.samples += 1
        seen: set[str] = set()
        top = True
        stage = "(other)"
        while frame is not None:
            where = _where(frame)
            if top:
                self.self_s[where] += spent
                top = False
            if where not in seen:
                self.cum_s[where] += spent
                seen.add(where)
            if frame.f_code.co_name in ROOTS or frame.f_code.co_name.startswith("_step") or \
                    frame.f_code.co_name.startswith("_sample"):
                stage = where  # the outermost one wins: frames are walked inner to outer
            frame = frame.f_back
        self.stage_s[stage] += spent

    def write(self) -> None:
        def top(c: Counter[str]) -> list[tuple[str, float]]:
            return [(k, round(v, 3)) for k, v in c.most_common(TOP)]
        doc = {"main_cpu_s": round(self.total_s, 3), "samples": self.samples,
               "sampler_cpu_s": round(self.own_s, 3),
               "self_s": top(self.self_s), "cum_s": top(self.cum_s),
               "stage_s": top(self.stage_s)}
        tmp = f"{self.out}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, self.out)


def main() -> None:
    args = sys.argv[1:]
    out = args.pop(0)
    interval_ms = float(args.pop(0)) if args and args[0] != "--" else 20.0
    if args and args[0] == "--":
        args.pop(0)
    sampler = Sampler(out, interval_ms / 1000)
    threading.Thread(target=sampler.run, name="profile-sampler", daemon=True).start()
    sys.argv = ["execgated", *args]
    try:
        runpy.run_module("execgate.daemon.main", run_name="__main__", alter_sys=True)
    finally:
        sampler.write()


if __name__ == "__main__":
    main()
