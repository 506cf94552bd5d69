"""Optuna's private names this project relies on, all in this module: each use goes through a
function here, and :data:`RELIED_ON` lists them for ``tests/test_private_names.py``, which fails
naming the name and Optuna's version when an upgrade removes one.

Why they are needed: the lane broker (:mod:`harness.lanes.broker`) judges lanes with Optuna's
successive-halving pruner and its own rung bookkeeping, creates trials with fixed values outside
the study's queue of waiting trials, and reads a trial's stored state as a running
``optuna.Trial`` sees it; the searcher (:mod:`harness.search.searcher`) opens a second handle on
a study's storage and takes up a running trial again by its id. The broker's stand-ins for a
study (``_StepView``, ``_WithBatch``) also provide what Optuna's samplers and pruner read of one
(``_get_trials``, ``_storage``): listed here too.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.pruners import _successive_halving

FIXED_PARAMS = "fixed_params"  # the system attribute ``enqueue_trial`` fixes a trial's values in

# (where, name): an attribute of an Optuna module, or of a Study, a Trial or a FrozenTrial instance
RELIED_ON: tuple[tuple[str, str], ...] = (
    ("optuna.pruners._successive_halving", "_completed_rung_key"),
    ("optuna.pruners._successive_halving", "_get_current_rung"),
    ("Study", "_storage"),  # also what SuccessiveHalvingPruner.prune writes its rung values through
    ("Study", "_study_id"),
    ("Study", "_thread_local"),  # its cached_all_trials, which Study.ask resets
    ("Study", "_get_trials"),  # what the samplers read a study through (deepcopy, states, use_cache)
    ("Trial", "_trial_id"),
    ("Trial", "_cached_frozen_trial"),
    ("Trial", "_get_latest_trial"),
    ("FrozenTrial", "_trial_id"),
)


def storage(study: optuna.Study) -> Any:
    """The study's storage object (shared by another handle opened on it: ``open_study(beside=...)``)."""
    return study._storage


def trial_id(trial: Any) -> int:
    """The storage's id of a trial (an ``optuna.Trial`` or a ``FrozenTrial``)."""
    return trial._trial_id


def trial_by_number(study: optuna.Study, number: int) -> optuna.Trial:
    """A running trial of ``study`` again, by its number, as ``study.ask`` gave it."""
    trial = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    return optuna.trial.Trial(study, trial)


def latest(trial: optuna.Trial) -> optuna.trial.FrozenTrial:
    """The trial as its storage holds it now (its reports and attributes so far)."""
    return trial._get_latest_trial()


def cached(trial: optuna.Trial) -> optuna.trial.FrozenTrial:
    """The trial as its handle last read it, without a read of the storage."""
    return trial._cached_frozen_trial


def stored(study: optuna.Study, trial: Any) -> optuna.trial.FrozenTrial:
    """The trial as the study's storage holds it now, read from the storage."""
    return study._storage.get_trial(trial._trial_id)


def set_system_attr(study: optuna.Study, trial: Any, key: str, value: Any) -> None:
    """Writes a system attribute of a trial (what the successive-halving pruner writes at a rung)."""
    study._storage.set_trial_system_attr(trial._trial_id, key, value)


def create_trial(study: optuna.Study, fixed: dict[str, Any]) -> tuple[int, int]:
    """A new running trial of ``study`` whose values ``fixed`` are set as ``enqueue_trial`` then
    ``ask`` set them, without the study's queue of waiting trials; (its id, its number)."""
    trial = study._storage.create_new_trial(study._study_id)
    study._storage.set_trial_system_attr(trial, FIXED_PARAMS, fixed)
    study._thread_local.cached_all_trials = None  # Optuna's per-ask cache, as study.ask resets it
    return trial, study._storage.get_trial_number_from_id(trial)


def current_rung(trial: optuna.trial.FrozenTrial) -> int:
    """The rungs the successive-halving pruner has passed ``trial`` at (its own count)."""
    return _successive_halving._get_current_rung(trial)


def completed_rung_key(rung: int) -> str:
    """The system attribute the successive-halving pruner writes a trial's value at ``rung`` in."""
    return _successive_halving._completed_rung_key(rung)
