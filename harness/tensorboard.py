"""TensorBoard logs per configuration (not only per Tune trial), rebuilt from the tables.

    tensorboard --logdir results/NAME/tensorboard

Each configuration is a run named by its id with its training-return curve (``return/mean``
over seeds and ``return/seed_K`` per seed, against env steps per seed) and its hyperparameters
with its score, so the HPARAMS tab compares every configuration of the study.
"""

from __future__ import annotations

import math
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


def write(root: Path, configs: pd.DataFrame, curves: pd.DataFrame, searched: list[str]) -> Path:
    """Writes ``root/tensorboard/<config id>/`` for every configuration (the folder is rebuilt)."""
    from tensorboardX import SummaryWriter
    from tensorboardX.summary import hparams as hparams_summaries

    out = root / "tensorboard"
    shutil.rmtree(out, ignore_errors=True)
    by_config = dict(tuple(curves.groupby("config_id"))) if len(curves) else {}
    for row in configs.to_dict("records"):
        cid = row["config_id"]
        with SummaryWriter(logdir=str(out / cid)) as w:
            c = by_config.get(cid)
            if c is not None:
                for steps, g in c.groupby("env_steps"):
                    values = g.episode_return.to_numpy(float)
                    if np.isfinite(values).any():
                        w.add_scalar("return/mean", float(np.nanmean(values)), int(steps))
                    for seed, v in zip(g.seed, values, strict=True):
                        if math.isfinite(v):
                            w.add_scalar(f"return/seed_{seed}", float(v), int(steps))
            hparams = {n: _hparam(row[n]) for n in searched if n in row and not pd.isna(row[n])}
            hparams.update(status=str(row["status"]), diverged=bool(row["diverged"]))
            metrics = {f"score/{k}": float(row[k]) for k in ("mean", "iqm", "ci_low", "ci_high")
                       if not pd.isna(row[k])}  # unscored (pruned, diverged) configs: no metrics
            for summary in hparams_summaries(hparams, metrics):  # the HPARAMS tab's session, this run
                w.file_writer.add_summary(summary)
            for k, v in metrics.items():
                w.add_scalar(k, v, 0)
    return out
