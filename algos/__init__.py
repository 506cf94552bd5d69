"""PPO and SAC as pure JAX kernels, and a registry: ``algos.get(name) -> AlgoSpec``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from algos import ppo, sac
from algos.common import Algo, EvalMetrics, batched


class AlgoSpec(NamedTuple):
    """What the harness needs to drive an algorithm by name."""

    name: str
    config_cls: type  # frozen dataclass of static settings
    hparams_cls: Any  # flax struct of float32 hyperparameters, with ``.default(**overrides)``
    make: Callable[..., Algo]  # make(config, env, env_params)


_REGISTRY = {
    "ppo": AlgoSpec("ppo", ppo.PPOConfig, ppo.PPOHParams, ppo.make),
    "sac": AlgoSpec("sac", sac.SACConfig, sac.SACHParams, sac.make),
}


class UnknownAlgoError(ValueError):
    """Raised by :func:`get` for an unregistered name."""


def registered() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> AlgoSpec:
    """The registered algorithm ``name``.

    Raises:
        UnknownAlgoError: the message lists the known algorithms.
    """
    if name not in _REGISTRY:
        raise UnknownAlgoError(f"unknown algo {name!r}; known algos: {', '.join(registered())}")
    return _REGISTRY[name]


__all__ = ["Algo", "AlgoSpec", "EvalMetrics", "UnknownAlgoError", "batched", "get", "registered"]
