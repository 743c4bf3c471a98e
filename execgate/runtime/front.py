"""Build the runtime's compiled front (front.c): `python -m execgate.runtime.front build OUT PY`.

install.sh installs the front as `execgate` and PY, the Python entry point (launcher.py's
script), beside it: the front execve()s the real runtime for every call with nothing to do and
PY for the rest. The paths and names the front shares with the Python side (the config file,
the front file, the runtime search path, the loop marker) are passed from here as -D
definitions, so each has one definition, in Python. Not imported by the runtime.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "front.c")
COMPILERS = ("cc", "clang", "gcc")
CFLAGS = ("-O2", "-Wall", "-Wextra", "-std=gnu11")


class BuildError(RuntimeError):
    pass


def _literal(value: str) -> str:
    """value as a C string literal; only what needs no escaping (paths, names)."""
    if any(c in value for c in '"\\') or not value.isprintable():
        raise BuildError(f"{value!r} cannot be built into the front")
    return f'"{value}"'


def definitions(python_entry: str, front_conf: str | None = None) -> list[str]:
    """The -D flags: what the front must agree on with the Python side."""
    from execgate.common import config, frontconf, protocol
    from execgate.oci import runc

    values = {"EXECGATE_PYTHON": python_entry,
              "FRONT_CONF": front_conf or frontconf.path_for(config.CACHE_PATH),
              "FRONT_FORMAT": frontconf.FORMAT,
              "DEFAULT_CONFIG": config.DEFAULT_PATH,
              "SEARCH_PATH": runc.SEARCH_PATH,
              "LOOP_MARKER": runc.LOOP_MARKER,
              "DAEMON_LOST": frontconf.DAEMON_LOST}
    numbers = {"MISSED_FRAMES": protocol.MISSED_FRAMES}
    return [f"-D{k}={_literal(v)}" for k, v in values.items()] + \
        [f"-D{k}={int(v)}" for k, v in numbers.items()]


def compiler() -> str | None:
    """$CC when set, else the first of cc, clang, gcc on $PATH."""
    for cc in ((os.environ["CC"],) if os.environ.get("CC") else COMPILERS):
        found = shutil.which(cc)
        if found:
            return found
    return None


def build(out: str, python_entry: str, *, front_conf: str | None = None,
          cc: str | None = None, extra: tuple[str, ...] = ()) -> str:
    """Compile the front to out (atomically, mode 0755): static where the C library allows it
    (no dynamic loader on every call), else dynamic. Returns out; BuildError when it cannot."""
    if not os.path.isabs(python_entry):
        raise BuildError(f"the Python entry point must be an absolute path: {python_entry!r}")
    cc = cc or compiler()
    if cc is None:
        raise BuildError("no C compiler (cc, clang, gcc)")
    base = [cc, *CFLAGS, *extra, *definitions(python_entry, front_conf), SOURCE]
    tmp = f"{out}.{os.getpid()}.tmp"
    errors = []
    for link in (["-static"], []):
        p = subprocess.run([*base, *link, "-o", tmp], capture_output=True, text=True)
        if p.returncode == 0:
            os.chmod(tmp, 0o755)
            os.replace(tmp, out)
            return out
        errors.append(p.stderr.strip())
    try:
        os.unlink(tmp)
    except OSError:
        pass
    raise BuildError(f"{cc} failed:\n" + "\n".join(errors))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "build":
        print("usage: python -m execgate.runtime.front build OUT PYTHON_ENTRY", file=sys.stderr)
        return 2
    try:
        print(build(args[1], args[2]))
    except (BuildError, OSError) as e:
        print(f"execgate.runtime.front: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
