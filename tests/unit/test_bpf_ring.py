"""The BPF ring buffer's consumer walk (bpf/syscall.py), on a synthetic data area, and the
inside probe's event records (bpf/inside_probe.py)."""

from __future__ import annotations

import struct

from execgate.bpf.syscall import ring_records

SIZE = 64  # data area (a power of two), mapped twice after a 16-byte "producer page"
BASE = 16


def _area(records: list[tuple[int, bytes]], start: int) -> tuple[bytearray, int]:
    """Writes (flags, payload) records from position `start`, as the kernel lays them out
    (the second mapping mirrors the first); returns the area and the producer position."""
    area = bytearray(BASE + 2 * SIZE)
    pos = start
    for flags, payload in records:
        rec = struct.pack("=II", len(payload) | flags, 0) + payload
        rec += bytes(-len(rec) % 8)
        for i, b in enumerate(rec):
            at = (pos + i) % SIZE
            area[BASE + at] = area[BASE + SIZE + at] = b
        pos += len(rec)
    return area, pos


def test_records_in_order_discarded_skipped_and_busy_stops() -> None:
    area, prod = _area([(0, b"first"), (1 << 30, b"gone"), (0, b"third!!!"), (1 << 31, b"w")],
                       0)
    out, cons = ring_records(memoryview(area), BASE, SIZE, 0, prod)
    assert out == [b"first", b"third!!!"]
    assert cons == 16 + 16 + 16  # the busy record is left for the next read


def test_a_record_wrapping_the_end_reads_whole() -> None:
    area, prod = _area([(0, b"0123456789abcdef0123")], 48)  # 28 bytes from 48: wraps at 64
    out, cons = ring_records(memoryview(area), BASE, SIZE, 48, prod)
    assert out == [b"0123456789abcdef0123"] and cons == prod == 48 + 32


def test_nothing_new_reads_nothing() -> None:
    area, prod = _area([(0, b"x")], 0)
    assert ring_records(memoryview(area), BASE, SIZE, prod, prod) == ([], prod)


def test_an_inside_event_parses_with_its_program_name() -> None:
    from execgate.bpf import inside_probe as inside

    raw = inside.EVENT.pack(inside.EV_CALL, 42, 7, 3, 123, 0, b"pytest\0\0junk")
    assert inside.parse(raw) == inside.Event(inside.EV_CALL, 42, 7, 3, 123, 0, "pytest")
    assert inside.parse(raw[:10]) is None
