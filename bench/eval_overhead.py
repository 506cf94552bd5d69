"""What the evaluation after every chunk costs: a study's trial kernel with and without it.

    python bench/eval_overhead.py                          # cartpole_ppo and cartpole_sac, CPU budget shape
    python bench/eval_overhead.py --studies dungeon_ppo --chunks 3

Runs the same trial (the study's static config, C configurations x S seeds of its CPU budget)
twice in one process: ``curve_episodes=0`` (training only, what a study ran before objectives
existed) and the study's own ``curve_episodes`` (training, then a deterministic evaluation after
each chunk, in the same compiled call). Compile time is excluded; the closing line is the ratio of
kernel times, evaluated / training only (1.00 means the evaluations are free).
"""

from __future__ import annotations

import argparse
import dataclasses

import _common  # noqa: F401  (XLA flag before JAX starts)
import numpy as np

import studies
from harness.kernel.plan import TrialPlan
from harness.kernel.runners import TrialRunner
from harness.space import static_points


def kernel_seconds(plan: TrialPlan, chunks: int) -> tuple[float, float]:
    """(seconds of ``chunks`` chunks after the first, mean evaluation return at the end)."""
    runner = TrialRunner(plan)
    report = runner.chunk()  # compiles
    for _ in range(chunks):
        if runner.done:
            break
        report = runner.chunk()
    return runner.kernel_s, float(np.nanmean(report.evals))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--studies", nargs="+", default=["cartpole_ppo", "cartpole_sac"])
    p.add_argument("--chunks", type=int, default=10, help="chunks timed per run (after the compiling one)")
    args = p.parse_args()
    import algos

    ratios = []
    print(f"{'study':14} {'C x S':>6} {'episodes':>8} {'train_s':>8} {'train+eval_s':>12} {'ratio':>6}")
    for name in args.studies:
        study = studies.get(name)
        spec = algos.get(study.algo)
        fields = {f.name for f in dataclasses.fields(spec.config_cls)}
        point = next(iter(static_points(study, fields)))
        budget = study.cpu
        plan = TrialPlan(env=study.env, algo=study.algo, seeds=budget.seeds, trial=0,
                         config={**study.config, **point, "total_timesteps": budget.timesteps},
                         hparams=[dict(study.hparams)] * budget.configs_per_trial,
                         objective="final", curve_episodes=0)
        bare, _ = kernel_seconds(plan, args.chunks)
        evaluated, _ = kernel_seconds(dataclasses.replace(plan, curve_episodes=study.curve_episodes), args.chunks)
        ratios.append(evaluated / bare)
        print(f"{name:14} {budget.configs_per_trial:>2} x {budget.seeds:<2} {study.curve_episodes:>8} "
              f"{bare:>8.2f} {evaluated:>12.2f} {evaluated / bare:>6.2f}", flush=True)
    print(f"ratio kernel time evaluated/train-only: {max(ratios):.2f} (worst of {len(ratios)})")


if __name__ == "__main__":
    main()
