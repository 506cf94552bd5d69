"""Optuna proposes, Ray Tune schedules: a Tune ``Searcher`` that asks Optuna C times per trial.

Each Tune trial is one kernel of C configurations sharing a static config. The first Optuna
trial of a batch samples everything; the other C-1 are enqueued with the same static values and
sample only the traced hyperparameters. When the Tune trial ends, each Optuna trial is told its
own result: COMPLETE with its score, PRUNED when the scheduler stopped the trial early, FAIL when
it diverged or the trial errored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import optuna
from ray.tune.search import Searcher

from harness.kernel.plan import TrialPlan
from harness.kernel.stats import config_score, reported_chunks
from harness.search import optuna_private as private
from harness.search.storage import storage
from harness.space import Categorical, Int, LogUniform, Study, Uniform, label
from harness.store.folder import InFlight
from harness.store.records import TrialRecord

optuna.logging.set_verbosity(optuna.logging.WARNING)

TRIAL_ATTR = "tune_trial"  # user attr: the Tune trial number an Optuna trial belongs to
CONFIG_ATTR = "config_index"


SAMPLERS = ("tpe", "random", "qmc")


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, constant liar for proposals still running), random, or quasi-random."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, scramble=True)
    raise ValueError(f"unknown sampler {name!r}; known samplers: {', '.join(SAMPLERS)}")


def open_study(study: Study, url: str, *, seed: int | None = None, sampler: str = "tpe",
               pruner: optuna.pruners.BasePruner | None = None, stream: int = 0,
               beside: optuna.Study | None = None, name: str | None = None) -> optuna.Study:
    """The Optuna study for ``study`` in the storage at ``url`` (created on first use), named
    ``name`` there (default: the study's name; a results folder's: ``Settings.optuna_name``). Without a
    ``seed``, the sampler's seed moves on with the study (the study's seed and its trials so far),
    so a resumed study does not replay the proposals it made before it was interrupted.
    ``beside``: a handle opened before in this process, whose storage (and its cache of trials)
    this one shares, so a trial created through either can be sampled by the other."""
    direction = "maximize" if study.direction == "maximize" else "minimize"
    store = private.storage(beside) if beside is not None else storage(url)
    name = name or study.name
    if seed is None:
        try:
            told = len(optuna.load_study(study_name=name, storage=store).get_trials(deepcopy=False))
        except KeyError:
            told = 0
        seed = study.seed * 1_000_003 + told + stream * 7_919_993  # stream: another process asking too
    return optuna.create_study(study_name=name, storage=store, sampler=make_sampler(sampler, seed),
                               direction=direction, load_if_exists=True, pruner=pruner)


def suggest(trial: optuna.Trial, space: dict[str, Any]) -> dict[str, Any]:
    """Values for every name in ``space`` from an Optuna trial (static choices decoded)."""
    out: dict[str, Any] = {}
    for name, dist in space.items():
        if isinstance(dist, LogUniform):
            out[name] = trial.suggest_float(name, dist.low, dist.high, log=True)
        elif isinstance(dist, Uniform):
            out[name] = trial.suggest_float(name, dist.low, dist.high)
        elif isinstance(dist, Int):
            out[name] = trial.suggest_int(name, dist.low, dist.high, log=dist.log)
        elif isinstance(dist, Categorical):
            out[name] = dist.value(trial.suggest_categorical(name, dist.labels()))
        else:  # pragma: no cover - Study validation rejects other types
            raise TypeError(f"unsupported distribution for {name}: {dist!r}")
    return out


def decoded(params: dict[str, Any], space: dict[str, Any]) -> dict[str, Any]:
    """An Optuna trial's params as ``suggest`` returns them (static choices decoded from their labels)."""
    return {n: space[n].value(v) if isinstance(space.get(n), Categorical) else v for n, v in params.items()}


def encoded(point: dict[str, Any], space: dict[str, Any]) -> dict[str, Any]:
    """``point``'s values as Optuna holds them (static choices as their labels): ``decoded``'s inverse."""
    return {n: label(v) if isinstance(space.get(n), Categorical) else v for n, v in point.items()}


def next_trial_number(ostudy: optuna.Study) -> int:
    numbers = [t.user_attrs.get(TRIAL_ATTR, -1) for t in ostudy.get_trials(deepcopy=False)]
    return max(numbers, default=-1) + 1


PlanFactory = Callable[[list[dict[str, Any]], int], TrialPlan]  # (points, trial number) -> plan


class BatchedOptunaSearcher(Searcher):
    """Proposes one Tune trial = C Optuna trials sharing their static values.

    Args:
        study: the study definition (search space, metric, direction).
        ostudy: the Optuna study (its storage keeps the search resumable).
        static_names: the searched names that are static config fields.
        configs_per_trial: C.
        make_plan: the trial's plan from its C points (searched values) and its trial number.
        extra: added to every trial's Tune config (device settings).
        on_complete: called with the trial's record when a Tune trial ends, before
            Optuna is told, so a crash in between is repaired from the record on resume.
        is_pruned: tells whether the scheduler stopped a Tune trial early.
        on_suggest: called with a trial's :class:`~harness.store.folder.InFlight` entry when it is
            proposed, so a driver killed meanwhile can go on with it.
        adopt: in-flight entries of a killed driver, proposed again first (same trial number,
            plan and Optuna trials) with ``resume_from``: their checkpoints, newest first.
        first_statics: static points (``{name: value}``) that trials take in turn, each until a
            trial that did not fail has it, before the sampler chooses (a lane study's few long
            trials: each combination of the static choices trained once, which TPE may not do).
    """

    def __init__(self, study: Study, ostudy: optuna.Study, *, static_names: list[str],
                 configs_per_trial: int, make_plan: PlanFactory, extra: dict[str, Any],
                 on_complete: Callable[[TrialRecord], None], is_pruned: Callable[[str], bool],
                 on_suggest: Callable[[InFlight], None] | None = None,
                 adopt: list[InFlight] | None = None, first_statics: list[dict[str, Any]] | None = None) -> None:
        super().__init__(metric="score", mode="max" if study.direction == "maximize" else "min")
        self.study, self.ostudy = study, ostudy
        self.static_names, self.c = static_names, configs_per_trial
        self.make_plan, self.extra = make_plan, extra
        self.on_complete, self.is_pruned = on_complete, is_pruned
        self.live: dict[str, tuple[list[optuna.Trial], list[dict[str, Any]], TrialPlan]] = {}
        self.curves: dict[str, dict[int, dict[str, Any]]] = {}
        self.nodes: dict[str, list[str]] = {}  # the Ray nodes (IPs) each trial ran on, in order
        self._next = next_trial_number(ostudy)
        self.on_suggest, self.adopt = on_suggest, list(adopt or [])
        self.first_statics = [encoded(p, study.space) for p in first_statics or []]
        self.reported: set[tuple[int, int]] = set()  # (Optuna number, step) already told to Optuna
        self.lane_ended: dict[str, dict[int, dict[str, Any]]] = {}  # lane trials: configurations ended so far

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self.adopt:
            return self._adopt(trial_id, self.adopt.pop(0))
        number, self._next = self._next, self._next + 1
        if (point := self._untaken_static()) is not None:
            self.ostudy.enqueue_trial(point)
        first = self.ostudy.ask()
        points = [suggest(first, self.study.space)]
        trials = [first]
        fixed = {n: first.params[n] for n in self.static_names}
        for _ in range(self.c - 1):
            self.ostudy.enqueue_trial(fixed)
            t = self.ostudy.ask()
            points.append(suggest(t, self.study.space))
            trials.append(t)
        for i, t in enumerate(trials):
            t.set_user_attr(TRIAL_ATTR, number)
            t.set_user_attr(CONFIG_ATTR, i)
        plan = self.make_plan(points, number)
        if plan.lanes is not None:  # lanes refilled: each configuration keyed by its Optuna number
            plan = replace(plan, config_keys=[t.number for t in trials],
                           lanes={**plan.lanes, "static": fixed, "params": points})
        self.live[trial_id] = (trials, points, plan)
        if self.on_suggest:
            self.on_suggest(InFlight(trial=number, plan=asdict(plan), points=points,
                                     optuna_numbers=[t.number for t in trials], tune_trial_ids=[trial_id]))
        return {"plan": asdict(plan), "study": self.study.name, **self.extra}

    def _untaken_static(self) -> dict[str, Any] | None:
        """The first of ``first_statics`` that no trial of the study has, but failed ones
        (a resumed study's too; a killed driver's trials that never started are failed)."""
        if not self.first_statics:
            return None
        taken = {tuple(t.params.get(n) for n in self.static_names) for t in self.ostudy.get_trials(deepcopy=False)
                 if TRIAL_ATTR in t.user_attrs and t.state != optuna.trial.TrialState.FAIL}
        return next((p for p in self.first_statics if tuple(p[n] for n in self.static_names) not in taken), None)

    def _adopt(self, trial_id: str, entry: InFlight) -> dict[str, Any]:
        """A killed driver's in-flight trial, proposed again as it was (its Optuna trials still RUNNING)."""
        frozen = {t.number: t for t in self.ostudy.get_trials(deepcopy=False)}
        trials = [optuna.trial.Trial(self.ostudy, private.trial_id(frozen[n])) for n in entry.optuna_numbers]
        self.reported |= {(n, step) for n in entry.optuna_numbers for step in frozen[n].intermediate_values}
        plan = TrialPlan(**entry.plan)
        self.live[trial_id] = (trials, entry.points, plan)
        if self.on_suggest:
            self.on_suggest(replace(entry, tune_trial_ids=[*entry.tune_trial_ids, trial_id], resume_from=()))
        return {"plan": asdict(plan), "study": self.study.name, **self.extra,
                "resume_from": list(entry.resume_from)}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        for row in json.loads(result.get("restored_curves") or "[]"):  # chunks run before a restore
            self.curves.setdefault(trial_id, {}).setdefault(int(row["chunk"]), row)
        nodes = self.nodes.setdefault(trial_id, [])
        if result.get("node_ip") and result["node_ip"] not in nodes[-1:]:
            nodes.append(result["node_ip"])
        if "returns" in result and "chunk" in result:
            self.curves.setdefault(trial_id, {})[int(result["chunk"])] = {
                "chunk": int(result["chunk"]), "env_steps": int(result["env_steps"]),
                "returns": result["returns"],
                **{k: result[k] for k in ("evals", "objective") if k in result},
                **({"pbt": json.loads(result["pbt"])} if result.get("pbt") else {})}
        if trial_id in self.live and self.live[trial_id][2].lanes is not None:
            ended = self.lane_ended.setdefault(trial_id, {})  # kept should the trial end in an error
            ended.update({c["optuna_number"]: c for c in json.loads(result.get("lane_ended") or "[]")})
            return  # its lanes' broker reports their configurations to Optuna
        if trial_id in self.live and result.get("num_chunks"):  # the curves so far, live
            picked = reported_chunks(int(result["num_chunks"]))
            rows = [r for k, r in sorted(self.curves.get(trial_id, {}).items()) if k in picked]
            self._report(trial_id, rows)

    def _report(self, trial_id: str, rows: list[dict[str, Any]]) -> None:
        """Each configuration's objective after each of ``rows``' chunks as Optuna intermediate
        values (step = env steps per seed), each (trial, step) once: Optuna's pruners and
        optuna-dashboard see the curves while the trial runs. A diverged seed's value is None, so
        the others' mean is reported."""
        trials = self.live[trial_id][0]
        for row in rows:
            if row.get("objective") is None:
                continue
            step = int(row["env_steps"])
            for i, t in enumerate(trials):
                value = config_score(row["objective"][i], None, self.study.metric)
                if value is not None and (t.number, step) not in self.reported:
                    t.report(value, step=step)
                    self.reported.add((t.number, step))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self.live:
            return
        if result:  # the last result may arrive only here (e.g. when the scheduler stops a trial)
            self.on_trial_result(trial_id, result)
        trials, points, plan = self.live[trial_id]
        if plan.lanes is not None:
            self._complete_lanes(trial_id, result, error)
            return
        if result and result.get("final"):
            status = "complete"
        elif not error and result is not None and self.is_pruned(trial_id):
            status = "pruned"
        else:
            status = "failed"
        result = result or {}
        configs = []
        for i, (t, p) in enumerate(zip(trials, points, strict=True)):
            rec: dict[str, Any] = {"index": i, "optuna_number": t.number, "params": p,
                                   "hparams": plan.hparams[i], "pruned": status == "pruned",
                                   "scores": result["scores"][i] if status == "complete" else None,
                                   "final_returns": result["final_returns"][i]
                                   if status == "complete" and "final_returns" in result else None,
                                   "diverged": (result.get("diverged") or [None] * len(trials))[i]}
            if result.get("final_hparams") and plan.pbt:
                rec["final_hparams"] = result["final_hparams"][i]
            if status == "pruned":  # the objective at the rung where the scheduler stopped it
                rec["last_value"] = config_score(result.get("objective", [[]] * len(trials))[i])
            configs.append(rec)
        by_chunk = self.curves.pop(trial_id, {})
        curves = [by_chunk[k] for k in sorted(by_chunk)]
        record = TrialRecord.from_dict({
            "trial": plan.trial, "tune_trial_id": trial_id, "status": status, "metric": self.study.metric,
            "objective": plan.objective, "threshold": plan.threshold, "pbt": plan.pbt,
            "static": plan.config, "seeds": plan.seeds, "configs": configs, "curves": curves,
            "env_steps": int(result.get("env_steps", 0)), "nodes": self.nodes.pop(trial_id, []),
            **{k: result[k] for k in RECORDED if k in result}}, f"trial {plan.trial}'s record")
        self.on_complete(record)
        if curves:  # the last chunk too (where the scheduler stopped it), if the spacing skipped it
            self._report(trial_id, curves[-1:])
        self.live.pop(trial_id)
        self.reported -= {(t.number, c["env_steps"]) for t in trials for c in curves}
        if plan.pbt:
            for t, c in zip(trials, record.configs, strict=True):
                t.set_user_attr("pbt", "hyperparameters changed mid-run by population-based training; "
                                       "told FAIL so TPE does not learn from them; value in pbt_value")
                if (value := c.value(self.study.metric)) is not None and status == "complete":
                    t.set_user_attr("pbt_value", value)
        tell(self.ostudy, record)

    def _complete_lanes(self, trial_id: str, result: dict | None, error: bool) -> None:
        """The record of a trial whose lanes were refilled: every configuration that ended in it
        (its own status, curve and why it stopped, also those reported before the trial failed);
        those still running when it failed as failed (and told FAIL)."""
        trials, points, plan = self.live.pop(trial_id)
        self.curves.pop(trial_id, None)
        result = result or {}
        status = "complete" if result.get("final") and not error else "failed"
        by_number = self.lane_ended.pop(trial_id, {})
        by_number.update({c["optuna_number"]: c for c in json.loads(result.get("lane_configs") or "[]")})
        configs = sorted(by_number.values(), key=lambda c: c["index"])
        failed = {"status": "failed", "stopped": "its trial failed", "pruned": False, "scores": None,
                  "final_returns": None, "diverged": None, "env_steps": None}
        for i, (t, p, h) in enumerate(zip(trials, points, plan.hparams, strict=True)):
            if t.number not in by_number:  # a first configuration: its index is its lane's
                configs.append({"index": i, "optuna_number": t.number, "params": p, "hparams": h, **failed})
        running = [t for t in self.ostudy.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
                   if t.user_attrs.get(TRIAL_ATTR) == plan.trial and "after_chunk" in t.user_attrs]
        for t in running:  # refills the trial was training when it failed
            if t.number not in by_number:
                params = decoded(t.params, self.study.space)
                configs.append({"index": max(c["index"] for c in configs) + 1, "optuna_number": t.number,
                                "params": params, "hparams": None, **failed})
        configs.sort(key=lambda c: c["index"])
        record = TrialRecord.from_dict({
            "trial": plan.trial, "tune_trial_id": trial_id, "status": status, "metric": self.study.metric,
            "objective": plan.objective, "threshold": plan.threshold, "pbt": None, "lanes": plan.lanes,
            "plan": asdict(plan),  # its first lanes: with the configurations, lanes.trial.replay's input
            "static": plan.config, "seeds": plan.seeds, "configs": configs, "curves": [],
            "env_steps": int(result.get("env_steps", 0)), "nodes": self.nodes.pop(trial_id, []),
            **{k: result[k] for k in RECORDED if k in result}}, f"trial {plan.trial}'s record")
        self.on_complete(record)
        tell(self.ostudy, record)

    def save(self, checkpoint_path: str) -> None:  # state lives in Optuna's storage and our records
        pass

    def restore(self, checkpoint_path: str) -> None:
        pass


# what a trial's last result adds to its record as it is: timings, its error, how it was resumed
RECORDED = ("kernel_seconds", "compile_seconds", "trial_seconds", "error", "resumed_after_chunk", "checkpoints",
            "checkpoint_seconds", "broker_seconds", "lanes_seconds")


def tell(ostudy: optuna.Study, record: TrialRecord) -> None:
    """Tells each Optuna trial of a trial record its state (idempotent)."""
    for c in record.configs:
        number = c.optuna_number
        status = record.status_of(c)  # a refilled lane's configuration has its own
        value = c.value(record.metric) if status == "complete" else None
        if record.pbt:  # its hyperparameters changed mid-run: keep it out of TPE's model
            ostudy.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        elif status == "pruned":
            ostudy.tell(number, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
        elif value is not None:
            ostudy.tell(number, value, skip_if_finished=True)
        else:
            ostudy.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)


def reconcile(ostudy: optuna.Study, records: list[TrialRecord], keep: set[int] = frozenset()) -> int:
    """After a killed driver: tells Optuna what the records know; marks the rest FAIL but those
    numbered in ``keep`` (in-flight trials that go on).

    Returns the number of Optuna trials marked FAIL or told from a record.
    """
    by_number = {c.optuna_number: r for r in records for c in r.configs}
    stale = [t for t in ostudy.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,
                                                                  optuna.trial.TrialState.WAITING))
             if t.number not in keep or t.number in by_number]
    for t in stale:
        if t.state == optuna.trial.TrialState.WAITING:
            ostudy.ask()  # pops a waiting trial so it can be told
    done = set()
    for t in stale:
        if t.number in by_number and id(by_number[t.number]) not in done:
            tell(ostudy, by_number[t.number])
            done.add(id(by_number[t.number]))
        ostudy.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    return len(stale)
