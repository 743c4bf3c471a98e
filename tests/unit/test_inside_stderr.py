"""An inside call's stderr is taken, never reopened by path (issue 21, item 1): feedback goes
only where the process itself could write, and an echoed hint is inert to a shell."""

from __future__ import annotations

import fcntl
import os
import pty
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from execgate.calls import feedback, tell
from execgate.common import hints
from execgate.daemon.inside import procfs
from execgate.daemon.inside.placement import write_line

HOSTILE = "';touch${IFS}x;#'"


@contextmanager
def child(stderr: int | IO[Any]) -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose fd 2 is `stderr`, waiting for a line on its stdin to exit."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"],
                            stdin=subprocess.PIPE, stderr=stderr)
    try:
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


def note() -> str:
    parsed = hints.parse(HOSTILE)
    assert parsed.error is not None
    return feedback.hint_ignored(HOSTILE, parsed.error)


def test_a_read_only_stderr_gets_nothing_written(tmp_path: Path) -> None:
    target = tmp_path / "root-owned"
    target.write_text("#!/bin/sh\necho hello\n")
    os.chmod(target, 0o644)
    with open(target, "rb") as ro, child(ro) as proc:
        # The old way (root reopening /proc/PID/fd/2 for writing) would have succeeded here.
        fd = procfs.take_stderr(proc.pid)
        assert fd is None
        write_line(fd, False, note())
    assert target.read_text() == "#!/bin/sh\necho hello\n"


def test_a_pipe_gets_the_note_without_blocking_or_changing_the_process_stream() -> None:
    with child(subprocess.PIPE) as proc:
        fd = procfs.take_stderr(proc.pid)
        assert fd is not None
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
        theirs = Path(f"/proc/{proc.pid}/fdinfo/2").read_text()
        flags = int(next(x for x in theirs.splitlines() if x.startswith("flags:")).split()[1], 8)
        assert not flags & os.O_NONBLOCK  # the process's own description is untouched
        assert tell.say(fd, False, [note()]) is None
        # A full pipe: the writes return at once instead of blocking the daemon.
        tell.say(fd, False, ["x" * 2 ** 20])
        assert tell.say(fd, False, ["more"]) is not None  # EAGAIN
        os.close(fd)
        assert proc.stderr is not None
        got = proc.stderr.read(4096).decode()
    assert got.startswith("[execgate] Ignored AGENT_RESOURCE_HINT=")


def test_a_file_opened_for_writing_gets_the_note_at_its_own_offset(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("old contents that the process overwrites\n")
    wfd = os.open(log, os.O_WRONLY)  # no O_APPEND: the process writes from 0
    os.write(wfd, b"mine\n")
    try:
        with child(wfd) as proc:
            fd = procfs.take_stderr(proc.pid)
            assert fd is not None
            assert tell.say(fd, False, ["[execgate] note\n"]) is None
            os.close(fd)
    finally:
        os.close(wfd)
    assert log.read_text().startswith("mine\n[execgate] note\n")


def test_a_terminal_is_reopened_as_a_terminal() -> None:
    master, slave = pty.openpty()
    try:
        with child(slave) as proc:
            fd = procfs.take_stderr(proc.pid)
            assert fd is not None and os.isatty(fd)
            assert tell.say(fd, True, ["[execgate] note\n"]) is None
            os.close(fd)
            assert b"[execgate] note" in os.read(master, 4096)
    finally:
        os.close(master)
        os.close(slave)


def test_a_blocking_socket_and_a_gone_process_get_no_feedback() -> None:
    a, b = socket.socketpair()
    with a, b, child(a.fileno()) as proc:
        assert procfs.take_stderr(proc.pid) is None
    assert procfs.take_stderr(proc.pid) is None  # reaped


def test_an_echoed_hint_is_inert_to_a_shell(tmp_path: Path) -> None:
    line = note()
    assert "'" not in hints.quote(HOSTILE)[1:-1]
    for raw in ";$`|&{}#\"":  # backslashes only as escapes, inside the quotes
        assert raw not in line.split("=", 1)[1].split(": ", 1)[0], raw
    # Even run as a script the line touches nothing.
    subprocess.run(["sh", "-c", line], cwd=tmp_path, capture_output=True, timeout=10)
    assert not (tmp_path / "x").exists()
    assert len(hints.quote("\U0001f600" * 100)) <= 40 + 5
    assert shlex.split(hints.quote(HOSTILE))  # one balanced word
