"""`execgatectl status`: its exit status says whether the daemon answered."""

import socket
import threading
from pathlib import Path

import pytest

from execgate.common import protocol
from execgate.ctl import main as ctl

STATUS = {"sandboxes": [], "daemon": {
    "calls": {"admitted": {"normal": 4, "forced": 1}, "finished": {"ok": 2, "oom_killed": 1},
              "unmanaged": 2, "admission_waits": {"count": 5, "sum_s": 2.5}},
    "config": {"restart_needed": ["[daemon] gate"], "last_error": None}}}


def _config(tmp_path: Path, sock: Path) -> str:
    conf = tmp_path / "config.toml"
    conf.write_text(f'socket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\n'
                    f'journal = "{tmp_path / "calls.jsonl"}"\n')
    return str(conf)


def test_unreachable_daemon_exits_non_zero_and_says_so(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    conf = _config(tmp_path, tmp_path / "gone.sock")
    assert ctl.main(["--config", conf, "status"]) == ctl.STATUS_UNREACHABLE
    out = capsys.readouterr()
    assert "read from disk" in out.out  # the disk's view is still shown
    assert "execgated not reachable" in out.err
    assert ctl.main(["--config", conf, "status", "--json"]) == ctl.STATUS_UNREACHABLE


def test_answering_daemon_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def answer() -> None:
        conn, _ = srv.accept()
        with conn:
            protocol.recv_frame(conn)
            conn.sendall(protocol.encode(protocol.reply(True, status=STATUS, pid=7)))

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        assert ctl.main(["--config", _config(tmp_path, path), "status"]) == 0
    finally:
        t.join(5)
        srv.close()
    out = capsys.readouterr()
    assert "execgated pid 7" in out.out and out.err == ""
    assert ("since start: admitted 5 (forced 1, overheld 0; mean wait 0.50 s), finished 3 "
            "(OOM-killed 1), ran unmanaged 2 (no daemon answer: fail open)") in out.out
    assert "config: changed, waiting for a restart: [daemon] gate" in out.out


def test_growth_gate_line_says_why_it_freezes_and_what_it_could_not_hold(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The status line carries the actuator's reason (select_gate's, worded in
    test_daemon_actuator.py) and the tasks the gate could not switch, when there are any."""
    reason = ("sched_ext unavailable (another sched_ext scheduler (scx_rusty) is loaded; "
              "execgate leaves it loaded); using cgroup.freeze")
    ctl.print_daemon({"growth": {"actuator": "freeze", "reason": reason, "held": []}})
    out = capsys.readouterr().out
    assert f"growth gate: freeze ({reason})" in out and "not held" not in out
    ctl.print_daemon({"growth": {"actuator": "sched_ext", "reason": "loaded", "held": [],
                                 "switch_failed": 2}})
    assert "; 2 tasks not held (SCHED_EXT refused)" in capsys.readouterr().out
