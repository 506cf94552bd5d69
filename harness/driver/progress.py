"""What a running study prints: a line per recorded trial, and throughput every 15 s.

:class:`Progress` is plain state (trials done, the study's best so far, env steps of running
trials) with the lines it makes; :mod:`harness.cluster.tuning` feeds it from Tune's callbacks and the
search phase from the records. Nothing here imports Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.space import label
from harness.store.records import TrialRecord, config_id

THROUGHPUT_EVERY = 15.0  # seconds between throughput lines


def fmt_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={label(v)}" for k, v in params.items())


def say(line: str) -> None:
    """Prints ``line`` at once (stdout may be a pipe: a long step follows many lines)."""
    print(line, flush=True)


class Progress:
    """Trials done out of ``total``, the best configuration so far, and env steps per second.

    Args:
        total: the study's trials (None: open-ended, a time budget's search).
        metric: ``mean`` or ``iqm`` over seeds.
        maximize: the study's direction.
        records: trial records already on disk (a resumed study).
        say: where lines go (stdout by default).
    """

    def __init__(self, total: int | None, *, metric: str, maximize: bool,
                 records: list[TrialRecord] | None = None,
                 say: Callable[[str], None] = say) -> None:
        self.total, self.metric, self.maximize, self.say = total, metric, maximize, say
        self.best: tuple[float, str, dict[str, Any]] | None = None
        self.done = 0
        self.running: dict[str, int] = {}  # env steps of each running Tune trial (all its runs)
        self.leading: dict[str, float] = {}  # each running trial's best configuration on its chunks so far
        self.steps_done = 0  # env steps of the trials finished in this run
        self.last_print, self.last_steps = time.monotonic(), 0
        for rec in records or []:
            self._note_best(rec)
        self.done = len(records or [])

    def _note_best(self, record: TrialRecord) -> None:
        sign = 1 if self.maximize else -1
        for c in record.configs:
            v = c.value(self.metric) if record.status_of(c) == "complete" else None
            if v is not None and (self.best is None or sign * v > sign * self.best[0]):
                self.best = (v, config_id(record.trial, c.index), c.params)

    def recorded(self, record: TrialRecord) -> None:
        """A trial's record was written: one line saying how it ended and the study's best."""
        self.done += 1
        self.steps_done += self.running.pop(record.tune_trial_id, 0)
        self.leading.pop(record.tune_trial_id, None)
        self._note_best(record)
        values = [v for c in record.configs if (v := c.value(self.metric)) is not None]
        pick = max if self.maximize else min
        n, lanes = len(record.configs), ""
        if record.lanes:
            to_end = sum(c.status == "complete" for c in record.configs)
            lanes = (f" (its lanes refilled: {to_end} trained to the end, {n - to_end} stopped early"
                     f"{_lane_time(record)})")
        what = {"complete": f"best of its {n} configs {pick(values):.1f}{lanes}" if values
                else f"no config trained to the end without diverging{lanes}" if record.lanes
                else "all configs diverged",
                "pruned": "stopped early by ASHA",
                "failed": "FAILED" + (f": {record.error}" if record.error else "")}[record.status]
        best = (f" | study best {self.best[0]:.1f} ({self.best[1]}: {fmt_params(self.best[2])})"
                if self.best else "")
        self.say(f"[{self.done}{self._of}] trial {record.trial}: {what}{best}")

    @property
    def _of(self) -> str:
        return "" if self.total is None else f"/{self.total}"

    def result(self, tune_trial_id: str, env_steps: int, running: int, score: float | None = None) -> None:
        """A running trial reported ``env_steps`` (all its runs together) and ``score``, its best
        configuration's objective on the chunks so far; every 15 s a line."""
        self.running[tune_trial_id] = env_steps
        first = not self.leading and self.best is None
        if score is not None and score == score:  # NaN: nothing scored yet
            self.leading[tune_trial_id] = float(score)
        self.tick(running, now=first and bool(self.leading))  # the first score is said at once

    def tick(self, running: int, *, now: bool = False) -> None:
        """Every 15 s a line (``now``: this one at once), also while no trial has reported yet
        (Ray's workers starting, the kernels compiling)."""
        at, now = now, time.monotonic()
        if now - self.last_print < THROUGHPUT_EVERY and not at:
            return
        steps = self.steps_done + sum(self.running.values())
        rate = (steps - self.last_steps) / (now - self.last_print)
        self.last_print, self.last_steps = now, steps
        best = f", best {self.best[0]:.1f} ({self.best[1]})" if self.best else ""
        if self.leading:  # the first score to look at, long before a trial ends
            lead = (max if self.maximize else min)(self.leading.values())
            best += f", leading running trial {lead:.1f} so far"
        head = f"  {self.done}{self._of} trials done, {running} running{best}; "
        if steps == 0:
            self.say(head + "waiting for their first chunk (each worker compiles its kernel first)")
        elif at:  # said at once: a rate over a moment would mislead
            self.say(head + f"{steps:,} env steps")
        else:
            self.say(head + f"{steps:,} env steps, {rate:,.0f} steps/s")

    def retrying(self, trial: int, error: str) -> None:
        self.say(f"  trial {trial} failed ({error}); retrying from its last checkpoint")

    def failed(self, trial: int, error: str) -> None:
        self.say(f"  trial {trial}: {error}")


def _lane_time(record: TrialRecord) -> str:
    """Where a lane trial's time went, where its record says: its kernel's chunks, the round
    trips to the broker, judging and refilling lanes between chunks."""
    if record.broker_seconds is None:
        return ""
    return (f"; {record.kernel_seconds or 0.0:.1f} s in its kernel, {record.broker_seconds:.1f} s waiting "
            f"for the broker, {record.lanes_seconds or 0.0:.1f} s judging and refilling")
