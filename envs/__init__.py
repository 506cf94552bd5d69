"""Pure-JAX environments and their registry: ``envs.make(name) -> (env, params)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envs.cartpole import CartPole, ContinuousCartPole
from envs.check import EnvContractError, check
from envs.core import Box, Discrete, Environment, MultiDiscrete, Step, Transition
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

    ``"gymnax:NAME"``, ``"jumanji:NAME"`` and ``"brax:NAME"`` build another library's env
    through :mod:`envs.adapters` (gymnax params overrides; Jumanji or Brax constructor
    arguments). ``"package.module:attr"`` and ``"path/file.py:attr"`` build an env of one's own
    (:mod:`envs.custom`: an ``Environment`` instance or class, or a factory).

    Raises:
        UnknownEnvError: ``name`` is not registered or cannot be built; the message says why
            and lists the known names.
    """
    from envs.adapters import LIBRARIES

    if not isinstance(name, str):
        raise UnknownEnvError(f"an env name must be a string, got {type(name).__name__} "
                              "(name your own env as 'module:attr' or 'file.py:attr')")
    library = name.split(":", 1)[0] if ":" in name else None
    if library in LIBRARIES:  # another library's env through an adapter (optional extras)
        from envs.adapters import make as make_adapter

        try:
            return make_adapter(library, name.split(":", 1)[1], **param_overrides)
        except ValueError as err:
            raise UnknownEnvError(str(err)) from err
    if library is not None:
        from envs.custom import EnvSpecError, is_code_spec, make_from_code

        if not is_code_spec(name):
            raise UnknownEnvError(f"unknown env {name!r}: {library!r} is neither an adapter library "
                                  f"({', '.join(LIBRARIES)}) nor an importable module or .py file")
        try:
            env, params = make_from_code(name)
        except EnvSpecError as err:
            raise UnknownEnvError(str(err)) from None
        return env, (params.replace(**param_overrides) if param_overrides else params)
    if name not in _REGISTRY:
        raise UnknownEnvError(f"unknown env {name!r}; known envs: {', '.join(registered())} "
                              "(or gymnax:NAME, jumanji:NAME, brax:NAME with their extras, or your own "
                              "as 'module:attr' or 'file.py:attr')")
    env = _REGISTRY[name]()
    params = env.default_params
    if param_overrides:
        params = params.replace(**param_overrides)
    return env, params


__all__ = [
    "Box",
    "Discrete",
    "MultiDiscrete",
    "EnvContractError",
    "Environment",
    "FlattenObservation",
    "Step",
    "Transition",
    "UnknownEnvError",
    "check",
    "make",
    "registered",
]
