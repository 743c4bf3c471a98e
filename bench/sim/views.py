"""The policy's view of every live sandbox, kept up to date instead of rebuilt each period.

Sandbox admission and residency each take one view per live sandbox every period (a
`headroom.LiveSandbox`, a `residency.SandboxView`). With 1,000 sandboxes, most of them busy and
unchanged from one period to the next, building those views was most of a run's time; here a
sandbox's view is rebuilt only when the memory model says its bytes or its call changed
(`Domain.watchers`) or the hands say what they know of it changed (`mark`), and every period for
the idle ones, whose idle time moves on. The list handed to the policy is the same, in the same
order (the domain's), as a full rebuild: `verify` checks that on every read (the unit tests set it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.sim.memory import Domain, SimBox

# (box, now) -> (its view, whether it is idle: rebuilt on every read)
Build = Callable[[SimBox, float], tuple[Any, bool]]


class BoxViews:
    """One kind of view of the domain's boxes, in the domain's order."""

    verify = False  # compare every read with a full rebuild (tests)

    def __init__(self, domain: Domain, build: Build) -> None:
        self.domain = domain
        self.build = build
        self.dirty: set[str] = set()
        domain.watchers.append(self.dirty)
        self.views: dict[str, Any] = {}  # box id -> view, in the boxes' order (SimBox.seq)
        self.idle: set[str] = set()

    def mark(self, box_id: str) -> None:
        """Something the view shows changed outside the memory model (a call queued, ...)."""
        self.dirty.add(box_id)

    def read(self, now: float) -> list[Any]:
        boxes = self.domain.boxes
        if self.dirty:
            new: list[SimBox] = []
            for bid in self.dirty:
                b = boxes.get(bid)
                if b is None:
                    self.views.pop(bid, None)
                    self.idle.discard(bid)
                elif bid in self.views:
                    self._put(b, now)
                else:
                    new.append(b)
            for b in sorted(new, key=lambda b: b.seq):  # after every box already here
                self._put(b, now)
            self.dirty.clear()
        for bid in self.idle:
            self.views[bid] = self.build(boxes[bid], now)[0]
        out = list(self.views.values())
        if self.verify:
            full = [self.build(b, now)[0] for b in boxes.values()]
            assert out == full, "incremental views differ from a full rebuild"
        return out

    def _put(self, b: SimBox, now: float) -> None:
        view, idle = self.build(b, now)
        self.views[b.id] = view
        if idle:
            self.idle.add(b.id)
        else:
            self.idle.discard(b.id)
