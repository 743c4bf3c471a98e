"""records.ContainerIndex: re-parse only what changed, never serve a stale or removed record."""

from __future__ import annotations

import json
import os

from execgate.common import records


def test_index_reparses_only_changed_records(tmp_path, monkeypatch) -> None:
    state = str(tmp_path)
    for i in range(3):
        records.save_container(state, {"id": f"c{i}", "n": i})
    index = records.ContainerIndex(state)
    assert [r["id"] for r in index.records()] == ["c0", "c1", "c2"]
    loads: list[str] = []
    real = records.load_container
    monkeypatch.setattr(records, "load_container",
                        lambda sd, cid: loads.append(cid) or real(sd, cid))
    assert [r["n"] for r in index.records()] == [0, 1, 2]
    assert loads == []  # nothing changed, nothing parsed
    records.save_container(state, {"id": "c1", "n": 10})
    records.remove_container(state, "c2")
    records.save_container(state, {"id": "c3", "n": 3})
    assert [(r["id"], r["n"]) for r in index.records()] == [("c0", 0), ("c1", 10), ("c3", 3)]
    assert sorted(loads) == ["c1", "c3"]


def test_index_hands_out_copies_and_skips_junk(tmp_path) -> None:
    state = str(tmp_path)
    records.save_container(state, {"id": "a", "x": 1})
    with open(os.path.join(state, "containers", "bad.json"), "w") as f:
        f.write("{not json")
    with open(os.path.join(state, "containers", "a.json.123.tmp"), "w") as f:
        json.dump({"id": "tmp"}, f)
    index = records.ContainerIndex(state)
    first = index.records()
    assert [r["id"] for r in first] == ["a"]
    first[0]["x"] = 99
    assert index.records()[0]["x"] == 1


def test_index_of_a_missing_directory_is_empty(tmp_path) -> None:
    assert records.ContainerIndex(str(tmp_path / "nope")).records() == []
