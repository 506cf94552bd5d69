"""Time to the answer: each registered study's default run (``python -m harness.study NAME``), timed by
phase, its answer scored on a yardstick that does not move with the budget.

    python bench/time_to_answer.py                                  # every study; cartpole_ppo on 3 study seeds
    python bench/time_to_answer.py --studies cartpole_ppo --study-seeds 1
    python bench/time_to_answer.py --tiny                           # the suite's run: a tiny budget

Each study runs as ``python -m harness.study`` would (its own CPU budget and scheduler; only its
study seed set, through a study file beside the results). The yardstick: the configuration the
study found and the default one, re-trained together on ``--held-out`` seeds no study used, at
the study's yardstick budget and objective (:data:`YARDSTICK`: the budget the study had on
2026-12-06, before it was cut, so a shorter budget cannot move what "good" means). With
``--today``, the same study also runs with that day's budget and scheduler in the same run, and
its answer is scored on the same seeds. Prints per study:

    ratio time today/new <study>: X     (study wall time, today's over the new default's)
    ratio answer new/today <study>: Y   (the yardstick score of the new answer over today's)

A study not run ``--today`` compares with its recorded figures (:data:`RECORDED`, said so).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HELD_OUT_TRIAL = 20_000  # the yardstick's seeds: a trial number of the final phase's stream no study runs
# each study's budget and scheduler until 2026-12-06: the yardstick's budget, and --today's run
YARDSTICK = {
    "cartpole_ppo": dict(trials=12, configs=4, seeds=3, timesteps=300_000, scheduler="asha"),
    "cartpole_sac": dict(trials=12, configs=2, seeds=2, timesteps=60_000, scheduler="asha"),
    "pendulum_sac": dict(trials=12, configs=2, seeds=2, timesteps=16_000, scheduler="asha"),
    "dungeon_ppo": dict(trials=12, configs=4, seeds=2, timesteps=500_000, scheduler="asha"),
    "snake_ppo": dict(trials=8, configs=2, seeds=2, timesteps=500_000, scheduler="asha"),
    "ant_ppo": dict(trials=4, configs=2, seeds=2, timesteps=200_000, scheduler="asha"),
}
# the default run's study minutes before 2026-12-07, where this bench did not run it (bench/RESULTS.md)
RECORDED = {"pendulum_sac": 11.4, "dungeon_ppo": 34.1, "snake_ppo": 39.8, "ant_ppo": 25.6}
TINY = dict(trials=1, configs=2, seeds=1, timesteps=2_048)
TIME_LINE = re.compile(r"^time: compiling ([\d.]+) min .*training ([\d.]+) min .*evaluating ([\d.]+) min "
                       r".*waiting ([\d.]+) min")


def study_file(folder: Path, name: str, seed: int) -> Path:
    """A study file: the registered study ``name`` with study seed ``seed``."""
    path = folder / f"{name}_s{seed}.py"
    path.write_text(f"import dataclasses\nimport studies\n\n"
                    f"STUDY = dataclasses.replace(studies.get({name!r}), name={path.stem!r}, seed={seed})\n")
    return path


def run_study(path: Path, out: Path, budget: dict[str, Any] | None, tiny: bool = False) -> dict[str, Any]:
    """One study as the CLI runs it (``budget``: overrides, None: the study's own; ``tiny``: the
    top configuration alone re-trained, no ablation path); its wall time, phases (from the
    summary's time line) and folder."""
    cmd = [sys.executable, "-m", "harness.study", str(path), "--out", str(out)]
    cmd += ["--top-k", "1", "--no-ablation"] if tiny else []
    if budget:
        cmd += ["--trials", str(budget["trials"]), "--configs-per-trial", str(budget["configs"]),
                "--seeds", str(budget["seeds"]), "--timesteps", str(budget["timesteps"])]
        cmd += ["--scheduler", budget["scheduler"]] if "scheduler" in budget else []
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    m = next((TIME_LINE.match(ln) for ln in r.stdout.splitlines() if TIME_LINE.match(ln)), None)
    phases = dict(zip(("compiling", "training", "evaluating", "waiting"), map(float, m.groups()), strict=True)) \
        if m else {}
    return dict(wall_min=wall / 60, phases=phases, folder=out / path.stem)


def answer(folder: Path) -> dict[str, Any]:
    """The study's answer and its default, as (plan, hparams): from its re-training's plans."""
    best = json.loads((folder / "reports" / "best.json").read_text())
    final = json.loads((folder / "final.json").read_text())

    def of(rec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
        first = rec["plans"][0]
        return first["plan"], first["plan"]["hparams"][first["config_index"]]

    return {"config_id": best["config_id"], "tuned": of(best["reproduce"]), "default": of(final["control"])}


def yardstick(runs: list[tuple[dict[str, Any], dict[str, float]]], name: str, timesteps: int,
              seeds: int) -> list[np.ndarray]:
    """Each (plan, hparams) re-trained for ``timesteps`` on the same ``seeds`` held-out seeds,
    scored by the registered study's objective; one kernel per static config."""
    import studies
    from harness.kernel.plan import FINAL, TrialPlan
    from harness.kernel.runners import run_trial

    study = studies.get(name)
    out: list[np.ndarray | None] = [None] * len(runs)
    groups: dict[str, list[int]] = {}
    for i, (plan, _) in enumerate(runs):
        config = {**plan["config"], "total_timesteps": timesteps}
        groups.setdefault(json.dumps(config, sort_keys=True), []).append(i)
    for config, idx in groups.items():
        plan = dataclasses.replace(TrialPlan(**runs[idx[0]][0]), config=json.loads(config),
                                   hparams=[runs[i][1] for i in idx], seeds=seeds, trial=HELD_OUT_TRIAL,
                                   study_seed=0, stream=FINAL, objective=study.objective,
                                   threshold=study.threshold, config_keys=None, chunks=None, lanes=None,
                                   pbt=None, schedule=None)
        for i, scores in zip(idx, run_trial(plan).scores, strict=True):
            out[i] = np.asarray(scores, float)
    return out  # type: ignore[return-value]


def ci(x: np.ndarray) -> str:
    from harness.kernel.stats import bootstrap_ci

    lo, hi = bootstrap_ci(x[np.isfinite(x)])
    return f"{np.nanmean(x):.2f} (95% CI {lo:.2f}..{hi:.2f})"


def paired(a: np.ndarray, b: np.ndarray) -> str:
    from harness.kernel.stats import paired_difference

    d, lo, hi = paired_difference(a, b)
    return f"{d:+.2f} (95% CI {lo:+.2f}..{hi:+.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--studies", nargs="+", default=list(YARDSTICK), choices=list(YARDSTICK))
    p.add_argument("--study-seeds", type=int, help="study seeds for cartpole_ppo (3; --tiny: 1); 1 for the others")
    p.add_argument("--held-out", type=int, help="held-out seeds of the yardstick (16; --tiny: 2)")
    p.add_argument("--today", nargs="*", default=["cartpole_ppo"],
                   help="studies also run at their budget until 2026-12-06 (default: cartpole_ppo)")
    p.add_argument("--tiny", action="store_true", help="a tiny budget for every run (the suite's check)")
    args = p.parse_args()
    import studies

    held = args.held_out or (2 if args.tiny else 16)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.studies:
            n_seeds = args.study_seeds or 1 if args.tiny or name != "cartpole_ppo" else args.study_seeds or 3
            y = YARDSTICK[name]
            steps = TINY["timesteps"] * 2 if args.tiny else y["timesteps"]
            versions = ["new", "today"] if name in args.today else ["new"]
            rows: dict[str, list[dict[str, Any]]] = {v: [] for v in versions}
            for seed in range(n_seeds):
                path = study_file(Path(tmp), name, seed)
                for v in versions:
                    budget = (dict(TINY, **({"scheduler": y["scheduler"]} if v == "today" else {})) if args.tiny
                              else y if v == "today" else None)
                    run = run_study(path, Path(tmp) / v, budget, tiny=args.tiny)
                    run.update(answer(run["folder"]))
                    rows[v].append(run)
                    print(f"{name} seed {seed} {v}: {run['wall_min']:.2f} min "
                          f"({', '.join(f'{k} {x:.2f}' for k, x in run['phases'].items())}); "
                          f"answer {run['config_id']}", flush=True)
            # every answer and every default on the same held-out seeds
            flat = [(v, i, kind) for v in versions for i in range(n_seeds) for kind in ("tuned", "default")]
            scores = yardstick([rows[v][i][kind] for v, i, kind in flat], name, steps, held)
            by = {key: s for key, s in zip(flat, scores, strict=True)}
            print(f"{name}: yardstick {steps:,} steps per seed, {studies.get(name).objective} objective, "
                  f"{held} held-out seeds x {n_seeds} study seeds")
            mean: dict[str, float] = {}
            for v in versions:
                tuned = np.concatenate([by[(v, i, "tuned")] for i in range(n_seeds)])
                default = np.concatenate([by[(v, i, "default")] for i in range(n_seeds)])
                mean[v] = float(np.nanmean(tuned))
                wall = np.mean([r["wall_min"] for r in rows[v]])
                print(f"  {v:5}: {wall:.2f} min a study; answer {ci(tuned)}; default {ci(default)}; "
                      f"tuned - default {paired(tuned, default)}")
            if "today" in versions:
                today_min = np.mean([r["wall_min"] for r in rows["today"]])
                new_t = np.concatenate([by[("new", i, "tuned")] for i in range(n_seeds)])
                old_t = np.concatenate([by[("today", i, "tuned")] for i in range(n_seeds)])
                print(f"  new - today, paired by seed: {paired(new_t, old_t)}")
                print(f"ratio answer new/today {name}: {mean['new'] / mean['today']:.3f}")
            else:
                today_min = RECORDED.get(name, float("nan"))
                print(f"  today: {today_min} min a study (recorded, bench/RESULTS.md; not run here)")
            new_min = np.mean([r["wall_min"] for r in rows["new"]])
            print(f"ratio time today/new {name}: {today_min / new_min:.2f}", flush=True)


if __name__ == "__main__":
    main()
