"""The search: Optuna proposes, Ray Tune runs the trials still missing, each ends in a record.

    outcome = search_phase.run(settings, folder, placement, guard)

A resumed study first makes Optuna agree with the records on disk (a driver killed between a
record and Optuna's tell), then adopts the trials a killed driver left in flight: each goes on
from its newest kernel checkpoint under its own trial number and Optuna trials.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness import report
from harness.cluster.placement import Placement
from harness.driver.guard import DiskGuard
from harness.driver.progress import Progress
from harness.driver.progress import say as progress_say
from harness.driver.settings import Settings
from harness.space import Budget, StudyError
from harness.store.folder import InFlight, ResultsFolder, Unreadable
from harness.store.records import TrialRecord

REPORT_EVERY = 10.0  # seconds between rebuilds of the CSV reports while trials finish


@dataclass(frozen=True)
class SearchOutcome:
    """What the search left: trials recorded out of the budget's, and whether it was cut short."""

    done: int
    total: int

    @property
    def interrupted(self) -> bool:
        return self.done < self.total


def run(settings: Settings, folder: ResultsFolder, placement: Placement, guard: DiskGuard, *,
        say: Callable[[str], None] = progress_say, timeplan: Any = None) -> SearchOutcome:
    """Runs the study's missing trials (all of them for a new study); with ``timeplan``
    (:class:`harness.driver.timeplan.TimePlan`), new trials until its search share is spent instead.

    Raises:
        StudyError: the Optuna storage cannot be opened, or the results disk refused a write.
    """
    # Ray and Optuna: imported once the study's session has started Ray, never at import
    from harness.cluster import tuning
    from harness.search.searcher import BatchedOptunaSearcher, open_study, reconcile
    from harness.search.storage import storage_error

    budget = settings.budget(placement.kind)
    records = folder.trials()
    try:
        ostudy = open_study(settings.study, settings.storage, sampler=settings.sampler, name=settings.optuna_name)
    except Exception as err:  # sqlalchemy/optuna raise many kinds for a bad URL
        if guard.note(err):
            raise guard.error() from None
        raise storage_error(settings.storage, err) from None
    trials = settings.tune_trials(budget)
    adopt = adoptable(folder, ostudy, records)[:max(0, trials - len(records))]
    stale = reconcile(ostudy, records, keep=going_on(ostudy, adopt))
    if records or stale or adopt:
        say(resuming_line(len(records), stale, adopt))
    progress = Progress(None if timeplan else trials, metric=settings.study.metric, maximize=settings.maximize,
                        records=records)
    remaining = trials - len(records)
    if remaining <= 0 and timeplan is None:
        return SearchOutcome(progress.done, trials)
    closed, learned = [False], [0]

    def until() -> bool:  # passed to Tune only with a time plan
        if progress.done != learned[0]:  # a trial ended since: its kernel time refines the plan
            learned[0] = progress.done
            timeplan.learn(folder.trials(), budget.timesteps)
        first = not records and not learned[0] and not folder.inflight()  # a study's first trial always runs
        closed[0] = closed[0] or not (first or timeplan.search_open())
        return closed[0]
    scheduler = asha(settings, budget)
    broker = BrokerHandle(settings, budget) if settings.scheduler == "lanes" else None
    try:  # from here on the broker's actor is stopped however this ends
        sink = RecordSink(folder, progress, ran_before=any(r.status != "failed" for r in records))
        searcher = BatchedOptunaSearcher(
            settings.study, ostudy, static_names=settings.static_names, configs_per_trial=budget.configs_per_trial,
            make_plan=plan_factory(settings, budget, broker.name if broker else ""),
            extra={"device": placement.device},
            on_complete=sink, on_suggest=folder.note_inflight, adopt=adopt,
            is_pruned=lambda tid: scheduler is not None and tid in scheduler.stopped,
            first_statics=settings.first_statics(budget))
        # trials still running when it stops stay in inflight/ and RUNNING in Optuna: resumed next run
        tuning.run(settings, folder, placement, guard, kind="run", searcher=searcher, scheduler=scheduler,
                   num_samples=-1 if timeplan else remaining, callbacks=[tuning.ProgressCallback(progress)],
                   halt=lambda: sink.same_failure is not None, until=until if timeplan else None)
    finally:
        if broker:
            broker.stop()
    if sink.same_failure:
        raise StudyError(f"every trial failed the same way, so the study stopped: {sink.same_failure} "
                         f"(records in {folder.root}; fix it, then resume with: {settings.resume_command})")
    if timeplan is not None:  # done when the share was spent and nothing is left in flight (Ctrl-C leaves some)
        left = len(folder.inflight())
        return SearchOutcome(progress.done, progress.done + (left if closed[0] else max(left, 1)))
    return SearchOutcome(progress.done, trials)


def plan_factory(settings: Settings, budget: Budget,
                 broker: str = "") -> Callable[[list[dict[str, Any]], int], Any]:
    """A search trial's plan from its C points: their shared static choices, their own
    hyperparameters (with ``lanes``: refilled for the rounds of a lane trial, answered by ``broker``)."""
    pbt = settings.pbt()
    lanes = settings.lanes(budget, broker)

    def make(points: list[dict[str, Any]], trial: int) -> Any:
        static = {n: points[0][n] for n in settings.static_names}
        config = settings.static_config(static, budget.timesteps)
        hparams = [settings.hparams(p) for p in points]
        chunks = None
        if lanes:
            from harness.kernel.compile import build_config  # JAX: not at import

            chunks = round(build_config(settings.study.algo, config).num_chunks * settings.lane_rounds(budget))
        return settings.plan(config, hparams, seeds=budget.seeds, trial=trial, pbt=pbt, lanes=lanes, chunks=chunks)
    return make


class BrokerHandle:
    """The study's :class:`~harness.lanes.broker.LaneBroker` as a Ray actor on this (the driver's) node,
    where the Optuna storage is: found by the trials under ``name``; :meth:`stop` ends it."""

    def __init__(self, settings: Settings, budget: Budget) -> None:
        import hashlib

        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from harness.lanes.broker import LaneBroker
        from harness.lanes.trial import serve_locally

        # one name per study and storage, so a resumed study's adopted trials find it by their plans; each
        # Ray job has its own anonymous namespace, so two drivers on one cluster find their own broker
        digest = hashlib.sha1(settings.storage.encode()).hexdigest()[:10]
        self.name = f"rl-harness-lanes-{settings.optuna_name}-{digest}"
        spec = settings.lanes(budget, self.name) or {}
        args = (settings.study, settings.storage)
        kwargs = dict(static_names=settings.static_names, hparams=settings.hparams, min_steps=spec["min_steps"],
                      eta=spec["eta"], sampler=settings.sampler, name=settings.optuna_name)
        self.actor = None
        if not ray.is_initialized():  # no Ray here (trials run in this process): the broker too
            serve_locally(self.name, LaneBroker(*args, **kwargs))
            return
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.actor = ray.remote(num_cpus=0)(LaneBroker).options(name=self.name, scheduling_strategy=here).remote(
            *args, **kwargs)
        ray.get(self.actor.ping.remote())  # started (its errors surface here, not in a trial)

    def stop(self) -> None:
        import ray

        from harness.lanes.trial import serve_locally

        if self.actor is not None:
            ray.kill(self.actor)
        else:
            serve_locally(self.name, None)


def adoptable(folder: ResultsFolder, ostudy: Any, records: list[TrialRecord]) -> list[InFlight]:
    """The trials a stopped driver left running (in flight without a record, their Optuna trials
    still RUNNING), each with its kernel checkpoints; entries that finished after all, were told
    meanwhile or cannot be read are dropped (an unreadable one named on stderr: it starts over)."""
    import optuna

    recorded = {r.trial for r in records}
    running = {t.number for t in ostudy.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
    out = []
    for entry in folder.inflight():
        if isinstance(entry, Unreadable):
            print(f"warning: {entry.error}; that trial starts over as a new one", file=sys.stderr)
            folder.drop_inflight(entry)
        elif entry.trial in recorded or (not entry.plan.get("lanes") and not set(entry.optuna_numbers) <= running):
            # (a lane trial's first configurations end while it runs: it goes on while it has no record)
            folder.drop_inflight(entry)
        else:
            out.append(entry)
    return out


def going_on(ostudy: Any, adopt: list[InFlight]) -> set[int]:
    """The Optuna trials the adopted trials go on with: their first configurations and, for lane
    trials, every refill their lanes were given (user attr ``tune_trial``), which their broker
    hands out again when they replay their chunks."""
    import optuna

    from harness.search.searcher import TRIAL_ATTR

    trials = {e.trial for e in adopt}
    refills = {t.number for t in ostudy.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
               if t.user_attrs.get(TRIAL_ATTR) in trials and "after_chunk" in t.user_attrs}
    return {n for e in adopt for n in e.optuna_numbers} | refills


def resuming_line(recorded: int, stale: int, adopt: list[InFlight]) -> str:
    going_on = ", ".join(f"trial {e.trial} " + ("from its checkpoint" if e.resume_from else
                                                "from the start (no checkpoint)") for e in adopt)
    return (f"resuming: {recorded} trials recorded"
            + (f", {stale} interrupted Optuna trials marked FAIL" if stale else "")
            + (f"; in flight when stopped: {going_on}" if going_on else ""))


class RecordSink:
    """Where a finished trial's record goes: the folder, the progress line, and (every
    ``REPORT_EVERY`` s; their cost grows with the trials) the small CSV reports. Watches for a
    study whose every trial fails the same way (``same_failure``: after ``FAIL_FAST`` such
    trials and none that ran, the study stops rather than burn its budget)."""

    FAIL_FAST = 2

    def __init__(self, folder: ResultsFolder, progress: Progress, *, ran_before: bool = False) -> None:
        self.folder, self.progress = folder, progress
        self.last_report = -math.inf
        self.ran = ran_before  # a trial that did not fail: failures are then not the study's own
        self.failures: list[str] = []
        self.same_failure: str | None = None

    def __call__(self, record: TrialRecord) -> None:
        self.folder.record(record)
        self.progress.recorded(record)
        if record.status != "failed":
            self.ran = True
        else:
            self.failures.append(record.error or "no error text")
            if not self.ran and len(self.failures) >= self.FAIL_FAST and len(set(self.failures)) == 1:
                self.same_failure = self.failures[0]
        if time.monotonic() - self.last_report >= REPORT_EVERY:  # CSVs while it runs; all of it at the end
            report.build(self.folder, plots=False)
            self.last_report = time.monotonic()


def halfway_rung(chunks: int) -> int:
    """ASHA's grace period for a single rung in the middle of a ``chunks``-chunk trial. Tune's ASHA
    puts a rung at every grace * 2**k below max_t, so the grace must exceed half of it, or a
    second rung near the end stops trials that had nearly finished."""
    return chunks // 2 + 1


def asha(settings: Settings, budget: Budget) -> Any:
    """Tune's ASHA with one rung halfway through the longest trial (None: no ASHA, or trials
    too short for a rung), remembering the trials it stopped (PRUNED in Optuna)."""
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    chunks = max(settings.chunks(budget))
    if settings.scheduler != "asha" or chunks < 3:
        return None

    class RecordingASHA(ASHAScheduler):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.stopped: set[str] = set()

        def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
            action = super().on_trial_result(tune_controller, trial, result)
            if action == TrialScheduler.STOP:
                self.stopped.add(trial.trial_id)
            return action

    mode = "max" if settings.maximize else "min"
    return RecordingASHA(time_attr="training_iteration", metric="score", mode=mode, max_t=chunks,
                         grace_period=halfway_rung(chunks), reduction_factor=2)
