"""How many configurations a study evaluates for its env steps, and how good its answer is:
lane-level successive halving against today's trial-level ASHA and TPE without early stopping.

    python bench/search_efficiency.py [--envs cartpole,dungeon,acrobot] [--study-seeds 3] [--first-seed 0] [--tiny]
                                      [--timesteps N] [--trials 6] [--top-k 3] [--methods tpe,trial,lane]
                                      [--held-out 16]

For each env and study seed, three studies through ``python -m harness.study`` (embedded Ray,
``--no-ablation``): the search, then the study's answer as a user gets it, its top 3
configurations re-trained on fresh seeds and the best of them by that re-evaluation
(``reports/best.json``; with ``--top-k 1``, the search's best alone):

- ``tpe``: ``--scheduler none``, N trials of C configurations, every one trained to the end;
- ``trial``: ``--scheduler asha``, Tune's ASHA stopping the worse half of the trials halfway;
- ``lane``: ``--scheduler lanes``, each configuration judged at 1/9 and 1/3 of its budget inside
  the kernel by Optuna's successive-halving pruner, stopped lanes refilled (by TPE, about one
  refill in three at random). Its trial count is set after ``trial``'s run so both train the
  same env steps (within one chunk per lane trial).

Per method: configurations evaluated (every one that trained to its first judgement or further),
env steps trained (every lane of every kernel, all seeds), the answer's score as the study
reports it (its top 3 re-trained on the study's fresh seeds, the best of them: that pick and the
score use the same seeds, so the score leans high), the answer's score on held-out seeds (every
method's answer re-trained in one kernel on ``--held-out`` seeds no study used, the same seeds
for all methods, so the methods' differences are paired), wall time. Scores as margins above
random play where the env has a reference (CartPole 22, the dungeon -0.86, Acrobot -500). Means
over study seeds, spread in brackets. The closing lines per env:

    ratio configs lane/trial <env>: X   (configurations per env step, lane over trial)
    ratio best lane/trial <env>: Y      (the answer's held-out margin, lane over trial)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (XLA flag before JAX starts)
import numpy as np

# env: (env id, study whose config and objective it takes, or its own), budget, random play's score
ENVS: dict[str, dict[str, Any]] = {
    "cartpole": dict(study="cartpole_ppo", reference=22.0,
                     full=dict(trials=6, configs=4, seeds=2, timesteps=100_000),
                     tiny=dict(trials=1, configs=2, seeds=2, timesteps=10_240)),
    "dungeon": dict(study="dungeon_ppo", reference=-0.86,
                    full=dict(trials=6, configs=4, seeds=2, timesteps=160_000),
                    tiny=dict(trials=1, configs=2, seeds=1, timesteps=40_960)),
    "acrobot": dict(env="gymnax:Acrobot-v1", reference=-500.0, objective="final",
                    config=dict(num_envs=16, num_steps=128, num_minibatches=4, update_epochs=4,
                                updates_per_chunk=5),
                    full=dict(trials=6, configs=4, seeds=2, timesteps=100_000),
                    tiny=dict(trials=1, configs=2, seeds=1, timesteps=20_480)),
}
METHODS = {"tpe": "none", "trial": "asha", "lane": "lanes"}
HELD_OUT_TRIAL = 10_000  # the held-out seeds: this trial number of the final phase's stream, which no study runs


def study_file(folder: Path, env: str, seed: int, top_k: int = 3, final_seeds: int | None = None) -> Path:
    """A study module for ``env`` with study seed ``seed``: the registered study's env, config,
    space and objective (or the entry's own), its top ``top_k`` re-trained on its fresh seeds
    (``final_seeds`` of them where given)."""
    import studies

    spec = ENVS[env]
    if "study" in spec:
        base = studies.get(spec["study"])
        env_id, config, objective = base.env, base.config, base.objective
        final_seeds = final_seeds or base.final_seeds
    else:
        env_id, config, objective, final_seeds = spec["env"], spec["config"], spec["objective"], final_seeds or 8
    path = folder / f"eff_{env}_{seed}.py"
    path.write_text(textwrap.dedent(f"""
        from harness.space import Budget, Study, Uniform
        from studies._spaces import PPO

        _B = Budget(trials=1, configs_per_trial=2, seeds=1, timesteps=20_480)
        STUDY = Study(name="eff_{env}_{seed}", description="search efficiency benchmark", env={env_id!r},
                      algo="ppo", config={config!r}, space=dict(**PPO, vf_coef=Uniform(0.25, 1.0)),
                      objective={objective!r}, seed={seed}, top_k={top_k}, final_seeds={final_seeds},
                      cpu=_B, gpu=_B, smoke=_B)
    """))
    return path


def run_study(path: Path, out: Path, method: str, budget: dict[str, int]) -> dict[str, Any]:
    """One study: configurations evaluated, env steps trained, best re-evaluated score, wall time."""
    from harness.store.folder import ResultsFolder

    cmd = [sys.executable, "-m", "harness.study", str(path), "--scheduler", METHODS[method],
           "--trials", str(budget["trials"]), "--configs-per-trial", str(budget["configs"]),
           "--seeds", str(budget["seeds"]), "--timesteps", str(budget["timesteps"]),
           "--no-ablation", "--out", str(out)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    folder = ResultsFolder(out / path.stem)
    records = folder.trials()
    steps = sum(rec.env_steps * budget["configs"] * rec.seeds for rec in records)
    evaluated = sum(1 for rec in records for c in rec.configs if rec.status_of(c) != "failed")
    answer = json.loads((folder.root / "reports" / "best.json").read_text())["reevaluation"] or {}
    best = answer.get("mean")
    return dict(configs=evaluated, env_steps=steps, best=float("nan") if best is None else best, wall_s=wall)


def held_out(folders: dict[str, Path], seeds: int, study_seed: int) -> dict[str, float]:
    """Each study's answer re-trained on ``seeds`` held-out seeds, the same for every study
    (one kernel per static config); its mean score."""
    from harness.kernel.plan import FINAL, TrialPlan
    from harness.kernel.runners import run_trial

    answers: dict[str, tuple[dict[str, Any], dict[str, float]]] = {}
    for method, folder in folders.items():
        best = json.loads((folder / "reports" / "best.json").read_text())
        if not best.get("reproduce"):
            continue
        first = best["reproduce"]["plans"][0]  # the final phase's plan: its static config, the answer's values
        answers[method] = first["plan"], first["plan"]["hparams"][first["config_index"]]
    out: dict[str, float] = {}
    for config in {json.dumps(plan["config"], sort_keys=True) for plan, _ in answers.values()}:
        group = [m for m, (plan, _) in answers.items() if json.dumps(plan["config"], sort_keys=True) == config]
        plan = dataclasses.replace(TrialPlan(**answers[group[0]][0]), hparams=[answers[m][1] for m in group],
                                   seeds=seeds, trial=HELD_OUT_TRIAL, study_seed=study_seed, stream=FINAL)
        for m, scores in zip(group, run_trial(plan).scores, strict=True):
            out[m] = float(np.nanmean(scores))
    return out


def matched_trials(trial_steps: int, budget: dict[str, int]) -> int:
    """The --trials that gives a lane study ``trial_steps`` env steps (all lanes busy to the end)."""
    per_trial = budget["configs"] * budget["seeds"] * budget["timesteps"]
    return max(1, round(trial_steps / per_trial))


def budget_of(env: str, args: argparse.Namespace) -> dict[str, int]:
    budget = dict(ENVS[env]["tiny" if args.tiny else "full"])
    given = {"timesteps": args.timesteps, "trials": args.trials}
    return {**budget, **{k: v for k, v in given.items() if v}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default="cartpole,dungeon,acrobot")
    p.add_argument("--study-seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0, help="the first study seed (to add seeds)")
    p.add_argument("--top-k", type=int, default=3, help="configurations re-trained on fresh seeds (default 3)")
    p.add_argument("--tiny", action="store_true",
                   help="a tiny budget, the answer re-trained on 2 fresh seeds (the test suite's run)")
    p.add_argument("--timesteps", type=int, help="env steps per configuration (default: each env's budget)")
    p.add_argument("--trials", type=int, help="the trial-level studies' trials (6)")
    p.add_argument("--methods", default="tpe,trial,lane", help="which of tpe, trial, lane (trial and lane always)")
    p.add_argument("--held-out", type=int, help="held-out seeds each answer is re-trained on (16; --tiny: 2)")
    args = p.parse_args()
    methods = [m for m in METHODS if m in {*args.methods.split(","), "trial", "lane"}]
    names = [e for e in args.envs.split(",") if e]
    unknown = sorted(set(names) - set(ENVS))
    if unknown:
        raise SystemExit(f"unknown env {', '.join(unknown)}; choose from {', '.join(ENVS)}")
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    n_held = args.held_out or (2 if args.tiny else 16)
    with tempfile.TemporaryDirectory(prefix="search-efficiency-") as tmp:
        for env in names:
            budget = budget_of(env, args)
            rows[env] = {m: [] for m in methods}
            for seed in range(args.first_seed, args.first_seed + args.study_seeds):
                path = study_file(Path(tmp), env, seed, args.top_k, final_seeds=2 if args.tiny else None)
                for method in methods:
                    b = dict(budget)
                    if method == "lane":
                        b["trials"] = matched_trials(rows[env]["trial"][-1]["env_steps"], budget)
                    r = run_study(path, Path(tmp) / f"{method}-{seed}", method, b)
                    rows[env][method].append(r)
                    print(env, seed, method, json.dumps(r), flush=True)
                held = held_out({m: Path(tmp) / f"{m}-{seed}" / path.stem for m in methods}, n_held, seed)
                for method in methods:
                    rows[env][method][-1]["held_out"] = held.get(method, float("nan"))
                print(env, seed, "held out:", json.dumps(held), flush=True)
    print()
    for env in names:
        ref = ENVS[env]["reference"]
        print(f"{env}: {budget_of(env, args)}, {args.study_seeds} study seeds; margins above random play's "
              f"({ref:g}): as reported = the study's answer (best of its top {args.top_k} re-trained on its "
              f"fresh seeds), held out = that answer on {n_held} seeds no study used")
        print(f"  {'method':7} {'configs':>16} {'env steps':>12} {'configs/M steps':>16} {'as reported':>22} "
              f"{'held out':>22} {'wall_s':>7}")
        stats = {}
        for method, rs in rows[env].items():
            configs = np.array([r["configs"] for r in rs], float)
            steps = np.array([r["env_steps"] for r in rs], float)
            margin = np.array([r["best"] - ref for r in rs], float)
            kept = np.array([r["held_out"] - ref for r in rs], float)
            per = configs / steps * 1e6
            stats[method] = (per.mean(), np.nanmean(kept), kept)
            print(f"  {method:7} {configs.mean():>7.1f} [{configs.min():.0f}..{configs.max():.0f}] "
                  f"{steps.mean():>12,.0f} {per.mean():>16.2f} {np.nanmean(margin):>10.2f} "
                  f"[{np.nanmin(margin):.2f}..{np.nanmax(margin):.2f}] {np.nanmean(kept):>10.2f} "
                  f"[{np.nanmin(kept):.2f}..{np.nanmax(kept):.2f}] {np.mean([r['wall_s'] for r in rs]):>7.1f}")
        diff = stats["lane"][2] - stats["trial"][2]
        se = np.nanstd(diff, ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")
        print(f"  lane - trial, held out, paired by study seed: {np.nanmean(diff):+.2f} (SE {se:.2f}; "
              f"lane ahead on {int((diff > 0).sum())} of {len(diff)})")
        print(f"ratio configs lane/trial {env}: {stats['lane'][0] / stats['trial'][0]:.2f}")
        print(f"ratio best lane/trial {env}: {stats['lane'][1] / stats['trial'][1]:.2f}")


if __name__ == "__main__":
    main()
