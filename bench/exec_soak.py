"""A cgroup per exec, soaked: do removed tool cgroups pile up as dying memory cgroups?

Memory cgroup ids are 16-bit (65,535 live, dying ones included), and a removed cgroup lingers
("dying") while pages are still charged to it. Every tool call gets a cgroup of its own and
leaves files behind (a build's outputs, caches), so a long-lived sandbox could run out of ids.
Two ways to look, as root on a cgroup v2 host (issue 21, item 12):

    python3 -m bench.exec_soak execs N [--out FILE]   # N execs through the installed execgate
    python3 -m bench.exec_soak churn N [--out FILE]   # the kernel alone: N cgroups, made and
                                                      # removed as execgate makes tool cgroups
        [--no-fork] [--parents K]   # the writer is the soak itself (it moves into each cgroup
                                    # and back: past the 65,535 ids under TCG in minutes);
                                    # the tool cgroups spread over K container cgroups

`execs` creates one container straight through `execgate` (cgroupfs driver, no engine; its
rootfs exported from the VM's test image), and runs N calls that each write a new 64 KiB file
(page cache charged to the call's cgroup) and keep it. `churn` does the same with no runtime:
mkdir tool-<i> under one parent, a forked writer placed in it, rmdir once it has exited; it
runs far faster under TCG, so it reaches the id limit's scale. Both sample, every STEP calls:
the parent's nr_dying_descendants, its live tool cgroups, memory.current, and (execs) the
journal lines written. A JSON summary is printed (and written to --out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from execgate.cgroups import container, v2

CGROOT = "/sys/fs/cgroup"
EXECGATE = "/usr/local/bin/execgate"
JOURNAL = "/var/lib/execgate/calls.jsonl"
IMAGE = "execgate-test:latest"
FILE_KIB = 64  # each call's new file (--file-kib)


def _journal_lines() -> int:
    try:
        with open(JOURNAL, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _dying(cg: str) -> int:
    return v2.read_keyed(cg, "cgroup.stat").get("nr_dying_descendants", 0)


def _sample(i: int, cg: str, t0: float, journal0: int | None) -> dict[str, Any]:
    out = {"calls": i, "s": round(time.monotonic() - t0, 1), "dying": _dying(cg),
           "live_tool_cgroups": len(container.tool_cgroups(cg)),
           "memory_current": v2.read_int(cg, "memory.current")}
    if journal0 is not None:
        out["journaled"] = _journal_lines() - journal0
    print(json.dumps(out), flush=True)
    return out


def _write_cmd(i: int, kib: int) -> list[str]:
    return ["sh", "-c", f"head -c {kib * 1024} /dev/urandom > /tmp/soak.{i}"]


def _write_in(cg: str, path: str, kib: int) -> None:
    """A child that joins cg, writes a new file (its page cache charged to cg) and exits: a
    fork, no exec, so that the kernel's side is what is measured."""
    pid = os.fork()
    if pid == 0:
        try:  # the child never returns into the parent's loop
            with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                f.write("0")
            with open(path, "wb") as f:
                f.write(os.urandom(kib * 1024))
            os._exit(0)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"the writer in {cg} failed ({status})")


def _write_here(cg: str, home: str, path: str, kib: int) -> None:
    """The soak itself joins cg, writes a new file (charged to cg: pages stay with the cgroup
    that first charged them) and goes back home: no fork, so no process per cgroup."""
    v2.move(os.getpid(), cg)
    try:
        with open(path, "wb") as f:
            f.write(os.urandom(kib * 1024))
    finally:
        v2.move(os.getpid(), home)


def churn(n: int, step: int, kib: int = FILE_KIB, fork: bool = True,
          parents: int = 1) -> dict[str, Any]:
    top = os.path.join(CGROOT, f"execgate-soak-{os.getpid()}")
    os.mkdir(top)
    with open(os.path.join(top, "cgroup.subtree_control"), "w") as f:
        f.write("+memory +pids")
    home = os.path.join(top, "home")  # where the soak lives when it writes itself
    os.mkdir(home)
    origin = v2.path_of_pid(os.getpid())
    boxes = []
    for k in range(parents):  # the containers' cgroups
        box = os.path.join(top, f"box-{k:03d}")
        os.mkdir(box)
        with open(os.path.join(box, "cgroup.subtree_control"), "w") as f:
            f.write("+memory +pids")
        boxes.append(box)
    scratch = tempfile.mkdtemp(prefix="soak-", dir="/var/tmp")
    t0, samples, refused = time.monotonic(), [], None
    try:
        for i in range(1, n + 1):
            cg = os.path.join(boxes[i % parents], f"tool-{i:06x}")
            try:
                os.mkdir(cg)
            except OSError as e:  # ENOSPC: out of memory cgroup ids
                refused = {"at": i, "error": str(e), **_sample(i - 1, top, t0, None)}
                break
            path = os.path.join(scratch, f"f.{i}")
            if fork:
                _write_in(cg, path, kib)
            else:
                _write_here(cg, home, path, kib)
            os.rmdir(cg)
            if i % step == 0 or i == n:
                samples.append(_sample(i, top, t0, None))
    finally:
        v2.move(os.getpid(), origin)
        shutil.rmtree(scratch, ignore_errors=True)
        for box in boxes:
            for e in os.scandir(box):
                if e.is_dir():
                    os.rmdir(e.path)
        time.sleep(1)
        after = _dying(top)
        for box in (*boxes, home):
            os.rmdir(box)
        os.rmdir(top)
    return {"mode": "churn", "n": n, "file_kib": kib, "fork": fork, "parents": parents,
            "samples": samples, "mkdir_refused": refused, "dying_after_files_removed": after}



def _bundle(tmp: str, cid: str) -> str:
    b = os.path.join(tmp, "bundle")
    rootfs = os.path.join(b, "rootfs")
    os.makedirs(rootfs)
    c = subprocess.run(["docker", "create", IMAGE, "true"], capture_output=True, text=True,
                       check=True).stdout.strip()
    try:
        export = subprocess.Popen(["docker", "export", c], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", rootfs], stdin=export.stdout, check=True)
        export.wait()
    finally:
        subprocess.run(["docker", "rm", c], capture_output=True)
    subprocess.run(["runc", "spec"], cwd=b, check=True)
    with open(os.path.join(b, "config.json")) as f:
        spec = json.load(f)
    spec["process"].update(terminal=False, args=["sleep", "inf"])
    spec["root"]["readonly"] = False
    spec["linux"]["cgroupsPath"] = f"/execgate-soak/{cid}"
    with open(os.path.join(b, "config.json"), "w") as f:
        json.dump(spec, f)
    return b


def _rt(root: str, *args: str, quiet: bool = False) -> None:
    subprocess.run([EXECGATE, "--root", root, *args], check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL if quiet else None, timeout=600)


def execs(n: int, step: int, kib: int = FILE_KIB) -> dict[str, Any]:
    cid = f"soak-{os.getpid()}"
    tmp = tempfile.mkdtemp(prefix="soak-", dir="/var/tmp")  # on disk, as an image's layers are
    root = os.path.join(tmp, "root")
    b = _bundle(tmp, cid)
    # --pid-file as an engine passes it: without it execgate cannot find init, and the container
    # runs unmanaged (plain runc)
    _rt(root, "create", "--bundle", b, "--pid-file", os.path.join(tmp, "init.pid"), cid,
        quiet=True)
    cg = os.path.join(CGROOT, "execgate-soak", cid)
    samples: list[dict[str, Any]] = []
    failed = 0
    try:
        _rt(root, "start", cid)
        journal0, t0 = _journal_lines(), time.monotonic()
        for i in range(1, n + 1):
            proc = os.path.join(tmp, "process.json")
            with open(proc, "w") as f:
                json.dump({"terminal": False, "user": {"uid": 0, "gid": 0},
                           "args": _write_cmd(i, kib), "env": ["PATH=/bin"], "cwd": "/"}, f)
            p = subprocess.run([EXECGATE, "--root", root, "exec", "--process", proc, cid],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=600)
            failed += p.returncode != 0
            if i % step == 0 or i == n:
                samples.append(_sample(i, cg, t0, journal0))
        deadline = time.monotonic() + 120  # the last calls' watchers journal them
        while _journal_lines() - journal0 < n and time.monotonic() < deadline:
            time.sleep(1)
        final = _sample(n, cg, t0, journal0)
    finally:
        subprocess.run([EXECGATE, "--root", root, "delete", "--force", cid],
                       capture_output=True, timeout=600)
        shutil.rmtree(tmp, ignore_errors=True)
    return {"mode": "execs", "n": n, "file_kib": kib, "failed": failed,
            "samples": samples, "final": final,
            "container_cgroup_left": os.path.exists(cg)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("execs", "churn"))
    ap.add_argument("n", type=int)
    ap.add_argument("--step", type=int, default=0, help="sample every STEP calls (N/20)")
    ap.add_argument("--file-kib", type=int, default=FILE_KIB,
                    help="the file each call leaves (KiB)")
    ap.add_argument("--no-fork", action="store_true",
                    help="churn: the soak writes in each cgroup itself (no process per cgroup)")
    ap.add_argument("--parents", type=int, default=1,
                    help="churn: container cgroups the tool cgroups spread over")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    step = a.step or max(1, a.n // 20)
    result = (execs(a.n, step, a.file_kib) if a.mode == "execs" else
              churn(a.n, step, a.file_kib, fork=not a.no_fork, parents=a.parents))
    result["kernel"] = os.uname().release
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
