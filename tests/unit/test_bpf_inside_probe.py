"""bpf/inside_probe.py's mirrors of inside.bpf.c, checked against the C: the event record, the
map keys and values the daemon writes, the enums and the stat slots, program and map names.

The C is parsed (struct fields with their types, in order; C alignment), every field gets its
own value, and the Python side must pack or parse each one at the offset of the field with its
name: swapping two fields of one type in either language fails here, not in the VM."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any

import pytest

from execgate.bpf import inside_probe as probe

C_SRC = probe.SRC.read_text()

# (size, alignment) of the C types these structs use; struct bpf_timer is two u64 (uapi).
_TYPES = {"u32": (4, 4), "s32": (4, 4), "u64": (8, 8), "s64": (8, 8), "char": (1, 1),
          "struct bpf_timer": (16, 8)}
_INTS = {"u32": "I", "s32": "i", "u64": "Q", "s64": "q"}


@dataclass(frozen=True)
class Field:
    name: str
    ctype: str
    offset: int
    size: int


def c_struct(name: str, src: str = C_SRC) -> tuple[list[Field], int]:
    """A struct's fields with their offsets, and its size, laid out as clang does."""
    m = re.search(rf"^struct {name} \{{[^\n]*\n(.*?)^\}};", src, re.S | re.M)
    assert m, f"struct {name} not in inside.bpf.c"
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    fields, offset, align = [], 0, 1
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        d = re.fullmatch(r"(struct \w+|\w+)\s+(\w+)(?:\[(\d+)\])?", decl)
        assert d, f"struct {name}: cannot read {decl!r}"
        ctype, field, count = d.group(1), d.group(2), int(d.group(3) or 1)
        size, a = _TYPES[ctype]
        offset += -offset % a
        fields.append(Field(field, ctype, offset, size * count))
        offset += size * count
        align = max(align, a)
    return fields, offset + -offset % align


def c_map(name: str, src: str = C_SRC) -> dict[str, str]:
    """A map definition's __uint/__type entries (type, max_entries, key, value)."""
    m = re.search(rf"struct \{{([^{{}}]*)\}} {name} SEC\(\"\.maps\"\);", src, re.S)
    assert m, f"map {name} not in inside.bpf.c"
    return dict(re.findall(r"__(?:uint|type)\((\w+), ([^)]+)\)", m.group(1)))


def c_type_size(ctype: str, src: str = C_SRC) -> int:
    if ctype.startswith("struct "):
        return c_struct(ctype.removeprefix("struct "), src)[1]
    arr = re.fullmatch(r"(\w+)\[(\d+)\]", ctype)
    if arr:
        return _TYPES[arr.group(1)][0] * int(arr.group(2))
    return _TYPES[ctype][0]


def c_enum(first: str, src: str = C_SRC) -> dict[str, int]:
    """The enum whose first member is ``first``: member -> value, as C numbers them."""
    m = re.search(rf"enum \{{\s*({first}\b[^}}]*)\}}", src)
    assert m, f"enum {first} not in inside.bpf.c"
    out, value = {}, -1
    for member in (x.strip() for x in m.group(1).split(",") if x.strip()):
        name, _, init = (s.strip() for s in member.partition("="))
        value = int(init) if init else value + 1
        out[name] = value
    return out


def pack_c(fields: list[Field], size: int, values: dict[str, Any]) -> bytes:
    """A record as the kernel writes it: each named field at its C offset."""
    raw = bytearray(size)
    for f in fields:
        v = values.get(f.name, 0)
        if f.ctype in _INTS:
            struct.pack_into("=" + _INTS[f.ctype], raw, f.offset, v)
        elif isinstance(v, bytes):
            raw[f.offset:f.offset + f.size] = v.ljust(f.size, b"\0")
    return bytes(raw)


def unpack_c(fields: list[Field], raw: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        if f.ctype in _INTS:
            out[f.name] = struct.unpack_from("=" + _INTS[f.ctype], raw, f.offset)[0]
        else:
            out[f.name] = raw[f.offset:f.offset + f.size]
    return out


class FakeMap:
    """A map with the C definition's key and value sizes, recording what Python writes."""

    def __init__(self, name: str, src: str = C_SRC) -> None:
        d = c_map(name, src)
        self.key_size, self.value_size = c_type_size(d["key"], src), c_type_size(d["value"], src)
        self.info = type("Info", (), {"value_size": self.value_size})()
        self.data: dict[bytes, bytes] = {}

    def update(self, key: bytes, value: bytes) -> None:
        assert (len(key), len(value)) == (self.key_size, self.value_size)
        self.data[key] = value

    def lookup(self, key: bytes) -> bytes | None:
        assert len(key) == self.key_size
        return self.data.get(key)

    def delete(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None


def _probe(src: str = C_SRC) -> probe.InsideProbe:
    maps = {name: FakeMap(name, src) for name in probe.MAPS if name != "inside_events"}
    return probe.InsideProbe(maps, [], ring=None)  # type: ignore[arg-type, misc]


# -- checks, parameterized by the C source so that the last test can feed them a changed one ----

def check_event(src: str = C_SRC) -> None:
    fields, size = c_struct("event", src)
    assert probe.EVENT.size == size, "struct event and EVENT differ in size"
    values = {f.name: 1000 + i for i, f in enumerate(fields) if f.ctype in _INTS}
    values["comm"] = b"pytest"
    ev = probe.parse(pack_c(fields, size, values))
    assert ev is not None
    named = [f.name for f in fields if f.name != "pad"]
    assert list(ev._fields) == named, "Event's fields are not struct event's, in order"
    for name in named:
        want = "pytest" if name == "comm" else values[name]
        assert getattr(ev, name) == want, f"Event.{name} is not read from struct event.{name}"


def check_agent(src: str = C_SRC) -> None:
    fields, _ = c_struct("agent", src)
    p = _probe(src)
    p.add_agent(7, 3)
    p.add_agent(8, 4, wrapper=True)
    agents = p.maps["inside_agents"].data
    assert unpack_c(fields, agents[struct.pack("=I", 7)]) == {"box": 3, "kind": probe.AGENT}
    assert unpack_c(fields, agents[struct.pack("=I", 8)]) == {"box": 4, "kind": probe.WRAPPER}


def check_call(src: str = C_SRC) -> None:
    fields, size = c_struct("call", src)
    assert fields[0] == Field("timer", "struct bpf_timer", 0, probe._TIMER_SIZE)
    p = _probe(src)
    p.adopt_call(42, 7, 3)
    got = unpack_c(fields, p.maps["inside_calls"].data[struct.pack("=I", 42)])
    assert {k: got[k] for k in ("exec_ns", "parent", "box", "reported", "pad")} == \
        {"exec_ns": 0, "parent": 7, "box": 3, "reported": 1, "pad": 0}
    assert got["comm"] == bytes(16) and got["timer"] == bytes(16)
    assert probe._TIMER_SIZE + probe._CALL_TAIL.size <= size


def check_enums_and_stats(src: str = C_SRC) -> None:
    kinds = c_enum("INSIDE_AGENT", src)
    assert (kinds["INSIDE_AGENT"], kinds["INSIDE_WRAPPER"]) == (probe.AGENT, probe.WRAPPER)
    events = c_enum("EV_CALL", src)
    assert events == {"EV_CALL": probe.EV_CALL, "EV_EXIT": probe.EV_EXIT,
                      "EV_AGENT": probe.EV_AGENT, "EV_AGENT_EXEC": probe.EV_AGENT_EXEC,
                      "EV_AGENT_EXIT": probe.EV_AGENT_EXIT}
    assert f"#define AT_EXEC {probe.AT_EXEC}\t" in src
    stats = c_enum("ST_SHORT", src)
    assert stats.pop("NR_INSIDE_STATS") == len(probe.STATS)
    assert [s.removeprefix("ST_").lower() for s in stats] == list(probe.STATS)
    p = _probe(src)
    for i in stats.values():
        p.maps["inside_stat"].update(struct.pack("=I", i), struct.pack("=Q", 100 + i))
    assert p.stats() == {s.removeprefix("ST_").lower(): 100 + i for s, i in stats.items()}
    cfg = c_enum("CFG_SLICE_NS", src)
    p.set_slice(5_000_000)
    assert p.maps["inside_cfg"].data == {struct.pack("=I", cfg["CFG_SLICE_NS"]):
                                         struct.pack("=Q", 5_000_000)}


# -- the tests ------------------------------------------------------------------------------------

def test_event_record_matches_struct_event() -> None:
    check_event()


def test_agents_map_values_match_struct_agent() -> None:
    check_agent()


def test_adopted_calls_match_struct_call() -> None:
    check_call()


def test_enums_stat_slots_and_cfg_match() -> None:
    check_enums_and_stats()


def test_eager_keys_are_the_maps_comm_keys() -> None:
    p = _probe()
    p.add_eager("a-very-long-program-name")  # FakeMap checks the char[16] key size
    assert list(p.maps["inside_eager"].data) == [b"a-very-long-pro\0"]


def test_program_and_map_names() -> None:
    assert set(re.findall(r"int BPF_PROG\((\w+),", C_SRC)) == set(probe.PROGRAMS)
    assert set(re.findall(r"\} (\w+) SEC\(\"\.maps\"\);", C_SRC)) == set(probe.MAPS)
    assert c_map("inside_events")["type"] == "BPF_MAP_TYPE_RINGBUF"
    assert all(len(name) <= 15 for name in (*probe.MAPS, *probe.PROGRAMS)), \
        "BPF object names are at most 15 characters"


def _swap(src: str, struct_name: str, a: str, b: str) -> str:
    """The source with two fields of a struct declared in the other order."""
    m = re.search(rf"^struct {struct_name} \{{.*?^\}};", src, re.S | re.M)
    assert m
    body = m.group(0)
    la = next(line for line in body.splitlines() if re.search(rf"\b{a}\b", line.split("/*")[0]))
    lb = next(line for line in body.splitlines() if re.search(rf"\b{b}\b", line.split("/*")[0]))
    swapped = body.replace(la, "\0").replace(lb, la).replace("\0", lb)
    return src.replace(body, swapped)


@pytest.mark.parametrize(("check", "struct_name", "a", "b"), [
    (check_event, "event", "tgid", "parent"),  # same type: only the names tell them apart
    (check_event, "event", "ns", "status"),
    (check_agent, "agent", "box", "kind"),
    (check_call, "call", "parent", "box"),
    (check_call, "call", "exec_ns", "reported"),
])
def test_a_reordered_field_is_caught(check: Any, struct_name: str, a: str, b: str) -> None:
    check()  # passes on the real source ...
    swapped = _swap(C_SRC, struct_name, a, b)
    names = [f.name for f in c_struct(struct_name, swapped)[0]]
    assert names.index(a) > names.index(b)  # (the changed source still parses)
    with pytest.raises(AssertionError):
        check(swapped)  # ... and not once two fields change places
