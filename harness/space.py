"""Studies as plain data: what to search, over what, with which budget.

A :class:`Study` names an environment, an algorithm, its static config, a search space and a
budget. Each searched name is either a static config field (changes shapes or loop counts: a
different value needs a different kernel, so static choices split trials) or a traced
hyperparameter (shared kernel; the C configurations of a trial differ only in these).

Nothing here imports Ray, Optuna or JAX: studies are framework-neutral data.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal


class StudyError(ValueError):
    """A study (or the options given for it) that cannot work; the message says why."""


@dataclass(frozen=True)
class LogUniform:
    low: float
    high: float


@dataclass(frozen=True)
class Uniform:
    low: float
    high: float


@dataclass(frozen=True)
class Int:
    low: int
    high: int
    log: bool = False


@dataclass(frozen=True)
class Categorical:
    """A choice among ``choices`` (any values; tuples such as layer sizes are fine)."""

    choices: tuple[Any, ...]

    def labels(self) -> list[str]:
        """Strings naming each choice (what Optuna stores)."""
        return [label(c) for c in self.choices]

    def value(self, text: str) -> Any:
        return self.choices[self.labels().index(text)]


Distribution = LogUniform | Uniform | Int | Categorical


def label(value: Any) -> str:
    """``(64, 64)`` -> ``"64,64"``; other values as ``str``."""
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class Budget:
    """How much to run: Tune trials, configurations per trial, seeds, env steps per seed."""

    trials: int
    configs_per_trial: int
    seeds: int
    timesteps: int

    def __post_init__(self) -> None:
        for name in ("trials", "configs_per_trial", "seeds", "timesteps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise StudyError(f"budget {name} must be a whole number, got {value!r}")
            if value < 1:
                raise StudyError(f"{name} must be >= 1, got {value}")


@dataclass(frozen=True)
class PBT:
    """Population-based training across a trial's C configurations (``algos.pbt``).

    Every ``interval`` chunks, the worst ``fraction`` of the configurations (by their mean
    evaluation return over the last ``interval`` chunks) copy the network and optimizer state of
    configurations drawn from the best ``fraction``, then perturb the searched continuous
    hyperparameters: ``multiply`` by 0.8 or 1.25, or ``resample`` from their distribution; both
    clipped to the search space.
    """

    interval: int = 4
    fraction: float = 0.25
    perturb: Literal["multiply", "resample"] = "multiply"


SCHEDULERS = ("asha", "lanes", "pbt", "none")
_FOLDER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a study's name is its results folder's
METRICS = ("mean", "iqm")  # a configuration's score over its seeds (harness.kernel.stats.config_score)
DIRECTIONS = ("maximize", "minimize")


@dataclass(frozen=True)
class Study:
    """A named hyperparameter study.

    Attributes:
        name: the registry name (``python -m harness.study NAME``).
        description: one line for ``--list``.
        env: an environment name for ``envs.make``: registered (``CartPole-v1``), another
            library's (``brax:ant``), or one's own (``"my_package.envs:make_env"``). A study
            file may also hold the env itself: an ``envs.Environment`` instance or class, or a
            factory returning one or ``(env, params)``.
        algo: a built-in algorithm (``ppo``, ``sac``, ``pqn``), an installed one, or your own:
            ``"module:attr"`` or ``"file.py:attr"`` naming an ``algos.AlgoSpec`` (a file beside the study file).
        config: static config fields fixed for the whole study.
        space: searched names -> distributions (static fields or hyperparameters).
        hparams: hyperparameter values fixed for the whole study (not searched).
        cpu, gpu, smoke: budgets for a CPU machine, a GPU, and ``--smoke``.
        top_k: configurations re-trained on fresh seeds at the end, beside the default
            configuration (the control).
        final_seeds: fresh seeds for that re-training (rounded up to a multiple of the budget's seeds).
        seed: the study seed every key is derived from.
        objective: what a run's value is, from the evaluation after every chunk (the
            deterministic policy, or samples from it where the config sets ``eval_policy="sample"``):
            ``final`` (the evaluation return after the last chunk), ``auc`` (the mean evaluation
            return over the run's chunks: reaching a return sooner and keeping it scores higher)
            or ``steps`` (env steps until the evaluation return reaches ``threshold``, censored
            at the budget; minimized).
        threshold: the return ``steps`` counts to.
        curve_episodes: evaluation episodes per seed after every chunk.
        metric: how a configuration's values over its seeds become its score:
            their ``mean`` or their interquartile mean ``iqm`` (robust to one odd seed).
        direction: ``maximize`` or ``minimize`` the score; by default what the objective needs.
        baseline: the control's values for searched names (static or traced); every other
            searched name takes the algorithm's default. The control is re-trained with the
            top configurations on the same fresh seeds, so the reports say what tuning gained.
        reference: a return to measure scores from (random play's, say), named by
            ``reference_label``: tuned vs default then also says how far each is above it and
            the ratio of those margins (a game whose returns start negative has no meaningful
            plain ratio).
        scheduler: ``asha`` (stop the worse half of the trials at the halfway rung), ``lanes``
            (successive halving of each configuration inside the trials' kernels, whose lanes are
            refilled with new configurations: harness.lanes), ``pbt``
            (population-based training inside each trial's kernel, settings in ``pbt``) or
            ``none``; ``--scheduler`` overrides it.
        pbt: the population-based training settings (defaults when None).
    """

    name: str
    description: str
    env: Any  # str, or (in a study file) an Environment instance, class or factory
    algo: str
    space: dict[str, Distribution]
    cpu: Budget
    gpu: Budget
    smoke: Budget
    config: dict[str, Any] = field(default_factory=dict)
    hparams: dict[str, float] = field(default_factory=dict)
    top_k: int = 3
    final_seeds: int = 4
    seed: int = 0
    objective: Literal["final", "auc", "steps"] = "final"
    threshold: float | None = None
    curve_episodes: int = 4
    metric: Literal["mean", "iqm"] = "mean"
    direction: Literal["maximize", "minimize"] | None = None
    baseline: dict[str, Any] = field(default_factory=dict)
    reference: float | None = None
    reference_label: str = "reference"
    scheduler: Literal["asha", "lanes", "pbt", "none"] = "asha"
    pbt: PBT | None = None
    source: str | None = None  # the study file it came from (set by studies.load_file)

    def __post_init__(self) -> None:
        if self.direction is None:  # frozen: set once, here
            object.__setattr__(self, "direction", "minimize" if self.objective == "steps" else "maximize")
        _check_shape(self)

    def static_names(self, config_fields: set[str]) -> list[str]:
        return [n for n in self.space if n in config_fields]

    def traced_names(self, config_fields: set[str]) -> list[str]:
        return [n for n in self.space if n not in config_fields]

    def pbt_plan(self, config_fields: set[str]) -> dict[str, Any]:
        """The trial plan's ``pbt`` entry: settings and the bounds of the perturbed (continuous,
        traced) hyperparameters."""
        settings = self.pbt or PBT()
        bounds = [[n, d.low, d.high, isinstance(d, LogUniform)] for n in self.traced_names(config_fields)
                  if isinstance(d := self.space[n], LogUniform | Uniform)]
        return {"interval": settings.interval, "fraction": settings.fraction, "perturb": settings.perturb,
                "bounds": bounds}


def _check_shape(study: Study) -> None:
    """The fields' types, so that a study file's slip is one line when it loads, not a traceback
    in a trial (what the values must be for the algorithm: :func:`validate`).

    Raises:
        StudyError: a field of the wrong type, a name that cannot be a folder's, a seed, top_k or
            final_seeds out of range, an empty search space, or a distribution whose bounds are not
            finite numbers (an integer range's: integers; a log scale's: above 0).
    """
    where = f"study {study.name}"
    for name in ("name", "algo"):
        if not isinstance(getattr(study, name), str):
            raise StudyError(f"{where}: {name} must be a string, got {getattr(study, name)!r}")
    if not _FOLDER_NAME.fullmatch(study.name):
        raise StudyError(f"study name {study.name!r} must name its results folder: letters, digits, '_', "
                         "'-' and '.', starting with a letter, digit or '_'")
    for name, least in (("seed", 0), ("top_k", 0), ("final_seeds", 1)):
        value = getattr(study, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise StudyError(f"{where}: {name} must be a whole number >= {least}, got {value!r}")
    for name in ("space", "config", "hparams", "baseline"):
        if not isinstance(getattr(study, name), dict):
            raise StudyError(f"{where}: {name} must be a dict of setting names, got {getattr(study, name)!r}")
    for name in ("cpu", "gpu", "smoke"):
        if not isinstance(getattr(study, name), Budget):
            raise StudyError(f"{where}: {name} must be a harness.space.Budget(trials=, configs_per_trial=, "
                             f"seeds=, timesteps=), got {getattr(study, name)!r}")
    if study.pbt is not None and not isinstance(study.pbt, PBT):
        raise StudyError(f"{where}: pbt must be a harness.space.PBT(...) or None, got {study.pbt!r}")
    if not study.space:
        raise StudyError(f"{where}: the search space is empty; search at least one setting, "
                         "e.g. space=dict(lr=LogUniform(1e-4, 1e-2))")
    for name, dist in study.space.items():
        if not isinstance(dist, LogUniform | Uniform | Int | Categorical):
            raise StudyError(f"{where}: space[{name!r}] must be LogUniform, Uniform, Int or Categorical, got "
                             f"{dist!r} (a fixed value goes in config or hparams)")
        if isinstance(dist, Categorical) and not isinstance(dist.choices, tuple | list):
            raise StudyError(f"{where}: space[{name!r}]: Categorical takes a tuple of choices, "
                             f"got {dist.choices!r}")
        if isinstance(dist, Categorical):
            continue
        number = int if isinstance(dist, Int) else int | float
        if not all(isinstance(v, number) and not isinstance(v, bool) and math.isfinite(v)
                   for v in (dist.low, dist.high)):
            kind = "integers" if isinstance(dist, Int) else "finite numbers"
            raise StudyError(f"{where}: space[{name!r}] bounds must be {kind}, got {dist.low!r}, {dist.high!r}")
        if isinstance(dist, Int) and dist.log and dist.low < 1:
            raise StudyError(f"{where}: space[{name!r}] is an integer range on a log scale but low={dist.low} < 1")


def _static_choices(name: str, dist: Distribution) -> list[Any]:
    if isinstance(dist, Categorical):
        return list(dist.choices)
    if isinstance(dist, Int) and dist.high - dist.low <= 64:
        return list(range(dist.low, dist.high + 1))
    raise StudyError(f"space[{name!r}] is a static (shape-changing) setting: it must be Categorical or an Int "
                     f"range of at most 65 values, got {type(dist).__name__}")


def static_points(study: Study, config_fields: set[str]) -> Iterator[dict[str, Any]]:
    """Every combination of the study's static (shape-changing) choices, as ``{name: value}``.

    Raises:
        StudyError: a static setting whose space cannot be enumerated.
    """
    static = study.static_names(config_fields)
    try:
        grids = [_static_choices(n, study.space[n]) for n in static]
    except StudyError as err:
        raise StudyError(f"study {study.name}: {err}") from None
    for combo in itertools.product(*grids):
        yield dict(zip(static, combo, strict=True))


def validate_pbt(study: Study, config_fields: set[str], *, configs_per_trial: int, chunks: int) -> None:
    """Checks that population-based training can work for this study and budget.

    Raises:
        StudyError: settings out of range, nothing to perturb, too few configurations per trial
            for one to be replaced, or too few chunks for one exploit step.
    """
    settings = study.pbt or PBT()
    where = f"study {study.name}: population-based training"
    if not 0 < settings.fraction <= 0.5:
        raise StudyError(f"{where}: fraction must be in (0, 0.5], got {settings.fraction}")
    if settings.perturb not in ("multiply", "resample"):
        raise StudyError(f"{where}: perturb must be 'multiply' or 'resample', got {settings.perturb!r}")
    if settings.interval < 1:
        raise StudyError(f"{where}: interval must be >= 1 chunk, got {settings.interval}")
    if not study.pbt_plan(config_fields)["bounds"]:
        raise StudyError(f"{where}: no continuous traced hyperparameter is searched, so nothing can be perturbed")
    need = math.ceil(1 / settings.fraction)
    if configs_per_trial < need:
        raise StudyError(f"{where} replaces {settings.fraction:g} of a trial's configurations: it needs "
                         f"--configs-per-trial >= {need}, got {configs_per_trial}")
    if chunks <= settings.interval:
        raise StudyError(f"{where} exploits every {settings.interval} chunks but a trial runs {chunks}; "
                         "lower the interval or raise --timesteps")


def out_of_range(hparams_cls: type, name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the hyperparameter ``name`` of ``hparams_cls`` (None when it can), from
    the ranges the algorithm declares (``PPOHParams.RANGES``: a discount in [0, 1], a rate above 0)."""
    where = getattr(hparams_cls, "RANGES", {}).get(name)
    if where is None or value in where:
        return None
    return f"{name}={label(value)} is outside {where}"


def validate(study: Study, config_cls: type, hparams_cls: type, *, timesteps: int) -> None:
    """Checks that every point of the study's space builds a valid static config.

    Raises:
        StudyError: an unknown name, an empty range, or a combination of static choices that
            the algorithm rejects (e.g. ``num_minibatches`` not dividing the batch).
    """
    config_fields = {f.name for f in dataclasses.fields(config_cls)}
    hp_fields = {f.name for f in dataclasses.fields(hparams_cls)}
    known = sorted(config_fields | hp_fields)
    for name in [*study.space, *study.config, *study.hparams]:
        if name not in config_fields | hp_fields:
            raise StudyError(f"study {study.name}: unknown setting {name!r} for {study.algo}; "
                             f"known: {', '.join(known)}")
    from harness.kernel.stats import OBJECTIVES  # numpy: not when a study file imports this module

    if study.metric not in METRICS:
        raise StudyError(f"study {study.name}: metric must be one of {', '.join(METRICS)}, got {study.metric!r}")
    if study.direction not in DIRECTIONS:
        raise StudyError(f"study {study.name}: direction must be one of {', '.join(DIRECTIONS)}, "
                         f"got {study.direction!r}")
    if study.objective not in OBJECTIVES:
        raise StudyError(f"study {study.name}: objective must be one of {', '.join(OBJECTIVES)}, "
                         f"got {study.objective!r}")
    if study.objective == "steps" and study.threshold is None:
        raise StudyError(f"study {study.name}: objective 'steps' needs a threshold (the return to reach)")
    if study.direction != ("minimize" if study.objective == "steps" else "maximize"):
        raise StudyError(f"study {study.name}: objective {study.objective!r} is "
                         f"{'minimized' if study.objective == 'steps' else 'maximized'}; "
                         f"direction={study.direction!r} contradicts it (leave direction out)")
    if study.curve_episodes < (0 if study.objective == "final" else 1):
        raise StudyError(f"study {study.name}: curve_episodes must be >= 1 for objective {study.objective!r}, "
                         f"got {study.curve_episodes}")
    if study.reference is not None and (isinstance(study.reference, bool) or not isinstance(
            study.reference, (int, float)) or not math.isfinite(study.reference)):
        raise StudyError(f"study {study.name}: reference must be a finite return, got {study.reference!r}")
    if study.scheduler not in SCHEDULERS:
        raise StudyError(f"study {study.name}: scheduler must be one of {', '.join(SCHEDULERS)}, "
                         f"got {study.scheduler!r}")
    for name in study.baseline:
        if name not in study.space:
            raise StudyError(f"study {study.name}: baseline sets {name!r}, which is not searched; "
                             f"searched: {', '.join(study.space)}")
    for name in study.hparams:
        if name not in hp_fields:
            raise StudyError(f"study {study.name}: {name!r} is a static config field; put it in config")
    for name, dist in study.space.items():
        if isinstance(dist, LogUniform | Uniform | Int) and not dist.low < dist.high:
            raise StudyError(f"study {study.name}: {name} range [{dist.low}, {dist.high}] is empty")
        if isinstance(dist, LogUniform) and dist.low <= 0:
            raise StudyError(f"study {study.name}: {name} is log-uniform but low={dist.low} <= 0")
        if isinstance(dist, Categorical) and not dist.choices:
            raise StudyError(f"study {study.name}: {name} has no choices")
        if name in hp_fields and isinstance(dist, Categorical) and not all(
                isinstance(c, int | float) and math.isfinite(c) for c in dist.choices):
            raise StudyError(f"study {study.name}: hyperparameter {name} must have numeric choices")
    checked = [(f"space[{name!r}]", name, v) for name, dist in study.space.items() for v in (
        dist.choices if isinstance(dist, Categorical) else (dist.low, dist.high))]
    checked += [(f"{field}[{name!r}]", name, v) for field in ("hparams", "baseline")
                for name, v in getattr(study, field).items()]
    for where, name, value in checked:
        if why := out_of_range(hparams_cls, name, value):
            raise StudyError(f"study {study.name}: {where} cannot work: {why}")
    control = {n: study.baseline[n] for n in study.static_names(config_fields) if n in study.baseline}
    for point in [*static_points(study, config_fields), control]:
        try:
            config_cls(**{**study.config, **point, "total_timesteps": timesteps})
        except (ValueError, TypeError) as err:
            where = ", ".join(f"{k}={label(v)}" for k, v in point.items())
            raise StudyError(f"study {study.name}: search space cannot work"
                             + (f" at {where}" if where else "") + f": {err}") from None
