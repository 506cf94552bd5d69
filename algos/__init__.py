"""PPO, SAC and PQN as pure JAX kernels, and the registry: ``algos.get(name) -> AlgoSpec``.

A name is a built-in (``ppo``, ``sac``, ``pqn``), an algorithm an installed package registers in the
entry-point group ``rl_harness.algos``, or the place of a user's own: ``"package.module:attr"`` or
``"path/file.py:attr"``, where ``attr`` is an :class:`AlgoSpec` (or a module defining ``SPEC``).
The contract an algorithm keeps is in ``docs/own-algo.md``; :func:`algos.check.check` tests it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, NamedTuple

from algos import ppo, pqn, sac
from algos.common import Algo, EvalMetrics, Range, batched, evaluate_policy

Actions = Literal["discrete", "continuous", "any"]


class AlgoSpec(NamedTuple):
    """What the harness needs to drive an algorithm by name."""

    name: str
    config_cls: type  # frozen dataclass of static settings
    hparams_cls: Any  # flax struct of float32 hyperparameters, with ``.default(**overrides)``
    make: Callable[..., Algo]  # make(config, env, env_params)
    actions: Actions = "any"  # the action spaces it trains on: checked against the env's before Ray starts


_REGISTRY = {
    "ppo": AlgoSpec("ppo", ppo.PPOConfig, ppo.PPOHParams, ppo.make),
    "sac": AlgoSpec("sac", sac.SACConfig, sac.SACHParams, sac.make, "continuous"),
    "pqn": AlgoSpec("pqn", pqn.PQNConfig, pqn.PQNHParams, pqn.make, "discrete"),
}
ENTRY_POINTS = "rl_harness.algos"
_FORMS = "'package.module:attr' or 'path/file.py:attr' naming an algos.AlgoSpec"


class UnknownAlgoError(ValueError):
    """Raised by :func:`get` for a name that names no algorithm."""


def registered() -> list[str]:
    """The built-in algorithms and those installed packages register, sorted."""
    return sorted({*_REGISTRY, *(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINTS))})


def get(name: str) -> AlgoSpec:
    """The algorithm ``name`` names: a built-in, an entry point, or ``module:attr`` / ``file.py:attr``.

    Raises:
        UnknownAlgoError: the message lists the known algorithms and the import forms, or says why
            the code a name points at cannot be loaded.
    """
    if not isinstance(name, str):
        raise UnknownAlgoError(f"algo must be a name, got {name!r}")
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        return _from_code(name)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINTS, name=name):
        try:
            obj = ep.load()
        except Exception as err:
            raise UnknownAlgoError(f"entry point {name!r} ({ep.value}) of {ENTRY_POINTS} failed to load: "
                                   f"{type(err).__name__}: {err}") from None
        return _as_spec(obj, f"entry point {name!r} ({ep.value})")
    raise UnknownAlgoError(f"unknown algo {name!r}; known algos: {', '.join(registered())} "
                           f"(or your own: {_FORMS})")


def _from_code(name: str) -> AlgoSpec:
    from envs.custom import EnvSpecError, load_file

    where, attr = name.rsplit(":", 1)
    try:
        if where.endswith(".py") or "/" in where:
            module: Any = load_file(Path(where))
        else:
            module = importlib.import_module(where)
    except EnvSpecError as err:
        raise UnknownAlgoError(f"algo {name!r}: {err}") from None
    except ImportError as err:
        raise UnknownAlgoError(f"algo {name!r}: cannot import {where!r} ({err})") from None
    except Exception as err:  # the user's module raised while importing: theirs, in one line
        raise UnknownAlgoError(f"algo {name!r}: importing {where!r} failed: {type(err).__name__}: {err}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            specs = [k for k, v in vars(module).items() if isinstance(v, AlgoSpec)]
            has = f"it defines {', '.join(specs)}" if specs else "it defines no AlgoSpec"
            raise UnknownAlgoError(f"algo {name!r}: {where} has no {attr!r}; {has}")
        obj = getattr(obj, part)
    return _as_spec(obj, f"algo {name!r}")


def _as_spec(obj: Any, what: str) -> AlgoSpec:
    spec = getattr(obj, "SPEC", None) if isinstance(obj, ModuleType) else obj
    if not isinstance(spec, AlgoSpec):
        raise UnknownAlgoError(f"{what} must name an algos.AlgoSpec (or a module defining SPEC), "
                               f"got {type(spec).__name__}")
    if spec.actions not in ("discrete", "continuous", "any"):
        raise UnknownAlgoError(f"{what}: AlgoSpec.actions must be 'discrete', 'continuous' or 'any', "
                               f"got {spec.actions!r}")
    from algos.check import AlgoContractError, check_classes

    try:  # before anything reads the classes' fields
        check_classes(spec)
    except AlgoContractError as err:
        raise UnknownAlgoError(str(err)) from None
    return spec


def is_builtin(name: str) -> bool:
    return name in _REGISTRY


__all__ = ["Algo", "AlgoSpec", "EvalMetrics", "Range", "UnknownAlgoError", "batched", "evaluate_policy", "get",
           "is_builtin", "registered"]
