"""CSV reports from a study's records on disk; no Ray needed.

    python -m harness.report results/cartpole_ppo

writes ``reports/configs.csv`` (one row per configuration: hyperparameters, mean, std, IQM,
bootstrap 95% CI over seeds, diverged, pruned, rank), ``reports/seeds.csv`` (configuration x
seed), ``reports/curves.csv`` (configuration x seed x env step), ``reports/best.json``,
``reports/importance.csv`` (harness/reports/importance.py), ``reports/ablation.csv`` (the path run
by harness/phases/ablation.py, tabled by harness/reports/ablation.py), and the plots with
``reports/index.html`` (open it in a browser; see harness/reports/plots.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.cli import Parser
from harness.kernel.stats import bootstrap_ci, config_score, describe_objective, iqm, paired_difference
from harness.reports import ablation, importance, lineage
from harness.space import label
from harness.store.folder import ResultsFolder, as_folder
from harness.store.records import (
    FinalConfig,
    FinalRecord,
    RecordsError,
    TrialRecord,
    config_id,
    write_json,
)


def _param_columns(params: dict[str, Any]) -> dict[str, Any]:
    return {k: label(tuple(v)) if isinstance(v, list) else v for k, v in params.items()}


def tables(where: ResultsFolder | Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(configs, seeds, curves) from a study's records."""
    folder = as_folder(where)
    meta = folder.meta()
    config_rows, seed_rows, curve_parts = [], [], []
    for rec in folder.trials():
        for c in rec.configs:
            cid = config_id(rec.trial, c.index)
            status = rec.status_of(c)  # a refilled lane's configuration has its own
            scores = [np.nan if s is None else s for s in (c.scores or [])]
            diverged = c.diverged or []
            for s in range(rec.seeds):
                seed_rows.append(dict(
                    config_id=cid, trial=rec.trial, seed=s,
                    score=scores[s] if scores else np.nan,
                    diverged=bool(diverged[s]) if diverged else False,
                    status=status))
            finite = np.array([v for v in scores if np.isfinite(v)])
            finals = np.array([v for v in (c.final_returns or []) if v is not None], float)
            lo, hi = bootstrap_ci(finite)
            config_rows.append(dict(
                config_id=cid, trial=rec.trial, optuna_number=c.optuna_number, status=status,
                **_param_columns(c.params), seeds=rec.seeds,
                env_steps=rec.env_steps_of(c),
                mean=finite.mean() if len(finite) else np.nan,
                std=finite.std(ddof=1) if len(finite) > 1 else np.nan,
                iqm=iqm(finite), ci_low=lo, ci_high=hi,
                final_return=finals.mean() if len(finals) else np.nan,
                diverged=any(diverged), pruned=c.pruned,
                **({"stopped": c.stopped} if rec.lanes else {})))
        curve_parts.append(_curves_of(rec))
    configs = pd.DataFrame(config_rows)
    curves = pd.concat(curve_parts, ignore_index=True) if curve_parts else pd.DataFrame(columns=CURVE_COLUMNS)
    if len(configs):
        configs = rank(configs, curves, meta.metric, meta.maximize)
    return configs, pd.DataFrame(seed_rows), curves


TIEBREAK = "train_auc"  # the secondary ranking metric, named in the reports


def ranked_by(metric: str, objective: str = "final", threshold: float | None = None,
              policy: str = "greedy") -> str:
    """How configurations are ranked, in words (written to best.json)."""
    return (f"{describe_objective(objective, threshold, policy)}, {metric} over seeds; ties broken by {TIEBREAK}, "
            "the mean training return over the whole run")


def rank(configs: pd.DataFrame, curves: pd.DataFrame, metric: str, maximize: bool) -> pd.DataFrame:
    """Ranks the complete, undiverged, scored configurations by ``metric``, ties broken by
    ``train_auc``: the mean training episode return over the whole run (all chunks and seeds),
    the area under the training curve, which rewards getting there sooner and staying there.
    Configurations equal on both share a rank; never ranked by order. Sorted best first."""
    auc = curves.groupby("config_id").episode_return.mean() if len(curves) else pd.Series(dtype=float)
    configs[TIEBREAK] = configs.config_id.map(auc).astype(float)
    rankable = (configs.status == "complete") & ~configs.diverged & configs[metric].notna()
    sign = 1.0 if maximize else -1.0
    keys = [(sign * m, sign * a if np.isfinite(a) else -np.inf)
            for m, a in zip(configs.loc[rankable, metric], configs.loc[rankable, TIEBREAK], strict=True)]
    order = sorted(range(len(keys)), key=lambda i: keys[i], reverse=True)
    ranks = np.empty(len(keys), dtype=int)
    for pos, i in enumerate(order):
        same = pos and keys[i] == keys[order[pos - 1]]
        ranks[i] = ranks[order[pos - 1]] if same else pos + 1
    configs["rank"] = pd.Series(ranks, index=configs.index[rankable], dtype="Int64").reindex(configs.index)
    return configs.sort_values(["rank", "config_id"], na_position="last").reset_index(drop=True)


CURVE_COLUMNS = ["config_id", "seed", "env_steps", "episode_return", "eval_return"]


def _curves_of(rec: TrialRecord) -> pd.DataFrame:
    """A trial record's curves, one row per (configuration, seed, chunk), built as arrays (a GPU
    study's records hold millions of points)."""
    points = rec.curves
    if rec.lanes:  # each configuration has its own curve (its lane's chunks)
        return _lane_curves_of(rec)
    if not points:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    def grid(key: str) -> np.ndarray:  # [K, C, S]; NaN where missing (records made before evaluations)
        return np.array([[[np.nan if v is None else v for v in row] for row in p[key]] if key in p
                         else np.full(np.shape(p["returns"]), np.nan) for p in points], dtype=float)

    returns, evals = grid("returns"), grid("evals")
    k, c, s = returns.shape
    ids = np.array([config_id(rec.trial, i) for i in range(c)])
    steps = np.array([p["env_steps"] for p in points])
    return pd.DataFrame({"config_id": np.tile(np.repeat(ids, s), k), "seed": np.tile(np.arange(s), k * c),
                         "env_steps": np.repeat(steps, c * s), "episode_return": returns.reshape(-1),
                         "eval_return": evals.reshape(-1)})


def _lane_curves_of(rec: TrialRecord) -> pd.DataFrame:
    rows = [(config_id(rec.trial, c.index), s, p["env_steps"], p["returns"][s], p["evals"][s])
            for c in rec.configs for p in c.curve for s in range(rec.seeds)]
    frame = pd.DataFrame(rows, columns=CURVE_COLUMNS)
    return frame.astype({"episode_return": float, "eval_return": float})


def reevaluated_best(final: FinalRecord, metric: str, maximize: bool) -> FinalConfig:
    """The re-trained configuration (final.json) with the best re-evaluation: the study's answer."""
    def key(c: FinalConfig) -> float:
        value = config_score(c.scores, c.diverged, metric)
        return -np.inf if value is None else value * (1 if maximize else -1)
    return max(final.configs, key=key)


def best(folder: ResultsFolder, configs: pd.DataFrame) -> dict[str, Any] | None:
    """The best configuration: by its re-evaluation on fresh seeds when the study has one."""
    meta = folder.meta()
    final = folder.final()
    maximize, metric = meta.maximize, meta.metric
    how = ranked_by(metric, meta.objective, meta.threshold, meta.eval_policy)
    if final and final.configs:
        top = reevaluated_best(final, metric, maximize)
        vals = np.array([v for v in top.scores or [] if v is not None], float)
        # its search score: None where its trial's record can no longer be read (reports/problems.txt names it)
        searched = configs.set_index("config_id")[metric] if len(configs) else pd.Series(dtype=float)
        score = searched.get(top.config_id)
        lo, hi = bootstrap_ci(vals)
        return dict(
            study=meta.study, config_id=top.config_id, params=top.params,
            metric=metric, search_score=None if score is None or pd.isna(score) else float(score),
            reevaluation=dict(mean=float(vals.mean()) if len(vals) else None, iqm=iqm(vals),
                              final_return=_mean(top.final_returns),
                              std=float(vals.std(ddof=1)) if len(vals) > 1 else None,
                              ci95=[lo, hi], seeds=len(top.scores or []), scores=top.scores,
                              diverged=any(top.diverged or []), failed=top.failed),
            objective=meta.objective, ranked_by=how,
            tuned_vs_default=tuned_vs_default(top, final.control, metric, maximize, meta.reference),
            reproduce=dict(command=top.command, plans=top.plans),
            candidates=[c.config_id for c in final.configs])
    if not len(configs) or configs["rank"].isna().all():
        return None
    row = configs.iloc[0]
    return dict(study=meta.study, config_id=row.config_id, search_score=float(row[metric]),
                objective=meta.objective, ranked_by=how, reevaluation=None,
                note="the study has not finished its re-evaluation yet")


def tuned_vs_default(tuned: FinalConfig, control: FinalConfig | None, metric: str,
                     maximize: bool, reference: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The tuned configuration against the control, both re-trained on the same fresh seeds:
    each one's score (``metric`` over seeds) with a bootstrap 95% CI, and the paired
    difference tuned - default with its 95% CI (seeds resampled in pairs). ``better`` says
    whether the difference's CI excludes 0 in the study's direction, ``worse`` whether it
    excludes 0 the other way (the default is better). With a ``reference`` (``{"label",
    "return"}``: random play's return, say), ``above_reference`` gives each mean's margin over
    it and the ratio of the margins (None unless the default's margin is positive)."""
    if not control or control.failed or tuned.failed:
        return None

    def side(c: FinalConfig) -> dict[str, Any]:
        vals = np.array([np.nan if v is None else v for v in c.scores or []], float)
        finite = vals[np.isfinite(vals)]
        lo, hi = bootstrap_ci(finite)
        return dict(config_id=c.config_id, score=config_score(c.scores, c.diverged, metric),
                    mean=float(finite.mean()) if len(finite) else None, ci95=[lo, hi],
                    diverged=any(c.diverged or []))

    a = [np.nan if v is None else v for v in tuned.scores or []]
    b = [np.nan if v is None else v for v in control.scores or []]
    diff, lo, hi = paired_difference(a, b)
    sign = 1.0 if maximize else -1.0
    paired = int(np.sum(np.isfinite(np.subtract(a, b))))
    out = dict(tuned=side(tuned), default=dict(side(control), params=control.params),
               difference=dict(mean=diff, ci95=[lo, hi], paired_seeds=paired),
               better=bool(np.isfinite(lo) and min(sign * lo, sign * hi) > 0),
               worse=bool(np.isfinite(lo) and max(sign * lo, sign * hi) < 0),
               ratio=_ratio(a, b))
    if reference is not None and out["tuned"]["mean"] is not None and out["default"]["mean"] is not None:
        ref = float(reference["return"])
        ta, tb = out["tuned"]["mean"] - ref, out["default"]["mean"] - ref
        out["above_reference"] = {"label": reference["label"], "return": ref, "tuned": ta, "default": tb,
                                  "ratio": ta / tb if tb > 0 else None}
    return out


def _mean(values: list[float | None] | None) -> float | None:
    """Mean of the finite values; None when there are none."""
    finite = [v for v in values or [] if v is not None and np.isfinite(v)]
    return float(np.mean(finite)) if finite else None


def _ratio(a: list[float], b: list[float]) -> float | None:
    """mean(a) / mean(b) over their finite values; None unless mean(b) > 0."""
    ma, mb = (np.mean([v for v in x if np.isfinite(v)]) if any(np.isfinite(x)) else np.nan for x in (a, b))
    return float(ma / mb) if np.isfinite(ma) and np.isfinite(mb) and mb > 0 else None


def final_table(final: FinalRecord | None, metric: str) -> pd.DataFrame:
    """The re-training on fresh seeds (final.json): one row per re-trained configuration and the control."""
    rows = []
    for role, c in [("tuned", c) for c in (final.configs if final else [])] + (
            [("default", final.control)] if final and final.control else []):
        vals = np.array([v for v in c.scores or [] if v is not None], float)
        finals = np.array([v for v in c.final_returns or [] if v is not None], float)
        lo, hi = bootstrap_ci(vals)
        rows.append(dict(config_id=c.config_id, role=role, failed=c.failed,
                         seeds=len(c.scores or []), score=config_score(c.scores, c.diverged, metric),
                         mean=vals.mean() if len(vals) else np.nan, ci_low=lo, ci_high=hi,
                         final_return=finals.mean() if len(finals) else np.nan,
                         diverged=any(c.diverged or []), **_param_columns(c.params)))
    return pd.DataFrame(rows)


def build(where: ResultsFolder | Path, *, plots: bool = True) -> dict[str, Path]:
    """Writes every report under the folder's ``reports/``; returns their paths. With ``plots``
    False (after each trial of a running study) only the small ones: configs.csv, seeds.csv and
    best.json; curves.csv, the plots, index.html and TensorBoard are written at the end. A study
    with no record yet gets empty tables and a page that says so.

    Raises:
        RecordsError: not a study's results folder.
    """
    folder = as_folder(where)
    meta = folder.meta()
    configs, seeds, curves = tables(folder)
    out = folder.reports_dir
    out.mkdir(parents=True, exist_ok=True)
    tables_ = {"configs": configs, "seeds": seeds, **({"curves": curves} if plots else {})}
    if final := folder.final():
        tables_["final"] = final_table(final, meta.metric)
    pbt = lineage.table(folder.trials())
    if len(pbt):
        tables_["pbt"] = pbt
    if plots and len(imp := importance.table(configs, meta)):  # Optuna's evaluators: at the end only
        tables_["importance"] = imp
    if (abl := folder.ablation()) and abl.steps:
        tables_["ablation"] = ablation.table(abl)
    paths = {name: folder.report(f"{name}.csv") for name in tables_}
    for name, df in tables_.items():
        tmp = paths[name].with_suffix(".csv.tmp")
        df.to_csv(tmp, index=False)
        tmp.replace(paths[name])
    problems = folder.report("problems.txt")  # files that could not be read: named, never dropped
    unreadable = folder.unreadable()
    if unreadable:
        problems.write_text("files left out of these reports:\n" + "".join(f"{p}\n" for p in unreadable))
        paths["problems"] = problems
    else:
        problems.unlink(missing_ok=True)
    b = best(folder, configs)
    if b is not None:
        paths["best"] = folder.report("best.json")
        write_json(paths["best"], _jsonable(b))
    if plots:
        from harness.reports import plots as plotting
        from harness.reports import tensorboard

        paths.update(plotting.build(folder, meta, configs, curves, _jsonable(b) if b else None,
                                    pbt if len(pbt) else None, tables_.get("importance"), tables_.get("ablation")))
        if len(configs):
            paths["tensorboard"] = tensorboard.write(folder.tensorboard_dir, configs, curves, list(meta.space))
    return paths


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, float | np.floating):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def main(argv: list[str] | None = None) -> int:
    parser = Parser("python -m harness.report", __doc__)
    parser.add_argument("results", help="a study's results folder, e.g. results/cartpole_ppo")
    args = parser.parse_args(argv)
    if not args.results.strip():
        parser.error("the results folder is an empty name; give a study's, e.g. results/cartpole_ppo")
    try:
        paths = build(Path(args.results))
    except RecordsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file where a reports folder goes, no permission, a full disk ...
        where = f": {err.filename}" if err.filename else ""
        print(f"error: the reports cannot be built: {err.strerror or err}{where}", file=sys.stderr)
        return 2
    for p in paths.values():
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
