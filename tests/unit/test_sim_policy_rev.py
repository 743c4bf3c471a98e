"""bench/sim/policy_rev.py's re-run: which arguments are paths to make absolute before the
command runs again from a temporary directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.sim.policy_rev import _is_path, absolute

REPO = str(Path(__file__).resolve().parents[2])


def test_a_scheme_named_like_a_directory_is_not_a_path() -> None:
    """`--schemes execgate` from the repository root: `execgate` is also the package's
    directory, and was made /repo/execgate (an unknown scheme) before."""
    assert not _is_path(REPO, "execgate")
    assert not _is_path(REPO, "--schemes")


def test_files_and_directories_given_as_paths_are() -> None:
    assert _is_path(REPO, "docs/replay/sweep/results.json.gz")
    assert _is_path(REPO, "docs/sim")
    assert _is_path(REPO, "README.md")
    assert not _is_path(REPO, "docs/no-such-dir")


def test_a_new_out_directory_is_made_absolute() -> None:
    """`--out docs/sim/new` with --policy-rev: the re-run runs in a temporary directory, and a
    relative output directory that did not exist yet was written there and lost."""
    args = absolute(REPO, ["validate", "docs/sim", "--out", "docs/sim/new", "--out=x/y",
                           "--schemes", "execgate"])
    assert args == ["validate", f"{REPO}/docs/sim", "--out", f"{REPO}/docs/sim/new",
                    f"--out={REPO}/x/y", "--schemes", "execgate"]


FLEET = Path(REPO) / "docs/replay/fleet/burst-a982a58/repeat-1.json.gz"


def _has_commit(rev: str) -> bool:
    return subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{rev}^{{commit}}"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not (FLEET.exists() and _has_commit("a982a58")),
                    reason="no fleet results or a shallow clone")
def test_a_fleet_boot_runs_at_its_own_older_policy(tmp_path) -> None:
    """`bench/figures.sh sim` validates every fleet boot at its own revision's policy: the
    harness called SandboxAdmission.finished with the call load that policies before it do not
    take, and 24 of 32 boots (the figures script with them) failed with a TypeError."""
    out = subprocess.run([sys.executable, "-m", "bench.sim", "validate", str(FLEET),
                          "--policy-rev", "a982a58", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tasks done exact: 2/2" in (tmp_path / "validate-a982a58.md").read_text()
