"""Pure-JAX environments and their registry: ``envs.make(name) -> (env, params)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envs.cartpole import CartPole, ContinuousCartPole
from envs.core import Box, Discrete, Environment, Step, Transition
from envs.dungeon import DungeonCrawl
from envs.pendulum import Pendulum
from envs.snake import Snake
from envs.wrappers import FlattenObservation

_REGISTRY: dict[str, Callable[[], Environment]] = {
    "CartPole-v1": CartPole,
    "ContinuousCartPole-v1": ContinuousCartPole,
    "DungeonCrawl-v1": lambda: FlattenObservation(env=DungeonCrawl()),
    "Pendulum-v1": Pendulum,
    "Snake-v1": Snake,
}


class UnknownEnvError(ValueError):
    """Raised by :func:`make` for a name that is not registered."""


def registered() -> list[str]:
    """The names :func:`make` accepts, sorted."""
    return sorted(_REGISTRY)


def make(name: str, **param_overrides: Any) -> tuple[Environment, Any]:
    """Builds a registered environment and its default params (optionally overridden).

    ``"gymnax:NAME"`` and ``"jumanji:NAME"`` build another library's env through
    :mod:`envs.adapters` (gymnax params overrides; Jumanji constructor arguments).

    Raises:
        UnknownEnvError: ``name`` is not registered; the message lists the known names.
    """
    if ":" in name:  # another library's env through an adapter (optional extras)
        from envs.adapters import make as make_adapter

        library, inner = name.split(":", 1)
        try:
            return make_adapter(library, inner, **param_overrides)
        except ValueError as err:
            raise UnknownEnvError(str(err)) from err
    if name not in _REGISTRY:
        raise UnknownEnvError(f"unknown env {name!r}; known envs: {', '.join(registered())} "
                              "(or gymnax:NAME, jumanji:NAME with the adapters extra)")
    env = _REGISTRY[name]()
    params = env.default_params
    if param_overrides:
        params = params.replace(**param_overrides)
    return env, params


__all__ = [
    "Box",
    "Discrete",
    "Environment",
    "FlattenObservation",
    "Step",
    "Transition",
    "UnknownEnvError",
    "make",
    "registered",
]
