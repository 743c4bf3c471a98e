"""Docker behaves with `--runtime execgate` exactly as with runc."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time

import pytest
from conftest import (
    Containers,
    container_cgroup,
    docker,
    journal_for,
    on_terminal,
    tool_cgroups,
    wait_for,
)

RUNTIMES = ("runc", "execgate")


def _pair(containers: Containers, *args: str, cmd: tuple[str, ...] = ("sleep", "inf")
          ) -> dict[str, str]:
    return {rt: containers.run(*args, runtime=rt, cmd=cmd) for rt in RUNTIMES}


def _state(cid: str) -> dict[str, object]:
    s = json.loads(docker("inspect", "-f", "{{json .State}}", cid).stdout)
    return {k: s[k] for k in ("Status", "Running", "Paused", "ExitCode", "OOMKilled")}


def test_exec_output_and_exit_codes_match(containers: Containers) -> None:
    pair = _pair(containers)
    cmds = [
        ["echo", "hello"],
        ["sh", "-c", "echo out; echo err >&2; exit 3"],
        ["sh", "-c", "seq 1 20000"],
        ["nonexistent-command"],
        ["sh", "-c", "kill -9 $$"],
    ]
    for cmd in cmds:
        got = {rt: docker("exec", cid, *cmd, check=False) for rt, cid in pair.items()}
        assert got["execgate"].returncode == got["runc"].returncode, cmd
        assert got["execgate"].stdout == got["runc"].stdout, cmd
        if cmd[0] != "nonexistent-command":  # the error text names the container id
            assert got["execgate"].stderr == got["runc"].stderr, cmd


def test_an_exec_that_leaves_a_background_process_returns_as_with_runc(
        containers: Containers) -> None:
    """Issue 21, item 7: the exec returns when its own process exits, not when what it left
    in the background (`cmd &`) does; that one still holds the call's cgroup, and the call is
    journaled once it ends."""

    pair = _pair(containers)
    took = {}
    for rt, cid in pair.items():
        t0 = time.monotonic()
        p = docker("exec", cid, "sh", "-c", "sleep 40 >/dev/null 2>&1 & echo started",
                   timeout=60)
        took[rt] = time.monotonic() - t0
        assert p.stdout == b"started\n", rt
    assert took["execgate"] < took["runc"] + 10, took  # was the background's 40 s
    cg = container_cgroup(pair["execgate"])
    assert tool_cgroups(cg), "the background process holds the call's cgroup"
    wait_for(lambda: [e for e in journal_for(pair["execgate"]) if "echo started" in
                      " ".join(e.get("argv") or [])], timeout=120, what="the journal line")
    wait_for(lambda: not tool_cgroups(cg), what="its cgroup removed (after its line)")


def test_exec_with_stdin(containers: Containers) -> None:
    data = os.urandom(1 << 20).hex().encode()
    for cid in _pair(containers).values():
        p = docker("exec", "-i", cid, "sh", "-c", "cat | md5sum", input=data)
        assert p.stdout.split()[0].decode() == hashlib.md5(data).hexdigest()


def test_exec_with_tty(containers: Containers) -> None:
    for cid in _pair(containers).values():
        rc, out = on_terminal(["docker", "exec", "-it", cid, "sh"],
                              b"tty; stty size; echo marker-$((6*7)); exit 5\n")
        assert rc == 5, out
        assert b"/dev/pts/" in out
        assert b"marker-42" in out
    # -t without -i, output only
    for cid in _pair(containers).values():
        p = docker("exec", "-t", cid, "echo", "tty-out")
        assert p.stdout == b"tty-out\r\n"


def test_tty_output_on_a_terminal_is_runcs(containers: Containers) -> None:
    """Byte for byte what runc gives a person at a terminal. (With -t alone the client leaves
    its terminal cooked, so runc's own output shows b"hi\r\r\n" there; -it makes it raw.)"""
    pair = _pair(containers)
    for flags in (["-t"], ["-it"]):
        seen = {rt: on_terminal(["docker", "exec", *flags, cid, "echo", "hi"])
                for rt, cid in pair.items()}
        assert seen["execgate"] == seen["runc"], (flags, seen)
        assert seen["runc"][0] == 0 and seen["runc"][1].startswith(b"hi\r"), (flags, seen)


def test_stop_kill_rm_restart(containers: Containers) -> None:
    pair = _pair(containers, cmd=("sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.2; done"))
    for cid in pair.values():
        docker("stop", "-t", "20", cid)
    assert _state(pair["execgate"]) == _state(pair["runc"])
    assert _state(pair["execgate"])["ExitCode"] == 0
    for cid in pair.values():
        docker("restart", "-t", "2", cid)
    assert _state(pair["execgate"]) == _state(pair["runc"])
    assert _state(pair["execgate"])["Running"] is True
    # After a restart the new init is managed again and execs still get their cgroups.
    cg = container_cgroup(pair["execgate"])
    assert os.path.isdir(os.path.join(cg, "init"))
    out = docker("exec", pair["execgate"], "cat", "/proc/self/cgroup").stdout
    assert out.startswith(b"0::/tool-")
    for cid in pair.values():
        docker("kill", cid)
    wait_for(lambda: all(not _state(c)["Running"] for c in pair.values()), what="kill")
    assert _state(pair["execgate"]) == _state(pair["runc"])
    pair = _pair(containers)
    for cid in pair.values():
        docker("rm", "-f", cid)
        assert docker("inspect", cid, check=False).returncode != 0


def test_pause_unpause(containers: Containers) -> None:
    ticker = "while :; do date +%s%N > /tmp/tick; sleep 0.1; done"
    pair = _pair(containers, cmd=("sh", "-c", ticker))
    for cid in pair.values():
        docker("pause", cid)
    assert _state(pair["execgate"]) == _state(pair["runc"])
    assert _state(pair["execgate"])["Paused"] is True
    cg = container_cgroup(pair["execgate"])
    with open(os.path.join(cg, "cgroup.events")) as f:
        assert "frozen 1" in f.read()
    for cid in pair.values():
        docker("unpause", cid)
    assert _state(pair["execgate"]) == _state(pair["runc"])
    for cid in pair.values():
        assert docker("exec", cid, "cat", "/tmp/tick").returncode == 0


def test_update_memory(containers: Containers) -> None:
    pair = _pair(containers, "--memory", "256m", "--memory-swap", "512m")
    for cid in pair.values():
        docker("update", "--memory", "128m", "--memory-swap", "256m", cid)
    for rt, cid in pair.items():
        cg = container_cgroup(cid)
        with open(os.path.join(cg, "memory.max")) as f:
            assert int(f.read()) == 128 << 20, rt
        assert json.loads(docker("inspect", "-f", "{{json .HostConfig.Memory}}", cid).stdout) \
            == 128 << 20


def test_top_and_stats(containers: Containers) -> None:
    pair = _pair(containers)
    for cid in pair.values():
        docker("exec", "-d", cid, "sleep", "60")
    wait_for(lambda: tool_cgroups(container_cgroup(pair["execgate"])), what="the exec")
    tops = {rt: [line.split()[-1] for line in
                 docker("top", cid, "-o", "pid,comm").stdout.decode().splitlines()[1:]]
            for rt, cid in pair.items()}
    assert sorted(tops["execgate"]) == sorted(tops["runc"])
    assert tops["execgate"].count("sleep") == 2  # init and the exec, across init/ and tool-*
    for rt, cid in pair.items():
        p = docker("stats", "--no-stream", "--format", "{{json .}}", cid)
        stats = json.loads(p.stdout)
        assert stats["MemUsage"] and not stats["MemUsage"].startswith("0B"), (rt, stats)
        assert stats["PIDs"] == "2", (rt, stats)


@pytest.mark.parametrize("rt", RUNTIMES)
def test_runtime_version_ends_with_runcs_own(rt: str) -> None:
    """`execgate --version` names execgate's version and the real runtime, then prints runc's
    own lines unchanged (issue 20): dockerd reads the last `version` line, runc's."""
    real = subprocess.run(["runc", "--version"], capture_output=True)
    ours = subprocess.run(["/usr/local/bin/execgate" if rt == "execgate" else "runc",
                           "--version"], capture_output=True)
    assert ours.stderr == b"" and ours.returncode == 0, ours
    assert ours.stdout.endswith(real.stdout), ours.stdout
    if rt == "execgate":
        head = ours.stdout[:-len(real.stdout)].decode().splitlines()
        assert head[0].startswith("execgate version "), head
        assert head[1].startswith("real runtime: "), head
    else:
        assert ours.stdout == real.stdout
