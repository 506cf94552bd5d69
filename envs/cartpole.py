"""CartPole-v1 (discrete) and a continuous-force variant, with gymnasium's dynamics.

Dynamics, reward (1 per step, the terminating step included), termination (|x| > 2.4 or
|theta| > 12 degrees) and the 500-step time limit follow gymnasium's ``CartPole-v1`` (Euler
integration). The observation is the physical state ``(x, x_dot, theta, theta_dot)``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import Box, Discrete, Environment, Transition


@struct.dataclass
class CartPoleState:
    x: jax.Array  # [] cart position
    x_dot: jax.Array  # [] cart velocity
    theta: jax.Array  # [] pole angle (rad)
    theta_dot: jax.Array  # [] pole angular velocity
    time: jax.Array  # [] int32 steps taken in this episode


@struct.dataclass
class CartPoleParams:
    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5  # half the pole's length
    force_mag: float = 10.0
    tau: float = 0.02
    theta_threshold: float = 12 * 2 * math.pi / 360
    x_threshold: float = 2.4
    max_steps: int = struct.field(pytree_node=False, default=500)

    @property
    def total_mass(self) -> float:
        return self.masspole + self.masscart

    @property
    def polemass_length(self) -> float:
        return self.masspole * self.length


def _obs(s: CartPoleState) -> jax.Array:
    return jnp.stack([s.x, s.x_dot, s.theta, s.theta_dot]).astype(jnp.float32)


def _physics(s: CartPoleState, force: jax.Array, p: CartPoleParams) -> Transition:
    cos, sin = jnp.cos(s.theta), jnp.sin(s.theta)
    temp = (force + p.polemass_length * s.theta_dot**2 * sin) / p.total_mass
    theta_acc = (p.gravity * sin - cos * temp) / (
        p.length * (4.0 / 3.0 - p.masspole * cos**2 / p.total_mass)
    )
    x_acc = temp - p.polemass_length * theta_acc * cos / p.total_mass
    new = CartPoleState(
        x=s.x + p.tau * s.x_dot,
        x_dot=s.x_dot + p.tau * x_acc,
        theta=s.theta + p.tau * s.theta_dot,
        theta_dot=s.theta_dot + p.tau * theta_acc,
        time=s.time + 1,
    )
    terminated = (jnp.abs(new.x) > p.x_threshold) | (jnp.abs(new.theta) > p.theta_threshold)
    return Transition(_obs(new), new, jnp.float32(1.0), terminated, {})


@dataclasses.dataclass(frozen=True)
class CartPole(Environment[CartPoleState, CartPoleParams]):
    """Push the cart left (0) or right (1) to keep the pole upright."""

    name: str = "CartPole-v1"

    @property
    def default_params(self) -> CartPoleParams:
        return CartPoleParams()

    def observation_space(self, params: CartPoleParams) -> Box:
        return Box(-jnp.inf, jnp.inf, (4,))

    def action_space(self, params: CartPoleParams) -> Discrete | Box:
        return Discrete(2)

    def reset(self, key: jax.Array, params: CartPoleParams) -> tuple[jax.Array, CartPoleState]:
        x, x_dot, theta, theta_dot = jax.random.uniform(key, (4,), jnp.float32, -0.05, 0.05)
        state = CartPoleState(x, x_dot, theta, theta_dot, jnp.int32(0))
        return _obs(state), state

    def force(self, action: jax.Array, params: CartPoleParams) -> jax.Array:
        return jnp.where(action == 1, params.force_mag, -params.force_mag)

    def transition(
        self, key: jax.Array, state: CartPoleState, action: jax.Array, params: CartPoleParams
    ) -> Transition:
        return _physics(state, self.force(action, params), params)


@dataclasses.dataclass(frozen=True)
class ContinuousCartPole(CartPole):
    """CartPole's physics with force ``clip(action, -1, 1) * force_mag``; action shape ``(1,)``."""

    name: str = "ContinuousCartPole-v1"

    def action_space(self, params: CartPoleParams) -> Discrete | Box:
        return Box(-1.0, 1.0, (1,))

    def force(self, action: jax.Array, params: CartPoleParams) -> jax.Array:
        return jnp.clip(jnp.reshape(action, ()), -1.0, 1.0) * params.force_mag
