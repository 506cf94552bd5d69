"""The trial's side of lane-level successive halving (:mod:`harness.lanes.broker` is the Optuna
side): :class:`LaneTrial`, inside a trial's worker, judges its lanes after each chunk through the
broker, records the configurations that ended (with their own curves) and refills their lanes on
the device (``harness.kernel.runners.LaneRunner.refill``); :func:`replay` trains a lane trial again
from its record. No Ray, Optuna or JAX at import: the trainable imports it in every worker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from harness.kernel.stats import config_score, reported_chunks
from harness.store.records import ConfigRecord

ETA = 3  # successive halving's reduction factor: rungs at 1/9, 1/3 and the whole budget
ROUNDS = 3  # lane trials: at most one per ROUNDS of the budget's trials (Settings.with_rounds)


def rungs(min_steps: int, budget_steps: int, eta: int = ETA) -> list[int]:
    """The env steps per seed where a configuration is judged: ``min_steps * eta**r`` below the budget."""
    out, step = [], max(1, min_steps)
    while step * eta <= budget_steps:  # the last rung is the budget itself: no judgement there
        out.append(step)
        step *= eta
    return out


@dataclass
class Lane:
    """The configuration a lane trains now: its Optuna trial and where it started."""

    number: int  # its Optuna trial number (its keys derive from it)
    params: dict[str, Any]  # the searched values
    hparams: dict[str, float]  # the traced hyperparameters the kernel gets
    start: int  # the trial's chunk (0-based) where it started
    index: int  # its index in the trial's record: configurations in the order they started
    judged: int = 0  # rungs it has passed


@dataclass
class LaneTrial:
    """A trial's lanes, on the trial's side: which configuration each lane trains, the ones that
    ended (their records), and the round trip to the broker after each chunk.

    ``call(trial, chunk, static, reports, refill)`` reaches :meth:`LaneBroker.step` (directly, or
    through a Ray actor)."""

    trial: int
    static: dict[str, Any]
    rungs: list[int]
    lanes: list[Lane]
    ended: list[dict[str, Any]] = field(default_factory=list)
    started: int = 0  # configurations started in this trial so far
    broker_s: float = 0.0  # seconds waiting for the broker's answers (the round trip after each chunk)
    lanes_s: float = 0.0  # seconds judging and refilling lanes here (reports, records, refills' dispatch)
    _evaluated: dict[int, tuple[list, list]] = field(default_factory=dict)  # this chunk's finished lanes

    @classmethod
    def start(cls, plan: Any, budget_steps: int) -> LaneTrial:
        """The lanes of ``plan`` (its ``lanes`` entry: ``static``, the static values as Optuna
        holds them; ``params``, each configuration's searched values; ``min_steps`` and ``eta``)."""
        spec = plan.lanes
        # the rungs of the study's budget, as its pruner counts them: the chunks' rounding down of it
        # can end just under the last rung and drop it
        budget = max(budget_steps, int(spec.get("budget", 0)))
        steps = rungs(int(spec["min_steps"]), budget, int(spec.get("eta", ETA)))
        first = zip(plan.config_keys, spec["params"], plan.hparams, strict=True)
        lanes = [Lane(n, p, h, 0, i) for i, (n, p, h) in enumerate(first)]
        return cls(plan.trial, spec["static"], steps, lanes, started=len(lanes))

    def after_chunk(self, runner: Any, call: Callable[..., dict[str, Any]]) -> dict[str, Any]:
        """Judges the lanes after the chunk the runner just ran, records those that ended and
        refills them (while the trial has chunks left for a new configuration to reach its first
        rung). Returns the broker's answer."""
        last = runner.done
        chunk = len(runner.curves)
        # chunks a new configuration needs to reach its first judgement
        first_rung_chunks, judged_at = 1, self.rungs[0] if self.rungs else runner.budget_steps
        while runner.config.env_steps_after(first_rung_chunks) < judged_at:
            first_rung_chunks += 1
        refill = runner.total_chunks - chunk >= first_rung_chunks
        t0 = time.perf_counter()
        reports = self.reports(runner, last)
        t1 = time.perf_counter()
        answer = call(self.trial, chunk, self.static, reports, refill)
        t2 = time.perf_counter()
        ended = {int(k): v for k, v in answer["ended"].items()}
        for lane, why in sorted(ended.items()):
            self.ended.append(self._record(runner, lane, why))
        new = {int(k): v for k, v in answer["new"].items()}
        if new:
            lanes = sorted(new)
            runner.refill(lanes, [new[c]["hparams"] for c in lanes], [new[c]["number"] for c in lanes])
            for c in lanes:
                self.lanes[c] = Lane(new[c]["number"], new[c]["params"], new[c]["hparams"], chunk, self.started)
                self.started += 1
        for c in ended:
            if c not in new:
                self.lanes[c] = None  # type: ignore[call-overload]  # idle until the trial ends
        self.broker_s += t2 - t1
        self.lanes_s += (t1 - t0) + (time.perf_counter() - t2)
        return answer

    def reports(self, runner: Any, last: bool) -> list[dict[str, Any]]:
        """Each running lane's state after the chunk just run, for :meth:`LaneBroker.step`."""
        r = runner.curves[-1]
        reported = reported_chunks(runner.config.num_chunks)  # of a configuration's own chunks
        finished = [c for c, lane in enumerate(self.lanes) if lane is not None
                    and runner.lane_chunks(c) >= runner.config.num_chunks and not r.diverged[c].any()]
        self._evaluated = {}
        if finished:
            s, f, _ = runner.lane_results(finished)
            self._evaluated = {c: (_floats(s[j]), _floats(f[j])) for j, c in enumerate(finished)}
        out = []
        for c, lane in enumerate(self.lanes):
            if lane is None:
                continue
            steps = int(r.lane_steps[c])
            rung = None  # the last rung this chunk took it past (a long chunk can pass two: Optuna's
            # pruner judges it at each in one call, and its next judgement is after the last)
            while lane.judged < len(self.rungs) and steps >= self.rungs[lane.judged]:
                rung = lane.judged
                lane.judged += 1
            values = reach = None
            if rung is not None:
                values = _floats(runner.lane_objective([c])[0])
                # promoted here, would it reach its next judgement (a rung, or its whole budget) in time?
                target = self.rungs[lane.judged] if lane.judged < len(self.rungs) else runner.budget_steps
                left = runner.total_chunks - len(runner.curves)
                reach = runner.config.env_steps_after(runner.lane_chunks(c) + left) >= target
            diverged = bool(r.diverged[c].any())
            now = None  # its objective so far, on the chunks Optuna is told (at a rung: its `values`)
            if not diverged and rung is None and runner.lane_chunks(c) in reported:
                now = _floats(runner.lane_objective([c])[0])
            out.append({"lane": c, "number": lane.number, "steps": steps, "rung": rung, "values": values,
                        "now": now, "diverged": diverged, "finished": c in finished, "last": last,
                        "reach": reach, "scores": self._evaluated[c][0] if c in self._evaluated else None})
        return out

    def _record(self, runner: Any, lane: int, ended: dict[str, Any]) -> dict[str, Any]:
        """An ended configuration as the trial's record holds it: its values, why and when it
        stopped, its scores (complete ones) and its own learning curve."""
        conf = self.lanes[lane]
        curve = runner.curves[conf.start:]
        scores = final = None
        diverged = [bool(d) for d in curve[-1].diverged[lane]]
        if ended["status"] == "complete":
            scores, final = self._evaluated[lane]
        last_value = None
        if ended["status"] == "pruned":
            last_value = config_score(_floats(runner.lane_objective([lane])[0]))
        return {"index": conf.index, "lane": lane, "optuna_number": conf.number, "params": conf.params,
                "hparams": conf.hparams,
                "status": ended["status"], "stopped": ended["why"], "pruned": ended["status"] == "pruned",
                "started_chunk": conf.start, "env_steps": int(curve[-1].lane_steps[lane]),
                "scores": scores, "final_returns": final, "diverged": diverged, "last_value": last_value,
                "curve": [{"env_steps": int(r.lane_steps[lane]), "returns": _floats(r.returns[lane]),
                           "evals": _floats(r.evals[lane])} for r in curve]}

    def records(self) -> list[dict[str, Any]]:
        """Every configuration that ended, in the order they started."""
        return sorted(self.ended, key=lambda rec: rec["index"])

    def state(self) -> str:
        """This object as JSON, saved with the trial's kernel checkpoint."""
        return json.dumps({"trial": self.trial, "static": self.static, "rungs": self.rungs,
                           "lanes": [asdict(lane) if lane else None for lane in self.lanes], "ended": self.ended,
                           "started": self.started, "broker_s": self.broker_s, "lanes_s": self.lanes_s})

    @classmethod
    def from_state(cls, text: str) -> LaneTrial:
        d = json.loads(text)
        return cls(d["trial"], d["static"], d["rungs"], [Lane(**x) if x else None for x in d["lanes"]],  # type: ignore[misc]
                   d["ended"], d["started"], d.get("broker_s", 0.0), d.get("lanes_s", 0.0))


def _floats(row: Any) -> list[float | None]:
    return [None if not np.isfinite(float(x)) else float(x) for x in np.asarray(row, float)]


_LOCAL: dict[str, Any] = {}  # LaneBrokers living in this process (a study run without Ray actors, tests)


def serve_locally(name: str, broker: Any) -> None:
    """Makes ``broker`` (a :class:`~harness.lanes.broker.LaneBroker`) the one :func:`broker_call` finds
    by ``name`` in this process (None: no more)."""
    if broker is None:
        _LOCAL.pop(name, None)
    else:
        _LOCAL[name] = broker


def broker_call(name: str) -> Callable[..., dict[str, Any]]:
    """:meth:`~harness.lanes.broker.LaneBroker.step` of the broker named ``name``: in this process,
    else the Ray actor of that name (one round trip per call)."""
    if name in _LOCAL:
        return _LOCAL[name].step
    import ray

    actor = ray.get_actor(name)
    return lambda *args: ray.get(actor.step.remote(*args))


def replay(plan: Any, configs: list[ConfigRecord] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Trains a lane trial again from its record: ``plan`` (its first lanes) and the recorded
    ``configs`` (each with its lane, the chunk it started at, its Optuna number and values; as the
    record's file or :meth:`LaneTrial.records` holds them, or typed), each refilled where it started.
    Returns, per recorded configuration in order, what the trial recorded of it: ``optuna_number``,
    ``env_steps``, ``curve`` (evaluations and returns after each of its chunks), and for those that
    trained to the end ``scores`` and ``final_returns``.
    With the same XLA threads it is bit for bit the trial's (harness.kernel.compile's keys are the
    configurations' own, whichever lane or process trains them)."""
    recorded = [c if isinstance(c, ConfigRecord) else ConfigRecord.from_dict(c, "a recorded lane configuration")
                for c in configs]
    if any(c.lane is None or c.started_chunk is None for c in recorded):
        raise ValueError("replay needs each configuration's lane and started_chunk, as a lane trial records them")
    from harness.kernel.runners import LaneRunner  # JAX: in the replay only, not in every worker at import

    runner = LaneRunner(plan)
    starts: dict[int, list[ConfigRecord]] = {}
    ends: dict[int, list[ConfigRecord]] = {}
    for c in recorded:
        if c.started_chunk > 0:
            starts.setdefault(c.started_chunk, []).append(c)
        ends.setdefault(c.started_chunk + len(c.curve), []).append(c)
    out: dict[int, dict[str, Any]] = {}
    while not runner.done:
        if new := sorted(starts.get(len(runner.curves), []), key=lambda c: c.lane):
            runner.refill([c.lane for c in new], [c.hparams for c in new], [c.optuna_number for c in new])
        runner.chunk()
        for c in ends.get(len(runner.curves), []):
            lane = c.lane
            curve = runner.curves[c.started_chunk:]
            row: dict[str, Any] = {
                "optuna_number": c.optuna_number, "env_steps": int(curve[-1].lane_steps[lane]),
                "curve": [{"env_steps": int(r.lane_steps[lane]), "returns": _floats(r.returns[lane]),
                           "evals": _floats(r.evals[lane])} for r in curve]}
            if c.status == "complete":
                s, f, _ = runner.lane_results([lane])
                row.update(scores=_floats(s[0]), final_returns=_floats(f[0]))
            out[c.optuna_number] = row
    return [out[c.optuna_number] for c in recorded]

