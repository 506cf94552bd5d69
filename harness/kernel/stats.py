"""Statistics over seeds, shared by the searcher, the trials and the reports (numpy only)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np


def iqm(x: np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% (fractional weights at the edges)."""
    x = np.sort(np.asarray(x, float))
    n = len(x)
    if n == 0:
        return float("nan")
    lo, hi = 0.25 * n, 0.75 * n
    weights = np.clip(np.minimum(np.arange(1, n + 1), hi) - np.maximum(np.arange(n), lo), 0, 1)
    return float(np.sum(weights * x) / np.sum(weights))


def bootstrap_ci(x: np.ndarray, *, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean over seeds (fixed seed: reproducible)."""
    x = np.asarray(x, float)
    if len(x) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = rng.choice(x, size=(resamples, len(x)), replace=True).mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def config_score(scores: Sequence[float | None] | None, diverged: Sequence[bool] | None = None,
                 metric: str = "mean") -> float | None:
    """The mean (or ``iqm``) of the finite ``scores`` over seeds; None when there are none or
    any seed ``diverged``."""
    if scores is None or any(diverged or []):
        return None
    finite = [float(v) for v in scores if v is not None and math.isfinite(v)]
    if not finite:
        return None
    return iqm(np.array(finite)) if metric == "iqm" else sum(finite) / len(finite)


Objective = Literal["final", "auc", "steps"]
OBJECTIVES: tuple[str, ...] = ("final", "auc", "steps")


def describe_objective(objective: str, threshold: float | None = None, policy: str = "greedy") -> str:
    """The objective in words, for reports and best.json; ``policy``: how evaluation acts
    (``greedy``: the deterministic policy; ``sample``: actions drawn from it)."""
    how = "deterministic" if policy == "greedy" else "sampled"
    return {"final": f"final evaluation return ({how} policy, after the last chunk)",
            "auc": f"area under the evaluation curve: mean {how}-policy evaluation return over the "
                   "run's chunks (sooner and steadier is better)",
            "steps": f"env steps until the evaluation return first reaches {threshold:g} (censored at the "
                     "budget: never reaching it counts as the whole budget; fewer is better)"
            if threshold is not None else "env steps to a threshold"}[objective]


def maximized(objective: str) -> bool:
    """Whether a larger value of ``objective`` is better (``steps`` is minimized)."""
    return objective != "steps"


def objective_values(evals: np.ndarray, steps: Sequence[int], objective: str, *,
                     final: np.ndarray | None = None, threshold: float | None = None,
                     budget: int | None = None) -> np.ndarray:
    """Each run's value under ``objective`` from its evaluation curve.

    Args:
        evals: ``[K, ...]`` mean deterministic evaluation return after each of K chunks.
        steps: ``[K]`` env steps per seed after each chunk.
        objective: ``final`` (``final`` if given, else the last evaluation), ``auc`` (the mean
            of the K evaluations) or ``steps`` (env steps at the first chunk whose evaluation
            reaches ``threshold``; ``budget`` where none does: censored).
        final: ``[...]`` a fuller evaluation after the last chunk, used by ``final``.
        threshold, budget: for ``steps``.

    Returns:
        ``[...]`` float values; NaN where an evaluation the value depends on is NaN.
    """
    evals = np.asarray(evals, float)
    if objective == "final":
        return np.asarray(final, float) if final is not None else evals[-1]
    if objective == "auc":
        return evals.mean(axis=0)
    if objective == "steps":
        if threshold is None or budget is None:
            raise ValueError("objective 'steps' needs a threshold and a budget")
        reached = evals >= threshold  # NaN compares False
        first = np.argmax(reached, axis=0)
        at = np.asarray(steps, float)[first]
        out = np.where(reached.any(axis=0), at, float(budget))
        return np.where(np.isnan(evals).any(axis=0), np.nan, out)
    raise ValueError(f"unknown objective {objective!r}; choose from {', '.join(OBJECTIVES)}")


def paired_difference(a: Sequence[float], b: Sequence[float], *, resamples: int = 2000,
                      seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``a - b`` over paired seeds and its 95% percentile-bootstrap interval, resampling
    the seeds (pairs) together: ``a[i]`` and ``b[i]`` shared seed ``i`` (common random numbers).
    Pairs where either is NaN are left out; NaNs when none is left."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = (a - b)[np.isfinite(a) & np.isfinite(b)]
    if not len(d):
        return float("nan"), float("nan"), float("nan")
    lo, hi = bootstrap_ci(d, resamples=resamples, seed=seed)
    return float(d.mean()), lo, hi


MAX_REPORTS = 50  # intermediate values per Optuna trial: evenly spaced chunks, the first and last included


def reported_chunks(num_chunks: int) -> set[int]:
    """The chunks (1-based) whose objective Optuna is told as it arrives: every one up to
    ``MAX_REPORTS`` chunks, evenly spaced ones beyond (a configuration's own chunks, where lanes
    are refilled)."""
    return {1 + round(i * (num_chunks - 1) / (MAX_REPORTS - 1)) for i in range(MAX_REPORTS)}
