"""Everything a subcommand handler needs about the current runtime call."""

from __future__ import annotations

from dataclasses import dataclass

from execgate.common.config import Config
from execgate.oci.cli import Invocation
from execgate.oci.runclog import RuncLog


@dataclass
class Context:
    inv: Invocation
    config: Config
    log: RuncLog
    runtime: str  # the real runtime's path
