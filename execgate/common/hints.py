"""AGENT_RESOURCE_HINT: what an agent says a tool call will need, parsed strictly.

The grammar is a superset of AgentCgroup's (`memory:low|medium|high|<size>`) plus
ToolSched-style `key=value` items, so hints written for either keep working:

    memory:high   mem=1.5g   cpu=2   io=50   duration=30s   idempotent   priority:low

Items are separated by commas and/or whitespace; keys and values are case-insensitive; every
key accepts `:` or `=` (`memory=`/`mem:` are synonyms of `mem=`/`memory:`), and spaces around
them are forgiven (`memory: 2g`), because the writer is usually a language model.

Sizes: a plain number is bytes; k/m/g (with optional `i` and/or `b`) are *binary* multiples.
`2g` means 2 GiB, never 2 * 10**9 bytes: people and models sizing memory think in powers of two,
and cgroup limits are usually set that way, so a decimal reading would undershoot every hint.

A hint is all-or-nothing. A partly understood hint is worse than none: dropping the one item
that failed to parse could silently turn "memory:2g,priority:low" into a mere priority change.
So any bad item voids the whole hint and the result carries one ASCII reason, quoting the
offending item, that execgate hands back to the agent (see execgate.calls.feedback).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from execgate.common.units import GiB, MiB

ENV_NAME = "AGENT_RESOURCE_HINT"
MAX_LEN = 1024
# Far above any real machine; keeps values inside u64 cgroup files and int64 wire formats.
MAX_BYTES = 1 << 60

CLASSES = ("low", "medium", "high")
PRIORITIES = ("low", "normal", "high")

_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmg", start=1):
    for _suffix in (_p, _p + "b", _p + "i", _p + "ib"):
        _UNITS[_suffix] = 1024**_i
_DURATION_UNITS = {"": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0}

# No sign, no exponent, no nan/inf: float() would accept all of those.
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_SIZE_RE = re.compile(_NUMBER + r"([a-z]*)")
_ITEM_RE = re.compile(r"([a-z_]+)(?:[:=](.*))?", re.DOTALL)
_AROUND_SEP_RE = re.compile(r"\s*([:=])\s*")
_SPLIT_RE = re.compile(r"[\s,]+")
_KEYS = {
    "memory": "memory",
    "mem": "memory",
    "cpu": "cpu",
    "io": "io",
    "duration": "duration",
    "priority": "priority",
    "idempotent": "idempotent",
}
_KNOWN = "memory, cpu, io, duration, priority, idempotent"


@dataclass(frozen=True)
class HintSizes:
    """What the memory classes mean on this host (configurable; AgentCgroup's values by default)."""

    low: int = 256 * MiB
    medium: int = 1 * GiB
    high: int | None = None  # None: unbounded, i.e. up to the container's own limit


DEFAULT_SIZES = HintSizes()


@dataclass(frozen=True)
class Hint:
    """A validated hint, as travels from the runtime to the daemon."""

    memory_bytes: int | None = None  # declared demand; None = undeclared or unbounded
    memory_class: str | None = None  # 'low'|'medium'|'high' when given as a class
    cpu: float | None = None
    io_mbps: float | None = None
    duration_s: float | None = None
    idempotent: bool = False
    priority: str = "normal"

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, so it survives JSON and msgpack unchanged."""
        return {
            "memory_bytes": self.memory_bytes,
            "memory_class": self.memory_class,
            "cpu": self.cpu,
            "io_mbps": self.io_mbps,
            "duration_s": self.duration_s,
            "idempotent": self.idempotent,
            "priority": self.priority,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Hint:
        """Missing keys take defaults (older peers); wrong types raise ValueError (bad peers)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"hint must be a mapping, not {type(d).__name__}")
        mem = d.get("memory_bytes")
        if mem is not None and (type(mem) is not int or not 0 < mem <= MAX_BYTES):
            raise ValueError(f"memory_bytes must be a positive integer or null, not {mem!r}")
        mclass = d.get("memory_class")
        if mclass is not None and mclass not in CLASSES:
            raise ValueError(f"memory_class must be one of {CLASSES} or null, not {mclass!r}")
        idem = d.get("idempotent", False)
        if not isinstance(idem, bool):
            raise ValueError(f"idempotent must be a boolean, not {idem!r}")
        prio = d.get("priority", "normal")
        if prio not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}, not {prio!r}")
        return cls(
            memory_bytes=mem,
            memory_class=mclass,
            cpu=_dict_float(d, "cpu"),
            io_mbps=_dict_float(d, "io_mbps"),
            duration_s=_dict_float(d, "duration_s"),
            idempotent=idem,
            priority=prio,
        )


@dataclass(frozen=True)
class ParsedHint:
    """Outcome of parse(): at most one of hint/error is set; both None means no hint given."""

    hint: Hint | None
    error: str | None
    raw: str


def _dict_float(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v > 0):
        raise ValueError(f"{key} must be a positive number or null, not {v!r}")
    return float(v)


def escape(text: str) -> str:
    """`text` as printable ASCII: anything else becomes a Python-style escape (`\\x1b`, `\\u00e9`).

    Anything echoed back to an agent or a log goes through here: a hint is untrusted input and
    must not smuggle terminal escapes or line breaks into someone else's stderr.
    """
    return "".join(
        ch if " " <= ch <= "~" else ch.encode("unicode_escape").decode("ascii") for ch in text
    )


# Echoed inside single quotes: only these pass raw. Every shell metacharacter (quotes,
# backslash, `$`, `;`, `|`, `&`, globs, brackets, `#`, `~`, `!`) becomes `\xNN`, so a quoted
# hint is inert even if a shell reads the line (`';touch${IFS}x;#'` cannot close the quotes).
_QUOTE_RAW = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 =:.,_+-/@%")


def _quoted_char(ch: str) -> str:
    if ch in _QUOTE_RAW:
        return ch
    if " " <= ch <= "~":
        return f"\\x{ord(ch):02x}"
    return ch.encode("unicode_escape").decode("ascii")  # \n, \x1b, \u200b


def quote(text: str, limit: int = 40) -> str:
    """Single-quoted, every character outside _QUOTE_RAW escaped Python-style (`\\x3b`,
    `\\u00e9`), cut at `limit` shown characters (never inside an escape) so 10 kB of junk
    stays one line."""
    shown: list[str] = []
    size = 0
    for i, ch in enumerate(text[: limit + 1]):
        piece = _quoted_char(ch)
        if size + len(piece) > limit or i == limit:
            return "'" + "".join(shown) + "...'"
        shown.append(piece)
        size += len(piece)
    return "'" + "".join(shown) + "'"


class _Bad(ValueError):
    """One item failed; carries the reason shown to the agent."""


def _positive(value: str, item: str, what: str) -> float:
    if value.startswith("-"):
        raise _Bad(f"{quote(item)}: {what} must be positive")
    if not re.fullmatch(_NUMBER, value):
        raise _Bad(f"{quote(item)}: {what} must be a positive number")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise _Bad(f"{quote(item)}: {what} must be a positive number")
    return number


def _size(value: str, item: str) -> int:
    if value.startswith("-"):
        raise _Bad(f"{quote(item)}: size must be positive")
    m = _SIZE_RE.fullmatch(value)
    if not m or m.group(2) not in _UNITS:
        raise _Bad(f"{quote(item)}: expected low, medium, high or a size like 512m or 2g")
    number = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(number) or number > MAX_BYTES:
        raise _Bad(f"{quote(item)}: size is too large")
    size = round(number)
    if size <= 0:
        raise _Bad(f"{quote(item)}: size must be positive")
    return size


def parse_size(value: str | int) -> int:
    """A byte size as hints and config.toml write it (512m, 2GiB, 1048576); ValueError if bad."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"size must be positive, not {value}")
        return value
    text = str(value).strip().lower()
    return _size(text, text)


def _duration(value: str, item: str) -> float:
    m = _SIZE_RE.fullmatch(value)
    if m and m.group(2) in _DURATION_UNITS:
        number = _positive(m.group(1), item, "duration") * _DURATION_UNITS[m.group(2)]
        if math.isfinite(number):
            return number
    if value.startswith("-"):
        raise _Bad(f"{quote(item)}: duration must be positive")
    raise _Bad(f"{quote(item)}: duration must be seconds, e.g. 30, 30s, 500ms or 2m")


def _item(token: str, sizes: HintSizes) -> tuple[str, Any]:
    """One item -> (field, value); memory yields a (bytes, class) pair."""
    low = token.lower()
    m = _ITEM_RE.fullmatch(low)
    key = _KEYS.get(m.group(1)) if m else None
    if m is None or key is None:
        raise _Bad(f"{quote(token)}: unknown item (known: {_KNOWN})")
    value = m.group(2)
    if key == "idempotent":
        if value is not None:
            raise _Bad(f"{quote(token)}: idempotent takes no value")
        return key, True
    if value is None or value == "":
        raise _Bad(f"{quote(token)}: missing value")
    if key == "memory":
        if value in CLASSES:
            return key, (getattr(sizes, value), value)
        return key, (_size(value, token), None)
    if key == "priority":
        if value not in PRIORITIES:
            raise _Bad(f"{quote(token)}: priority must be low, normal or high")
        return key, value
    if key == "duration":
        return key, _duration(value, token)
    return key, _positive(value, token, key)


def _agree(a: object, b: object) -> bool:
    """Whether two values for the same key may both stand (memory: same bytes, no class clash)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return a[0] == b[0] and (a[1] is None or b[1] is None or a[1] == b[1])
    return a == b


def parse(text: str | None, sizes: HintSizes = DEFAULT_SIZES) -> ParsedHint:
    """Parse a hint value; never raises, so a bad hint can only ever mean "no hint"."""
    raw = text or ""
    if not raw.strip():
        return ParsedHint(None, None, raw)
    if len(raw) > MAX_LEN:
        return ParsedHint(None, f"too long ({len(raw)} chars, max {MAX_LEN}): {quote(raw)}", raw)
    if any(not ch.isprintable() and ch not in " \t\r\n" for ch in raw):
        return ParsedHint(None, f"non-printable character in {quote(raw)}", raw)

    seen: dict[str, tuple[Any, str]] = {}  # key -> (value, the item that gave it)
    try:
        for token in _SPLIT_RE.split(_AROUND_SEP_RE.sub(r"\1", raw.strip())):
            if not token:
                continue
            key, value = _item(token, sizes)
            if key not in seen:
                seen[key] = (value, token)
            elif not _agree(seen[key][0], value):
                raise _Bad(f"{quote(token)}: conflicts with {quote(seen[key][1])}")
            elif key == "memory" and seen[key][0][1] is None:
                seen[key] = (value, token)  # `mem=1g memory:medium` keeps the class
    except _Bad as e:
        return ParsedHint(None, str(e), raw)
    if not seen:  # only separators
        return ParsedHint(None, None, raw)

    fields: dict[str, Any] = {}
    if "memory" in seen:
        fields["memory_bytes"], fields["memory_class"] = seen["memory"][0]
    for key, name in (("cpu", "cpu"), ("io", "io_mbps"), ("duration", "duration_s")):
        if key in seen:
            fields[name] = seen[key][0]
    if "idempotent" in seen:
        fields["idempotent"] = True
    if "priority" in seen:
        fields["priority"] = seen["priority"][0]
    return ParsedHint(Hint(**fields), None, raw)


def _last(env: list[str]) -> str | None:
    prefix = ENV_NAME + "="
    found = None
    for item in env:
        if isinstance(item, str) and item.startswith(prefix):
            found = item[len(prefix) :]
    return found


def pick(exec_env: list[str], container_env: list[str]) -> str | None:
    """The hint that applies to one exec: the exec's own wins, even if set empty on purpose."""
    found = _last(exec_env or [])
    return found if found is not None else _last(container_env or [])


def clamp(hint: Hint, *, priority_allowed: bool, memory_limit: int | None) -> Hint:
    """Cut a hint down to what this agent may ask for: a hint never raises a call's limits.

    An unbounded `memory:high` becomes the container's limit when one is known, because that is
    the most the call can ever use; an undeclared demand stays undeclared.
    """
    changes: dict[str, Any] = {}
    if hint.priority == "high" and not priority_allowed:
        changes["priority"] = "normal"
    if memory_limit is not None and memory_limit > 0:
        declared = hint.memory_bytes
        unbounded = declared is None and hint.memory_class == "high"
        if unbounded or (declared is not None and declared > memory_limit):
            changes["memory_bytes"] = memory_limit
    return replace(hint, **changes) if changes else hint


def _file_name(sandbox: str) -> str:
    """A safe, collision-free file name: cleaned names get a hash of the original appended."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", sandbox).lstrip(".")[:100]
    if clean != sandbox or not clean:
        digest = hashlib.sha256(sandbox.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        clean = f"{clean}-{digest}" if clean else digest
    return clean


def warnings_dir(state_dir: str) -> str:
    """Where the sandboxes' records of bad hints warned about are (daemon/retention.py prunes)."""
    return os.path.join(state_dir, "hint-warnings")


def warnings_path(state_dir: str, sandbox: str) -> str:
    """The sandbox's record of the bad hints it was warned about."""
    return os.path.join(warnings_dir(state_dir), _file_name(sandbox))


def forget_warnings(state_dir: str, sandbox: str) -> None:
    """The sandbox is gone: drop its record of warnings (state must not grow forever)."""
    try:
        os.unlink(warnings_path(state_dir, sandbox))
    except OSError:
        pass


def should_warn(state_dir: str, sandbox: str, value: str) -> bool:
    """Whether to tell the agent about this bad hint: once per sandbox and distinct value.

    Each exec is a fresh runtime process, so the memory of what was said lives on disk: one file
    per sandbox of sha256 prefixes, appended with O_APPEND (small appends stay whole between
    concurrent writers). Two racing callers may both warn; nothing here ever raises, and any
    I/O trouble answers True: a repeated warning costs less than a lost one.
    """
    try:
        key = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        path = warnings_path(state_dir, sandbox)
        try:
            with open(path, "rb") as f:
                if key.encode() in f.read().split():
                    return False
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, key.encode() + b"\n")
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return True
    return True
