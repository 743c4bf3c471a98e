"""Minimal cgroup v2 file operations (no library: this runs on every exec)."""

from __future__ import annotations

import errno
import os
import time

ROOT = os.environ.get("EXECGATE_CGROUP_ROOT", "/sys/fs/cgroup")
CGROUP2_SUPER_MAGIC = 0x63677270


def is_unified(root: str = ROOT) -> bool:
    """True on a pure cgroup v2 host (hybrid and v1 hosts are passed through untouched)."""
    return os.path.exists(os.path.join(root, "cgroup.controllers"))


def path_of_pid(pid: int, root: str = ROOT) -> str:
    """Absolute cgroupfs directory of a process, from its '0::' line."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return os.path.join(root, line[3:].strip().lstrip("/"))
    raise LookupError(f"pid {pid} has no cgroup v2 membership")


def read(cg: str, name: str) -> str:
    with open(os.path.join(cg, name)) as f:
        return f.read()


def write(cg: str, name: str, value: str) -> None:
    fd = os.open(os.path.join(cg, name), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def read_keyed(cg: str, name: str) -> dict[str, int]:
    """A flat-keyed file (memory.events, cpu.stat, cgroup.events) as a dict; {} if absent."""
    try:
        text = read(cg, name)
    except OSError:
        return {}
    return parse_keyed(text)


def parse_keyed(text: str) -> dict[str, int]:
    """A flat-keyed file's content as a dict (lines whose value is not an integer left out)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, val = line.partition(" ")
        try:
            out[key] = int(val)
        except ValueError:
            continue
    return out


def read_int(cg: str, name: str) -> int | None:
    try:
        return int(read(cg, name).strip())
    except (OSError, ValueError):
        return None


def procs(cg: str) -> list[int]:
    try:
        return [int(p) for p in read(cg, "cgroup.procs").split()]
    except (OSError, ValueError):
        return []


def thaw(cg: str) -> bool:
    """Thaw a cgroup frozen through its own cgroup.freeze; whether it was. A cgroup that is gone
    (or never was) has nothing to thaw."""
    try:
        if read_int(cg, "cgroup.freeze") != 1:
            return False
        write(cg, "cgroup.freeze", "0")
        return True
    except OSError:
        return False


def populated(cg: str) -> bool:
    return read_keyed(cg, "cgroup.events").get("populated", 0) == 1


def never_ran(cg: str, unknown: bool = False) -> bool:
    """Whether no task ever ran in the cgroup: its cpu.stat shows no CPU used (exec'ing into a
    cgroup alone uses some). unknown: the answer when cpu.stat cannot be read."""
    used = read_keyed(cg, "cpu.stat").get("usage_usec")
    return unknown if used is None else used == 0


def wait_event(cg: str, key: str, value: int, timeout: float) -> bool:
    """Wait until cgroup.events shows key == value (kernfs notifies with POLLPRI)."""
    import select

    deadline = time.monotonic() + timeout
    fd = os.open(os.path.join(cg, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    try:
        p = select.poll()
        p.register(fd, select.POLLPRI | select.POLLERR)
        while True:
            os.lseek(fd, 0, os.SEEK_SET)
            if f"{key} {value}" in os.read(fd, 4096).decode().splitlines():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            p.poll(int(left * 1000) + 1)
    finally:
        os.close(fd)


def move(pid: int, cg: str) -> None:
    write(cg, "cgroup.procs", str(pid))


def enable_controllers(cg: str, wanted: tuple[str, ...]) -> list[str]:
    """Enable the wanted controllers that the cgroup offers; returns those enabled."""
    available = read(cg, "cgroup.controllers").split()
    enabled = [c for c in wanted if c in available]
    if enabled:
        write(cg, "cgroup.subtree_control", " ".join("+" + c for c in enabled))
    return enabled


def remove(cg: str, attempts: int = 20) -> bool:
    """rmdir an empty cgroup; EBUSY right after its last task exits is retried briefly."""
    for i in range(attempts):
        try:
            os.rmdir(cg)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY or i == attempts - 1:
                return False
            time.sleep(0.01 * (i + 1))
    return False


def remove_tree(cg: str) -> bool:
    """Remove a cgroup and all its (empty) descendants, deepest first."""
    ok = True
    try:
        entries = list(os.scandir(cg))
    except FileNotFoundError:
        return True
    except OSError:
        return False
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            ok = remove_tree(entry.path) and ok
    return remove(cg) and ok
