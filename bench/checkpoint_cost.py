"""What mid-run checkpoints cost: a study's trial kernel with and without a checkpoint after every chunk.

    python bench/checkpoint_cost.py                               # cartpole_ppo, pendulum_sac; CPU budget shape
    python bench/checkpoint_cost.py --studies pendulum_sac --budget gpu --chunks 2

Runs the same trial (the study's static config, C configurations x S seeds of the chosen budget)
twice in one process, alternating chunk by chunk: bare, and with what a trial does at a
checkpoint (``TrialRunner.snapshot``, written and fsynced as ``kernel.msgpack``, then copied once
more as Tune does when it persists a checkpoint to the study's folder). Prints the snapshot size,
seconds per checkpoint, the wall-time ratio with a checkpoint after every chunk (the worst case),
and the share of a trial's time at the default interval (a checkpoint every 60 s, stretched to
20 x its cost): the promise is at most 5%.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
import time

import _common  # noqa: F401  (XLA flag before JAX starts)

import studies
from harness.cluster.trainable import CHECKPOINT_SECONDS
from harness.kernel.plan import TrialPlan
from harness.kernel.runners import TrialRunner
from harness.space import static_points
from harness.store.folder import KERNEL_FILE
from harness.store.records import write_bytes


def checkpoint(runner: TrialRunner, folder: str) -> tuple[float, int]:
    """One checkpoint as a trial takes it; (seconds, bytes)."""
    t = time.perf_counter()
    os.makedirs(os.path.join(folder, "actor"), exist_ok=True)
    path = os.path.join(folder, "actor", KERNEL_FILE)
    write_bytes(path, runner.snapshot())
    shutil.copytree(os.path.join(folder, "actor"), os.path.join(folder, "persisted"), dirs_exist_ok=True)
    return time.perf_counter() - t, os.path.getsize(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--studies", nargs="+", default=["cartpole_ppo", "pendulum_sac"])
    p.add_argument("--budget", choices=("cpu", "gpu"), default="cpu", help="the trial shape (default: cpu)")
    p.add_argument("--chunks", type=int, default=4, help="chunks timed per run (after the compiling one)")
    args = p.parse_args()
    import algos

    worst, shares = [], []
    print(f"{'study':14} {'C x S':>7} {'chunk_s':>8} {'snap_MB':>8} {'ckpt_s':>7} {'every-chunk':>11} "
          f"{'default':>8}")
    for name in args.studies:
        study = studies.get(name)
        spec = algos.get(study.algo)
        fields = {f.name for f in dataclasses.fields(spec.config_cls)}
        point = next(iter(static_points(study, fields)))
        budget = getattr(study, args.budget)
        plan = TrialPlan(env=study.env, algo=study.algo, seeds=budget.seeds, trial=0,
                         config={**study.config, **point, "total_timesteps": budget.timesteps},
                         hparams=[dict(study.hparams)] * budget.configs_per_trial,
                         objective=study.objective, threshold=study.threshold, curve_episodes=study.curve_episodes)
        bare, saved = TrialRunner(plan), TrialRunner(plan)
        bare.chunk(), saved.chunk()  # compile (the second runner reuses the compiled chunk)
        chunk_s, ckpt_s, size, n = 0.0, 0.0, 0, 0
        with tempfile.TemporaryDirectory() as folder:
            for _ in range(args.chunks):
                if bare.done:
                    break
                t = time.perf_counter()
                bare.chunk()
                chunk_s += time.perf_counter() - t
                saved.chunk()
                dt, size = checkpoint(saved, folder)
                ckpt_s += dt
                n += 1
        chunk_s, ckpt_s = chunk_s / n, ckpt_s / n
        ratio = (chunk_s + ckpt_s) / chunk_s
        share = ckpt_s / (max(CHECKPOINT_SECONDS, 20 * ckpt_s) + ckpt_s)  # one checkpoint per interval
        worst.append(ratio)
        shares.append(share)
        print(f"{name:14} {budget.configs_per_trial:>3} x {budget.seeds:<3} {chunk_s:>8.3f} {size / 2**20:>8.2f} "
              f"{ckpt_s:>7.3f} {ratio:>10.3f}x {100 * share:>7.2f}%", flush=True)
    print(f"ratio wall time checkpoint-every-chunk/bare: {' '.join(f'{r:.3f}' for r in worst)}")
    print(f"checkpoint share of trial time at the default interval ({CHECKPOINT_SECONDS:.0f} s): "
          f"{' '.join(f'{100 * s:.2f}%' for s in shares)} (promise: <= 5%)")


if __name__ == "__main__":
    main()
