"""``reports/ablation.csv`` from ``ablation.json`` (the ablation path, :mod:`harness.phases.ablation`):
each step's score over the seeds and its gain over the step before, with 95% intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.kernel.stats import bootstrap_ci, paired_difference
from harness.space import label
from harness.store.records import AblationRecord

COLUMNS = ["step", "param", "value", "mean", "ci_low", "ci_high", "gain", "gain_ci_low", "gain_ci_high",
           "seeds", "candidates"]


def table(ablation: AblationRecord) -> pd.DataFrame:
    """reports/ablation.csv: one row per step of the path, its score over the seeds with a 95%
    bootstrap CI, and its gain over the step before (paired by seed, in the direction the study
    optimises: positive is better) with the paired 95% CI."""
    sign = 1.0 if ablation.maximize else -1.0
    rows, prev = [], None
    for s in ablation.steps:
        vals = np.array([np.nan if v is None else v for v in s.scores or []], float)
        finite = vals[np.isfinite(vals)]
        lo, hi = bootstrap_ci(finite)
        n = min(len(vals), 0 if prev is None else len(prev))  # inner points run the ends' first seeds
        gain = (np.nan, np.nan, np.nan) if not n else paired_difference(sign * vals[:n], sign * prev[:n])
        value = s.value
        rows.append(dict(step=s.step, param=s.param or "(default)",
                         value="" if s.param is None else f"{value:.4g}" if isinstance(value, float)
                         else label(tuple(value) if isinstance(value, list) else value),
                         mean=finite.mean() if len(finite) else np.nan, ci_low=lo, ci_high=hi, gain=gain[0],
                         gain_ci_low=gain[1], gain_ci_high=gain[2], seeds=len(vals), candidates=len(s.tried)))
        prev = vals if len(vals) else prev
    return pd.DataFrame(rows, columns=COLUMNS)

