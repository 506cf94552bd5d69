"""Any gymnax environment as an :class:`envs.Environment` (``envs.make("gymnax:NAME")``).

gymnax folds its time limit into ``done``; here a ``done`` that comes only from reaching
``max_steps_in_episode`` is a truncation (our :meth:`Environment.step` applies that limit), and
every other ``done`` is a termination. gymnax's own auto-reset is not used.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import Box, Discrete, Environment, Space, Transition


@struct.dataclass
class GymnaxParams:
    inner: Any  # gymnax's EnvParams
    max_steps: int = struct.field(pytree_node=False, default=500)


def _space(space: Any) -> Space:
    if hasattr(space, "n"):
        return Discrete(int(space.n))
    return Box(float(jnp.min(space.low)), float(jnp.max(space.high)), tuple(space.shape))


@dataclasses.dataclass(frozen=True)
class GymnaxEnv(Environment):
    """A gymnax env; its state (which has gymnax's ``time``) is used as ours."""

    inner: Any = None

    def __hash__(self) -> int:
        return hash((type(self), self.name))

    @property
    def default_params(self) -> GymnaxParams:
        p = self.inner.default_params
        return GymnaxParams(p, int(p.max_steps_in_episode))

    def observation_space(self, params: GymnaxParams) -> Box:
        space = _space(self.inner.observation_space(params.inner))
        assert isinstance(space, Box)
        return space

    def action_space(self, params: GymnaxParams) -> Space:
        return _space(self.inner.action_space(params.inner))

    def reset(self, key: jax.Array, params: GymnaxParams) -> tuple[jax.Array, Any]:
        return self.inner.reset_env(key, params.inner)

    def transition(self, key: jax.Array, state: Any, action: jax.Array, params: GymnaxParams) -> Transition:
        obs, new, reward, done, info = self.inner.step_env(key, state, action, params.inner)
        out_of_time = new.time >= params.inner.max_steps_in_episode
        terminated = jnp.logical_and(done, ~out_of_time)
        info = {k: v for k, v in info.items() if k != "discount"}
        return Transition(obs.astype(jnp.float32), new, jnp.asarray(reward, jnp.float32), terminated,
                          info, truncated=jnp.logical_and(done, out_of_time))


def make_gymnax(name: str, **param_overrides: Any) -> tuple[Environment, Any]:
    import gymnax

    if name not in gymnax.registered_envs:
        raise ValueError(f"unknown gymnax env {name!r}; gymnax envs: {', '.join(gymnax.registered_envs)}")
    inner, _ = gymnax.make(name)
    env = GymnaxEnv(name=f"gymnax:{name}", inner=inner)
    params = env.default_params
    if param_overrides:
        params = params.replace(inner=params.inner.replace(**param_overrides))
    return env, params
