"""Demand estimate (ToolSched §3.2–3.3): command classes, declared-hint GM correction, history."""

from __future__ import annotations

import math

import pytest

from execgate.common.units import GiB, MiB
from execgate.policy.estimate import (
    CallInfo,
    Demand,
    EstimateConfig,
    Estimator,
    HistoryEstimator,
    Outcome,
    classify_command,
)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # test
        (["pytest", "-q"], "test"),
        (["python", "-m", "pytest", "tests"], "test"),
        (["/usr/bin/python3.11", "-u", "-m", "pytest"], "test"),
        (["tox", "-e", "py311"], "test"),
        (["go", "test", "./..."], "test"),
        (["cargo", "test", "--release"], "test"),
        (["npm", "test"], "test"),
        (["npm", "run", "test:unit"], "test"),
        (["make", "test"], "test"),
        (["make", "-j8", "check"], "test"),
        # build_install
        (["pip", "install", "-r", "requirements.txt"], "build_install"),
        (["python3", "-m", "pip", "install", "requests"], "build_install"),
        (["npm", "install"], "build_install"),
        (["apt-get", "-y", "install", "gcc"], "build_install"),
        (["cargo", "build"], "build_install"),
        (["make"], "build_install"),
        (["make", "-j8", "all"], "build_install"),
        (["gcc", "-O2", "main.c"], "build_install"),
        (["clang-17", "main.c"], "build_install"),
        # git
        (["git", "status"], "git"),
        (["/usr/bin/git", "clone", "https://example.com/r.git"], "git"),
        # light
        (["grep", "-rn", "TODO", "."], "light"),
        (["rg", "foo"], "light"),
        (["ls", "-la"], "light"),
        (["cat", "README.md"], "light"),
        (["find", ".", "-name", "*.py"], "light"),
        (["head", "-n", "5", "f"], "light"),
        (["tail", "f"], "light"),
        (["sed", "-n", "1,5p", "f"], "light"),
        (["awk", "{print $1}", "f"], "light"),
        (["echo", "hi"], "light"),
        (["wc", "-l", "f"], "light"),
        # other
        (["node", "server.js"], "other"),
        (["python", "-c", "print(1)"], "other"),
        (["vim", "x"], "other"),
        ([], "other"),
        # wrappers: shells, timeout, env assignments, chains
        (["sh", "-c", "pytest -x"], "test"),
        (["bash", "-lc", "cd /src && python -m pytest -q"], "test"),
        (["/bin/bash", "-e", "-o", "pipefail", "-c", "pip install . && pytest"], "test"),
        (["bash", "-lc", "cd /src && ls"], "light"),
        (["sh", "-c", "git status; make"], "build_install"),
        (["sh", "-c", "cat f | grep x | wc -l"], "light"),
        (["sh", "-c", "cargo test 2>&1 | tail -n 20"], "test"),
        (["sh", "-c", "echo 'pytest; make'"], "light"),  # quoted: an argument, not a command
        (["sh", "-c", "ls\ngo test ./..."], "test"),
        (["sh", "-c", 'bash -c "make check"'], "test"),
        (["sh", "script.sh"], "other"),
        (["sh", "-c", "echo 'unbalanced"], "light"),
        (["timeout", "30", "pytest"], "test"),
        (["timeout", "-s", "KILL", "--kill-after=5", "60", "go", "test"], "test"),
        (["FOO=1", "BAR=2", "cargo", "test"], "test"),
        (["env", "-u", "HOME", "FOO=1", "npm", "install"], "build_install"),
        (["sh", "-c", "FOO=1 timeout 10 nice -n 5 make test"], "test"),
        (["bash", "-lc", "cd x && FOO=1 git log"], "git"),
        (["uv", "run", "pytest"], "test"),
        (["poetry", "run", "python", "-m", "pytest"], "test"),
        (["FOO=1"], "light"),
    ],
)
def test_command_class(argv: list[str], expected: str) -> None:
    assert classify_command(argv) == expected


def call(
    argv: list[str] | None = None,
    *,
    sandbox: str = "sb",
    declared: int | None = None,
    cid: str = "c",
) -> CallInfo:
    return CallInfo(cid, sandbox, argv or ["pytest"], declared_bytes=declared)


def outcome(peak: int, avg: int | None = None, *, oom: bool = False) -> Outcome:
    return Outcome(
        peak_bytes=peak, avg_bytes=peak // 2 if avg is None else avg, duration_s=1.0, oom_killed=oom
    )


def test_history_estimator_satisfies_protocol() -> None:
    assert isinstance(HistoryEstimator(), Estimator)


def test_declared_without_history_uses_factor_one() -> None:
    est = HistoryEstimator()
    d = est.estimate(call(declared=400 * MiB))
    assert d == Demand(avg_bytes=100 * MiB, peak_bytes=400 * MiB, source="declared")
    assert est.peak_correction("sb") == 1.0


def test_declared_gm_correction_hand_computed() -> None:
    est = HistoryEstimator()
    # Ratios observed/declared 2 and 8: GM = sqrt(16) = 4.
    est.observe(call(declared=100 * MiB), outcome(200 * MiB, 50 * MiB))  # avg ratio 1/2
    est.observe(call(declared=50 * MiB), outcome(400 * MiB, 25 * MiB / 4))  # avg ratio 1/8
    assert est.peak_correction("sb") == pytest.approx(4.0)
    assert est.avg_correction("sb") == pytest.approx(0.25)  # sqrt(1/16)
    d = est.estimate(call(declared=100 * MiB))
    assert d.peak_bytes == 400 * MiB
    assert d.avg_bytes == 25 * MiB
    assert d.source == "declared"


def test_declared_gm_three_ratios_and_under_declaration() -> None:
    est = HistoryEstimator()
    for ratio in (0.25, 4.0, 4.0):  # GM = (0.25 * 4 * 4) ** (1/3) = 4 ** (1/3)
        est.observe(call(declared=64 * MiB), outcome(int(64 * MiB * ratio)))
    assert est.peak_correction("sb") == pytest.approx(4 ** (1 / 3))
    build = call(["cargo", "build"], declared=3 * MiB)  # a class the sandbox has no history of
    assert est.estimate(build).peak_bytes == round(3 * MiB * 4 ** (1 / 3))


def test_under_declaring_never_beats_the_sandboxs_own_history() -> None:
    """Issue 21 §4: 50 calls that declared 1 B and peaked at 2 GiB. The clamped GM corrects
    a 1 B declaration to 16 B: the call would always be "light". The history wins."""
    est = HistoryEstimator()
    for i in range(50):
        est.observe(call(declared=1, cid=f"c{i}"), outcome(2 * GiB, GiB))
    d = est.estimate(call(declared=1))
    assert d == Demand(GiB, 2 * GiB, "sandbox-history:test")
    # A declaration above the history stands; a neighbour's history never raises one.
    assert est.estimate(call(declared=3 * GiB)).source == "declared"
    assert est.estimate(call(declared=64 * MiB, sandbox="other")) == \
        Demand(16 * MiB, 64 * MiB, "declared")


def test_ratios_are_clamped() -> None:
    est = HistoryEstimator()
    est.observe(call(declared=MiB), outcome(64 * MiB))  # ratio 64 -> 16
    est.observe(call(declared=MiB), outcome(MiB))  # ratio 1
    assert est.peak_correction("sb") == pytest.approx(4.0)  # sqrt(16 * 1)
    est2 = HistoryEstimator()
    est2.observe(call(declared=64 * MiB), outcome(0, 0))  # ratio 0 -> 1/16 (and no log(0))
    assert est2.peak_correction("sb") == pytest.approx(1 / 16)


def test_gm_window_evicts_oldest_default_k_256() -> None:
    est = HistoryEstimator()
    assert est.config.declared_window == 256
    for _ in range(256):
        est.observe(call(declared=MiB), outcome(2 * MiB))
    assert est.peak_correction("sb") == pytest.approx(2.0)
    for _ in range(128):
        est.observe(call(declared=MiB), outcome(8 * MiB))
    # Window: 128 x 2 and 128 x 8 -> GM = sqrt(2 * 8) = 4.
    assert est.declared_window_len("sb") == 256
    assert est.peak_correction("sb") == pytest.approx(4.0)
    for _ in range(128):
        est.observe(call(declared=MiB), outcome(8 * MiB))
    assert est.peak_correction("sb") == pytest.approx(8.0)  # every 2 evicted


def test_gm_window_small_k() -> None:
    est = HistoryEstimator(EstimateConfig(declared_window=4))
    for peak in (16, 16, 1, 1):
        est.observe(call(declared=MiB), outcome(peak * MiB))
    assert est.peak_correction("sb") == pytest.approx(4.0)  # (16*16*1*1) ** (1/4)
    est.observe(call(declared=MiB), outcome(MiB))
    est.observe(call(declared=MiB), outcome(MiB))
    assert est.peak_correction("sb") == pytest.approx(1.0)


def test_correction_is_per_sandbox() -> None:
    """An agent that over-declares (300 MiB for a 1 MiB call) is corrected; its neighbour's
    truthful 220 MiB is not discounted into a co-admission."""
    est = HistoryEstimator()
    for _ in range(3):
        est.observe(call(declared=300 * MiB, sandbox="sloppy"), outcome(MiB))
    assert est.peak_correction("sloppy") == pytest.approx(1 / 16)
    assert est.estimate(call(declared=220 * MiB, sandbox="sloppy")).peak_bytes < 14 * MiB
    assert est.estimate(call(declared=220 * MiB, sandbox="honest")).peak_bytes == 220 * MiB
    est.forget_sandbox("sloppy")
    assert est.declared_window_len("sloppy") == 0


def test_oom_killed_peak_is_inflated() -> None:
    est = HistoryEstimator()
    est.observe(call(declared=100 * MiB), outcome(100 * MiB, oom=True))
    assert est.peak_correction("sb") == pytest.approx(2.0)
    est.observe(call(["make"]), outcome(300 * MiB, 100 * MiB, oom=True))
    assert est.estimate(call(["make"])).peak_bytes == 600 * MiB


def test_class_defaults() -> None:
    est = HistoryEstimator()
    expected = {
        ("ls",): ("light", 16 * MiB),
        ("git", "diff"): ("git", 64 * MiB),
        ("node", "x.js"): ("other", 256 * MiB),
        ("pip", "install", "x"): ("build_install", 1 * GiB),
        ("pytest",): ("test", 1 * GiB),
    }
    for argv, (cls, peak) in expected.items():
        d = est.estimate(call(list(argv)))
        assert d == Demand(peak // 4, peak, f"class-default:{cls}")


def test_history_fallback_order() -> None:
    est = HistoryEstimator()
    pytest_a, pytest_b, pytest_c = (call(["pytest"], sandbox=s) for s in "abc")
    assert est.estimate(pytest_a).source == "class-default:test"

    est.observe(pytest_b, outcome(600 * MiB, 200 * MiB))
    assert est.estimate(pytest_b) == Demand(200 * MiB, 600 * MiB, "sandbox-history:test")
    assert est.estimate(pytest_a) == Demand(200 * MiB, 600 * MiB, "class-history:test")

    est.observe(pytest_a, outcome(300 * MiB, 100 * MiB))
    assert est.estimate(pytest_a) == Demand(100 * MiB, 300 * MiB, "sandbox-history:test")
    # Class history: max of peaks (600), mean of averages (150).
    assert est.estimate(pytest_c) == Demand(150 * MiB, 600 * MiB, "class-history:test")

    # Another class of the same sandbox is untouched; a declared hint above the sandbox's
    # history wins over it, one below does not (issue 21 §4).
    assert est.estimate(call(["git", "log"], sandbox="a")).source == "class-default:git"
    assert est.estimate(call(["pytest"], sandbox="a", declared=512 * MiB)).source == "declared"
    assert est.estimate(call(["pytest"], sandbox="a", declared=64 * MiB)).peak_bytes == 300 * MiB
    # Wrapped commands share the class history.
    wrapped = call(["sh", "-c", "cd /w && pytest -q"], sandbox="a")
    assert est.estimate(wrapped).source == "sandbox-history:test"


def test_history_recent_max_window() -> None:
    est = HistoryEstimator(EstimateConfig(history_window=8))
    c = call(["make"])
    est.observe(c, outcome(900 * MiB, 100 * MiB))
    for _ in range(7):
        est.observe(c, outcome(100 * MiB, 20 * MiB))
    d = est.estimate(c)
    assert d.peak_bytes == 900 * MiB
    assert d.avg_bytes == math.ceil((100 + 7 * 20) * MiB / 8)
    est.observe(c, outcome(100 * MiB, 20 * MiB))  # the 900 MiB spike leaves the window
    assert est.estimate(c) == Demand(20 * MiB, 100 * MiB, "sandbox-history:build_install")


def test_min_history() -> None:
    est = HistoryEstimator(EstimateConfig(min_history=2))
    c = call(["make"])
    est.observe(c, outcome(100 * MiB))
    assert est.estimate(c).source == "class-default:build_install"
    est.observe(c, outcome(100 * MiB))
    assert est.estimate(c).source == "sandbox-history:build_install"


def test_zero_declared_is_no_hint_and_forget_sandbox() -> None:
    est = HistoryEstimator()
    c = call(["make"], declared=0)
    est.observe(c, outcome(100 * MiB))
    assert est.declared_window_len("sb") == 0
    assert est.estimate(c).source == "sandbox-history:build_install"
    est.forget_sandbox("sb")
    assert est.estimate(c).source == "class-history:build_install"


def test_call_info_validation() -> None:
    c = CallInfo("c1", "sb", ["ls", "-l"])
    assert c.argv == ("ls", "-l")
    assert c.priority == "normal"
    assert c.arrival is None
    with pytest.raises(ValueError):
        CallInfo("c1", "sb", ["ls"], priority="urgent")
