"""InsideAgents: the daemon's inside-agent front door, assembled from its parts (see __init__).

Started and stopped with the daemon's loop; its snapshot is `status.daemon.inside`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from .admission import CallAdmission
from .discovery import Discovery, Inotify
from .end_watcher import EndWatcher
from .ending import Ending
from .placement import Placement
from .recovery import Recovery
from .sources import EventSources

log = logging.getLogger("execgated.inside")


class InsideAgents(Discovery, EventSources, Placement, CallAdmission, Ending,
                   Recovery):
    """Every tool process an opted-in container's agent spawns, a gated tool call."""

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.ends = EndWatcher(self._ended_threadsafe)
        cdir = os.path.join(self.cfg.state_dir, "containers")
        try:
            os.makedirs(cdir, mode=0o700, exist_ok=True)
            self.inotify = Inotify(cdir)
            self.loop.add_reader(self.inotify.fd, self._records_changed)
        except OSError as e:
            log.info("no inotify on %s (%s): records are re-read every %.1f s", cdir, e,
                     self.conf.scan_period_s)
        self._starting = True  # a previous daemon may have left calls frozen: thaw them all
        try:
            self._scan()
        finally:
            self._starting = False
        self._task = asyncio.ensure_future(self._periodic())

    def stop(self) -> None:
        """Shutting down: nothing of ours may stay frozen while the daemon is gone."""
        if self._task is not None:
            self._task.cancel()
        for handle, _m in self._due.values():
            handle.cancel()
        self._due.clear()
        for c in list(self.calls.values()):
            if c.frozen:
                self._thaw(c)
            if c.wait is not None:
                c.wait.cancel()
        self._listen(False, linger=False)
        if self.inotify is not None and self.loop is not None:
            self.loop.remove_reader(self.inotify.fd)
            self.inotify.close()
        if self.ends is not None:
            self.ends.stop()

    def snapshot(self) -> dict[str, Any]:
        stats = dict(self.stats)
        stats["short"] += self.tracker.gone_before_fork + self._probe_short
        if self.probe is not None:
            with contextlib.suppress(OSError):
                stats["kernel"] = self.probe.stats()  # the probe's own counters
                stats["short"] += stats["kernel"]["short"]
        source = "bpf" if self.probe is not None else "connector" if self.conn else \
            "loading" if self._loading is not None else None
        return {"containers": len(self.boxes), "listening": source in ("bpf", "connector"),
                "source": source, "calls": len(self.calls), "learned": sorted(self.learned),
                **stats}
