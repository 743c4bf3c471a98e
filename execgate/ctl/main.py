"""`execgatectl`: the operator's view of execgate (the runtime itself keeps runc's exact CLI)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from execgate.common import config as config_mod
from execgate.common import journal
from execgate.common.hints import escape
from execgate.common.units import short

from . import configure
from . import model as model_cmd


def _source(source: str | None) -> str:
    return {"bpf": "in the kernel", "connector": "through the proc connector",
            "loading": "by nothing yet: the kernel probe is loading"}.get(
        source or "", "by nothing: see the daemon's log")


def _command(argv: list[str] | None, width: int = 40) -> str:
    """A command line for a table: printable ASCII (an agent's argv may hold terminal escapes),
    cut to width with "..." at its end."""
    cmd = escape(" ".join(argv or []))
    return cmd if len(cmd) <= width else cmd[:width - 3] + "..."


def _names(snap: dict[str, Any]) -> dict[str, str]:
    """Container id -> the name status shows (daemon/names.py), for the sandboxes it lists."""
    return {b["id"]: b.get("name") or b["id"][:12] for b in snap.get("sandboxes", [])}


# `execgatectl status`'s exit status when the daemon did not answer (systemctl's "not running"):
# the disk's view is still printed, but a script or a probe must not read it as healthy.
STATUS_UNREACHABLE = 3


def _status(cfg: config_mod.Config) -> tuple[dict[str, Any], str, bool]:
    """From the daemon when it runs; otherwise from disk (said in the header); and whether the
    daemon answered."""
    from execgate.common import protocol
    from execgate.daemon import status

    try:
        answer = protocol.call(cfg.socket, protocol.request("status"), timeout=2.0)
        if answer.get("ok"):
            return answer["status"], f"execgated pid {answer.get('pid')}", True
        source = f"daemon error: {answer.get('error')}"
    except (OSError, protocol.ProtocolError) as e:
        source = f"execgated not reachable ({e}); read from disk"
    return status.collect(cfg), source, False


def print_daemon(d: dict[str, Any], names: dict[str, str] | None = None) -> None:
    p = d.get("pressure") or {}
    adm = d.get("admission") or {}
    print(f"domain: {d.get('domain')}   pressure: {str(p.get('state', '?')).upper()}   "
          f"headroom {short(p.get('headroom'))} (effective {short(p.get('effective_headroom'))}) "
          f"of budget {short(p.get('budget'))}")
    if p.get("reason"):
        print(f"  why: {p['reason']}")
    growth = d.get("growth") or {}
    held = growth.get("held") or []
    unswitched = growth.get("switch_failed") or 0
    print(f"growth gate: {growth.get('actuator') or 'none'} ({growth.get('reason', '-')}); "
          f"yellow slots b={growth.get('slots', '-')}; held now: {', '.join(held) or 'none'}"
          + (f"; {unswitched} tasks not held (SCHED_EXT refused)" if unswitched else ""))
    print_probes(d.get("probes") or {})
    res = d.get("residency") or {}
    if res:
        print(f"residency: {'on' if res.get('enabled') else 'off'} (idle after "
              f"{res.get('idle_after_s')} s); frozen {res.get('frozen', 0)}, thawed "
              f"{res.get('thawed', 0)}, {res.get('reclaims', 0)} reclaims took "
              f"{short(res.get('reclaimed_bytes'))}")
    ins = d.get("inside") or {}
    if ins.get("containers"):
        print(f"inside agents: {ins['containers']} containers, {ins.get('calls', 0)} calls now; "
              f"placed {ins.get('placed', 0)}, ended within their first slice "
              f"{ins.get('short', 0)}, missed {ins.get('missed', 0)}, failed "
              f"{ins.get('failed', 0)} (followed {_source(ins.get('source'))})")
        if ins.get("learned"):
            print(f"  placed at their exec, learned: {', '.join(ins['learned'])}")
    print_sandbox_admission(d.get("sandbox_admission") or {})
    queued = adm.get("queued") or []
    running = adm.get("running") or []
    print(f"admitted {short(adm.get('admitted_bytes'))}; {len(running)} running, "
          f"{len(queued)} queued; history: {d.get('history_calls', 0)} calls")
    if d.get("predictor"):
        print(model_cmd.status_line(d["predictor"]))
    kept = d.get("retention") or {}
    removed = kept.get("removed") or {}
    if kept.get("rotations") or any(removed.values()):
        print(f"retention: journal rotated {kept.get('rotations', 0)} times; removed "
              f"{removed.get('journal_files', 0)} journal files, "
              f"{removed.get('store_rows', 0)} store rows, "
              f"{removed.get('hint_warnings', 0)} hint-warning files")
    print_counts(d.get("calls") or {}, d.get("config") or {}, d.get("exec") or {},
                 d.get("lifecycle") or {})
    if queued:
        print(f"\nQUEUED ({len(queued)})")
        print(f"{'CALL':<18} {'SANDBOX':<14} {'QUEUE':<6} {'PEAK':>9} {'WAIT':>7}  "
              f"{'SOURCE':<9} COMMAND")
        for q in queued:
            dem = q.get("demand") or {}
            box = str(q.get("sandbox", ""))
            print(f"{q.get('call_id', ''):<18} {(names or {}).get(box, box)[:14]:<14} "
                  f"{q.get('queue', ''):<6} {short(dem.get('peak_bytes')):>9} "
                  f"{q.get('waited_s', 0):>6.1f}s  {dem.get('source', ''):<9} "
                  f"{_command(q.get('argv'))}")


def print_counts(calls: dict[str, Any], conf: dict[str, Any], front: dict[str, Any],
                 lifecycle: dict[str, Any]) -> None:
    """Since the daemon started (the numbers its metrics serve), and config changes waiting."""
    if calls:
        how = calls.get("admitted") or {}
        ended = calls.get("finished") or {}
        waits = calls.get("admission_waits") or {}
        mean = waits.get("sum_s", 0) / waits["count"] if waits.get("count") else 0.0
        print(f"since start: admitted {sum(how.values())} (forced {how.get('forced', 0)}, "
              f"overheld {how.get('overheld', 0)}; mean wait {mean:.2f} s), finished "
              f"{sum(ended.values())} (OOM-killed {ended.get('oom_killed', 0)}), ran unmanaged "
              f"{calls.get('unmanaged', 0)} (no daemon answer: fail open)")
        failed = calls.get("fail_open") or {}
        if failed:
            print("runtime failed open (ran as plain runc, see journalctl -u execgated): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(failed.items())))
    if front:
        ops = ", ".join(f"{k} {v}" for k, v in lifecycle.items())
        print(f"for the compiled front: {front.get('placed', 0)} calls placed (following "
              f"{front.get('following', 0)} now; {front.get('refused', 0)} left to the "
              f"Python runtime){'; ' + ops if ops else ''}")
    if conf.get("restart_needed"):
        print(f"config: changed, waiting for a restart: {', '.join(conf['restart_needed'])}")
    if conf.get("last_error"):
        print(f"config: the last reload changed nothing: {conf['last_error']}")


def print_sandbox_admission(sa: dict[str, Any]) -> None:
    """Creates waiting to start (oldest first, with why) and how creates were admitted."""
    if not sa:
        return
    totals = sa.get("totals") or {}
    waiting = sa.get("waiting") or []
    def bound(key: str) -> str:
        return "unbounded" if sa.get(key) is None else f"{sa[key]} s"

    print(f"sandbox admission: {'on' if sa.get('enabled') else 'off'} (max start wait "
          f"{bound('max_start_wait_s')} for kubelet, {bound('max_start_wait_s_no_deadline')} "
          f"for callers without a deadline); {sa.get('live', 0)} live, "
          f"{len(sa.get('starting') or [])} starting ({sa.get('launching', 0)} launching of "
          f"at most {sa.get('max_launching') or 'any'}), {len(waiting)} waiting; admitted "
          f"{totals.get('admitted', 0)}, fail-open {totals.get('fail-open', 0)}, cancelled "
          f"{sa.get('cancelled', 0)}")
    if waiting:
        print(f"\nWAITING SANDBOXES ({len(waiting)})")
        print(f"{'CONTAINER':<14} {'WAITED':>7} {'BASELINE':>9}  WHY")
        for w in waiting:
            print(f"{str(w.get('sandbox_id', ''))[:12]:<14} {w.get('waited_s', 0):>6.1f}s "
                  f"{short(w.get('baseline_bytes')):>9}  {w.get('reason', '')}")


def print_probes(pr: dict[str, Any]) -> None:
    """bcc probes: state, OOM kills per sandbox, fault rates of running calls."""
    if not pr:
        return
    kills = ", ".join(f"{box[:12]} {n}" for box, n in
                      sorted((pr.get("oom_kills_by_sandbox") or {}).items()))
    print(f"probes: {pr.get('state')} ({pr.get('reason') or pr.get('mode')}); "
          f"OOM kills seen: {pr.get('oom_kills', 0)}{f' ({kills})' if kills else ''}")
    faults = pr.get("faults") or {}
    if faults:
        print("  page faults: " + ", ".join(
            f"{cid} {f['rate']:.0f}/s (total {f['count']}, peak {f['peak_10ms']}/10 ms)"
            for cid, f in sorted(faults.items())))


def print_status(snap: dict[str, Any], source: str) -> None:
    print(f"source: {source}")
    names = _names(snap)
    if snap.get("daemon"):
        print_daemon(snap["daemon"], names)
    boxes = snap.get("sandboxes", [])
    print(f"\nSANDBOXES ({len(boxes)})")
    print(f"{'CONTAINER':<14} {'MANAGED':<8} {'MEMORY':>9} {'ANON':>9} {'SWAPPED':>9} "
          f"{'LIMIT':>9} {'CALLS':>5}  NOTE")
    for box in boxes:
        note = "" if box["alive"] else "cgroup gone"
        if box.get("frozen"):
            note = "idle, frozen under pressure"
        if not box["managed"]:
            note = box.get("reason") or "unmanaged"
        limit = box.get("memory_max")
        limit = short(int(limit)) if limit and limit.isdigit() else (limit or "-")
        print(f"{names[box['id']][:14]:<14} {'yes' if box['managed'] else 'no':<8} "
              f"{short(box.get('memory_current')):>9} {short(box.get('memory_anon')):>9} "
              f"{short(box.get('memory_swap_current')):>9} {limit:>9} {len(box['calls']):>5}  "
              f"{note}")
    live = [(box["id"], c) for box in boxes for c in box["calls"]]
    # what the agent asked to run, as the daemon admitted it; else the call's process now
    asked = {r.get("call_id"): r.get("argv") for r in
             ((snap.get("daemon") or {}).get("admission") or {}).get("running") or []}
    print(f"\nRUNNING CALLS ({len(live)})")
    print(f"{'CONTAINER':<14} {'CALL':<18} {'MEMORY':>9} {'PEAK':>9} {'PIDS':>4} {'AGE':>7}  "
          f"{'STATE':<7} COMMAND")
    for cid, c in live:
        age = "-" if c.get("age") is None else f"{c['age']:.1f}s"
        print(f"{names[cid][:14]:<14} {c['call']:<18} {short(c.get('memory_current')):>9} "
              f"{short(c.get('memory_peak')):>9} {c.get('pids', 0):>4} {age:>7}  "
              f"{'frozen' if c.get('frozen') else 'running':<7} "
              f"{_command(asked.get(c['call']) or c.get('argv'))}")
    unadmitted = [b["id"] for b in boxes if (b.get("start") or {}).get("admitted") is False]
    if unadmitted:
        print(f"started unadmitted (no daemon at create): {len(unadmitted)}")
    print_calls(snap.get("recent_calls", []), title="RECENT CALLS", names=names)


def print_calls(calls: list[dict[str, Any]], title: str = "CALLS",
                names: dict[str, str] | None = None) -> None:
    print(f"\n{title} ({len(calls)})")
    print(f"{'CONTAINER':<14} {'CALL':<18} {'EXIT':>5} {'OOM':>4} {'PEAK':>9} {'SECS':>7}  COMMAND")
    for c in calls:
        code = "-" if c.get("exit_code") is None else str(c["exit_code"])
        cid = str(c.get("container", ""))
        print(f"{(names or {}).get(cid, cid[:12])[:14]:<14} {c.get('call', ''):<18} {code:>5} "
              f"{'yes' if c.get('oom_killed') else 'no':>4} {short(c.get('memory_peak')):>9} "
              f"{c.get('duration', 0):>7.2f}  {_command(c.get('argv'), 60)}")


def stream_events(cfg: config_mod.Config) -> int:
    from execgate.common import protocol

    try:
        with protocol.Client(cfg.socket, timeout=None) as daemon:  # events come when they come
            daemon.send(protocol.request("events"))
            while True:
                msg = daemon.recv()
                if msg.get("subscribed"):
                    continue
                msg.pop("v", None)
                msg.pop("ok", None)
                print(json.dumps(msg), flush=True)
    except KeyboardInterrupt:
        return 0
    except (OSError, protocol.ProtocolError) as e:
        print(f"execgatectl: events: {e}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="execgatectl", description=__doc__)
    parser.add_argument("--config", help="config file (default /etc/execgate/config.toml)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_status = sub.add_parser("status", help="sandboxes, running and recent tool calls (exit "
                              f"status {STATUS_UNREACHABLE} when the daemon does not answer)")
    p_status.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("events", help="stream admissions and outcomes as they happen (JSON lines)")
    p_calls = sub.add_parser("calls", help="finished tool calls from the journal")
    p_calls.add_argument("-n", type=int, default=20, help="how many (default 20)")
    p_calls.add_argument("--json", action="store_true", help="one JSON object per line")
    model_cmd.add_parser(sub)
    p_config = sub.add_parser("config", help="the config file")
    p_check = p_config.add_subparsers(dest="config_cmd", required=True).add_parser(
        "check", help="every error and warning at its line; exit 1 on an error")
    p_check.add_argument("path", nargs="?", help="default: --config, else "
                         "/etc/execgate/config.toml")
    configure.add_parsers(sub)
    args = parser.parse_args(argv)
    if args.cmd in ("configure", "unconfigure"):
        return configure.run(args)
    if args.cmd == "config":
        from . import config_check

        return config_check.main(args.path or args.config)
    cfg = config_mod.load(args.config)
    for err in cfg.errors:
        print(f"execgatectl: {err}", file=sys.stderr)
    if args.cmd == "status":
        snap, source, answered = _status(cfg)
        if args.json:
            json.dump({"source": source, **snap}, sys.stdout, indent=2)
            print()
        else:
            print_status(snap, source)
        if not answered:
            print(f"execgatectl: {source}", file=sys.stderr)
            return STATUS_UNREACHABLE
    elif args.cmd == "events":
        return stream_events(cfg)
    elif args.cmd == "model":
        return model_cmd.run(args, cfg)
    elif args.cmd == "calls":
        calls = journal.tail(cfg.journal, args.n)  # the rotated files too
        if args.json:
            for c in calls:
                print(json.dumps(c))
        else:
            print_calls(calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
