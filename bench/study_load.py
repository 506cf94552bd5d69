"""A study of many short trials on the embedded local Ray: does the driver stay flat?

    python bench/study_load.py                      # 200 trials of cartpole_ppo, 1 config x 1 seed x 2,048 steps
    python bench/study_load.py --trials 20

Runs ``python -m harness.study`` as a user would, samples the driver's resident memory every
0.5 s and notes when each trial is recorded. Compares the first quarter of the trials with the
last: trials per minute, the driver's memory, and the per-trial overhead (wall time per trial
less the trial's own kernel time). Flat means ratios near 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--timesteps", type=int, default=2048)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="study-load-") as out:
        run(args, out)


def run(args: argparse.Namespace, out: str) -> None:
    """The study in the folder ``out``, timed; prints its rates, overheads and driver memory."""
    cmd = [sys.executable, "-m", "harness.study", "cartpole_ppo", "--trials", str(args.trials),
           "--configs-per-trial", "1", "--seeds", "1", "--timesteps", str(args.timesteps), "--no-asha",
           "--sampler", "random", "--top-k", "0", "--no-ablation", "--out", out]  # the search alone
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    samples: list[tuple[float, float]] = []

    def sample() -> None:
        while proc.poll() is None:
            samples.append((time.monotonic() - t0, rss_mb(proc.pid)))
            time.sleep(0.5)

    threading.Thread(target=sample, daemon=True).start()
    done: list[tuple[int, float]] = []  # (trial, seconds since start) as each is recorded
    tail, head = [], []
    for line in proc.stdout:
        tail = (tail + [line])[-30:]
        if len(head) < 30:
            head.append(line)
        m = re.match(r"\[(\d+)/\d+\] trial (\d+):", line)
        if m:
            done.append((int(m.group(2)), time.monotonic() - t0))
    proc.wait()
    if proc.returncode != 0 or len(done) < 4:
        sys.exit(f"the study failed (exit {proc.returncode}):\n" + "".join(tail))
    root = Path(out) / "cartpole_ppo"
    kernel = {json.loads(p.read_text())["trial"]: json.loads(p.read_text()).get("kernel_seconds", 0.0)
              + json.loads(p.read_text()).get("compile_seconds", 0.0) for p in (root / "trials").glob("*.json")}
    q = len(done) // 4
    first, last = done[: q + 1], done[-q - 1:]  # q intervals each, between recordings
    slots = int(re.search(r"\((\d+) trials? at a time\)", "".join(head)).group(1))

    def rate(part: list[tuple[int, float]]) -> float:
        return (len(part) - 1) / ((part[-1][1] - part[0][1]) / 60)

    def overhead(part: list[tuple[int, float]]) -> float:  # slot-seconds per trial beyond its own kernel
        wall = (part[-1][1] - part[0][1]) * slots
        return (wall - sum(kernel.get(t, 0.0) for t, _ in part[1:])) / (len(part) - 1)

    r1, r2, o1, o2 = rate(first), rate(last), overhead(first), overhead(last)
    def memory(part: list[tuple[int, float]]) -> float:  # the driver's RSS when each trial was recorded
        return max(min(samples, key=lambda s: abs(s[0] - when))[1] for _, when in part)

    m1, m2 = memory(first), memory(last)
    print(f"{len(done)} trials in {done[-1][1]:.0f} s (whole command {time.monotonic() - t0:.0f} s)")
    print(f"{slots} trials at a time; overhead = slot-seconds per trial beyond its kernel and compile time")
    print(f"{'quarter':8} {'trials/min':>10} {'overhead_s/trial':>16} {'driver_RSS_MB':>13}")
    print(f"{'first':8} {r1:>10.1f} {o1:>16.2f} {m1:>13.0f}")
    print(f"{'last':8} {r2:>10.1f} {o2:>16.2f} {m2:>13.0f}")
    print(f"ratio last/first: trials/min {r2 / r1:.2f}, overhead {o2 / o1:.2f}, driver memory {m2 / m1:.2f}")


if __name__ == "__main__":
    main()
