"""TTY execs: stand between runc and the engine on `--console-socket` to reach the terminal.

runc hands the pty master to the engine over a Unix socket (SCM_RIGHTS). execgate gives runc a
socket of its own, forwards the master to the engine's socket unchanged, and keeps a handle on
the pty's *slave* side (TIOCGPTPEER): what the watcher writes there after the call appears on
the user's terminal like the call's own output, and the engine sees the stream end only when
the watcher lets go of it.

`write_to_terminal` serves the daemon too (an inside call's stderr may be a terminal), hence
calls/; the relay itself runs only in the runtime's watcher.
"""

from __future__ import annotations

import fcntl
import os
import select
import socket
import termios
import time

TIOCGPTPEER = 0x5441


class Proxy:
    """A listening socket runc connects to instead of the engine's."""

    def __init__(self, path: str, target: str) -> None:
        self.path = path
        self.target = target
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self.sock.bind(path)
        self.sock.listen(1)

    def fileno(self) -> int:
        return self.sock.fileno()

    def relay(self, runtime_pidfd: int) -> int | None:
        """Forward runc's pty master to the engine; return a slave fd (None if runc never came).

        Blocks until runc connects or exits. The master is forwarded even when taking the
        slave fails, so the engine never waits for a terminal that will not come.
        """
        try:
            ready, _, _ = select.select([self.sock, runtime_pidfd], [], [])
            if self.sock not in ready:
                ready, _, _ = select.select([self.sock], [], [], 0)
                if not ready:
                    return None
            conn, _ = self.sock.accept()
            with conn:
                data, fds, _flags, _addr = socket.recv_fds(conn, 4096, 1)
            if not fds:
                return None
            master = fds[0]
            slave = None
            try:
                slave = fcntl.ioctl(master, TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError:
                slave = None
            finally:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as out:
                    out.connect(self.target)
                    socket.send_fds(out, [data], [master])
                os.close(master)
            return slave
        finally:
            self.close()

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def write_to_terminal(slave: int, text: str, timeout: float = 1.0) -> None:
    """Write lines so they render on a raw or cooked terminal alike.

    The note is written while the call's exit is held: a terminal that does not drain (nobody
    reads it, or output is stopped with ^S) must not hold the exec too. Whatever it has not
    taken within timeout is dropped: TimeoutError (issue 21, item 8). The descriptor is our own
    open of the pty (TIOCGPTPEER), so making it non-blocking touches nobody else's."""
    try:
        oflag = termios.tcgetattr(slave)[1]
        if not oflag & termios.OPOST or not oflag & termios.ONLCR:
            text = text.replace("\n", "\r\n")
    except termios.error:
        pass
    data = text.encode()
    os.set_blocking(slave, False)
    deadline = time.monotonic() + timeout
    while data:
        try:
            data = data[os.write(slave, data):]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [slave], [], left)[1]:
                raise TimeoutError(f"the terminal took no more within {timeout:g} s") from None


