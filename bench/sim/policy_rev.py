"""Run the simulator on the execgate package as it was at a git revision.

A VM results file was measured with the policy of its day; the working tree's policy has moved
on since (the no-force rule, sandbox admission, ...). To validate the simulator against the VM the
execgate schemes must run the same decision code the VM ran, so `--policy-rev REV` extracts
`execgate` at REV (either layout: the package directory, or, before 0.2, top-level directories
named as its subpackages: policy/ was execgate.policy) into a temporary directory and re-runs the
same command with it first on PYTHONPATH. bench/ itself is always the working tree's.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

ENV = "BENCH_SIM_POLICY_REV"
REPO = Path(__file__).resolve().parents[2]
# The decision code and what it imports, as top-level directories before 0.2.
OLD_SUBPACKAGES = ("policy", "common", "cgroups", "oci", "daemon", "bpf")


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True).stdout


def extract(rev: str, dest: Path) -> Path:
    """dest/execgate as it was at rev, laid over the working tree's package; returns dest.

    policy/ is rev's alone (the decision code under test: a module added since, such as
    sandbox_admission.py, must not appear). Elsewhere every module rev had is rev's, and modules
    added since (execgate.common.units, which bench/ imports) stay the working tree's."""
    shutil.copytree(REPO / "execgate", dest / "execgate",
                    ignore=shutil.ignore_patterns("__pycache__", "policy"))
    names = _git("ls-tree", "--name-only", rev).decode().split()
    if "execgate" in names:
        mapping = {"execgate": "execgate"}
    else:  # before 0.2: execgate.X lived in ./X
        mapping = {d: f"execgate/{d}" for d in OLD_SUBPACKAGES if d in names}
    data = _git("archive", "--format=tar", rev, *mapping)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            top, _, rest = m.name.partition("/")
            if top not in mapping or not m.isfile():
                continue
            target = dest / mapping[top] / rest
            target.parent.mkdir(parents=True, exist_ok=True)
            f = tar.extractfile(m)
            assert f is not None
            target.write_bytes(f.read())
    init = dest / "execgate" / "__init__.py"
    if not init.exists():
        init.write_text("")
    return dest


def rerun(rev: str, argv: Sequence[str]) -> int:
    """The same `python -m bench.sim` command, with execgate from rev. It runs in the
    temporary directory (the working tree's bench/ linked in): `-m` puts the current directory
    first on sys.path, ahead of PYTHONPATH, so from the repository root the working tree's
    execgate would win. Relative paths in argv are made absolute first."""
    args = absolute(os.getcwd(), argv)
    with tempfile.TemporaryDirectory(prefix="egsim-") as tmp:
        extract(rev, Path(tmp))
        (Path(tmp) / "bench").symlink_to(REPO / "bench")
        env = dict(os.environ, PYTHONPATH=tmp, **{ENV: rev})
        return subprocess.run([sys.executable, "-m", "bench.sim", *args], env=env, cwd=tmp,
                              check=False).returncode


# Options whose value is a path that need not exist yet (an output directory).
OUT_OPTIONS = ("--out",)


def absolute(cwd: str, argv: Sequence[str]) -> list[str]:
    """argv with its paths made absolute: existing ones, and the values of OUT_OPTIONS (a new
    --out directory, relative, was written into the temporary directory and lost)."""
    out: list[str] = []
    for i, a in enumerate(argv):
        opt, eq, value = a.partition("=")
        if eq and opt in OUT_OPTIONS:
            out.append(f"{opt}={Path(cwd, value)}")
        elif (i and argv[i - 1] in OUT_OPTIONS) or _is_path(cwd, a):
            out.append(str(Path(cwd, a)))
        else:
            out.append(a)
    return out


def _is_path(cwd: str, arg: str) -> bool:
    """A path to make absolute: an existing file, or an existing path with a directory part
    (a bare word that names a directory here, such as the scheme `execgate`, is not one)."""
    if arg.startswith("-"):
        return False
    p = Path(cwd, arg)
    return p.is_file() or (os.sep in arg and p.exists())


def check() -> None:
    """In a re-run child: refuse to go on if execgate is not the extracted one."""
    rev = active()
    if rev is None:
        return
    import execgate

    where = Path(execgate.__file__).resolve()
    if REPO in where.parents:
        raise SystemExit(f"policy_rev: execgate came from {where}, not from {rev}")


def active() -> str | None:
    """The revision this process's execgate comes from (None: the working tree)."""
    return os.environ.get(ENV)
