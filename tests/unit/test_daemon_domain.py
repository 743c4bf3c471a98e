"""The daemon's domain sample: /proc/meminfo and PSI parsing, a cgroup domain read through kept
descriptors, and the host fallback while the cgroup does not exist."""

from __future__ import annotations

import shutil
from pathlib import Path

from execgate.common.meminfo import field as meminfo_bytes
from execgate.common.units import MiB
from execgate.daemon.domain import Domain, psi_some_avg10


def test_meminfo_and_psi_fields() -> None:
    data = b"MemTotal:     102400 kB\nMemFree:  51200 kB\nMemAvailable:   71680 kB"
    assert meminfo_bytes(data, "MemTotal") == 100 * MiB
    assert meminfo_bytes(data, "MemAvailable") == 70 * MiB  # the last line, no newline
    assert meminfo_bytes(data, "Free") is None and meminfo_bytes(b"", "MemTotal") is None
    assert psi_some_avg10(b"some avg10=1.50 avg60=0.00 avg300=0.00 total=9\nfull avg10=0.00") \
        == 1.5
    assert psi_some_avg10(b"full avg10=2.00") is None and psi_some_avg10(None) is None


def test_a_cgroup_domain_follows_its_files_and_falls_back_to_the_host(tmp_path: Path) -> None:
    cg = tmp_path / "agents.slice"
    dom = Domain(str(cg))
    host = dom.sample()  # not there yet: the host
    assert host.budget > 0 and host.available > 0
    cg.mkdir()
    (cg / "memory.max").write_text(f"{1024 * MiB}\n")
    (cg / "memory.current").write_text(f"{100 * MiB}\n")
    (cg / "memory.pressure").write_text("some avg10=3.00 avg60=0 avg300=0 total=1\n")
    s = dom.sample()
    assert (s.budget, s.used, s.available, s.psi_some_avg10) == (1024 * MiB, 100 * MiB,
                                                                  924 * MiB, 3.0)
    (cg / "memory.current").write_text(f"{900 * MiB}\n")  # same file, new content
    assert dom.sample().available == 124 * MiB
    shutil.rmtree(cg)  # gone again (a kept descriptor of a regular file still reads)
    cg.mkdir()
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.current").write_text(f"{10 * MiB}\n")
    fresh = Domain(str(cg)).sample()
    assert fresh.budget == host.budget and fresh.used == 10 * MiB
    assert 0 < fresh.available <= host.budget - 10 * MiB
    assert Domain(str(cg), budget_override=512 * MiB).sample().budget == 512 * MiB


def test_swap_free_is_the_hosts_within_the_domains_swap_max(tmp_path: Path) -> None:
    """The last resort waits while swap has room (issue 15 §5): the domain reports what swap it
    can still use — host SwapFree, within its own memory.swap.max when it sets one."""
    cg = tmp_path / "agents.slice"
    cg.mkdir()
    (cg / "memory.max").write_text(f"{1024 * MiB}\n")
    (cg / "memory.current").write_text(f"{100 * MiB}\n")
    dom = Domain(str(cg))
    host_free = dom.sample().swap_free  # no swap files: the host's SwapFree
    assert host_free is not None and host_free >= 0
    (cg / "memory.swap.max").write_text("0\n")
    (cg / "memory.swap.current").write_text("0\n")
    assert Domain(str(cg)).sample().swap_free == 0  # swap off for the domain
    (cg / "memory.swap.max").write_text("max\n")
    unlimited = Domain(str(cg)).sample().swap_free
    assert unlimited is not None and abs(unlimited - host_free) < 64 * MiB  # the host's, moving
