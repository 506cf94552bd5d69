"""One invocation of a study, resolved once into a frozen value before anything runs.

The CLI (:mod:`harness.study`) reads argv into :class:`Options`; :func:`resolve` checks them
against the study, its algorithm, its env and a resumed folder's ``study.json``, and returns
:class:`Settings`, which is all the phases ever see. Every rule about budgets, schedulers and
checkpoint cadence is here, once; so is the one factory of ``TrialPlan`` and the one merge of a
static config. Nothing here imports Ray or Optuna.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.driver.timeplan import parse_duration
from harness.kernel.plan import SEARCH, TrialPlan
from harness.lanes.trial import ETA, ROUNDS
from harness.space import (
    PBT,
    Budget,
    Categorical,
    Int,
    LogUniform,
    Study,
    StudyError,
    static_points,
    validate,
    validate_pbt,
)
from harness.store.folder import ResultsFolder, StudyMeta
from harness.store.records import RecordsError

RESUME_FIXED = ("configs_per_trial", "seeds", "timesteps")  # budget values a resumed study keeps
OPEN_TRIALS = 100_000  # a time-budgeted search's bound on trials: the time ends it long before


@dataclass(frozen=True)
class Options:
    """What the user asked for on the command line (None: the study's or the default)."""

    trials: int | None = None
    configs_per_trial: int | None = None
    seeds: int | None = None
    timesteps: int | None = None
    scheduler: str | None = None
    checkpoint_every: str = "60s"
    device_memory: str | None = None
    sampler: str = "tpe"
    storage: str | None = None
    address: str | None = None
    smoke: bool = False
    top_k: int | None = None  # configurations re-trained at the end (None: the study's; 0: none)
    ablation: bool = True  # the ablation path from the default to the best configuration, after the re-training
    time: str | None = None  # --time: a wall-clock budget for the whole study ('5m')

    def given(self) -> dict[str, int | None]:
        return {"trials": self.trials, "configs_per_trial": self.configs_per_trial, "seeds": self.seeds,
                "timesteps": self.timesteps}


@dataclass(frozen=True)
class Settings:
    """A study invocation, resolved: what every phase receives instead of argv."""

    study: Study
    algo: Any  # algos.AlgoSpec
    budgets: dict[str, Budget]  # by device kind ("cpu", "gpu"), each validated
    scheduler: Literal["asha", "lanes", "pbt", "none"]
    checkpoint: dict[str, float]  # checkpoint_seconds / checkpoint_chunks, for the trials' device settings
    device_bytes: int | None  # --device-memory
    sampler: str
    storage: str  # the Optuna storage URL
    address: str | None  # an existing Ray cluster; None: the embedded one
    smoke: bool
    resume_command: str  # the command that resumes this study (printed when it stops early)
    ablation: bool = True  # the ablation path after the final phase (harness.phases.ablation)
    rounds: float | None = None  # with lanes: a lane trial's length in trials (with_rounds); None: not set yet
    optuna_study: str = ""  # the Optuna study's name in the storage (with_optuna_study); "": the study's name
    time_s: float | None = None  # --time in seconds: the search runs trials until its share is spent

    @property
    def config_fields(self) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(self.algo.config_cls))

    @property
    def static_names(self) -> list[str]:
        return self.study.static_names(set(self.config_fields))

    @property
    def maximize(self) -> bool:
        return self.study.direction == "maximize"

    def budget(self, kind: str) -> Budget:
        return self.budgets["gpu" if kind == "gpu" else "cpu"]

    def pbt(self) -> dict[str, Any] | None:
        """The plans' population-based training entry, or None without PBT."""
        return self.study.pbt_plan(set(self.config_fields)) if self.scheduler == "pbt" else None

    def tune_trials(self, budget: Budget) -> int:
        """Ray Tune trials the search runs: the budget's, or with ``lanes`` one per
        :meth:`lane_rounds` of them (each as long as that many, its lanes refilled; a ``--trials``
        that grows a resumed lane study grows it by whole lane trials)."""
        if self.scheduler != "lanes":
            return budget.trials
        return max(1, math.ceil(budget.trials / self.lane_rounds(budget) - 1e-9))

    def lane_rounds(self, budget: Budget) -> float:
        """How many trials' worth of chunks one lane trial runs (:meth:`with_rounds`; before it,
        the budget's trials over one lane trial per :data:`harness.lanes.trial.ROUNDS` of them)."""
        return self.rounds or budget.trials / -(-budget.trials // ROUNDS)

    @property
    def optuna_name(self) -> str:
        return self.optuna_study or self.study.name

    def with_optuna_study(self, stored: StudyMeta | None, own_storage: bool) -> Settings:
        """With the name of this results folder's Optuna study: the one its study.json names; for a
        new folder, the study's name, or the first free ``NAME-2``, ``NAME-3``, ... in a storage that
        already holds one of that name (another folder's, whose running trials this one would fail as
        stale). ``own_storage``: the folder's own new SQLite file, so nothing is asked.

        Raises:
            StudyError: the storage cannot be opened.
        """
        if stored is not None:
            return dataclasses.replace(self, optuna_study=stored.optuna_study or self.study.name)
        if own_storage:
            return dataclasses.replace(self, optuna_study=self.study.name)
        from harness.search.storage import free_study_name  # Optuna: not at import

        return dataclasses.replace(self, optuna_study=free_study_name(self.study.name, self.storage))

    def with_open_trials(self, kind: str) -> tuple[Settings, Budget]:
        """With a time budget: the device's budget with as many trials as the time allows
        (:data:`OPEN_TRIALS` as a bound; the search stops proposing when its share is spent)."""
        key = "gpu" if kind == "gpu" else "cpu"
        budget = dataclasses.replace(self.budgets[key], trials=OPEN_TRIALS)
        return dataclasses.replace(self, budgets={**self.budgets, key: budget}), budget

    def with_rounds(self, budget: Budget, slots: int, stored: StudyMeta | None) -> Settings:
        """With ``lanes``: as few lane trials as keep each of ``slots`` trials-at-a-time busy and
        leave room for each combination of the static choices, and no more than one per
        :data:`harness.lanes.trial.ROUNDS` of the budget's trials. Fewer, longer lane trials train
        more configurations to the end, since a configuration started near a trial's end cannot
        finish (bench/RESULTS.md). A resumed study keeps its own length."""
        if self.scheduler != "lanes":
            return self
        if stored is not None and stored.scheduler == "lanes" and stored.budget:
            # its own length; None in a folder from before it was stored: lane_rounds' rule, as it started with
            return dataclasses.replace(self, rounds=stored.rounds)
        points = sum(1 for _ in static_points(self.study, set(self.config_fields)))
        lane_trials = max(1, min(-(-budget.trials // ROUNDS), max(slots, points)))
        return dataclasses.replace(self, rounds=budget.trials / lane_trials)

    def first_statics(self, budget: Budget) -> list[dict[str, Any]]:
        """The static points the first trials take in turn: with ``lanes``, every combination of
        the static choices where its lane trials leave room for each (its few long trials: each
        trained once before TPE chooses, as :meth:`with_rounds` allows for); otherwise, or with
        more combinations than lane trials, none (the sampler's choice)."""
        if self.scheduler != "lanes":
            return []
        points = list(static_points(self.study, set(self.config_fields)))
        return points if 1 < len(points) <= self.tune_trials(budget) else []

    def lanes(self, budget: Budget, broker: str) -> dict[str, Any] | None:
        """A search plan's ``lanes`` entry (``scheduler == "lanes"``), or None: rungs from 1/eta**2
        of the budget's env steps, answered by the broker named ``broker``."""
        if self.scheduler != "lanes":
            return None
        return {"eta": ETA, "min_steps": max(1, budget.timesteps // ETA**2), "budget": budget.timesteps,
                "broker": broker}

    # -- the one merge and the one factory -------------------------------------------------------
    def static_config(self, point: dict[str, Any], timesteps: int) -> dict[str, Any]:
        """The static config of a trial: the study's, its static choices, its env steps per seed
        (JSON-shaped: tuples as lists, as it is recorded)."""
        return json.loads(json.dumps({**self.study.config, **point, "total_timesteps": timesteps}))

    def hparams(self, point: dict[str, Any]) -> dict[str, float]:
        """The traced hyperparameters of a configuration: the study's fixed ones and its searched ones."""
        return {**self.study.hparams, **{k: float(v) for k, v in point.items() if k not in self.static_names}}

    def plan(self, config: dict[str, Any], hparams: list[dict[str, float]], *, seeds: int, trial: int,
             stream: int = SEARCH, pbt: dict[str, Any] | None = None,
             schedule: list[dict[str, Any]] | None = None, lanes: dict[str, Any] | None = None,
             chunks: int | None = None) -> TrialPlan:
        """The plan of one kernel of this study: ``len(hparams)`` configurations x ``seeds`` seeds
        (``lanes``, ``chunks``: its lanes refilled for ``chunks`` chunks, harness.lanes)."""
        s = self.study
        return TrialPlan(env=s.env, algo=s.algo, config=config, hparams=hparams, seeds=seeds, trial=trial,
                         study_seed=s.seed, stream=stream, objective=s.objective, threshold=s.threshold,
                         curve_episodes=s.curve_episodes, pbt=pbt, schedule=schedule, lanes=lanes, chunks=chunks)

    def chunks(self, budget: Budget) -> list[int]:
        """Chunks each static configuration of the study trains for at ``budget``."""
        return [self.algo.config_cls(**self.static_config(p, budget.timesteps)).num_chunks
                for p in static_points(self.study, set(self.config_fields))]

    def control(self, timesteps: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
        """The default configuration (the control): its values for the searched names (the
        study's ``baseline``, else the algorithm's defaults), static config and hyperparameters."""
        statics = set(self.static_names)
        config_defaults = {f.name: f.default for f in dataclasses.fields(self.algo.config_cls)}
        hp_defaults = self.algo.hparams_cls.default()
        params: dict[str, Any] = {}
        for name in self.study.space:
            if name in self.study.baseline:
                params[name] = self.study.baseline[name]
            elif name in statics:
                params[name] = self.study.config.get(name, config_defaults[name])
            else:
                params[name] = self.study.hparams.get(name, float(f"{float(getattr(hp_defaults, name)):.7g}"))
        return params, *self.configuration(params, timesteps)

    def configuration(self, point: dict[str, Any], timesteps: int) -> tuple[dict[str, Any], dict[str, float]]:
        """The static config and the hyperparameters of a point that sets every searched name."""
        statics = set(self.static_names)
        return self.static_config({n: v for n, v in point.items() if n in statics}, timesteps), self.hparams(point)

    def meta(self, budget: Budget, stored: StudyMeta | None, created: str) -> StudyMeta:
        """study.json for this invocation (a resumed study keeps when and how it was started)."""
        s = self.study
        base = stored or StudyMeta(study=s.name, env=s.env, algo=s.algo, direction=s.direction or "maximize",
                                   metric=s.metric, objective=s.objective, threshold=s.threshold,
                                   scheduler=self.scheduler, seed=s.seed, smoke=self.smoke, created=created)
        return dataclasses.replace(
            base, budget=dataclasses.asdict(budget), space={n: _kind(d) for n, d in s.space.items()},
            eval_policy=s.config.get("eval_policy", "greedy"), rounds=self.rounds or base.rounds,
            optuna_study=self.optuna_study or base.optuna_study,
            reference=None if s.reference is None else {"label": s.reference_label, "return": s.reference})


def _check_writable(root: Path) -> None:
    """Raises StudyError unless ``root`` is, or can be made as, a folder this process can write:
    tried by making it and a file in it, then removing what the try made."""
    made = [p for p in (root, *root.parents) if not p.exists()]
    probe = root / f".rl-harness-write-test-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
    except OSError as err:
        raise StudyError(f"cannot write results to {root}: {err.strerror or err} ({err.filename or root}); "
                         "choose another --out") from None
    finally:
        if probe.is_file():
            probe.unlink()
        for path in made:  # deepest first
            if path.is_dir():
                path.rmdir()


def prepare_folder(folder: ResultsFolder, study_name: str, *, fresh: bool) -> tuple[StudyMeta | None, str | None]:
    """The folder's study.json when it resumes ``study_name`` (None for a new study), and where a
    ``fresh`` start put the old folder.

    Raises:
        StudyError: the folder holds something else, or another study.
    """
    _check_writable(folder.root)
    aside = None
    if fresh and folder.root.exists():
        aside = str(folder.set_aside())
    if not folder.root.exists():
        return None, aside
    if not folder.is_study():
        if any(folder.root.iterdir()):
            raise StudyError(f"{folder.root} exists and is not a study's results folder; "
                             "choose another --out or use --fresh")
        return None, aside
    try:
        meta = folder.meta()
    except RecordsError as err:
        raise StudyError(f"{err}; choose another --out or use --fresh") from None
    if meta.study != study_name:
        raise StudyError(f"{folder.root} holds study {meta.study!r}, not {study_name!r}; "
                         "choose another --out or use --fresh")
    return meta, aside


def resolve(study: Study, options: Options, *, stored: StudyMeta | None, folder: ResultsFolder,
            resume_command: str) -> Settings:
    """Checks everything that can be checked before Ray starts and returns the settings.

    Raises:
        StudyError: an unknown algorithm or env, an env that breaks the contract, a budget or search
            space that cannot work (at either device's budget), a resumed study's fixed budget changed,
            a scheduler that cannot run at this budget, a bad --checkpoint-every or --device-memory,
            an --address that does not answer, a --storage that cannot be opened, an empty value.
    """
    import algos  # JAX: when a study is resolved, not at import
    import envs

    try:
        spec = algos.get(study.algo)
        env, env_params = envs.make(study.env)
        envs.check(env, env_params)  # before Ray starts: a broken env fails here, in one line
    except (algos.UnknownAlgoError, envs.UnknownEnvError, envs.EnvContractError) as err:
        raise StudyError(f"study {study.name}: {err}") from None
    for flag, value in (("--address", options.address), ("--storage", options.storage),
                        ("--device-memory", options.device_memory)):
        if value is not None and not value.strip():
            raise StudyError(f"{flag} is empty: give a value or leave it out")
    scheduler = options.scheduler or study.scheduler
    if options.time is not None and options.trials is not None:
        raise StudyError("--time and --trials cannot go together: --time runs trials until the search's share of "
                         "the time is spent; give one of them")
    if options.time is not None and scheduler == "lanes":
        raise StudyError("--time runs whole trials until the search's share is spent, and a lane trial is as long "
                         "as several; use --scheduler asha, none or pbt with --time")
    if options.top_k is not None:
        if options.top_k < 0:
            raise StudyError(f"--top-k must be 0 or more, got {options.top_k}")
        study = dataclasses.replace(study, top_k=options.top_k)
    checkpoint = parse_checkpoint_every(options.checkpoint_every)
    device_bytes = parse_bytes(options.device_memory) if options.device_memory else None
    budgets = {kind: resolve_budget(study, options, kind, stored, folder) for kind in ("cpu", "gpu")}
    if scheduler == "pbt" and options.smoke:
        study, budgets = _smoke_pbt(study, budgets, spec)
    settings = Settings(study=study, algo=spec, budgets=budgets, scheduler=scheduler,  # type: ignore[arg-type]
                        checkpoint=checkpoint, device_bytes=device_bytes, sampler=options.sampler,
                        storage=options.storage or folder.optuna_url(), address=options.address,
                        smoke=options.smoke, resume_command=resume_command, ablation=options.ablation,
                        time_s=None if options.time is None else parse_duration(options.time))
    if options.smoke:
        settings = _smoke_statics(settings)
    client = (options.address or "").startswith("ray://")
    if scheduler == "lanes" and client and settings.storage.startswith("sqlite"):
        raise StudyError("--scheduler lanes through a Ray client (ray://) needs an Optuna storage every node can "
                         "reach (--storage postgresql://... or mysql://...): its broker runs on the cluster, "
                         "and an SQLite file is on this machine")
    if scheduler == "lanes" and study.curve_episodes < 1:
        raise StudyError(f"study {study.name}: --scheduler lanes judges each configuration by its evaluations "
                         f"during training, and curve_episodes={study.curve_episodes} evaluates none; set "
                         "curve_episodes >= 1 or choose another scheduler")
    fields = set(settings.config_fields)
    for budget in dict.fromkeys(budgets.values()):
        validate(study, spec.config_cls, spec.hparams_cls, timesteps=budget.timesteps)
    from algos.check import check  # JAX

    for i, point in enumerate(static_points(study, fields)):  # the algorithm takes this env (SAC: continuous)
        try:
            config = spec.config_cls(**settings.static_config(point, budgets["cpu"].timesteps))
            # a user's algorithm is traced as the kernel runs it (once: its code is the same at every point)
            algo = (check(spec, env, env_params, config, trace=i == 0 and not algos.is_builtin(study.algo))
                    or spec.make(config, env, env_params))
        except ValueError as err:  # algos.check.AlgoContractError too
            raise StudyError(f"study {study.name}: {err}") from None
        if scheduler == "pbt":
            if not algo.learner_fields:
                raise StudyError(f"study {study.name}: population-based training copies a learner between "
                                 f"configurations, and algo {study.algo} declares no Algo.learner_fields")
            validate_pbt(study, fields, configs_per_trial=budget.configs_per_trial,
                         chunks=min(settings.chunks(budget)))
    _check_reachable(options)  # last: the checks above need no network
    return settings


def _check_reachable(options: Options) -> None:
    """The cluster and the Optuna storage the user named answer now: said before Ray starts (and
    before --fresh moves old results aside), in one line."""
    if options.address:
        check_address(options.address)
    if options.storage:
        from harness.search.storage import check_storage  # Optuna: only when a storage is named

        check_storage(options.storage)


def check_address(address: str) -> None:
    """That ``--address`` is ``auto``/``local``, or a host:port (``ray://`` too: Ray's client) that
    accepts a connection now: said in one line at once, not after Ray's own timeouts.

    Raises:
        StudyError: neither (the cluster's session says it as a ``ClusterError``).
    """
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise StudyError(f"--address {address!r} is not host:port, 'auto' or ray://host:port")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as err:
        raise StudyError(f"cannot reach a Ray cluster at {address} ({err.strerror or err}); "
                         "start one with `ray start --head` or leave out --address") from None


def resolve_budget(study: Study, options: Options, kind: str, stored: StudyMeta | None,
                   folder: ResultsFolder) -> Budget:
    """The budget on a ``kind`` device: the study's (``--smoke``: its smoke budget), the options
    over it; a resumed study keeps its C, S and env steps (``--trials`` may grow it).

    Raises:
        StudyError: a value below 1, or a fixed value changed on resume.
    """
    base = study.smoke if options.smoke else (study.gpu if kind == "gpu" else study.cpu)
    given = options.given()
    for k, v in given.items():
        if v is not None and v < 1:
            raise StudyError(f"--{k.replace('_', '-')} must be >= 1, got {v}")
    values = {**dataclasses.asdict(base), **{k: v for k, v in given.items() if v is not None}}
    if stored is not None and stored.budget:
        for k in RESUME_FIXED:
            if given[k] is not None and given[k] != stored.budget[k]:
                raise StudyError(f"{folder.root} was started with --{k.replace('_', '-')} {stored.budget[k]}; "
                                 f"resume with the same value or use --fresh")
            values[k] = stored.budget[k]
        if given["trials"] is None:
            values["trials"] = stored.budget["trials"]
    return Budget(**values)


def _smoke_statics(settings: Settings) -> Settings:
    """``--smoke``: the static (shape-changing) choices fixed at the control's values, so the whole
    smoke run (search trials, re-training, control) compiles one kernel shape, once; the searched
    hyperparameters are still searched."""
    statics = settings.static_names
    if not statics or len(statics) == len(settings.study.space):  # nothing else to search: keep them
        return settings
    params, _, _ = settings.control(1)
    s = settings.study
    study = dataclasses.replace(s, config={**s.config, **{n: params[n] for n in statics}},
                                space={k: v for k, v in s.space.items() if k not in statics},
                                baseline={k: v for k, v in s.baseline.items() if k not in statics})
    return dataclasses.replace(settings, study=study)


def _smoke_pbt(study: Study, budgets: dict[str, Budget], spec: Any) -> tuple[Study, dict[str, Budget]]:
    """``--smoke --scheduler pbt``: the smoke budget made big enough for one exploit step (enough
    configurations for one to be replaced, at least two chunks, an interval shorter than the trial)."""
    settings = study.pbt or PBT()
    need = math.ceil(1 / settings.fraction) if 0 < settings.fraction <= 0.5 else 1
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}

    def configs(timesteps: int) -> list[Any]:
        return [spec.config_cls(**{**study.config, **p, "total_timesteps": timesteps})
                for p in static_points(study, fields)]

    out = {}
    for kind, b in budgets.items():
        timesteps = max([b.timesteps] + [c.env_steps_after(2) for c in configs(b.timesteps) if c.num_chunks < 2])
        out[kind] = dataclasses.replace(b, configs_per_trial=max(b.configs_per_trial, need), timesteps=timesteps)
    chunks = min(c.num_chunks for b in out.values() for c in configs(b.timesteps))
    if settings.interval >= chunks:
        study = dataclasses.replace(study, pbt=dataclasses.replace(settings, interval=max(1, chunks // 2)))
    return study, out


def parse_checkpoint_every(text: str) -> dict[str, float]:
    """``--checkpoint-every``: '90s' / '90', '4chunks' or 'never' as the trials' device settings.

    Raises:
        StudyError: anything else.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|seconds?|chunks?)?\s*", text or "")
    if (text or "").strip().lower() in ("never", "off", "0"):
        return {"checkpoint_seconds": 0, "checkpoint_chunks": 0}
    if not m or float(m.group(1)) <= 0 or (m.group(2) or "").startswith("chunk") and not m.group(1).isdigit():
        raise StudyError(f"--checkpoint-every {text!r}: give seconds ('60s'), chunks ('4chunks') or 'never'")
    if (m.group(2) or "s").startswith("chunk"):
        return {"checkpoint_seconds": 0, "checkpoint_chunks": int(m.group(1))}
    return {"checkpoint_seconds": float(m.group(1)), "checkpoint_chunks": 0}


def parse_bytes(text: str) -> int:
    """``"80GiB"``, ``"512MB"``, ``"1e9"`` -> bytes (binary units either way).

    Raises:
        StudyError: not a size.
    """
    t = text.strip().lower().replace(" ", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    try:
        value = float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise StudyError(f"--device-memory {text!r} is not a size (e.g. 80GiB, 512MiB)") from None
    if value <= 0:
        raise StudyError(f"--device-memory {text!r} must be positive")
    return int(value)


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}


def _kind(dist: Any) -> str:
    """How a searched name is plotted: ``log``, ``uniform``, ``int`` or ``categorical``."""
    if isinstance(dist, LogUniform) or (isinstance(dist, Int) and dist.log):
        return "log"
    return {Int: "int", Categorical: "categorical"}.get(type(dist), "uniform")
