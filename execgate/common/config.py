"""execgate's configuration: /etc/execgate/config.toml over built-in defaults.

Read on every runtime call, so it stays a flat table parsed with tomllib (stdlib) and nothing
more, and this module imports nothing at load time: the runtime reads it through
load_cached(), which keeps the resolved config in a marshal file and parses TOML only when the
config file has changed. A broken config must never break a container: errors fall back to the
defaults and are reported by the caller; a cache that is stale, corrupt or unwritable is only
a missed shortcut.
"""

from __future__ import annotations

import os

DEFAULT_PATH = "/etc/execgate/config.toml"
# The runtime's cache of the resolved config, in the default state dir (tmpfs: gone on reboot);
# not in the configured state_dir, which is only known once the config is read.
CACHE_PATH = "/run/execgate/config.cache"
# A config file changed this recently may change again within the same timestamp tick (the
# kernel's file times are coarse), unseen by the cache key: it is not cached until it settles.
SETTLE_NS = 2_000_000_000
# The end of the one error that means the whole file was not read (it did not parse, or could
# not be opened): every setting is its default.
UNREAD = "; using defaults"


class Config:
    """The settings, each declared with its default. Immutable; compared by setting (not errors
    and tables). A plain class, not a dataclass: `dataclasses` costs the runtime more to import
    (inspect, ast, dis...) than all the rest of a call."""

    # The real OCI runtime: a path or command name, or a list tried in order.
    runtime: tuple[str, ...] = ("runc", "crun")
    # Per-container records and per-call state (tmpfs: gone on reboot, like runc's own state).
    state_dir: str = "/run/execgate"
    # Append-only JSONL of finished tool calls (outcome, duration, peak memory).
    journal: str = "/var/lib/execgate/calls.jsonl"
    # Journal lines keep a call's program and command class, not its arguments (paths, tokens
    # and prompts stay off the disk; what is learned is by class only).
    redact_commands: bool = False
    # execgate's own debug log; empty disables it.
    debug_log: str = ""
    # Controllers enabled for tool-call cgroups inside each container's cgroup.
    controllers: tuple[str, ...] = ("cpu", "memory", "pids")
    # Daemon socket and the runtime's budget for talking to it (fail open past it).
    socket: str = "/run/execgate/execgated.sock"
    daemon_timeout_ms: int = 200
    # oom_score_adj of every tool call (raised, never lowered): the kernel picks tool calls as
    # OOM victims before the agent and the container's init (-1000..1000; 0 leaves it alone).
    tool_oom_score_adj: int = 500
    # AgentCgroup mode: a call's declared memory becomes its cgroup's memory.high (off by
    # default: static per-call limits thrash; kept as a baseline for the benchmark).
    memory_high_from_hint: bool = False
    # Per-exec cgroups; false makes execgate a pure passthrough.
    per_exec_cgroups: bool = True
    # A TTY call's exit is held (ptrace, runtime/exithold.py) until its note is on the terminal;
    # false frees the call's main process for a debugger inside the container (notes may race).
    tty_exit_hold: bool = True
    # Problems met while loading, for the caller to report, each "path:line: what": errors (a
    # value refused, its default kept; an unreadable file) and warnings (a key or table that
    # nothing reads, ignored).
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    # The file these settings were read from, or looked for ("" for built-in defaults): where
    # the tables' problems are located (daemon/settings.py) and a reload reads.
    path: str = ""
    # Sub-tables ([daemon], [pressure], [admission], ...) for the components that own them
    # ({} by default).
    tables: dict[str, dict[str, object]]

    def __init__(self, **values: object) -> None:
        unknown = values.keys() - _DEFAULTS.keys() - {"tables"}
        if unknown:
            raise TypeError(f"Config() got unknown fields {sorted(unknown)}")
        fields = self.__dict__
        fields.update(_DEFAULTS)
        fields["tables"] = {}
        fields.update(values)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Config is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Config is immutable: cannot delete {name!r}")

    def _compared(self) -> tuple[object, ...]:
        return tuple(self.__dict__[name] for name in SETTINGS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._compared() == other._compared()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._compared())

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items()) + ")"


# The keys of config.toml's top level, in declaration order.
_LOADED = ("errors", "warnings", "path")  # what loading adds beside the settings
SETTINGS = tuple(name for name in Config.__annotations__ if name not in (*_LOADED, "tables"))
_DEFAULTS = {name: getattr(Config, name) for name in (*SETTINGS, *_LOADED)}
# The sub-tables, each read by its owner: the daemon's (daemon/settings.py) and install.sh's
# [swap] (ctl/swap.py). Any other is reported as unknown (a misspelled table is not silent).
TABLES = ("daemon", "pressure", "admission", "estimate", "growth", "inside", "residency",
          "sandbox_admission", "headroom", "metrics", "predictor", "retention", "swap")


def _coerce(name: str, value: object, default: object) -> object:
    if isinstance(default, tuple):
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
            if not value and default:  # `runtime = []` would leave nothing to run
                raise ValueError(f"{name} must not be empty")
            return tuple(value)
        raise ValueError(f"{name} must be a string or a list of strings")
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false")
        return value
    if isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer")
        return value
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    return value


def locate(text: str) -> dict[tuple[str, str], int]:
    """Where each table and key of a TOML text is, for messages: (table, key) -> line (from
    1); a table's header under (table, ""), top-level keys under ("", key). A line tomllib
    reads but this does not (a dotted key, a key inside a multi-line string) is not found."""
    import re

    header = re.compile(r'\s*\[\s*([A-Za-z0-9_.\-" ]+?)\s*\]')
    assignment = re.compile(r'\s*([A-Za-z0-9_\-]+|"[^"]*")\s*=')
    lines: dict[tuple[str, str], int] = {}
    table = ""
    for n, line in enumerate(text.splitlines(), 1):
        if m := header.match(line):
            table = m.group(1).replace('"', "").replace(" ", "")
            lines.setdefault((table, ""), n)
        elif m := assignment.match(line):
            lines.setdefault((table, m.group(1).strip('"')), n)
    return lines


def where(path: str, lines: dict[tuple[str, str], int], table: str, key: str = "") -> str:
    """"path:line" of table's key (else of its header, else of the key an inline table is
    under), or path alone when neither is found."""
    line = lines.get((table, key)) or lines.get((table, "")) or lines.get(("", table))
    return f"{path}:{line}" if line else path


def _parse(path: str, text: bytes) -> Config:
    import tomllib

    try:
        source = text.decode()
        data = tomllib.loads(source)
    except ValueError as e:  # TOMLDecodeError (its message has the line), UnicodeDecodeError
        return Config(errors=(f"{path}: {e}{UNREAD}",), path=path)
    values: dict[str, object] = {}
    errors: list[str] = []
    warnings: list[str] = []
    tables: dict[str, dict[str, object]] = {}
    lines: dict[tuple[str, str], int] | None = None
    for key, value in data.items():
        if isinstance(value, dict) and key not in SETTINGS:
            tables[key] = value
            if key not in TABLES:
                lines = lines or locate(source)
                warnings.append(f"{where(path, lines, key)}: unknown table [{key}] ignored "
                                f"(known: {', '.join(TABLES)})")
            continue
        if key not in SETTINGS:
            lines = lines or locate(source)
            warnings.append(f"{where(path, lines, '', key)}: unknown key {key!r} ignored")
            continue
        try:
            values[key] = _coerce(key, value, _DEFAULTS[key])
        except ValueError as e:
            lines = lines or locate(source)
            errors.append(f"{where(path, lines, '', key)}: {e}; default kept")
    return Config(**values, errors=tuple(errors), warnings=tuple(warnings), tables=tables,
                  path=path)


def load(path: str | None = None) -> Config:
    """Load the config; problems are collected in Config.errors and .warnings, never raised."""
    return _load(path, None)


def load_cached(path: str | None = None, cache: str | None = None) -> Config:
    """load() for the runtime: the same Config, from the cache (default CACHE_PATH) while the
    file is unchanged."""
    return _load(path, cache or CACHE_PATH)


def _load(path: str | None, cache: str | None, eager_front: bool = False) -> Config:
    """eager_front: write the front's copy even while the file is unsettled (the cache
    still waits for it to settle)."""
    path = path or os.environ.get("EXECGATE_CONFIG") or DEFAULT_PATH
    key = None
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if cache and (key := _cache_key(path, st)):
                cached = read_cache(cache, key)
                if cached is not None:
                    _front(cache, path, st, cached)
                    return cached
            text = f.read()
    except FileNotFoundError:
        if cache:
            _front(cache, path, None, Config())
        return Config(path=path)
    except OSError as e:
        return Config(errors=(f"{path}: {e}{UNREAD}",), path=path)
    cfg = _parse(path, text)
    settled = _settled(st)
    if cache and key and settled:
        write_cache(cache, key, cfg)
    if cache and ((key and settled) or eager_front):
        _front(cache, path, st, cfg)
    return cfg


def refresh_front(path: str | None = None, cache: str | None = None) -> bool:
    """The front's copy (and, once settled, the cache) from the config file as it is now, settled
    or not. The daemon calls this when it starts and reloads: the runtime writes the copy only
    once the file is SETTLE_NS old, so after a config change and a restart every call started
    Python until one came later (the bench's five creates at once all did). True while the file
    is unsettled: call again after SETTLE_NS, as an edit within the same timestamp tick would
    leave this copy stale."""
    path = path or os.environ.get("EXECGATE_CONFIG") or DEFAULT_PATH
    _load(path, cache or CACHE_PATH, eager_front=True)
    try:
        return not _settled(os.stat(path))
    except OSError:
        return False


def _front(cache: str, path: str, st: os.stat_result | None, cfg: Config) -> None:
    """The compiled front's copy of what it needs (common/frontconf.py), beside the cache."""
    from execgate.common import frontconf

    frontconf.write(frontconf.path_for(cache), path, st, cfg, (__file__,))


# The cache: one marshal'd (key, settings) pair. The key names the config file by path, device,
# inode, size and times (an edit or a replacement changes it) and this module's file and
# settings (an upgrade of execgate does); the file must be ours, as it names the binary we run.


def _cache_key(path: str, st: os.stat_result) -> tuple[object, ...] | None:
    try:
        code = os.stat(__file__)
    except OSError:
        return None
    return (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
            st.st_ctime_ns, code.st_ino, code.st_size, code.st_mtime_ns, SETTINGS)


def _settled(st: os.stat_result) -> bool:
    import time

    return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= SETTLE_NS


def read_cache(cache: str, key: tuple[object, ...]) -> Config | None:
    """The cached Config for key; None when missing, stale, corrupt or not ours."""
    import marshal

    try:
        with open(cache, "rb") as f:
            if os.fstat(f.fileno()).st_uid != os.geteuid():
                return None
            cached_key, values = marshal.loads(f.read())
        if cached_key != key:
            return None
        return Config(**values)
    except Exception:  # noqa: BLE001 - unreadable, truncated, garbage: the file is read instead
        return None


def write_cache(cache: str, key: tuple[object, ...], cfg: Config) -> None:
    """Replace the cache atomically (a reader sees the old one or the new one); best effort."""
    import marshal

    try:
        blob = marshal.dumps((key, cfg.__dict__))
    except ValueError:
        return  # a value marshal cannot hold (a TOML date in a table): not cached
    replace_file(cache, blob)


def replace_file(path: str, blob: bytes) -> None:
    """Write path atomically (mode 0600: a reader sees the old file or the new); best effort."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
