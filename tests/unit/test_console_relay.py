"""The console-socket relay against a real pty and real Unix sockets (no runc needed)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from execgate.calls import terminal
from execgate.oci import cli


def test_relay_forwards_master_and_keeps_the_slave(tmp_path: Path) -> None:
    engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    engine.bind(str(tmp_path / "engine.sock"))
    engine.listen(1)
    proxy = terminal.Proxy(str(tmp_path / "c" / "proxy.sock"), str(tmp_path / "engine.sock"))
    master, slave0 = os.openpty()
    os.close(slave0)
    got: dict[str, object] = {}

    def fake_engine() -> None:
        conn, _ = engine.accept()
        with conn:
            data, fds, _, _ = socket.recv_fds(conn, 4096, 1)
        got["data"], got["fd"] = data, fds[0]

    t = threading.Thread(target=fake_engine)
    t.start()
    runc = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    runc.connect(proxy.path)
    socket.send_fds(runc, [b"/dev/pts/7"], [master])
    runc.close()
    os.close(master)
    rfd, wfd = os.pipe()  # stands in for runc's pidfd: never readable here
    slave = terminal.Proxy.relay(proxy, rfd)
    t.join(5)
    assert got["data"] == b"/dev/pts/7"
    assert slave is not None
    terminal.write_to_terminal(slave, "[execgate] note\n")
    os.close(slave)
    out = os.read(int(got["fd"]), 1024)  # type: ignore[arg-type]
    assert out.replace(b"\r", b"") == b"[execgate] note\n"
    assert not os.path.exists(proxy.path)
    for fd in (rfd, wfd, int(got["fd"])):  # type: ignore[arg-type]
        os.close(fd)


def test_relay_gives_up_when_runc_exits_without_connecting(tmp_path: Path) -> None:
    proxy = terminal.Proxy(str(tmp_path / "p.sock"), str(tmp_path / "none.sock"))
    rfd, wfd = os.pipe()
    os.write(wfd, b"x")  # "runc exited"
    assert proxy.relay(rfd) is None
    assert not os.path.exists(proxy.path)


def test_replace_console_socket_in_every_spelling() -> None:
    for spelled in (["--console-socket", "/e"], ["-console-socket", "/e"],
                    ["--console-socket=/e"]):
        inv = cli.parse(["--root", "/r", "exec", "-t", *spelled, "--process", "/p", "cid"])
        out = inv.with_command_flags(["--cgroup", "tool-1"])
        out = inv.replace_command_flag(out, "console-socket", "/mine")
        assert "/e" not in out and "--console-socket=/e" not in out, out
        assert any(a.endswith("/mine") for a in out)
        assert out[-1] == "cid" and "/p" in out and out[out.index("--cgroup") + 1] == "tool-1"


def test_a_terminal_that_does_not_drain_never_holds_the_note_writer() -> None:
    """Issue 21, item 8: the exit note is written while the exit is held; a terminal whose
    output is stopped (^S) or never read blocked that write, and the exec hung with it."""
    import termios
    import time

    for stopped in (True, False):
        master, slave = os.openpty()
        if stopped:
            termios.tcflow(slave, termios.TCOOFF)
        note = "[execgate] note\n" * (1 if stopped else 20000)  # unread: more than a pty holds
        result: list[BaseException | None] = []

        def write(s: int = slave, n: str = note,
                  result: list[BaseException | None] = result) -> None:
            try:
                terminal.write_to_terminal(s, n)
                result.append(None)
            except OSError as e:
                result.append(e)

        t0 = time.monotonic()
        t = threading.Thread(target=write, daemon=True)
        t.start()
        t.join(5)
        assert not t.is_alive(), f"the write blocked (stopped={stopped})"
        assert time.monotonic() - t0 < 3
        assert isinstance(result[0], TimeoutError), result
        os.close(slave)
        os.close(master)
