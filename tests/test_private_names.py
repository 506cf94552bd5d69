"""Optuna's and Ray's private names the harness relies on (harness/search/optuna_private.py,
harness/cluster/ray_private.py) are still there in the installed libraries: an upgrade that
removes or changes one fails here, naming it and the library's version, rather than deep inside
a study."""

from __future__ import annotations

import importlib
import inspect

import optuna
import pytest
import ray

from harness.cluster import ray_private
from harness.search import optuna_private as private


def _resolve(path: str) -> object:
    """The object a dotted path names: its longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def _instances() -> dict[str, object]:
    """A Study, a Trial and a FrozenTrial of an in-memory study (their attributes are set per instance)."""
    study = optuna.create_study()
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    return {"Study": study, "Trial": trial, "FrozenTrial": study.get_trials(deepcopy=False)[0]}


@pytest.mark.parametrize("where,name", private.RELIED_ON, ids=[f"{w}.{n}" for w, n in private.RELIED_ON])
def test_optuna__each_private_name_relied_on_is_there(where, name):
    owner = _instances().get(where) or _resolve(where)
    assert hasattr(owner, name), (f"Optuna {optuna.__version__} has no {where}.{name}, which "
                                  "harness/search/optuna_private.py relies on")


def test_optuna__the_private_helpers_do_what_the_broker_and_the_searcher_rely_on():
    v = f"Optuna {optuna.__version__}"
    study = optuna.create_study(pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3,
                                                                               min_early_stopping_rate=0))
    study.enqueue_trial({"x": 0.25})
    queued = study.ask()
    assert private.cached(queued).system_attrs.get(private.FIXED_PARAMS) == {"x": 0.25}, \
        f"{v}: enqueue_trial no longer fixes a trial's values in system attr {private.FIXED_PARAMS!r}"
    trial_id, number = private.create_trial(study, {"x": 0.75})
    made = optuna.trial.Trial(study, trial_id)
    assert made.number == number and made.suggest_float("x", 0.0, 1.0) == 0.75, \
        f"{v}: a trial created with fixed values does not take them (optuna_private.create_trial)"
    again = private.trial_by_number(study, number)
    assert private.trial_id(again) == trial_id == private.trial_id(private.stored(study, again))
    again.report(1.0, step=1)
    assert study.pruner.prune(study, private.latest(again)) is False  # the first trial at its rung goes on
    assert private.current_rung(private.latest(again)) == 1, f"{v}: the pruner's rung count changed"
    assert private.completed_rung_key(0) in private.latest(again).system_attrs, \
        f"{v}: the successive-halving pruner no longer writes {private.completed_rung_key(0)!r}"
    private.set_system_attr(study, again, "mark", 1)
    assert private.stored(study, again).system_attrs["mark"] == 1
    assert private.storage(study) is study._storage
    # what the broker's stand-ins for a study provide: the pruner writes through study._storage,
    # the samplers read through study._get_trials(deepcopy, states, use_cache)
    assert "study._storage" in inspect.getsource(optuna.pruners.SuccessiveHalvingPruner.prune), \
        f"{v}: SuccessiveHalvingPruner.prune no longer writes through study._storage (lanes.broker._WithBatch)"
    params = inspect.signature(optuna.study.Study._get_trials).parameters
    assert {"deepcopy", "states", "use_cache"} <= set(params), \
        f"{v}: Study._get_trials takes {list(params)}; lanes.broker._StepView takes deepcopy, states, use_cache"


@pytest.mark.parametrize("where,name", ray_private.RELIED_ON, ids=[f"{w}.{n}" for w, n in ray_private.RELIED_ON])
def test_ray__each_private_name_relied_on_is_there(where, name):
    assert hasattr(_resolve(where), name), (f"Ray {ray.__version__} has no {where}.{name}, which "
                                            "harness/cluster/ray_private.py relies on")
