"""Compressed swap for idle sandboxes: what install.sh sets up, and undoes exactly.

An idle sandbox's memory is mostly anonymous (an agent framework's heap, a language server),
which memory.reclaim can push out only where there is swap. So install.sh gives the host
compressed swap, unless told not to (`--no-swap`, or `[swap] mode = "off"`):

* no swap yet: a zram device (RAM compressed with zstd, ~3:1 on process memory), sized as a
  fraction of RAM. Default 50 %, zram-generator's and Fedora's default: full, at ~3:1, it holds
  half of RAM's worth of pages in a sixth of RAM. Its compressed pages are RAM too, so a much
  larger device would let idle sandboxes crowd out running calls.
* swap already there (a partition or file): zswap in front of it (a compressed cache, so most
  swap-outs never reach the disk), compressor zstd where the kernel has it.
* only zram already (zram-generator, zram-tools): the host has compressed swap; left alone.

Two files, so that removal takes exactly what was made and nothing else:

* the plan (`/var/lib/execgate/swap.json`): what install decided, applied at every boot by
  execgate-swap.service (a oneshot unit ordered before execgated and docker: simpler and more
  robust than the daemon, which restarts at will and should not own the host's swap);
* what was made this boot (`/run/execgate/swap-made.json`, tmpfs: a reboot undoes it anyway):
  the zram device and whether we loaded the module or hot-added the device, or zswap's
  parameters as they were before. `stop` undoes only that.

    python3 -m execgate.ctl.swap plan [--mode M] [--size S]   # decide and say why
    python3 -m execgate.ctl.swap start | stop | remove | status
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

PLAN = "/var/lib/execgate/swap.json"
MADE = "/run/execgate/swap-made.json"
MODES = ("auto", "zram", "zswap", "off")
DEFAULT_SIZE = "50%"
DEFAULT_COMPRESSOR = "zstd"
ZRAM_PRIORITY = 100  # above any disk swap: the compressed copy is the cheap one


class SwapError(Exception):
    pass


@dataclass(frozen=True)
class Plan:
    mode: str  # "zram" | "zswap" | "none"
    why: str
    size_bytes: int = 0  # zram's disksize (uncompressed capacity)
    compressor: str = DEFAULT_COMPRESSOR


@dataclass(frozen=True)
class Swap:
    """One line of /proc/swaps."""

    name: str
    kind: str
    size_kib: int
    used_kib: int


def parse_swaps(text: str) -> list[Swap]:
    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) >= 4:
            out.append(Swap(f[0], f[1], int(f[2]), int(f[3])))
    return out


def parse_size(value: str | int, mem_total: int) -> int:
    """"50%" of RAM, or a size as config.toml writes it ("8g", 1073741824)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            pct = float(value.strip()[:-1])
        except ValueError:
            raise SwapError(f"swap size {value!r}: not a percentage") from None
        if not 0 < pct <= 400:
            raise SwapError(f"swap size {value!r}: must be in (0, 400] %")
        return int(mem_total * pct / 100) // 4096 * 4096
    from execgate.common.hints import parse_size as size

    try:
        return size(value) // 4096 * 4096
    except ValueError as e:
        raise SwapError(f"swap size {value!r}: {e}") from None


def decide(mode: str, size: str | int, compressor: str, swaps: list[Swap], ours: set[str],
           mem_total: int) -> Plan:
    """What to set up on a host whose active swap is `swaps` (`ours`: devices we made)."""
    if mode not in MODES:
        raise SwapError(f"swap mode {mode!r}: not one of {', '.join(MODES)}")
    if mode == "off":
        return Plan("none", "swap setup off: the host's swap is left as it is")
    others = [s for s in swaps if s.name not in ours]
    if mode == "auto":
        if not others:
            mode = "zram"
        elif all(os.path.basename(s.name).startswith("zram") for s in others):
            names = ", ".join(s.name for s in others)
            return Plan("none", f"the host already has compressed swap ({names}): left alone")
        else:
            mode = "zswap"
    if mode == "zram":
        nbytes = parse_size(size, mem_total)
        return Plan("zram", f"zram swap of {nbytes >> 20} MiB ({size} of "
                            f"{mem_total >> 20} MiB RAM), {compressor}: "
                    + ("the host has no swap" if not others else "asked for"),
                    nbytes, compressor)
    names = ", ".join(s.name for s in others) or "no swap yet"
    return Plan("zswap", f"zswap ({compressor}) in front of the host's swap ({names})",
                compressor=compressor)


# -- the host --------------------------------------------------------------------------------


class Host:
    """The files and commands swap setup touches; a root for tests (sysfs and procfs under it)."""

    def __init__(self, root: str = "/", run: Callable[[list[str]], None] | None = None) -> None:
        self.root = root
        self.run = run or _run

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def read(self, *parts: str) -> str:
        with open(self.path(*parts)) as f:
            return f.read().strip()

    def write(self, value: str, *parts: str) -> None:
        with open(self.path(*parts), "w") as f:
            f.write(value)

    def swaps(self) -> list[Swap]:
        try:
            return parse_swaps(self.read("proc/swaps"))
        except OSError:
            return []

    def mem_total(self) -> int:
        for line in self.read("proc/meminfo").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
        raise SwapError("no MemTotal in /proc/meminfo")


def _run(argv: list[str]) -> None:
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise SwapError(f"{' '.join(argv)}: {(p.stderr or p.stdout).strip() or p.returncode}")


def load(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def save(path: str, data: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _algorithms(host: Host, dev: str) -> list[str]:
    return host.read("sys/block", dev, "comp_algorithm").replace("[", "").replace("]", "").split()


def start_zram(host: Host, plan: Plan) -> dict[str, Any]:
    """A zram device with the plan's compressor and size, as swap; what was made."""
    made: dict[str, Any] = {"mode": "zram", "module_loaded": False, "hot_added": False,
                            "size_bytes": plan.size_bytes}
    if not os.path.isdir(host.path("sys/class/zram-control")):
        host.run(["modprobe", "zram", "num_devices=1"])
        made["module_loaded"] = True
        for _ in range(50):  # udev creates the device node a moment later
            if os.path.isdir(host.path("sys/class/zram-control")):
                break
            time.sleep(0.1)
        dev = "zram0"
    else:
        dev = f"zram{int(host.read('sys/class/zram-control/hot_add'))}"
        made["hot_added"] = True
    made["device"] = dev
    try:
        algos = _algorithms(host, dev)
        compressor = plan.compressor if plan.compressor in algos else algos[0]
        host.write(compressor, "sys/block", dev, "comp_algorithm")
        made["compressor"] = compressor
        host.write(str(plan.size_bytes), "sys/block", dev, "disksize")
        node = f"/dev/{dev}"
        for _ in range(50):
            if os.path.exists(host.path(node.lstrip("/"))):
                break
            time.sleep(0.1)
        host.run(["mkswap", node])
        host.run(["swapon", "-p", str(ZRAM_PRIORITY), node])
    except (OSError, SwapError, IndexError):
        stop(host, made)  # nothing half-made is left behind
        raise
    return made


def start_zswap(host: Host, plan: Plan) -> dict[str, Any]:
    params = "sys/module/zswap/parameters"
    try:
        before = {"enabled": host.read(params, "enabled"),
                  "compressor": host.read(params, "compressor")}
    except OSError as e:
        raise SwapError(f"no zswap in this kernel ({e})") from None
    made: dict[str, Any] = {"mode": "zswap", "before": before}
    if before["compressor"] != plan.compressor:
        try:
            host.write(plan.compressor, params, "compressor")
        except OSError as e:
            made["note"] = (f"compressor {plan.compressor} refused ({e}); "
                            f"kept {before['compressor']}")
    host.write("Y", params, "enabled")
    return made


def start(host: Host, plan_path: str = PLAN, made_path: str = MADE) -> str:
    """Apply the plan unless it is applied already; what happened, in words."""
    data = load(plan_path)
    if data is None:
        return "no swap plan: nothing to do"
    plan = Plan(**data)
    made = load(made_path)
    if made is not None:
        if made.get("mode") == plan.mode and made.get("size_bytes", 0) == plan.size_bytes \
                and _alive(host, made):
            return f"already set up: {_describe(made)}"
        stop(host, made)
        _unlink(made_path)
    if plan.mode == "none":
        return plan.why
    made = start_zram(host, plan) if plan.mode == "zram" else start_zswap(host, plan)
    save(made_path, made)
    return f"set up {_describe(made)}: {plan.why}"


def _alive(host: Host, made: dict[str, Any]) -> bool:
    if made.get("mode") == "zram":
        return f"/dev/{made.get('device')}" in {s.name for s in host.swaps()}
    return made.get("mode") == "zswap"


def _describe(made: dict[str, Any]) -> str:
    if made.get("mode") == "zram":
        return f"/dev/{made['device']} ({made.get('compressor')})"
    return f"zswap (was enabled={made.get('before', {}).get('enabled')})"


def stop(host: Host, made: dict[str, Any]) -> list[str]:
    """Undo what `made` says was made, and only that; the steps that failed, in words."""
    failed: list[str] = []

    def step(what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except (OSError, SwapError) as e:
            failed.append(f"{what}: {e}")

    if made.get("mode") == "zram" and made.get("device"):
        dev = made["device"]
        node = f"/dev/{dev}"
        if node in {s.name for s in host.swaps()}:
            step(f"swapoff {node}", lambda: host.run(["swapoff", node]))
        if os.path.isdir(host.path("sys/block", dev)):
            step(f"reset {dev}", lambda: _reset_zram(host, dev))
            if made.get("hot_added"):
                step(f"remove {dev}", lambda: host.write(
                    dev.removeprefix("zram"), "sys/class/zram-control/hot_remove"))
        if made.get("module_loaded"):
            step("unload zram", lambda: _unload_zram(host))
    elif made.get("mode") == "zswap":
        params = "sys/module/zswap/parameters"
        before = made.get("before") or {}
        if before.get("compressor"):
            step("restore zswap compressor",
                 lambda: host.write(before["compressor"], params, "compressor"))
        if before.get("enabled"):
            step("restore zswap enabled", lambda: host.write(before["enabled"], params, "enabled"))
    return failed


def _while_busy(fn: Callable[[], None], busy: Callable[[Exception], bool],
                attempts: int = 50, pause_s: float = 0.1) -> None:
    """fn, retried for up to attempts x pause_s while it fails as busy: right after swapoff
    (and reset), udev probing the device's change holds it open for a moment."""
    for i in range(attempts):
        try:
            fn()
            return
        except (OSError, SwapError) as e:
            if i == attempts - 1 or not busy(e):
                raise
            time.sleep(pause_s)


def _reset_zram(host: Host, dev: str) -> None:
    """Write reset, retried while the kernel answers EBUSY (the device still open: the full
    e2e suite's zram test failed its teardown on one)."""
    _while_busy(lambda: host.write("1", "sys/block", dev, "reset"),
                lambda e: isinstance(e, OSError) and e.errno == errno.EBUSY)


def _unload_zram(host: Host) -> None:
    """modprobe -r zram, retried while the kernel answers "in use"."""
    _while_busy(lambda: host.run(["modprobe", "-r", "zram"]),
                lambda e: isinstance(e, SwapError))


def status(host: Host, plan_path: str = PLAN, made_path: str = MADE) -> dict[str, Any]:
    made = load(made_path)
    out: dict[str, Any] = {"plan": load(plan_path), "made": made,
                           "swaps": [asdict(s) for s in host.swaps()]}
    if made and made.get("mode") == "zram":
        out["mm_stat"] = zram_mm_stat(host, made["device"])
    return out


def zram_mm_stat(host: Host, dev: str) -> dict[str, int] | None:
    """/sys/block/zramN/mm_stat's first fields: what was stored, and what it costs."""
    try:
        f = [int(x) for x in host.read("sys/block", dev, "mm_stat").split()[:3]]
    except (OSError, ValueError):
        return None
    return {"orig_data_size": f[0], "compr_data_size": f[1], "mem_used_total": f[2]}


# [swap]'s keys (config.toml), read by `plan`.
CONFIG_KEYS = {"mode": "auto", "size": DEFAULT_SIZE, "compressor": DEFAULT_COMPRESSOR}


def table_problems(table: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """What is wrong with a [swap] table, as (key, text, is_error), for `execgatectl config
    check` (install.sh reads it at `plan` and dies on a bad value)."""
    out = []
    for key, value in table.items():
        if key not in CONFIG_KEYS:
            out.append((key, f"[swap] unknown key {key!r} ignored", False))
        elif key == "mode" and value not in MODES:
            out.append((key, f"[swap] mode: {value!r} is not one of {', '.join(MODES)}", True))
        elif key == "compressor" and not isinstance(value, str):
            out.append((key, "[swap] compressor: must be a string", True))
        elif key == "size":
            try:
                parse_size(value, 1 << 30)
            except SwapError as e:
                out.append((key, f"[swap] size: {e}", True))
    return out


def _config_table(path: str | None) -> dict[str, Any]:
    from execgate.common import config

    table = config.load(path).tables.get("swap") or {}
    return table if isinstance(table, dict) else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m execgate.ctl.swap", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("op", choices=("plan", "start", "stop", "remove", "status"))
    ap.add_argument("--mode", choices=MODES, help="default: [swap] mode, else auto")
    ap.add_argument("--size", help="zram size: 50%% of RAM or 8g (default: [swap] size, else "
                                   f"{DEFAULT_SIZE})")
    ap.add_argument("--config", help="config.toml (default: /etc/execgate/config.toml)")
    ap.add_argument("--plan-file", default=PLAN)
    ap.add_argument("--made-file", default=MADE)
    args = ap.parse_args(argv)
    host = Host()
    try:
        if args.op == "plan":
            table = _config_table(args.config)
            made = load(args.made_file) or {}
            ours = {f"/dev/{made['device']}"} if made.get("device") else set()
            plan = decide(args.mode or str(table.get("mode", "auto")),
                          args.size or table.get("size", DEFAULT_SIZE),
                          str(table.get("compressor", DEFAULT_COMPRESSOR)),
                          host.swaps(), ours, host.mem_total())
            save(args.plan_file, asdict(plan))
            print(plan.why)
        elif args.op == "start":
            print(start(host, args.plan_file, args.made_file))
        elif args.op in ("stop", "remove"):
            made = load(args.made_file)
            failed = stop(host, made) if made else []
            for f in failed:
                print(f"warning: {f}", file=sys.stderr)
            if not failed:
                _unlink(args.made_file)
            if args.op == "remove":
                _unlink(args.plan_file)
            print(f"removed {_describe(made)}" if made and not failed else
                  "nothing to remove" if not made else "removed in part (see warnings)")
            return 1 if failed else 0
        else:
            print(json.dumps(status(host, args.plan_file, args.made_file), indent=1))
    except SwapError as e:
        print(f"swap: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
