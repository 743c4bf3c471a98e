"""Sandbox admission: a create starts when pinned memory + its baseline + one call fits budget − S;
FIFO, always when nothing is live, fail open after max_start_wait_s; baselines learned per image."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from execgate.common.units import GiB, MiB
from execgate.policy.headroom import LiveSandbox
from execgate.policy.sandbox_admission import (
    LIVE_LOAD_MIN_S,
    BaselineModel,
    DomainSnapshot,
    SandboxAdmission,
    SandboxAdmissionConfig,
    SandboxRequest,
    Verdict,
    high_quantile,
)

# max_launching 0: memory alone decides here; the bound on creates under way has its own tests.
CFG = SandboxAdmissionConfig(default_baseline_bytes=256 * MiB, default_call_peak_bytes=256 * MiB,
                             max_start_wait_s=100.0, settle_s=60.0, max_launching=0)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(cfg: SandboxAdmissionConfig = CFG) -> tuple[SandboxAdmission, Clock]:
    clock = Clock()
    return SandboxAdmission(cfg, clock), clock


def snap(*boxes: LiveSandbox, budget: int = 2 * GiB, margin: int = 0,
         calls: tuple[int, ...] = (), other: int = 0) -> DomainSnapshot:
    return DomainSnapshot(budget, margin, boxes, calls, other)


def active(sid: str, resident: int, peak: int = 256 * MiB) -> LiveSandbox:
    return LiveSandbox(sid, resident, 0, None, peak)


def one(adm: SandboxAdmission, s: DomainSnapshot) -> dict[str, Verdict]:
    return {d.sandbox_id: d.verdict for d in adm.step(s)}


def test_admits_when_pinned_plus_baseline_plus_one_call_fits_budget_minus_margin() -> None:
    adm, _ = make()
    adm.submit(SandboxRequest("new", "py"))
    # 1 GiB pinned + 256 MiB baseline + 256 MiB call = 1.5 GiB <= 2 GiB − 512 MiB
    [d] = adm.step(snap(active("a", 1 * GiB), margin=512 * MiB))
    assert d.verdict is Verdict.ADMITTED and d.start
    assert (d.need_bytes, d.room_bytes, d.short_bytes) == (1536 * MiB, 1536 * MiB, 0)
    assert "admitted" in d.reason and "budget - S" in d.reason


def test_waits_when_it_does_not_fit_and_says_by_how_much() -> None:
    adm, clock = make()
    adm.submit(SandboxRequest("new", "py"))
    clock.t += 5
    [d] = adm.step(snap(active("a", 1 * GiB), margin=600 * MiB))
    assert d.verdict is Verdict.WAITING and not d.start
    assert d.short_bytes == 88 * MiB
    assert d.reason.startswith("waiting 5.0 s of 100 s") and "short 88 MiB" in d.reason
    # still queued, and status shows why
    [w] = adm.snapshot()["waiting"]
    assert w["sandbox_id"] == "new" and w["reason"] == d.reason


def test_one_call_term_is_the_largest_next_call_peak_including_the_new_sandbox() -> None:
    adm, _ = make()
    adm.submit(SandboxRequest("new", "py", call_peak_bytes=100 * MiB))
    # a's next call may peak at 700 MiB: 768 + 256 + 700 = 1724 MiB > 1.5 GiB room
    [d] = adm.step(snap(active("a", 768 * MiB, peak=700 * MiB), margin=512 * MiB))
    assert d.verdict is Verdict.WAITING and d.call_peak_bytes == 700 * MiB
    assert "next peak of a" in d.reason
    # the new sandbox's own first call counts too
    adm2, _ = make()
    adm2.submit(SandboxRequest("big", "py", call_peak_bytes=900 * MiB))
    [d2] = adm2.step(snap(active("a", 512 * MiB, peak=100 * MiB), margin=512 * MiB))
    assert d2.verdict is Verdict.WAITING and d2.call_peak_bytes == 900 * MiB


def test_pinned_counts_active_sandboxes_and_idle_ones_less_reclaimable() -> None:
    adm, _ = make()
    adm.submit(SandboxRequest("new", "py"))
    idle = LiveSandbox("idle", 600 * MiB, reclaimable_bytes=500 * MiB, idle_s=30.0)
    busy = LiveSandbox("busy", 600 * MiB, reclaimable_bytes=500 * MiB, idle_s=None)
    # pinned = 100 (idle) + 600 (busy: gives nothing back) + 24 (other) = 724 MiB; the running
    # call's 300 MiB charge exceeds the one-call term (256), so it stands for both
    [d] = adm.step(snap(idle, busy, calls=(300 * MiB,), other=24 * MiB))
    assert d.need_bytes == (724 + 256 + 300) * MiB and d.verdict is Verdict.ADMITTED
    assert "running calls 300 MiB" in d.reason


def test_running_calls_and_the_next_call_share_one_room_not_two() -> None:
    """A running call's room is the next call's once it ends: the new baseline must fit beside
    the running calls at their charges and beside the largest next call, not beside both."""
    adm, _ = make()
    adm.submit(SandboxRequest("new", "py", call_peak_bytes=100 * MiB))
    a = active("a", 512 * MiB, peak=600 * MiB)
    # room 1.5 GiB: 512 + 256 + max(400 running, 600 next) = 1368 MiB fits; the sum
    # (512 + 256 + 400 + 600 = 1768 MiB) would not
    [d] = adm.step(snap(a, margin=512 * MiB, calls=(250 * MiB, 150 * MiB)))
    assert d.verdict is Verdict.ADMITTED and d.need_bytes == 1368 * MiB
    assert "one call 600 MiB (next peak of a)" in d.reason
    # running calls larger than the next call: they are the term
    adm2, _ = make()
    adm2.submit(SandboxRequest("new", "py", call_peak_bytes=100 * MiB))
    [d2] = adm2.step(snap(active("a", 512 * MiB, peak=200 * MiB), margin=512 * MiB,
                          calls=(500 * MiB, 300 * MiB)))
    assert d2.verdict is Verdict.WAITING and d2.need_bytes == (512 + 256 + 800) * MiB
    assert "running calls 800 MiB" in d2.reason


def test_always_admits_when_nothing_is_live_but_the_next_one_waits() -> None:
    adm, _ = make()
    adm.submit(SandboxRequest("a", "huge", call_peak_bytes=4 * GiB))
    adm.submit(SandboxRequest("b", "py"))
    out = adm.step(snap(budget=1 * GiB))
    assert [d.verdict for d in out] == [Verdict.ADMITTED, Verdict.WAITING]
    assert "nothing live" in out[0].reason and out[0].short_bytes > 0
    # a, admitted but not yet in the snapshot, counts at its prediction: b still waits
    assert one(adm, snap(budget=1 * GiB)) == {"b": Verdict.WAITING}


def test_fifo_a_later_small_sandbox_does_not_overtake_an_older_waiting_one() -> None:
    adm, clock = make()
    adm.submit(SandboxRequest("big", "py", call_peak_bytes=1 * GiB))
    clock.t += 1
    adm.submit(SandboxRequest("small", "py", call_peak_bytes=1 * MiB))
    s = snap(active("a", 1 * GiB, peak=1 * MiB))
    out = adm.step(s)
    assert [(d.sandbox_id, d.verdict) for d in out] == [
        ("big", Verdict.WAITING), ("small", Verdict.WAITING)]
    assert "behind big" in out[1].reason
    # once big fits, both go, oldest first, each counting the one admitted before it
    out = adm.step(snap(active("a", 256 * MiB, peak=1 * MiB), budget=3 * GiB))
    assert [(d.sandbox_id, d.verdict) for d in out] == [
        ("big", Verdict.ADMITTED), ("small", Verdict.ADMITTED)]
    assert out[1].need_bytes == (256 + 256 + 256) * MiB + 1 * GiB


def test_admitting_several_in_one_step_stops_when_the_room_is_used() -> None:
    adm, clock = make()
    for sid in "abcd":
        adm.submit(SandboxRequest(sid, "py"))
        clock.t += 1
    # room 1.5 GiB: a (512 + 256) ... each adds 256 MiB of baseline, the call term stays 256
    out = one(adm, snap(active("x", 512 * MiB), budget=1536 * MiB))
    assert out == {"a": Verdict.ADMITTED, "b": Verdict.ADMITTED, "c": Verdict.ADMITTED,
                   "d": Verdict.WAITING}


def test_fail_open_after_max_start_wait_with_the_reason_and_a_count() -> None:
    adm, clock = make()
    ticket = adm.submit(SandboxRequest("new", "py"))
    assert ticket.deadline == ticket.arrival + 100.0
    full = snap(active("a", 2 * GiB))
    clock.t += 99.9
    assert one(adm, full) == {"new": Verdict.WAITING}
    clock.t += 0.1
    [d] = adm.step(full)
    assert d.verdict is Verdict.FAIL_OPEN and d.start
    assert d.reason.startswith("fail open: waited 100.0 s >= max_start_wait_s 100 s")
    status = adm.snapshot()
    assert status["waiting"] == [] and status["totals"] == {"admitted": 0, "fail-open": 1}
    # it is live now: it counts against the next one
    adm.submit(SandboxRequest("next", "py"))
    [n] = adm.step(snap(budget=600 * MiB))
    assert n.verdict is Verdict.WAITING and n.need_bytes == (256 + 256 + 256) * MiB


def test_default_wait_is_below_kubelets_runtime_request_timeout() -> None:
    assert SandboxAdmissionConfig().max_start_wait_s < 120.0


def test_an_admitted_sandbox_counts_its_predicted_baseline_until_settled() -> None:
    """The rule without reserve_growth: the prediction counts until the first call."""
    adm, clock = make(dataclasses.replace(CFG, reserve_growth=False))
    adm.submit(SandboxRequest("a", "py"))
    adm.step(snap())
    adm.submit(SandboxRequest("b", "py"))
    # a has started with only 10 MiB so far: it still counts 256 MiB
    starting = LiveSandbox("a", 10 * MiB, 0, None, 0)
    [d] = adm.step(snap(starting))
    assert d.need_bytes == (256 + 256 + 256) * MiB
    adm.cancel("b")
    adm.settled("a")
    adm.submit(SandboxRequest("c", "py"))
    [d] = adm.step(snap(starting))
    assert d.need_bytes == (10 + 256 + 256) * MiB
    # without settled, the reservation lapses after settle_s
    adm.submit(SandboxRequest("d", "py"))
    adm.step(snap(budget=8 * GiB))
    clock.t += 60.0
    adm.submit(SandboxRequest("e", "py"))
    assert adm.step(snap(budget=8 * GiB))[0].need_bytes == 512 * MiB


def test_a_starting_sandbox_counts_only_the_baseline_it_has_yet_to_allocate() -> None:
    """Memory it allocated and residency pushed out has arrived: it is not counted again."""
    adm, _ = make()
    adm.submit(SandboxRequest("a", "py"))
    adm.step(snap())
    adm.submit(SandboxRequest("b", "py"))
    adm.step(snap(LiveSandbox("a", 200 * MiB, 0, None, 0), budget=MiB))  # b waits: a seen 200
    # a's 200 MiB pushed out to 20: it pins 20 and has 56 MiB of its 256 MiB still to come
    [d] = adm.step(snap(LiveSandbox("a", 20 * MiB, 0, None, 0), budget=MiB))
    assert d.need_bytes == (20 + 56 + 256 + 256) * MiB


def test_swap_absorbs_arriving_baselines_over_a_learned_start() -> None:
    """With swap, a baseline needs room only for its arrival: what swap-out moves during a start
    (its bandwidth over the measured start time, within swap's free room) is not counted.
    (Without reserve_growth: a settled sandbox counts what it holds.)"""
    adm, clock = make(dataclasses.replace(CFG, default_start_s=0.0, reserve_growth=False))
    adm.submit(SandboxRequest("a", "py"))
    adm.step(snap())
    adm.submit(SandboxRequest("b", "py"))
    swap = {"swap_free_bytes": 1 * GiB, "swap_out_bytes_per_s": 10.0 * MiB}
    tight = DomainSnapshot(700 * MiB, 0, (), (), 0, **swap)
    # no start measured yet, none assumed: a's and b's baselines count whole, with b's call
    [d] = adm.step(tight)
    assert d.verdict is Verdict.WAITING and d.need_bytes == (256 + 256 + 256) * MiB
    assert "swap absorbs 0 B" in d.reason
    # the default assumes a start of 1 s: 10 MiB absorbed
    assert make()[0].absorbable(tight) == 10 * MiB
    clock.t += 20.0
    adm.settled("a")  # a took 20 s from admission to its first call
    assert adm.snapshot()["start_s"] == 20.0
    # now a is live and pushed out to 16 MiB (its memory can leave: reclaimable), and swap
    # moves 10 MiB/s x 20 s = 200 MiB while b's baseline arrives
    a = LiveSandbox("a", 16 * MiB, reclaimable_bytes=16 * MiB, idle_s=5.0)
    [d] = adm.step(DomainSnapshot(512 * MiB, 0, (a,), (), 0, **swap))
    assert d.verdict is Verdict.ADMITTED and d.need_bytes == (56 + 256) * MiB
    assert "swap absorbs 200 MiB" in d.reason
    # swap's free room bounds it, and without swap nothing is absorbed
    adm.submit(SandboxRequest("c", "py"))
    small = {"swap_free_bytes": 100 * MiB, "swap_out_bytes_per_s": 10.0 * MiB}
    assert adm.absorbable(DomainSnapshot(GiB, 0, (), (), 0, **small)) == 100 * MiB
    assert adm.absorbable(DomainSnapshot(GiB, 0)) == 0
    # b (arriving 256) + c (256) - 100 absorbed = 412, + 256 one call
    [d] = adm.step(DomainSnapshot(GiB, 0, (a,), (), 0, **small))
    assert d.need_bytes == (412 + 256) * MiB


def test_cancel_drops_a_waiting_create_and_duplicates_are_refused() -> None:
    adm, _ = make()
    adm.submit(SandboxRequest("a", "py"))
    with pytest.raises(ValueError):
        adm.submit(SandboxRequest("a", "py"))
    assert adm.cancel("a") and not adm.cancel("a")
    assert adm.step(snap()) == []


def test_disabled_admits_every_create_at_once() -> None:
    adm, _ = make(SandboxAdmissionConfig(enabled=False))
    for sid in "ab":
        adm.submit(SandboxRequest(sid, "py"))
    assert one(adm, snap(active("x", 4 * GiB))) == {"a": Verdict.ADMITTED, "b": Verdict.ADMITTED}


def test_baseline_default_before_history_then_learned_per_image() -> None:
    model = BaselineModel(CFG)
    assert model.predict("py").baseline_bytes == 256 * MiB
    assert model.predict("py").source == "default"
    model.observe("py", 400 * MiB, call_peak_bytes=700 * MiB)
    p = model.predict("py")
    assert (p.baseline_bytes, p.call_peak_bytes) == (400 * MiB, 700 * MiB)
    assert p.source == "image-history (1 finished)"
    assert model.predict("node").baseline_bytes == 256 * MiB  # per image
    # a declared first-call peak wins over history
    assert model.predict("py", call_peak_bytes=50 * MiB).call_peak_bytes == 50 * MiB


def test_baseline_is_a_high_quantile_of_a_bounded_window() -> None:
    cfg = SandboxAdmissionConfig(history_window=4, baseline_quantile=0.75)
    model = BaselineModel(cfg)
    for mib in (900, 100, 200, 300, 400):  # 900 falls out of the window of 4
        model.observe("py", mib * MiB)
    assert model.predict("py").baseline_bytes == 300 * MiB
    assert model.snapshot()["py"] == {"finished": 4, "baseline_bytes": 300 * MiB,
                                      "grows_to_bytes": 250 * MiB, "call_load_bytes": 0}
    assert high_quantile([5, 1, 3], 1.0) == 5 and high_quantile([5, 1, 3], 0.01) == 1


def test_images_are_bounded_least_recently_finished_forgotten_first() -> None:
    model = BaselineModel(SandboxAdmissionConfig(max_images=2))
    model.observe("a", 1 * MiB)
    model.observe("b", 2 * MiB)
    model.observe("a", 1 * MiB)
    model.observe("c", 3 * MiB)
    assert sorted(model.snapshot()) == ["a", "c"]


def test_finished_sandboxes_teach_the_next_create_of_their_image() -> None:
    adm, _ = make()
    adm.submit(SandboxRequest("a", "py"))
    adm.step(snap())
    adm.finished("a", "py", 500 * MiB, call_peak_bytes=300 * MiB)
    ticket = adm.submit(SandboxRequest("b", "py"))
    assert ticket.prediction.baseline_bytes == 500 * MiB
    # 1024 + 500 + 300 MiB > 1.75 GiB: with the defaults (256 + 256) it would have started
    [d] = adm.step(snap(active("x", 1 * GiB), budget=1792 * MiB))
    assert d.verdict is Verdict.WAITING and d.need_bytes == (1024 + 500 + 300) * MiB


def test_config_rejects_nonsense() -> None:
    for bad in ({"baseline_quantile": 0}, {"history_window": 0}, {"max_start_wait_s": -1},
                {"max_start_wait_s_no_deadline": -1},
                {"default_baseline_bytes": -1}):
        with pytest.raises(ValueError):
            SandboxAdmissionConfig(**bad)


def test_one_call_term_is_the_largest_next_peak_of_live_started_and_own() -> None:
    """The one-call term is kept as a running max (one pass per step): each create's is the
    largest of the live sandboxes', those started this step and its own, waiting ones not."""
    import random

    rng = random.Random(7)
    for _ in range(50):
        adm, clock = make()
        boxes = [active(f"b{i}", rng.randrange(64) * MiB, rng.randrange(1, 900) * MiB)
                 for i in range(rng.randrange(0, 6))]
        reqs = [SandboxRequest(f"n{i}", "py", rng.choice([None, rng.randrange(1, 900) * MiB]))
                for i in range(rng.randrange(1, 8))]
        for r in reqs:
            adm.submit(r)
            clock.t += 1
        peaks = [(b.next_call_peak_bytes, b.sandbox_id) for b in boxes]
        for d in adm.step(snap(*boxes, budget=rng.randrange(1, 4) * GiB)):
            own = next(r for r in reqs if r.sandbox_id == d.sandbox_id)
            mine = own.call_peak_bytes if own.call_peak_bytes is not None else 256 * MiB
            assert d.call_peak_bytes == max([*peaks, (mine, d.sandbox_id)])[0]
            if d.start:
                peaks.append((mine, d.sandbox_id))


def test_the_history_exports_and_restores_whole_within_its_bounds() -> None:
    cfg = SandboxAdmissionConfig(history_window=2, max_images=2)
    model = BaselineModel(cfg)
    for image, base, peak, start in (("a", 10, None, None), ("a", 20, 5, 15), ("a", 30, 7, None),
                                     ("b", 40, 9, 35)):
        mib = None if peak is None else peak * MiB
        model.observe(image, base * MiB, mib, None if mib is None else mib // 2,
                      None if start is None else start * MiB)
    again = BaselineModel(cfg)
    again.restore(model.export())
    assert again.export() == model.export() == {
        "a": {"baselines": [20 * MiB, 30 * MiB], "call_peaks": [5 * MiB, 7 * MiB],
              "call_loads": [5 * MiB // 2, 7 * MiB // 2], "starts": [15 * MiB, None]},
        "b": {"baselines": [40 * MiB], "call_peaks": [9 * MiB], "call_loads": [9 * MiB // 2],
              "starts": [35 * MiB]}}
    assert again.call_load("a") == 3 * MiB
    # A new sandbox arrives with what they started with (a baseline where a start was not
    # measured); they grow to their baselines' mean.
    assert again.predict("a").baseline_bytes == 30 * MiB
    assert again.predict("b").baseline_bytes == 35 * MiB
    assert again.mean_baseline("a") == 25 * MiB
    bounded = BaselineModel(SandboxAdmissionConfig(history_window=1, max_images=1))
    bounded.restore(model.export())
    assert bounded.export() == {"b": {"baselines": [40 * MiB], "call_peaks": [9 * MiB],
                                      "call_loads": [9 * MiB // 2], "starts": [35 * MiB]}}
    older = BaselineModel(cfg)  # a file written before call loads and starts were kept
    older.restore({"a": {"baselines": [20 * MiB], "call_peaks": [5 * MiB]}})
    assert older.call_load("a") == 0 and older.predict("a").baseline_bytes == 20 * MiB
    older.observe("a", 60 * MiB, start_bytes=10 * MiB)  # one start beside an old baseline
    assert older.export()["a"]["starts"] == [None, 10 * MiB]
    assert older.predict("a").baseline_bytes == 20 * MiB  # not the lone start's 10


def test_starts_only_step_decides_as_the_full_step_and_snapshot_says_the_same() -> None:
    """step(waiting=False) leaves out the creates that wait (every one behind the first that
    waits: first in, first out): the starts are the full step's, the queue and totals after it
    too, and snapshot() formats the same reasons the full step gave each waiting create."""
    rng = random.Random(3)
    full, clock = make()
    lazy = SandboxAdmission(CFG, clock)
    live: list[LiveSandbox] = []
    for i in range(400):
        op = rng.random()
        if op < 0.4:
            req = SandboxRequest(f"s{i}", rng.choice(("py", "node")),
                                 rng.choice((None, 128 * MiB, 900 * MiB)))
            full.submit(req)
            lazy.submit(req)
        elif op < 0.5 and live:
            gone, baseline = live.pop(rng.randrange(len(live))), rng.randint(50, 400) * MiB
            for adm in (full, lazy):
                adm.finished(gone.sandbox_id, "py", baseline)
        else:
            s = snap(*live, budget=rng.choice((1, 2, 4)) * GiB, calls=(rng.randint(0, 600) * MiB,))
            every = full.step(s)
            started = lazy.step(s, waiting=False)
            assert started == [d for d in every if d.start]
            live += [LiveSandbox(d.sandbox_id, rng.randint(50, 300) * MiB, 0, None, 256 * MiB)
                     for d in started]
            if rng.random() < 0.3:
                assert lazy.snapshot() == full.snapshot()
        clock.t += rng.choice((0.1, 1.0, 30.0))
    assert lazy.snapshot() == full.snapshot()
    assert full.snapshot()["totals"]["fail-open"] > 0 and full.snapshot()["totals"]["admitted"] > 0


def _learn_load(adm: SandboxAdmission, image: str, load: int) -> None:
    """One finished sandbox of `image` whose calls averaged `load` bytes over its life."""
    adm.finished(f"gone-{image}", image, 100 * MiB, 50 * MiB, load)


def test_many_live_sandboxes_count_their_expected_calls_not_one_call() -> None:
    """Ten live sandboxes whose calls average 100 MiB each over their lives expect ~1 GiB of
    calls at once: more than any one call's 50 MiB peak, so that is what must fit."""
    adm, _ = make()
    _learn_load(adm, "py", 100 * MiB)
    boxes = []
    for i in range(10):
        adm.submit(SandboxRequest(f"s{i}", "py"))
        [d] = adm.step(snap(*boxes, budget=64 * GiB))
        assert d.start
        boxes.append(active(f"s{i}", 100 * MiB, peak=50 * MiB))
    assert adm.call_load() == 1000 * MiB and adm.snapshot()["call_load_bytes"] == 1000 * MiB
    adm.submit(SandboxRequest("new", "py"))
    # pinned 10 x 100 MiB + baseline 100 MiB + the eleven's calls 1100 MiB = 2200 MiB
    [d] = adm.step(snap(*boxes, budget=2199 * MiB))
    assert d.verdict is Verdict.WAITING and d.need_bytes == 2200 * MiB, d
    assert "call load 1.1 GiB (the live sandboxes" in d.reason, d.reason
    [d] = adm.step(snap(*boxes, budget=2200 * MiB))
    assert d.start
    # Without the load term one call's room was all that counted: 1000 + 100 + 50 MiB.
    off, _ = make(dataclasses.replace(CFG, count_call_load=False))
    _learn_load(off, "py", 100 * MiB)
    off.submit(SandboxRequest("new", "py"))
    [d] = off.step(snap(*boxes, budget=64 * GiB))
    assert d.need_bytes == 1150 * MiB and off.call_load() == 0


def test_the_load_leaves_with_its_sandbox_and_counts_per_image() -> None:
    adm, _ = make()
    _learn_load(adm, "py", 100 * MiB)
    _learn_load(adm, "go", 30 * MiB)
    for sid, image in (("a", "py"), ("b", "py"), ("c", "go")):
        adm.submit(SandboxRequest(sid, image))
    adm.step(snap(budget=64 * GiB))
    assert adm.call_load() == 230 * MiB
    adm.finished("a", "py", 100 * MiB)
    adm.cancel("c")
    assert adm.call_load() == 100 * MiB
    adm.live("d", "go")  # running before the daemon started
    adm.live("d", "go")  # told again: counted once
    assert adm.call_load() == 130 * MiB
    _learn_load(adm, "go", 90 * MiB)  # the image's mean moves: (30 + 90) / 2
    assert adm.call_load() == 160 * MiB


def test_an_image_without_history_adds_no_load() -> None:
    adm, _ = make()
    for sid in ("a", "b"):
        adm.submit(SandboxRequest(sid, "py"))
    adm.step(snap(budget=64 * GiB))
    assert adm.call_load() == 0
    adm.finished("x", "py", 100 * MiB)  # a baseline, but no call load measured
    assert adm.call_load() == 0


def test_a_live_sandbox_keeps_the_rest_of_its_predicted_baseline_for_its_life() -> None:
    """reserve_growth: its calls leave files and caches behind, up to the baseline its image's
    sandboxes ended with; what it has not grown to yet stays set aside after its first call."""
    adm, clock = make()
    adm.finished("old", "py", 600 * MiB, 100 * MiB, 10 * MiB)  # they end with 600 MiB
    adm.submit(SandboxRequest("a", "py"))
    adm.step(snap(budget=8 * GiB))
    clock.t += 5.0
    adm.settled("a")  # its first call: 200 MiB so far
    a = LiveSandbox("a", 200 * MiB, 0, None, 0)
    adm.submit(SandboxRequest("b", "py"))
    [d] = adm.step(snap(a, budget=8 * GiB))
    # a: 200 MiB held + 400 still to come; b: 600 MiB; one call 100 MiB (learned)
    assert d.need_bytes == (200 + 400 + 600 + 100) * MiB and d.start
    assert adm.call_load() == 20 * MiB  # a's and b's
    assert adm.snapshot()["starting"] == [
        {"sandbox_id": "b", "baseline_bytes": 600 * MiB, "admitted_at": clock.t}]
    assert adm.snapshot()["start_s"] == 5.0
    clock.t += 600.0  # long after settle_s: still counted while it lives
    a = LiveSandbox("a", 450 * MiB, 0, None, 0)
    b = LiveSandbox("b", 100 * MiB, 0, None, 0)
    adm.submit(SandboxRequest("c", "py"))
    [d] = adm.step(snap(a, b, budget=8 * GiB))
    assert d.need_bytes == (450 + 150 + 100 + 500 + 600 + 100) * MiB
    # a finished: nothing of it counts; b and c, not live for settle_s (gone unreported, or
    # their creates failed after admission): dropped, only d's own baseline and call count
    adm.finished("a", "py", 600 * MiB)
    adm.submit(SandboxRequest("d", "py"))
    clock.t += 61.0
    [d] = adm.step(snap(budget=8 * GiB))
    assert d.need_bytes == (600 + 100) * MiB and adm.call_load() == 10 * MiB  # d's
    assert [s["sandbox_id"] for s in adm.snapshot()["starting"]] == ["d"]


def test_growth_still_to_come_is_absorbed_by_swaps_free_room() -> None:
    """A settled sandbox grows over its life: with swap room to spare it goes there as it
    comes (residency pushes idle memory out), so only what swap cannot take counts."""
    adm, _ = make(dataclasses.replace(CFG, default_start_s=0.0))
    adm.finished("old", "py", 600 * MiB)
    adm.submit(SandboxRequest("a", "py"))
    adm.step(snap(budget=8 * GiB))
    adm.settled("a")
    a = LiveSandbox("a", 200 * MiB, 0, None, 0)
    adm.submit(SandboxRequest("b", "py"))
    for free, growth in ((0, 400), (100 * MiB, 300), (GiB, 0)):
        s = DomainSnapshot(8 * GiB, 0, (a,), (), 0, swap_free_bytes=free,
                           swap_out_bytes_per_s=10.0 * MiB)
        [d] = adm.step(s, waiting=True)
        assert d.need_bytes == (200 + growth + 600 + 256) * MiB, (free, d.reason)
        if growth:
            assert f"({growth} MiB of it growth to come)" in d.reason, d.reason
        adm.cancel("b")
        adm.submit(SandboxRequest("b", "py"))


def test_arrivals_take_of_the_free_swap_only_their_bytes() -> None:
    """What swap-out could move during a start is a reach, not a use: the arrivals take their
    bytes of the free swap, and the growth to come gets the rest. (Taking the whole reach left
    no room for growth at hardware speed: 1 GiB/s over a 1 s start took all of 1 GiB free,
    and 400 MiB of growth counted as pinned beside 600 MiB of swap nobody used.)"""
    adm, clock = make()
    adm.finished("old", "py", 600 * MiB)
    adm.submit(SandboxRequest("a", "py"))
    adm.step(snap(budget=8 * GiB))
    clock.t += 1.0
    adm.settled("a")  # a start of 1 s
    a = LiveSandbox("a", 200 * MiB, 0, None, 0)
    adm.submit(SandboxRequest("b", "py"))
    fast = DomainSnapshot(8 * GiB, 0, (a,), (), 0, swap_free_bytes=1 * GiB,
                          swap_out_bytes_per_s=1.0 * GiB)
    [d] = adm.step(fast, waiting=True)
    # b's 600 MiB arrive into swap; a's 400 MiB still to come fit the 424 MiB left
    assert d.need_bytes == (200 + 256) * MiB, d.reason
    assert "growth to come" not in d.reason


def test_calls_run_on_the_swap_credit_call_admission_counts() -> None:
    """Call admission runs calls on the swap credit (budget - S + credit): their charges may
    exceed budget - S while swap takes their cold pages. Sandbox admission lets its calls term
    use that credit, within what the arrivals leave of the free swap; none while the domain
    thrashes (credit 0) or with calls_on_swap off (the rule before)."""
    def need(credit: int, free: int, cfg: SandboxAdmissionConfig = CFG
             ) -> tuple[Verdict, int, int]:
        adm, _ = make(dataclasses.replace(cfg, default_start_s=1.0))
        adm.submit(SandboxRequest("b", "py"))
        s = DomainSnapshot(1 * GiB, 0, (active("a", 100 * MiB),), (1200 * MiB,), 0,
                           swap_free_bytes=free, swap_out_bytes_per_s=1.0 * GiB,
                           swap_credit_bytes=credit)
        [d] = adm.step(s, waiting=True)
        assert (d.verdict is Verdict.ADMITTED) == (d.need_bytes <= 1 * GiB), d.reason
        return d.verdict, d.need_bytes // MiB, d.on_swap_bytes // MiB
    # b's 256 MiB baseline arrives into swap; the running call's 1200 MiB, less 1 GiB of credit
    # (what residency is to push out ahead of them, beside the arrival)
    assert need(1 * GiB, 2 * GiB) == (Verdict.ADMITTED, 100 + 1200 - 1024, 1024)
    assert need(0, 2 * GiB) == (Verdict.WAITING, 100 + 1200, 0)  # thrashing: no credit
    off = dataclasses.replace(CFG, calls_on_swap=False)
    assert need(1 * GiB, 2 * GiB, off) == (Verdict.WAITING, 100 + 1200, 0)
    # 300 MiB free: the arrival takes 256 of it, calls get the 44 left
    assert need(1 * GiB, 300 * MiB) == (Verdict.WAITING, 100 + 1200 - 44, 44)


def test_an_unbounded_wait_never_fails_open_and_status_says_so() -> None:
    """max_start_wait_s = inf (TOML): for engines that wait on a create as long as it takes
    (Docker, Podman), creates queue under sustained overload instead of failing open."""
    adm, clock = make(dataclasses.replace(CFG, max_start_wait_s=math.inf))
    ticket = adm.submit(SandboxRequest("new", "py"))
    assert ticket.deadline == math.inf
    clock.t += 1e7
    [d] = adm.step(snap(active("a", 2 * GiB), budget=2 * GiB))
    assert d.verdict is Verdict.WAITING and d.reason.startswith("waiting 10000000.0 s (no bound):")
    view = adm.snapshot()
    assert view["max_start_wait_s"] is None and view["waiting"][0]["deadline"] is None
    json.dumps(view, allow_nan=False)  # status is JSON: no infinity in it


def test_a_create_without_a_caller_deadline_waits_until_it_fits_by_default() -> None:
    """Docker and Podman put no deadline on a create: by default it waits past
    max_start_wait_s (kubelet's bound) until it fits, and then is admitted, not failed open."""
    assert SandboxAdmissionConfig().max_start_wait_s_no_deadline == math.inf
    adm, clock = make(dataclasses.replace(CFG, max_start_wait_s_no_deadline=math.inf))
    ticket = adm.submit(SandboxRequest("docker", "py", caller_deadline=False))
    assert ticket.deadline == math.inf
    clock.t += 1000
    [d] = adm.step(snap(active("a", 2 * GiB)), waiting=True)
    assert d.verdict is Verdict.WAITING and "(no bound)" in d.reason
    [d] = adm.step(snap(active("a", 1 * GiB)))
    assert d.verdict is Verdict.ADMITTED
    assert adm.snapshot()["totals"] == {"admitted": 1, "fail-open": 0}


def test_a_kubelet_create_behind_a_docker_one_fails_open_at_its_own_bound() -> None:
    """First in, first out, but each create's wait is its caller's: the kubelet create goes
    ahead at max_start_wait_s while the older Docker create keeps waiting, also when the daemon
    asks only for the creates that start (waiting=False)."""
    for waiting in (True, False):
        adm, clock = make(dataclasses.replace(CFG, max_start_wait_s_no_deadline=math.inf))
        adm.submit(SandboxRequest("docker", "py", caller_deadline=False))
        clock.t += 1
        adm.submit(SandboxRequest("kubelet", "py", caller_deadline=True))
        full = snap(active("a", 2 * GiB))
        clock.t += 99.9
        assert [d.sandbox_id for d in adm.step(full, waiting) if d.start] == []
        clock.t += 0.1
        started = [d for d in adm.step(full, waiting) if d.start]
        assert [(d.sandbox_id, d.verdict) for d in started] == [("kubelet", Verdict.FAIL_OPEN)]
        assert "max_start_wait_s 100 s" in started[0].reason
        view = adm.snapshot()
        [w] = view["waiting"]
        assert w["sandbox_id"] == "docker" and w["deadline"] is None
        assert w["caller_deadline"] is False and "(no bound)" in w["reason"], w
        assert view["max_start_wait_s"] == 100.0 and view["max_start_wait_s_no_deadline"] is None
        json.dumps(view, allow_nan=False)


def test_a_bounded_no_deadline_wait_fails_open_under_its_own_name() -> None:
    adm, clock = make(dataclasses.replace(CFG, max_start_wait_s_no_deadline=600.0))
    adm.submit(SandboxRequest("docker", "py", caller_deadline=False))
    clock.t += 600
    [d] = adm.step(snap(active("a", 2 * GiB)), waiting=False)
    assert d.verdict is Verdict.FAIL_OPEN
    assert d.reason.startswith("fail open: waited 600.0 s >= max_start_wait_s_no_deadline 600 s")


def test_a_sandbox_whose_first_call_comes_before_its_record_is_still_counted() -> None:
    """The daemon sees a sandbox through its record, rescanned now and then; its first call
    may come first. Until settle_s it counts whole (as growth to come), then, never seen,
    it is taken for gone."""
    adm, clock = make()
    adm.submit(SandboxRequest("a", "py"))
    adm.step(snap(budget=8 * GiB))
    adm.settled("a")
    adm.submit(SandboxRequest("b", "py"))
    [d] = adm.step(snap(budget=8 * GiB))
    assert d.need_bytes == (256 + 256 + 256) * MiB, d.reason
    assert "(256 MiB of it growth to come)" in d.reason
    clock.t += 60.0
    adm.submit(SandboxRequest("c", "py"))
    assert adm.step(snap(budget=8 * GiB))[0].need_bytes == (256 + 256) * MiB


def test_before_one_finished_an_images_live_sandboxes_teach_its_baseline() -> None:
    """learn_from_live: 1,000 sandboxes (simulated) were admitted on the 256 MiB default while
    the first ones already held more: 170 of them filled 56 GiB of 64 before one finished."""
    adm, clock = make()
    adm.submit(SandboxRequest("a", "py"))
    adm.step(snap(budget=8 * GiB))
    adm.submit(SandboxRequest("b", "py"))
    adm.submit(SandboxRequest("c", "go"))
    [b, c] = adm.step(snap(active("a", 400 * MiB), budget=8 * GiB))
    assert b.baseline_bytes == 400 * MiB and c.baseline_bytes == 256 * MiB  # its own image's
    started = adm.snapshot()["starting"]
    assert {w["sandbox_id"]: w["baseline_bytes"] for w in started} == {
        "a": 256 * MiB, "b": 400 * MiB, "c": 256 * MiB}
    adm.submit(SandboxRequest("d", "py"))
    [d] = adm.step(snap(active("a", 400 * MiB), active("b", 100 * MiB), budget=1 * GiB))
    assert "live sandboxes (none finished)" in d.reason, d.reason
    # a finished: its history speaks from now on
    adm.finished("a", "py", 300 * MiB)
    assert adm.snapshot()["images"]["py"]["baseline_bytes"] == 300 * MiB
    adm.submit(SandboxRequest("e", "py"))
    clock.t += 1.0
    decisions = adm.step(snap(active("b", 100 * MiB), budget=8 * GiB))
    assert decisions[-1].baseline_bytes == 300 * MiB
    # The rule before: the default until one finished.
    old, _ = make(dataclasses.replace(CFG, learn_from_live=False))
    old.submit(SandboxRequest("a", "py"))
    old.step(snap(budget=8 * GiB))
    old.submit(SandboxRequest("b", "py"))
    [b] = old.step(snap(active("a", 400 * MiB), budget=8 * GiB))
    assert b.baseline_bytes == 256 * MiB


def test_before_one_finished_live_sandboxes_teach_the_call_load() -> None:
    """Their calls' peak x duration over the time they lived, once that is a minute both summed
    and since the first came (a hundred sandboxes two seconds old say only what their first
    calls peaked at)."""
    adm, clock = make()
    for sid in ("a", "b"):
        adm.submit(SandboxRequest(sid, "py"))
    adm.step(snap(budget=8 * GiB))
    adm.call_ran("a", 100 * MiB * 30.0)  # a 100 MiB call for 30 s
    adm.call_ran("x", 1 * GiB * 30.0)  # not a sandbox of this queue: nothing
    clock.t += LIVE_LOAD_MIN_S / 2
    assert adm.call_load() == 0  # 60 s lived between them, but 30 s since the first came
    clock.t += LIVE_LOAD_MIN_S / 2
    assert adm.call_load() == 2 * (100 * MiB * 30 // 120)  # 25 MiB each
    # A sandbox that leaves without teaching history takes its calls and its time along.
    adm.cancel("a")
    assert adm.call_load() == 0  # b ran no call
    adm.finished("b", "py", 200 * MiB, 100 * MiB, 10 * MiB)  # history: its mean from now on
    assert adm.call_load() == 0  # no live sandbox of it
    adm.submit(SandboxRequest("c", "py"))
    adm.step(snap(budget=8 * GiB))
    assert adm.call_load() == 10 * MiB
    off, _ = make(dataclasses.replace(CFG, learn_from_live=False))
    off.submit(SandboxRequest("a", "py"))
    off.step(snap(budget=8 * GiB))
    off.call_ran("a", 100 * MiB * 600.0)
    assert off.call_load() == 0


def test_the_last_live_sandbox_to_finish_hands_its_image_to_history() -> None:
    """What live sandboxes taught goes once the image has history: an image forgotten by the
    model later (max_images) starts from the default again, not from an old live figure."""
    adm, _ = make(dataclasses.replace(CFG, max_images=1))
    adm.submit(SandboxRequest("a", "py"))
    adm.step(snap(budget=8 * GiB))
    adm.submit(SandboxRequest("b", "py"))
    [b] = adm.step(snap(active("a", 900 * MiB), budget=8 * GiB))
    assert b.baseline_bytes == 900 * MiB
    adm.finished("a", "py", 300 * MiB)
    adm.finished("b", "py", 300 * MiB)
    adm.finished("z", "go", 50 * MiB)  # py leaves the model
    adm.submit(SandboxRequest("c", "py"))
    [c] = adm.step(snap(budget=8 * GiB))
    assert c.baseline_bytes == 256 * MiB and "default" in c.reason, c.reason


def test_started_sandboxes_stay_counted_while_no_create_waits() -> None:
    """The daemon steps the policy only while a create waits; between, `expire` drops only the
    started sandboxes it no longer knows (it used to step with no sandboxes, and every one
    older than settle_s was taken for gone: its growth and its load lapsed)."""
    adm, clock = make()
    _learn_load(adm, "py", 100 * MiB)
    for sid in ("a", "b"):
        adm.submit(SandboxRequest(sid, "py"))
    adm.step(snap(budget=8 * GiB))
    clock.t += CFG.settle_s + 1
    adm.expire({"a"})  # b's create failed after admission, or it went unreported
    assert adm.call_load() == 100 * MiB
    assert [s["sandbox_id"] for s in adm.snapshot()["starting"]] == ["a"]
    off, clock = make(dataclasses.replace(CFG, reserve_growth=False))
    off.submit(SandboxRequest("a", "py"))
    off.step(snap(budget=8 * GiB))
    clock.t += CFG.settle_s + 1
    off.expire({"a"})  # without reserve_growth a start counts until settle_s only
    assert off.snapshot()["starting"] == []


def test_live_sandboxes_grow_toward_their_images_mean_as_known_now() -> None:
    """A live sandbox's growth to come is measured against its image's mean finished baseline,
    learned since its admission; the new sandbox alone counts the high quantile (summed over
    dozens, the 90th percentile set 660 MiB aside for each where they ended with 440 on
    average)."""
    adm, clock = make()
    adm.submit(SandboxRequest("a", "py"))
    adm.step(snap(budget=8 * GiB))
    clock.t += 5.0
    adm.settled("a")
    adm.finished("x", "py", 200 * MiB, 100 * MiB)
    adm.finished("y", "py", 1000 * MiB, 100 * MiB)  # mean 600 MiB, 90th percentile 1000
    adm.submit(SandboxRequest("b", "py"))
    [d] = adm.step(snap(active("a", 200 * MiB), budget=8 * GiB))
    # a: 200 MiB held + 400 to its image's mean; b: 1000 MiB; one call 256 MiB (a's view)
    assert d.need_bytes == (200 + 400 + 1000 + 256) * MiB, d.reason
    old, clock = make(dataclasses.replace(CFG, learn_from_live=False))
    old.submit(SandboxRequest("a", "py"))
    old.step(snap(budget=8 * GiB))
    clock.t += 5.0
    old.settled("a")
    old.finished("x", "py", 200 * MiB, 100 * MiB)
    old.finished("y", "py", 1000 * MiB, 100 * MiB)
    old.submit(SandboxRequest("b", "py"))
    [d] = old.step(snap(active("a", 200 * MiB), budget=8 * GiB))
    # the rule before: a keeps the 256 MiB default it was admitted with
    assert d.need_bytes == (200 + 56 + 1000 + 256) * MiB, d.reason


def test_live_sandboxes_share_the_free_swap_they_would_be_pushed_to() -> None:
    """Each live sandbox's pushable figure counts its anonymous pages as far as the whole free
    swap has room; summed, they share it: what it cannot hold stays pinned, and the swap they
    take is not there for arrivals. (At 15x in the simulator, 42 live sandboxes each counted
    ~30 MiB against the same 641 MiB of free swap: 56 admitted in 3 s, 22 OOM kills.)"""
    adm, _ = make(dataclasses.replace(CFG, reserve_growth=False))
    adm.submit(SandboxRequest("new", "py"))
    # ten active sandboxes, each 100 MiB resident, all of it cold anonymous memory
    boxes = tuple(LiveSandbox(f"s{i}", 100 * MiB, cold_bytes=100 * MiB, swap_bytes=100 * MiB)
                  for i in range(10))
    swap = {"swap_free_bytes": 300 * MiB, "swap_out_bytes_per_s": 100.0 * MiB}
    # pushable 1000 MiB against 300 MiB of swap: 700 MiB stay; + 256 baseline + 256 call,
    # no swap left to absorb the arrival
    [d] = adm.step(DomainSnapshot(1200 * MiB, 0, boxes, (), 0, **swap))
    assert d.verdict is Verdict.WAITING and d.need_bytes == (700 + 256 + 256) * MiB
    # with room for all of it in swap, 100 MiB of it absorbs the arrival (1 s at 100 MiB/s)
    roomy = {**swap, "swap_free_bytes": 2 * GiB}
    [d] = adm.step(DomainSnapshot(1200 * MiB, 0, boxes, (), 0, **roomy))
    assert d.verdict is Verdict.ADMITTED and d.need_bytes == (256 - 100 + 256) * MiB
    # the host's free swap is what they share, whatever one sandbox's swap.max leaves it
    adm.submit(SandboxRequest("next", "py"))
    [d] = adm.step(DomainSnapshot(1200 * MiB, 0, boxes, (), 0, swap_free_bytes=50 * MiB,
                                  swap_out_bytes_per_s=100.0 * MiB,
                                  swap_shared_bytes=2 * GiB))
    assert "pinned 0 B" in d.reason


def test_at_most_max_launching_creates_are_under_way_until_their_start_has_run() -> None:
    """Memory has room for all five, but only two at once may be between admission and their
    runtime's start; the next goes when one has started, or when one is over settle_s."""
    adm, _ = make(dataclasses.replace(CFG, max_launching=2))
    for i in range(5):
        adm.submit(SandboxRequest(f"s{i}", "py"))
    big = snap(budget=64 * GiB)
    assert one(adm, big) == {"s0": Verdict.ADMITTED, "s1": Verdict.ADMITTED,
                             "s2": Verdict.WAITING, "s3": Verdict.WAITING,
                             "s4": Verdict.WAITING}
    [w, *_] = adm.snapshot()["waiting"]
    assert "2 admitted creates not yet started (max_launching 2)" in w["reason"]
    assert (adm.snapshot()["launching"], adm.snapshot()["max_launching"]) == (2, 2)
    adm.launched("s0")
    adm.launched("s0")  # said twice: counted once
    assert one(adm, big) == {"s2": Verdict.ADMITTED, "s3": Verdict.WAITING,
                             "s4": Verdict.WAITING}
    adm.settled("s1")  # its first call came: its start has run too
    assert one(adm, big) == {"s3": Verdict.ADMITTED, "s4": Verdict.WAITING}
    adm.cancel("s2")  # its create failed
    assert one(adm, big) == {"s4": Verdict.ADMITTED}
    assert adm.snapshot()["launching"] == 2  # s3, s4


def test_a_create_never_seen_starting_stops_counting_after_settle_s() -> None:
    """Its record came (it is live in the snapshot) but no start was seen: after settle_s it
    no longer holds the place."""
    adm, clock = make(dataclasses.replace(CFG, max_launching=1))
    adm.submit(SandboxRequest("a", "py"))
    adm.submit(SandboxRequest("b", "py"))
    assert not adm.launches_full()
    assert one(adm, snap(budget=64 * GiB)) == {"a": Verdict.ADMITTED, "b": Verdict.WAITING}
    big = snap(active("a", 8 * MiB), budget=64 * GiB)
    clock.t += CFG.settle_s - 1
    assert adm.launches_full()  # the daemon does not measure for a step that cannot start any
    assert one(adm, big) == {"b": Verdict.WAITING}
    clock.t += 1
    assert not adm.launches_full()
    assert one(adm, big) == {"b": Verdict.ADMITTED}
    assert not make(dataclasses.replace(CFG, max_launching=0))[0].launches_full()  # no bound


def test_the_bound_on_creates_under_way_yields_to_the_callers_patience() -> None:
    """A kubelet create held by the bound fails open at max_start_wait_s, as for memory."""
    adm, clock = make(dataclasses.replace(CFG, max_launching=1, settle_s=1000.0))
    adm.submit(SandboxRequest("a", "py"))
    adm.submit(SandboxRequest("b", "py", caller_deadline=True))
    big = snap(budget=64 * GiB)
    assert one(adm, big) == {"a": Verdict.ADMITTED, "b": Verdict.WAITING}
    clock.t += CFG.max_start_wait_s
    adm.launched("x")  # an unknown sandbox: nothing to do
    [d] = adm.step(big)
    assert d.verdict is Verdict.FAIL_OPEN and "(max_launching 1)" in d.reason, d.reason


def test_a_restarted_sandboxs_new_create_stays_queued_when_its_old_life_finishes() -> None:
    """docker restart: the record goes and the same id asks again before the daemon's rescan
    sees the old one gone; learning from the old life must not drop the new create."""
    adm, _ = make()
    adm.submit(SandboxRequest("x", "py"))
    assert one(adm, snap()) == {"x": Verdict.ADMITTED}
    adm.cancel("x")  # what the daemon does when the same id asks again
    adm.submit(SandboxRequest("x", "py"))
    adm.finished("x", "py", 64 * MiB)
    assert one(adm, snap()) == {"x": Verdict.ADMITTED}


def test_the_default_bound_on_creates_under_way_is_a_few() -> None:
    assert 1 <= SandboxAdmissionConfig().max_launching <= 8
    with pytest.raises(ValueError, match="max_launching"):
        SandboxAdmissionConfig(max_launching=-1)
