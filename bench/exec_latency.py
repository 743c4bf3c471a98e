"""Benchmark: `docker exec CONTAINER true` latency with execgate vs plain runc.

Both containers run in the same Docker, interleaved call by call so drift (TCG, caches) hits
both alike; the result is a ratio of medians, the only figure that carries across machines.
Also timed: a passed-through runtime call (`execgate --version` vs `runc --version`), the
price every non-intercepted runc command pays for going through execgate.
    python3 -m bench.exec_latency [--n 40] [--image execgate-test:latest] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--image", default="execgate-test:latest")
    ap.add_argument("--execgate", default="/usr/local/bin/execgate")
    ap.add_argument("--out")
    args = ap.parse_args()
    boxes = {rt: _docker("run", "-d", "--runtime", rt, args.image, "sleep", "inf")
             for rt in ("runc", "execgate")}
    try:
        samples = _interleaved({rt: ["docker", "exec", cid, "true"] for rt, cid in boxes.items()},
                               args.n)
    finally:
        subprocess.run(["docker", "rm", "-f", *boxes.values()], capture_output=True)
    passthrough = _interleaved({"runc": ["runc", "--version"],
                                "execgate": [args.execgate, "--version"]}, args.n)
    pmed = {k: statistics.median(v) for k, v in passthrough.items()}
    med = {rt: statistics.median(v) for rt, v in samples.items()}
    result = {
        "n": args.n,
        "median_s": med,
        "p90_s": {rt: statistics.quantiles(v, n=10)[-1] for rt, v in samples.items()},
        "ratio_execgate_over_runc": med["execgate"] / med["runc"],
        "added_ms_median": (med["execgate"] - med["runc"]) * 1000,
        "passthrough_median_s": pmed,
        "passthrough_added_ms": (pmed["execgate"] - pmed["runc"]) * 1000,
    }
    print(f"docker exec true, n={args.n}: runc {med['runc'] * 1000:.0f} ms, "
          f"execgate {med['execgate'] * 1000:.0f} ms (median), "
          f"ratio {result['ratio_execgate_over_runc']:.3f}")
    print(f"runtime --version: runc {pmed['runc'] * 1000:.1f} ms, "
          f"execgate {pmed['execgate'] * 1000:.1f} ms (median)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
