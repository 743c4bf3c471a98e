"""Whether the real runtime can start an exec in a child of its container's cgroup.

Every tool call rests on `exec --cgroup` (runc >= 1.1; crun and others say so in their help).
A runtime without it fails every managed exec on an unknown flag, so before relying on it
execgate asks the runtime's own `exec --help` once per binary, and where the flag is missing
every exec passes through as it is (logged: the calls run unmanaged). The answer is kept in
the state directory, keyed by the binary's path and stat: an upgraded runtime is asked again.
A runtime that gives no readable help (a timeout, a crash) is not held against it: nothing is
kept, the flag is assumed, and it is asked again next time. A long-lived caller (the daemon's
exec op, on every call) also keeps the answer in memory: one stat per call.
"""

from __future__ import annotations

import os

from execgate.common import config

from . import runc

DIR = "runtime-probe"
TIMEOUT_S = 10.0
_known: dict[str, tuple[str, bool]] = {}  # runtime -> (its stat key, the answer)


def _key(st: os.stat_result) -> str:
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns}"


def _file(state_dir: str, runtime: str) -> str:
    return os.path.join(state_dir, DIR, runtime.strip("/").replace("/", "_") + ".exec-cgroup")


def supported(runtime: str, state_dir: str) -> bool:
    """Whether `runtime exec --cgroup` exists; one stat and one small read once asked."""
    try:
        key = _key(os.stat(runtime))
    except OSError:
        return True  # the exec fails on its own, as runc would
    known = _known.get(runtime)
    if known is not None and known[0] == key:
        return known[1]
    path = _file(state_dir, runtime)
    answer = None
    try:
        with open(path) as f:
            kept_key, _, verdict = f.read().strip().rpartition(" ")
        if kept_key == key and verdict in ("0", "1"):
            answer = verdict == "1"
    except OSError:
        pass
    if answer is None:
        answer = ask(runtime)
        if answer is None:
            return True
        config.replace_file(path, f"{key} {int(answer)}\n".encode())  # else asked again
    _known[runtime] = (key, answer)
    return answer


def ask(runtime: str) -> bool | None:
    """The runtime's `exec --help`: True when it names --cgroup, False when it is exec's help
    without it, None when there is no help to read."""
    import subprocess

    try:
        p = subprocess.run([runtime, "exec", "--help"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=TIMEOUT_S, env=runc.child_env())
    except (OSError, subprocess.SubprocessError):
        return None
    text = (p.stdout + p.stderr).decode(errors="replace")
    if "--cgroup" in text:
        return True
    if "--pid-file" in text or "--process" in text:  # exec's own help, no --cgroup in it
        return False
    return None
