"""The compiled front's view of the config: what `runtime/front.c` needs to hand a call to the
real runtime without starting Python, resolved here so that C never parses TOML.

Written by the Python runtime beside its config cache (config.load_cached) and by the daemon
when it starts and reloads (config.refresh_front), read by the front on every call. One
`key value` line each: `config` and `code` name the config file and the modules that resolve
it, with their stat (`dev ino size mtime_ns ctime_ns`; `-` for a config file that does not
exist). The front trusts the rest only while every one still matches, so an edit of the config
or an upgrade of execgate sends calls to Python until Python writes the file again.
`socket` and `daemon_timeout_ms` are the daemon's, for the managed execs the front hands it
(daemon/exec_op.py).
A config with problems to report, or a debug log to write, gets no file: every call goes through
Python, which reports them.
"""

from __future__ import annotations

import os

from execgate.common import config

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing: the runtime imports this
if TYPE_CHECKING:
    from execgate.common.config import Config

NAME = "front.conf"
FORMAT = "execgate-front 1"
# Set by the front when the daemon died with a call or a create it was sent, or took it
# (`queued`) and then fell silent: Python runs it at once without asking again. Asked again,
# the restarted daemon queued the call a second time (in the VM three calls waited 101-108 s
# more after a kill -9).
DAEMON_LOST = "EXECGATE_DAEMON_LOST"


def path_for(cache: str) -> str:
    """The front file that goes with a config cache (the front is built with the default one)."""
    return os.path.join(os.path.dirname(cache), NAME)


def _stat_fields(st: os.stat_result) -> str:
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"


def render(path: str, st: os.stat_result | None, cfg: Config, code: tuple[str, ...]
           ) -> str | None:
    """The front file for cfg loaded from path (st: its stat, None when it does
    not exist), valid while the files in code are unchanged; None when the front must leave every
    call to Python."""
    if cfg.errors or getattr(cfg, "warnings", ()) or cfg.debug_log:
        return None
    from execgate import __version__

    try:
        codes = [f"code {_stat_fields(os.stat(c))} {os.path.abspath(c)}" for c in code]
    except OSError:
        return None
    lines = [FORMAT,
             f"config {_stat_fields(st) if st else '-'} {os.path.abspath(path)}",
             *codes,
             f"version {__version__}",
             f"state_dir {cfg.state_dir}",
             f"per_exec_cgroups {int(cfg.per_exec_cgroups)}",
             f"socket {cfg.socket}",
             f"daemon_timeout_ms {max(1, int(cfg.daemon_timeout_ms))}",
             *(f"runtime {r}" for r in cfg.runtime),
             "end"]
    if any(c in line for line in lines for c in "\n\r\0"):
        return None  # what a line cannot hold: Python resolves every call
    return "\n".join(lines) + "\n"


def write(front: str, path: str, st: os.stat_result | None, cfg: Config,
          code: tuple[str, ...]) -> None:
    """Bring the front file up to date (removed when the front must not use one); best effort,
    and nothing written when it already says the same."""
    text = render(path, st, cfg, (*code, __file__))
    blob = text.encode() if text is not None else None
    try:
        with open(front, "rb") as f:
            if f.read() == blob:
                return
    except OSError:
        if blob is None:
            return
    if blob is not None:
        config.replace_file(front, blob)
        return
    try:
        os.unlink(front)
    except OSError:
        pass
