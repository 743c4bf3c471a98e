"""What execgate tells an agent on stderr: exact wording, shape limits, advice and thresholds."""

from __future__ import annotations

import pytest

from execgate.calls import feedback as fb
from execgate.common import hints
from execgate.common.units import GiB, MiB

TAG = "[execgate] "


def check_shape(msg: str) -> list[str]:
    assert msg.endswith("\n")
    assert msg.isascii()
    lines = msg[:-1].split("\n")
    assert 1 <= len(lines) <= 5
    for line in lines:
        assert line.startswith(TAG)
        assert line.count("[execgate]") == 1
        assert len(line) <= 160
        assert line.isprintable()
    return lines


# --- oom_killed: pinned wording ----------------------------------------------------------------


def test_oom_pytest_in_a_shell() -> None:
    msg = fb.oom_killed(
        int(2.1 * GiB), int(1.8 * GiB), None, ["bash", "-c", "cd /repo && pytest tests/"]
    )
    assert msg == (
        "[execgate] Out of memory: the kernel OOM-killed this call.\n"
        "[execgate] Peak memory 2.1 GiB; available 1.8 GiB.\n"
        "[execgate] Fix: run one test file or package instead of the whole suite"
        " (e.g. `pytest path/to/test_one.py`).\n"
        "[execgate] Or declare AGENT_RESOURCE_HINT=memory:3g so the call starts"
        " only when that much memory is free.\n"
    )
    check_shape(msg)


def test_oom_by_execgate_with_limit() -> None:
    msg = fb.oom_killed(300 * MiB, 200 * MiB, 4 * GiB, ["pip", "install", "torch"], by="execgate")
    assert msg == (
        "[execgate] Out of memory: execgate killed this call as a last resort,"
        " host memory ran out.\n"
        "[execgate] Peak memory 300 MiB; available 200 MiB; container limit 4 GiB.\n"
        "[execgate] Fix: install fewer packages at once, e.g. one or two per `pip install`.\n"
        "[execgate] Or declare AGENT_RESOURCE_HINT=memory:512m so the call starts"
        " only when that much memory is free.\n"
    )
    check_shape(msg)


def test_oom_unknown_numbers_generic_command() -> None:
    msg = fb.oom_killed(None, None, None, ["python", "train.py"])
    assert msg == (
        "[execgate] Out of memory: the kernel OOM-killed this call.\n"
        "[execgate] Peak memory unknown; available unknown.\n"
        "[execgate] Fix: do less per call, e.g. process less data at once"
        " or split it into smaller steps.\n"
        "[execgate] Or declare AGENT_RESOURCE_HINT=memory:<size> (e.g. memory:2g) so the call"
        " starts only when that much memory is free.\n"
    )
    check_shape(msg)


def test_oom_at_the_container_limit_says_a_hint_cannot_help() -> None:
    msg = fb.oom_killed(4 * GiB - MiB, 3 * GiB, 4 * GiB, ["go", "test", "./..."])
    assert msg == (
        "[execgate] Out of memory: the kernel OOM-killed this call.\n"
        "[execgate] Peak memory 4 GiB; available 3 GiB; container limit 4 GiB.\n"
        "[execgate] Fix: run one test file or package instead of the whole suite"
        " (e.g. `go test ./path/to/pkg`).\n"
        "[execgate] A hint cannot help: the call needs more than the container's 4 GiB limit,"
        " which execgate never raises.\n"
    )
    check_shape(msg)
    assert "AGENT_RESOURCE_HINT" not in msg


def test_oom_below_the_limit_still_suggests_a_hint() -> None:
    msg = fb.oom_killed(int(2.5 * GiB), 100 * MiB, 4 * GiB, ["cargo", "test"])
    assert "AGENT_RESOURCE_HINT=memory:3g " in msg
    assert "`cargo test one_test_name`" in msg


@pytest.mark.parametrize("peak", [0, 1, 255 * MiB, GiB, 7 * GiB, 10**15])
@pytest.mark.parametrize("by", ["kernel", "execgate"])
def test_oom_shape_for_any_input(peak: int, by: str) -> None:
    argv = ["sh", "-c", "x" * 5000 + "\x1b[2J\u00e9"]
    check_shape(fb.oom_killed(peak, peak, peak or None, argv, by=by))
    check_shape(fb.oom_killed(peak, None, None, [], by=by))


# --- suggested hint rounding -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("peak", "hint"),
    [
        (0, "256m"),
        (1, "256m"),
        (100 * MiB, "256m"),
        (256 * MiB - 1, "256m"),
        (256 * MiB, "512m"),  # killed at its peak: it needed more than that
        (300 * MiB, "512m"),
        (700 * MiB, "768m"),
        (800 * MiB, "1g"),
        (GiB - 1, "1g"),
        (GiB, "2g"),
        (int(1.1 * GiB), "2g"),
        (int(2.1 * GiB), "3g"),
        (15 * GiB + 1, "16g"),
    ],
)
def test_suggested_hint_rounds_up_to_a_clean_step(peak: int, hint: str) -> None:
    msg = fb.oom_killed(peak, None, None, ["make"])
    assert f"AGENT_RESOURCE_HINT=memory:{hint} so" in msg
    # and the suggestion is itself a valid hint that covers the peak
    parsed = hints.parse(f"memory:{hint}")
    assert parsed.hint is not None and parsed.hint.memory_bytes is not None
    assert parsed.hint.memory_bytes > peak


# --- command classification --------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["pytest"],
        ["pytest", "-x", "tests/"],
        ["/usr/local/bin/pytest", "tests"],
        ["python", "-m", "pytest"],
        ["python3.11", "-m", "unittest", "discover"],
        ["bash", "-c", "cd /repo && pytest tests/"],
        ["bash", "-lc", "source .venv/bin/activate; python -m pytest -q"],
        ["sh", "-c", "CI=1 timeout 600 pytest"],
        ["sh", "-c", "uv run pytest tests"],
        ["tox"],
        ["tox", "-e", "py311"],
        ["npm", "test"],
        ["npm", "run", "test"],
        ["yarn", "run", "test:unit"],
        ["pnpm", "test"],
        ["go", "test", "./..."],
        ["cargo", "test"],
        ["make", "test"],
        ["make", "-j8", "check"],
        ["bash", "-c", "sudo -E make test 2>&1 | tail -50"],
    ],
)
def test_test_runs_are_detected(argv: list[str]) -> None:
    assert fb.classify(argv)[0] == "test"
    assert "one test file or package instead of the whole suite" in fb.oom_killed(
        GiB, GiB, None, argv
    )


@pytest.mark.parametrize(
    ("argv", "tool"),
    [
        (["pip", "install", "-r", "requirements.txt"], "pip"),
        (["pip3", "install", "numpy"], "pip"),
        (["python", "-m", "pip", "install", "."], "pip"),
        (["uv", "pip", "install", "torch"], "pip"),
        (["npm", "install"], "npm"),
        (["npm", "ci"], "npm"),
        (["yarn", "add", "react"], "yarn"),
        (["bash", "-c", "apt-get update && apt-get install -y gcc"], "apt-get"),
        (["apt", "install", "gcc"], "apt"),
    ],
)
def test_installs_are_detected(argv: list[str], tool: str) -> None:
    assert fb.classify(argv) == ("install", tool)
    assert f"one or two per `{tool} install`" in fb.oom_killed(GiB, GiB, None, argv)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["python", "train.py"],
        ["bash", "-c", "cat test.log"],
        ["bash", "-c", "echo 'pytest'"],
        ["go", "build", "./..."],
        ["make"],
        ["npm", "run", "build"],
        ["pip", "list"],
        ["bash", "-c", "unbalanced 'quote"],
        ["ls", "tests/"],
    ],
)
def test_other_commands_get_generic_advice(argv: list[str]) -> None:
    assert fb.classify(argv) == ("other", "")
    assert "Fix: do less per call" in fb.oom_killed(GiB, GiB, None, argv)


# --- one-line messages -------------------------------------------------------------------------


def test_admission_delayed() -> None:
    assert fb.admission_delayed(4.2) == (
        "[execgate] This call waited 4.2 s before starting (host memory pressure);"
        " it was delayed, not hung.\n"
    )
    assert fb.admission_delayed(65, reason="3 calls ahead of it") == (
        "[execgate] This call waited 1 min 5 s before starting (3 calls ahead of it);"
        " it was delayed, not hung.\n"
    )
    assert len(check_shape(fb.admission_delayed(1e9, reason="r" * 500))) == 1


def test_gate_held() -> None:
    assert fb.gate_held(3.0, 10.0) == (
        "[execgate] This call was paused by the memory growth gate for 3.0 s of its 10 s run"
        " (30%) while host memory was short; it was not hung.\n"
    )
    assert "(100%)" in fb.gate_held(5.0, 0.0)
    assert "(100%)" in fb.gate_held(12.0, 10.0)
    assert len(check_shape(fb.gate_held(4000.0, 7000.0))) == 1


def test_hint_ignored() -> None:
    parsed = hints.parse("memory:lots")
    assert parsed.error is not None
    assert fb.hint_ignored("memory:lots", parsed.error) == (
        "[execgate] Ignored AGENT_RESOURCE_HINT='memory:lots': expected low,"
        " medium, high or a size like 512m or 2g; the call ran without a hint.\n"
    )


def test_hint_ignored_stays_one_safe_line_for_hostile_input() -> None:
    junk = "x" * 10_000 + "\x1b[31m\nevil"
    parsed = hints.parse(junk)
    assert parsed.error is not None
    msg = fb.hint_ignored(junk, parsed.error)
    (line,) = check_shape(msg)
    assert line.endswith("; the call ran without a hint.")
    assert "AGENT_RESOURCE_HINT='" + "x" * 40 + "...'" in line
    (line,) = check_shape(fb.hint_ignored("a\nb\x00", "why\nnot \x1b[0m"))
    assert line == (
        "[execgate] Ignored AGENT_RESOURCE_HINT='a\\nb\\x00': why\\nnot \\x1b[0m;"
        " the call ran without a hint."
    )


# --- formatting helpers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (312 * MiB, "312 MiB"),
        (1023 * MiB + 1000 * 1024, "1 GiB"),
        (2 * GiB, "2 GiB"),
        (int(2.1 * GiB), "2.1 GiB"),
        (int(9.97 * GiB), "10 GiB"),
        (1 << 40, "1 TiB"),
        (-5, "0 B"),
    ],
)
def test_fmt_size(n: int, text: str) -> None:
    assert fb.fmt_size(n) == text


@pytest.mark.parametrize(
    ("s", "text"),
    [
        (0, "0.0 s"),
        (0.04, "0.0 s"),
        (4.2, "4.2 s"),
        (9.96, "10 s"),
        (42.4, "42 s"),
        (59.6, "1 min"),
        (65, "1 min 5 s"),
        (3599, "59 min 59 s"),
        (3600, "1 h"),
        (3725, "1 h 2 min"),
        (-1, "0.0 s"),
        (float("nan"), "0.0 s"),
    ],
)
def test_fmt_duration(s: float, text: str) -> None:
    assert fb.fmt_duration(s) == text


# --- thresholds and compose --------------------------------------------------------------------


def test_should_report_delay() -> None:
    assert fb.should_report_delay(2.0) is True
    assert fb.should_report_delay(5.0) is True
    assert fb.should_report_delay(1.99) is False
    assert fb.should_report_delay(0.0) is False
    assert fb.should_report_delay(0.6, threshold_s=0.5) is True
    assert fb.should_report_delay(float("nan")) is False


def test_should_report_hold() -> None:
    assert fb.should_report_hold(2.0, 10.0) is True  # exactly 20%
    assert fb.should_report_hold(1.9, 10.0) is False
    assert fb.should_report_hold(5.0, 10.0, share=0.5) is True
    assert fb.should_report_hold(0.0, 10.0) is False
    assert fb.should_report_hold(1.0, 0.0) is False
    assert fb.should_report_hold(float("nan"), 10.0) is False


def test_compose_joins_for_one_write() -> None:
    a = fb.admission_delayed(3.0)
    b = fb.gate_held(3.0, 10.0)
    out = fb.compose(a, "", b)
    assert out == (a + b).encode("ascii")
    assert fb.compose() == b""
    assert fb.compose("[execgate] no newline") == b"[execgate] no newline\n"
    assert fb.compose("[execgate] caf\u00e9\n") == b"[execgate] caf\\xe9\n"
