"""execgatectl configure|unconfigure for every engine format, on temp dirs: twice each leaves the
files as they were, invalid input is refused untouched, a dry run writes nothing."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from execgate.ctl import configure, configure_containerd, configure_podman, configure_toml
from execgate.ctl.main import main as ctl_main

CONTAINERD_17 = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""
CONTAINERD_2 = """version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    SystemdCgroup = true
"""
# engine -> (the file --config names, the file that is there before, its text)
CASES = {
    "docker": ("daemon.json", "daemon.json", '{"debug": true,  "runtimes": {}}'),
    "containerd": ("config.toml", "config.toml", CONTAINERD_17),
    "crio": ("crio.conf.d/99-execgate.conf", "crio.conf", '[crio]\nlog_dir = "/x"\n'),
    "podman": ("containers.conf.d/99-execgate.conf", "containers.conf", "[engine]\n"),
}


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root but backups (kept on purpose), and every directory."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if ".execgate-backup-" not in f:
                p = Path(dirpath, f)
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


def _ctl(cmd: str, engine: str, config: Path, *args: str) -> int:
    return configure.main([cmd, engine, "--config", str(config), *args])


@pytest.fixture(autouse=True)
def _podman_5(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(configure_podman, "podman_major", lambda: 5)
    monkeypatch.setattr(configure_containerd, "installed_version", lambda: 2)


@pytest.mark.parametrize("engine", sorted(CASES))
@pytest.mark.parametrize("default", [False, True])
def test_configure_twice_unconfigure_twice_leaves_it_as_it_was(
        tmp_path: Path, engine: str, default: bool) -> None:
    target, existing, text = CASES[engine]
    (tmp_path / existing).write_text(text)
    before = _snapshot(tmp_path)
    extra = ["--set-as-default"] if default else []
    assert _ctl("configure", engine, tmp_path / target, *extra) == 0
    configured = _snapshot(tmp_path)
    assert configured != before
    assert _ctl("configure", engine, tmp_path / target, *extra) == 0
    assert _snapshot(tmp_path) == configured, "a second configure changes nothing"
    assert _ctl("unconfigure", engine, tmp_path / target) == 0
    assert _snapshot(tmp_path) == before
    assert _ctl("unconfigure", engine, tmp_path / target) == 0
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("engine", sorted(CASES))
def test_dry_run_writes_nothing(tmp_path: Path, engine: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    target, existing, text = CASES[engine]
    (tmp_path / existing).write_text(text)
    before = _snapshot(tmp_path)
    assert _ctl("configure", engine, tmp_path / target, "--dry-run") == 0
    assert _snapshot(tmp_path) == before and "would write" in capsys.readouterr().out
    assert _ctl("configure", engine, tmp_path / target) == 0
    configured = _snapshot(tmp_path)
    assert _ctl("unconfigure", engine, tmp_path / target, "--dry-run") == 0
    assert _snapshot(tmp_path) == configured


@pytest.mark.parametrize("engine", sorted(CASES))
def test_invalid_input_is_refused_untouched(tmp_path: Path, engine: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    target, existing, _ = CASES[engine]
    (tmp_path / existing).write_text('{"runtimes": [' if engine == "docker" else "[engine\nx=")
    before = _snapshot(tmp_path)
    assert _ctl("configure", engine, tmp_path / target) == 3
    assert _snapshot(tmp_path) == before
    assert "nothing was changed" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["containerd", "crio", "podman"])
def test_someone_elses_drop_in_is_refused(tmp_path: Path, engine: str) -> None:
    target, existing, text = CASES[engine]
    (tmp_path / existing).write_text(text)
    drop_in = "conf.d/" + configure_containerd.DROP_IN.format(name="execgate")
    ours = tmp_path / (drop_in if engine == "containerd" else target)
    ours.parent.mkdir(parents=True, exist_ok=True)
    ours.write_text("# mine\n")
    assert _ctl("configure", engine, tmp_path / target) == 3
    assert ours.read_text() == "# mine\n"
    assert _ctl("unconfigure", engine, tmp_path / target) == 0
    assert ours.read_text() == "# mine\n"


def test_containerd_1x_drop_in_carries_the_cri_section_and_runcs_options(tmp_path: Path) -> None:
    main = tmp_path / "config.toml"
    main.write_text(CONTAINERD_17)
    assert _ctl("configure", "containerd", main) == 0
    doc = tomllib.loads((tmp_path / "conf.d" / "99-execgate.toml").read_text())
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert doc["version"] == 2 and cri["cni"] == {"bin_dir": "/usr/lib/cni"}
    assert cri["containerd"]["runtimes"]["execgate"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"SystemdCgroup": True, "BinaryName": "/usr/local/bin/execgate"}}
    assert "runc" in cri["containerd"]["runtimes"]  # the section is replaced whole in 1.x
    assert tomllib.loads(main.read_text())["imports"] == [f"{tmp_path}/conf.d/*.toml"]


def test_containerd_2x_drop_in_holds_the_entry_alone(tmp_path: Path) -> None:
    main = tmp_path / "config.toml"
    main.write_text(CONTAINERD_2)
    assert _ctl("configure", "containerd", main, "--set-as-default") == 0
    doc = tomllib.loads((tmp_path / "conf.d" / "99-execgate.toml").read_text())
    assert doc == {"version": 3, "plugins": {"io.containerd.cri.v1.runtime": {"containerd": {
        "runtimes": {"execgate": {"runtime_type": "io.containerd.runc.v2", "options": {
            "SystemdCgroup": True, "BinaryName": "/usr/local/bin/execgate"}}},
        "default_runtime_name": "execgate"}}}}


def test_containerd_uses_an_imported_directory_and_refuses_imports_without_one(
        tmp_path: Path) -> None:
    main = tmp_path / "config.toml"
    main.write_text('version = 2\nimports = ["/elsewhere/a.toml", "config.d/*.toml"]\n')
    before = main.read_text()
    assert _ctl("configure", "containerd", main) == 0
    assert main.read_text() == before, "already imports a directory of drop-ins"
    assert (tmp_path / "config.d" / "99-execgate.toml").exists()
    assert _ctl("unconfigure", "containerd", main) == 0
    assert not (tmp_path / "config.d" / "99-execgate.toml").exists()
    main.write_text('version = 2\nimports = ["/elsewhere/a.toml"]\n')
    assert _ctl("configure", "containerd", main) == 3
    main.write_text("[plugins.cri]\nx = 1\n")  # no version: 1, the 1.x-only format
    assert _ctl("configure", "containerd", main) == 3


def test_containerd_without_a_config_makes_one_and_removes_it(tmp_path: Path) -> None:
    main = tmp_path / "config.toml"
    assert _ctl("configure", "containerd", main) == 0
    assert tomllib.loads(main.read_text()) == {"version": 2,
                                               "imports": [f"{tmp_path}/conf.d/*.toml"]}
    assert _ctl("unconfigure", "containerd", main) == 0
    assert not main.exists() and not (tmp_path / "conf.d" / "99-execgate.toml").exists()


def test_an_edit_in_between_is_kept_and_only_ours_removed(tmp_path: Path) -> None:
    main = tmp_path / "config.toml"
    main.write_text(CONTAINERD_17)
    assert _ctl("configure", "containerd", main) == 0
    main.write_text(main.read_text() + "oom_score = -999\n")
    assert _ctl("unconfigure", "containerd", main) == 0
    assert main.read_text() == CONTAINERD_17 + "oom_score = -999\n"
    d = tmp_path / "daemon.json"
    assert _ctl("configure", "docker", d) == 0
    d.write_text(d.read_text().replace("{", '{"debug": true, ', 1))
    assert _ctl("unconfigure", "docker", d) == 0
    assert d.read_text() == '{\n  "debug": true\n}\n'


def test_podman_appends_from_5_and_lists_the_others_before(tmp_path: Path) -> None:
    (tmp_path / "containers.conf").write_text('[engine]\nruntime_supports_json = ["crun"]\n')
    drop = tmp_path / "containers.conf.d" / "99-execgate.conf"
    o = configure.Options(config=str(drop))
    for major, want in ((5, ["execgate", {"append": True}]), (4, ["crun", "execgate"])):
        text = configure_podman.plan(o, undo=False, major=major).edits[0].text
        engine = tomllib.loads(text or "")["engine"]
        assert engine["runtime_supports_json"] == want
        assert engine["runtimes"] == {"execgate": ["/usr/local/bin/execgate"]}


def test_execgatectl_wires_both_commands(tmp_path: Path) -> None:
    drop = tmp_path / "crio.conf.d" / "99-execgate.conf"
    assert ctl_main(["configure", "crio", "--config", str(drop), "--set-as-default"]) == 0
    assert tomllib.loads(drop.read_text())["crio"]["runtime"] == {
        "default_runtime": "execgate",
        "runtimes": {"execgate": {"runtime_path": "/usr/local/bin/execgate",
                                  "runtime_type": "oci"}}}
    assert ctl_main(["unconfigure", "crio", "--config", str(drop)]) == 0
    assert not drop.exists()
    assert ctl_main(["configure", "crio", "--config", str(drop), "--runtime-path", "rel"]) == 2


@pytest.mark.parametrize("doc", [
    {"a": 1, "b": {"c": "x\"y\\\n\u00e9", "d": [1, 2.5, True, ["n"]], "e": {}},
     "f.g": {"h i": {"j": [{"append": True}]}}},
    tomllib.loads(CONTAINERD_17), tomllib.loads(CONTAINERD_2)])
def test_toml_writer_reads_back(doc: dict[str, object]) -> None:
    assert tomllib.loads(configure_toml.dump(doc)) == doc


def test_copies_of_a_private_config_stay_private(tmp_path: Path) -> None:
    """containerd's config may hold registry credentials: the 1.x drop-in (which copies its CRI
    section) and the kept original are as private as config.toml."""
    main = tmp_path / "config.toml"
    main.write_text(CONTAINERD_17)
    main.chmod(0o600)
    assert _ctl("configure", "containerd", main) == 0
    assert (tmp_path / "conf.d" / "99-execgate.toml").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "config.toml.execgate-orig.json").stat().st_mode & 0o777 == 0o600
    assert main.stat().st_mode & 0o777 == 0o600


def test_unconfigure_takes_out_only_the_runtime_it_names(tmp_path: Path) -> None:
    """The original comes back whole only when it means what removing ours leaves: a second
    registration (another name) stays, and a path that is not ours takes nothing out."""
    d = tmp_path / "daemon.json"
    d.write_text("{}")
    assert _ctl("configure", "docker", d, "--set-as-default") == 0
    configured = d.read_text()
    assert _ctl("unconfigure", "docker", d, "--runtime-path", "/nowhere") == 0
    assert d.read_text() == configured
    assert _ctl("configure", "docker", d, "--runtime-name", "eg2") == 0
    assert _ctl("unconfigure", "docker", d) == 0
    assert json.loads(d.read_text()) == {"runtimes": {"eg2": {"path": "/usr/local/bin/execgate"}}}


def test_containerd_keeps_its_import_while_another_name_needs_it(tmp_path: Path) -> None:
    main = tmp_path / "config.toml"
    main.write_text(CONTAINERD_17)
    assert _ctl("configure", "containerd", main) == 0
    assert _ctl("configure", "containerd", main, "--runtime-name", "eg2") == 0
    assert (tmp_path / "conf.d" / "99-eg2.toml").exists()
    assert _ctl("unconfigure", "containerd", main) == 0
    assert "imports" in tomllib.loads(main.read_text()), "99-eg2.toml is still imported"
    assert _ctl("unconfigure", "containerd", main, "--runtime-name", "eg2") == 0
    assert main.read_text() == CONTAINERD_17


@pytest.mark.parametrize("version", [2, 3])
def test_containerd_keeps_the_builtin_runc_a_config_leaves_out(tmp_path: Path,
                                                               version: int) -> None:
    """containerd decodes a CRI section that defines runtimes into a fresh map: without runc in
    it, the default runtime is gone (the VM's containerd 1.7 showed it in `config dump`)."""
    main = tmp_path / "config.toml"
    main.write_text(f"version = {version}\n")
    assert _ctl("configure", "containerd", main) == 0
    doc = tomllib.loads((tmp_path / "conf.d" / "99-execgate.toml").read_text())
    runtimes = doc["plugins"][configure_containerd.CRI[version]]["containerd"]["runtimes"]
    assert runtimes["runc"] == {"runtime_type": "io.containerd.runc.v2"}
    assert runtimes["execgate"]["options"] == {"BinaryName": "/usr/local/bin/execgate"}
