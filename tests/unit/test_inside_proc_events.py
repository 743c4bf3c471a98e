"""The proc-connector parser against hand-packed kernel messages (layouts of linux/cn_proc.h)."""

from __future__ import annotations

import struct

from execgate.daemon.inside import proc_events as pe


def _msg(what: int, body: bytes, *, ts: int = 123456789, cpu: int = 1, seq: int = 7,
         idx: int = pe.CN_IDX_PROC, mtype: int = pe.NLMSG_DONE, pad: int = 0) -> bytes:
    event = struct.pack("=IIQ", what, cpu, ts) + body + b"\0" * pad
    cn = struct.pack("=IIIIHH", idx, pe.CN_VAL_PROC, seq, 0, len(event), 0)
    return struct.pack("=IHHII", 16 + len(cn) + len(event), mtype, 0, seq, 0) + cn + event


def fork(ppid: int, ptgid: int, pid: int, tgid: int, **kw: int) -> bytes:
    return _msg(pe.PROC_EVENT_FORK, struct.pack("=iiii", ppid, ptgid, pid, tgid), **kw)


def exec_(pid: int, tgid: int, **kw: int) -> bytes:
    return _msg(pe.PROC_EVENT_EXEC, struct.pack("=ii", pid, tgid), **kw)


def exit_(pid: int, tgid: int, code: int, **kw: int) -> bytes:
    return _msg(pe.PROC_EVENT_EXIT, struct.pack("=iiIIii", pid, tgid, code, 17, 1, 1), **kw)


def test_fork_exec_exit() -> None:
    [f] = pe.parse(fork(100, 100, 200, 200))
    assert (f.what, f.parent_pid, f.parent_tgid, f.pid, f.tgid) == (pe.PROC_EVENT_FORK, 100,
                                                                      100, 200, 200)
    assert f.timestamp_ns == 123456789 and f.cpu == 1 and not f.is_thread
    [e] = pe.parse(exec_(200, 200, ts=5))
    assert (e.what, e.pid, e.tgid, e.timestamp_ns) == (pe.PROC_EVENT_EXEC, 200, 200, 5)
    [x] = pe.parse(exit_(200, 200, 9))  # killed by SIGKILL: a wait status of 9
    assert (x.what, x.tgid, x.exit_code) == (pe.PROC_EVENT_EXIT, 200, 9)


def test_thread_creation_is_marked() -> None:
    [f] = pe.parse(fork(100, 100, 201, 100))
    assert f.is_thread


def test_several_messages_in_one_datagram_and_padding() -> None:
    data = fork(1, 1, 2, 2, pad=4) + exec_(2, 2) + exit_(2, 2, 0)
    assert [e.what for e in pe.parse(data)] == [pe.PROC_EVENT_FORK, pe.PROC_EVENT_EXEC,
                                                 pe.PROC_EVENT_EXIT]


def test_ack_and_ignored_kinds() -> None:
    [ack] = pe.parse(_msg(pe.PROC_EVENT_NONE, struct.pack("=I", 0)))
    assert ack.what == pe.PROC_EVENT_NONE and ack.err == 0
    uid = _msg(pe.PROC_EVENT_UID, struct.pack("=iiII", 5, 5, 0, 0))
    assert list(pe.parse(uid)) == []


def test_malformed_and_foreign_messages_are_skipped() -> None:
    good = exec_(3, 3)
    assert list(pe.parse(good[:20])) == []  # truncated header
    assert list(pe.parse(good[:-4])) == []  # length beyond the datagram
    assert list(pe.parse(exec_(3, 3, idx=2))) == []  # another connector
    assert list(pe.parse(exec_(3, 3, mtype=pe.NLMSG_ERROR))) == []
    bad_len = bytearray(good)
    struct.pack_into("=I", bad_len, 0, 4)  # shorter than a header: stop, do not loop
    assert list(pe.parse(bytes(bad_len))) == []
    short_body = _msg(pe.PROC_EVENT_FORK, struct.pack("=ii", 1, 1))
    assert list(pe.parse(short_body)) == []


def test_control_messages() -> None:
    m = pe.control_message(pe.PROC_CN_MCAST_LISTEN, pe.WANTED, seq=3, port=99)
    length, mtype, _flags, seq, port = struct.unpack_from("=IHHII", m)
    assert (length, mtype, seq, port) == (len(m), pe.NLMSG_DONE, 3, 99)
    idx, val, cseq, _ack, dlen, _f = struct.unpack_from("=IIIIHH", m, 16)
    assert (idx, val, cseq, dlen) == (pe.CN_IDX_PROC, pe.CN_VAL_PROC, 3, 8)
    assert struct.unpack_from("=II", m, 36) == (pe.PROC_CN_MCAST_LISTEN, pe.WANTED)
    legacy = pe.control_message(pe.PROC_CN_MCAST_IGNORE, None, seq=4)
    assert len(legacy) == 40 and struct.unpack_from("=I", legacy, 36) == (pe.PROC_CN_MCAST_IGNORE,)
