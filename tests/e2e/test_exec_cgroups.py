"""Every `docker exec` through execgate runs in its own cgroup inside the container's."""

from __future__ import annotations

import concurrent.futures
import os

from conftest import (
    STATE_DIR,
    Containers,
    cgroup_of,
    container_cgroup,
    docker,
    init_pid,
    journal_for,
    tool_cgroups,
    wait_for,
)


def test_init_moves_to_leaf_and_controllers_are_enabled(containers: Containers) -> None:
    cid = containers.run()
    cg = container_cgroup(cid)
    assert cgroup_of(init_pid(cid)) == os.path.join(cg, "init")
    with open(os.path.join(cg, "cgroup.subtree_control")) as f:
        enabled = f.read().split()
    assert {"cpu", "memory", "pids"} <= set(enabled)
    with open(os.path.join(cg, "cgroup.procs")) as f:
        assert f.read().strip() == ""
    assert os.path.exists(os.path.join(STATE_DIR, "containers", cid + ".json"))


def test_exec_runs_in_its_own_tool_cgroup(containers: Containers) -> None:
    cid = containers.run()
    cg = container_cgroup(cid)
    out = docker("exec", cid, "cat", "/proc/self/cgroup").stdout.decode()
    # The container has its own cgroup namespace: the path is relative to its root.
    path = out.strip().split("::", 1)[1]
    assert os.path.basename(path).startswith("tool-"), out
    # While a call runs, the host sees it in <container cgroup>/tool-*.
    docker("exec", "-d", cid, "sleep", "30")
    tools = wait_for(lambda: tool_cgroups(cg), what="a tool cgroup")
    assert len(tools) == 1
    with open(os.path.join(cg, tools[0], "cgroup.procs")) as f:
        pids = f.read().split()
    assert len(pids) == 1
    with open(f"/proc/{pids[0]}/cmdline") as f:
        assert f.read().split("\0")[0] == "sleep"


# Concurrent execs: enough to overlap in the runtime and the daemon, few enough for TCG. Fifty took
# 250-620 s under TCG (docker spawned them over ~100 s; runc init costs each ~1-2 CPU s), and in
# CI, two lanes on a slower host, one exec ran past its 600 s.
N_EXECS = 24


def test_concurrent_execs_each_get_a_cgroup_and_none_leak(containers: Containers) -> None:
    cid = containers.run()
    cg = container_cgroup(cid)

    def one(i: int) -> tuple[int, str, bytes]:
        p = docker("exec", cid, "sh", "-c", f"cat /proc/self/cgroup; echo n={i}", check=False,
                   timeout=600)
        return p.returncode, p.stdout.decode(), p.stderr

    with concurrent.futures.ThreadPoolExecutor(max_workers=N_EXECS) as pool:
        results = list(pool.map(one, range(N_EXECS)))
    assert all(rc == 0 for rc, _, _ in results), [r for r in results if r[0] != 0][:3]
    paths = {out.splitlines()[0] for _, out, _ in results}
    assert len(paths) == N_EXECS, "every exec must have a cgroup of its own"
    assert all(out.splitlines()[1] == f"n={i}" for i, (_, out, _) in enumerate(results))
    wait_for(lambda: not tool_cgroups(cg), timeout=60, what="tool cgroups to be removed")
    wait_for(lambda: len(journal_for(cid)) >= N_EXECS, timeout=60,
             what=f"{N_EXECS} journal entries")
    entries = journal_for(cid)
    assert all(e["exit_code"] == 0 and not e["oom_killed"] for e in entries), entries[:3]


def test_container_limit_bounds_the_sum_and_oom_is_recorded(containers: Containers) -> None:
    cid = containers.run("--memory", "96m", "--memory-swap", "96m")
    cg = container_cgroup(cid)
    with open(os.path.join(cg, "memory.max")) as f:
        assert int(f.read()) == 96 << 20
    # 64 MiB fits; a second concurrent 64 MiB call pushes the sum over the container's limit.
    docker("exec", "-d", cid, "memhog", "64", "20")
    wait_for(lambda: tool_cgroups(cg), what="the first call")
    second = docker("exec", cid, "memhog", "64", check=False)
    assert second.returncode in (0, 137), second
    entries = wait_for(lambda: len(journal_for(cid)) >= 2 and journal_for(cid), timeout=60,
                       what="both calls in the journal")
    # The kernel picks one of the two (either may be the larger) and kills that call whole.
    # Usually that is all; but when the survivor faults again before the victim's pages are
    # uncharged, the kernel starts a second OOM kill (seen once under TCG: kills 18 ms apart).
    killed = [e for e in entries if e["oom_killed"]]
    assert 1 <= len(killed) <= 2, entries
    assert all(e["exit_code"] == 137 and e["signal"] == 9 for e in killed), killed
    assert max(e["memory_peak"] for e in killed) > 16 << 20
    assert all(e["exit_code"] == 0 for e in entries if not e["oom_killed"]), entries
    second_killed = any(e["argv"] == ["memhog", "64"] for e in killed)
    assert (second.returncode == 137) == second_killed, (second, killed)
    # The container's init survived: a tool call is killed, never the container.
    assert docker("exec", cid, "true").returncode == 0
    assert docker("inspect", "-f", "{{.State.Running}}", cid).stdout.strip() == b"true"


def test_exit_status_and_peak_are_recorded(containers: Containers) -> None:
    cid = containers.run()
    rc = docker("exec", cid, "sh", "-c", "memhog 32; exit 7", check=False).returncode
    assert rc == 7
    entry = wait_for(lambda: journal_for(cid), what="the journal entry")[0]
    assert entry["argv"] == ["sh", "-c", "memhog 32; exit 7"]
    assert entry["exit_code"] == 7
    assert entry["memory_peak"] >= 32 << 20
    assert entry["oom_killed"] is False
    assert entry["duration"] > 0


def test_plain_runc_container_is_untouched(containers: Containers) -> None:
    cid = containers.run(runtime="runc")
    cg = cgroup_of(init_pid(cid))
    assert os.path.basename(cg) != "init"
    assert not os.path.exists(os.path.join(cg, "init"))
    out = docker("exec", cid, "cat", "/proc/self/cgroup").stdout.decode()
    assert out.strip() == "0::/"
    assert not tool_cgroups(cg)
    assert not os.path.exists(os.path.join(STATE_DIR, "containers", cid + ".json"))
    assert journal_for(cid) == []
