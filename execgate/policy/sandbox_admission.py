"""Admission of whole sandboxes by memory (issue 15 §1).

Admitting tool calls is not enough: at 8.6x the sweep's sandboxes started on arrival and their
baselines alone were twice the budget, so the domain was red before any call ran and the calls
waited out their bounded wait to be forced into a full host. A new sandbox therefore waits in
the runtime's `create` (nothing in its cgroup yet) until

    pinned + max(max(running, one call, load) - on swap, 0)
        + max(arriving + baseline(new) - absorbed, 0) <= budget - S

pinned: memory outside tool calls that cannot be pushed out — active sandboxes' resident memory
(less their cold pages), idle sandboxes' resident memory less what they can give back, and
what of those anonymous pages the free swap cannot hold (each sandbox's figure counts the
whole free swap; summed, they share it: `headroom.swap_over_promised`) — plus
what live sandboxes have yet to grow to (`reserve_growth`): a sandbox's calls leave files and
caches behind, up to the baseline its image's sandboxes ended with (their mean, with
learn_from_live: summed over many, the mean is what they come to), and what swap's free room
cannot take of that growth is as good as pinned. Without it the rule forgot a sandbox's
prediction at its first call and admitted sandboxes whose leftovers then filled the budget
(the generator's tasks end with ~260 MiB of them beside a ~180 MiB baseline). running: the
running calls' charges (what call admission set aside for them). one call: the largest
next-call peak over live sandboxes and the new one. The max keeps both promises: the new
baseline fits beside the running calls at their peaks (no OOM now), and once they end, the
largest next call fits (at least one call can always run: admitting a sandbox never leaves the
others unable to work). Adding the two instead, as this rule did at first, set room aside for
two calls where the domain runs one: at the VM's 8.6x Poisson point it held 14 of 16 creates,
six of them the whole bounded wait.

load: the calls the live sandboxes and the new one are expected to run at once — each one's
call load (the time average of its tool calls' peaks over its life, learned per image from
finished sandboxes) summed. One call's room is enough for 16 sandboxes; for hundreds it is
not: at 1,000 sandboxes arriving 2 s apart without swap (the simulator, 19.7x), admitting up to
"one call fits" let ~170 sandboxes' baselines and leftovers fill the budget while they had ~26
GiB of calls to run between them; calls queued the whole bounded wait, creates failed open,
and 228 of 1,000 tasks finished (3,207 sandbox inits OOM-killed; growth and load counted, with
creates that may wait as long as it takes: 1,000 of 1,000, no OOM kill). A sum of means, not of
peaks: over many sandboxes their calls' peaks do not coincide (call admission paces the ones
that would), and an image without history counts 0 (the one-call term rules until it has).

arriving: the baselines of sandboxes admitted but not yet at them (each its prediction less the
most resident memory seen of it). absorbed: what swap can take while they arrive — the
swap-out bandwidth over a start's duration (learned: admission to first call), within the
swap's free room. With swap, an arrived baseline is cold and pushable like any other (it
leaves `pinned`); what must fit is its arrival, and swap-out works during the whole start.
Before a start was measured, `default_start_s`; without swap absorbed is 0 and the whole
baseline counts.

on swap: the swap room call admission counts as memory (the domain's swap credit: none while
it thrashes), within what the live sandboxes' claims, the arrivals and the growth leave of the
free swap. Calls run on it, their cold pages swapped out as they grow; counting their charges
against budget - S alone held every create while calls ran on swap that still had room.

* Baselines are learned per image from finished sandboxes (`BaselineModel`): for the new
  sandbox a high quantile of what the last few held before their first call, what it arrives
  with (an under-estimate costs OOM kills, an over-estimate a wait); what live sandboxes grow
  to, leftovers included, summed over many, their mean, counted for the new one too from the
  step after it starts. Counting the new one at the high quantile of what they grew to (65 MiB
  where they start at ~31 and end at ~47 on average) ran the VM's 8.6x point without swap one
  sandbox at a time (the simulator: 810 s against 560, reserve 627). Before
  any history (`learn_from_live`): the most one of the image's live sandboxes has held, if
  more than the configured default, and their call load so far. Learning only from finished
  sandboxes let 170 of 1,000 (simulated) in on the 256 MiB default in the first 340 s, before
  one finished; they grew to 56 GiB of 64 and ran their calls one or two at a time for 5,000 s.
  Bounded: a window per image, a cap on images.
* FIFO, oldest first, no bypass: a later small sandbox does not overtake an older waiting one.
  Letting it would keep the room an older, larger sandbox waits for always just too small
  (starvation), and agents started first would finish last (unfair). The wait is bounded anyway,
  so strict order costs at most the bound on its wait (none for Docker's creates: below).
* A sandbox is always admitted when nothing is live: alone it can only hurt itself.
* At most `max_launching` admitted creates are under way at once (admission until the
  runtime's `start` has run): a container's start is CPU work of the engine, runc and systemd,
  and two dozen at once on two CPUs took minutes each, past systemd's scope timeout for some;
  one at a time per few CPUs they come up one after another instead of all late.
* The wait is bounded by the caller's patience, which differs by caller. kubelet (through a CRI
  runtime: the request says `caller_deadline`) times its runtime requests out at 2 minutes: after
  `max_start_wait_s` (default 100 s) its create goes ahead (fail open) with verdict FAIL_OPEN,
  for the daemon to log and count. moby and containerd put no deadline on a runtime's create
  (moby calls it with a context that ignores client cancellation), nor does Podman: their
  creates wait `max_start_wait_s_no_deadline`, by default until they fit. Failing open there
  trades a wait nobody times out for OOM kills in a full host: in the simulator without swap,
  1,000 sandboxes finished 230 tasks with a 100 s bound and all 1,000 with none.

What the daemon passes in: `submit(SandboxRequest)` when a create asks; every control period
(and after submit/settled/finished) `step(DomainSnapshot)` with the budget, S
(`PressureReading.safety_margin`), the live sandboxes (`headroom.LiveSandbox`) and running
calls' charges; `settled(id)` when a started sandbox has reached its baseline (its first tool
call); `launched(id)` when its runtime's `start` has run; `finished(id, image,
baseline_bytes)` when a sandbox is removed; `cancel(id)` when a create gave up or failed.
What it gets back: from `step`, one `SandboxDecision` per queued sandbox (ADMITTED /
FAIL_OPEN: let the create go on; WAITING: keep holding it), each with its reason;
`snapshot()` for `execgatectl status`.

Pure and deterministic: no I/O, time from the injected clock.
"""

from __future__ import annotations

import enum
import functools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from execgate.policy.frozen import frozen
from execgate.policy.headroom import LiveSandbox, swap_over_promised
from execgate.policy.pressure import fmt_bytes


@dataclass(frozen=True)
class SandboxAdmissionConfig:
    """[sandbox_admission] in config.toml, when wired."""

    # False admits every create at once (the -nosandboxadmit ablation).
    enabled: bool = True
    # Predicted baseline (memory outside tool calls) of an image with no finished sandbox yet.
    default_baseline_bytes: int = 256 << 20  # 256 MiB (1 << 20 = 1 MiB)
    # Predicted next-call peak of a new sandbox when neither the request nor history says;
    # the same as the call estimator's default for an unclassified command.
    default_call_peak_bytes: int = 256 << 20  # 256 MiB
    # The baseline predicted from history is this quantile (nearest rank) of the window.
    baseline_quantile: float = 0.9
    # Finished sandboxes remembered per image, and images remembered (least recently used go).
    history_window: int = 16
    max_images: int = 256
    # A create whose caller times out (kubelet: 120 s) waits at most this long, then goes ahead
    # (fail open); one whose caller has no deadline (Docker, Podman) waits at most the second.
    max_start_wait_s: float = 100.0
    max_start_wait_s_no_deadline: float = math.inf
    # An admitted sandbox counts at least its predicted baseline until `settled` or this long
    # (with reserve_growth: for its life; this long only if it never shows up live).
    settle_s: float = 60.0
    # At most this many admitted creates under way at once, from admission until the
    # runtime's `start` has run (`launched`), or settle_s (a create that failed); the next waits
    # (0: no bound). A container's start is CPU work of the engine, runc and systemd: in a VM
    # run of the 15x burst 24 at once took 37-406 s each in runc create, and 7 of them failed
    # in systemd's scope timeout, where 8 at once took ~50 s.
    max_launching: int = 4
    # A start's duration (admission to first call) before one was measured: how long swap-out
    # has while a baseline arrives (0: count whole baselines until a start was measured).
    default_start_s: float = 1.0
    # Count the live sandboxes' expected concurrent calls (their learned call loads) beside
    # the one-call term (false: one call's room only, the rule before 3 Dec).
    count_call_load: bool = True
    # A live sandbox keeps the rest of its predicted baseline (learned: what it held outside
    # calls when it finished, leftovers included) set aside for its whole life, not only until
    # its first call (false: until then, the rule before 3 Dec).
    reserve_growth: bool = True
    # An image none of whose sandboxes has finished is predicted from its live ones: its
    # baseline at least the most one of them has held outside calls so far, its call load
    # theirs so far; and a live sandbox grows toward what is known now (its image's mean
    # finished baseline, else that live prediction), not the prediction it was admitted with
    # (false: the defaults and no load until a sandbox finishes, and the prediction at
    # admission; the rule before 4 Dec). Without reserve_growth a sandbox leaves the count at
    # its first call, so only its start teaches.
    learn_from_live: bool = True
    # The calls term may use the swap room call admission counts as memory (the domain's swap
    # credit, 0 while it thrashes), what the sandboxes' claims, arrivals and growth leave of the
    # free swap (false: calls fit in budget - S alone, the rule before 4 Dec, evening).
    calls_on_swap: bool = True

    def __post_init__(self) -> None:
        if self.default_baseline_bytes < 0 or self.default_call_peak_bytes < 0:
            raise ValueError("default_baseline_bytes and default_call_peak_bytes must be >= 0")
        if not 0 < self.baseline_quantile <= 1:
            raise ValueError("baseline_quantile must be in (0, 1]")
        if self.history_window < 1 or self.max_images < 1:
            raise ValueError("history_window and max_images must be >= 1")
        if self.max_launching < 0:
            raise ValueError("max_launching must be >= 0")
        if min(self.max_start_wait_s, self.max_start_wait_s_no_deadline, self.settle_s,
               self.default_start_s) < 0:
            raise ValueError("max_start_wait_s, max_start_wait_s_no_deadline, settle_s and "
                             "default_start_s must be >= 0")

    @staticmethod
    def bound_name(caller_deadline: bool) -> str:
        """The setting that bounds a create's wait: its caller's patience (module docstring)."""
        return "max_start_wait_s" if caller_deadline else "max_start_wait_s_no_deadline"

    def max_wait_s(self, caller_deadline: bool) -> float:
        """How long a create may wait."""
        return getattr(self, self.bound_name(caller_deadline))


def high_quantile(values: Sequence[int], q: float) -> int:
    """Nearest-rank q-quantile: an observed value, never an interpolation below the top ones."""
    ordered = sorted(values)
    return ordered[min(max(math.ceil(q * len(ordered)), 1), len(ordered)) - 1]


@dataclass(frozen=True)
class BaselinePrediction:
    """A new sandbox's predicted baseline and next-call peak; `source` says where from."""

    baseline_bytes: int
    call_peak_bytes: int
    source: str


@dataclass
class _ImageHistory:
    baselines: deque[int]  # what each held outside calls at its largest (leftovers included)
    call_peaks: deque[int]
    call_loads: deque[int]  # time-averaged tool-call bytes over a sandbox's life
    # what each held before its first call, what a new one arrives with (None: not measured,
    # its baseline serves); one entry per baseline, the two windows in step
    starts: deque[int | None]
    load: int | None = None  # their mean, once asked (None: to compute)
    mean: int | None = None  # the baselines' mean, likewise


class BaselineModel:
    """Per-image history of finished sandboxes' baselines (and largest call peaks)."""

    def __init__(self, config: SandboxAdmissionConfig) -> None:
        self.config = config
        self._images: OrderedDict[str, _ImageHistory] = OrderedDict()

    def observe(self, image: str, baseline_bytes: int, call_peak_bytes: int | None = None,
                call_load_bytes: int | None = None, start_bytes: int | None = None) -> None:
        """A sandbox of `image` finished: its baseline (memory outside tool calls at its largest,
        what its calls left behind included), if it ran calls the largest call peak, its call
        load (its calls' peak x duration summed, over its life), and if measured what it held
        before its first call (its start)."""
        hist = self._history(image)
        hist.baselines.append(max(baseline_bytes, 0))
        hist.mean = None
        hist.starts.append(None if start_bytes is None
                           else min(max(start_bytes, 0), max(baseline_bytes, 0)))
        if call_peak_bytes is not None:
            hist.call_peaks.append(max(call_peak_bytes, 0))
        if call_load_bytes is not None:
            hist.call_loads.append(max(call_load_bytes, 0))
            hist.load = None

    def finished(self, image: str) -> int:
        """How many finished sandboxes of `image` the history holds."""
        hist = self._images.get(image)
        return 0 if hist is None else len(hist.baselines)

    def mean_baseline(self, image: str) -> int | None:
        """The mean of the image's finished baselines (None without history): what a sum over
        many of its live sandboxes grows to, where a high quantile for each overstates it."""
        hist = self._images.get(image)
        if hist is None or not hist.baselines:
            return None
        if hist.mean is None:
            hist.mean = sum(hist.baselines) // len(hist.baselines)
        return hist.mean

    def call_load(self, image: str) -> int:
        """The image's call load: the mean over its finished sandboxes (what a sum over many
        live ones approaches), 0 without history."""
        hist = self._images.get(image)
        if hist is None or not hist.call_loads:
            return 0
        if hist.load is None:
            hist.load = sum(hist.call_loads) // len(hist.call_loads)
        return hist.load

    def _history(self, image: str) -> _ImageHistory:
        """The image's history, now the most recently used (the least recent is forgotten
        beyond max_images)."""
        cfg = self.config
        hist = self._images.get(image)
        if hist is None:
            n = cfg.history_window
            hist = self._images[image] = _ImageHistory(deque(maxlen=n), deque(maxlen=n),
                                                       deque(maxlen=n), deque(maxlen=n))
        self._images.move_to_end(image)
        while len(self._images) > cfg.max_images:
            self._images.popitem(last=False)
        return hist

    def export(self) -> dict[str, dict[str, list[int]]]:
        """The whole history, least recently used image first, for the daemon to keep."""
        return {image: {"baselines": list(h.baselines), "call_peaks": list(h.call_peaks),
                        "call_loads": list(h.call_loads), "starts": list(h.starts)}
                for image, h in self._images.items()}

    def restore(self, data: object) -> None:
        """Take back what `export` wrote. What is not a list of integers (a hand-edited file) is
        skipped; the rest serves."""
        for image, saved in (data.items() if isinstance(data, dict) else ()):
            if not isinstance(saved, dict):
                continue
            lists = [saved.get(k) for k in ("baselines", "call_peaks", "call_loads")]
            base, peaks, loads = ([v for v in x if type(v) is int] if isinstance(x, list) else []
                                  for x in lists)
            starts = saved.get("starts")
            # one per baseline, or none (a file from before starts were kept)
            if not (isinstance(starts, list) and len(starts) == len(base)):
                starts = [None] * len(base)
            if base:
                hist = self._history(str(image))
                hist.baselines.extend(max(v, 0) for v in base)
                hist.call_peaks.extend(max(v, 0) for v in peaks)
                hist.call_loads.extend(max(v, 0) for v in loads)
                hist.starts.extend(max(v, 0) if type(v) is int else None for v in starts)
                hist.load = hist.mean = None

    def predict(self, image: str, call_peak_bytes: int | None = None) -> BaselinePrediction:
        """History of the image, else the configured defaults: what a new sandbox arrives with
        (its image's starts, each one's baseline where its start was not measured). What it
        grows to after is the growth term's (`mean_baseline`), counted from the step after it
        starts like every live sandbox's. call_peak_bytes: the request's own prediction of its
        first call's peak, which wins over history."""
        cfg = self.config
        hist = self._images.get(image)
        if hist is None or not hist.baselines:
            peak = cfg.default_call_peak_bytes if call_peak_bytes is None else call_peak_bytes
            return BaselinePrediction(cfg.default_baseline_bytes, peak, "default")
        q = cfg.baseline_quantile
        if call_peak_bytes is None:
            call_peak_bytes = (high_quantile(hist.call_peaks, q) if hist.call_peaks
                               else cfg.default_call_peak_bytes)
        arrivals = [b if s is None else s
                    for b, s in zip(hist.baselines, hist.starts, strict=True)]
        return BaselinePrediction(high_quantile(arrivals, q), call_peak_bytes,
                                  f"image-history ({len(hist.baselines)} finished)")

    def snapshot(self) -> dict[str, Any]:
        return {image: {"finished": len(h.baselines),
                        "baseline_bytes": self.predict(image).baseline_bytes,
                        "grows_to_bytes": self.mean_baseline(image),
                        "call_load_bytes": self.call_load(image)}
                for image, h in self._images.items()}


@dataclass(frozen=True)
class SandboxRequest:
    """A managed container's create, asking to start."""

    sandbox_id: str
    image: str
    # Predicted peak of its first tool call, if the caller knows (a declaration); else learned.
    call_peak_bytes: int | None = None
    # Arrival on the admission clock; None lets submit stamp it.
    arrival: float | None = None
    # Whether its caller times the create out (kubelet): max_start_wait_s bounds its wait, else
    # max_start_wait_s_no_deadline. True unless told: what a runtime that does not say gets.
    caller_deadline: bool = True


@dataclass(frozen=True)
class DomainSnapshot:
    """The domain as the daemon sees it this period.

    margin_bytes: S (`PressureReading.safety_margin`). running_call_bytes: one entry per
    running tool call, its charge (the daemon may pass max(charge, current bytes)).
    other_bytes: memory in the domain outside live sandboxes that cannot be pushed out
    (0 for a cgroup domain that holds only sandboxes). swap_free_bytes and
    swap_out_bytes_per_s: the swap's free room for this domain's sandboxes and the bandwidth
    reclaims achieve (residency's), for what arriving baselines swap can absorb (0: none)."""

    budget_bytes: int
    margin_bytes: int
    sandboxes: Sequence[LiveSandbox] = ()
    running_call_bytes: Sequence[int] = ()
    other_bytes: int = 0
    swap_free_bytes: int = 0
    swap_out_bytes_per_s: float = 0.0
    # The free swap the live sandboxes share (the host's; swap_free_bytes is what one arriving
    # sandbox may use, within its swap.max); None: swap_free_bytes.
    swap_shared_bytes: int | None = None
    # The swap room call admission counts as available now (`PressureReading.swap_credit`:
    # 0 while the domain thrashes or swap credit is off): calls it runs on it are not resident.
    swap_credit_bytes: int = 0

    @property
    def room_bytes(self) -> int:
        """budget − S: what sandboxes and calls may hold."""
        return max(self.budget_bytes - self.margin_bytes, 0)


class Verdict(enum.StrEnum):
    ADMITTED = "admitted"  # it fits (or nothing is live): start it
    WAITING = "waiting"  # keep holding the create
    FAIL_OPEN = "fail-open"  # waited max_start_wait_s: start it anyway, log and count it


@dataclass(frozen=True)
class SandboxDecision:
    """One queued sandbox's verdict this step, with the numbers behind it."""

    sandbox_id: str
    verdict: Verdict
    waited_s: float
    need_bytes: int  # pinned + max(running calls, one call, load) - on swap + unabsorbed
    room_bytes: int  # budget − S
    baseline_bytes: int
    call_peak_bytes: int  # the one-call term: the largest next-call peak, the new one's included
    reason: str
    # What of the arriving baselines (this one's included) the rule left to swap: residency is
    # to push that much out while they arrive.
    absorbed_bytes: int = 0
    # What of the calls term the rule left to swap (the swap credit it used): residency is to
    # push that much out too, ahead of the calls, not leave it to the kernel as they grow.
    on_swap_bytes: int = 0

    @property
    def start(self) -> bool:
        """The create may go on."""
        return self.verdict is not Verdict.WAITING

    @property
    def short_bytes(self) -> int:
        return max(self.need_bytes - self.room_bytes, 0)


@dataclass(frozen=True)
class SandboxTicket:
    """Receipt of a submitted create: what it is predicted to need and by when it starts."""

    sandbox_id: str
    prediction: BaselinePrediction
    arrival: float
    deadline: float  # arrival + its bound (inf: none): it starts by then, fitting or not


@dataclass
class _Queued:
    request: SandboxRequest
    prediction: BaselinePrediction
    arrival: float
    seq: int
    reason: str = "not yet considered"


@dataclass
class _Starting:
    prediction: BaselinePrediction
    admitted_at: float
    image: str = ""
    seen_bytes: int = 0  # the most resident memory a snapshot showed of it so far
    settled: bool = False  # its first call came (reserve_growth keeps it counted)
    area: float = 0.0  # its calls' peak x duration so far (learn_from_live)


@dataclass
class _LiveImage:
    """What an image's sandboxes admitted here show while they live (learn_from_live)."""

    seen_bytes: int = 0  # the most one of them held outside calls
    area: float = 0.0  # their calls' peak x duration so far, summed
    since: float = 0.0  # their admission times, summed (their ages: n x now - since)
    count: int = 0
    first: float = 0.0  # when the first of those live now (or since the last was) came


# Live sandboxes' call load counts once they have lived this long, together and since the
# first of them came: a few seconds of a sandbox (or of a hundred started at once) say more
# about a first call than about a life.
LIVE_LOAD_MIN_S = 60.0


class SandboxAdmission:
    """FIFO queue of sandbox creates, admitted by memory with a bounded wait."""

    def __init__(self, config: SandboxAdmissionConfig, clock: Callable[[], float],
                 baselines: BaselineModel | None = None) -> None:
        self.config = config
        self.clock = clock
        self.model = BaselineModel(config) if baselines is None else baselines
        self._queue: dict[str, _Queued] = {}
        self._with_deadline = 0  # queued creates whose caller has a deadline (caller_deadline)
        self._starting: dict[str, _Starting] = {}
        # Admitted creates whose runtime's start has not yet run, with their admission times
        # (max_launching): the ones _launches_over looks at, not every live sandbox.
        self._launching: dict[str, float] = {}
        self._seq = 0
        # Whether the queue's own order (submission) is oldest first: true while creates come
        # in arrival order; then a step need not sort it.
        self._fifo = True
        self._last_arrival = float("-inf")
        # What the last step(waiting=False) left undecided: the creates behind the first that
        # waits, their reasons formatted on demand (snapshot).
        self._later: Callable[[], object] | None = None
        self._totals = {Verdict.ADMITTED.value: 0, Verdict.FAIL_OPEN.value: 0}
        self.start_s: float | None = None  # a start's duration, admission to first call (EWMA)
        # Live sandboxes' images (started here, or told by `live`), and how many of each: the
        # load term is a sum over images, not over sandboxes, each step.
        self._image_of: dict[str, str] = {}
        self._per_image: dict[str, int] = {}
        self._live: dict[str, _LiveImage] = {}  # image -> its sandboxes admitted here

    # -- the daemon's calls ------------------------------------------------------------------

    def submit(self, request: SandboxRequest) -> SandboxTicket:
        """Queue a create; a later `step` decides it."""
        sid = request.sandbox_id
        if sid in self._queue or sid in self._starting:
            raise ValueError(f"sandbox {sid!r} already submitted")
        arrival = self.clock() if request.arrival is None else request.arrival
        prediction = self._predict(request.image, request.call_peak_bytes)
        self._queue[sid] = _Queued(request, prediction, arrival, self._seq)
        self._with_deadline += request.caller_deadline
        self._seq += 1
        self._fifo = self._fifo and arrival >= self._last_arrival
        self._last_arrival = max(self._last_arrival, arrival)
        return SandboxTicket(sid, prediction, arrival,
                             arrival + self.config.max_wait_s(request.caller_deadline))

    def cancel(self, sandbox_id: str) -> bool:
        """The create gave up (its caller went away) or failed: forget it."""
        queued = self._dequeue(sandbox_id)
        started = self._unstart(sandbox_id)
        self._gone(sandbox_id)
        return queued is not None or started is not None

    def call_ran(self, sandbox_id: str, byte_seconds: float) -> None:
        """A call of the sandbox ended: its peak x how long it ran, toward its image's call load
        while none of that image's sandboxes has finished (learn_from_live)."""
        start = self._starting.get(sandbox_id)
        if start is not None and byte_seconds > 0:
            live = self._live.get(start.image)
            if live is not None:
                start.area += byte_seconds
                live.area += byte_seconds

    def live(self, sandbox_id: str, image: str) -> None:
        """A live sandbox of `image` that did not start through this queue (it was running
        when the daemon started): its calls count in the load term too."""
        if sandbox_id not in self._image_of and sandbox_id not in self._queue:
            self._image_of[sandbox_id] = image
            self._per_image[image] = self._per_image.get(image, 0) + 1

    def _gone(self, sandbox_id: str) -> None:
        image = self._image_of.pop(sandbox_id, None)
        if image is not None:
            left = self._per_image[image] - 1
            if left:
                self._per_image[image] = left
            else:
                del self._per_image[image]

    def call_load(self) -> int:
        """The live sandboxes' expected concurrent call bytes: their images' call loads summed
        (0 with count_call_load off)."""
        return sum(n * self._load_of(image) for image, n in self._per_image.items())

    def _load_of(self, image: str) -> int:
        """One sandbox of `image`'s part of the load term: its finished sandboxes' mean, or
        before one finished (learn_from_live) its live ones' so far."""
        if not self.config.count_call_load:
            return 0
        if not self.config.learn_from_live or self.model.finished(image):
            return self.model.call_load(image)
        live = self._live.get(image)
        if live is None or not live.count:
            return 0
        now = self.clock()
        lived = live.count * now - live.since
        if lived < LIVE_LOAD_MIN_S or now - live.first < LIVE_LOAD_MIN_S:
            return 0
        return int(live.area / lived)

    def _predict(self, image: str, call_peak_bytes: int | None = None) -> BaselinePrediction:
        """The model's prediction, or before a sandbox of the image finished (learn_from_live)
        at least the most one of its live sandboxes has held."""
        pred = self.model.predict(image, call_peak_bytes)
        live = self._live.get(image) if self.config.learn_from_live else None
        if live is None or live.seen_bytes <= pred.baseline_bytes or self.model.finished(image):
            return pred
        return BaselinePrediction(live.seen_bytes, pred.call_peak_bytes,
                                  "live sandboxes (none finished)")

    def _grows_to(self, image: str) -> int:
        """What a started sandbox of `image` is expected to grow to, among many: its finished
        sandboxes' mean baseline (the high quantile is for one new sandbox; summed over dozens
        it set 660 MiB aside for each where they ended with 440 on average and live ones held
        ~320: 80 sandboxes filled the budget where 110 fit), else the live or default
        prediction."""
        mean = self.model.mean_baseline(image)
        return self._predict(image).baseline_bytes if mean is None else mean

    def _start(self, sandbox_id: str, pred: BaselinePrediction, now: float, image: str) -> None:
        """A create admitted: its entry (and its share of its image's live figures)."""
        self._starting[sandbox_id] = _Starting(pred, now, image)
        self._launching[sandbox_id] = now
        live = self._live.get(image)
        if live is None:
            live = self._live[image] = _LiveImage()
        if not live.count:
            live.first = now
        live.count += 1
        live.since += now
        self._bound_live()

    def _unstart(self, sandbox_id: str) -> _Starting | None:
        """Forget a started sandbox's entry (and its share of its image's live figures)."""
        start = self._starting.pop(sandbox_id, None)
        self._launching.pop(sandbox_id, None)
        live = None if start is None else self._live.get(start.image)
        if live is not None:
            live.count -= 1
            live.since -= start.admitted_at
            live.area -= start.area
            if not live.count and self.model.finished(start.image):
                del self._live[start.image]  # its history speaks for it now
            elif not live.count:  # what it learned stays in seen_bytes until history comes
                live.area = live.since = 0.0
                self._bound_live()
        return start

    def _bound_live(self) -> None:
        """At most max_images images' live figures: those with no live sandbox go first."""
        if len(self._live) > self.config.max_images:
            for image in [i for i, v in self._live.items() if not v.count]:
                del self._live[image]
                if len(self._live) <= self.config.max_images:
                    break

    def expire(self, live: Collection[str]) -> None:
        """While no create waits (no step): forget started sandboxes not live after settle_s
        (a create that failed after admission, a sandbox gone unreported), and without
        reserve_growth every one past settle_s. live: the sandboxes the daemon knows. (A step
        with no snapshot of them took every started one older than settle_s for gone: growth,
        load and what live sandboxes teach all lapsed a minute after the last create waited.)"""
        now, cfg = self.clock(), self.config
        for sid, start in list(self._starting.items()):
            if now - start.admitted_at < cfg.settle_s:
                continue
            if sid not in live:
                self._unstart(sid)
                self._gone(sid)
            elif not cfg.reserve_growth:
                self._unstart(sid)

    def settled(self, sandbox_id: str) -> None:
        """The sandbox's first tool call came: how long that took teaches how long swap-out has
        while a baseline arrives. Without reserve_growth its prediction is no longer counted
        (its resident bytes say what it holds); with it, what it has yet to grow to still is.
        """
        start = self._starting.get(sandbox_id)
        if start is None or start.settled:
            return
        self.launched(sandbox_id)
        took = max(self.clock() - start.admitted_at, 0.0)
        self.start_s = took if self.start_s is None else 0.7 * self.start_s + 0.3 * took
        if self.config.reserve_growth:
            start.settled = True
        else:
            self._unstart(sandbox_id)

    def launched(self, sandbox_id: str) -> None:
        """The sandbox's runtime `start` has run (or its first call came): it no longer counts
        toward max_launching."""
        self._launching.pop(sandbox_id, None)

    def launches_full(self, now: float | None = None) -> bool:
        """Whether max_launching admitted creates are under way: none can start now but by its
        wait's bound, whatever the memory. Creates under way past settle_s stop counting."""
        if self.config.max_launching and self._launching:
            self._launches_over(self.clock() if now is None else now)
        return self._at_launch_bound()

    def _at_launch_bound(self) -> bool:
        """max_launching creates under way, those started in a step so far included."""
        cap = self.config.max_launching
        return bool(cap) and len(self._launching) >= cap

    def _launches_over(self, now: float) -> None:
        """Creates under way longer than settle_s (failed, or their start unseen) stop counting
        toward max_launching: a lost signal never closes the door."""
        for sid, at in list(self._launching.items()):
            if now - at >= self.config.settle_s:
                self.launched(sid)

    def finished(self, sandbox_id: str, image: str, baseline_bytes: int | None,
                 call_peak_bytes: int | None = None, call_load_bytes: int | None = None,
                 start_bytes: int | None = None) -> None:
        """The sandbox was removed; learn its image's baseline (None: not measured), call
        load (its calls' peak x duration summed, over its life; None: not measured) and start
        (what it held before its first call; None: not measured). A create of the same id
        queued meanwhile (a restart: its record went and it asked again before a rescan saw
        that) is a new life and stays queued."""
        if baseline_bytes is not None:  # first: the image's live figures go with its history
            self.model.observe(image, baseline_bytes, call_peak_bytes, call_load_bytes,
                               start_bytes)
        self._unstart(sandbox_id)
        self._gone(sandbox_id)

    def step(self, snap: DomainSnapshot, waiting: bool = True, now: float | None = None
             ) -> list[SandboxDecision]:
        """Decide every queued create, oldest first; started ones leave the queue.

        waiting=False returns the creates that start only (what the daemon acts on): first in,
        first out, every create behind the first that waits waits too, and their reasons are
        formatted when snapshot() reads them, not for every queued create every period. now: the
        caller's time, when it asked launches_full at it (the same answer here); the clock's
        by default."""
        now = self.clock() if now is None else now
        cfg = self.config
        self._later = None
        if not cfg.reserve_growth:
            for sid in [sid for sid, s in self._starting.items()
                        if now - s.admitted_at >= cfg.settle_s]:
                self._unstart(sid)
        # What each image's started sandboxes grow toward, as known now (learn_from_live), once
        # per image per step.
        grows_to = ({image: self._grows_to(image) for image in self._per_image}
                    if cfg.learn_from_live else None)
        cap = cfg.max_launching
        self.launches_full(now)  # the creates under way past settle_s stop counting
        pinned, claimed, arriving, growing, top = self._pinned(snap, now, grows_to)
        # The free swap is shared: what the live sandboxes would push out takes it first (what
        # it cannot take stays resident: pinned), then the arrivals, then the growth to come.
        shared = snap.swap_free_bytes if snap.swap_shared_bytes is None \
            else snap.swap_shared_bytes
        over, swap_left = swap_over_promised(claimed, shared)
        pinned += over
        swap_left = min(swap_left, snap.swap_free_bytes)
        running = sum(max(c, 0) for c in snap.running_call_bytes)
        load = self.call_load()
        loads = self._load_of
        absorbed = self.absorbable(snap, swap_left)
        credit = max(snap.swap_credit_bytes, 0) if cfg.calls_on_swap else 0

        @functools.cache  # creates behind one another mostly share their figures
        def on_swap_of(arriving: int, baseline: int) -> tuple[int, int]:
            """(growth pinned, calls on swap) beside the arrivals and a new `baseline`. The free
            swap left after the claims goes to the arrivals (what of them swap-out moves during
            a start: their bytes at most, not the bandwidth's whole reach, which left no room
            for the rest at hardware speed), then to settled sandboxes' growth as it comes
            (what it cannot take is as good as pinned), then to calls: call admission runs
            them on the swap credit, their cold pages swapped out as they grow, and counting
            their charges against budget - S alone held every create until they ended while
            swap had room (the simulator's 15x Poisson point at hardware speed: creates waited
            15 s on average, execgate 13 % behind eager+swap, which lost nothing)."""
            left = max(swap_left - min(absorbed, arriving + baseline), 0)
            growth = max(growing - left, 0)
            return growth, min(credit, left - (growing - growth))

        # top: the largest (next-call peak, id) so far, kept as sandboxes start: one pass over
        # the live sandboxes per step, not one per queued create (1,000 sandboxes made it the
        # cost).
        fmt = functools.cache(fmt_bytes)  # few sizes recur in reasons

        @functools.cache  # and their terms
        def terms_of(pinned: int, growth: int, arriving: int, baseline: int, source: str,
                     peak: int, peak_of: str, load: int, on_swap: int, need: int) -> str:
            """The reason's sum, `need` (decide's) spelt out term by term."""
            if load > max(peak, running):
                calls = (f"call load {fmt(load)} (the live sandboxes' and its expected calls; "
                         f"> next peak {fmt(peak)} of {peak_of})")
            elif peak >= running:
                calls = f"one call {fmt(peak)} (next peak of {peak_of})"
            else:
                calls = f"running calls {fmt(running)} (> next peak {fmt(peak)} of {peak_of})"
            base = f"baseline {fmt(baseline)} ({source})"
            if arriving or absorbed:
                base = (f"unabsorbed arrivals {fmt(_unabsorbed(arriving, baseline, absorbed))} "
                        f"(arriving {fmt(arriving)} + {base} - swap absorbs {fmt(absorbed)})")
            if on_swap:
                calls += f" - on swap {fmt(on_swap)}"
            held = f"pinned {fmt(pinned + growth)}"
            if growth:
                held += f" ({fmt(growth)} of it growth to come)"
            return f"{held} + {base} + {calls} = {fmt(need)}"

        empty = not snap.sandboxes and not self._starting
        room = snap.room_bytes
        decisions: list[SandboxDecision] = []
        ahead: str | None = None  # the oldest sandbox still waiting
        within = f"budget - S {fmt(room)}"
        def decide(entry: _Queued) -> SandboxDecision:
            """This step's verdict on one create; its reason is kept for snapshot()."""
            if cfg.learn_from_live:  # what was learned since it was queued
                entry.prediction = self._predict(entry.request.image,
                                                 entry.request.call_peak_bytes)
            sid, pred = entry.request.sandbox_id, entry.prediction
            mine = (pred.call_peak_bytes, sid)
            peak, peak_of = mine if top is None else max(top, mine)
            calls = load + loads(entry.request.image)
            growth, on_swap = on_swap_of(arriving, pred.baseline_bytes)
            calls_term = max(peak, running, calls)
            need = (pinned + growth + max(calls_term - on_swap, 0)
                    + _unabsorbed(arriving, pred.baseline_bytes, absorbed))
            waited = max(now - entry.arrival, 0.0)
            caller = entry.request.caller_deadline
            bound = cfg.max_wait_s(caller)
            terms = terms_of(pinned, growth, arriving, pred.baseline_bytes, pred.source, peak,
                             peak_of, calls, on_swap, need)
            if not cfg.enabled:
                verdict, reason = Verdict.ADMITTED, "admitted: sandbox admission is off"
            elif ahead is None and empty:
                verdict, reason = Verdict.ADMITTED, f"admitted: nothing live; {terms}"
            elif ahead is None and need <= room and not self._at_launch_bound():
                verdict, reason = Verdict.ADMITTED, f"admitted: {terms} <= {within}"
            elif waited >= bound:
                verdict = Verdict.FAIL_OPEN
                held = (f"; {len(self._launching)} admitted creates not yet started "
                        f"(max_launching {cap})" if need <= room and self._at_launch_bound()
                        else "")
                reason = (f"fail open: waited {waited:.1f} s >= {cfg.bound_name(caller)} "
                          f"{bound:g} s; {terms} vs {within}{held}")
            else:
                verdict = Verdict.WAITING
                if ahead is not None:
                    why = f"behind {ahead}, which came first (first in, first out); {terms}"
                elif need > room:
                    why = f"{terms} > {within}, short {fmt(need - room)}"
                else:
                    why = (f"{len(self._launching)} admitted creates not yet started "
                           f"(max_launching {cap}); {terms} <= {within}")
                of_max = f" of {bound:g} s" if math.isfinite(bound) else " (no bound)"
                reason = f"waiting {waited:.1f} s{of_max}: {why}"
            entry.reason = reason
            absorbs = min(absorbed, arriving + pred.baseline_bytes)
            return frozen(  # its __init__ costs, one per queued create per step
                SandboxDecision, sandbox_id=sid, verdict=verdict, waited_s=waited,
                need_bytes=need, room_bytes=room, baseline_bytes=pred.baseline_bytes,
                call_peak_bytes=peak, reason=reason, absorbed_bytes=absorbs,
                on_swap_bytes=min(on_swap, calls_term))

        def start(entry: _Queued, d: SandboxDecision) -> None:
            """It leaves the queue; what it brings counts for the creates behind it."""
            nonlocal load, arriving, top, empty
            decisions.append(d)
            sid, pred = d.sandbox_id, entry.prediction
            self._dequeue(sid)
            image = entry.request.image
            self._start(sid, pred, now, image)
            self._totals[d.verdict.value] += 1
            self.live(sid, image)
            load += loads(image)
            arriving += pred.baseline_bytes
            mine = (pred.call_peak_bytes, sid)
            top = mine if top is None else max(top, mine)
            empty = False

        queue = self._oldest_first()
        for i, entry in enumerate(queue):
            d = decide(entry)
            if d.verdict is not Verdict.WAITING:
                start(entry, d)
                continue
            ahead = ahead or d.sandbox_id
            if waiting:
                decisions.append(d)
                continue
            # The rest wait behind it, but for those whose bound is over (a kubelet create
            # behind a Docker one); the others' reasons are formatted when snapshot() asks.
            rest = queue[i + 1:]
            bounded = self._with_deadline or math.isfinite(cfg.max_start_wait_s_no_deadline)
            due = [e for e in rest if now - e.arrival >= cfg.max_wait_s(e.request.caller_deadline)
                   ] if bounded else []
            for late in due:
                start(late, decide(late))
            self._later = functools.partial(lambda rest: [decide(e) for e in rest],
                                            [e for e in rest if e.request.sandbox_id
                                             in self._queue])
            break
        return decisions

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready view for `execgatectl status`: waiting creates (oldest first, with why),
        started sandboxes not yet at their baseline, totals, learned baselines."""
        now = self.clock()

        def finite(s: float) -> float | None:  # JSON has no infinity: None says "no bound"
            return s if math.isfinite(s) else None

        if self._later is not None:  # the reasons the last step left to be formatted
            self._later()
            self._later = None
        return {
            "max_start_wait_s": finite(self.config.max_start_wait_s),
            "max_start_wait_s_no_deadline": finite(self.config.max_start_wait_s_no_deadline),
            "waiting": [
                {"sandbox_id": e.request.sandbox_id, "image": e.request.image,
                 "waited_s": max(now - e.arrival, 0.0), "caller_deadline":
                 e.request.caller_deadline, "deadline": finite(
                     e.arrival + self.config.max_wait_s(e.request.caller_deadline)),
                 "baseline_bytes": e.prediction.baseline_bytes,
                 "call_peak_bytes": e.prediction.call_peak_bytes,
                 "source": e.prediction.source, "reason": e.reason}
                for e in self._oldest_first()
            ],
            "starting": [
                {"sandbox_id": sid, "baseline_bytes": s.prediction.baseline_bytes,
                 "admitted_at": s.admitted_at}
                for sid, s in self._starting.items() if not s.settled
            ],
            "launching": len(self._launching),
            "max_launching": self.config.max_launching,
            "totals": dict(self._totals),
            "start_s": self.start_s,
            "call_load_bytes": self.call_load(),
            "images": self.model.snapshot(),
        }

    # -- internals ---------------------------------------------------------------------------

    def _dequeue(self, sandbox_id: str) -> _Queued | None:
        entry = self._queue.pop(sandbox_id, None)
        if entry is not None:
            self._with_deadline -= entry.request.caller_deadline
        return entry

    def _oldest_first(self) -> list[_Queued]:
        """The queued creates by (arrival, submission): the queue's own order while they came
        in arrival order (a step decides every one of them, each period)."""
        if self._fifo:
            return list(self._queue.values())
        return sorted(self._queue.values(), key=lambda e: (e.arrival, e.seq))

    def absorbable(self, snap: DomainSnapshot, swap_free: int | None = None) -> int:
        """What swap can take of arriving baselines: its bandwidth over a start (measured, else
        default_start_s), within its free room (swap_free: what the live sandboxes leave of
        it); 0 without swap."""
        start_s = self.config.default_start_s if self.start_s is None else self.start_s
        moved = int(max(snap.swap_out_bytes_per_s, 0.0) * start_s)
        free = snap.swap_free_bytes if swap_free is None else swap_free
        return max(min(moved, free), 0)

    def _pinned(self, snap: DomainSnapshot, now: float, grows_to: dict[str, int] | None
                ) -> tuple[int, int, int, int, tuple[int, str] | None]:
        """Bytes outside tool calls that cannot be pushed out, the live sandboxes' claims on
        the free swap (summed in the same pass: a second one cost the 1,000-sandbox sweep
        ~6 % of its time), the baselines still arriving,
        the growth settled sandboxes have still to come, and the largest (next-call peak, id)
        of a live sandbox (None: none is). A sandbox admitted but not settled pins
        what the snapshot says and has the rest of its predicted baseline still to come (the
        prediction less the most resident memory seen of it: memory it allocated and residency
        then pushed out has arrived, and counting it again held the VM's burst creates back a
        whole docker run); its next-call peak is at least the predicted one.

        With reserve_growth a settled sandbox keeps the rest of its prediction counted: its
        calls leave files and caches behind (the generator's tasks end with ~260 MiB of them
        beside a ~180 MiB baseline), and a rule that forgot them at the first call admitted
        sandboxes whose growth then filled the budget (1,000 sandboxes without swap, in the
        simulator: calls starved, creates failed open, 228 of 1,000 tasks done). An entry
        that is not live after settle_s (a create that failed after admission, a sandbox gone
        unreported) is dropped. With learn_from_live the rest is measured against what its image's
        sandboxes are expected to grow to as known now (`grows_to`), and the most seen of a
        sandbox teaches its image's."""
        boxes = snap.sandboxes
        pinned = max(snap.other_bytes, 0)
        starting = self._starting
        claimed = 0
        if not starting:  # every sandbox as the snapshot shows it
            for box in boxes:
                pinned += box.pinned_bytes
                claimed += box.swap_claim_bytes
            top = max(((box.next_call_peak_bytes, box.sandbox_id) for box in boxes), default=None)
            return pinned, claimed, 0, 0, top
        arriving = growing = 0
        matched = 0
        top_peak: float = -math.inf
        top_id = ""
        get = starting.get
        live = self._live if grows_to is not None else None
        target_of = None if grows_to is None else grows_to.get
        last_image: str | None = None  # the image whose target was looked up last (mostly one)
        target: int | None = None
        # One pass over the live sandboxes, plain comparisons (with reserve_growth nearly every
        # live sandbox has an entry: at 1,000 sandboxes this loop was the simulator's cost).
        for box in boxes:
            pinned += box.pinned_bytes
            claimed += box.swap_claim_bytes
            sid = box.sandbox_id
            peak = box.next_call_peak_bytes
            start = get(sid)
            if start is not None:
                matched += 1
                pred = start.prediction
                seen = start.seen_bytes
                resident = box.resident_bytes
                if resident > seen:
                    start.seen_bytes = seen = resident
                    if live is not None:
                        image = live.get(start.image)
                        if image is not None and resident > image.seen_bytes:
                            image.seen_bytes = resident
                if target_of is None:
                    to_come = pred.baseline_bytes - seen
                else:
                    if start.image is not last_image:
                        last_image = start.image
                        target = target_of(last_image)
                    to_come = (pred.baseline_bytes if target is None else target) - seen
                if to_come > 0:
                    if start.settled:
                        growing += to_come
                    else:
                        arriving += to_come
                if pred.call_peak_bytes > peak:
                    peak = pred.call_peak_bytes
            if peak > top_peak or (peak == top_peak and sid > top_id):
                top_peak, top_id = peak, sid
        top = (int(top_peak), top_id) if boxes else None
        if matched == len(starting):  # every entry is live
            return pinned, claimed, arriving, growing, top
        seen = {box.sandbox_id for box in boxes}
        stale = []
        for sid, start in starting.items():
            if sid in seen:
                continue
            if now - start.admitted_at >= self.config.settle_s:
                stale.append(sid)  # (reserve_growth only: the filter in step took the rest)
                continue
            base = start.prediction.baseline_bytes
            if grows_to is not None:
                base = grows_to.get(start.image, base)
            if start.settled:  # its first call came before the daemon saw its record
                growing += max(base - start.seen_bytes, 0)
            else:
                arriving += base
            mine = (start.prediction.call_peak_bytes, sid)
            if top is None or mine > top:
                top = mine
        for sid in stale:
            self._unstart(sid)
            self._gone(sid)
        return pinned, claimed, arriving, growing, top


def _unabsorbed(arriving: int, baseline: int, absorbed: int) -> int:
    """What of the arriving baselines and the new one must fit as it is: swap takes the rest."""
    return max(arriving + baseline - absorbed, 0)
