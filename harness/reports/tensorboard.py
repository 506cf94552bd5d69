"""TensorBoard logs per configuration (not only per Tune trial), rebuilt from the tables.

    tensorboard --logdir results/NAME/tensorboard

Each configuration is a run named by its id with its training-return curve (``return/mean``
over seeds, against env steps per seed) and its hyperparameters with its score, so the HPARAMS
tab compares every configuration of the study; the ``PER_SEED`` best configurations also get a
curve per seed (``return/seed_K``): per-seed curves for every configuration of a GPU study are
slow to write (bench/RESULTS.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def _hparam(value: Any) -> bool | str | float | int:
    if isinstance(value, bool | str | int):
        return value
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value)
    return str(value)


PER_SEED = 10  # best configurations whose seeds get a curve each


def write(out: Path, configs: pd.DataFrame, curves: pd.DataFrame, searched: list[str]) -> Path:
    """Writes ``out/<config id>/`` (a study's ``tensorboard/``) for every configuration (the folder
    is rebuilt); ``configs`` is ranked (best first)."""
    from tensorboardX import SummaryWriter
    from tensorboardX.summary import hparams as hparams_summaries

    shutil.rmtree(out, ignore_errors=True)
    finite = curves[np.isfinite(curves.episode_return.to_numpy(float))] if len(curves) else curves
    means = {cid: (g.env_steps.to_numpy(), g.episode_return.to_numpy(float)) for cid, g in
             finite.groupby(["config_id", "env_steps"], as_index=False).episode_return.mean().groupby("config_id")}
    top = set(configs.config_id.head(PER_SEED))
    per_seed = dict(tuple(finite[finite.config_id.isin(top)].groupby("config_id"))) if len(finite) else {}
    for row in configs.to_dict("records"):
        cid = row["config_id"]
        with SummaryWriter(logdir=str(out / cid)) as w:
            for steps, value in zip(*means.get(cid, ((), ())), strict=True):
                w.add_scalar("return/mean", float(value), int(steps))
            if cid in per_seed:
                g = per_seed[cid]
                for seed, steps, value in zip(g.seed, g.env_steps, g.episode_return, strict=True):
                    w.add_scalar(f"return/seed_{seed}", float(value), int(steps))
            hparams = {n: _hparam(row[n]) for n in searched if n in row and not pd.isna(row[n])}
            hparams.update(status=str(row["status"]), diverged=bool(row["diverged"]))
            metrics = {f"score/{k}": float(row[k]) for k in ("mean", "iqm", "ci_low", "ci_high")
                       if not pd.isna(row[k])}  # unscored (pruned, diverged) configs: no metrics
            for summary in hparams_summaries(hparams, metrics):  # the HPARAMS tab's session, this run
                w.file_writer.add_summary(summary)
            for k, v in metrics.items():
                w.add_scalar(k, v, 0)
    return out
