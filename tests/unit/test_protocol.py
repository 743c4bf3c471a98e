"""The framing the runtime, execgatectl and the benchmarks share (execgate/common/protocol.py)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from execgate.common import protocol


def _serve(path: str, answers: list[dict[str, object]]) -> threading.Thread:
    """A one-connection daemon: reads one request, then sends the answers in order."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def run() -> None:
        conn, _ = server.accept()
        with conn, server:
            assert protocol.recv_frame(conn)["op"] == "admit"
            for answer in answers:
                conn.sendall(protocol.encode(answer))

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
