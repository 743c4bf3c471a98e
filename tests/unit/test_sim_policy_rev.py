"""bench/sim/policy_rev.py's re-run: which arguments are paths to make absolute before the
command runs again from a temporary directory."""

from __future__ import annotations

from pathlib import Path

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
