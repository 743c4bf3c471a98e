"""Replay results that explain themselves: per-call daemon decisions, kernel OOM kills with their
victims, the swap setting per point, the burst workload and whole [execgate] stderr lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import decisions, kills, replay, swap
from bench import schemes as S
from bench import workload as W
from bench.runner import keep_stderr, loop_delta
from bench.sweep import build_points

CID = "a" * 64
OTHER = "b" * 64
T0 = 1_000_000.0


def test_kernel_oom_kills_are_parsed_and_attributed_to_task_attempt_and_call() -> None:
    log = [
        (10, "memload invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=500"),
        (11, "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=x,mems_allowed=0,"
             f"oom_memcg=/egbench.slice,task_memcg=/egbench.slice/docker-{CID}.scope/tool-7,"
             "task=memload,pid=4242,uid=0"),
        (12, "Memory cgroup out of memory: Killed process 4242 (memload) total-vm:90000kB, "
             "anon-rss:80000kB, file-rss:4kB, shmem-rss:0kB, UID:0 pgtables:200kB "
             "oom_score_adj:500"),
        (13, "oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/egbench.slice,"
             f"task_memcg=/egbench.slice/docker-{OTHER}.scope,task=memload,pid=77,uid=0"),
        (14, "Memory cgroup out of memory: Killed process 77 (memload) anon-rss:30000kB "
             "oom_score_adj:0"),
        (15, "Memory cgroup out of memory: Killed process 99 (dockerd) anon-rss:1kB"),
    ]
    found = kills.parse_kills(log)
    assert [(k["pid"], k["comm"]) for k in found] == [(4242, "memload"), (77, "memload"),
                                                       (99, "dockerd")]
    assert found[0]["oom_memcg"] == "/egbench.slice"
    assert found[0]["anon_rss_kb"] == 80000 and found[0]["oom_score_adj"] == 500
    boxes = {CID: {"task": "t1", "attempt": 2, "init_pid": 4000},
             OTHER: {"task": "t2", "attempt": 1, "init_pid": 77}}
    calls = {"tool-7": {"call": 3}}
    a = kills.attribute(found[0], boxes, calls)
    assert (a["victim"], a["task"], a["attempt"], a["call"], a["call_id"]) == (
        "call", "t1", 2, 3, "tool-7")
    b = kills.attribute(found[1], boxes, calls)
    assert (b["victim"], b["task"], b["container"]) == ("init", "t2", OTHER)
    assert kills.attribute(found[2], boxes, calls)["victim"] == "unattributed"
    # the rate-limited case: only the "Killed process" line, an init known by its pid
    (lone,) = kills.parse_kills([(20, "Memory cgroup out of memory: Killed process 77 "
                                      "(memload) anon-rss:1kB")])
    assert kills.attribute(lone, boxes, calls)["victim"] == "init"
    elsewhere = dict(found[0], task_memcg="/system.slice/cron.service")
    assert kills.attribute(elsewhere, boxes, calls)["victim"] == "other"
    # a victim already exiting is chosen (its oom-kill line) but not killed: no kill (the VM's
    # bench replay once counted two kills where memory.events said one)
    skipped = kills.parse_kills([
        (30, "oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/egbench.slice,task_memcg=/x,"
             "task=memload,pid=5,uid=0"),
        (31, "Memory cgroup out of memory: Killed process 5 (memload) anon-rss:9kB"),
        (32, "oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/egbench.slice,task_memcg=/x,"
             "task=memload,pid=5,uid=0"),
        (33, "Memory cgroup out of memory: OOM victim 5 (memload) is already exiting. Skip "
             "killing the task"),
        (34, "oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/egbench.slice,task_memcg=/y,"
             "task=memload,pid=6,uid=0"),
        (35, "Memory cgroup out of memory: OOM victim 6 (memload) is already exiting. Skip "
             "killing the task"),
    ])
    assert [(k["pid"], k["anon_rss_kb"]) for k in skipped] == [(5, 9)]


def test_each_call_gets_its_journal_decision_admission_reason_and_residency() -> None:
    calls = [
        {"task": "t", "attempt": 1, "call": 1, "container": CID, "start": 1.0, "end": 9.0},
        {"task": "t", "attempt": 1, "call": 2, "container": CID, "start": 20.0, "end": 30.0},
        {"task": "u", "attempt": 1, "call": 1, "container": OTHER, "start": 2.0, "end": 3.0},
    ]
    journal = [  # the runtime stamps arrival a moment after the runner's docker exec
        {"call": "tool-2", "container": CID, "arrival": T0 + 21.5, "start": T0 + 26.0,
         "end": T0 + 30.0, "waited_s": 4.5, "forced": True, "held_s": 1.25,
         "killed_by_execgate": False, "oom_killed": True, "argv": ["memload"]},
        {"call": "tool-1", "container": CID, "arrival": T0 + 1.4, "waited_s": 0.0,
         "forced": False, "held_s": 0.0, "oom_killed": False},
    ]
    events = [
        {"event": "admitted", "call": "tool-2", "sandbox": CID, "reason": "alone",
         "state": "red", "charge": 5, "probe": False, "time": T0 + 26.0},
        {"event": "residency", "action": "reclaimed", "container": CID, "reclaimed": 7 << 20,
         "time": T0 + 15.0},
        {"event": "residency", "action": "thawed", "container": CID, "time": T0 + 20.5},
    ]
    by_id = decisions.annotate_calls(calls, journal, events, T0)
    first, second, other = calls
    assert first["daemon"]["call"] == "tool-1" and "residency" not in first
    d = second["daemon"]
    assert (d["waited_s"], d["forced"], d["held_s"], d["oom_killed"]) == (4.5, True, 1.25, True)
    assert (d["admit_reason"], d["admit_state"]) == ("alone", "red")
    assert d["arrival"] == 21.5 and "argv" not in d  # on the run's clock, argv left out
    assert second["residency"] == {"reclaimed_bytes": 7 << 20,
                                   "actions": ["reclaimed", "thawed"]}
    assert "daemon" not in other
    assert by_id["tool-2"] is second
    stats = decisions.journal_stats(journal)
    assert (stats["journal_calls"], stats["journal_forced"], stats["journal_held"],
            stats["journal_oom_killed"], stats["admission_wait_max_s"]) == (2, 1, 1, 1, 4.5)


def test_journal_lines_are_read_from_an_offset_and_filtered_by_container(tmp_path: Path) -> None:
    p = tmp_path / "calls.jsonl"
    old = json.dumps({"call": "old", "container": CID}) + "\n"
    p.write_text(old + json.dumps({"call": "new", "container": CID}) + "\n{broken\n"
                 + json.dumps({"call": "x", "container": "elsewhere"}) + "\n"
                 + json.dumps({"event": "finished", "call": "new"}) + "\n")
    got = decisions.read_lines(str(p), len(old))
    assert [e.get("call") for e in decisions.of_containers(got, {CID}, {"new"})] == [
        "new", "new"]
    assert decisions.read_lines(str(tmp_path / "missing")) == []


def test_execgate_lines_on_stderr_are_kept_whole() -> None:
    long = "[execgate] waited 312 s for memory: red, 14 MiB free, this call declared 120 MiB; " \
           "ran alone once the others ended" + "." * 150
    noise = "x" * 500
    got = keep_stderr(f"{noise}\n{long}\nTraceback: boom\n")
    assert long in got  # whole, though longer than the 200 kept of the rest
    assert got.endswith("boom") and len(got) < len(long) + 205
    assert keep_stderr("plain failure") == "plain failure"


def test_swap_helpers_read_proc_swaps_and_the_algorithm(tmp_path: Path) -> None:
    f = tmp_path / "swaps"
    f.write_text("Filename\tType\tSize\tUsed\tPriority\n"
                 "/dev/zram0  partition\t1048572\t2048\t100\n")
    assert swap.active_swaps(str(f)) == [{"device": "/dev/zram0", "type": "partition",
                                           "size_bytes": 1048572 * 1024,
                                           "used_bytes": 2048 * 1024, "priority": 100}]
    assert swap.selected_algorithm("lzo lzo-rle lz4 [zstd]") == "zstd"
    assert swap.slice_limit(True) == "max" and swap.slice_limit(False) == "0"
    assert swap.HostSwap(devices=swap.active_swaps(str(f))).zram == "/dev/zram0"


def test_every_scheme_of_a_point_shares_its_swap_setting() -> None:
    sc = S.parse_schemes("eager,eager+swap,execgate,execgate-noswap,execgate-nosandboxadmit")
    off, skipped_off = S.schemes_at(sc, False)
    assert [(s.name, sw) for s, sw in off] == [("eager", False), ("execgate", False),
                                               ("execgate-nosandboxadmit", False)]
    assert [w.split(":")[0] for w in skipped_off] == ["eager+swap", "execgate-noswap"]
    on, skipped_on = S.schemes_at(sc, True)
    assert [(s.name, sw) for s, sw in on] == [
        ("eager+swap", True), ("execgate", True), ("execgate-noswap", False),
        ("execgate-nosandboxadmit", True)]
    assert skipped_on == ["eager: the same run as eager+swap with swap on"]
    # eager alone at a swap-on point is eager with swap (nothing to dedupe against)
    assert [(s.name, sw) for s, sw in S.schemes_at(S.parse_schemes("eager"), True)[0]] == [
        ("eager", True)]
    eager_swap = S.SCHEMES["eager+swap"]
    assert (eager_swap.runtime, eager_swap.daemon, eager_swap.hints) == ("runc", False, False)


def test_the_new_ablations_and_the_swap_setting_reach_the_daemon_config() -> None:
    dom = "/sys/fs/cgroup/egbench.slice"
    nosa = S.bench_config({}, S.SCHEMES["execgate-nosandboxadmit"], domain=dom, swap=True)
    assert nosa["sandbox_admission"] == {"enabled": False} and "residency" not in nosa
    nosw = S.bench_config({}, S.SCHEMES["execgate-noswap"], domain=dom, swap=False)
    assert nosw["residency"] == {"swap_max": 0}
    plain = S.bench_config({"residency": {"idle_after_s": 5}}, S.EXECGATE, domain=dom,
                           swap=False)
    assert plain["residency"] == {"idle_after_s": 5, "swap_max": 0}  # no swap at this point
    assert "swap_max" not in S.bench_config({}, S.EXECGATE, domain=dom, swap=True).get(
        "residency", {})
    assert "residency" not in S.bench_config({}, S.EAGER, domain=dom, swap=False)
    # the sandbox admission's default baseline and call peak shrink with the workload's memory
    scaled = S.bench_config({}, S.EXECGATE, domain=dom, mem_scale=8, swap=True)
    assert scaled["sandbox_admission"]["default_baseline_bytes"] == 32 << 20
    assert scaled["sandbox_admission"]["default_call_peak_bytes"] == 32 << 20


def test_burst_arrivals_fall_within_their_window_the_same_for_every_run() -> None:
    a = W.arrival_schedule(6, 3, "burst", window_s=10.0)
    assert a == W.arrival_schedule(6, 3, "burst", window_s=10.0) == sorted(a)
    assert a[0] == 0.0 and all(0 <= x <= 10.0 for x in a) and len(set(a)) == 6
    assert W.arrival_schedule(3, 3, "burst") == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        W.arrival_schedule(3, 3, "burst", window_s=-1)


def _args(*argv: str) -> object:
    ap = replay._parser()
    args = ap.parse_args(["plan", *argv])
    replay._apply_workload(ap, args, ["plan", *argv])
    return args


def test_the_burst_workload_keeps_the_waits_and_plan_shows_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("--workload", "burst", "--tasks", "3", "--speed", "10", "--budget", "200m",
                 "--swap", "both", "--max-calls", "2")
    assert (args.arrival, args.burst_window, args.idle_scale, args.keep_waits) == (
        "burst", 10.0, 1.0, True)
    assert args.max_calls == 2  # given on the command line: it wins over the workload's 3
    points = build_points(args)
    assert [p.swap for p in points] == [False, True]
    assert points[0].describe(10.0)["swap"] == "off" and points[1].label.endswith("swap on")
    assert max(points[0].arrivals_trace) <= 10.0
    assert replay.main(["plan", "--workload", "burst", "--tasks", "2", "--swap", "both",
                        "--schemes", "eager,eager+swap,execgate"]) == 0
    out = capsys.readouterr().out
    assert "LLM waits kept" in out and "pages zstd 3:1" in out
    assert "runs eager+swap, execgate; not here: eager: the same run" in out
    with pytest.raises(ValueError, match="idle-scale must be 1"):
        _args("--keep-waits", "--idle-scale", "0.05")


def test_an_attempt_gets_its_sandbox_admission() -> None:
    attempts = [{"container": CID}, {"container": OTHER}, {"container": None}]
    events = [{"event": "admitted", "of": "sandbox", "sandbox": CID, "waited_s": 62.1,
               "verdict": "admitted", "reason": "nothing live", "need": 5, "room": 3},
              {"event": "admitted", "call": "tool-1", "sandbox": OTHER, "waited_s": 1.0}]
    decisions.annotate_attempts(attempts, events)
    assert attempts[0]["sandbox_admission"] == {"waited_s": 62.1, "verdict": "admitted",
                                                "reason": "nothing live", "need": 5, "room": 3}
    assert "sandbox_admission" not in attempts[1] and "sandbox_admission" not in attempts[2]


def test_an_attempt_gets_where_its_containers_ops_spent_their_time() -> None:
    attempts = [{"container": CID}, {"container": OTHER}]
    events = [{"event": "lifecycle", "op": op, "container": CID, "runc_s": r, "waited_s": w,
               "daemon_s": d} for op, r, w, d in (("create", 40.0, 0.2, 75.0),
                                                  ("start", 30.0, 0.0, 12.5))]
    decisions.annotate_attempts(attempts, events)
    assert attempts[0]["lifecycle"] == {
        "create": {"runc_s": 40.0, "waited_s": 0.2, "daemon_s": 75.0},
        "start": {"runc_s": 30.0, "waited_s": 0.0, "daemon_s": 12.5}}
    assert "lifecycle" not in attempts[1]


def test_the_daemon_loop_over_a_run_is_the_difference_of_its_counters() -> None:
    before = {"iterations": 10, "cpu_s": 1.0, "wall_s": 2.0, "process_cpu_s": 3.0,
              "stage_cpu_s": {"calls": 0.5}, "periods": {"sample": 4, "idle": 6}}
    after = {"iterations": 110, "cpu_s": 4.0, "wall_s": 6.0, "process_cpu_s": 9.0,
             "stage_cpu_s": {"calls": 1.5, "residency": 2.0},
             "threads_cpu_s": {"MainThread": 5.0, "follow": 1.0},
             "periods": {"sample": 54, "calm": 40, "idle": 16},
             "sandbox_steps": {"steps_measured": 7, "steps_unmeasured": 3}}
    assert loop_delta(before, after) == {
        "iterations": 100, "wall_s": 4.0, "cpu_s": 3.0, "process_cpu_s": 6.0,
        "stage_cpu_s": {"calls": 1.0, "residency": 2.0},
        "threads_cpu_s": {"MainThread": 5.0, "follow": 1.0},
        "periods": {"sample": 50, "calm": 40, "idle": 10},
        "sandbox_steps": {"steps_measured": 7, "steps_unmeasured": 3}}
    assert loop_delta(before, None) is None
    assert loop_delta(after, before) is None  # the daemon restarted mid-run
