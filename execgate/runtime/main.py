"""`execgate`: an OCI runtime that is runc for everything but four subcommands.

Like NVIDIA's container runtime, it intercepts only what it must (create, start, exec, kill, delete)
and execve()s the real runtime for the rest, so `state`, `events`, `ps`, `update`, `pause`… are
runc's own, byte for byte. `--version` first prints execgate's own version and the real runtime's
path, then runc's own lines (dockerd reads a runtime's version from the last line that says
"version": runc's). A handler that fails falls back to plain passthrough: execgate may lose
control of a container, never break it.
"""

from __future__ import annotations

import os
import sys

from execgate.common import config as config_mod
from execgate.oci import cli, runc
from execgate.oci.runclog import RuncLog

from .context import Context

# This module and what it imports run on every runtime call, most of them passthroughs: none
# imports typing, dataclasses, re, json, tomllib or shutil at load time (test_launcher.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import NoReturn

    # A handler returns the argv to execve the real runtime with, or an exit status when it has
    # already run the runtime itself.
    Handler = Callable[[Context], list[str] | int]


INTERCEPTED = ("create", "start", "exec", "kill", "delete")


def _handlers() -> dict[str, ModuleType]:
    """The intercepted subcommands' modules: each has `handle(ctx)` (a Handler) and may have
    `recover(ctx)`, run when its handler fails, before the passthrough."""
    from . import create, delete, kill, start
    from . import exec as exec_

    return {"create": create, "start": start, "exec": exec_, "kill": kill, "delete": delete}


def _runtime(cfg: config_mod.Config, log: RuncLog) -> str:
    """The real runtime: the configured one, else (a typo must not break every container
    operation) the default candidates, with an error logged. A configured runtime that is
    execgate itself is refused, not worked around: that install is broken."""
    try:
        return runc.find(cfg.runtime)
    except runc.RuntimeNotFound as e:
        default = config_mod.Config.runtime
        if cfg.runtime == default or e.itself:
            raise
        real = runc.find(default)
        log.error(f"configured runtime: {e}; using {real}")
        return real


def _fail(inv: cli.Invocation, log: RuncLog, msg: str) -> NoReturn:
    """A runc-level error, said as runc says one: in its log and on stderr, exit 1, or 255 for
    exec (runc's own, so that an engine tells it from the command's exit status)."""
    log.error(msg)
    print(f"execgate: {msg}", file=sys.stderr)
    sys.exit(255 if inv.command == "exec" else 1)


def print_version(real: str) -> None:
    """execgate's own version line and the real runtime's path, before the runtime prints its
    own; written straight to fd 1, as execve drops whatever Python still buffers."""
    from execgate import __version__

    os.write(1, f"execgate version {__version__}\nreal runtime: {real}\n".encode())


def main() -> None:
    argv = sys.argv[1:]
    inv = cli.parse(argv)
    cfg = config_mod.load_cached()
    log = RuncLog(inv.globals.get("log"), inv.globals.get("log-format"), cfg.debug_log,
                  debug=inv.globals.is_set("debug"))
    for problem in (*cfg.errors, *cfg.warnings):  # a bad value, a misspelled key: said once
        log.warning(problem)
    if runc.in_loop():
        _fail(inv, log, "execgate was called by itself: the configured runtime resolves to "
              "execgate")
    try:
        real = _runtime(cfg, log)
    except runc.RuntimeNotFound as e:
        _fail(inv, log, str(e))

    if inv.command is None and inv.globals.is_set("version"):
        print_version(real)
    result: list[str] | int = argv
    handlers = _handlers() if cfg.per_exec_cgroups and inv.command in INTERCEPTED else {}
    if inv.command in handlers:
        ctx = Context(inv=inv, config=cfg, log=log, runc=real)
        module = handlers[inv.command]
        try:
            result = module.handle(ctx)
        except Exception as e:  # noqa: BLE001 - never break a container over our own bug
            log.warning(f"{inv.command}: {type(e).__name__}: {e}; passing through to {real}")
            from execgate.common import records

            try:
                positionals = inv.command_flags().positionals
            except Exception:  # noqa: BLE001 - the argv itself may be what failed
                positionals = []
            records.note_fail_open(cfg.state_dir, "handler-error",
                                   positionals[0] if positionals else None,
                                   f"{inv.command}: {type(e).__name__}: {e}")
            recover = getattr(module, "recover", None)
            if recover is not None:
                recover(ctx)
            result = argv
    if isinstance(result, int):
        sys.stdout.flush()
        runc.exit_as(result)
    log.debug(f"execve {real} {' '.join(result)}")
    runc.execve(real, result)


if __name__ == "__main__":
    main()
