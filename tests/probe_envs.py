"""Probe environments (after rejax's tests): tiny MDPs whose right answer is known exactly."""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import Box, Discrete, Environment, Transition


@struct.dataclass
class ProbeState:
    obs: jax.Array  # [1]
    time: jax.Array  # [] int32


@struct.dataclass
class ProbeParams:
    max_steps: int = struct.field(pytree_node=False, default=10)


@dataclasses.dataclass(frozen=True)
class Probe(Environment[ProbeState, ProbeParams]):
    """``constant``: one step, reward 1 (V = 1). ``two_step``: obs 0 then 1, reward 1 at the end
    (V(0) = gamma). ``action``: obs = +-1 at random; one step; reward 1 for the matching action
    (discrete: action 1 when obs > 0; continuous: reward ``1 - (a - obs/2)^2``)."""

    kind: Literal["constant", "two_step", "action"] = "constant"
    discrete: bool = True
    name: str = "Probe"

    @property
    def default_params(self) -> ProbeParams:
        return ProbeParams()

    def observation_space(self, params: ProbeParams) -> Box:
        return Box(-1.0, 1.0, (1,))

    def action_space(self, params: ProbeParams) -> Discrete | Box:
        return Discrete(2) if self.discrete else Box(-1.0, 1.0, (1,))

    def reset(self, key: jax.Array, params: ProbeParams) -> tuple[jax.Array, ProbeState]:
        obs = jnp.zeros(1)
        if self.kind == "action":
            obs = jnp.where(jax.random.bernoulli(key), 1.0, -1.0) * jnp.ones(1)
        return obs, ProbeState(obs, jnp.int32(0))

    def transition(self, key, state, action, params) -> Transition:
        time = state.time + 1
        if self.kind == "constant":
            return Transition(state.obs, ProbeState(state.obs, time), jnp.float32(1.0),
                              jnp.bool_(True), {})
        if self.kind == "two_step":
            first = state.obs[0] == 0.0
            obs = jnp.ones(1)
            return Transition(obs, ProbeState(obs, time), jnp.where(first, 0.0, 1.0),
                              ~first, {})
        if self.discrete:
            reward = (jnp.reshape(action, ()) == (state.obs[0] > 0)).astype(jnp.float32)
        else:
            reward = 1.0 - (jnp.reshape(action, ()) - state.obs[0] / 2) ** 2
        return Transition(state.obs, ProbeState(state.obs, time), reward, jnp.bool_(True), {})


@struct.dataclass
class PointState:
    obs: jax.Array  # [H, W, 2]
    target: jax.Array  # [] int32: the marked cell, row-major
    time: jax.Array  # [] int32


@dataclasses.dataclass(frozen=True)
class PointAtTheCell(Environment[PointState, ProbeParams]):
    """A grid probe for policies over cells: one cell of a ``size x size`` grid is marked (features
    one-hot: empty, marked), at random; one step; reward 1 for the action that names the marked cell
    (row-major index), 0 otherwise. Random play earns ``1 / size**2``; the right answer needs the
    cell's position, which a policy that sees its cells as an unordered set cannot know."""

    size: int = 3
    name: str = "PointAtTheCell"

    @property
    def default_params(self) -> ProbeParams:
        return ProbeParams()

    def observation_space(self, params: ProbeParams) -> Box:
        return Box(0.0, 1.0, (self.size, self.size, 2))

    def action_space(self, params: ProbeParams) -> Discrete:
        return Discrete(self.size * self.size)

    def grid(self, target: jax.Array) -> jax.Array:
        marked = jax.nn.one_hot(target, self.size * self.size).reshape(self.size, self.size)
        return jnp.stack([1.0 - marked, marked], axis=-1)

    def reset(self, key: jax.Array, params: ProbeParams) -> tuple[jax.Array, PointState]:
        target = jax.random.randint(key, (), 0, self.size * self.size)
        obs = self.grid(target)
        return obs, PointState(obs, target, jnp.int32(0))

    def transition(self, key, state, action, params) -> Transition:
        reward = (jnp.reshape(action, ()) == state.target).astype(jnp.float32)
        return Transition(state.obs, state.replace(time=state.time + 1), reward, jnp.bool_(True), {})
