"""Fan-out of daemon events (queued, admitted, finished, ...) to `execgatectl events`."""

from __future__ import annotations

import asyncio
import time
from typing import Any


class EventBus:
    def __init__(self, backlog: int = 1000) -> None:
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self.backlog = backlog

    def publish(self, kind: str, **fields: Any) -> None:
        event = {"event": kind, "time": time.time(), **fields}
        for q in list(self._subscribers):
            if q.full():  # a stalled reader loses its oldest events, never blocks the loop
                q.get_nowait()
            q.put_nowait(event)

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=self.backlog)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers.discard(q)
