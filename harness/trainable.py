"""The Ray Tune function trainable: one trial = one C x S kernel, reporting after every chunk.

This module must not import JAX at import time: the process setup (CPU core pinning, GPU memory
fraction, persistent compilation cache) has to happen before JAX starts its backend, and Ray
imports this module in every worker.
"""

from __future__ import annotations

import fcntl
import math
import os
import threading
import time
from typing import Any

_SETUP_DONE = False
_CORE_LOCKS: list[Any] = []  # held for the process's lifetime


def _pin_cpu_cores(count: int) -> list[int]:
    """Pins this process to ``count`` cores no other trial process holds (file locks in /tmp).

    XLA's CPU backend uses every core in the affinity mask, so concurrent trials would
    oversubscribe the machine; a lock per core hands each trial its own. Returns the cores
    pinned ([] when none were free: the process keeps every core).
    """
    got = []
    for core in sorted(os.sched_getaffinity(0)):
        if len(got) == count:
            break
        f = open(f"/tmp/rl-harness-core-{core}.lock", "w")  # noqa: SIM115 - held while we live
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        _CORE_LOCKS.append(f)
        got.append(core)
    if got:
        os.sched_setaffinity(0, got)
    return got


def setup_process(device: dict[str, Any]) -> None:
    """Once per worker process, before JAX runs: device placement and the compile cache."""
    global _SETUP_DONE
    if _SETUP_DONE:
        return
    from harness.device import configure_xla

    configure_xla()
    if device.get("gpu_fraction"):
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 * device['gpu_fraction']:.3f}")
    elif device.get("pin_cores"):
        _pin_cpu_cores(int(device.get("cpus", 1)))
    import jax

    if device.get("cache_dir"):
        jax.config.update("jax_compilation_cache_dir", device["cache_dir"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    _SETUP_DONE = True


def _floats(rows: Any) -> list[list[float | None]]:
    """A [C, S] array as nested lists, NaN as None (JSON has no NaN)."""
    return [[None if not math.isfinite(float(x)) else float(x) for x in row] for row in rows]


def _best(rows: list[list[float | None]], diverged: list[list[bool]]) -> float:
    means = []
    for row, div in zip(rows, diverged, strict=True):
        vals = [v for v in row if v is not None]
        if vals and not any(div):
            means.append(sum(vals) / len(vals))
    return max(means) if means else float("nan")


class _Watchdog:
    """Ends the process if a chunk makes no progress for ``limit`` seconds.

    XLA on CPU has hung in a first call (RAY_FACTS.md); a dead worker makes Tune retry the
    trial, and a trial that keeps failing is recorded as failed, instead of a study that
    waits forever.
    """

    def __init__(self, limit: float) -> None:
        self.limit, self.last = limit, time.monotonic()
        threading.Thread(target=self._watch, daemon=True).start()

    def beat(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self.limit = math.inf

    def _watch(self) -> None:
        while True:
            time.sleep(5)
            if time.monotonic() - self.last > self.limit:
                print(f"rl-harness: no progress for {self.limit:.0f}s; ending this worker", flush=True)
                os._exit(3)


def train_trial(config: dict[str, Any]) -> None:
    """Tune function trainable. ``config`` holds a ``TrialPlan`` as a dict and device settings."""
    setup_process(config.get("device", {}))
    from ray import tune

    from harness.kernel import TrialPlan, run_trial

    plan = TrialPlan(**config["plan"])
    watchdog = _Watchdog(float(config.get("device", {}).get("chunk_timeout", 900)))
    started = time.perf_counter()
    last: dict[str, Any] = {}

    def on_chunk(r: Any) -> None:
        watchdog.beat()
        _maybe_crash(plan, r.chunk)
        returns, diverged = _floats(r.returns), r.diverged.tolist()
        last.update(env_steps=r.env_steps, returns=returns, diverged=diverged,
                    steps_per_sec=r.steps_per_sec, kernel_seconds=r.kernel_seconds,
                    chunk=r.chunk, num_chunks=r.num_chunks)
        if r.chunk < r.num_chunks:  # the last chunk is reported with the evaluation
            tune.report({"score": _best(returns, diverged), **last})

    try:
        result = run_trial(plan, on_chunk)
    finally:
        watchdog.stop()
    scores, diverged = _floats(result.scores), result.diverged.tolist()
    tune.report({**last, "score": _best(scores, diverged), "scores": scores, "diverged": diverged,
                 "final": True, "compile_seconds": result.compile_seconds,
                 "kernel_seconds": result.kernel_seconds,
                 "trial_seconds": time.perf_counter() - started})


def _maybe_crash(plan: Any, chunk: int) -> None:
    """Fault injection for the reliability tests: ``RL_HARNESS_CRASH=TRIAL:TIMES:DIR`` makes
    search trial TRIAL's worker die after its first chunk, the first TIMES attempts (counted in DIR)."""
    spec = os.environ.get("RL_HARNESS_CRASH")
    if not spec or chunk != 1 or plan.stream != 0:
        return
    trial = plan.trial
    target, times, folder = spec.split(":", 2)
    if int(target) != trial:
        return
    attempts = len([p for p in os.listdir(folder) if p.startswith(f"crash-{trial}-")])
    if attempts < int(times):
        open(os.path.join(folder, f"crash-{trial}-{attempts}"), "w").close()
        os._exit(1)
