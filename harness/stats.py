"""Statistics over seeds, shared by the searcher, the trials and the reports (numpy only)."""

from __future__ import annotations

import math
from collections.abc import Sequence

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
