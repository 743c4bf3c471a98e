"""The words of agent command lines that more than one reader must agree on.

Admission classes a call by its command (policy/estimate.py) and the OOM note advises by it
(calls/feedback.py): both see through the same shells, runners and assignments, so both take
them from here. Cheap to import (the runtime path's feedback imports it).
"""

from __future__ import annotations

import re

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh", "mksh"})
# `<runner> run <cmd>` runs <cmd>.
RUNNERS = frozenset({"uv", "poetry", "pipenv", "pdm", "hatch", "rye"})
PYTHON = re.compile(r"(python|pypy)(\d+(\.\d+)?)?")
NODE_PMS = frozenset({"npm", "pnpm", "yarn", "bun"})
# `FOO=1 cmd`: an environment assignment in front of the command.
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)
