"""A container cgroup that kills as a group (memory.oom.group = 1, Kubernetes >= 1.28): each
call's cgroup is capped below what the container still has, so its OOM stays its own."""

from __future__ import annotations

from pathlib import Path

from execgate.cgroups import container

MiB = 1 << 20


def _container(tmp: Path, group: str, limit: str, anon_mib: int) -> tuple[str, str]:
    cg = tmp / "pod"
    tool = cg / "tool-1"
    tool.mkdir(parents=True)
    (cg / "memory.oom.group").write_text(group)
    (cg / "memory.max").write_text(limit)
    (cg / "memory.stat").write_text(f"anon {anon_mib * MiB}\nfile {50 * MiB}\n")
    (tool / "memory.max").write_text("max\n")
    return str(cg), str(tool)


def test_a_group_killing_container_caps_the_call_below_what_it_has_left(tmp_path: Path) -> None:
    cg, tool = _container(tmp_path, "1\n", f"{512 * MiB}\n", 200)
    cap = container.contain_group_oom(cg, tool)
    # 512 - 200 of the agent's anonymous memory - 25.6 MiB (5 % of 512 MiB) of margin
    assert cap == 512 * MiB - 200 * MiB - (512 * MiB) // 20
    assert (Path(tool) / "memory.max").read_text() == str(cap)


def test_the_floor_and_the_cases_left_alone(tmp_path: Path) -> None:
    cg, tool = _container(tmp_path / "a", "1\n", f"{64 * MiB}\n", 60)
    assert container.contain_group_oom(cg, tool) == container.GROUP_OOM_FLOOR
    for group, limit in (("0\n", f"{512 * MiB}\n"), ("1\n", "max\n")):  # Docker's; no limit
        cg, tool = _container(tmp_path / group.strip() / limit.strip(), group, limit, 10)
        assert container.contain_group_oom(cg, tool) is None
        assert (Path(tool) / "memory.max").read_text() == "max\n"
