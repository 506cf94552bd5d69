"""Report building at a GPU study's size: per-seed TensorBoard curves for every configuration
(what the harness wrote before) against per-seed curves for the best 10 only, same records.

    python bench/report_scale.py [--trials 16 --configs 64 --seeds 16 --chunks 98]

The defaults are cartpole_ppo's GPU budget (16 trials x 64 configs x 16 seeds, 500k steps in
chunks of 10 updates of 512 steps: 98 chunks): 1,024 configurations, 1.6M curve points. Writes a
synthetic results folder of that size (random scores and curves), then times the tables (what
runs after every trial), the plots, and TensorBoard both ways. The last line is the ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from harness import report
from harness.reports import plots, tensorboard
from harness.store.folder import ResultsFolder
from harness.store.records import write_json

SPACE = {"lr": "log", "gamma": "uniform", "gae_lambda": "uniform", "clip_eps": "uniform", "ent_coef": "log"}


def write_study(folder: ResultsFolder, trials: int, configs: int, seeds: int, chunks: int) -> None:
    rng = np.random.default_rng(0)
    write_json(folder.study_file, {"study": "bench", "direction": "maximize", "metric": "mean", "space": SPACE})
    for t in range(trials):
        params = [{k: float(rng.uniform(0.01, 1)) for k in SPACE} for _ in range(configs)]
        write_json(folder.trial_file(t), {
            "trial": t, "tune_trial_id": f"x{t}", "status": "complete", "metric": "mean", "seeds": seeds,
            "static": {"total_timesteps": 5120 * chunks}, "env_steps": 5120 * chunks,
            "configs": [{"index": i, "optuna_number": t * configs + i, "params": p, "hparams": p, "pruned": False,
                         "scores": np.round(rng.uniform(0, 500, seeds), 2).tolist(), "diverged": [False] * seeds}
                        for i, p in enumerate(params)],
            "curves": [{"chunk": k + 1, "env_steps": 5120 * (k + 1),
                        "returns": np.round(rng.uniform(10, 500, (configs, seeds)), 2).tolist()}
                       for k in range(chunks)]})


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--configs", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=98)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        folder = ResultsFolder(Path(d))
        write_study(folder, a.trials, a.configs, a.seeds, a.chunks)
        (configs, _, curves), t_tables = timed(lambda: report.tables(folder))
        _, t_small = timed(lambda: report.build(folder, plots=False))
        best = report._jsonable(report.best(folder, configs))
        meta = folder.meta()
        _, t_plots = timed(lambda: plots.build(folder, meta, configs, curves, best))
        searched = list(meta.space)
        _, t_tb_top = timed(lambda: tensorboard.write(folder.tensorboard_dir, configs, curves, searched))
        tensorboard.PER_SEED = len(configs)  # the old behaviour: every configuration's seeds
        _, t_tb_all = timed(lambda: tensorboard.write(folder.tensorboard_dir, configs, curves, searched))
    print(f"{len(configs):,} configurations, {len(curves):,} curve points")
    print(f"tables {t_tables:.1f}s; configs/seeds/best after a trial {t_small:.1f}s; plots {t_plots:.1f}s")
    print(f"tensorboard, per-seed curves for every configuration (before): {t_tb_all:.1f}s")
    print(f"tensorboard, per-seed curves for the best {min(10, len(configs))} (now): {t_tb_top:.1f}s")
    print(f"ratio tensorboard before/now: {t_tb_all / t_tb_top:.2f}")


if __name__ == "__main__":
    main()
