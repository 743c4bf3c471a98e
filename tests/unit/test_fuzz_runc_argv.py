"""Fuzz: the runc command lines an engine (or anyone) may hand the runtime (issue 21).

Whatever the argv, `oci/cli.py` parses it without raising, and the splices the handlers make
keep everything else as it was: `--cgroup tool-x` lands right after the subcommand, and
re-parsing the result finds the same subcommand, global flags and container id, plus the
cgroup; replacing `--console-socket` changes only that value.
"""

from __future__ import annotations

import random

import fuzzing

from execgate.oci import cli

COMMANDS = ("create", "start", "exec", "kill", "delete", "run", "state", "ps", "events",
            "update", "pause", "checkpoint", "features", "")
FLAGS = ("log", "log-format", "root", "criu", "rootless", "debug", "systemd-cgroup",
         "process", "p", "console-socket", "pid-file", "detach", "d", "tty", "t", "env", "e",
         "cwd", "user", "u", "cap", "preserve-fds", "bundle", "b", "force", "f", "all", "a",
         "cgroup", "no-new-keyring", "pidfd-socket", "ignore-paused", "h", "help", "version")


def _token(r: random.Random) -> str:
    roll = r.random()
    if roll < 0.45:
        name = r.choice(FLAGS)
        dash = r.choice(("-", "--"))
        if r.random() < 0.3:
            return f"{dash}{name}={fuzzing.text(r, 2)}"
        return dash + name
    if roll < 0.55:
        return r.choice(("--", "-", "---x", "-=", "--=v", "=", ""))
    if roll < 0.7:
        return r.choice(COMMANDS)
    return fuzzing.text(r, 3) or "box"


def _argv(r: random.Random) -> list[str]:
    head = [_token(r) for _ in range(r.choice((0, 0, 1, 2, 3)))]
    tail = [_token(r) for _ in range(r.randrange(8))]
    cmd = [r.choice(("exec", "exec", "exec", *COMMANDS))] if r.random() < 0.9 else []
    ids = ["box"] if r.random() < 0.8 else []
    return head + cmd + tail + ids


def test_any_argv_parses_and_splices_keep_the_rest() -> None:
    r = fuzzing.rng("runc-argv")
    execs = 0
    for i in range(fuzzing.N):
        argv = _argv(r)
        with fuzzing.reported(i, argv):
            inv = cli.parse(argv)
            flags = inv.command_flags()
        assert inv.argv == argv
        if inv.command is None:
            continue
        assert argv[inv.command_index] == inv.command
        out = inv.with_command_flags(["--cgroup", "tool-0123456789ab"])
        j = inv.command_index + 1
        assert out[:j] == argv[:j] and out[j + 2:] == argv[j:], (i, argv)
        again = cli.parse(out)
        assert (again.command, again.command_index) == (inv.command, inv.command_index)
        assert again.globals.values == inv.globals.values, (i, argv)
        if inv.command == "exec":
            execs += 1
            re_flags = again.command_flags()
            assert re_flags.positionals == flags.positionals, (i, argv, out)
            assert re_flags.values["cgroup"][0] == "tool-0123456789ab", (i, argv)
            swapped = inv.replace_command_flag(out, "console-socket", "/run/proxy.sock")
            assert len(swapped) == len(out)
            changed = [k for k, (a, b) in enumerate(zip(out, swapped, strict=True)) if a != b]
            assert all("/run/proxy.sock" in swapped[k] for k in changed), (i, argv, swapped)
    assert execs > fuzzing.N // 20, execs
