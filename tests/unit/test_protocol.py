"""The framing the runtime, execgatectl and the benchmarks share (execgate/common/protocol.py)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from execgate.common import protocol
from execgate.oci.runclog import RuncLog


def _serve(path: str, answers: list[dict[str, object]], every_s: float | None = None
           ) -> threading.Thread:
    """A one-connection daemon: reads one request, then sends the answers in order (with
    `every_s`, a byte every every_s seconds: a trickling daemon)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def run() -> None:
        conn, _ = server.accept()
        with conn, server:
            assert protocol.recv_frame(conn)["op"] in ("admit", "start_sandbox")
            data = b"".join(protocol.encode(a) for a in answers)
            chunks = [data] if every_s is None else [bytes([b]) for b in data]
            for chunk in chunks:
                try:
                    conn.sendall(chunk)
                except OSError:
                    return
                time.sleep(every_s or 0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_client_reads_frames_in_order(tmp_path: Path) -> None:
    path = str(tmp_path / "d.sock")
    thread = _serve(path, [protocol.reply(True, queued=True), protocol.reply(True, admitted=True)])
    with protocol.Client(path, 2.0) as daemon:
        daemon.send(protocol.request("admit", call="tool-1"))
        assert daemon.recv()["queued"] and daemon.recv()["admitted"]
        with pytest.raises(protocol.ProtocolError, match="closed mid-frame"):
            daemon.recv()
    thread.join(2)


def test_an_answer_of_another_version_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "d.sock")
    thread = _serve(path, [{"v": protocol.VERSION + 1, "ok": True}])
    with pytest.raises(protocol.ProtocolError, match="speaks protocol v2"):
        protocol.call(path, protocol.request("admit"), timeout=2.0)
    thread.join(2)


@pytest.mark.parametrize("body", [
    b"\x81\x91\x01\x02",  # {[1]: 2}: a map keyed by a list
    b"\x81\x81\x01\x02\x03",  # {{1: 2}: 3}: keyed by a map
    b"\x82\xa2op\xa4ping\x81\x90\xc0\x01",  # a list key one level down
])
def test_a_map_no_dict_can_hold_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(protocol.ProtocolError, match="undecodable frame: a map key"):
        protocol.decode_body(body)


def test_a_trickling_daemon_cannot_stretch_the_runtime_budget(tmp_path: Path) -> None:
    """200 ms is the whole exchange's, up to `queued`, not each read's (issue 21, item 8)."""
    from execgate.runtime import admit

    path = str(tmp_path / "d.sock")
    queued = protocol.reply(True, queued=True, queue="light", max_wait_s=30.0)
    thread = _serve(path, [queued, protocol.reply(True, admitted=True)], every_s=0.02)
    log = RuncLog(str(tmp_path / "log"), "json")
    t0 = time.monotonic()
    answer, why = admit.request(path, 0.2, {"call": "tool-1"}, log)  # runs unmanaged
    assert answer is None and why.startswith("daemon unavailable after 0.2"), why
    assert time.monotonic() - t0 < 0.5  # the frames would take > 1 s
    assert "daemon unavailable" in (tmp_path / "log").read_text()
    thread.join(5)


def test_a_call_whose_daemon_was_lost_by_the_front_is_not_asked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The front waited on `queued` and the daemon died: the runtime runs the call unmanaged
    at once, though a (restarted) daemon answers on the socket."""
    from execgate.common import frontconf
    from execgate.runtime import admit

    path = str(tmp_path / "d.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    monkeypatch.setenv(frontconf.DAEMON_LOST, "1")
    log = RuncLog(str(tmp_path / "log"), "json")
    assert admit.request(path, 0.2, {"call": "tool-1"}, log) == (
        None, "the daemon went away or fell silent while the call waited")
    server.settimeout(0.1)
    with pytest.raises(TimeoutError):
        server.accept()  # never asked
    server.close()
    assert "went away or fell silent while the call waited" in (tmp_path / "log").read_text()


def test_a_trickling_daemon_cannot_stretch_a_create_budget(tmp_path: Path) -> None:
    from execgate.runtime import start_admit

    path = str(tmp_path / "d.sock")
    thread = _serve(path, [protocol.reply(True, queued=True, max_wait_s="x")], every_s=0.02)
    t0 = time.monotonic()
    answer, why = start_admit.ask(path, 0.2, {"sandbox": "box", "image": "img"})
    assert answer is None and "daemon unavailable" in why
    assert time.monotonic() - t0 < 0.5
    thread.join(5)


def test_a_one_shot_call_is_bounded_as_a_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "d.sock")
    thread = _serve(path, [protocol.reply(True, pid=1)], every_s=0.02)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        protocol.call(path, protocol.request("admit"), timeout=0.2)
    assert time.monotonic() - t0 < 0.5
    thread.join(5)


def test_a_lone_surrogate_goes_out_escaped_and_the_unencodable_is_a_protocol_error() -> None:
    """A process spec's JSON may hold "\\ud800": an argv or a journal entry with it must still
    reach the daemon and `execgatectl status` (issue 21, item 5)."""
    frame = protocol.encode({"v": 1, "argv": ["ls", "x\ud800"]})
    assert protocol.decode_body(frame[4:])["argv"] == ["ls", "x\\ud800"]
    with pytest.raises(protocol.ProtocolError, match="unencodable"):
        protocol.encode({"v": 1, "n": 2**64})
