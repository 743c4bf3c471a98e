"""Find the real OCI runtime and hand calls to it.

Loops are the one fatal misconfiguration of a wrapper (daemon.json pointing `runc` at execgate,
or config naming execgate itself), so every candidate is checked against our own executable and
a marker in the environment stops a second nesting level outright.
"""

from __future__ import annotations

import os
import sys

LOOP_MARKER = "EXECGATE_WRAPPED"
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class RuntimeNotFound(RuntimeError):
    def __init__(self, message: str, itself: bool = False) -> None:
        super().__init__(message)
        self.itself = itself  # a candidate was execgate itself (a loop, not a typo)


def which(name: str, path: str | None = None) -> str | None:
    """shutil.which() for a bare command name, without importing shutil (and its fnmatch, re):
    the first executable non-directory called name in path (default $PATH)."""
    if path is None:
        path = os.environ.get("PATH", os.defpath)
    if not path:
        return None
    for d in dict.fromkeys(path.split(os.pathsep)):
        cand = os.path.join(d, name)
        if os.access(cand, os.X_OK) and not os.path.isdir(cand):
            return cand
    return None


def _self_paths() -> set[str]:
    paths = {os.path.realpath(sys.argv[0])} if sys.argv and sys.argv[0] else set()
    found = which("execgate")
    if found:
        paths.add(os.path.realpath(found))
    return paths


def _is_execgate(path: str, own: set[str]) -> bool:
    if os.path.realpath(path) in own:
        return True
    # A console-script wrapper for execgate (e.g. another venv's copy) names our entry point.
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    return head.startswith(b"#!") and b"execgate.runtime" in head


def find(candidates: tuple[str, ...]) -> str:
    """The first candidate that exists, is executable and is not execgate."""
    own = _self_paths()
    search = os.environ.get("PATH", "") + ":" + SEARCH_PATH
    tried = []
    for cand in candidates:
        path = cand if "/" in cand else which(cand, search)
        tried.append(path or cand)
        if not path or not os.access(path, os.X_OK) or os.path.isdir(path):
            continue
        if _is_execgate(path, own):
            tried[-1] += " (is execgate itself)"
            continue
        return path
    raise RuntimeNotFound("no OCI runtime found (tried " + ", ".join(tried) + ")",
                          itself=any(t.endswith(" (is execgate itself)") for t in tried))


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env[LOOP_MARKER] = "1"
    return env


def in_loop() -> bool:
    return os.environ.get(LOOP_MARKER) == "1"


def execve(runtime: str, args: list[str]) -> None:
    """Become the real runtime: same pid, same stdio, same exit status; never returns."""
    os.execve(runtime, [runtime, *args], child_env())


# What an engine sends a runtime it wants gone: passed on to a runtime run as our child.
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def run(runtime: str, args: list[str]) -> int:
    """Run the real runtime as a child with our stdio and every fd (runc's --preserve-fds);
    its exit status (-N: killed by signal N). A signal the engine sends us meanwhile is
    forwarded, so it stops runc as it would have stopped runc run directly."""
    import signal

    child: list[int] = []
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if not child:
            pending.append(signum)
            return
        try:
            os.kill(child[0], signum)
        except ProcessLookupError:
            pass

    signums = [getattr(signal, name) for name in FORWARDED]
    previous = {s: signal.signal(s, forward) for s in signums}
    try:
        child.append(os.posix_spawn(runtime, [runtime, *args], child_env()))
        for signum in pending:
            forward(signum, None)
        _, status = os.waitpid(child[0], 0)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return os.waitstatus_to_exitcode(status)


def exit_as(status: int) -> None:
    """Exit as the runtime child did: the same code, or killed by the same signal."""
    if status >= 0:
        os._exit(status)
    import signal

    try:
        signal.signal(-status, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL, SIGSTOP: default already, and cannot be set
        pass
    os.kill(os.getpid(), -status)
    os._exit(128 - status)  # a signal that does not kill by default (SIGCHLD, SIGCONT...)
