"""cgroups.container.prepare against the kernel's rule that a cgroup handing controllers to its
children holds no task (EBUSY). A fake v2 layer plays the kernel: tasks live in sets, and a task
may reach the container's cgroup late — between the last round of moves and the write to
cgroup.subtree_control, as a fork does while a loaded host is still freezing the container.
Before the fix that one late task made the sandbox unmanaged (seen in the VM replay e2e)."""

import errno
import time
from pathlib import Path

import pytest

from execgate.cgroups import container, v2


class FakeKernel:
    def __init__(self, cg: str, tasks: set[int], late: set[int], stuck: bool = False) -> None:
        self.tasks = {cg: set(tasks), container.init_leaf(cg): set()}
        self.cg, self.late, self.stuck, self.frozen = cg, set(late), stuck, 0

    def procs(self, cg: str) -> list[int]:
        return sorted(self.tasks[cg])

    def move(self, pid: int, cg: str) -> None:
        if self.stuck:
            return  # the write "succeeds" but the task stays (it keeps coming back)
        for members in self.tasks.values():
            members.discard(pid)
        self.tasks[cg].add(pid)

    def enable_controllers(self, cg: str, wanted: tuple[str, ...]) -> list[str]:
        self.tasks[cg] |= self.late  # arrived after the last round of moves
        self.late = set()
        if self.tasks[cg]:
            raise OSError(errno.EBUSY, "Device or resource busy")
        return list(wanted)

    def read_int(self, cg: str, name: str) -> int:
        return self.frozen

    def write(self, cg: str, name: str, value: str) -> None:
        assert name == "cgroup.freeze"
        self.frozen = int(value)


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def make(tasks: set[int], late: set[int], stuck: bool = False) -> FakeKernel:
        k = FakeKernel(str(tmp_path), tasks, late, stuck)
        for name in ("procs", "move", "enable_controllers", "read_int", "write"):
            monkeypatch.setattr(v2, name, getattr(k, name))
        monkeypatch.setattr(v2, "wait_event", lambda *a, **kw: True)
        return k
    return make


def test_a_task_arriving_after_the_moves_is_moved_too(kernel, tmp_path: Path) -> None:
    k = kernel(tasks={10, 11}, late={12})
    assert container.prepare(str(tmp_path), ("cpu", "memory")) == ["cpu", "memory"]
    assert k.tasks[str(tmp_path)] == set()
    assert k.tasks[container.init_leaf(str(tmp_path))] == {10, 11, 12}
    assert k.frozen == 0  # thawed again


def test_a_task_that_never_leaves_fails_at_the_deadline_and_thaws(kernel, tmp_path: Path) -> None:
    k = kernel(tasks={10}, late=set(), stuck=True)
    with pytest.raises(OSError) as e:
        container.prepare(str(tmp_path), ("memory",), timeout=0.2)
    assert e.value.errno == errno.EBUSY and k.frozen == 0


def test_a_freeze_that_outlasts_the_timeout_still_moves_the_tasks(kernel, tmp_path: Path,
                                                                   monkeypatch) -> None:
    """A task in direct reclaim (an init writing its baseline into a full host, the 15x burst)
    freezes only when its allocation returns. The wait for the freeze took the whole timeout,
    the moves never started, and the sandbox ran unmanaged (EBUSY); moving needs no freeze."""
    k = kernel(tasks={10, 11}, late=set())
    waits: list[float] = []

    def never_frozen(cg: str, key: str, value: int, timeout: float) -> bool:
        waits.append(timeout)
        time.sleep(timeout)
        return False

    monkeypatch.setattr(v2, "wait_event", never_frozen)
    assert container.prepare(str(tmp_path), ("memory",), timeout=0.2) == ["memory"]
    assert k.tasks[container.init_leaf(str(tmp_path))] == {10, 11} and k.frozen == 0
    # With the default timeout the wait is capped; the rest is for the moves.
    k.tasks[str(tmp_path)] = {12}
    assert container.prepare(str(tmp_path), ("memory",)) == ["memory"]
    assert waits == [0.2, container.FREEZE_WAIT_S]
