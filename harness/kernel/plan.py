"""A trial as plain data: what the driver hands a worker (:class:`TrialPlan`) and what the
kernel gives back (:class:`ChunkReport`, :class:`TrialResult`).

No JAX, Ray or Optuna here (numpy only): the driver builds plans and reads results at module
level without importing JAX; :mod:`harness.kernel.compile` and :mod:`harness.kernel.runners`
turn a plan into compiled chunks and run them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.kernel.stats import OBJECTIVES

# Key streams (study seed, trial, stream, seed index): training and evaluation differ, so a configuration
# is scored on episodes it never trained on; the final re-training has streams of its own (fresh seeds)
SEARCH, FINAL = 0, 1
CURVE_TAG = 7919  # evaluation after chunk k uses fold_in(fold_in(eval key, CURVE_TAG), k)
PBT_TAG = 104729  # the exploit/explore step after chunk k uses fold_in(fold_in(trial key, PBT_TAG), k)
CONFIG_TAG = 15485863  # with config_keys: configuration n's keys from fold_in(fold_in(study key, CONFIG_TAG), n)


@dataclass(frozen=True)
class TrialPlan:
    """Everything a worker needs to run one trial, as plain data (it travels through Ray)."""

    env: str
    algo: str
    config: dict[str, Any]  # static config fields (total_timesteps included)
    hparams: list[dict[str, float]]  # one dict of traced values per configuration: C of them
    seeds: int
    trial: int
    study_seed: int = 0
    stream: int = SEARCH
    objective: str = "final"  # what a run's score is (harness.kernel.stats.objective_values)
    threshold: float | None = None  # for objective "steps"
    curve_episodes: int = 4  # evaluation episodes per seed after every chunk (0: none)
    # population-based training across the C configurations: {"interval": chunks, "fraction",
    # "perturb", "bounds": [[name, low, high, log], ...]} (algos.pbt); None: none
    pbt: dict[str, Any] | None = None
    # hyperparameters changed between chunks (a PBT lineage replayed): [{"chunk": k, "hparams":
    # [C dicts]}], each applied after chunk k; None: fixed
    schedule: list[dict[str, Any]] | None = None
    # each configuration's own key (its Optuna number), not the trial and its position, so it trains
    # the same in any trial and lane (harness.lanes); None: keyed by the trial
    config_keys: list[int] | None = None
    # the trial's length in chunks when its lanes are refilled with new configurations as they
    # stop (each configuration still trains at most the config's num_chunks); None: num_chunks
    chunks: int | None = None
    # lane-level successive halving (harness.lanes): {"eta", "min_steps", "broker"}; None: none
    lanes: dict[str, Any] | None = None


@dataclass
class ChunkReport:
    """What one chunk produced, on the host."""

    chunk: int  # 1-based
    num_chunks: int
    env_steps: int  # per seed, cumulative
    returns: np.ndarray  # [C, S] mean return of episodes finished in this chunk (NaN: none)
    evals: np.ndarray  # [C, S] evaluation return after this chunk (NaN: not evaluated)
    diverged: np.ndarray  # [C, S] bool, sticky
    steps_per_sec: float  # all C x S runs together, this chunk
    kernel_seconds: float  # time spent in compiled chunks so far (compile excluded)
    pbt: dict[str, Any] | None = None  # the exploit/explore step after this chunk: source, hparams
    lane_steps: np.ndarray | None = None  # [C] env steps per seed of each lane's configuration so far


@dataclass
class TrialResult:
    scores: np.ndarray  # [C, S] value under the plan's objective (NaN where diverged)
    final_returns: np.ndarray  # [C, S] evaluation return after the last chunk
    diverged: np.ndarray  # [C, S] bool
    env_steps: int  # per seed
    kernel_seconds: float
    compile_seconds: float
    curves: list[ChunkReport] = field(default_factory=list)
    final_hparams: list[dict[str, float]] = field(default_factory=list)  # after PBT or a schedule


class OutOfMemory(RuntimeError):
    """A trial's kernel does not fit in device memory even one configuration at a time."""


def config_groups(configs: int, batch: int) -> list[list[int]]:
    """The configurations' indices in sub-batches of ``batch`` (the last one may be shorter)."""
    return [list(range(i, min(i + batch, configs))) for i in range(0, configs, batch)]


def check_objective(plan: TrialPlan) -> None:
    """Raises ValueError for a plan whose objective cannot be computed from its evaluations."""
    if plan.objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {plan.objective!r}; choose from {', '.join(OBJECTIVES)}")
    if plan.objective != "final" and plan.curve_episodes < 1:
        raise ValueError(f"objective {plan.objective!r} needs an evaluation after every chunk "
                         "(curve_episodes >= 1)")
    if plan.objective == "steps" and plan.threshold is None:
        raise ValueError("objective 'steps' needs a threshold")
