"""Everything a subcommand handler needs about the current runtime call."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (on every runtime call)
if TYPE_CHECKING:
    from execgate.common.config import Config
    from execgate.oci.cli import Invocation
    from execgate.oci.runclog import RuncLog


class Context:
    def __init__(self, inv: Invocation, config: Config, log: RuncLog, runc: str) -> None:
        self.inv = inv
        self.config = config
        self.log = log
        self.runc = runc  # the real runtime's path (runc, crun)
