"""Lane-level successive halving: a trial's kernel keeps its C x S shape for its whole life while
each lane (one configuration, its S seeds) is judged at the study's rungs and refilled with a new
configuration when it stops.

Two sides, one round trip per chunk per trial:

- :class:`LaneBroker` owns the lanes' Optuna trials (in the driver's process or, under Ray, an
  actor on the driver's node: ``harness.phases.search_phase``). Each lane's configuration is an
  Optuna trial that reports its curve after each chunk; at each rung (``min_steps * eta**r`` env
  steps per seed) Optuna's ``SuccessiveHalvingPruner`` judges it against every configuration of
  the study that reached that rung, lanes of the same chunk together. An ended configuration is
  told to Optuna and its lane gets a new proposal with the trial's static values: TPE's, but one
  in ``EXPLORE`` at random, as in BOHB.
- :class:`~harness.lanes.trial.LaneTrial` is the trial's side (inside its worker): after each chunk
  it asks the broker, records the configurations that ended and refills their lanes on the device
  (``harness.kernel.runners.LaneRunner.refill``).

The successive-halving pruner is asynchronous successive halving itself and needs no brackets,
which a fixed-width kernel would fill with the same lanes. The Optuna private names it relies on
are in :mod:`harness.search.optuna_private`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import optuna

from harness.kernel.stats import config_score
from harness.lanes.trial import ETA
from harness.search import optuna_private as private
from harness.search.searcher import CONFIG_ATTR, TRIAL_ATTR, open_study, suggest

EXPLORE = 3  # with TPE, refills whose Optuna number is a multiple of EXPLORE are proposed at random
ANSWERS_KEPT = 4096  # the broker's latest answers kept in memory (a replayed chunk's; older ones: from storage)
VERDICT_ATTR = "verdict"  # a lane's Optuna trial: its latest judgement {"at": env steps, "prune", "attrs"}


class LaneBroker:
    """The Optuna side: reports lanes at their rungs, asks the pruner, tells ended configurations,
    proposes new ones with a trial's static values. One call per chunk per trial (:meth:`step`);
    a trial that replays chunks after a restart gets the same answers (and the same new
    configurations) again: the latest ``ANSWERS_KEPT`` are kept per (trial, chunk), and any
    other is answered again from what the study's storage holds (as a new broker does after a
    kill: who was told what, each verdict, each refill asked)."""

    def __init__(self, study: Any, storage: str, *, static_names: list[str],
                 hparams: Callable[[dict[str, Any]], dict[str, float]], min_steps: int, eta: int = ETA,
                 sampler: str = "tpe", name: str | None = None) -> None:
        self.study, self.static_names, self.hparams = study, static_names, hparams
        self.min_steps, self.eta = min_steps, eta
        self.pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, min_steps), reduction_factor=eta,
                                                             min_early_stopping_rate=0)
        # its own sampler stream: the driver's searcher asks the same study for the trials' first lanes
        self.ostudy = open_study(study, storage, sampler=sampler, pruner=self.pruner, stream=1, name=name)
        # BOHB's random fraction: TPE fitted on early survivors stays near the first promoted region,
        # and a random proposal is cheap where most stop at the first rung
        self.explore = None
        if sampler == "tpe":
            self.explore = open_study(study, storage, sampler="random", pruner=self.pruner, stream=2,
                                      beside=self.ostudy, name=name)
        self.answers: dict[tuple[int, int], dict[str, Any]] = {}
        self._trials: dict[int, Any] = {}
        self._running: set[int] = set()  # Optuna trials this broker has seen running
        self._asked: dict[tuple[int, int, int], int] | None = None  # (trial, chunk, lane) -> a refill asked before

    def ping(self) -> bool:
        return True

    def _trial(self, number: int) -> Any:
        if number not in self._trials:
            self._trials[number] = private.trial_by_number(self.ostudy, number)
        return self._trials[number]

    def step(self, trial: int, chunk: int, static: dict[str, Any], lanes: list[dict[str, Any]],
             refill: bool) -> dict[str, Any]:
        """After the trial's ``chunk`` (1-based): ``lanes`` are its running lanes' reports
        (:meth:`LaneTrial.reports`). Returns ``{"ended": {lane: {status, why, ...}},
        "new": {lane: {number, params, hparams}}}``: the lanes whose configuration ended and
        (when ``refill``) their new configurations."""
        key = (trial, chunk)
        if key not in self.answers:
            if len(self.answers) >= ANSWERS_KEPT:  # the oldest: a replay that needs it is answered from storage
                del self.answers[next(iter(self.answers))]
            self.answers[key] = self._step(trial, chunk, static, lanes, refill)
        return self.answers[key]

    def _step(self, trial: int, chunk: int, static: dict[str, Any], lanes: list[dict[str, Any]],
              refill: bool) -> dict[str, Any]:
        ended: dict[int, dict[str, Any]] = {}
        metric = self.study.metric
        judged: list[tuple[float, Any, dict[str, Any]]] = []  # lanes at a rung: (value, Optuna trial, report)
        going: list[tuple[Any, dict[str, Any]]] = []  # lanes whose configuration goes on
        for r in lanes:
            t = self._trial(r["number"])
            told = self._told(t)
            if told is not None:  # ended before (by an earlier broker, or an answer no longer kept)
                if r["steps"] >= told["at"]:
                    ended[r["lane"]] = {"status": told["status"], "why": told["why"]}
                continue
            if r.get("now") is not None and (now := config_score(r["now"], None, metric)) is not None \
                    and r["steps"] not in private.cached(t).intermediate_values:  # (once: a replayed chunk)
                t.report(now, step=int(r["steps"]))  # its curve between rungs (a rung's value is reported
                # where it is judged)
            if r["diverged"]:
                ended[r["lane"]] = self._stop(t, r, "diverged", "diverged")
            elif r["finished"]:
                value = config_score(r["scores"], None, metric)
                ended[r["lane"]] = self._stop(t, r, "complete", "trained its whole budget", value)
            elif r["rung"] is not None and (value := config_score(r["values"], None, metric)) is not None:
                judged.append((value, t, r))
            else:
                going.append((t, r))
        self._judge_batch(judged, ended, going)
        for t, r in going:
            if r["last"]:  # the trial's budget ends before this configuration's does
                ended[r["lane"]] = self._stop(t, r, "pruned", "cut short: the trial's budget ended")
        return {"ended": ended, "new": self._refills(trial, chunk, static, sorted(ended)) if refill else {}}

    def _judge_batch(self, judged: list[tuple[float, Any, dict[str, Any]]], ended: dict[int, dict[str, Any]],
                     going: list[tuple[Any, dict[str, Any]]]) -> None:
        """The lanes of one chunk at a rung (``judged``: value, Optuna trial, report): each stopped
        (into ``ended``) or going on (into ``going``)."""
        # Each lane is judged rung by rung with its whole batch counted: judged one after another,
        # a lane would go on merely for beating the lanes judged before it.
        values: dict[int, float] = {}  # Optuna number -> its value now
        at: dict[int, int] = {}  # Optuna number -> the first rung it is judged at
        top: dict[int, int] = {}  # Optuna number -> the last rung its env steps have passed
        verdicts: dict[int, dict[str, Any]] = {}  # Optuna number -> a verdict a broker before this one wrote
        for value, t, r in judged:
            frozen = private.latest(t)
            verdict = frozen.user_attrs.get(VERDICT_ATTR)
            if verdict is not None and verdict["at"] >= r["steps"]:  # judged here (or later) before a kill
                verdicts[t.number] = verdict if verdict["at"] == r["steps"] else {"prune": False, "attrs": {}}
                continue
            if r["steps"] not in frozen.intermediate_values:
                t.report(value, step=int(r["steps"]))
            # Optuna's rung count, a rung behind the lane's own where a rung value could not be computed
            values[t.number], at[t.number] = value, private.current_rung(private.latest(t))
            top[t.number] = r["rung"]  # its report's rung: the last its steps passed (none past the budget)
        # the study's trials read once per batch, not per lane: the pruner sees them with the batch's
        # rung values so far (rung_attrs) and the rest of the batch at the rung being judged (_WithBatch)
        trials = self.ostudy.get_trials(deepcopy=False) if at else []
        rung_attrs: dict[int, dict[str, Any]] = {}
        new = {t.number: {"at": int(r["steps"]), "prune": False, "attrs": {}}
               for _, t, r in judged if t.number in at}
        by_number = {t.number: t for _, t, _ in judged}
        for rung in range(min(at.values(), default=0), max(top.values(), default=-1) + 1):
            batch = {n: values[n] for n in at if at[n] <= rung <= top[n] and not new[n]["prune"]}
            step = max(1, self.min_steps) * self.eta**rung  # the rung's own step (the pruner's min_resource)
            for n in batch:
                prune, written = _judge(self.pruner, self.ostudy, by_number[n], step, rung, batch, trials,
                                        rung_attrs)
                rung_attrs.setdefault(n, {}).update(written)
                new[n]["attrs"].update(written)
                new[n]["prune"] = prune
        for _, t, r in judged:
            verdict = verdicts.get(t.number)
            if verdict is None:  # written before anything it decides: a broker killed in between answers as it did
                verdict = new[t.number]
                t.set_user_attr(VERDICT_ATTR, verdict)
            for key, value in verdict["attrs"].items():  # the pruner's rung values, written after its verdict
                private.set_system_attr(self.ostudy, t, key, value)
            if verdict["prune"]:  # at the last rung Optuna wrote a value for (at those before it, promoted)
                where = max((int(k.rpartition("_")[2]) for k in verdict["attrs"]), default=r["rung"])
                why = f"stopped at rung {where + 1} ({r['steps']} env steps)"
                ended[r["lane"]] = self._stop(t, r, "pruned", why)
            elif not r["reach"]:  # promoted, but the trial ends before its next judgement:
                # stopped now, so its lane trains a new configuration instead of one that cannot finish
                ended[r["lane"]] = self._stop(t, r, "pruned", f"cut short at rung {r['rung'] + 1}: the trial "
                                                              "ends before its next judgement")
            else:
                going.append((t, r))

    def _refills(self, trial: int, chunk: int, static: dict[str, Any],
                 lanes: list[int]) -> dict[int, dict[str, Any]]:
        """New configurations with the trial's ``static`` values for ``lanes`` (ended after ``chunk``)."""
        new: dict[int, dict[str, Any]] = {}
        step_trials: list[Any] = []  # this step's new Optuna trials, as the samplers see them
        snapshot: list[Any] = []  # the study's trials, read at the step's first proposal
        for lane in lanes:  # asked in lane order: Optuna numbers rise with the lanes
            before = self._asked_before(trial, chunk, lane)
            if before is not None:  # a killed driver's broker asked it: the same configuration again
                t = self._trial(before)
                point = suggest(t, self.study.space)  # its stored values (Optuna returns them as set)
            else:
                t = self._ask(static, snapshot, step_trials)
                # where it belongs first: a broker after a kill here finds it and hands it out again
                t.set_user_attr(TRIAL_ATTR, trial)
                t.set_user_attr(CONFIG_ATTR, -1)  # a refill: its index in the trial's record is set there
                t.set_user_attr("lane", lane)
                t.set_user_attr("after_chunk", chunk)
                # and for this broker too: a step that fails after this ask (a storage error) and is
                # replayed hands it out again, not a second refill that would stay RUNNING, orphaned
                self._asked[(trial, chunk, lane)] = t.number  # type: ignore[index]  # built by _asked_before
                point = suggest(t, self.study.space)
                t.study = t.study.inner  # the study itself again: the step's view is not kept
                self._trials[t.number] = t
            new[lane] = {"number": t.number, "params": point, "hparams": self.hparams(point)}
        return new

    def _ask(self, static: dict[str, Any], snapshot: list[Any], step_trials: list[Any]) -> Any:
        """A new Optuna trial with the ``static`` values fixed, as ``enqueue_trial`` then ``ask`` fix
        them, but never through the study's queue of waiting trials: the driver's searcher enqueues
        and asks there at the same time, and ``ask`` pops whichever waiting trial comes first.
        Its sampler sees the study through :class:`_StepView`: ``snapshot`` (read here at the
        step's first proposal, and again if another process added trials since) and the step's
        trials before it (``step_trials``, to which it is added)."""
        study = self.ostudy
        trial_id, number = private.create_trial(study, static)
        if not snapshot or number != 1 + max(t.number for t in snapshot + step_trials):  # the first, or a
            snapshot[:] = study.get_trials(deepcopy=False)  # trial of the driver's came between: read again
        if self.explore is not None and number % EXPLORE == 0:
            study = self.explore  # the same storage and pruner; its sampler proposes at random
        t = optuna.trial.Trial(_StepView(study, snapshot, step_trials), trial_id)
        step_trials.append(t)
        return t

    def _stop(self, t: Any, r: dict[str, Any], status: str, why: str,
              value: float | None = None) -> dict[str, str]:
        """Tells Optuna that the lane's configuration ended (and where and why, in its user attrs)."""
        t.set_user_attr("stopped", {"status": status, "why": why, "at": int(r["steps"])})
        self._running.discard(t.number)
        self._trials.pop(t.number, None)  # (a replay that asks again reads it from the storage)
        if status == "complete" and value is not None:
            self.ostudy.tell(t.number, value, skip_if_finished=True)
        else:
            state = optuna.trial.TrialState.PRUNED if status == "pruned" else optuna.trial.TrialState.FAIL
            self.ostudy.tell(t.number, state=state, skip_if_finished=True)
        return {"status": status, "why": why}

    def _told(self, t: Any) -> dict[str, Any] | None:
        """How a broker before this one ended the configuration (status, why, at which env steps),
        or None while it runs."""
        if t.number in self._running:  # seen running by this broker, which alone ends it
            return None
        frozen = private.stored(self.ostudy, t)
        if frozen.state == optuna.trial.TrialState.RUNNING:
            self._running.add(t.number)
            return None
        return frozen.user_attrs.get("stopped") or {"status": "diverged", "why": "told elsewhere", "at": 0}

    def _asked_before(self, trial: int, chunk: int, lane: int) -> int | None:
        """The refill a broker before this one asked for this (trial, chunk, lane), if any."""
        if self._asked is None:  # once per broker: the refills its study holds
            self._asked = {}
            for t in self.ostudy.get_trials(deepcopy=False):
                if "after_chunk" in t.user_attrs:
                    attrs = t.user_attrs
                    self._asked[(attrs[TRIAL_ATTR], attrs["after_chunk"], attrs["lane"])] = t.number
        return self._asked.get((trial, chunk, lane))


def _judge(pruner: Any, ostudy: Any, t: Any, step: int, rung: int, batch: dict[int, float], trials: list[Any],
           rung_attrs: dict[int, dict[str, Any]]) -> tuple[bool, dict[str, Any]]:
    """Optuna's successive-halving ``pruner`` on the lane trial ``t`` at ``rung`` alone (its value
    shown at the rung's own ``step``), the other lanes of its ``batch`` counted as having reached it.
    ``trials``: the study's, read once per batch; ``rung_attrs``: the batch's rung values so far.

    Returns (stopped there, the rung values the pruner wrote). Nothing is written to storage: the
    broker writes the verdict first, so a lane judged again after a kill is not counted a rung further."""
    frozen = copy.copy(private.latest(t))
    frozen.intermediate_values = {step: batch[t.number]}  # its value now, as reported at its env steps
    frozen.system_attrs = {**frozen.system_attrs, **rung_attrs.get(t.number, {})}
    view = _WithBatch(ostudy, trials, rung_attrs, t.number, rung, batch)
    return bool(pruner.prune(view, frozen)), view.written


class _Held:
    """A storage as the pruner sees it through :class:`_WithBatch`: reads pass through, the trial
    attributes it writes (its rung values) go to ``written``."""

    def __init__(self, storage: Any, written: dict[str, Any]) -> None:
        self._inner, self._written = storage, written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._written[key] = value


class _WithBatch:
    """The study as Optuna's successive-halving pruner reads it while it judges one lane: the
    study's trials, where the lanes of the same batch that it has not judged yet already hold
    their value at the rung (the attribute the pruner writes for each trial it judges there).
    What the pruner writes is kept in ``written`` (the broker writes it after the verdict)."""

    def __init__(self, study: Any, trials: list[Any], rung_attrs: dict[int, dict[str, Any]], judged: int,
                 rung: int, batch: dict[int, float]) -> None:
        self._trials, self._rung_attrs, self._judged, self._batch = trials, rung_attrs, judged, batch
        self._key = private.completed_rung_key(rung)  # the attribute the pruner reads
        self.direction = study.direction
        self.written: dict[str, float] = {}
        self._storage = _Held(private.storage(study), self.written)  # what the pruner writes through

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[Any]:
        out = []
        for t in self._trials:
            if states is not None and t.state not in states:
                continue
            if t.number in self._rung_attrs or t.number in self._batch:
                attrs = {**t.system_attrs, **self._rung_attrs.get(t.number, {})}
                if t.number in self._batch and t.number != self._judged:
                    attrs.setdefault(self._key, self._batch[t.number])
                t = copy.copy(t)
                t.system_attrs = attrs
            out.append(t)
        return out


class _StepView:
    """A study as a sampler reads it while one broker step proposes its refills: the trials read once
    at the step's first proposal (``snapshot``) plus the step's own new trials (``step_trials``), as
    :func:`as_judged` shows them. TPE reads the whole study for each parameter it samples, too slow
    from SQLite once per proposal (bench/RESULTS.md, "The lane broker's step"). Samplers read through
    ``_get_trials`` alone; anything else, writes included, passes to the study. Trials another
    process adds during the step are read again at the next proposal (:meth:`LaneBroker._ask`)."""

    def __init__(self, inner: Any, snapshot: list[Any], step_trials: list[Any]) -> None:
        self.inner, self._snapshot, self._step_trials = inner, snapshot, step_trials

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # Optuna's samplers read a study through this private method (optuna_private.RELIED_ON)
    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[Any]:
        fresh = {t.number: private.cached(t) for t in self._step_trials}
        trials = sorted([t for t in self._snapshot if t.number not in fresh] + list(fresh.values()),
                        key=lambda t: t.number)  # in the storage's order
        trials = [t for t in as_judged(trials) if states is None or t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials


def as_judged(trials: list[Any]) -> list[Any]:
    """The study as the broker's samplers see it: a running lane judged at a rung shows as a pruned
    trial, so TPE ranks it by value with those stopped there rather than as the constant liar's worst
    (promoted lanes are the study's best). Lanes not yet judged stay running, for the liar to spread a
    step's proposals. A lane running or ended short of its budget shows its curve up to its last
    judgement only, as TPE ranks a pruned trial by its last intermediate value."""
    out = []
    for t in trials:
        running = t.state == optuna.trial.TrialState.RUNNING
        if running or ("stopped" in t.user_attrs and t.state == optuna.trial.TrialState.PRUNED):
            at = (t.user_attrs.get(VERDICT_ATTR) or {}).get("at", -1)
            t = copy.copy(t)
            t.intermediate_values = {k: v for k, v in t.intermediate_values.items() if k <= at}
            if running and t.intermediate_values:
                t.state = optuna.trial.TrialState.PRUNED
        out.append(t)
    return out


