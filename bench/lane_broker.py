"""The lane broker's step against Optuna's own per-lane loop: same study, values, pruner and sampler.

    python bench/lane_broker.py                  # 64 lanes (a GPU lane trial), 8 steps
    python bench/lane_broker.py --lanes 8 --steps 2

A lane trial waits for the broker after each chunk; on a GPU a chunk takes well under a second,
so what the broker spends shows in the trial's speed. Each step here puts every lane at a rung
(the heaviest step: a GPU trial's first lanes reach their first rung together), with the same
values for both sides (seeded), then refills what was stopped. Optuna's loop is what a user of
its API would write: per lane ``report``, ``should_prune``, ``tell`` and, for a stopped one,
``ask`` and suggest with the trial's static values. Both sides start from the same 64 running
trials, each in its own SQLite storage, with the cartpole_ppo study's space, pruner (successive
halving, eta 3) and TPE (multivariate, constant liar). The broker judges a chunk's lanes at a rung
together and Optuna's loop one after another, so they stop a few different configurations: each
side's count of stopped and refilled ones is printed beside its time. Then as many steps between
rungs, where each lane only reports its objective so far for its curve: the broker's cost on most
chunks.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna  # noqa: E402

import studies  # noqa: E402
from harness.driver.settings import Options, resolve  # noqa: E402
from harness.lanes.broker import LaneBroker  # noqa: E402
from harness.search.searcher import open_study, suggest  # noqa: E402
from harness.store.folder import ResultsFolder  # noqa: E402

STATIC = {"num_minibatches": "8"}  # the trial's static choice, as Optuna holds it
MIN_STEPS, CHUNK = 100, 128  # rungs at 100, 300, 900 env steps; a chunk is 128


def values(lanes: int, steps: int) -> list[list[float]]:
    rnd = random.Random(0)
    return [[rnd.random() * 100 for _ in range(lanes)] for _ in range(steps)]


def run_ours(settings, lanes: int, table: list[list[float]]) -> tuple[list[float], int]:
    broker = LaneBroker(settings.study, settings.storage, static_names=settings.static_names,
                        hparams=settings.hparams, min_steps=MIN_STEPS)
    driver = open_study(settings.study, settings.storage)
    numbers = [driver.ask().number for _ in range(lanes)]
    times, stopped = [], 0

    def reports(row: list[float], steps: int, at_rung: bool) -> list[dict]:  # as LaneTrial.reports makes them
        return [{"lane": i, "number": numbers[i], "steps": steps, "rung": 0 if at_rung else None,
                 "values": [v] if at_rung else None, "now": None if at_rung else [v], "diverged": False,
                 "finished": False, "last": False, "reach": True if at_rung else None, "scores": None}
                for i, v in enumerate(row)]

    for chunk, row in enumerate(table, 1):
        at_rung = reports(row, CHUNK * chunk, True)
        t0 = time.perf_counter()
        answer = broker.step(0, chunk, STATIC, at_rung, True)
        times.append(time.perf_counter() - t0)
        stopped += len(answer["ended"])
        for lane, new in answer["new"].items():
            numbers[lane] = new["number"]
    # then steps between rungs: each lane only tells its objective so far (its curve in Optuna)
    between = []
    for k, row in enumerate(table, 1):
        curve_only = reports(row, CHUNK * len(table) + k, False)
        t0 = time.perf_counter()
        broker.step(0, len(table) + k, STATIC, curve_only, True)
        between.append(time.perf_counter() - t0)
    print(f"us      seconds a step between rungs (each lane's value for its curve only): "
          f"{' '.join(f'{t:.3f}' for t in between)}  mean {sum(between) / len(between):.3f}", flush=True)
    return times, stopped


def run_optuna(settings, lanes: int, table: list[list[float]]) -> tuple[list[float], int]:
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=MIN_STEPS, reduction_factor=3,
                                                    min_early_stopping_rate=0)
    study = open_study(settings.study, settings.storage, pruner=pruner)
    trials = [study.ask() for _ in range(lanes)]
    times, stopped = [], 0
    for chunk, row in enumerate(table, 1):
        t0 = time.perf_counter()
        for i, value in enumerate(row):
            trials[i].report(value, step=CHUNK * chunk)
            if trials[i].should_prune():
                study.tell(trials[i], state=optuna.trial.TrialState.PRUNED)
                stopped += 1
                study.enqueue_trial(STATIC)
                trials[i] = study.ask()
                suggest(trials[i], settings.study.space)
        times.append(time.perf_counter() - t0)
    return times, stopped


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lanes", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    table = values(args.lanes, args.steps)
    rows = {}
    for name, run in (("optuna", run_optuna), ("us", run_ours)):
        with tempfile.TemporaryDirectory() as tmp:
            study = studies.get("cartpole_ppo")
            settings = resolve(study, Options(scheduler="lanes"), stored=None,
                               folder=ResultsFolder(Path(tmp) / study.name), resume_command="")
            rows[name], stopped = run(settings, args.lanes, table)
        print(f"{name:7} seconds a step: {' '.join(f'{t:.2f}' for t in rows[name])}  total {sum(rows[name]):.2f}"
              f"  ({stopped} stopped and refilled)", flush=True)
    print(f"ratio optuna/us seconds for {args.steps} steps of {args.lanes} lanes: "
          f"{sum(rows['optuna']) / sum(rows['us']):.2f}")


if __name__ == "__main__":
    main()
