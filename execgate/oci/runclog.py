"""execgate's own diagnostics, written where the engine already looks for runc's.

containerd/Docker read runc's `--log` file (json with `--log-format json`) and show its error
lines to the user; writing ours there in the same format makes them visible the same way.
Nothing is ever written to stdout/stderr: those belong to the container's process.
"""

from __future__ import annotations

import os
import time


class RuncLog:
    def __init__(self, path: str | None, fmt: str | None, debug_path: str = "",
                 debug: bool = False) -> None:
        self.path = path
        self.json = (fmt or "text") == "json"
        self.debug_path = debug_path
        self.debug_enabled = debug  # runc's --debug: debug lines go to --log too

    def _append(self, path: str, line: str) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def log(self, level: str, msg: str) -> None:
        to_runc_log = self.path and (level != "debug" or self.debug_enabled)
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e9):09d}Z"
        msg = "execgate: " + msg
        if to_runc_log:
            import json  # only when there is something to write: most calls have nothing

            if self.json:
                line = json.dumps({"level": level, "msg": msg, "time": stamp}) + "\n"
            else:
                line = f"time={json.dumps(stamp)} level={level} msg={json.dumps(msg)}\n"
            self._append(self.path, line)  # type: ignore[arg-type]
        if self.debug_path:
            self._append(self.debug_path, f"{stamp} pid={os.getpid()} {level} {msg}\n")

    def debug(self, msg: str) -> None:
        if self.debug_path or self.debug_enabled:
            self.log("debug", msg)

    def warning(self, msg: str) -> None:
        self.log("warning", msg)

    def error(self, msg: str) -> None:
        self.log("error", msg)
