"""Which searched hyperparameters mattered: Optuna's importance evaluators over the study's
completed configurations, read from its records (no Ray, no Optuna storage needed).

    table = importance.table(configs, meta)   # reports/importance.csv

- fANOVA (``FanovaImportanceEvaluator``): the share of the objective's variance over the whole
  search space that each hyperparameter explains on its own, from a random forest fitted to the
  configurations (functional ANOVA; Hutter et al. 2014).
- PED-ANOVA (``PedAnovaImportanceEvaluator``): how differently each hyperparameter is spread in
  the best 10% of the configurations than in all of them (Pearson divergence; Watanabe et al.
  2023): what matters for being near the top, rather than over the whole space.

Each row normalised over the hyperparameters (they sum to 1 per evaluator and scope). The scope
``all`` is every completed configuration (static choices among the hyperparameters); a study with
static choices also gets one scope per static choice (``num_minibatches=4``) with enough of them.
Pruned (stopped early) and diverged configurations are left out: their scores are not comparable.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from harness.store.folder import StudyMeta

MIN_CONFIGS = 8  # completed configurations an importance needs (PED-ANOVA's top 10%: at least one)
EVALUATORS = ("fanova", "ped_anova")
COLUMNS = ["scope", "evaluator", "param", "importance", "rank", "configs"]


def usable(configs: pd.DataFrame, metric: str = "mean") -> pd.DataFrame:
    """The configurations an importance is computed over: finished their budget, not diverged."""
    if not len(configs):
        return configs
    ok = configs[metric].notna() & ~configs["diverged"].astype(bool) & ~configs["pruned"].astype(bool)
    return configs[ok & (configs["status"] == "complete")]


def table(configs: pd.DataFrame, meta: StudyMeta, *, seed: int = 0) -> pd.DataFrame:
    """Importances (``COLUMNS``) of ``meta.space``'s names for the study's objective; empty when
    fewer than :data:`MIN_CONFIGS` configurations completed."""
    done = usable(configs, meta.metric)
    names = [n for n in meta.space if n in done.columns]
    if len(done) < MIN_CONFIGS or not names:
        return pd.DataFrame(columns=COLUMNS)
    scopes = [("all", done)]
    for n in names:
        if meta.space[n] == "categorical":  # static choices split kernels: a scope per choice
            for value, part in done.groupby(n, sort=True):
                if len(part) >= MIN_CONFIGS and part[names].nunique().gt(1).any():
                    scopes.append((f"{n}={value}", part))
    rows = []
    for scope, part in scopes:
        varied = [n for n in names if part[n].nunique() > 1]  # a constant one explains nothing
        if not varied:
            continue
        for evaluator, values in evaluate(part, varied, meta, seed=seed).items():
            order = sorted(values, key=lambda k: -values[k])
            rows += [dict(scope=scope, evaluator=evaluator, param=k, importance=values[k],
                          rank=order.index(k) + 1, configs=len(part)) for k in names if k in values]
    return pd.DataFrame(rows, columns=COLUMNS)


def evaluate(part: pd.DataFrame, names: list[str], meta: StudyMeta, *,
             seed: int = 0) -> dict[str, dict[str, float]]:
    """``{evaluator: {name: importance}}`` over the configurations of ``part`` (their score:
    the column of the study's metric, the objective's mean or IQM over seeds)."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    dists: dict[str, Any] = {}
    for n in names:
        kind, col = meta.space[n], part[n]
        if kind == "categorical":
            dists[n] = CategoricalDistribution(sorted(col.astype(str).unique()))
        elif kind == "int":
            dists[n] = IntDistribution(int(col.min()), int(col.max()))
        else:  # the observed range: the space's own bounds are not in study.json
            dists[n] = FloatDistribution(float(col.min()), float(col.max()), log=kind == "log")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory"
    try:
        study = optuna.create_study(direction=meta.direction)
    finally:
        optuna.logging.set_verbosity(verbosity)
    for _, row in part.iterrows():
        params = {n: str(row[n]) if meta.space[n] == "categorical" else
                  int(row[n]) if meta.space[n] == "int" else float(row[n]) for n in names}
        value = float(row[meta.metric])
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value))
    evaluators = {"fanova": optuna.importance.FanovaImportanceEvaluator(seed=seed),
                  "ped_anova": optuna.importance.PedAnovaImportanceEvaluator()}
    out = {}
    with warnings.catch_warnings():  # e.g. PED-ANOVA's "importances will be equal" on a flat objective
        warnings.simplefilter("ignore")
        for name, ev in evaluators.items():
            values = optuna.importance.get_param_importances(study, evaluator=ev, params=names, normalize=True)
            out[name] = {k: float(v) if np.isfinite(v) else 0.0 for k, v in values.items()}
    return out


def top(imp: pd.DataFrame, k: int = 3, evaluator: str = "fanova") -> list[tuple[str, float]]:
    """The ``k`` most important hyperparameters over all configurations by ``evaluator``."""
    rows = imp[(imp["scope"] == "all") & (imp["evaluator"] == evaluator)].sort_values("rank")
    return [(r.param, float(r.importance)) for r in rows.head(k).itertuples()]


def too_few(configs: pd.DataFrame) -> str:
    """Why there is no importance, in one line."""
    return (f"hyperparameter importance needs at least {MIN_CONFIGS} completed configurations; "
            f"this study has {len(usable(configs))}")
