"""Ray Tune, wired once for both phases: the search (a searcher and a scheduler proposing trials)
and the final re-training (a grid of fixed plans, or a :class:`PlanFeed` of batches decided as
the run goes, for the ablation path).

Also the thin Tune-facing shells over plain objects: :class:`GuardedSearcher` (a searcher that
stops acting once the results disk refuses writes, as Tune's ``ConcurrencyLimiter`` wraps one),
the disk callback, stopper and log filter over :class:`~harness.driver.guard.DiskGuard`, and the
progress callback over :class:`~harness.driver.progress.Progress`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from ray import tune
from ray.tune.search import Searcher

from harness.cluster.placement import Placement
from harness.cluster.trainable import BOILERPLATE, trainable_for
from harness.driver.guard import DiskGuard
from harness.driver.progress import Progress
from harness.driver.settings import Settings
from harness.store.folder import ResultsFolder

MAX_FAILURES = 2  # retries of a trial whose worker died (it goes on from its last checkpoint)


def run(settings: Settings, folder: ResultsFolder, placement: Placement, guard: DiskGuard, *,
        kind: Literal["run", "final"], searcher: Searcher | None = None, scheduler: Any = None,
        num_samples: int = 1, param_space: dict[str, Any] | None = None,
        callbacks: list[Any] | None = None, halt: Callable[[], bool] | None = None,
        until: Callable[[], bool] | None = None) -> tune.ResultGrid:
    """Runs one Tune experiment under ``folder/tune/<kind>-K``: the study's trainable, its
    placement, actor reuse, retries of dead workers, the disk guard's callback and stopper
    (``halt``: another reason to stop the whole run; ``until``: once true, no new trial starts).
    A final run (``kind="final"``) keeps each trial's last checkpoint: the trained policies.

    Raises:
        StudyError: the results disk refused a write meanwhile (the guard's one line).
    """
    DiskErrorLog.install(guard)
    logging.getLogger("ray.tune.tune").addFilter(_not_incomplete_trials)
    guarded = GuardedSearcher(searcher, guard, until) if searcher else None
    seen = [TrialsSeen(guarded.trials)] if guarded else []
    tuner = tune.Tuner(
        trainable_for(settings.study.name, placement.resources),
        param_space=param_space,
        tune_config=tune.TuneConfig(search_alg=guarded,
                                    scheduler=scheduler, num_samples=num_samples,
                                    max_concurrent_trials=placement.slots, reuse_actors=True,
                                    trial_dirname_creator=lambda t: folder.tune_trial_dirname(t.trial_id)),
        run_config=tune.RunConfig(
            name=folder.next_run(kind), storage_path=str(folder.tune_dir), verbose=0,
            callbacks=[*(callbacks or []), *seen, DiskWatch(guard)], stop=StopOnDiskError(guard, halt),
            failure_config=tune.FailureConfig(max_failures=MAX_FAILURES),
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=kind == "final", num_to_keep=2)))
    grid = tuner.fit()
    guard.raise_if_tripped()
    return grid


def trial_error(trial: Any) -> str:
    """What a failed Tune trial's error says (Tune's own log of it is turned off): its error file
    in the trial's local folder, where Tune writes it before calling back (``get_error`` reads
    the copy in storage, which comes later: a worker whose node died read "no error text")."""
    try:
        local = trial.error_file
        text = Path(local).read_text() if local and os.path.exists(local) else trial.get_error() or ""
    except Exception:  # noqa: BLE001 - the error file may be unreadable (a full disk, say)
        text = ""
    return error_line(str(text))


_NOISE = (*BOILERPLATE, "File \"", "^", "~", "During handling of")
_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Died\w*)): (.+)$")


def error_line(text: str) -> str:
    """``Type: message`` from an error's text (a traceback, possibly wrapped by Ray): the last line
    that names an exception and its message, its type without module path; else the last line
    that is not a framework's boilerplate; "no error text" when there is none."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if (m := _RAISED.match(ln)) and not m[2].startswith(_NOISE):
            return f"{m[1].rpartition('.')[2]}: {m[2]}"[:300]
    useful = [ln for ln in lines if not ln.startswith(_NOISE)]
    return useful[-1][:300] if useful else "no error text"


class GuardedSearcher(Searcher):
    """``searcher`` behind the disk guard: a write to a full or read-only results disk inside its
    calls (records, Optuna's storage, inflight/) trips the guard rather than failing inside Tune,
    which logs such errors and goes on. From then on it does nothing: the trials stopped on the
    way out are neither recorded nor told, so the next run adopts them, and it proposes no more
    (``FINISHED``: with no trial running, a searcher that answers None keeps Tune asking again
    for minutes before it looks at its stopper)."""

    def __init__(self, searcher: Searcher, guard: DiskGuard, until: Callable[[], bool] | None = None) -> None:
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher, self.guard, self.until = searcher, guard, until
        self.trials: dict[str, Any] = {}  # Tune's trials by id (TrialsSeen): a failed one's error text

    def suggest(self, trial_id: str) -> dict | str | None:
        if self.until is not None and self.until():  # the time budget's search share is spent
            return Searcher.FINISHED
        config = self.guard.call(self.searcher.suggest, trial_id)
        return Searcher.FINISHED if self.guard.tripped else config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.guard.call(self.searcher.on_trial_result, trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        trial = self.trials.pop(trial_id, None)
        if error and trial is not None and not (result or {}).get("error"):
            # it failed in Tune, not in its own code (its worker or node died): Tune's error text
            result = {**(result or {}), "error": trial_error(trial)}
        self.guard.call(self.searcher.on_trial_complete, trial_id, result=result, error=error)

    def get_state(self) -> dict:  # state lives in Optuna's storage and the records (Tune asks wrappers)
        return {}

    def set_state(self, state: dict) -> None:
        pass


class FeedStopped(RuntimeError):
    """The Tune run of a :class:`PlanFeed` ended before a batch handed to it had run."""


class PlanFeed(Searcher):
    """Trials from batches of fixed plans handed in while the run goes on (:meth:`run`, called
    from another thread, blocks until its batch has run): one Tune run serves batch after batch,
    its actors reused, for work that picks its next plans from the last ones' results (the
    ablation path). Each trial's config is ``config(plan)``; a failed trial's result is None.
    The run ends once :meth:`close` is called and nothing is left."""

    def __init__(self, config: Callable[[Any], dict[str, Any]]) -> None:
        super().__init__()
        self._config, self._cond = config, threading.Condition()
        self._queue: list[tuple[list, int, Any]] = []  # (the batch's results, index, plan)
        self._running: dict[str, tuple[list, int]] = {}
        self._closed = False

    def __getstate__(self) -> dict:  # Tune pickles its searcher into the run's folder: a feed has no
        return {}  # state to restore (a resumed study computes its ablation path again)

    def __setstate__(self, state: dict) -> None:
        self.__init__(lambda plan: {})  # type: ignore[misc]

    def run(self, plans: list[Any]) -> list[dict[str, Any] | None]:
        """Runs ``plans`` as trials of the run; their last results, in order.

        Raises:
            FeedStopped: the run ended (stopped, interrupted) before they all ran.
        """
        results: list = [_PENDING] * len(plans)
        with self._cond:
            self._queue += [(results, i, plan) for i, plan in enumerate(plans)]
            self._cond.wait_for(lambda: self._closed or _PENDING not in results)
            if _PENDING in results:
                raise FeedStopped("the Tune run ended before these plans ran")
        return results

    def close(self) -> None:
        """No more batches: the run ends once its trials have; a batch still waiting fails."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def suggest(self, trial_id: str) -> dict | None:
        with self._cond:
            if not self._queue:
                return Searcher.FINISHED if self._closed else None
            results, i, plan = self._queue.pop(0)
            self._running[trial_id] = (results, i)
            return self._config(plan)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        with self._cond:
            results, i = self._running.pop(trial_id)
            results[i] = {**result, "checkpoint": ""} if result and result.get("final") and not error else None
            self._cond.notify_all()


_PENDING = object()


class TrialsSeen(tune.Callback):
    """Tune's trials by id, for :class:`GuardedSearcher` (a searcher sees only the ids)."""

    def __init__(self, into: dict[str, Any]) -> None:
        self.into = into

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.into[trial.trial_id] = trial


class DiskWatch(tune.Callback):
    """A trial that fails while the results disk refuses writes (its checkpoint could not be
    saved, say) stops the study instead of being retried until it counts as failed."""

    def __init__(self, guard: DiskGuard) -> None:
        self.guard = guard

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.guard.note_if_unwritable()

    on_trial_error = on_trial_recover


class StopOnDiskError(tune.Stopper):
    """Ends the whole experiment once the guard has tripped (or ``halt`` says so)."""

    def __init__(self, guard: DiskGuard, halt: Callable[[], bool] | None = None) -> None:
        self.guard, self.halt = guard, halt

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.guard.tripped or bool(self.halt and self.halt())


class DiskErrorLog(logging.Filter):
    """On Tune's loggers: an error logged because the results disk refuses writes (Tune saves its
    experiment state there, logs a traceback when that fails and goes on) trips the guard and is
    not printed; so is (without tripping it) a failed save whose only fault is Tune's own temp
    file vanishing mid-copy; other records pass."""

    LOGGERS = ("ray.tune.execution.experiment_state", "ray.tune.execution.tune_controller")

    def __init__(self, guard: DiskGuard) -> None:
        super().__init__()
        self.guard = guard

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if isinstance(err, FileNotFoundError) and "-tmp-" in str(err):
            # Tune's race, not the disk: its state file renamed from a temp name mid-copy; the next save
            # copies it, and studies resume from their own records, not Tune's state
            return False
        found = self.guard.note(err, probe=False) or self.guard.note(record.getMessage(), probe=False)
        return not found

    @classmethod
    def install(cls, guard: DiskGuard) -> None:
        for name in cls.LOGGERS:
            log = logging.getLogger(name)
            for f in [f for f in log.filters if isinstance(f, cls)]:
                log.removeFilter(f)
            log.addFilter(cls(guard))


def _not_incomplete_trials(record: logging.LogRecord) -> bool:
    """Drops Tune's closing "Trials did not complete: [ID...]": each failed trial has had its own
    line with its error (ProgressCallback), by its number rather than Tune's id."""
    return not record.getMessage().startswith("Trials did not complete")


class ProgressCallback(tune.Callback):
    """Feeds Tune's trial events to :class:`~harness.driver.progress.Progress`."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        plan = trial.config["plan"]
        steps = int(result.get("env_steps", 0)) * plan["seeds"] * len(plan["hparams"])
        self.progress.result(trial.trial_id, steps, running=sum(t.status == "RUNNING" for t in trials),
                             score=None if result.get("done") else result.get("score"))

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.progress.tick(running=sum(t.status == "RUNNING" for t in trials))

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.progress.retrying(trial.config["plan"]["trial"], trial_error(trial))

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.progress.failed(trial.config["plan"]["trial"], trial_error(trial))
