"""The probes' pure logic: what the kernel's tracepoint offers, attribution of a cgroup path to
a sandbox and call, fault rates, config, and the daemon running on when probes cannot load.
(The probes themselves run in the VM: tests/e2e/test_bpf_probes.py.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

from execgate.bpf import probes
from execgate.common import config
from execgate.daemon import settings as settings_mod
from execgate.daemon.events import EventBus
from execgate.daemon.probe_monitor import Owner, ProbeMonitor, attribute, fault_view

# oom:mark_victim as the VM's 7.3.4 kernel has it (6.8+).
MARK_VICTIM = """name: mark_victim
ID: 574
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;
\tfield:unsigned long total_vm;\toffset:16;\tsize:8;\tsigned:0;
\tfield:unsigned long anon_rss;\toffset:24;\tsize:8;\tsigned:0;
\tfield:unsigned long file_rss;\toffset:32;\tsize:8;\tsigned:0;
\tfield:unsigned long shmem_rss;\toffset:40;\tsize:8;\tsigned:0;
\tfield:uid_t uid;\toffset:48;\tsize:4;\tsigned:0;
\tfield:unsigned long pgtables;\toffset:56;\tsize:8;\tsigned:0;
\tfield:short oom_score_adj;\toffset:64;\tsize:2;\tsigned:1;

print fmt: "pid=%d comm=%s"
"""

OLD_MARK_VICTIM = "format:\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n" \
                  "\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n"


def test_parse_format_and_defines() -> None:
    fields = probes.parse_format(MARK_VICTIM)
    assert list(fields)[:3] == ["pid", "comm", "total_vm"]
    assert "common_pid" not in fields and fields["comm"].startswith("__data_loc")
    assert probes.raw_victim_supported(fields)
    d = probes.defines(fields, raw_victim=True, faults=True)
    assert "#define HAS_anon_rss 1" in d and "#define HAS_comm 1" in d
    assert d[-2:] == ["#define RAW_VICTIM 1", "#define FAULTS 1"]


def test_old_kernel_has_only_the_pid() -> None:
    fields = probes.parse_format(OLD_MARK_VICTIM)
    assert fields == {"pid": "int pid"}
    assert not probes.raw_victim_supported(fields)
    assert probes.defines(fields, raw_victim=False, faults=False) == []
    # a fixed-size comm array is not the __data_loc string the probe reads
    assert probes.defines({"comm": "char comm[16]"}, raw_victim=False, faults=False) == []


def test_the_bcc_source_knows_every_define() -> None:
    src = probes.SRC.read_text()
    for name in probes.OOM_FIELDS:
        assert f"HAS_{name}" in src
    assert "RAW_VICTIM" in src and "FAULTS" in src


def test_attribute_by_path() -> None:
    box = "/sys/fs/cgroup/system.slice/docker-abc.scope"
    calls = [("tool-1", "sb", "abc", f"{box}/tool-1")]
    boxes = [("abc", "sb", box), ("def", "def", "/sys/fs/cgroup/x/docker-def.scope")]
    assert attribute(f"{box}/tool-1", calls, boxes) == Owner("abc", "sb", "tool-1")
    assert attribute(f"{box}/tool-1/sub", calls, boxes) == Owner("abc", "sb", "tool-1")
    # a call the daemon never saw (ran unmanaged, or ended before it was indexed)
    assert attribute(f"{box}/tool-9", calls, boxes) == Owner("abc", "sb", "tool-9")
    # the sandbox's own processes: no call
    assert attribute(f"{box}/init", calls, boxes) == Owner("abc", "sb", None)
    # not a prefix match on a sibling name
    assert attribute(f"{box}x/tool-1", [], boxes) == Owner(None, None, None)
    assert attribute(None, calls, boxes) == Owner(None, None, None)


def test_fault_view_rates() -> None:
    first = fault_view(None, 100, 7, 0.1)
    assert first == {"count": 100, "rate": 0.0, "peak_10ms": 7}
    assert fault_view(first, 600, 40, 0.1)["rate"] == 5000.0
    assert fault_view(first, 50, 0, 0.1)["rate"] == 0.0  # a recycled id never goes negative


def test_wall_us_is_now_for_now() -> None:
    assert abs(probes.wall_us(time.monotonic_ns()) - time.time_ns() // 1000) < 50_000


def test_resolve_cgroup_by_proc_and_index() -> None:
    own = probes.own_cgroup(pid=os.getpid())
    assert own is not None
    path, how = probes.resolve_cgroup(0, os.getpid())
    assert (path, how) == (own, "proc")
    assert probes.resolve_cgroup(42, os.getpid(), lambda cid: "/x" if cid == 42 else None) == \
        ("/x", "index")


def _settings(tmp_path: Path, text: str) -> tuple[settings_mod.Settings, list[str]]:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return settings_mod.load(config.load(str(p)))


def test_probes_config(tmp_path: Path) -> None:
    s, errors = _settings(tmp_path, "[daemon]\n")
    assert s.daemon.probes == "auto" and not errors
    assert _settings(tmp_path, "[daemon]\nprobes = true\n")[0].daemon.probes == "on"
    assert _settings(tmp_path, "[daemon]\nprobes = false\n")[0].daemon.probes == "off"
    s, errors = _settings(tmp_path, '[daemon]\nprobes = "maybe"\n')
    assert s.daemon.probes == "auto" and any("probes" in e for e in errors)


def test_daemon_runs_on_when_probes_cannot_load(tmp_path: Path) -> None:
    def no_bcc() -> probes.Probes:
        raise probes.ProbesUnavailable("bcc not importable (test)")

    mon = ProbeMonitor("auto", EventBus(), str(tmp_path),
                       runner_factory=lambda known: probes.ProbeRunner(known, loader=no_bcc))
    mon.start()
    deadline = time.monotonic() + 5
    while mon.snapshot()["state"] == "loading" and time.monotonic() < deadline:
        time.sleep(0.01)
    mon.step({})
    snap = mon.snapshot()
    assert snap["state"] == "unavailable" and "bcc" in snap["reason"]
    mon.stop()
    off = ProbeMonitor("off", EventBus(), str(tmp_path))
    off.start()
    off.step({})
    assert off.snapshot()["state"] == "off"
