"""Sandbox admission wired: the `start_sandbox` op, the snapshot the daemon builds for the
policy on a temp cgroupfs domain (container records, memory files), the runtime's client."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from test_daemon_engine import Clock

from execgate.cgroups.sandbox import image_key
from execgate.common import records
from execgate.common.config import Config
from execgate.common.units import MiB
from execgate.daemon import settings
from execgate.daemon.engine import Engine, LiveCall
from execgate.daemon.main import Daemon, _start_sandbox_error
from execgate.daemon.sandboxes import RESCAN_S, WAITING_STEP_S, cgroup_dir, within
from execgate.oci.bundle import Bundle
from execgate.policy.estimate import CallInfo
from execgate.runtime import start_admit

BUDGET = 256 * MiB  # S = 32 MiB (1/8): room 224 MiB


class FakeConn:
    """The op's connection: frames sent, and a hang-up the test can cause."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.hung_up = asyncio.Event()

    async def send(self, msg: dict[str, Any]) -> None:
        self.frames.append(msg)

    async def closed(self) -> None:
        await self.hung_up.wait()


def _write(path: Path, name: str, value: object) -> None:
    (path / name).write_text(f"{value}\n")


class Bed:
    """An engine on a temp domain holding sandbox cgroups, with their container records."""

    def __init__(self, tmp: Path, **table: Any) -> None:
        self.tmp = tmp
        self.dom = tmp / "domain"
        self.dom.mkdir()
        _write(self.dom, "memory.max", BUDGET)
        _write(self.dom, "memory.current", 8 * MiB)
        self.state = tmp / "state"
        cfg = Config(state_dir=str(self.state), journal=str(tmp / "calls.jsonl"), tables={
            "daemon": {"domain": str(self.dom), "store": str(tmp / "h.sqlite")},
            "sandbox_admission": {"default_baseline_bytes": "48m",
                                  "default_call_peak_bytes": "32m", **table},
            "residency": {"idle_after_s": 600.0}})
        s, errors = settings.load(cfg)
        assert errors == []
        self.clock = Clock()
        self.engine = Engine(cfg, s, self.clock)
        self.daemon = Daemon(cfg, self.engine)

    def sandbox(self, cid: str, mem: int, image: str = "cmd:memload", **stat: int) -> Path:
        cg = self.dom / cid
        (cg / "init").mkdir(parents=True)  # prepared: residency follows it
        _write(cg, "memory.current", mem)
        (cg / "memory.stat").write_text("".join(f"{k} {v}\n" for k, v in stat.items()))
        records.save_container(str(self.state), {"id": cid, "managed": True, "cgroup": str(cg),
                                                 "image": image, "created": time.time()})
        _write(self.dom, "memory.current", 8 * MiB + mem)
        return cg

    def remove(self, cid: str) -> None:
        records.remove_container(str(self.state), cid)
        shutil.rmtree(self.dom / cid)
        _write(self.dom, "memory.current", 8 * MiB)

    async def start(self, cid: str, **extra: Any) -> tuple[asyncio.Task[Any], FakeConn]:
        """A create asking, as the runtime does; its first frame is in conn.frames."""
        conn = FakeConn()
        msg = {"v": 1, "op": "start_sandbox", "sandbox": cid, "image": "cmd:sleep",
               "cgroups_path": "", **extra}
        task = asyncio.create_task(self.daemon.op_start_sandbox(msg, conn))  # type: ignore[arg-type]
        for _ in range(50):
            await asyncio.sleep(0)
            if conn.frames:
                break
        return task, conn

    def waiting(self) -> list[dict[str, Any]]:
        return self.engine.snapshot()["sandbox_admission"]["waiting"]


def test_start_sandbox_fields_are_checked_by_name() -> None:
    assert "'sandbox'" in (_start_sandbox_error({"image": "x"}) or "")
    assert "'image'" in (_start_sandbox_error({"sandbox": "c", "image": ""}) or "")
    assert "'cgroups_path'" in (_start_sandbox_error(
        {"sandbox": "c", "image": "x", "cgroups_path": 3}) or "")
    assert _start_sandbox_error({"sandbox": "c", "image": "x", "cgroups_path": "/a",
                                 "pod": "p", "hostname": "h", "caller_deadline": False}) is None
    assert "'caller_deadline'" in (_start_sandbox_error(
        {"sandbox": "c", "image": "x", "caller_deadline": "yes"}) or "")


def test_a_bad_request_is_refused_and_queues_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        bed = Bed(tmp_path)
        answer = await bed.daemon.op_start_sandbox({"sandbox": ["c"], "image": "x"},
                                                   FakeConn())  # type: ignore[arg-type]
        assert answer is not None and answer["ok"] is False and "'sandbox'" in answer["error"]
        assert bed.waiting() == []

    asyncio.run(scenario())


def test_a_create_waits_for_room_and_starts_when_the_other_sandbox_goes(tmp_path: Path) -> None:
    async def scenario() -> None:
        bed = Bed(tmp_path)
        events = bed.engine.events.subscribe()
        bed.sandbox("filler", 170 * MiB)
        bed.engine.tick()
        task, conn = await bed.start("new")
        assert conn.frames[0]["queued"] is True and conn.frames[0]["max_wait_s"] == 100.0
        assert conn.frames[0]["baseline"] == 48 * MiB  # no history: the default
        # 170 MiB resident + 48 MiB baseline + 32 MiB one call > 224 MiB
        [w] = bed.waiting()
        assert w["sandbox_id"] == "new" and "short" in w["reason"], w
        bed.clock.t += 3
        bed.engine.tick()
        assert not task.done() and len(conn.frames) == 1
        bed.remove("filler")
        bed.clock.t += 1
        bed.engine.tick()
        await asyncio.wait_for(task, 1)
        final = conn.frames[1]
        assert final["admitted"] is True and final["verdict"] == "admitted", final
        assert final["waited_s"] == 4.0 and bed.waiting() == []
        kinds = []
        while not events.empty():
            e = events.get_nowait()
            if e.get("of") == "sandbox":
                kinds.append(e["event"])
        assert kinds == ["queued", "finished", "admitted"], kinds
        # The filler's baseline (what it held before any call) is learned for its image.
        pred = bed.engine.sandboxes.policy.model.predict("cmd:memload")
        assert pred.baseline_bytes == 170 * MiB and pred.source.startswith("image-history")
        assert bed.engine.snapshot()["sandbox_admission"]["totals"]["admitted"] == 1

    asyncio.run(scenario())


def test_an_expired_wait_starts_the_create_and_is_counted_fail_open(tmp_path: Path) -> None:
    async def scenario() -> None:
        bed = Bed(tmp_path, max_start_wait_s=5.0)
        bed.sandbox("filler", 200 * MiB)
        bed.engine.tick()
        task, conn = await bed.start("new")
        assert conn.frames[0]["max_wait_s"] == 5.0
        bed.clock.t += 5
        bed.engine.tick()
        await asyncio.wait_for(task, 1)
        assert conn.frames[1]["verdict"] == "fail-open", conn.frames[1]
        assert bed.engine.snapshot()["sandbox_admission"]["totals"]["fail-open"] == 1

    asyncio.run(scenario())


def test_a_create_without_a_caller_deadline_waits_past_kubelets_bound(tmp_path: Path) -> None:
    """Docker's create (caller_deadline false) is told its wait has no bound, and is still
    waiting where a kubelet create, or one from a runtime that does not say, went ahead."""
    async def scenario() -> None:
        bed = Bed(tmp_path, max_start_wait_s=5.0)
        bed.sandbox("filler", 200 * MiB)
        bed.engine.tick()
        docker, dconn = await bed.start("docker", caller_deadline=False)
        kubelet, kconn = await bed.start("kubelet", caller_deadline=True)
        older, oconn = await bed.start("older")
        assert dconn.frames[0]["max_wait_s"] == float("inf")
        assert kconn.frames[0]["max_wait_s"] == oconn.frames[0]["max_wait_s"] == 5.0
        bed.clock.t += 5
        bed.engine.tick()
        await asyncio.wait_for(asyncio.gather(kubelet, older), 1)
        assert kconn.frames[1]["verdict"] == oconn.frames[1]["verdict"] == "fail-open"
        assert not docker.done() and [w["sandbox_id"] for w in bed.waiting()] == ["docker"]
        dconn.hung_up.set()
        await asyncio.wait_for(docker, 1)

    asyncio.run(scenario())


def test_a_bundle_kubelet_asked_for_says_its_caller_has_a_deadline() -> None:
    """The CRI runtimes annotate what kubelet asks for; Docker's and Podman's bundles do not."""
    assert Bundle(path="/b", annotations={"io.kubernetes.cri.container-type": "container"}
                  ).caller_deadline()
    assert Bundle(path="/b", annotations={"io.kubernetes.cri-o.ContainerType": "container"}
                  ).caller_deadline()
    assert not Bundle(path="/b", annotations={"org.opencontainers.image.ref.name": "x"}
                      ).caller_deadline()
    assert not Bundle(path="/b").caller_deadline()


def test_a_create_that_hangs_up_is_forgotten(tmp_path: Path) -> None:
    async def scenario() -> None:
        bed = Bed(tmp_path)
        bed.sandbox("filler", 200 * MiB)
        bed.engine.tick()
        task, conn = await bed.start("new")
        assert len(bed.waiting()) == 1
        conn.hung_up.set()
        assert await asyncio.wait_for(task, 1) is None
        assert bed.waiting() == [] and bed.engine.sandboxes.stats["cancelled"] == 1
        # The same sandbox may ask again (its create was retried).
        task, conn = await bed.start("new")
        assert conn.frames[0]["queued"] is True
        conn.hung_up.set()
        await asyncio.wait_for(task, 1)

    asyncio.run(scenario())


def test_a_create_gone_before_it_hears_queued_is_forgotten(tmp_path: Path) -> None:
    """Its `queued` frame meets a broken pipe: the wait ends there, not at max_start_wait_s,
    and no error traceback is logged for it (issue 21, item 6)."""
    async def scenario() -> None:
        bed = Bed(tmp_path)
        bed.sandbox("filler", 200 * MiB)
        bed.engine.tick()

        class Gone(FakeConn):
            async def send(self, msg: dict[str, Any]) -> None:
                raise BrokenPipeError("the runtime is gone")

        msg = {"v": 1, "op": "start_sandbox", "sandbox": "new", "image": "cmd:sleep"}
        assert await bed.daemon.op_start_sandbox(msg, Gone()) is None  # type: ignore[arg-type]
        assert bed.waiting() == [] and bed.engine.sandboxes.stats["cancelled"] == 1

    asyncio.run(scenario())


def test_a_restarted_container_asks_again_and_is_admitted(tmp_path: Path) -> None:
    async def scenario() -> None:
        bed = Bed(tmp_path)
        bed.engine.tick()
        for _ in range(2):  # the second create comes within settle_s of the first
            task, conn = await bed.start("box")
            await asyncio.wait_for(task, 1)
            assert conn.frames[1]["verdict"] == "admitted", conn.frames

    asyncio.run(scenario())


def test_the_snapshot_counts_calls_by_charge_and_sandboxes_without_them(tmp_path: Path) -> None:
    async def scenario() -> None:
        bed = Bed(tmp_path)
        bed.sandbox("a", 150 * MiB)
        bed.engine.tick()
        info = CallInfo(call_id="tool-1", sandbox="a", argv=["pytest"])
        call = LiveCall(info, "a", str(bed.dom / "a" / "tool-1"), bed.clock(),
                        extra={"charge": 80 * MiB})
        call.last_mem = 50 * MiB
        bed.engine.calls["tool-1"] = call
        bed.engine.sandboxes.call_ended("a", 40 * MiB)  # an earlier call peaked at 40 MiB
        task, conn = await bed.start("new")
        snap = bed.engine.sandboxes.last
        assert snap is not None and snap.budget_bytes == BUDGET and snap.margin_bytes == 32 * MiB
        [box] = snap.sandboxes
        assert box.sandbox_id == "a" and box.resident_bytes == 100 * MiB
        assert box.idle_s is None and box.next_call_peak_bytes == 40 * MiB
        assert list(snap.running_call_bytes) == [80 * MiB] and snap.other_bytes == 8 * MiB
        conn.hung_up.set()
        await asyncio.wait_for(task, 1)

    asyncio.run(scenario())


def test_waiting_creates_are_decided_every_half_second_or_when_something_changed(
        tmp_path: Path) -> None:
    """While creates wait, measuring every sandbox each 0.1 s period took a third of the
    daemon's CPU in the 15x burst: the domain is measured again after WAITING_STEP_S, or at
    the next period after a create came or a call began or ended, not at every period."""
    async def scenario() -> None:
        bed = Bed(tmp_path)
        bed.sandbox("filler", 170 * MiB)
        bed.engine.tick()
        task, conn = await bed.start("new")
        first = bed.engine.sandboxes.last
        assert first is not None
        bed.clock.t += WAITING_STEP_S / 5
        bed.engine.tick()  # nothing changed: no new measure
        assert bed.engine.sandboxes.last is first
        info = CallInfo(call_id="tool-1", sandbox="filler", argv=["pytest"])
        bed.engine.calls["tool-1"] = LiveCall(info, "filler", str(bed.dom / "filler" / "t"),
                                              bed.clock())
        bed.engine.tick()  # a call began: measured at once
        second = bed.engine.sandboxes.last
        assert second is not first
        bed.engine.tick()
        assert bed.engine.sandboxes.last is second
        task2, conn2 = await bed.start("newer")  # a create came
        assert bed.engine.sandboxes.last is not second
        third = bed.engine.sandboxes.last
        bed.clock.t += WAITING_STEP_S
        bed.engine.tick()  # half a second on
        assert bed.engine.sandboxes.last is not third
        for c in (conn, conn2):
            c.hung_up.set()
        await asyncio.wait_for(asyncio.gather(task, task2), 1)

    asyncio.run(scenario())


def test_a_sandbox_teaches_what_its_calls_left_behind_not_its_page_cache(tmp_path: Path) -> None:
    """A sandbox's baseline is what it held outside calls at its largest, leftovers in tmpfs or
    shm included (the policy's reserve_growth sets that aside for live sandboxes); it was
    measured only before the first call, so the leftovers went unlearned. Page cache the kernel
    drops before an OOM kill is not counted; nor is a sample taken while a call of it is live.
    What it held before its first call is learned too: what a new sandbox arrives with."""
    bed = Bed(tmp_path)
    cg = bed.sandbox("a", 40 * MiB)
    bed.engine.tick()
    bed.engine.sandboxes.call_arrived("a")
    info = CallInfo(call_id="tool-1", sandbox="a", argv=["pytest"])
    call = LiveCall(info, "a", str(cg / "tool-1"), bed.clock(), extra={"charge": 90 * MiB})
    call.last_mem = 20 * MiB  # sampled before it grew: the sandbox's 150 MiB is mostly the call
    bed.engine.calls["tool-1"] = call
    _write(cg, "memory.current", 150 * MiB)
    bed.clock.t += 3
    bed.engine.tick()
    del bed.engine.calls["tool-1"]  # it ended, leaving 25 MiB in /dev/shm and 20 of cache
    _write(cg, "memory.current", 85 * MiB)
    (cg / "memory.stat").write_text(f"anon {40 * MiB}\nfile {45 * MiB}\nshmem {25 * MiB}\n")
    bed.clock.t += 3
    bed.engine.tick()
    bed.remove("a")
    bed.clock.t += 3
    bed.engine.tick()
    model = bed.engine.sandboxes.policy.model
    assert model.mean_baseline("cmd:memload") == 65 * MiB  # what its sandboxes grow to
    assert model.predict("cmd:memload").baseline_bytes == 40 * MiB  # what a new one arrives with


def _learned(bed: Bed, cid: str) -> dict[str, list]:
    """What sandbox cid taught its image, once removed."""
    bed.remove(cid)
    bed.clock.t += 3
    bed.engine.tick()
    return bed.engine.sandboxes.policy.model.export()["cmd:memload"]


def test_what_a_sandbox_holds_after_calls_is_never_taken_for_its_start(tmp_path: Path) -> None:
    """Its start is what it held before any call: not learned where a call came before the
    daemon found its record (an agent's exec right after the create) nor for a sandbox
    created before the daemon (a restart: its past is unknown). A call running unadmitted in
    a tool cgroup (its runtime could not reach the daemon) is not the sandbox's memory."""
    bed = Bed(tmp_path)
    bed.engine.sandboxes.call_arrived("early")  # before the rescan that finds it
    bed.sandbox("early", 70 * MiB)
    bed.clock.t += 3
    bed.engine.tick()
    assert _learned(bed, "early") == {"baselines": [70 * MiB], "call_peaks": [],
                                     "call_loads": [], "starts": [None]}
    cg = bed.sandbox("old", 50 * MiB)
    records.save_container(str(bed.state), {"id": "old", "managed": True, "cgroup": str(cg),
                                            "image": "cmd:memload", "created": time.time() - 60})
    bed.clock.t += 3
    bed.engine.tick()
    assert _learned(bed, "old")["starts"] == [None, None]
    cg = bed.sandbox("box", 40 * MiB)
    bed.clock.t += 3
    bed.engine.tick()
    tool = cg / "tool-0123456789ab"
    tool.mkdir()
    _write(tool, "cgroup.events", "populated 1")
    _write(cg, "memory.current", 150 * MiB)  # 110 of it the unadmitted call's
    bed.clock.t += 3
    bed.engine.tick()
    _write(tool, "cgroup.events", "populated 0")
    _write(cg, "memory.current", 60 * MiB)  # what it left
    bed.clock.t += 3
    bed.engine.tick()
    learned = _learned(bed, "box")
    assert learned["baselines"][-1] == 60 * MiB and learned["starts"][-1] == 40 * MiB, learned


def test_a_started_sandboxs_calls_teach_its_images_call_load_while_it_lives(
        tmp_path: Path) -> None:
    """The engine's ended calls reach sandbox admission: before a sandbox of the image has
    finished, the live ones' calls make its call load (learn_from_live)."""
    async def scenario() -> None:
        bed = Bed(tmp_path)
        bed.engine.tick()
        task, conn = await bed.start("box")
        await asyncio.wait_for(task, 1)
        assert conn.frames[-1]["verdict"] == "admitted", conn.frames
        policy = bed.engine.sandboxes.policy
        bed.engine.sandboxes.call_ended("box", 40 * MiB, 30.0)
        bed.engine.sandboxes.call_ended("box", None, 30.0)  # no peak measured: nothing
        bed.sandbox("box", 100 * MiB)  # its record, as the runtime writes it after create
        bed.clock.t += 60.0
        assert policy.call_load() == 40 * MiB * 30 // 60
        # Minutes with no create waiting: the daemon only rescans, and the sandbox it knows
        # stays counted (a step with no sandboxes took it for gone after settle_s).
        for _ in range(3):
            bed.clock.t += 60.0
            bed.engine.tick()
        assert policy.call_load() == 40 * MiB * 30 // 240
        bed.remove("box")
        bed.clock.t += 60.0
        bed.engine.tick()
        assert policy.call_load() == 0

    asyncio.run(scenario())


def test_the_snapshot_offers_swap_room_within_the_sandboxes_swap_max(tmp_path: Path) -> None:
    """What swap can absorb of arriving baselines: the host's free swap (faked here: this host's
    own is not the test's), within [residency] swap_max, at the configured bandwidth until
    reclaims measured one."""
    async def scenario() -> None:
        bed = Bed(tmp_path, default_start_s=0.0)  # nothing absorbed: the create keeps waiting
        res = bed.engine.residency
        res.swap_free = lambda: 900 * MiB  # type: ignore[method-assign]
        bed.sandbox("a", 150 * MiB)
        bed.engine.tick()
        task, conn = await bed.start("new")
        snap = bed.engine.sandboxes.last
        assert snap is not None and snap.swap_free_bytes == 900 * MiB
        assert snap.swap_out_bytes_per_s == 256 * MiB  # [headroom] swap_out_bytes_per_s
        res.swap_out_rate = 5.0 * MiB  # reclaims here achieved 5 MiB/s
        res.cfg = dataclasses.replace(res.cfg, swap_max=str(300 * MiB))
        bed.clock.t += WAITING_STEP_S
        bed.engine.tick()
        snap = bed.engine.sandboxes.last
        assert snap is not None and snap.swap_free_bytes == 300 * MiB
        assert snap.swap_out_bytes_per_s == 5.0 * MiB
        res.cfg = dataclasses.replace(res.cfg, swap_max="0")
        bed.clock.t += WAITING_STEP_S
        bed.engine.tick()
        assert bed.engine.sandboxes.last.swap_free_bytes == 0  # type: ignore[union-attr]
        # the swap room call admission counts as memory: calls run on it (sandbox_admission)
        bed.engine._swap_credit = lambda: 123 * MiB  # type: ignore[method-assign]
        bed.clock.t += WAITING_STEP_S
        bed.engine.tick()
        snap = bed.engine.sandboxes.last
        assert snap is not None and snap.swap_credit_bytes == 123 * MiB
        conn.hung_up.set()
        await asyncio.wait_for(task, 1)

    asyncio.run(scenario())


def test_an_idle_sandbox_makes_room_it_is_asked_to_give(tmp_path: Path) -> None:
    async def scenario() -> None:
        bed = Bed(tmp_path)
        bed.sandbox("idle", 200 * MiB, file=150 * MiB)  # page cache: reclaimable, swap or not
        bed.engine.tick()
        task, conn = await bed.start("new")
        await asyncio.wait_for(task, 1)
        # pinned 50 + other 8 + baseline 48 + one call 32 = 138 MiB <= 224 MiB
        assert conn.frames[1]["verdict"] == "admitted", conn.frames
        [box] = bed.engine.sandboxes.last.sandboxes  # type: ignore[union-attr]
        assert box.reclaimable_bytes == 150 * MiB and box.idle_s is not None
        # ... on 64 MiB of it (138 + 150 - 224): residency is asked for them.
        assert bed.engine.residency.room_wanted() == 64 * MiB

    asyncio.run(scenario())


def test_a_create_admitted_on_the_swap_credit_asks_residency_for_it(tmp_path: Path) -> None:
    """The calls term's part left to swap (the credit it used) is pushed out of idle sandboxes
    ahead of the calls, beside the arriving baseline: not left to the kernel as they grow."""
    async def scenario() -> None:
        bed = Bed(tmp_path, default_call_peak_bytes="150m")
        bed.engine.residency.swap_free = lambda: 900 * MiB  # type: ignore[method-assign]
        bed.engine._swap_credit = lambda: 123 * MiB  # type: ignore[method-assign]
        bed.sandbox("idle", 200 * MiB, file=150 * MiB)
        bed.engine.tick()
        task, conn = await bed.start("new")
        await asyncio.wait_for(task, 1)
        # pinned 50 + other 8 + one call 150 - 123 on swap + baseline 48 absorbed = 85 MiB
        assert conn.frames[1]["verdict"] == "admitted", conn.frames
        # all of it in RAM would be 58 + 150 + 150 idle + 48 = 406 MiB: 182 MiB over 224
        assert bed.engine.residency.room_wanted() == 182 * MiB

    asyncio.run(scenario())


def test_a_create_outside_a_cgroup_domain_is_admitted_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        bed = Bed(tmp_path)
        bed.sandbox("filler", 220 * MiB)
        bed.engine.tick()
        task, conn = await bed.start("new", cgroups_path="other.slice:docker:new")
        await asyncio.wait_for(task, 1)
        assert conn.frames[1]["admitted"] is True and "outside" in conn.frames[1]["reason"]
        assert bed.engine.sandboxes.stats["outside_domain"] == 1

    asyncio.run(scenario())


def test_cgroups_paths_resolve_as_runc_does() -> None:
    assert cgroup_dir("a-b.slice:docker:x", "/cg") == "/cg/a.slice/a-b.slice/docker-x.scope"
    assert cgroup_dir(":docker:x", "/cg") == "/cg/system.slice/docker-x.scope"
    assert cgroup_dir("/docker/x", "/cg") == "/cg/docker/x"
    assert cgroup_dir("", "/cg") is None
    assert within("/cg/a.slice/x", "/cg/a.slice/") and not within("/cg/a.slicex", "/cg/a.slice")


def test_image_key_prefers_annotations_then_the_init_program() -> None:
    spec = Bundle(path="/b", annotations={"io.kubernetes.cri.image-name": "docker.io/a:1"},
                  args=["/bin/sleep", "inf"])
    assert image_key(spec) == "docker.io/a:1"
    spec.annotations["execgate.image"] = "agent"
    assert image_key(spec) == "agent"
    assert image_key(Bundle(path="/b", args=["/usr/bin/memload", "-x"])) == "cmd:memload"
    assert image_key(Bundle(path="/b")) == "default"


def test_the_runtime_fails_open_on_a_silent_daemon(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(srv.accept()[0]), daemon=True).start()
    t0 = time.monotonic()
    answer, why = start_admit.ask(path, 0.2, {"sandbox": "c", "image": "x"})
    assert answer is None and "unavailable" in why and time.monotonic() - t0 < 2
    srv.close()
    for s in held:
        s.close()
    os.unlink(path)


def test_learned_baselines_survive_a_restart_and_a_bad_file_is_no_failure(
        tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    bed.sandbox("a", 70 * MiB)
    bed.engine.tick()
    bed.remove("a")
    bed.clock.t += 3
    bed.engine.tick()  # a is gone: its baseline is learned, and kept
    saved = tmp_path / "state" / "baselines.json"
    assert saved.exists()
    again = Engine(bed.daemon.cfg, bed.engine.settings, bed.clock)  # a restarted daemon
    pred = again.sandboxes.policy.model.predict("cmd:memload")
    assert pred.baseline_bytes == 70 * MiB and pred.source.startswith("image-history"), pred
    # A corrupt or hand-edited file: logged, and what can be read still serves.
    saved.write_text('{"cmd:memload": {"baselines": [1048576, "x"], "call_peaks": "y"}, '
                     '"other": 3, "third": {"baselines": null}}')
    pred = Engine(bed.daemon.cfg, bed.engine.settings, bed.clock) \
        .sandboxes.policy.model.predict("cmd:memload")
    assert pred.baseline_bytes == 1 * MiB, pred
    saved.write_text("{not json")
    pred = Engine(bed.daemon.cfg, bed.engine.settings, bed.clock) \
        .sandboxes.policy.model.predict("cmd:memload")
    assert pred.source == "default", pred


def test_a_create_waits_while_max_launching_others_have_not_started(tmp_path: Path) -> None:
    """Room for both, but one create under way at most: the second goes once the first's
    record says its runtime's start has run (prepared), not when runc create has. While the
    bound holds, nothing can start but by its wait's bound: the same sandboxes are not
    measured again (one come or gone is: the policy forgets a start it does not see live)."""
    async def scenario() -> None:
        bed = Bed(tmp_path, max_launching=1)
        bed.engine.tick()
        task_a, conn_a = await bed.start("a")
        bed.engine.tick()
        await asyncio.wait_for(task_a, 1)
        assert conn_a.frames[1]["verdict"] == "admitted"
        task_b, conn_b = await bed.start("b")
        [w] = bed.waiting()
        assert "1 admitted creates not yet started (max_launching 1)" in w["reason"], w
        cg = bed.sandbox("a", 20 * MiB)  # runc create has run: its record, not yet prepared
        rec = records.load_container(str(bed.state), "a")
        records.save_container(str(bed.state), {**rec, "prepared": False, "cgroup": str(cg)})
        bed.clock.t += WAITING_STEP_S
        bed.engine.tick()
        assert not task_b.done() and [w["sandbox_id"] for w in bed.waiting()] == ["b"]
        held = bed.engine.sandboxes.last  # a came: measured
        assert held is not None and [s.sandbox_id for s in held.sandboxes] == ["a"]
        bed.clock.t += WAITING_STEP_S
        bed.engine.tick()
        assert not task_b.done() and bed.engine.sandboxes.last is held  # decided, not measured
        assert bed.engine.sandboxes.stats["steps_unmeasured"] >= 1
        records.save_container(str(bed.state), {**rec, "prepared": True, "cgroup": str(cg)})
        bed.clock.t += WAITING_STEP_S
        bed.engine.tick()
        await asyncio.wait_for(task_b, 1)
        assert bed.engine.sandboxes.last is not held  # measured again once it could start
        assert conn_b.frames[1]["verdict"] == "admitted" and bed.waiting() == []
        sa = bed.engine.snapshot()["sandbox_admission"]
        assert (sa["launching"], sa["max_launching"]) == (1, 1)

    asyncio.run(scenario())


def test_a_container_recreated_before_a_rescan_is_still_decided(tmp_path: Path) -> None:
    """docker restart: its record goes and the same id asks again before the daemon has seen
    the old one go; learning from the old life dropped the new create, which then waited
    forever (Docker's creates have no bound)."""
    async def scenario() -> None:
        bed = Bed(tmp_path)
        bed.sandbox("x", 20 * MiB)
        bed.engine.tick()
        bed.clock.t += RESCAN_S
        bed.engine.tick()  # x is live
        bed.remove("x")
        task, conn = await bed.start("x")
        bed.clock.t += WAITING_STEP_S
        bed.engine.tick()
        await asyncio.wait_for(task, 1)
        assert conn.frames[1]["verdict"] == "admitted" and bed.waiting() == []

    asyncio.run(scenario())
