"""What an agent's command line runs: one classifier of argv, one taxonomy.

Admission predicts a call's memory by its command class (policy/estimate.py keys its history by
the class) and the OOM note advises by it (calls/feedback.py: "run one test file", "install
fewer packages"); both read the class from `classify` here, so they never disagree about what a
command is. Cheap to import (re, os, shlex only): the runtime path's feedback imports it.

Classes, lightest first (a chain is classified by its heaviest command): `light` (reading,
searching, small file operations, shell builtins), `git`, `other`, `build_install`, `test`.
The names are history keys in users' SQLite stores: never rename one.

The classifier sees through shell wrappers (`sh -c "…"`, `bash -lc "…"`), `timeout`, `env`,
`nice`, `sudo`, runners (`uv run …`), env assignments and `cd x && …` chains.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh", "mksh"})
# `<runner> run <cmd>` runs <cmd>.
RUNNERS = frozenset({"uv", "poetry", "pipenv", "pdm", "hatch", "rye"})
PYTHON = re.compile(r"(python|pypy)(\d+(\.\d+)?)?")
NODE_PMS = frozenset({"npm", "pnpm", "yarn", "bun"})
# `FOO=1 cmd`: an environment assignment in front of the command.
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)

# Command classes, lightest first: a chain is classified by the one ranked last.
LIGHT, GIT, OTHER, BUILD_INSTALL, TEST = "light", "git", "other", "build_install", "test"
CLASS_RANK = {LIGHT: 0, GIT: 1, OTHER: 2, BUILD_INSTALL: 3, TEST: 4}

# Reading, searching and small file operations; shell builtins (so `cd x && cmd` is `cmd`).
_LIGHT = frozenset[str]().union(
    {"grep", "egrep", "fgrep", "rg", "ag", "ls", "cat", "find", "fd", "head", "tail", "sed", "awk"},
    {"gawk", "mawk", "echo", "printf", "wc", "tree", "pwd", "cd", "pushd", "popd", "true", "false"},
    {":", "export", "unset", "set", "source", ".", "alias", "test", "[", "sleep", "mkdir", "rmdir"},
    {"touch", "rm", "cp", "mv", "ln", "stat", "which", "type", "whoami", "id", "date", "basename"},
    {"dirname", "readlink", "realpath", "diff", "cmp", "tr", "cut", "uniq", "tee", "chmod"},
    {"chown", "file", "du", "df", "nl", "rev", "less", "more"},
)
_TEST_TOOLS = frozenset(
    {"pytest", "py.test", "tox", "nox", "jest", "vitest", "mocha", "rspec", "phpunit", "ctest"}
)
_COMPILERS = re.compile(
    r"(gcc|g\+\+|cc|c\+\+|clang|clang\+\+|ld|ld\.lld|rustc|javac|tsc|cmake|meson|scons)(-[\d.]+)?"
)
_MAKE = frozenset({"make", "gmake", "bmake", "ninja"})
_BUILD_TOOLS = frozenset({"mvn", "gradle", "gradlew", "bazel", "bazelisk", "dotnet"})
_PIP = re.compile(r"pip(\d+(\.\d+)?)?")
_PKG_MANAGERS = frozenset(
    {"apt", "apt-get", "aptitude", "yum", "dnf", "apk", "zypper", "conda", "mamba", "gem", "brew"}
)
_INSTALL_VERBS = frozenset({"install", "add", "upgrade", "update", "build", "sync", "download"})
_NPX = frozenset({"npx", "pnpx", "bunx"})
# Wrappers that run the rest of their argv, and their options that take a value.
_WRAPPERS = {
    "nohup": frozenset({"-a"}), "time": frozenset({"-a"}), "exec": frozenset({"-a"}),
    "command": frozenset({"-a"}), "stdbuf": frozenset({"-a"}), "builtin": frozenset({"-a"}),
    "ionice": frozenset({"-c", "-n", "-p"}),
    "sudo": frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"}),
}
_SEPARATOR_CHARS = frozenset(";&|()\n")
_MAX_DEPTH = 8


class Command:
    """A call's command as every reader sees it: its class, and for the advice the tool that
    decided the class (`pip` for pip3, `python -m pip` and `uv pip`; `pytest` for
    `python -m pytest`; '' when nothing was recognised) and whether it installs packages (an
    install is `build_install`, but `pip install` and `make` want different advice)."""

    __slots__ = ("cls", "install", "tool")

    def __init__(self, cls: str, tool: str = "", install: bool = False) -> None:
        self.cls = cls
        self.tool = tool
        self.install = install

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Command):
            return NotImplemented
        return (self.cls, self.tool, self.install) == (other.cls, other.tool, other.install)

    def __hash__(self) -> int:
        return hash((self.cls, self.tool, self.install))

    def __repr__(self) -> str:
        return f"Command({self.cls!r}, {self.tool!r}, {self.install!r})"


def classify(argv: Sequence[str]) -> Command:
    """The class of an argv (the heaviest command of a chain) and the tool that decided it."""
    if not argv:
        return Command(OTHER)
    return _classify_simple(list(argv), 0)


def classify_command(argv: Sequence[str]) -> str:
    """The command class of an argv: 'test', 'build_install', 'git', 'light' or 'other'."""
    return classify(argv).cls


def _heaviest(commands: Sequence[Command]) -> Command:
    """The first of the highest-ranked commands."""
    return max(commands, key=lambda c: CLASS_RANK[c.cls]) if commands else Command(LIGHT)


def _first_operand(args: Sequence[str]) -> tuple[str, int]:
    """The first argument that is not an option, and its index ('' and len if none)."""
    for i, a in enumerate(args):
        if not a.startswith("-") and not a.startswith("+"):
            return a, i
    return "", len(args)


def _is_test_target(word: str) -> bool:
    return word.startswith("test") or word in ("check", "unittest")


def _skip_options(args: Sequence[str], with_value: frozenset[str]) -> int:
    """Index of the first operand, skipping options (and the values of those in with_value)."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        if args[i] == "--":
            return i + 1
        i += 2 if args[i] in with_value else 1
    return i


def _classify_string(command: str, depth: int) -> Command:
    """Classify a shell command string: the heaviest simple command in it."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>\n")
        lexer.whitespace_split = True
        lexer.whitespace = " \t\r"
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: fall back to a plain split
        tokens = command.split()
    commands: list[Command] = []
    current: list[str] = []
    skip_next = False
    for tok in tokens:
        if skip_next:  # the target of a redirection
            skip_next = False
        elif tok and set(tok) <= _SEPARATOR_CHARS:
            if current:
                commands.append(_classify_simple(current, depth))
            current = []
        elif tok and tok[0] in "<>" and set(tok) <= set("<>&|"):
            skip_next = True
        else:
            current.append(tok)
    if current:
        commands.append(_classify_simple(current, depth))
    return _heaviest(commands) if commands else Command(OTHER)


def _classify_simple(argv: Sequence[str], depth: int) -> Command:
    """Classify one simple command, unwrapping transparent prefixes first."""
    args = list(argv)
    while True:
        while args and ASSIGNMENT.fullmatch(args[0]):
            args.pop(0)
        if not args:
            return Command(LIGHT)  # only assignments
        head, rest = os.path.basename(args[0]), args[1:]
        if head == "env":
            i = _skip_options(rest, frozenset({"-u", "--unset", "-C", "--chdir", "-S"}))
            args = rest[i:]
        elif head == "timeout":
            i = _skip_options(rest, frozenset({"-s", "--signal", "-k", "--kill-after"}))
            args = rest[i + 1 :]  # drop the duration
        elif head == "nice":
            i = _skip_options(rest, frozenset({"-n", "--adjustment"}))
            args = rest[i:]
        elif head in _WRAPPERS:
            args = rest[_skip_options(rest, _WRAPPERS[head]) :]
        elif head in RUNNERS and rest[:1] == ["run"]:
            args = rest[1 + _skip_options(rest[1:], frozenset({"--with", "-p", "--python"})) :]
        elif head in SHELLS:
            return _classify_shell(rest, depth)
        else:
            return _classify_command(head, rest)
        if not args:
            return Command(LIGHT)


def _classify_shell(args: Sequence[str], depth: int) -> Command:
    """`sh -c "…"`, `bash -lc "…"`, `bash -e -o pipefail -c "…"`: classify the string."""
    i = 0
    has_c = False
    while i < len(args) and args[i].startswith(("-", "+")) and args[i] not in ("-", "--"):
        opt = args[i]
        if opt in ("-o", "+o", "-O", "+O"):
            i += 1  # takes a value
        elif not opt.startswith("--") and "c" in opt[1:]:
            has_c = True
        i += 1
    if has_c and i < len(args) and depth < _MAX_DEPTH:
        return _classify_string(args[i], depth + 1)
    return Command(OTHER)  # a script or an interactive shell: nothing to see


def _classify_command(head: str, args: Sequence[str]) -> Command:
    """Rules for one command name and its arguments."""
    if head in _LIGHT:
        return Command(LIGHT, head)
    if head == "git":
        return Command(GIT, head)
    if head in _TEST_TOOLS:
        return Command(TEST, head)
    verb, vi = _first_operand(args)
    if PYTHON.fullmatch(head):
        if "-m" in args:
            j = args.index("-m")
            module = args[j + 1] if j + 1 < len(args) else ""
            tail = args[j + 2 :]
            if module in ("pytest", "tox", "nox", "unittest"):
                return Command(TEST, module)
            if module == "pip":
                sub, _ = _first_operand(tail)
                return _pip(sub)
            if module == "build":
                return Command(BUILD_INSTALL, module)
            return Command(OTHER)
        if "-c" in args[: vi + 1]:
            return Command(OTHER)
        if os.path.basename(verb) == "setup.py":
            return Command(BUILD_INSTALL, "setup.py")
        return Command(OTHER)
    if _PIP.fullmatch(head):
        return _pip(verb)
    if head == "uv":
        if verb == "pip":
            sub, _ = _first_operand(args[vi + 1 :])
            if sub in ("install", "sync", "compile"):
                return Command(BUILD_INSTALL, "pip", sub != "compile")
            return Command(OTHER)
        if verb in ("sync", "add", "build", "lock"):
            return Command(BUILD_INSTALL, head, verb in ("sync", "add"))
        return Command(OTHER)
    if head == "go":
        if verb == "test":
            return Command(TEST, head)
        if verb in ("build", "install", "get", "mod", "run"):
            return Command(BUILD_INSTALL, head, verb in ("install", "get"))
        return Command(OTHER)
    if head == "cargo":
        if verb in ("test", "t", "nextest", "bench"):
            return Command(TEST, head)
        build = ("build", "b", "install", "check", "c", "clippy", "doc", "run", "r", "fetch")
        return Command(BUILD_INSTALL, head, verb == "install") if verb in build else Command(OTHER)
    if head in NODE_PMS:
        if verb in ("test", "t", "tst"):
            return Command(TEST, head)
        if verb == "run":
            script, _ = _first_operand(args[vi + 1 :])
            if _is_test_target(script):
                return Command(TEST, head)
            return Command(BUILD_INSTALL, head) if script.startswith("build") else Command(OTHER)
        if verb in ("install", "i", "ci", "add", "update", "upgrade") or (
            head == "yarn" and not verb
        ):
            return Command(BUILD_INSTALL, head, True)
        return Command(OTHER)
    if head in _NPX:
        if verb in ("jest", "vitest", "mocha", "playwright"):
            return Command(TEST, verb)
        if verb in ("tsc", "webpack", "vite"):
            return Command(BUILD_INSTALL, verb)
        return Command(OTHER)
    if head in _MAKE or head in _BUILD_TOOLS:  # `make check`, `mvn test`, `bazel test //…`
        wants_test = any(_is_test_target(a) for a in args if not a.startswith("-"))
        return Command(TEST if wants_test else BUILD_INSTALL, head)
    if _COMPILERS.fullmatch(head):
        return Command(BUILD_INSTALL, head)
    if head in _PKG_MANAGERS:
        if verb in _INSTALL_VERBS:
            return Command(BUILD_INSTALL, head, verb != "build")
        return Command(OTHER)
    return Command(OTHER)


def _pip(verb: str) -> Command:
    """`pip <verb>`, however pip was named: installs are `build_install`, the rest `other`."""
    if verb in ("install", "download", "wheel"):
        return Command(BUILD_INSTALL, "pip", verb != "wheel")
    return Command(OTHER)
