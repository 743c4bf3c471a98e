"""The one argv classifier (common/commands.py): class, deciding tool, install or not."""

from __future__ import annotations

import pytest

from execgate.calls import feedback
from execgate.common.commands import (
    BUILD_INSTALL,
    LIGHT,
    OTHER,
    TEST,
    Command,
    classify,
    classify_command,
)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["pip3", "install", "numpy"], Command(BUILD_INSTALL, "pip", True)),
        (["python", "-m", "pip", "install", "."], Command(BUILD_INSTALL, "pip", True)),
        (["uv", "pip", "install", "torch"], Command(BUILD_INSTALL, "pip", True)),
        (["pip", "wheel", "."], Command(BUILD_INSTALL, "pip", False)),
        (["npm", "ci"], Command(BUILD_INSTALL, "npm", True)),
        (["npm", "run", "build"], Command(BUILD_INSTALL, "npm", False)),
        (["make"], Command(BUILD_INSTALL, "make", False)),
        (["cargo", "install", "ripgrep"], Command(BUILD_INSTALL, "cargo", True)),
        (["python", "-m", "pytest", "-q"], Command(TEST, "pytest")),
        (["python3", "-m", "unittest"], Command(TEST, "unittest")),
        (["npx", "jest"], Command(TEST, "jest")),
        (["python", "train.py"], Command(OTHER)),
        ([], Command(OTHER)),
    ],
)
def test_the_class_comes_with_the_tool_that_decided_it(argv: list[str], expected: Command) -> None:
    assert classify(argv) == expected
    assert classify_command(argv) == expected.cls


def test_a_chain_is_its_heaviest_command_and_the_first_of_those_names_the_tool() -> None:
    c = classify(["bash", "-c", "apt-get update && apt-get install -y gcc && ls"])
    assert c == Command(BUILD_INSTALL, "apt-get", True)
    assert classify(["sh", "-c", "pip install . && pytest -x"]) == Command(TEST, "pytest")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["sudo", "-E", "make", "test"], TEST),
        (["sudo", "-u", "bob", "pip", "install", "x"], BUILD_INSTALL),
        (["bash", "-c", "sudo -E make test 2>&1 | tail -50"], TEST),
        (["sudo", "ls"], LIGHT),
    ],
)
def test_sudo_is_seen_through(argv: list[str], expected: str) -> None:
    assert classify_command(argv) == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["sh", "-c", "cd /src && python -m pytest -q"],
        ["bash", "-lc", "pip install . && make"],
        ["npm", "run", "build"],
        ["go", "get", "example.com/x"],
        ["make", "-j8", "check"],
        ["git", "status"],
        ["cat", "README.md"],
    ],
)
def test_the_feedback_advises_by_the_estimators_class(argv: list[str]) -> None:
    """One taxonomy: the OOM note's test / install / other is read off the same class."""
    kind, _ = feedback.classify(argv)
    cls = classify_command(argv)
    assert (kind == "test") == (cls == TEST)
    assert kind != "install" or cls == BUILD_INSTALL
