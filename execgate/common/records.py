"""Small on-disk records shared by the runtime, its watchers, the daemon and the CLI.

Containers: one JSON file per container under <state_dir>/containers, written atomically
(rename), so a reader never sees half a record and a crash never leaves one.
Finished tool calls: one JSON line each, appended to the journal (O_APPEND keeps concurrent
writers' lines whole).
Fail-open events: what ran as plain runc because execgate could not do its part (a handler's
error, a container never prepared, a runtime without `exec --cgroup`) and so left no journal
line: one JSON line each in <state_dir>/fail-open.jsonl, which the daemon takes and counts
(status, metrics, its log), so they are not only in per-container runc logs.
"""

from __future__ import annotations

import json
import os
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing: the runtime imports this
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any


AGENT_ANNOTATION = "execgate.agent"  # "inside": the container's agent runs in it


def agent_inside(record: dict[str, Any], default: bool) -> bool:
    """Whether a container's agent runs inside it (annotation first, then the config default)."""
    value = (record.get("annotations") or {}).get(AGENT_ANNOTATION)
    if value is None:
        return default
    return str(value).strip().lower() == "inside"


def _containers_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "containers")


def _container_path(state_dir: str, cid: str) -> str:
    if not cid or "/" in cid or cid.startswith("."):
        raise ValueError(f"invalid container id {cid!r}")
    return os.path.join(_containers_dir(state_dir), cid + ".json")


def save_container(state_dir: str, record: dict[str, Any]) -> None:
    path = _container_path(state_dir, record["id"])
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, separators=(",", ":"))
    os.rename(tmp, path)


def load_container(state_dir: str, cid: str) -> dict[str, Any] | None:
    """The container's record; None when there is none (or it is not a JSON object)."""
    try:
        with open(_container_path(state_dir, cid)) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def remove_container(state_dir: str, cid: str) -> None:
    try:
        os.unlink(_container_path(state_dir, cid))
    except (FileNotFoundError, ValueError):
        pass


def containers(state_dir: str) -> Iterator[dict[str, Any]]:
    try:
        names = sorted(os.listdir(_containers_dir(state_dir)))
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(".json"):
            rec = load_container(state_dir, name[:-5])
            if rec:
                yield rec


class ContainerIndex:
    """The container records, re-parsed only where a file changed (a save renames a new file in,
    so a changed record has a new inode). The daemon rescans on every change in the directory;
    parsing every record each time cost it ~10 ms of CPU per container started at 1,000."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self._seen: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}

    def records(self) -> list[dict[str, Any]]:
        """Every readable record, in name order (copies: callers may keep or change them)."""
        try:
            entries = list(os.scandir(_containers_dir(self.state_dir)))
        except FileNotFoundError:
            entries = []
        fresh: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}
        for entry in entries:
            if not entry.name.endswith(".json"):
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
            old = self._seen.get(entry.name)
            if old is not None and old[0] == sig:
                fresh[entry.name] = old
                continue
            rec = load_container(self.state_dir, entry.name[:-5])
            if rec:
                fresh[entry.name] = (sig, rec)
        self._seen = fresh
        return [dict(fresh[name][1]) for name in sorted(fresh)]


FAIL_OPEN = "fail-open.jsonl"
FAIL_OPEN_KINDS = ("handler-error", "not-prepared", "no-exec-cgroup")


def note_fail_open(state_dir: str, kind: str, container: str | None, detail: str) -> None:
    """Record a fail-open event; never raises (the call runs as plain runc all the same)."""
    entry = {"time": round(time.time(), 3), "kind": kind, "container": container,
             "detail": detail[:300]}
    try:
        append_journal(os.path.join(state_dir, FAIL_OPEN), entry)
    except (OSError, ValueError):
        pass


def take_fail_open(state_dir: str) -> list[dict[str, Any]]:
    """The daemon's: the events recorded up to its previous take. The file is renamed aside,
    and read at the next take, so a runtime that opened it just before the rename has long
    finished its one write by then."""
    path = os.path.join(state_dir, FAIL_OPEN)
    aside = path + ".taking"
    events: list[dict[str, Any]] = []
    try:
        with open(aside, "rb") as f:
            data = f.read(1 << 20)
        os.unlink(aside)
    except FileNotFoundError:
        pass
    except OSError:
        return events
    else:
        events = journal_entries(data.splitlines())
    try:
        os.rename(path, aside)
    except OSError:
        pass
    return events


def append_journal(path: str, entry: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def tail_journal(path: str, n: int, chunk: int = 1 << 16) -> list[dict[str, Any]]:
    """The last n entries, read from the end: the journal only ever grows."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        pos, data = f.seek(0, os.SEEK_END), b""
        while pos > 0 and data.count(b"\n") <= n:
            step = min(chunk, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    return journal_entries(data.splitlines()[-n:] if n > 0 else [])


def read_journal(path: str) -> Iterator[dict[str, Any]]:
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        for line in f:
            yield from journal_entries([line])


# Every entry starts with its call (calls/record.py's journal order); inside a JSON string a
# quote is escaped, so this is only ever the start of an entry.
_ENTRY_START = b'{"call"'


def journal_entries(lines: Iterable[bytes]) -> list[dict[str, Any]]:
    """The entries of whole journal lines. A line a writer never finished (killed mid-write,
    disk full) has the next writer's entry appended to it: that entry is recovered, only the
    torn part is lost."""
    out = []
    for line in lines:
        start = 0
        while start >= 0:
            try:
                entry = json.loads(line[start:])
            except ValueError:
                start = line.find(_ENTRY_START, start + 1)
                continue
            if isinstance(entry, dict):
                out.append(entry)
            break
    return out
