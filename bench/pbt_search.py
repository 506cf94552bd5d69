"""Population-based training in the kernel against TPE search and Ray Tune's PBT, at equal env steps.

    python bench/pbt_search.py [--env cartpole|dungeon] [--population 16] [--seeds 2] [--timesteps 40960]
                               [--interval 2] [--methods kernel-pbt,tpe,tune-pbt]

PPO's traced hyperparameters as ``cartpole_ppo`` and ``dungeon_ppo`` search them (lr, gamma, GAE
lambda, clip, entropy and value coefficients), on CartPole-v1 (4 minibatches) or DungeonCrawl-v1
(``dungeon_ppo``'s network, masks and sampled evaluation), objective ``final`` (the evaluation
after the last chunk, mean over seeds), N configurations x S seeds x T env steps in each of:

- ``kernel-pbt``: ``harness.study --scheduler pbt``, two trials of N/2 configurations (two
  populations, one kernel each, one per core as TPE's concurrent trials); every ``interval`` chunks
  the worst quarter of each copies its best quarter and perturbs.
- ``tpe``: ``harness.study --scheduler none``, N/4 trials of 4 configurations, Optuna's TPE
  proposing between trials.
- ``tune-pbt``: Ray Tune's ``PopulationBasedTraining`` over the same space, N Tune trials of one
  configuration (our kernel, S seeds), exploiting through checkpoints on disk every ``interval``
  chunks (Tune perturbs by x0.8/x1.2 or resamples).

Each prints the best configuration's score (on the evaluation seeds) and the wall time from
start to the last result, Ray's start included, no re-training; the closing line is the ratio
of wall times, and the scores say whether the speed cost anything.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (XLA flag before JAX starts)
import numpy as np

from harness.cluster.session import usable_cores

STATIC = dict(num_envs=4, num_steps=128, update_epochs=4, updates_per_chunk=10, num_minibatches=4)
ENVS = ("cartpole", "dungeon")


def target(name: str) -> tuple[str, dict[str, Any]]:
    """The env and its static config: CartPole with ``STATIC``, the dungeon as ``dungeon_ppo`` has it."""
    if name == "cartpole":
        return "CartPole-v1", STATIC
    import studies

    study = studies.get("dungeon_ppo")
    return study.env, study.config


def study_file(folder: Path, args: argparse.Namespace) -> Path:
    env, static = target(args.env)
    path = folder / "pbt_bench.py"
    path.write_text(textwrap.dedent(f"""
        from harness.space import PBT, Budget, Study, Uniform
        from studies._spaces import PPO

        _B = Budget(trials=1, configs_per_trial=4, seeds={args.seeds}, timesteps={args.timesteps})
        STUDY = Study(name="pbt_bench", description="PBT benchmark", env={env!r}, algo="ppo",
                      config={static!r}, space=dict(**PPO, vf_coef=Uniform(0.25, 1.0)), objective="final",
                      top_k=0, pbt=PBT(interval={args.interval}), cpu=_B, gpu=_B, smoke=_B)
    """))
    return path


def harness_study(path: Path, out: Path, scheduler: str, trials: int, configs: int,
                  args: argparse.Namespace) -> dict:
    """Runs the study file through ``python -m harness.study``; its best score and wall time."""
    cmd = [sys.executable, "-m", "harness.study", str(path), "--scheduler", scheduler, "--trials", str(trials),
           "--configs-per-trial", str(configs), "--seeds", str(args.seeds), "--timesteps", str(args.timesteps),
           "--out", str(out)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    import pandas as pd

    configs_csv = pd.read_csv(out / "pbt_bench" / "reports" / "configs.csv")
    return dict(score=float(configs_csv["mean"].max()), wall_s=wall,
                configs=int(configs_csv["mean"].notna().sum()))


def _tune_trainable() -> type:
    from ray import tune

    from harness.kernel.plan import TrialPlan
    from harness.kernel.runners import TrialRunner

    class OneConfig(tune.Trainable):
        """One configuration x S seeds of our kernel, a chunk per step, its state checkpointed."""

        def setup(self, config: dict[str, Any]) -> None:
            from harness.cluster.trainable import setup_process

            setup_process({"pin_cores": True, "cpus": 1})
            self.plan = TrialPlan(env=config["env"], algo="ppo", config=config["static"], seeds=config["seeds"],
                                  hparams=[{k: float(config[k]) for k in config["names"]}], trial=config["index"],
                                  objective="final", curve_episodes=4)
            self.runner = TrialRunner(self.plan)

        def reset_config(self, new_config: dict[str, Any]) -> bool:
            self.setup(new_config)
            return True

        def step(self) -> dict[str, Any]:
            r = self.runner.chunk()
            out = {"score": float(np.nanmean(r.evals)), "env_steps": r.env_steps}
            if self.runner.done:
                res = self.runner.finish()
                out.update(final=float(np.nanmean(res.final_returns)), done=True)
            return out

        def save_checkpoint(self, checkpoint_dir: str) -> None:
            with open(os.path.join(checkpoint_dir, "state.pkl"), "wb") as f:
                pickle.dump({"state": self.runner.states[0], "curves": self.runner.curves,
                             "steps": self.runner.steps}, f)

        def load_checkpoint(self, checkpoint_dir: str) -> None:
            with open(os.path.join(checkpoint_dir, "state.pkl"), "rb") as f:
                saved = pickle.load(f)
            self.runner.states[0], self.runner.curves, self.runner.steps = (saved["state"], saved["curves"],
                                                                            saved["steps"])

    return OneConfig


def tune_pbt(out: Path, args: argparse.Namespace) -> dict:
    """Ray Tune's PopulationBasedTraining over the same space, local Ray on 127.0.0.1."""
    t0 = time.perf_counter()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    from harness.space import LogUniform, Uniform
    from studies._spaces import PPO

    space = {**PPO, "vf_coef": Uniform(0.25, 1.0)}
    env, static = target(args.env)

    def dist(d: Any) -> Any:
        return tune.loguniform(d.low, d.high) if isinstance(d, LogUniform) else tune.uniform(d.low, d.high)

    ray.init(num_cpus=usable_cores(), include_dashboard=False, _node_ip_address="127.0.0.1",
             configure_logging=False, log_to_driver=False)
    try:
        pbt = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=args.interval,
                                      hyperparam_mutations={k: dist(d) for k, d in space.items()})
        rng = np.random.default_rng(0)
        tuner = tune.Tuner(
            tune.with_resources(_tune_trainable(), {"cpu": 1}),
            param_space={"env": env, "static": {**static, "total_timesteps": args.timesteps}, "seeds": args.seeds,
                         "names": list(space), "index": tune.sample_from(lambda _: int(rng.integers(1 << 30))),
                         **{k: dist(d) for k, d in space.items()}},
            tune_config=tune.TuneConfig(scheduler=pbt, metric="score", mode="max", num_samples=args.population,
                                        reuse_actors=True),
            run_config=tune.RunConfig(storage_path=str(out), name="tune_pbt", verbose=0,
                                      checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0)))
        grid = tuner.fit()
        finals = [r.metrics.get("final") for r in grid if r.metrics and r.metrics.get("final") is not None]
    finally:
        ray.shutdown()
    finite = [f for f in finals if np.isfinite(f)]  # Tune's x1.2 mutations are not clipped: some diverge
    return dict(score=float(max(finite)) if finite else float("nan"), wall_s=time.perf_counter() - t0,
                configs=len(finite))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=ENVS, default="cartpole")
    p.add_argument("--population", type=int, default=16, help="configurations N (a multiple of 8)")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--timesteps", type=int, default=40_960,
                   help="env steps per seed (a chunk: 5,120 on CartPole, 20,480 in the dungeon)")
    p.add_argument("--interval", type=int, default=2, help="chunks between exploit steps")
    p.add_argument("--methods", default="kernel-pbt,tpe,tune-pbt",
                   help="which of kernel-pbt, tpe, tune-pbt (kernel-pbt and tune-pbt always)")
    args = p.parse_args()
    methods = set(args.methods.split(",")) | {"kernel-pbt", "tune-pbt"}
    if methods - {"kernel-pbt", "tpe", "tune-pbt"}:
        raise SystemExit(f"--methods: unknown {sorted(methods - {'kernel-pbt', 'tpe', 'tune-pbt'})}; "
                         "choose from kernel-pbt, tpe, tune-pbt")
    if args.population % 8:
        raise SystemExit("--population must be a multiple of 8 (two populations of which a quarter is replaced)")
    rows = {}
    with tempfile.TemporaryDirectory(prefix="pbt-bench-") as tmp:
        folder = Path(tmp)
        path = study_file(folder, args)
        rows["kernel-pbt"] = harness_study(path, folder / "a", "pbt", 2, args.population // 2, args)
        print("kernel-pbt", json.dumps(rows["kernel-pbt"]), flush=True)
        if "tpe" in methods:
            rows["tpe"] = harness_study(path, folder / "b", "none", args.population // 4, 4, args)
            print("tpe", json.dumps(rows["tpe"]), flush=True)
        rows["tune-pbt"] = tune_pbt(folder / "c", args)
        print("tune-pbt", json.dumps(rows["tune-pbt"]), flush=True)
    steps = args.population * args.seeds * args.timesteps
    print(f"{target(args.env)[0]} PPO, {args.population} configurations x {args.seeds} seeds x "
          f"{args.timesteps:,} steps ({steps:,} env steps each), exploit every {args.interval} chunks")
    print(f"{'method':11} {'best score':>10} {'wall_s':>8} {'configs scored':>15}")
    for name, r in rows.items():
        print(f"{name:11} {r['score']:>10.1f} {r['wall_s']:>8.1f} {r['configs']:>15}")
    ratio = {name: r["wall_s"] / rows["kernel-pbt"]["wall_s"] for name, r in rows.items()}
    tpe = f"; tpe/kernel-pbt: {ratio['tpe']:.2f}" if "tpe" in ratio else ""
    print(f"ratio wall time tune-pbt/kernel-pbt: {ratio['tune-pbt']:.2f}{tpe}")


if __name__ == "__main__":
    main()
