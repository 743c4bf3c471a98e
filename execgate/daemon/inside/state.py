"""What the daemon keeps of inside agents: opted-in containers (Box), placed calls (Call), and
the state every part of InsideAgents shares (AgentsState, the base of its parts).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from execgate.bpf import inside_probe as probe_mod
from execgate.calls.record import ToolCall
from execgate.common import records
from execgate.common.config import Config

from ..engine import Engine
from ..settings import InsideConfig, Settings
from . import proc_events
from .end_watcher import EndWatcher
from .tracker import Match, Tracker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .discovery import Inotify


@dataclass
class Box:
    """An opted-in container."""

    cid: str
    sandbox: str
    cgroup: str
    init_pid: int
    command: str | None
    number: int = 0  # the box's number in the BPF probe's agents map
    agents: set[int] = field(default_factory=set)
    spares: list[str] = field(default_factory=list)
    next_scan: float = 0.0


@dataclass
class Call:
    call: ToolCall  # as runtime/exec.py's, so the journal line reads the same
    pid: int
    box: Box
    stderr: int | None
    frozen: bool = False
    status: int | None = None
    last_comm: str = ""  # the program it ran last (the kernel's exit event), for learning
    exited: threading.Event = field(default_factory=threading.Event)
    ended: bool = False  # its cgroup emptied (the exit event may come before or after)
    peak: int | None = None  # its memory.peak when it ended, for learning
    wait: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.call.call

    @property
    def cgroup(self) -> str:
        return self.call.cgroup


class AgentsState:
    """The event source, placement and end watching, on the daemon's asyncio loop: the state
    its parts (discovery, sources, placement, admission, ending, recovery) share."""

    def __init__(self, cfg: Config, settings: Settings, engine: Engine) -> None:
        self.cfg = cfg
        self.settings = settings
        self.conf: InsideConfig = settings.inside
        self.engine = engine
        self.tracker = Tracker(self.conf.rule)
        self.boxes: dict[str, Box] = {}
        self.calls: dict[str, Call] = {}
        self.by_pid: dict[int, Call] = {}
        self.conn: proc_events.ProcConnector | None = None
        self.probe: probe_mod.InsideProbe | None = None  # the kernel-side source (rule child)
        self._probe_off: str | None = None  # why the probe is not used (auto: once is enough)
        self._probe_short = 0  # short commands counted by probes closed since
        # The probe loading on a worker thread: (probe, object file, seconds it took).
        self._loading: asyncio.Future[tuple[probe_mod.InsideProbe, str, float]] | None = None
        self._quiet_since: float | None = None  # when the last opted-in container left
        self._early_exits: dict[int, int] = {}  # tgid -> ns of an EV_EXIT before its EV_CALL
        self._numbers: dict[int, str] = {}  # box number -> container id
        self.learned: set[str] = set()  # programs placed at exec because their calls grew
        self._next_number = 1
        self.ends: EndWatcher | None = None
        self.inotify: Inotify | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._dirty = True
        self._index = records.ContainerIndex(cfg.state_dir)
        self._overruns = 0
        self._starting = False
        self._retry_listen_at = 0.0
        self.stats = {"placed": 0, "short": 0, "missed": 0, "failed": 0, "events": 0,
                      "in_exec": 0}
        # Calls in their first slice (place_after_ms): tgid -> (timer, match).
        self._due: dict[int, tuple[asyncio.TimerHandle, Match]] = {}
        self._slice_ns = int(self.conf.place_after_ms * 1e6)
        self._batch_s = self.conf.place_after_ms / 2000
