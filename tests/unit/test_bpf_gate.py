"""bpf/gate.py and bpf/loader.py without sched_ext: build command, map layouts, the bpf(2)
wrapper on a plain hash map (when this host lets us create one) and the gate's verdicts on it,
on fake sysfs trees. The scheduler itself is tested in tests/e2e (VM)."""

from __future__ import annotations

import os
import re
import struct
import subprocess
from pathlib import Path

import pytest

from execgate.bpf import gate, loader

GATE_PY = Path(__file__).resolve().parents[2] / "execgate" / "bpf" / "gate.py"
BPF_C = GATE_PY.with_name("gate.bpf.c")


# -- the C side and the Python side agree ---------------------------------------------------------

def test_map_names_and_layouts_match_the_bpf_source() -> None:
    src = BPF_C.read_text()
    for full in gate.MAP_NAMES.values():
        assert re.search(rf"\}}\s*{full}\s+SEC\(\"\.maps\"\)", src), full
        assert len(full) <= 15, "BPF object names are at most 15 characters"
    assert f"struct sched_ext_ops {gate.LINK_PIN} = {{" in src
    assert f'.name\t\t= "{gate.SCHED_NAME}"' in src
    assert "LIBBPF_PIN_BY_NAME" in src
    # struct gate_stat: 7 u64 + 2 s64 + 128 + 256 bytes; struct gate_cfg: 2 u64
    body = re.search(r"struct gate_stat \{(.*?)\};", src, re.S).group(1)
    assert len(re.findall(r"^\s*[us]64 ", body, re.M)) == 9
    assert "exit_reason[128]" in body and "exit_msg[256]" in body
    assert gate._STAT.size == 9 * 8 + 128 + 256
    cfg = re.search(r"struct gate_cfg \{(.*?)\};", src, re.S).group(1)
    assert len(re.findall(r"^\s*u64 ", cfg, re.M)) == gate._CFG.size // 8 == 2
    assert f"#define GATE_DENY {gate.GATE_DENY}" in src
    # The BPF side clamps the hold cap below the 30 s watchdog, like the loader.
    assert "HOLD_CAP_MAX_NS\t(25 * NSEC_PER_SEC)" in src and gate.MAX_HOLD_CAP_S == 25.0


def test_stats_parse() -> None:
    raw = gate._STAT.pack(5, 3, 2, 1, 40, 1, 1, 1026, 0, b"runnable task stall", b"x[1] stuck")
    s = gate.GateStats.parse(raw)
    assert (s.parked, s.released, s.capped, s.killed, s.scans, s.held) == (5, 3, 2, 1, 40, 1)
    assert s.exited and s.exit_kind == 1026
    assert s.exit_reason == "runnable task stall" and s.exit_msg == "x[1] stuck"


def test_map_info_parse() -> None:
    raw = struct.pack("=6I16s", 1, 42, 8, 4, 16384, 0, b"execgate_deny") + bytes(40)
    info = gate.MapInfo.parse(raw)
    assert (info.type, info.id, info.key_size, info.value_size) == (1, 42, 8, 4)
    assert info.max_entries == 16384 and info.name == "execgate_deny"


# -- build ----------------------------------------------------------------------------------------

def test_clang_command() -> None:
    cmd = loader.clang_command("g.bpf.c", "g.o", "/inc", clang="clang-19", machine="x86_64")
    assert cmd[0] == "clang-19"
    assert cmd[cmd.index("-target") + 1] == "bpf"
    assert "-g" in cmd and "-O2" in cmd and "-D__TARGET_ARCH_x86" in cmd
    assert cmd[-4:] == ["-c", "g.bpf.c", "-o", "g.o"]
    assert cmd[cmd.index("-I") + 1] == "/inc"
    assert "-D__TARGET_ARCH_arm64" in loader.clang_command("a", "b", "c", machine="aarch64")
    with pytest.raises(gate.GateUnavailable):
        loader.clang_command("a", "b", "c", machine="vax")


def test_build_without_btf_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(gate.GateUnavailable):
        gate.build(tmp_path / "out", btf=str(tmp_path / "no-btf"))


def test_build_sh_runs_gate_build_from_anywhere(tmp_path: Path) -> None:
    """build.sh finds the package beside itself, whatever the caller's directory and path."""
    sh = GATE_PY.with_name("build.sh")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(sh), "--help"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "build [-h] [--force] [out_dir]" in out.stdout, out.stderr


# -- kernel state from sysfs ----------------------------------------------------------------------

def test_state_and_scheduler_name(tmp_path: Path) -> None:
    sysfs = tmp_path / "sched_ext"
    assert gate.state(str(sysfs)) == "unsupported"
    sysfs.mkdir()
    (sysfs / "state").write_text("disabled\n")
    assert gate.state(str(sysfs)) == "disabled"
    assert gate.scheduler_name(str(sysfs)) is None
    (sysfs / "state").write_text("enabled\n")
    (sysfs / "root").mkdir()
    (sysfs / "root" / "ops").write_text("execgate\n")
    assert gate.state(str(sysfs)) == "enabled"
    assert gate.scheduler_name(str(sysfs)) == "execgate"
    assert gate.wait_state({"disabled"}, 0.1, str(sysfs)) == "enabled"


# -- the bpf(2) wrapper on a real (plain) hash map -------------------------------------------------

def _hash_map(key_size: int, value_size: int, entries: int = 64) -> int:
    # BPF_MAP_CREATE (0): map_type, key_size, value_size, max_entries, map_flags
    try:
        return gate._syscall_bpf(0, gate._attr("=5I", 1, key_size, value_size, entries, 0))
    except OSError as e:
        pytest.skip(f"cannot create BPF maps here: {e}")


def test_bpf_map_roundtrip() -> None:
    m = gate.BpfMap(_hash_map(8, 4))
    try:
        assert (m.info.key_size, m.info.value_size, m.info.max_entries) == (8, 4, 64)
        k = struct.pack("=Q", 777)
        assert m.lookup(k) is None
        m.update(k, struct.pack("=I", 1))
        assert m.lookup(k) == struct.pack("=I", 1)
        for i in range(5):
            m.update(struct.pack("=Q", i), struct.pack("=I", 1))
        assert sorted(struct.unpack("=Q", x)[0] for x in m.iter_keys()) == [0, 1, 2, 3, 4, 777]
        assert m.delete(k) and not m.delete(k)
        assert gate._clear_map(m) == 5
        assert list(m.iter_keys()) == []
        with pytest.raises(ValueError):
            m.update(b"short", struct.pack("=I", 1))
    finally:
        m.close()


def test_gate_set_and_clear_on_plain_maps(tmp_path: Path) -> None:
    """Gate's verdict logic against stand-in maps: deny = entry, allow = no entry."""
    maps = {"deny": gate.BpfMap(_hash_map(8, 4)), "cfg": gate.BpfMap(_hash_map(4, 16, 1)),
            "stat": gate.BpfMap(_hash_map(4, gate._STAT.size, 1))}
    root = tmp_path / "cg"
    (root / "tool-a" / "sub").mkdir(parents=True)
    g = gate.Gate(str(tmp_path / "pins"), maps, cgroup_root=str(root),
                  sysfs=str(tmp_path / "no-scx"))
    try:
        a = os.stat(root / "tool-a").st_ino
        assert g.set("tool-a", allow=False)
        assert g.denied() == [a]
        assert g.set(root / "tool-a" / "sub", allow=False)
        assert len(g.denied()) == 2
        assert g.set("tool-a", allow=True) and not g.set("tool-a", allow=True)
        # a denied cgroup that is removed before it is allowed: the cached id is used
        (root / "tool-a" / "sub").rmdir()
        assert g.set("tool-a/sub", allow=True)
        assert g.denied() == []
        assert not g.set("gone", allow=False)  # the call ended meanwhile
        with pytest.raises(ValueError):
            g.set(str(root), allow=False)  # the root would hold everything
        g.set(999, allow=False)
        assert g.clear() == 1 and g.denied() == []
        assert not g.attached()  # no sched_ext here
        g.configure(hold_cap_s=5, scan_ms=20)
        cfg = maps["cfg"].lookup(struct.pack("=I", 0))
        assert cfg == gate._CFG.pack(5_000_000_000, 20_000_000)
        with pytest.raises(ValueError):
            g.configure(hold_cap_s=30)  # over the watchdog
    finally:
        assert g.unload() and g.unload()  # twice is fine
    with pytest.raises(gate.GateError):
        g.set("tool-a", allow=False)


# -- load ------------------------------------------------------------------------------------------

def test_load_refuses_without_sched_ext_or_when_busy(tmp_path: Path) -> None:
    with pytest.raises(gate.GateUnavailable):
        gate.load(tmp_path / "x.o", str(tmp_path / "pins"), sysfs=str(tmp_path / "none"))
    sysfs = tmp_path / "sched_ext"
    sysfs.mkdir()
    (sysfs / "state").write_text("enabled\n")
    with pytest.raises(gate.GateBusy):
        gate.load(tmp_path / "x.o", str(tmp_path / "pins"), sysfs=str(sysfs))
