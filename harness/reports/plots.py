"""Plots and a static report page from a study's tables (matplotlib, no server needed).

    reports/curves.png        learning curves of the top configurations, bootstrap 95% bands over seeds
    reports/params.png        score against each searched hyperparameter (log axes for log spaces)
    reports/progress.png      best score so far against trial number
    reports/importance.png    each hyperparameter's importance by fANOVA and PED-ANOVA
    reports/ablation.png      the ablation path from the default to the best configuration, 95% CIs
    reports/index.html        the answer, what mattered, the leaderboard, the plots
"""

from __future__ import annotations

import html
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.store.folder import ResultsFolder, StudyMeta

TOP = 5  # configurations drawn in curves.png


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path, ax: Any = None) -> Path:
    if ax is not None:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _band(values: np.ndarray, *, resamples: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap 95% interval of the mean over seeds, per step: ``values [S, T]`` (NaN allowed)."""
    rng = np.random.default_rng(seed)
    s = values.shape[0]
    idx = rng.integers(0, s, size=(resamples, s))
    with warnings.catch_warnings():  # steps where no seed finished an episode are all-NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(values[idx], axis=1)  # [R, T]
        return np.nanpercentile(means, 2.5, axis=0), np.nanpercentile(means, 97.5, axis=0)


def stopped_marks(configs: pd.DataFrame, curves: pd.DataFrame, column: str = "eval_return") -> pd.DataFrame:
    """Where each configuration of a lane study that did not train to the end stopped: one row per
    pruned or diverged configuration (``config_id``, ``status``, ``env_steps``: its last chunk's;
    ``value``: its mean over seeds there, else at its last chunk with one, NaN where it has none).
    Empty for a study whose lanes were not refilled (no ``stopped`` column: every trial there ends
    together)."""
    rows = [(cid, status, *_mark(curve)) for cid, status, curve in _stopped_curves(configs, curves, column)]
    return pd.DataFrame(rows, columns=["config_id", "status", "env_steps", "value"])


def _mark(curve: pd.Series) -> tuple[int, float]:
    """Where a mean curve (by env steps) stopped: its last env steps, its last finite value (NaN: none)."""
    finite = curve.dropna()
    return int(curve.index.max()), float(finite.iloc[-1]) if len(finite) else np.nan


def _stopped_curves(configs: pd.DataFrame, curves: pd.DataFrame, column: str) -> list[tuple[str, str, pd.Series]]:
    """(config_id, status, its mean curve over seeds by env steps) of each pruned or diverged
    configuration of a lane study (none without a ``stopped`` column), from one groupby."""
    if "stopped" not in configs or not len(curves):
        return []
    ended = configs[configs.status.isin(["pruned", "diverged"])].set_index("config_id").status
    means = curves[curves.config_id.isin(ended.index)].groupby(["config_id", "env_steps"])[column].mean()
    return [(cid, ended[cid], curve.droplevel(0)) for cid, curve in means.groupby(level=0)]


def curves_plot(configs: pd.DataFrame, curves: pd.DataFrame, path: Path, objective: str = "final",
                policy: str = "greedy") -> Path | None:
    """The top configurations' evaluation curves (training return where a study has none)."""
    ranked = configs[configs["rank"].notna()].head(TOP)
    if not len(ranked) or not len(curves):
        return None
    column = "eval_return" if "eval_return" in curves and curves.eval_return.notna().any() else "episode_return"
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    stopped = _stopped_curves(configs, curves, column)
    for status, color, label in (("pruned", "grey", "stopped early (x: where)"),
                                 ("diverged", "tab:red", "diverged (x: where; at the bottom: no finite return)")):
        for i, (_, _, curve) in enumerate(c for c in stopped if c[1] == status):
            at, value = _mark(curve)
            ax.plot(curve.index.to_numpy(), curve.to_numpy(), color=color, alpha=0.35, linewidth=0.8, zorder=1)
            where = {} if np.isfinite(value) else {"transform": ax.get_xaxis_transform()}
            ax.scatter([at], [value if np.isfinite(value) else 0.02], marker="x", color=color, s=14, zorder=1,
                       label=label if i == 0 else None, **where)
    for cid in ranked.config_id:
        c = curves[curves.config_id == cid].pivot_table(index="seed", columns="env_steps",
                                                       values=column, dropna=False)
        steps, values = c.columns.to_numpy(), c.to_numpy(float)
        with np.errstate(all="ignore"):
            mean = np.nanmean(values, axis=0) if values.size else values
        lo, hi = _band(values)
        (line,) = ax.plot(steps, mean, label=f"{cid} (rank {int(ranked.set_index('config_id').loc[cid, 'rank'])})")
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set(xlabel="env steps per seed",
           ylabel=(f"evaluation return ({'deterministic' if policy == 'greedy' else 'sampled'})"
                   if column == "eval_return" else "training episode return"),
           title=f"top {len(ranked)} configurations, ranked by objective {objective!r}\n"
                 "mean over seeds, bootstrap 95% band")
    return _save(plt, fig, path, ax)


def params_plot(configs: pd.DataFrame, space: dict[str, str], metric: str, path: Path,
                objective: str = "final") -> Path | None:
    names = [n for n in space if n in configs.columns]
    if not names or not len(configs):
        return None
    plt = _pyplot()
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    scored = configs[configs[metric].notna() & ~configs.diverged]
    failed = configs[configs[metric].isna() | configs.diverged]
    lo, hi = (scored[metric].min(), scored[metric].max()) if len(scored) else (0.0, 1.0)
    floor = lo - 0.1 * (hi - lo + 1e-9)  # unscored configurations sit on a line below every score
    for ax, name in zip(axes.flat, names, strict=False):
        kind = space[name]
        x = scored[name].astype(str) if kind == "categorical" else scored[name]
        ax.scatter(x, scored[metric], s=18, alpha=0.8, label="scored")
        if len(failed):
            fx = failed[name].astype(str) if kind == "categorical" else failed[name]
            ax.scatter(fx, np.full(len(failed), floor), marker="x", color="grey", s=18,
                       label="pruned / diverged / failed (no score)")
        if kind == "log":
            from matplotlib.ticker import NullFormatter

            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(xlabel=name + (" (log)" if kind == "log" else ""), ylabel=f"{objective} ({metric})")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"configuration score (objective {objective!r}, {metric} over seeds) by hyperparameter")
    return _save(plt, fig, path)


def progress_plot(configs: pd.DataFrame, metric: str, maximize: bool, path: Path,
                  objective: str = "final") -> Path | None:
    scored = configs[configs[metric].notna() & ~configs.diverged]
    if not len(scored):
        return None
    per_trial = scored.groupby("trial")[metric].max() if maximize else scored.groupby("trial")[metric].min()
    trials = np.arange(int(configs.trial.max()) + 1)
    per_trial = per_trial.reindex(trials)
    best = (per_trial.cummax() if maximize else per_trial.cummin()).ffill()
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.scatter(trials, per_trial, s=16, alpha=0.6, label="best configuration of the trial")
    ax.step(trials, best, where="post", label="best so far")
    ax.set(xlabel="trial", ylabel=metric, title=f"best score over trials (objective {objective!r})")
    return _save(plt, fig, path, ax)


def importance_plot(imp: pd.DataFrame, path: Path) -> Path | None:
    """Horizontal bars: each hyperparameter's importance over all configurations, per evaluator."""
    rows = imp[imp["scope"] == "all"]
    if not len(rows):
        return None
    wide = rows.pivot(index="param", columns="evaluator", values="importance").fillna(0.0)
    wide = wide.loc[wide.mean(axis=1).sort_values().index]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.4 * len(wide)))
    height = 0.8 / len(wide.columns)
    for i, ev in enumerate(wide.columns):
        ax.barh(np.arange(len(wide)) + i * height, wide[ev], height=height, label=ev)
    ax.set_yticks(np.arange(len(wide)) + 0.4 - height / 2, wide.index)
    ax.set(xlabel="importance (normalised; sums to 1 per evaluator)",
           title=f"hyperparameter importance over {int(rows['configs'].iloc[0])} configurations")
    return _save(plt, fig, path, ax)


def ablation_plot(abl: pd.DataFrame, path: Path, objective: str = "final") -> Path | None:
    """The path as steps: the score after each switch with its 95% CI, from the default to the best."""
    if len(abl) < 2:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1 + 0.9 * len(abl)), 3.8))
    x = np.arange(len(abl))
    ax.step(x, abl["mean"], where="mid", color="tab:blue", alpha=0.5)
    ax.errorbar(x, abl["mean"], yerr=[abl["mean"] - abl["ci_low"], abl["ci_high"] - abl["mean"]],
                fmt="o", capsize=4, color="tab:blue", label="score after the switch (95% CI over seeds)")
    ax.set_xticks(x, [f"{p}\n{v}" if v else p for p, v in zip(abl["param"], abl["value"], strict=True)],
                  fontsize=8)
    ax.set(ylabel=f"score ({objective})", title="ablation path: default -> best, by each switch's gain alone")
    return _save(plt, fig, path, ax)


PAGE_STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table.board{border-collapse:collapse;font-size:13px}
.board td,.board th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}
.board td:first-child,.board th:first-child{text-align:left}
.scroll{overflow-x:auto;max-width:100%} .pair{display:flex;gap:2em;flex-wrap:wrap;align-items:flex-start}
.pair>div{flex:1 1 420px;min-width:0} img{max-width:100%}
pre.cmd{background:#f6f6f6;padding:.8em;font-size:12px;white-space:pre-wrap;word-break:break-all;user-select:all}
.files a{margin-right:.8em}"""


def _fmt(v: Any) -> str:
    """A table cell: floats to 4 significant digits, missing values (None, NaN) blank."""
    if v is None or isinstance(v, float) and math.isnan(v):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<div class='scroll'><table class='board'><tr>{head}</tr>{body}</table></div>"


def _answer_html(best: dict[str, Any] | None) -> str:
    """The best configuration as a short table beside the default's values, its command, tuned vs default."""
    if not best:
        return "<p>No configuration has been scored yet.</p>"
    r = best.get("reevaluation") or {}
    default = ((best.get("tuned_vs_default") or {}).get("default") or {}).get("params", {})
    score = (f"re-evaluated {r['mean']:.4g} (95% CI {r['ci95'][0]:.4g} .. {r['ci95'][1]:.4g}) on "
             f"{r['seeds']} fresh seeds" if r.get("mean") is not None and r.get("ci95") else
             f"search score {_fmt(best.get('search_score'))}")
    rows = [[k, v, default.get(k, "")] for k, v in sorted(best.get("params", {}).items())]
    command = (best.get("reproduce") or {}).get("command")
    return (f"<p><b>{html.escape(best['config_id'])}</b>: {score}. Ranked by "
            f"{html.escape(best.get('ranked_by', ''))}.</p>"
            + _table(["hyperparameter", "best", "default"], rows)
            + (f"<p>Train it again:</p><pre class='cmd'>{html.escape(command)}</pre>" if command else "")
            + _control_html(best))


def _mattered_html(images: dict[str, Path], ablation: pd.DataFrame | None, importance: pd.DataFrame | None) -> str:
    """The ablation path as a table beside its plot, then the importance beside its plot."""
    parts = []
    if ablation is not None and len(ablation) >= 2:
        rows = [[r.param, r.value, r.mean, r.gain,
                 None if pd.isna(r.gain_ci_low) else f"{r.gain_ci_low:+.3g} .. {r.gain_ci_high:+.3g}", r.seeds]
                for r in ablation.itertuples()]
        parts.append("<h3>Ablation path: default to best, one switch at a time</h3><div class='pair'><div>"
                     + _table(["switch", "to", "score", "gain", "gain 95% CI", "seeds"], rows) + "</div>"
                     + (f"<div><img src='{images['ablation'].name}' alt='ablation path'></div>"
                        if "ablation" in images else "") + "</div>")
    if importance is not None and len(imp := importance[importance["scope"] == "all"]):
        wide = imp.pivot(index="param", columns="evaluator", values="importance")
        wide = wide.loc[wide.mean(axis=1).sort_values(ascending=False).index]
        rows = [[param, *vals] for param, vals in zip(wide.index, wide.to_numpy().tolist(), strict=True)]
        n = int(imp["configs"].max())
        parts.append(f"<h3>Importance ({n} configurations)</h3><div class='pair'><div>"
                     + _table(["hyperparameter", *wide.columns], rows) + "</div>"
                     + (f"<div><img src='{images['importance'].name}' alt='importance'></div>"
                        if "importance" in images else "") + "</div>")
    return "".join(parts) or (
        "<p>No ablation path or importance yet (too few configurations, or --no-ablation).</p>")


LEADERBOARD = ["rank", "config_id", "status"]  # then the searched hyperparameters, then these scores
SCORES = ["mean", "ci_low", "ci_high", "seeds", "env_steps"]


def index_html(folder: ResultsFolder, meta: StudyMeta, configs: pd.DataFrame, images: list[Path],
               best: dict[str, Any] | None, ablation: pd.DataFrame | None = None,
               importance: pd.DataFrame | None = None) -> Path:
    """reports/index.html: the answer first, then what mattered, then the leaderboard and the plots;
    the raw records as links."""
    by_stem = {p.stem: p for p in images}
    cols = [c for c in [*LEADERBOARD, *meta.space, *SCORES] if c in configs.columns]
    top = configs.head(20)[cols]
    board = _table(cols, top.to_numpy().tolist())
    plots = "\n".join(f'<p><img src="{p.name}" alt="{p.stem}"></p>' for p in images
                      if p.stem not in ("ablation", "importance"))
    files = " ".join(f'<a href="{n}">{n}</a>' for n in ("best.json", "configs.csv", "seeds.csv", "curves.csv",
                                                        "final.csv", "importance.csv", "ablation.csv")
                     if folder.report(n).exists() or n == "best.json" and best)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(meta.study)}: rl-harness report</title>
<style>{PAGE_STYLE}</style></head>
<body><h1>{html.escape(meta.study)}</h1>
<p>{html.escape(meta.env)} / {html.escape(meta.algo)}; budget
{html.escape(", ".join(f"{k} {v}" for k, v in meta.budget.items()))}.</p>
<h2>The answer</h2>{_answer_html(best)}
<h2>What mattered</h2>{_mattered_html(by_stem, ablation, importance)}
<h2>Leaderboard (top 20 of {len(configs)})</h2>{board}
<h2>Plots</h2>{plots}
<p class="files">Records: {files}</p>
</body></html>
"""
    path = folder.report("index.html")
    path.write_text(page)
    return path


def pbt_plot(configs: pd.DataFrame, pbt: pd.DataFrame, path: Path) -> Path | None:
    """The lineage and hyperparameter schedules of the PBT trial holding the best configuration:
    one line per configuration, an arrow where it copied another; then each perturbed
    hyperparameter's value over chunks."""
    ranked = configs[configs["rank"].notna() & configs.trial.isin(pbt.trial.unique())]
    if not len(ranked):
        return None
    trial = int(ranked.iloc[0].trial)
    t = pbt[pbt.trial == trial]
    names = [c for c in t.columns if c not in ("trial", "chunk", "config_id", "source", "copied", "fitness")
             and t[c].nunique() > 1]
    plt = _pyplot()
    cols = min(3, 1 + len(names))
    rows = math.ceil((1 + len(names)) / cols)
    fig, grid = plt.subplots(rows, cols, figsize=(4.8 * cols, 3.4 * rows), squeeze=False)
    axes = list(grid.flat)
    ids = sorted(t.config_id.unique())
    y = {cid: i for i, cid in enumerate(ids)}
    chunks = sorted(t.chunk.unique())
    last = chunks[-1] + (chunks[-1] - chunks[-2] if len(chunks) > 1 else 1)  # one interval past the last step
    best = ranked.iloc[0].config_id
    ax = axes[0]
    for cid in ids:
        ax.plot([0, last], [y[cid], y[cid]], color=f"C{y[cid] % 10}", lw=3 if cid == best else 1,
                label=f"best: {best}" if cid == best else None)
    for row in t[t.copied].itertuples():
        ax.annotate("", xy=(row.chunk, y[row.config_id]), xytext=(row.chunk, y[row.source]),
                    arrowprops=dict(arrowstyle="->", color="black", lw=1))
    ax.set(xlabel="chunk", ylabel="configuration", yticks=range(len(ids)), title=f"trial {trial}: who copied whom")
    ax.set_yticklabels(ids, fontsize=6)
    for ax, name in zip(axes[1:], names, strict=False):
        for cid, g in t.groupby("config_id"):
            g = g.sort_values("chunk")
            ax.step(list(g.chunk) + [last], list(g[name]) + [g[name].iloc[-1]], where="post",
                    color=f"C{y[cid] % 10}", lw=2.5 if cid == best else 1, alpha=1 if cid == best else 0.6)
        if (t[name] > 0).all() and t[name].max() / t[name].min() > 5:
            ax.set_yscale("log")
        ax.set(xlabel="chunk", ylabel=name, title=f"{name} per configuration (best bold)")
    for ax in axes[1 + len(names):]:
        ax.axis("off")
    axes[0].legend(fontsize=7)
    return _save(plt, fig, path)


def _control_html(best: dict[str, Any]) -> str:
    """The tuned-vs-default table of index.html ("" without a control)."""
    t = best.get("tuned_vs_default")
    if not t:
        return ""

    def cell(x: dict[str, Any]) -> str:
        if x.get("mean") is None:
            return "no score"
        return f"{x['mean']:.4g} (95% CI {x['ci95'][0]:.4g} .. {x['ci95'][1]:.4g})"

    d = t["difference"]
    verdict = ("Tuning helps: the paired difference's 95% CI excludes 0." if t["better"] else
               "The default is better: the paired difference's 95% CI excludes 0 the other way."
               if t.get("worse") else "No clear difference: the paired difference's 95% CI includes 0.")
    diff = "" if d["mean"] is None else f"{d['mean']:+.4g} (95% CI {d['ci95'][0]:+.4g} .. {d['ci95'][1]:+.4g})"
    if r := t.get("above_reference"):
        times = "" if r["ratio"] is None else f": {r['ratio']:.2g}x"
        verdict += (f" Above {html.escape(r['label'])} ({r['return']:.4g}): tuned {r['tuned']:.4g}, "
                    f"default {r['default']:.4g}{times}.")
    return (f"<h3>Tuned vs default (same fresh seeds)</h3><table class='board'><tr><th></th><th>configuration"
            f"</th><th>score</th></tr><tr><td>tuned</td><td>{html.escape(t['tuned']['config_id'])}</td>"
            f"<td>{cell(t['tuned'])}</td></tr><tr><td>default</td><td>the defaults above</td>"
            f"<td>{cell(t['default'])}</td></tr><tr><td>paired difference</td><td>{d['paired_seeds']} seeds</td>"
            f"<td>{diff}</td></tr></table><p>{verdict}</p>")


def build(folder: ResultsFolder, meta: StudyMeta, configs: pd.DataFrame, curves: pd.DataFrame,
          best: dict[str, Any] | None, pbt: pd.DataFrame | None = None, importance: pd.DataFrame | None = None,
          ablation: pd.DataFrame | None = None) -> dict[str, Path]:
    """Writes the plots and index.html under the folder's ``reports/``; returns their paths (no
    plots for a study with no record yet: its page says nothing has been scored)."""
    metric, objective = meta.metric, meta.objective
    made = [] if not len(configs) else [
        curves_plot(configs, curves, folder.report("curves.png"), objective, meta.eval_policy),
        params_plot(configs, meta.space, metric, folder.report("params.png"), objective),
        progress_plot(configs, metric, meta.maximize, folder.report("progress.png"), objective),
        pbt_plot(configs, pbt, folder.report("pbt.png")) if pbt is not None else None,
        importance_plot(importance, folder.report("importance.png")) if importance is not None else None,
        ablation_plot(ablation, folder.report("ablation.png"), objective) if ablation is not None else None]
    images = [p for p in made if p is not None]
    paths = {p.stem + "_png": p for p in images}
    paths["index"] = index_html(folder, meta, configs, images, best, ablation, importance)
    return paths
