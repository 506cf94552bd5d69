"""The ablation path: from the default configuration to the best one, one hyperparameter at a time.

    ablation = ablation.run(settings, folder, placement, guard)   # after the final phase

First every hyperparameter that differs is switched alone from the default configuration (the
control) to the best configuration's value; then the path switches them in the order of those
gains, each point adding the next. Each pass is one batch of kernels on the first round of the
final phase's fresh seeds, so every point is paired with every other by seed: 2d-2 candidates,
where a greedy path re-ranking after every switch would cost d(d+1)/2 - 1.

The path's two ends are the final phase's own runs of the control and of the best configuration,
so it ends at the best configuration's re-evaluated score exactly. A best configuration from
population-based training has no fixed values to switch to, so no path.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from harness.cluster.placement import Placement
from harness.driver import progress
from harness.driver.guard import DiskGuard
from harness.driver.settings import Settings
from harness.kernel.stats import config_score
from harness.phases import final_phase
from harness.report import reevaluated_best
from harness.store.folder import ResultsFolder
from harness.store.records import AblationRecord, AblationStep, FinalConfig

Scores = list[float | None] | None  # a candidate's objective value per seed (None: diverged); None: failed
Measure = Callable[[dict[str, dict[str, Any]]], dict[str, Scores]]  # candidate points -> their scores


def differing(start: dict[str, Any], end: dict[str, Any]) -> list[str]:
    """The names whose values differ (lists and tuples compared as JSON)."""
    return [n for n in end if json.dumps(start.get(n)) != json.dumps(end[n])]


def path(start: dict[str, Any], end: dict[str, Any], start_scores: Scores, end_scores: Scores,
         measure: Measure, *, maximize: bool = True, metric: str = "mean",
         on_step: Callable[[int, int, int], None] | None = None) -> list[AblationStep]:
    """The path from ``start`` to ``end`` (dicts of the searched names' values), ordered by each
    switch's gain on its own.

    ``measure({name: point})`` scores a batch of points; it is called at most twice: the single
    switches from ``start``, then the path's inner points (``name``: the last switch of that
    point). The last point is ``end`` itself, scored by ``end_scores``. A point without a score
    (diverged, failed) gains least. ``on_step(pass, passes, points)`` says what is measured next.
    """
    names = differing(start, end)
    if not names:
        return [AblationStep(0, None, None, start_scores, {})]

    def mean(scores: Scores) -> float | None:
        return config_score(scores, None, metric) if scores else None

    def gain(n: str, means: dict[str, float | None]) -> float:
        m = means[n]
        return float("-inf") if m is None else m if maximize else -m

    passes = 1 if len(names) <= 2 else 2
    if len(names) == 1:
        singles: dict[str, Scores] = {names[0]: end_scores}
    else:
        if on_step:
            on_step(1, passes, len(names))
        singles = measure({n: {**start, n: end[n]} for n in names})
    tried = {n: mean(singles.get(n)) for n in names}
    order = sorted(names, key=lambda n: -gain(n, tried))  # stable: ties keep the best configuration's order
    inner: dict[str, Scores] = {}
    if len(order) > 2:
        if on_step:
            on_step(2, passes, len(order) - 2)
        points, current = {}, dict(start)
        for n in order[:-1]:
            current = {**current, n: end[n]}
            points[n] = dict(current)
        inner = measure({n: p for n, p in points.items() if n != order[0]})
    steps = [AblationStep(0, None, None, start_scores, {})]
    for k, n in enumerate(order, 1):
        scores = end_scores if k == len(order) else singles.get(n) if k == 1 else inner.get(n)
        steps.append(AblationStep(k, n, end[n], scores, tried if k == 1 else {n: mean(scores)}))
    return steps


def run(settings: Settings, folder: ResultsFolder, placement: Placement, guard: DiskGuard, *,
        run_plans: final_phase.RunPlans | None = None,
        say: Callable[[str], None] = progress.say) -> AblationRecord | None:
    """Computes the path for the study's best re-trained configuration and writes ablation.json;
    returns it (None: turned off, nothing to ablate, or ablation.json is already up to date)."""
    final = folder.final()
    if not settings.ablation or not final or not final.configs or not final.control:
        return None
    study = settings.study
    best = reevaluated_best(final, study.metric, settings.maximize)
    control = final.control
    old = folder.ablation()
    if old and old.trials == final.trials and old.target == best.config_id:
        return None

    def record(steps: list[AblationStep], **rest: Any) -> AblationRecord:
        return AblationRecord(steps, trials=final.trials, target=best.config_id, objective=study.objective,
                              maximize=settings.maximize, **rest)

    if best.schedule:
        why = "the best configuration changed its hyperparameters during training (population-based training)"
        say(f"no ablation path: {why}")
        folder.write_ablation(record([], skipped=why))
        return None
    if best.failed or control.failed:
        why = "the re-training of the best or the default configuration failed"
        say(f"no ablation path: {why}")
        folder.write_ablation(record([], skipped=why))
        return None
    budget = settings.budget(placement.kind)
    records = folder.trials()
    kernels = 0

    def walk(run: final_phase.RunPlans) -> list[AblationStep]:
        def measure(points: dict[str, dict[str, Any]]) -> dict[str, Scores]:
            nonlocal kernels
            candidates = {n: candidate(settings, p, budget.timesteps) for n, p in points.items()}
            # the first round of the final phase's seeds: paired with the ends at a fraction of their cost
            plans, members = final_phase.final_plans(settings, budget, candidates, records, 1)
            kernels += len(plans)
            runs = final_phase.collect(plans, members, run(plans))
            out: dict[str, Scores] = {}
            for n in candidates:
                j = final_phase.joined(runs[n])
                out[n] = None if j.failed else _seeds(j)
            return out

        def on_step(step: int, steps: int, points: int) -> None:
            what = "each switched alone from the default" if step == 1 else "the path's inner points"
            say(f"ablation path, pass {step}/{steps}: {points} configurations ({what}) on {budget.seeds} "
                "seeds ...")

        return path(control.params, best.params, _seeds(control), _seeds(best), measure,
                    maximize=settings.maximize, metric=study.metric, on_step=on_step)

    t0 = time.monotonic()
    # every step's kernels in one Tune run (its actors reused), unless the kernels are stood in for
    steps = walk(run_plans) if run_plans else final_phase.tune_streamed(settings, folder, placement, guard, walk)
    out = record(steps, kernels=kernels, seconds=round(time.monotonic() - t0, 1), seeds=budget.seeds)
    folder.write_ablation(out)
    return out


def candidate(settings: Settings, point: dict[str, Any], timesteps: int) -> final_phase.Candidate:
    """A point of the path (every searched name's value) as a configuration to train."""
    return final_phase.Candidate(point, *settings.configuration(point, timesteps))


def _seeds(c: FinalConfig | final_phase.Joined) -> Scores:
    return [None if d else s for s, d in zip(c.scores or [], c.diverged or [], strict=True)]


