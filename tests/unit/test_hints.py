"""AGENT_RESOURCE_HINT grammar, precedence, clamping, wire form and warn-once bookkeeping."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import pytest

from execgate.common import hints
from execgate.common.hints import Hint, HintSizes, ParsedHint
from execgate.common.units import GiB, MiB


def ok(text: str, sizes: HintSizes = hints.DEFAULT_SIZES) -> Hint:
    parsed = hints.parse(text, sizes)
    assert parsed.error is None, parsed.error
    assert parsed.hint is not None
    return parsed.hint


def bad(text: str) -> str:
    parsed = hints.parse(text)
    assert parsed.hint is None
    assert parsed.error
    assert parsed.error.isascii() and "\n" not in parsed.error
    return parsed.error


# --- classes and sizes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size", "cls"),
    [
        ("memory:low", 256 * MiB, "low"),
        ("memory:medium", GiB, "medium"),
        ("memory:high", None, "high"),
        ("mem:low", 256 * MiB, "low"),
        ("mem=high", None, "high"),
        ("MEMORY:HIGH", None, "high"),
    ],
)
def test_memory_classes(text: str, size: int | None, cls: str) -> None:
    h = ok(text)
    assert (h.memory_bytes, h.memory_class) == (size, cls)


def test_class_sizes_are_configurable() -> None:
    sizes = HintSizes(low=64 * MiB, medium=512 * MiB, high=8 * GiB)
    assert ok("memory:low", sizes).memory_bytes == 64 * MiB
    assert ok("memory:medium", sizes).memory_bytes == 512 * MiB
    assert ok("memory:high", sizes).memory_bytes == 8 * GiB


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("4096", 4096),
        ("4096b", 4096),
        ("2k", 2048),
        ("2kb", 2048),
        ("2ki", 2048),
        ("2kib", 2048),
        ("512m", 512 * MiB),
        ("512MB", 512 * MiB),
        ("512Mi", 512 * MiB),
        ("2g", 2 * GiB),
        ("2G", 2 * GiB),
        ("2gb", 2 * GiB),
        ("2Gi", 2 * GiB),
        ("1.5g", 3 * GiB // 2),
        (".5g", GiB // 2),
        ("1.", 1),
    ],
)
def test_sizes_are_binary(value: str, size: int) -> None:
    for form in (f"memory:{value}", f"mem={value}", f"memory={value}", f"mem:{value}"):
        h = ok(form)
        assert h.memory_bytes == size
        assert h.memory_class is None


def test_toolsched_items() -> None:
    h = ok("mem=2g cpu=1.5 io=40 duration=30")
    assert h == Hint(memory_bytes=2 * GiB, cpu=1.5, io_mbps=40.0, duration_s=30.0)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30", 30.0), ("30s", 30.0), ("1.5S", 1.5), ("500ms", 0.5), ("2m", 120.0), (".5m", 30.0)],
)
def test_duration_units(value: str, seconds: float) -> None:
    assert ok(f"duration={value}").duration_s == pytest.approx(seconds)


def test_flags_and_priority() -> None:
    assert ok("idempotent").idempotent is True
    assert ok("IDEMPOTENT").idempotent is True
    assert ok("memory:low").idempotent is False
    assert ok("memory:low").priority == "normal"
    for p in ("low", "normal", "high"):
        assert ok(f"priority:{p}").priority == p
        assert ok(f"priority={p.upper()}").priority == p


@pytest.mark.parametrize(
    "text",
    [
        "memory:2g,cpu=2,idempotent,priority:low",
        "memory:2g cpu=2 idempotent priority:low",
        "memory:2g, cpu=2,\tidempotent ,priority:low",
        "  memory:2g\n cpu=2 ,, idempotent priority:low  ",
        "MEMORY:2G,CPU=2,Idempotent,Priority:LOW",
        "memory : 2g, cpu = 2, idempotent, priority: low",
    ],
)
def test_separators_and_case(text: str) -> None:
    assert ok(text) == Hint(memory_bytes=2 * GiB, cpu=2.0, idempotent=True, priority="low")


def test_agreeing_duplicates_are_fine() -> None:
    assert ok("memory:1g mem=1024m").memory_bytes == GiB
    h = ok("mem=1g memory:medium")  # same bytes; the class is kept
    assert (h.memory_bytes, h.memory_class) == (GiB, "medium")
    assert ok("memory:high,mem=high").memory_class == "high"
    assert ok("cpu=2 cpu=2.0").cpu == 2.0


@pytest.mark.parametrize("text", [None, "", "   ", "\t\n", ",", " , ,"])
def test_empty_is_no_hint_and_no_error(text: str | None) -> None:
    parsed = hints.parse(text)
    assert parsed == ParsedHint(None, None, text or "")


# --- malformed: the whole hint is ignored ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("memory:lots", "'memory:lots': expected low, medium, high or a size like 512m or 2g"),
        ("memory:-5g", "'memory:-5g': size must be positive"),
        ("memory:0", "'memory:0': size must be positive"),
        ("memory:0.1", "'memory:0.1': size must be positive"),
        ("memory:nan", "'memory:nan': expected low, medium, high or a size like 512m or 2g"),
        ("memory:inf", "'memory:inf': expected low, medium, high or a size like 512m or 2g"),
        ("memory:1e9", "'memory:1e9': expected low, medium, high or a size like 512m or 2g"),
        ("memory:2t", "'memory:2t': expected low, medium, high or a size like 512m or 2g"),
        ("memory:99999999999g", "'memory:99999999999g': size is too large"),
        ("memory:", "'memory:': missing value"),
        ("cpu=0", "'cpu=0': cpu must be a positive number"),
        ("cpu=-1", "'cpu=-1': cpu must be positive"),
        ("cpu=nan", "'cpu=nan': cpu must be a positive number"),
        ("cpu=inf", "'cpu=inf': cpu must be a positive number"),
        ("cpu=high", "'cpu=high': cpu must be a positive number"),
        ("io=0.0", "'io=0.0': io must be a positive number"),
        ("duration=0", "'duration=0': duration must be a positive number"),
        ("duration=-3s", "'duration=-3s': duration must be positive"),
        ("duration=1h", "'duration=1h': duration must be seconds, e.g. 30, 30s, 500ms or 2m"),
        ("priority:urgent", "'priority:urgent': priority must be low, normal or high"),
        ("idempotent=yes", "'idempotent=yes': idempotent takes no value"),
        (
            "gpu=1",
            "'gpu=1': unknown item (known: memory, cpu, io, duration, priority, idempotent)",
        ),
        ("high", "'high': unknown item (known: memory, cpu, io, duration, priority, idempotent)"),
        ("memory:low mem=2g", "'mem=2g': conflicts with 'memory:low'"),
        ("memory:high memory:4g", "'memory:4g': conflicts with 'memory:high'"),
        ("memory:low memory:medium", "'memory:medium': conflicts with 'memory:low'"),
        ("priority:low priority:high", "'priority:high': conflicts with 'priority:low'"),
    ],
)
def test_malformed_reason_names_the_item(text: str, reason: str) -> None:
    assert bad(text) == reason


def test_one_bad_item_voids_the_whole_hint() -> None:
    parsed = hints.parse("memory:2g,priority:low,cpu=0")
    assert parsed.hint is None
    assert parsed.error == "'cpu=0': cpu must be a positive number"
    assert parsed.raw == "memory:2g,priority:low,cpu=0"
    assert bad("idempotent memory:lots").startswith("'memory:lots'")


def test_offending_item_is_truncated_in_the_reason() -> None:
    reason = bad("memory:" + "9" * 200 + "x")
    assert reason.startswith("'memory:" + "9" * 33 + "...'")
    assert len(reason) < 120


def test_too_long_is_rejected_outright() -> None:
    junk = "x" * 10_000
    reason = bad(junk)
    assert reason == "too long (10000 chars, max 1024): '" + "x" * 40 + "...'"
    assert hints.parse("memory:low," + " " * 1013).hint is not None  # exactly 1024 is fine
    assert hints.parse("memory:low," + " " * 1014).hint is None


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("mem=1g\x1b[31m", "'mem=1g\\x1b\\x5b31m'"),
        ("memory:low\x00", "'memory:low\\x00'"),
        ("memory:\x7flow", "'memory:\\x7flow'"),
        ("memory:low\u200b", "'memory:low\\u200b'"),
    ],
)
def test_non_printable_is_rejected_and_escaped(text: str, shown: str) -> None:
    assert bad(text) == f"non-printable character in {shown}"


def test_non_ascii_printable_is_an_unknown_item_shown_escaped() -> None:
    assert bad("mémoire:2g").startswith("'m\\xe9moire:2g': unknown item")


def test_parse_never_raises_on_junk() -> None:
    for text in ["=", ":", "==", "memory==2g", "a:b:c", "9" * 1024, "memory:" + "9" * 400]:
        parsed = hints.parse(text)
        assert parsed.hint is None and parsed.error


# --- pick / clamp --------------------------------------------------------------------------------


def test_pick_exec_wins_over_container() -> None:
    exec_env = ["PATH=/bin", "AGENT_RESOURCE_HINT=memory:high"]
    container_env = ["AGENT_RESOURCE_HINT=memory:low"]
    assert hints.pick(exec_env, container_env) == "memory:high"
    assert hints.pick(["PATH=/bin"], container_env) == "memory:low"
    assert hints.pick([], []) is None
    assert hints.pick(["PATH=/bin"], ["HOME=/root"]) is None


def test_pick_last_definition_wins_and_empty_is_a_definition() -> None:
    env = ["AGENT_RESOURCE_HINT=memory:low", "X=1", "AGENT_RESOURCE_HINT=mem=2g"]
    assert hints.pick(env, []) == "mem=2g"  # only the first '=' splits key from value
    assert hints.pick(["AGENT_RESOURCE_HINT="], ["AGENT_RESOURCE_HINT=memory:low"]) == ""


def test_pick_ignores_lookalikes() -> None:
    env = [
        "AGENT_RESOURCE_HINTS=memory:low",
        "agent_resource_hint=memory:low",
        "AGENT_RESOURCE_HINT",
    ]
    assert hints.pick(env, []) is None


def test_clamp_priority() -> None:
    h = Hint(priority="high")
    assert hints.clamp(h, priority_allowed=False, memory_limit=None).priority == "normal"
    assert hints.clamp(h, priority_allowed=True, memory_limit=None).priority == "high"
    low = Hint(priority="low")
    assert hints.clamp(low, priority_allowed=False, memory_limit=None) == low


def test_clamp_memory_never_above_the_container_limit() -> None:
    h = Hint(memory_bytes=8 * GiB, cpu=2.0)
    assert hints.clamp(h, priority_allowed=False, memory_limit=4 * GiB) == Hint(
        memory_bytes=4 * GiB, cpu=2.0
    )
    assert hints.clamp(h, priority_allowed=False, memory_limit=None) == h
    small = Hint(memory_bytes=GiB)
    assert hints.clamp(small, priority_allowed=False, memory_limit=4 * GiB) == small


def test_clamp_unbounded_high_becomes_the_limit_undeclared_stays_undeclared() -> None:
    high = Hint(memory_class="high")
    clamped = hints.clamp(high, priority_allowed=False, memory_limit=2 * GiB)
    assert (clamped.memory_bytes, clamped.memory_class) == (2 * GiB, "high")
    assert hints.clamp(high, priority_allowed=False, memory_limit=None) == high
    assert hints.clamp(Hint(), priority_allowed=False, memory_limit=2 * GiB) == Hint()


# --- wire form -----------------------------------------------------------------------------------


def test_to_dict_from_dict_round_trip_through_json() -> None:
    for h in [
        Hint(),
        ok("memory:high idempotent priority:high"),
        ok("mem=1.5g cpu=0.5 io=12.5 duration=250ms priority:low"),
    ]:
        d = h.to_dict()
        assert Hint.from_dict(json.loads(json.dumps(d))) == h


def test_from_dict_tolerates_missing_and_extra_keys() -> None:
    assert Hint.from_dict({}) == Hint()
    assert Hint.from_dict({"memory_bytes": 5, "future": 1}) == Hint(memory_bytes=5)
    assert Hint.from_dict({"cpu": 2}).cpu == 2.0  # JSON may carry a float as an int


@pytest.mark.parametrize(
    "d",
    [
        {"memory_bytes": "1g"},
        {"memory_bytes": 1.5},
        {"memory_bytes": True},
        {"memory_bytes": 0},
        {"memory_bytes": -1},
        {"memory_class": "huge"},
        {"cpu": "2"},
        {"cpu": True},
        {"cpu": -1.0},
        {"io_mbps": float("nan")},
        {"duration_s": float("inf")},
        {"idempotent": 1},
        {"priority": "urgent"},
        {"priority": None},
    ],
)
def test_from_dict_rejects_wrong_types(d: dict) -> None:
    with pytest.raises(ValueError):
        Hint.from_dict(d)


def test_from_dict_rejects_non_mapping() -> None:
    with pytest.raises(ValueError):
        Hint.from_dict(["memory_bytes", 1])  # type: ignore[arg-type]


# --- should_warn ---------------------------------------------------------------------------------


def test_should_warn_once_per_sandbox_and_value(tmp_path) -> None:
    state = str(tmp_path)
    assert hints.should_warn(state, "sb1", "memory:lots") is True
    assert hints.should_warn(state, "sb1", "memory:lots") is False
    assert hints.should_warn(state, "sb1", "memory:lots") is False
    assert hints.should_warn(state, "sb1", "memory:LOTS") is True  # a distinct value
    assert hints.should_warn(state, "sb2", "memory:lots") is True  # a distinct sandbox
    assert hints.should_warn(state, "sb2", "memory:lots") is False
    assert sorted(os.listdir(tmp_path / "hint-warnings")) == ["sb1", "sb2"]


def test_should_warn_sanitises_sandbox_names(tmp_path) -> None:
    state = str(tmp_path)
    for name in ["../../etc/passwd", "a/b", "..", "", "x" * 500, "caf\u00e9", "a\x00b"]:
        assert hints.should_warn(state, name, "v") is True
        assert hints.should_warn(state, name, "v") is False
    files = os.listdir(tmp_path / "hint-warnings")
    assert len(files) == 7
    assert all("/" not in f and not f.startswith(".") and len(f) < 200 for f in files)
    assert sorted(os.listdir(tmp_path)) == ["hint-warnings"]
    # Distinct names that clean up the same way still get their own file.
    assert hints.should_warn(state, "a_b", "v") is True


def test_should_warn_survives_odd_values(tmp_path) -> None:
    state = str(tmp_path)
    for value in ["", "\ud800", "x" * 100_000, "\n\n"]:
        assert hints.should_warn(state, "sb", value) is True
        assert hints.should_warn(state, "sb", value) is False


def test_should_warn_errs_on_the_side_of_warning(tmp_path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("not a directory")
    assert hints.should_warn(str(blocker), "sb", "v") is True
    assert hints.should_warn(str(blocker), "sb", "v") is True


def test_should_warn_unusable_record_still_warns(tmp_path) -> None:
    (tmp_path / "hint-warnings" / "sb").mkdir(parents=True)  # a directory where the file goes
    assert hints.should_warn(str(tmp_path), "sb", "v") is True
    assert hints.should_warn(str(tmp_path), "sb", "v") is True


def _hammer(args: tuple[str, int]) -> list[bool]:
    state, n = args
    return [hints.should_warn(state, f"sb{i % 3}", f"value-{i % 7}") for i in range(n)]


def test_should_warn_concurrent_processes_never_raise(tmp_path) -> None:
    state = str(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.map(_hammer, [(state, 200)] * 8)
    flat = [r for rs in results for r in rs]
    # 21 distinct (sandbox, value) pairs: each warned at least once, rarely more.
    assert 21 <= sum(flat) <= 21 * 8
    for i in range(21):
        assert hints.should_warn(state, f"sb{i % 3}", f"value-{i % 7}") is False


def test_should_warn_from_separate_interpreters(tmp_path) -> None:
    code = (
        "import sys; from execgate.common import hints; "
        "print(hints.should_warn(sys.argv[1], 'sb', 'memory:lots'))"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    ]
    assert runs == ["True", "False"]
