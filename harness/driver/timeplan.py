"""A wall-clock budget for a whole study (``--time 5m``): the search keeps proposing trials until
its share is spent, the rest is kept for the re-training, the ablation path and the reports.

    plan = timeplan.TimePlan(total_s=300, slots=2, ...)      # from a measured trial kernel
    plan.search_open()                                       # may one more trial start now?

The shares are estimated from one trial's kernel timed before the study starts
(:func:`calibrate`), then from the search's own records as they arrive. Nothing here imports
Ray or Optuna.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import dataclass
from typing import Any

from harness.kernel.device import use_compile_cache
from harness.space import StudyError
from harness.store.records import TrialRecord

PHASE_OVERHEAD_S = 10.0  # a Tune run's own start: actors, imports, the compile cache read
TRIAL_OVERHEAD_S = 3.0  # a search trial's own start and record, beside its kernel
RAY_START_S = 10.0  # the embedded Ray up and the study's header printed
REPORTS_S = 10.0  # the reports rebuilt at the end
_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """``'90s'``, ``'5m'``, ``'1h30m'`` or a bare number of minutes, in seconds.

    Raises:
        StudyError: not a duration, or not positive.
    """
    t = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        seconds = float(t) * 60
    elif re.fullmatch(r"(\d+(\.\d+)?[hms])+", t):
        seconds = sum(float(n) * _UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([hms])", t))
    else:
        raise StudyError(f"--time {text!r}: expected a duration such as 90s, 5m or 1h30m")
    if seconds <= 0:
        raise StudyError(f"--time {text!r}: must be more than zero")
    return seconds


def fmt_duration(seconds: float) -> str:
    """Seconds as ``'2m30s'`` (whole seconds, rounded up)."""
    s = math.ceil(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@dataclass
class TimePlan:
    """How a study fits ``total_s`` seconds from ``started`` (``time.monotonic()``).

    Args:
        kernel_s: one trial's kernel for the whole budget (measured, then from the records).
        compile_s: compiling one kernel shape.
        slots: trials run side by side.
        final_kernels, ablation_kernels: kernels the re-training and the ablation path run.
    """

    total_s: float
    started: float
    kernel_s: float
    compile_s: float
    slots: int
    final_kernels: int
    ablation_kernels: int
    shapes: int = 1  # static combinations: each compiles once

    @property
    def deadline(self) -> float:
        return self.started + self.total_s

    def reserve_s(self) -> float:
        """The time kept after the search: the re-training, the ablation path, the reports."""
        # the re-training is one batch of kernels, the ablation path two (its second waits on the first)
        waves = math.ceil(self.final_kernels / self.slots) + math.ceil(self.ablation_kernels / self.slots) + 1 * (
            self.ablation_kernels > 0)
        batches = (self.final_kernels > 0) + 2 * (self.ablation_kernels > 0)
        return waves * self.kernel_s + batches * PHASE_OVERHEAD_S + REPORTS_S

    def trial_s(self) -> float:
        """A search trial's expected time, start to record."""
        return self.kernel_s + TRIAL_OVERHEAD_S

    def search_s(self) -> float:
        return self.total_s - RAY_START_S - self.reserve_s()

    def planned_trials(self) -> int:
        """About how many search trials fit: every slot busy, each shape compiled once."""
        compile_s = self.compile_s * math.ceil(self.shapes / self.slots)
        return max(0, math.floor((self.search_s() - compile_s) / self.trial_s()) * self.slots)

    def minimum_s(self) -> float:
        """The shortest ``--time`` in which one trial, the re-training and the ablation path fit."""
        return RAY_START_S + self.compile_s + self.trial_s() + self.reserve_s()

    def learn(self, records: list[TrialRecord], budget_steps: int) -> None:
        """Takes the kernel time from the search's complete trials (the measurement before it
        was taken alone on an idle machine)."""
        seen = [r.kernel_seconds * budget_steps / r.env_steps for r in records
                if r.status == "complete" and r.env_steps and r.kernel_seconds and not r.lanes]
        if seen:
            self.kernel_s = statistics.median(seen)

    def search_open(self, now: float | None = None) -> bool:
        """Whether a new search trial started now ends before the search's share is spent."""
        now = time.monotonic() if now is None else now
        return now + self.trial_s() <= self.deadline - self.reserve_s()

    def describe(self, configs: int, seeds: int, timesteps: int) -> str:
        """The plan in one line, said at the start."""
        n = self.planned_trials()
        return (f"time budget {fmt_duration(self.total_s)}: about {n} trials of {configs} configs x {seeds} "
                f"seeds x {timesteps:,} steps in the search's {fmt_duration(self.search_s())} (a trial's kernel "
                f"about {self.kernel_s:.0f} s here), then {fmt_duration(self.reserve_s())} for the re-training, "
                f"the ablation path and the reports; new trials stop at the search's share")


def kernels_after_search(top_k: int, rounds: int, configs: int, searched: int, statics: int,
                         ablation: bool) -> tuple[int, int]:
    """Kernels of the re-training (the top ``top_k`` and the default, ``rounds`` rounds) and of the
    ablation path (2d-2 points for ``searched`` names on one round), each static split adding one."""
    split = 1 if statics else 0
    final = rounds * (math.ceil((top_k + 1) / configs) + split) if top_k else 0
    points = max(searched, 0) + max(searched - 2, 0)
    abl = (math.ceil(searched / configs) + math.ceil(max(searched - 2, 0) / configs) + split) \
        if ablation and top_k and points else 0
    return final, abl


def calibrate(plan: Any, cache_dir: str | None) -> tuple[float, float]:
    """Compiles ``plan``'s kernel here and times two chunks: (compile seconds, the kernel's
    seconds for the whole budget). The compiled program goes to the node's persistent cache,
    where the trials find it."""
    from harness.kernel.runners import runner_for  # JAX: settings imports this module at its top

    if cache_dir:
        use_compile_cache(cache_dir)
    t0 = time.perf_counter()
    runner = runner_for(plan)
    runner.chunk()  # its first call pays the rest of the compile
    compile_s = time.perf_counter() - t0
    if runner.done:  # a one-chunk budget: its compile and its chunk are not told apart, so both count
        return compile_s, compile_s
    t1 = time.perf_counter()
    runner.chunk()
    chunk_s = time.perf_counter() - t1
    return compile_s, chunk_s * runner.total_chunks
