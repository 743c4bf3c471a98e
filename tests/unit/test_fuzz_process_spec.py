"""Fuzz: process specs (`runc exec --process FILE`) as the exec handler reads them.

Whatever JSON (or not JSON) the file holds, `oci/process.py` gives a well-typed spec or a
ValueError, and the handler's use of it (the hint from its env, the admit request) never
raises: a spec the handler cannot read runs without a hint, never breaks the exec (issue 21,
item 5).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import fuzzing

from execgate.calls import hint as hint_mod
from execgate.common import protocol
from execgate.oci import process

FIELDS = ("args", "env", "cwd", "terminal", "user", "capabilities", "consoleSize", "rlimits",
          "noNewPrivileges", "apparmorProfile", "selinuxLabel", "oomScoreAdj")


def _env_item(r: random.Random) -> Any:
    if r.random() < 0.5:
        return f"AGENT_RESOURCE_HINT={fuzzing.text(r)}"
    return fuzzing.value(r)


def _spec(r: random.Random) -> bytes:
    roll = r.random()
    if roll < 0.03:
        n = fuzzing.depth(r)
        return b"[" * n + b"]" * n
    if roll < 0.06:
        return r.randbytes(r.randrange(1, 40))
    if roll < 0.12:
        return json.dumps(fuzzing.value(r)).encode()
    spec: dict[str, Any] = {}
    for key in FIELDS:
        if r.random() < 0.5:
            continue
        if key in ("args", "env") and r.random() < 0.6:
            spec[key] = [_env_item(r) if key == "env" else fuzzing.text(r)
                         for _ in range(r.randrange(4))]
        else:
            spec[key] = fuzzing.value(r)
    if r.random() < 0.05:  # JSON may spell a lone surrogate, which no UTF-8 can carry
        spec["args"] = [*(spec.get("args") if isinstance(spec.get("args"), list) else []),
                        r.choice(("\ud800", "x\udfff"))]
    text = json.dumps(spec)
    if r.random() < 0.05:
        text = text[: r.randrange(len(text) + 1)]  # cut short
    return text.encode("utf-8", "surrogatepass")


def test_any_process_spec_reads_as_a_spec_or_a_value_error(tmp_path: Path) -> None:
    r = fuzzing.rng("process-spec")
    cg = tmp_path / "box"
    cg.mkdir()
    (cg / "memory.max").write_text("max\n")
    read = refused = 0
    for i in range(fuzzing.N):
        data = _spec(r)
        try:
            with fuzzing.reported(i, data, ValueError):
                spec = process.parse(data)
        except ValueError:
            refused += 1
            continue
        read += 1
        assert all(isinstance(a, str) for a in spec.args)
        assert all(isinstance(e, str) for e in spec.env)
        assert isinstance(spec.cwd, str) and isinstance(spec.terminal, bool)
        with fuzzing.reported(i, data):
            raw = spec.getenv("AGENT_RESOURCE_HINT")
            got = hint_mod.resolve(raw, str(cg), "box", str(tmp_path / "state"),
                                   lambda _why: None, None)
            protocol.encode(protocol.request("admit", argv=spec.args, hint=got))  # sendable
        assert got is None or isinstance(got, dict)
    assert read > fuzzing.N // 2 and refused > 0


def test_an_env_prefix_declares_the_hint_as_kubectl_exec_can() -> None:
    """`kubectl exec P -- env AGENT_RESOURCE_HINT=memory:2g pytest` carries the hint in the
    command, not in the exec's environment: the prefix wins, as env itself would apply it."""
    from execgate.oci.process import ProcessSpec

    name = "AGENT_RESOURCE_HINT"
    env = [f"{name}=memory:1g"]
    assert ProcessSpec(["pytest"], env).command_getenv(name) == "memory:1g"
    assert ProcessSpec(["env", f"{name}=memory:2g", "pytest"], env).command_getenv(name) \
        == "memory:2g"
    assert ProcessSpec(["/usr/bin/env", "A=1", f"{name}=x", f"{name}=y", "sh", f"{name}=z"],
                       []).command_getenv(name) == "y"  # the last before the command
    assert ProcessSpec(["env", "-i", "PATH=/bin", "pytest"], env).command_getenv(name) is None
    assert ProcessSpec(["env", "-u", name, "pytest"], env).command_getenv(name) is None
    assert ProcessSpec(["env"], env).command_getenv(name) == "memory:1g"
    assert ProcessSpec(["envsubst", f"{name}=q"], env).command_getenv(name) == "memory:1g"
