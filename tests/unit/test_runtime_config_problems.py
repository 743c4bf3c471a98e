"""The runtime says its config's problems in runc's log, warnings (a misspelled key) as well as
errors: the e2e test of runc fidelity found the unknown key unsaid once config problems were
split into errors and warnings (issue 20)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]


def test_an_unknown_key_is_a_warning_in_runcs_log(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('runtime = ["/bin/false"]\nno_such_key = 1\n')
    log = tmp_path / "log.json"
    env = dict(os.environ, EXECGATE_CONFIG=str(cfg), PYTHONPATH=str(SRC))
    p = subprocess.run([sys.executable, "-m", "execgate.runtime.main", "--log", str(log),
                        "--log-format", "json", "--root", str(tmp_path), "state", "nope"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1  # /bin/false's answer, passed through
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    ours = [e for e in lines if e["msg"].startswith("execgate: ")]
    assert ours and ours[0]["level"] == "warning" and "no_such_key" in ours[0]["msg"], lines
