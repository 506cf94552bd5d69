"""rl-harness: hyperparameter search for RL in JAX (Ray Tune runs the trials, Optuna proposes, each
trial one jitted kernel of configurations x seeds).

A study file needs only the names below (:mod:`harness.space`, which stays importable by its own
name too)::

    from harness import Budget, Categorical, LogUniform, Study, Uniform

The commands are ``python -m harness.study``, ``harness.report``, ``harness.play`` and
``harness.train``; the subpackages and the order they import each other in are in
docs/architecture.md. Importing this package imports no JAX, Ray, Optuna or numpy.
"""

from harness.space import PBT, Budget, Categorical, Int, LogUniform, Study, StudyError, Uniform

__all__ = ["PBT", "Budget", "Categorical", "Int", "LogUniform", "Study", "StudyError", "Uniform"]
