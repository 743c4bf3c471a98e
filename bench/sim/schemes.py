"""Schemes only the simulator runs, beside bench/schemes.py's (which the VM runs too).

Sandbox admission (execgate/policy/sandbox_admission.py, issue 15 §1: a sandbox's create waits
until its predicted baseline and one call fit beside what cannot be pushed out) runs for every
scheme with the daemon, as in the daemon, unless its config's `[sandbox_admission] enabled` is
false (`execgate-nosandboxadmit`) or the policy revision has none (`--policy-rev` of a VM run
before it). `execgate-sandboxadmit` forces it on, for points whose recorded config turned it off.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from bench.schemes import DEFAULT_STATIC_K, EXECGATE, Scheme, parse_schemes

SANDBOX_ADMIT = replace(EXECGATE, name="execgate-sandboxadmit", family="execgate-sandboxadmit",
                        description="execgate, sandbox admission forced on")
SIM_SCHEMES: dict[str, Scheme] = {SANDBOX_ADMIT.name: SANDBOX_ADMIT}


def parse(spec: str, static_k: Sequence[int] = DEFAULT_STATIC_K,
          n_tasks: int | None = None) -> list[Scheme]:
    """bench.schemes.parse_schemes, plus the simulator's own names."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    out: list[Scheme] = []
    for name in names:
        out += [SIM_SCHEMES[name]] if name in SIM_SCHEMES else parse_schemes(name, static_k,
                                                                            n_tasks)
    seen: set[str] = set()
    return [s for s in out if not (s.name in seen or seen.add(s.name))]


def sandbox_admission(scheme: Scheme, cfg: Mapping[str, Any], mem_scale: float,
                      clock: Callable[[], float]) -> Any:
    """The scheme's SandboxAdmission (None for schemes without the daemon, with it turned off,
    or on a policy revision that has none): [sandbox_admission] of the config if present, else
    the defaults with their byte sizes divided by the workload's memory scale, as bench_config
    scales the daemon's tables."""
    table = dict(cfg.get("sandbox_admission") or {})
    if scheme.name == SANDBOX_ADMIT.name:
        table["enabled"] = True
    elif not scheme.daemon or not table.get("enabled", True):
        return None
    try:
        from execgate.policy import sandbox_admission as sa
    except ImportError:
        return None
    base = sa.SandboxAdmissionConfig()
    values = {f.name: (table[f.name] if f.name in table
                       else max(0, round(getattr(base, f.name) / mem_scale))
                       if f.name.endswith("_bytes") else getattr(base, f.name))
              for f in dataclasses.fields(base)}
    return sa.SandboxAdmission(sa.SandboxAdmissionConfig(**values), clock)


def run_key(scheme: Scheme, cfg: Mapping[str, Any] | None) -> str:
    """What a simulation of the scheme depends on: its fields but its names, the config, and
    whether sandbox admission runs (on by default; SANDBOX_ADMIT's name forces it). The
    simulation is deterministic, so schemes with one key have one result: a sweep runs it once
    (execgate-sandboxadmit is execgate wherever the config leaves sandbox admission on)."""
    fields = {f.name: getattr(scheme, f.name) for f in dataclasses.fields(scheme)
              if f.name not in ("name", "family", "description")}
    table = dict((cfg or {}).get("sandbox_admission") or {})
    admits = scheme.name == SANDBOX_ADMIT.name or (scheme.daemon and table.get("enabled", True))
    return json.dumps([fields, cfg, bool(admits)], sort_keys=True, default=str)
