"""Imports point one way, engine to kernel (docs/architecture.md): a module may import only the
packages below its own. An arrow the other way (the daemon reaching into the runtime, policy
reading the daemon) fails here, before it becomes a knot."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "execgate"
BASE = {"common", "cgroups", "oci"}
ALLOWED = {
    "ctl": {"daemon", "policy", "bpf", "calls"} | BASE,
    "daemon": {"policy", "bpf", "calls"} | BASE,
    "runtime": {"calls"} | BASE,
    "policy": {"common"},
    "bpf": BASE,
    "calls": BASE,
    "cgroups": {"common"},
    "oci": {"common"},
    "common": set(),
}


def _imports(path: Path) -> set[str]:
    """Top-level module names of every absolute import in the file (lazy ones included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_every_package_is_placed() -> None:
    found = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert found == set(ALLOWED), "a new package needs its place in ALLOWED and the docs"


def test_imports_point_one_way() -> None:
    wrong = []
    for path in sorted(PKG.rglob("*.py")):
        own = path.relative_to(PKG).parts[0]
        if own not in ALLOWED:
            continue  # execgate/__init__.py
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "bench":
                wrong.append(f"{path.relative_to(PKG)} imports {name} (bench is not installed)")
            elif parts[0] == "execgate" and len(parts) > 1 and parts[1] != own \
                    and parts[1] not in ALLOWED[own]:
                wrong.append(f"{path.relative_to(PKG)} imports {name}")
    assert not wrong, "\n".join(wrong)

