"""The VM test bed's edits of the shipped config (tests/vm/guest-run.sh) leave valid TOML with
the values the suite relies on. A second `gate =` line they once inserted made the file
invalid once packaging/config.toml set every key: the daemon ran on its defaults (sched_ext,
probes on) and bench.replay refused to start, and nothing on the host noticed."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = "/etc/execgate/config.toml"


def test_guest_run_edits_leave_valid_toml_with_freeze_and_no_probes(tmp_path: Path) -> None:
    script = (ROOT / "tests" / "vm" / "guest-run.sh").read_text()
    # Each `sed -i ... /etc/execgate/config.toml` command (a trailing backslash continues it).
    joined = script.replace("\\\n", " ")
    edits = [line.strip() for line in joined.splitlines()
             if line.strip().startswith("sed -i") and TARGET in line]
    assert len(edits) >= 2, edits
    conf = tmp_path / "config.toml"
    shutil.copy(ROOT / "packaging" / "config.toml", conf)
    for cmd in edits:
        subprocess.run(["bash", "-c", cmd.replace(TARGET, str(conf))], check=True)
    data = tomllib.loads(conf.read_text())
    assert data["daemon"]["gate"] == "freeze"
    assert data["daemon"]["probes"] is False
    assert data["daemon_timeout_ms"] == 2000
    assert len(re.findall(r"(?m)^gate = ", conf.read_text())) == 1
