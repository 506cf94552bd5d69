"""Helpers for testing the driver's units without Ray: resolved settings, a placement, and a
stand-in for Ray Tune that drives a searcher the way Tune does (suggest, results, complete)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from harness.cluster.placement import Placement
from harness.driver.settings import Options, Settings, resolve
from harness.phases.search_phase import plan_factory
from harness.space import Budget, Study
from harness.store.folder import ResultsFolder

CPU = Placement("cpu", {"cpu": 1}, 2, {"cache_dir": "/nonexistent"})


def settings_for(study: Study, tmp_path: Path, **options: Any) -> Settings:
    """``study`` resolved as ``python -m harness.study`` would (``options``: :class:`Options` fields)."""
    folder = ResultsFolder(tmp_path / study.name)
    return resolve(study, Options(**options), stored=None, folder=folder,
                   resume_command="python -m harness.study x")


def plan_maker(study: Study, tmp_path: Path, *, seeds: int, timesteps: int, configs: int = 1) -> Any:
    settings = settings_for(study, tmp_path)
    return plan_factory(settings, Budget(trials=1, configs_per_trial=configs, seeds=seeds, timesteps=timesteps))


def fake_result(plan: dict[str, Any], chunk: int, num_chunks: int, *, value: float = 1.0) -> dict[str, Any]:
    """What a trial reports after ``chunk``: every run of configuration i of trial t returns
    ``value * (10 * (t + 1) + i)`` (NaN, diverged, where ``value`` is NaN); the last chunk is final."""
    c, s = len(plan["hparams"]), plan["seeds"]
    nan = value != value
    grid = [[None if nan else value * (10 * (plan["trial"] + 1) + i)] * s for i in range(c)]
    steps = plan["config"]["total_timesteps"] * chunk // num_chunks
    out = {"chunk": chunk, "num_chunks": num_chunks, "env_steps": steps, "returns": grid, "evals": grid,
           "objective": grid, "diverged": [[nan] * s for _ in range(c)],
           "score": float("nan") if nan else max(map(max, grid))}
    if chunk == num_chunks:
        out.update(final=True, scores=grid, final_returns=grid, kernel_seconds=1.0, compile_seconds=2.0)
    return out


class FakeTune:
    """Stands in for ``harness.cluster.tuning.run``: runs each proposed trial to the end, one at a time,
    reporting :func:`fake_result` after each of ``chunks`` chunks (``stop_after``: the whole run
    stops, as on Ctrl-C, after that many trials were proposed; they stay in flight)."""

    def __init__(self, chunks: int = 2, stop_after: int | None = None, value: float = 1.0,
                 error: str | None = None, copies: dict[int, int] | None = None) -> None:
        self.chunks, self.stop_after, self.value, self.error = chunks, stop_after, value, error
        self.copies = copies or {}  # population-based training after chunk 1: {lane: the lane it copies}
        self.configs: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []

    def __call__(self, settings: Settings, folder: ResultsFolder, placement: Placement, guard: Any, *,
                 kind: str, searcher: Any = None, num_samples: int = 1, halt: Any = None, **kwargs: Any) -> None:
        import itertools

        from harness.cluster.tuning import GuardedSearcher

        self.calls.append({"kind": kind, "num_samples": num_samples, **kwargs})
        searcher = GuardedSearcher(searcher, guard, kwargs.get("until"))
        for n in itertools.count() if num_samples == -1 else range(num_samples):  # -1: until FINISHED
            tid = f"fake{len(self.configs):03d}"
            config = searcher.suggest(tid)
            if config is None or config == searcher.FINISHED:
                break
            self.configs.append(config)
            if self.stop_after is not None and n + 1 >= self.stop_after:
                break
            if self.error:  # what the trainable returns for an error that would fail again
                result = {"done": True, "error": self.error, "score": float("nan")}
            for k in range(1, 0 if self.error else self.chunks + 1):
                result = fake_result(config["plan"], k, self.chunks, value=self.value)
                if k == 1 and self.copies:
                    result["pbt"] = json.dumps(self.exploit(config["plan"]))
                searcher.on_trial_result(tid, result)
            searcher.on_trial_complete(tid, result)
            if halt is not None and halt():
                break
        guard.raise_if_tripped()


    def exploit(self, plan: dict[str, Any]) -> dict[str, Any]:
        """The exploit/explore event after chunk 1: each lane in ``copies`` takes the other's
        network and its learning rate doubled."""
        source = [self.copies.get(i, i) for i in range(len(plan["hparams"]))]
        hparams = [dict(plan["hparams"][s], lr=plan["hparams"][s]["lr"] * (2 if s != i else 1))
                   for i, s in enumerate(source)]
        fitness = [float(i) for i in range(len(source))]
        return {"chunk": 1, "source": source, "fitness": fitness, "hparams": hparams}


def small(study: Study, **budget: int) -> Study:
    """``study`` with every budget replaced by ``Budget(**budget)``."""
    b = Budget(**{"trials": 2, "configs_per_trial": 2, "seeds": 2, "timesteps": 4096, **budget})
    return dataclasses.replace(study, cpu=b, gpu=b, smoke=b)
