"""The environment interface: functional, stateless, with named step results.

Every environment is a frozen (hashable) Python object holding no arrays. Its state and
parameters are pytrees passed in and out, so environments can be vmapped and jitted freely.

Subclasses implement ``reset`` and ``transition``; :meth:`Environment.step` adds the
time limit and the automatic reset in exactly one place.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Generic, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
from flax import struct

TState = TypeVar("TState")
TParams = TypeVar("TParams")


# (row, col) offsets of the grid actions up, right, down, left (Snake, DungeonCrawl)
MOVES = jnp.array([[-1, 0], [0, 1], [1, 0], [0, -1]], jnp.int32)


@dataclasses.dataclass(frozen=True)
class Discrete:
    """``n`` actions ``0 .. n-1``."""

    n: int
    shape: tuple[int, ...] = ()
    dtype: Any = jnp.int32

    def __str__(self) -> str:
        return f"Discrete({self.n})"

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.randint(key, (), 0, self.n, dtype=self.dtype)

    def contains(self, x: jax.Array) -> jax.Array:
        return jnp.logical_and(x >= 0, x < self.n)


@dataclasses.dataclass(frozen=True)
class Box:
    """A box ``[low, high]`` of the given shape (bounds may be infinite)."""

    low: float
    high: float
    shape: tuple[int, ...]
    dtype: Any = jnp.float32

    def __str__(self) -> str:
        return f"Box({self.low}, {self.high}, {self.shape})"

    def sample(self, key: jax.Array) -> jax.Array:
        low = jnp.maximum(self.low, -1e3)
        high = jnp.minimum(self.high, 1e3)
        return jax.random.uniform(key, self.shape, self.dtype, low, high)

    def contains(self, x: jax.Array) -> jax.Array:
        x = jnp.asarray(x)
        if x.shape != self.shape:
            return jnp.asarray(False)
        return jnp.all(jnp.logical_and(x >= self.low, x <= self.high))


@dataclasses.dataclass(frozen=True)
class MultiDiscrete:
    """``len(nvec)`` sub-actions taken at once, the i-th in ``0 .. nvec[i]-1``: an action is an
    int32 ``[len(nvec)]``. Its action mask (if the env has one) is ``[len(nvec), max(nvec)]``, one
    row of legal choices per sub-action (entries past ``nvec[i]`` are ignored)."""

    nvec: tuple[int, ...]
    dtype: Any = jnp.int32

    def __post_init__(self) -> None:
        if not self.nvec or min(self.nvec) < 1:
            raise ValueError("MultiDiscrete needs at least one sub-action of at least one choice, "
                             f"got {self.nvec}")

    def __str__(self) -> str:
        return f"MultiDiscrete({list(self.nvec)})"

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.nvec),)

    @property
    def width(self) -> int:
        """Choices per row of the policy's logits (the largest sub-action)."""
        return max(self.nvec)

    def valid(self) -> jax.Array:
        """``[len(nvec), width]`` bool: which logits are choices at all."""
        return jnp.arange(self.width)[None, :] < jnp.asarray(self.nvec)[:, None]

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.randint(key, self.shape, 0, jnp.asarray(self.nvec), dtype=self.dtype)

    def contains(self, x: jax.Array) -> jax.Array:
        x = jnp.asarray(x)
        if x.shape != self.shape:
            return jnp.asarray(False)
        return jnp.all(jnp.logical_and(x >= 0, x < jnp.asarray(self.nvec)))


Space = Discrete | MultiDiscrete | Box


@struct.dataclass
class Step:
    """The result of :meth:`Environment.step`.

    ``obs``/``state`` are already reset when the episode ended; ``final_obs`` is the
    observation the transition reached before any reset (use it to bootstrap on truncation).
    ``terminated`` and ``truncated`` are exclusive: a step that hits the time limit and a
    terminal state at once is terminated.
    """

    obs: Any  # [*obs_shape], or a pytree of arrays for structured observations
    state: Any
    reward: jax.Array  # [] float32
    terminated: jax.Array  # [] bool
    truncated: jax.Array  # [] bool
    final_obs: jax.Array  # [*obs_shape]
    info: dict[str, jax.Array] = struct.field(default_factory=dict)

    @property
    def done(self) -> jax.Array:
        return jnp.logical_or(self.terminated, self.truncated)


class Transition(NamedTuple):
    """What an environment's own dynamics return (no time limit, no reset).

    ``truncated`` is for the env's own limits other than ``max_steps`` (e.g. Snake's steps
    without eating); the time limit itself is applied by :meth:`Environment.step`.
    """

    obs: Any  # an array, or a pytree of arrays for structured observations
    state: Any
    reward: jax.Array
    terminated: jax.Array
    info: dict[str, jax.Array]
    truncated: jax.Array | bool = False


@dataclasses.dataclass(frozen=True)
class Environment(Generic[TState, TParams]):
    """Base class. States must have an int32 ``time`` field; params a static ``max_steps``."""

    name: str = "Environment"

    @property
    def default_params(self) -> TParams:
        raise NotImplementedError

    def observation_space(self, params: TParams) -> Box:
        raise NotImplementedError

    def action_space(self, params: TParams) -> Space:
        raise NotImplementedError

    def reset(self, key: jax.Array, params: TParams) -> tuple[jax.Array, TState]:
        """Starts an episode. Returns ``(obs, state)``."""
        raise NotImplementedError

    def transition(
        self, key: jax.Array, state: TState, action: jax.Array, params: TParams
    ) -> Transition:
        """One step of the dynamics, with ``state.time`` advanced by one."""
        raise NotImplementedError

    def action_mask(self, state: TState, params: TParams) -> jax.Array | None:
        """Legal actions as a bool vector, or ``None`` when every action is always legal."""
        return None

    def observe(self, state: TState, params: TParams) -> Any:
        """The observation of ``state``, for envs whose observation is a function of the state.

        ``None`` (the default): :meth:`step` takes the observation from ``reset``/``transition``
        and selects between them. An env that implements this lets :meth:`step` observe the
        already-selected next state instead, so the reset observation is never built.
        """
        return None

    def step(self, key: jax.Array, state: TState, action: jax.Array, params: TParams) -> Step:
        """Steps the dynamics, applies the time limit and resets finished episodes."""
        key_step, key_reset = jax.random.split(key)
        tr = self.transition(key_step, state, action, params)
        terminated = jnp.asarray(tr.terminated, jnp.bool_)
        out_of_time = tr.state.time >= params.max_steps  # type: ignore[attr-defined]
        truncated = jnp.logical_and(jnp.logical_or(out_of_time, tr.truncated), ~terminated)
        done = jnp.logical_or(terminated, truncated)
        reset_obs, reset_state = self.reset(key_reset, params)
        where_done = partial(jax.tree.map, lambda r, s: jnp.where(done, r, s))
        next_state = where_done(reset_state, tr.state)
        obs = self.observe(next_state, params)
        return Step(
            obs=where_done(reset_obs, tr.obs) if obs is None else obs,
            state=next_state,
            reward=jnp.asarray(tr.reward, jnp.float32),
            terminated=terminated,
            truncated=truncated,
            final_obs=tr.obs,
            info=tr.info,
        )
