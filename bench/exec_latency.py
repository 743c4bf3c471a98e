"""Benchmark: what execgate adds to Docker's runtime calls, against plain runc.

Three parts, each interleaved call by call (the order alternating) so drift (TCG, caches) hits
both alike; the figures to carry across machines are the ratios of medians:
- `docker exec CONTAINER true` and `docker run --rm IMAGE true`, end to end;
- every runtime call of a container's life (create, start, state, exec, kill, delete), each
  timed alone, on containers made from a bundle of IMAGE with `execgate --root R` and
  `runc --root R'` directly (the cgroupfs driver, as tests/e2e/test_runc_direct.py does);
- a passed-through call with no container (`--version`);
- a burst: K sandboxes `docker run -d` at once, then one `docker exec` in each at once, as a
  fleet's arrivals do (the light-load replay's five sandboxes took 16 s to start against
  eager's 11 s while one `docker run` alone costs the same): the time until the last returns.
    python3 -m bench.exec_latency [--n 30] [--image execgate-test:latest] [--out FILE]
                                  [--skip docker,calls,version,burst] [--burst K] [--burst-n N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time

RUNTIMES = ("runc", "execgate")
CALLS = ("create", "start", "state", "exec", "kill", "delete")
CGROUP_PARENT = "execgate-bench"


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def summary(samples: list[float]) -> dict[str, float]:
    """Median and spread (10th and 90th percentiles), in seconds."""
    deciles = (statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1
               else samples * 9)
    return {"median": statistics.median(samples), "p10": deciles[0], "p90": deciles[-1],
            "n": len(samples)}


def compare(samples: dict[str, list[float]]) -> dict[str, object]:
    """Each runtime's summary, execgate's median over runc's and the milliseconds it adds."""
    out: dict[str, object] = {rt: summary(v) for rt, v in samples.items()}
    med = {rt: statistics.median(v) for rt, v in samples.items()}
    out["ratio"] = med["execgate"] / med["runc"]
    out["added_ms"] = (med["execgate"] - med["runc"]) * 1000
    return out


def _interleaved(cmds: dict[str, list[str]], n: int) -> dict[str, list[float]]:
    """n timed runs of each command, alternating the order so drift hits all alike."""
    samples: dict[str, list[float]] = {k: [] for k in cmds}
    for argv in cmds.values():  # warm-up
        subprocess.run(argv, check=True, capture_output=True)
    for i in range(n):
        order = list(cmds.items()) if i % 2 == 0 else list(reversed(cmds.items()))
        for k, argv in order:
            t0 = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            samples[k].append(time.perf_counter() - t0)
    return samples


def _all_at_once(argvs: list[list[str]]) -> tuple[float, list[str]]:
    """Run argvs at once; the time until the last has returned, and their stdouts."""
    out: list[str] = [""] * len(argvs)

    def one(i: int) -> None:
        out[i] = subprocess.run(argvs[i], check=True, capture_output=True,
                                text=True).stdout.strip()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(argvs))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, out


def bursts(image: str, k: int, n: int) -> dict[str, dict[str, list[float]]]:
    """n interleaved rounds per runtime of k sandboxes started at once, then one `true` exec'd
    in each at once: each round's time to the last return, for the runs and for the execs."""
    samples: dict[str, dict[str, list[float]]] = {
        part: {rt: [] for rt in RUNTIMES} for part in ("run", "exec")}
    for i in range(n + 1):  # round 0 warms up
        for rt in RUNTIMES if i % 2 == 0 else reversed(RUNTIMES):
            run_s, cids = _all_at_once([["docker", "run", "-d", "--runtime", rt, image,
                                         "sleep", "inf"] for _ in range(k)])
            try:
                exec_s, _ = _all_at_once([["docker", "exec", c, "true"] for c in cids])
            finally:
                subprocess.run(["docker", "rm", "-f", *cids], capture_output=True)
            if i:
                samples["run"][rt].append(run_s)
                samples["exec"][rt].append(exec_s)
    return samples


def _bundle(image: str, where: str) -> str:
    """A runc bundle of image's filesystem running `sleep inf` (rootfs shared by every
    container)."""
    rootfs = os.path.join(where, "rootfs")
    os.makedirs(rootfs)
    cid = _docker("create", image, "true")
    try:
        export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", rootfs], stdin=export.stdout, check=True)
        if export.wait() != 0:
            raise RuntimeError("docker export failed")
    finally:
        _docker("rm", cid)
    subprocess.run(["runc", "spec"], cwd=where, check=True)
    with open(os.path.join(where, "config.json")) as f:
        spec = json.load(f)
    spec["process"].update(terminal=False, args=["sleep", "inf"])
    spec["root"].update(path=rootfs, readonly=False)
    with open(os.path.join(where, "spec.json"), "w") as f:
        json.dump(spec, f)
    with open(os.path.join(where, "process.json"), "w") as f:
        json.dump({"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["true"],
                   "env": ["PATH=/bin"], "cwd": "/"}, f)
    return where


def _cycle(binary: str, root: str, bundle: str, cid: str) -> dict[str, float]:
    """One container's life through binary, each runtime call timed."""
    own = os.path.join(bundle, cid)
    os.makedirs(own)
    with open(os.path.join(bundle, "spec.json")) as f:
        spec = json.load(f)
    spec["linux"]["cgroupsPath"] = f"/{CGROUP_PARENT}/{cid}"
    with open(os.path.join(own, "config.json"), "w") as f:
        json.dump(spec, f)
    times: dict[str, float] = {}

    def call(name: str, *args: str, stdio: int | None = subprocess.PIPE) -> None:
        t0 = time.perf_counter()
        p = subprocess.run([binary, "--root", root, *args], stdin=subprocess.DEVNULL,
                           stdout=stdio, stderr=stdio, timeout=120)
        times[name] = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(f"{binary} {name} {cid} -> {p.returncode}: {p.stderr!r}")

    # create's container inherits its stdio: pipes would never close.
    call("create", "create", "--bundle", own, "--pid-file", os.path.join(own, "pid"), cid,
         stdio=subprocess.DEVNULL)
    call("start", "start", cid)
    call("state", "state", cid)
    call("exec", "exec", "--process", os.path.join(bundle, "process.json"), cid)
    call("kill", "kill", cid, "KILL")
    deadline = time.monotonic() + 60
    while json.loads(subprocess.run(["runc", "--root", root, "state", cid], check=True,
                                    capture_output=True).stdout)["status"] != "stopped":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{cid} did not stop")
        time.sleep(0.05)
    call("delete", "delete", cid)
    shutil.rmtree(own)
    return times


def runtime_calls(binaries: dict[str, str], image: str, n: int
                  ) -> dict[str, dict[str, list[float]]]:
    """n interleaved container lives per runtime: every call's samples, by call and runtime."""
    samples: dict[str, dict[str, list[float]]] = {c: {rt: [] for rt in binaries} for c in CALLS}
    with tempfile.TemporaryDirectory(prefix="exec-latency-") as tmp:
        bundle = _bundle(image, tmp)
        roots = {rt: os.path.join(tmp, f"root-{rt}") for rt in binaries}
        for rt, binary in binaries.items():  # warm-up
            _cycle(binary, roots[rt], bundle, f"warm-{rt}")
        for i in range(n):
            order = list(binaries.items())
            for rt, binary in order if i % 2 == 0 else reversed(order):
                for c, t in _cycle(binary, roots[rt], bundle, f"b{i}-{rt}").items():
                    samples[c][rt].append(t)
    try:
        os.rmdir(f"/sys/fs/cgroup/{CGROUP_PARENT}")
    except OSError:
        pass
    return samples


def _line(name: str, r: dict) -> str:
    return (f"{name:18s} runc {r['runc']['median'] * 1000:8.1f} ms "
            f"[{r['runc']['p10'] * 1000:.1f}-{r['runc']['p90'] * 1000:.1f}]  "
            f"execgate {r['execgate']['median'] * 1000:8.1f} ms "
            f"[{r['execgate']['p10'] * 1000:.1f}-{r['execgate']['p90'] * 1000:.1f}]  "
            f"ratio {r['ratio']:.3f}  ({r['added_ms']:+.1f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--image", default="execgate-test:latest")
    ap.add_argument("--execgate", default="/usr/local/bin/execgate")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: "
                    "docker, calls, version, burst")
    ap.add_argument("--burst", type=int, default=5, help="sandboxes started at once")
    ap.add_argument("--burst-n", type=int, default=10, help="rounds of the burst")
    ap.add_argument("--out")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    binaries = {"runc": shutil.which("runc") or "runc", "execgate": args.execgate}
    result: dict[str, object] = {"n": args.n}
    rows: list[tuple[str, dict]] = []
    if "docker" not in skip:
        boxes = {rt: _docker("run", "-d", "--runtime", rt, args.image, "sleep", "inf")
                 for rt in RUNTIMES}
        try:
            execs = _interleaved({rt: ["docker", "exec", cid, "true"]
                                  for rt, cid in boxes.items()}, args.n)
        finally:
            subprocess.run(["docker", "rm", "-f", *boxes.values()], capture_output=True)
        runs = _interleaved({rt: ["docker", "run", "--rm", "--runtime", rt, args.image, "true"]
                             for rt in RUNTIMES}, args.n)
        rows += [("docker exec true", compare(execs)), ("docker run true", compare(runs))]
    if "burst" not in skip:
        b = bursts(args.image, args.burst, args.burst_n)
        rows += [(f"{args.burst} docker run -d", compare(b["run"])),
                 (f"{args.burst} docker exec", compare(b["exec"]))]
    if "calls" not in skip:
        for c, by_rt in runtime_calls(binaries, args.image, args.n).items():
            rows.append((f"runtime {c}", compare(by_rt)))
    if "version" not in skip:
        rows.append(("runtime --version", compare(_interleaved(
            {rt: [b, "--version"] for rt, b in binaries.items()}, args.n))))
    result["results"] = dict(rows)
    print(f"n={args.n}, median [p10-p90]")
    for name, r in rows:
        print(_line(name, r))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
