"""Study throughput: our harness vs a naive Ray Tune + OptunaSearch study, same budget, one run.

    python bench/study_throughput.py [--configs 16 --seeds 2 --timesteps 200000] [--no-warm]

Both search PPO on CartPole-v1 over the same hyperparameters for CONFIGS x SEEDS (configuration,
seed) evaluations of TIMESTEPS env steps each:
- us: `python -m harness.study` (C configs x S seeds per kernel, actor reuse, pinned cores), no
  ASHA and no final re-training, so the work is the same; run twice: with the persistent
  compilation cache empty (a first study on a machine) and warm (any later study; --no-warm
  skips this second run, as the suite's tiny run does);
- naive: one (configuration, seed) per Tune trial, OptunaSearch, default Tune settings.
Prints evaluations per minute for each, the ratio, and our overhead share: wall time outside
compiled chunks / (wall time x concurrent trials), from the trials' own kernel timers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.cluster.session import usable_cores

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SPACE = dict(lr=(1e-4, 3e-3, True), gamma=(0.95, 0.999, False), gae_lambda=(0.8, 0.99, False),
             clip_eps=(0.1, 0.3, False), ent_coef=(1e-4, 3e-2, True), vf_coef=(0.25, 1.0, False))


def run_ours(configs: int, seeds: int, timesteps: int, per_trial: int, tmp: Path, name: str) -> dict:
    space = ", ".join(f"{k}={'LogUniform' if log else 'Uniform'}({lo}, {hi})"
                      for k, (lo, hi, log) in SPACE.items())
    budget = f"Budget({configs // per_trial}, {per_trial}, {seeds}, {timesteps})"
    (tmp / "bench_ppo.py").write_text(
        "from harness.space import *\n"
        f"STUDY = Study(name='bench_ppo', description='bench', env='CartPole-v1', algo='ppo',\n"
        f"    config=dict(num_minibatches=4), space=dict({space}), top_k=0,\n"
        f"    cpu={budget}, gpu={budget}, smoke={budget})\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache")}  # empty for the first run only
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "harness.study", str(tmp / "bench_ppo.py"), "--out",
                        str(tmp / name), "--no-asha"], env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(r.stdout + r.stderr)
    recs = [json.loads(p.read_text()) for p in (tmp / name / "bench_ppo" / "trials").glob("*.json")]
    kernel = sum(rec["kernel_seconds"] for rec in recs)
    best = max(max((sum(c["scores"]) / len(c["scores"])) for c in rec["configs"]) for rec in recs)
    return dict(impl=name, wall=wall, kernel=kernel, evals=configs * seeds, best=best)


def run_naive(configs: int, seeds: int, timesteps: int, tmp: Path) -> dict:
    import optuna
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    sys.path.insert(0, str(HERE))
    from _naive import naive_trial

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    t0 = time.perf_counter()
    ray.init(num_cpus=usable_cores(), _node_ip_address="127.0.0.1", include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")
    space = {k: optuna.distributions.FloatDistribution(lo, hi, log=log) for k, (lo, hi, log) in SPACE.items()}
    # one Tune trial per (configuration, seed): CONFIGS x SEEDS trials, each its own proposal
    searcher = OptunaSearch(space, metric="score", mode="max", seed=0)
    tuner = tune.Tuner(
        naive_trial,
        param_space={"timesteps": timesteps},
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=configs * seeds),
        run_config=tune.RunConfig(storage_path=str(tmp / "naive"), name="naive", verbose=0))
    grid = tuner.fit()
    wall = time.perf_counter() - t0
    ray.shutdown()
    df = grid.get_dataframe()
    return dict(impl="naive", wall=wall, kernel=float(df["kernel_seconds"].sum()), evals=len(df),
                best=float(df["score"].max()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", type=int, default=16)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--timesteps", type=int, default=200_000)
    p.add_argument("--configs-per-trial", type=int, default=4)
    p.add_argument("--no-warm", action="store_true", help="skip our second run (warm compilation cache)")
    a = p.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ours = (a.configs, a.seeds, a.timesteps, a.configs_per_trial, tmp)
        cold = run_ours(*ours, "us")
        warm = None if a.no_warm else run_ours(*ours, "us-warm")
        naive = run_naive(a.configs, a.seeds, a.timesteps, tmp)
    rows = [r for r in (cold, warm, naive) if r]
    slots = usable_cores()  # what the embedded Ray of both is given
    print(f"budget: {a.configs} configs x {a.seeds} seeds x {a.timesteps:,} steps, PPO CartPole-v1, "
          f"{slots} CPU cores")
    print(f"{'impl':8} {'evals':>6} {'wall_s':>8} {'kernel_s':>9} {'evals/min':>10} {'overhead':>9} {'best':>7}")
    for r in rows:
        r["per_min"] = r["evals"] / (r["wall"] / 60)
        r["overhead"] = 1 - r["kernel"] / (r["wall"] * slots)
        print(f"{r['impl']:8} {r['evals']:>6} {r['wall']:>8.1f} {r['kernel']:>9.1f} {r['per_min']:>10.1f} "
              f"{r['overhead']:>8.0%} {r['best']:>7.1f}")
    print(f"ratio evals/min us/naive: {cold['per_min'] / naive['per_min']:.2f}"
          + (f" (warm compilation cache: {warm['per_min'] / naive['per_min']:.2f})" if warm else ""))
    print(f"overhead us: {cold['overhead']:.0%}"
          + (f" (warm compilation cache: {warm['overhead']:.0%})" if warm else ""))


if __name__ == "__main__":
    main()
