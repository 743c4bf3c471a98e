"""Write the runtime's lean entry point: `python -m execgate.runtime.launcher PATH` (install.sh).

The runtime starts on every runtime call Docker makes, most of them passthroughs that last a
few milliseconds once Python is up, so Python's own start-up is most of their cost. pip's
console script starts Python with site (every .pth of the system site-packages, which the venv
sees only so that the daemon can import Debian's bcc) and imports re. The script written here
starts Python isolated and without site (`-IS`: no PYTHON* variables, no user site, no .pth)
and puts on sys.path only the directories the runtime imports from (the venv's site-packages,
wherever msgpack is), found now, with the same interpreter. Should they move (a venv rebuilt
by hand), the script starts site as usual and imports again: slower, never broken.
"""

from __future__ import annotations

import os
import subprocess
import sys

# Kept within the first 512 bytes: oci/runc.py recognises any copy of execgate by its
# shebang and the name of the entry point (a runtime configured as execgate would loop).
TEMPLATE = """\
#!{python} -IS
# execgate's runtime (execgate.runtime.main:main), written by `python -m execgate.runtime.launcher`:
# Python starts isolated, without site; sys.path gets only what the runtime imports.
import sys

sys.path.extend({paths!r})
try:
    from execgate.runtime.main import main
except ImportError:  # the paths moved: start site as usual, then retry
    import site

    site.main()
    from execgate.runtime.main import main
sys.exit(main())
"""


def runtime_paths() -> list[str]:
    """The sys.path entries holding what the runtime imports: execgate and msgpack."""
    import msgpack

    import execgate.runtime

    pkgs = [os.path.dirname(next(iter(execgate.runtime.__path__))),
            os.path.dirname(os.path.abspath(msgpack.__file__ or ""))]
    return list(dict.fromkeys(os.path.dirname(p) for p in pkgs))


def render(python: str, paths: list[str]) -> str:
    return TEMPLATE.format(python=python, paths=paths)


def check(python: str, paths: list[str]) -> None:
    """Import the runtime's modules the way the script will; CalledProcessError if it can't."""
    modules = ", ".join(f"execgate.runtime.{m}" for m in
                        ("main", "create", "start", "exec", "kill", "delete", "watcher"))
    code = f"import sys; sys.path.extend({paths!r}); import {modules}, msgpack"
    subprocess.run([python, "-IS", "-c", code], check=True)


def write(path: str, python: str | None = None) -> None:
    """Write the entry point at path (atomically, mode 0755) once it proved to work."""
    python = python or sys.executable
    if len(python) > 120 or any(c.isspace() for c in python):  # what a #! line cannot hold
        raise ValueError(f"{python!r} cannot be a #! interpreter")
    paths = runtime_paths()
    check(python, paths)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(render(python, paths))
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m execgate.runtime.launcher PATH", file=sys.stderr)
        return 2
    try:
        write(args[0])
    except (OSError, ImportError, ValueError, subprocess.CalledProcessError) as e:
        print(f"execgate.runtime.launcher: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
