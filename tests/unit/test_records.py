from pathlib import Path

import pytest

from execgate.common import records


def test_container_round_trip(tmp_path: Path) -> None:
    rec = {"id": "abc", "cgroup": "/sys/fs/cgroup/x", "managed": True}
    records.save_container(str(tmp_path), rec)
    assert records.load_container(str(tmp_path), "abc") == rec
    assert list(records.containers(str(tmp_path))) == [rec]
    records.remove_container(str(tmp_path), "abc")
    assert records.load_container(str(tmp_path), "abc") is None
    records.remove_container(str(tmp_path), "abc")  # twice is fine


@pytest.mark.parametrize("cid", ["", "../x", ".hidden", "a/b"])
def test_ids_cannot_escape(tmp_path: Path, cid: str) -> None:
    with pytest.raises(ValueError):
        records.save_container(str(tmp_path), {"id": cid})
    assert records.load_container(str(tmp_path), cid) is None


def test_journal_tail(tmp_path: Path) -> None:
    path = str(tmp_path / "j" / "calls.jsonl")
    assert records.tail_journal(path, 5) == []
    for i in range(1000):
        records.append_journal(path, {"i": i, "pad": "x" * 100})
    with open(path, "a") as f:
        f.write("not json\n")
    tail = records.tail_journal(path, 3, chunk=256)
    assert [e["i"] for e in tail] == [998, 999]  # the broken last line is skipped
    assert len(list(records.read_journal(path))) == 1000
