"""The host's memory-pressure state Q(t), shared by admission and the growth gate."""

from __future__ import annotations

import enum


class Pressure(enum.IntEnum):
    """Ordered so that max() picks the worse state (red wins ties)."""

    GREEN = 0
    YELLOW = 1
    RED = 2

    def __str__(self) -> str:
        return self.name.lower()
