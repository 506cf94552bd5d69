"""Pendulum-v1 with gymnasium's dynamics, reward and 200-step time limit.

Swing a frictionless pendulum up and hold it: reward
``-(angle_normalize(th)^2 + 0.1 thdot^2 + 0.001 u^2)``, torque ``u`` clipped to [-2, 2].
Observation ``(cos th, sin th, thdot)``. Never terminates; truncates after 200 steps.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import Box, Environment, Transition


@struct.dataclass
class PendulumState:
    theta: jax.Array  # [] angle, 0 = upright
    theta_dot: jax.Array  # [] angular velocity
    time: jax.Array  # [] int32


@struct.dataclass
class PendulumParams:
    max_speed: float = 8.0
    max_torque: float = 2.0
    dt: float = 0.05
    g: float = 10.0
    m: float = 1.0
    l: float = 1.0  # noqa: E741 (gymnasium's name)
    max_steps: int = struct.field(pytree_node=False, default=200)


def angle_normalize(x: jax.Array) -> jax.Array:
    return ((x + math.pi) % (2 * math.pi)) - math.pi


def _obs(s: PendulumState) -> jax.Array:
    return jnp.stack([jnp.cos(s.theta), jnp.sin(s.theta), s.theta_dot]).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class Pendulum(Environment[PendulumState, PendulumParams]):
    name: str = "Pendulum-v1"

    @property
    def default_params(self) -> PendulumParams:
        return PendulumParams()

    def observation_space(self, params: PendulumParams) -> Box:
        return Box(-params.max_speed, params.max_speed, (3,))

    def action_space(self, params: PendulumParams) -> Box:
        return Box(-params.max_torque, params.max_torque, (1,))

    def reset(self, key: jax.Array, params: PendulumParams) -> tuple[jax.Array, PendulumState]:
        high = jnp.array([math.pi, 1.0], jnp.float32)
        theta, theta_dot = jax.random.uniform(key, (2,), jnp.float32, -high, high)
        state = PendulumState(theta, theta_dot, jnp.int32(0))
        return _obs(state), state

    def transition(
        self, key: jax.Array, state: PendulumState, action: jax.Array, params: PendulumParams
    ) -> Transition:
        p = params
        u = jnp.clip(jnp.reshape(action, ()), -p.max_torque, p.max_torque)
        th, thdot = state.theta, state.theta_dot
        cost = angle_normalize(th) ** 2 + 0.1 * thdot**2 + 0.001 * u**2
        thdot = thdot + (3 * p.g / (2 * p.l) * jnp.sin(th) + 3.0 / (p.m * p.l**2) * u) * p.dt
        thdot = jnp.clip(thdot, -p.max_speed, p.max_speed)
        new = PendulumState(th + thdot * p.dt, thdot, state.time + 1)
        return Transition(_obs(new), new, -cost, jnp.bool_(False), {})
