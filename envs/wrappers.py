"""Wrappers that change how an environment looks, never its dynamics."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from envs.core import Box, Environment, Space, Transition


def flatten(obs: Any) -> jax.Array:
    """Concatenates the raveled leaves of a structured observation (in ``jax.tree`` order)."""
    return jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(obs)]).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class FlattenObservation(Environment):
    """``env`` with its structured (pytree) observation flattened to one float32 vector.

    Build it as ``FlattenObservation(env=inner)`` (the first positional field is ``name``).

    The leaves are concatenated in ``jax.tree`` order (dict keys sorted); the observation space
    is a Box spanning the lowest and highest bounds of the parts.
    """

    env: Environment = dataclasses.field(default_factory=Environment)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.env.name)

    @property
    def default_params(self) -> Any:
        return self.env.default_params

    def observation_space(self, params: Any) -> Box:
        parts = jax.tree.leaves(self.env.observation_space(params),
                                is_leaf=lambda x: isinstance(x, Box))
        size = sum(math.prod(b.shape) for b in parts)
        return Box(min(b.low for b in parts), max(b.high for b in parts), (size,))

    def action_space(self, params: Any) -> Space:
        return self.env.action_space(params)

    def observe(self, state: Any, params: Any) -> jax.Array | None:
        obs = self.env.observe(state, params)
        return None if obs is None else flatten(obs)

    def action_mask(self, state: Any, params: Any) -> jax.Array | None:
        return self.env.action_mask(state, params)

    def reset(self, key: jax.Array, params: Any) -> tuple[jax.Array, Any]:
        obs, state = self.env.reset(key, params)
        return flatten(obs), state

    def transition(self, key: jax.Array, state: Any, action: jax.Array, params: Any) -> Transition:
        tr = self.env.transition(key, state, action, params)
        return tr._replace(obs=flatten(tr.obs))
