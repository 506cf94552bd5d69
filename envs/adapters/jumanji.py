"""Any Jumanji environment as an :class:`envs.Environment` (``envs.make("jumanji:NAME")``).

Jumanji ends an episode with discount 0 on termination and discount 1 on truncation (its own
time limit); those become our ``terminated`` and ``truncated``. The observation's
``action_mask`` field, when present, is served by :meth:`JumanjiEnv.action_mask`, and the other
fields form the (structured) observation, flattened by :class:`envs.FlattenObservation`.
Jumanji keeps its random key in its state, so the keys we pass in are used only to reset.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import Box, Discrete, Environment, Transition
from envs.wrappers import FlattenObservation


@struct.dataclass
class JumanjiState:
    inner: Any  # Jumanji's state
    mask: jax.Array  # [A] bool, the observation's action mask (all True if it has none)
    time: jax.Array  # [] int32


@struct.dataclass
class JumanjiParams:
    # Jumanji's own time limit where it has one; episodes also bound evaluation's scan length
    max_steps: int = struct.field(pytree_node=False, default=10_000)


@dataclasses.dataclass(frozen=True)
class JumanjiEnv(Environment):
    inner: Any = None

    def __hash__(self) -> int:
        return hash((type(self), self.name))

    @property
    def default_params(self) -> JumanjiParams:
        return JumanjiParams(int(getattr(self.inner, "time_limit", 10_000)))

    def _split(self, observation: Any, num_actions: int) -> tuple[dict, jax.Array]:
        fields = observation._asdict() if hasattr(observation, "_asdict") else dict(vars(observation))
        mask = fields.pop("action_mask", None)
        mask = jnp.ones(num_actions, jnp.bool_) if mask is None else jnp.asarray(mask, jnp.bool_)
        return {k: jnp.asarray(v, jnp.float32) for k, v in fields.items()}, mask

    def observation_space(self, params: JumanjiParams) -> dict[str, Box]:  # type: ignore[override]
        obs, _ = jax.eval_shape(lambda k: self._split(self.inner.reset(k)[1].observation, 1),
                                jax.random.key(0))
        return {k: Box(-jnp.inf, jnp.inf, v.shape) for k, v in obs.items()}

    def action_space(self, params: JumanjiParams) -> Discrete:
        return Discrete(int(self.inner.action_spec.num_values))

    def action_mask(self, state: JumanjiState, params: JumanjiParams) -> jax.Array:
        return state.mask

    def reset(self, key: jax.Array, params: JumanjiParams) -> tuple[dict, JumanjiState]:
        inner, ts = self.inner.reset(key)
        obs, mask = self._split(ts.observation, self.action_space(params).n)
        return obs, JumanjiState(inner, mask, jnp.int32(0))

    def transition(self, key: jax.Array, state: JumanjiState, action: jax.Array,
                   params: JumanjiParams) -> Transition:
        inner, ts = self.inner.step(state.inner, action)
        obs, mask = self._split(ts.observation, self.action_space(params).n)
        last = ts.last()
        terminated = last & (ts.discount == 0)
        return Transition(obs, JumanjiState(inner, mask, state.time + 1),
                          jnp.asarray(ts.reward, jnp.float32), terminated, {},
                          truncated=last & ~terminated)


def make_jumanji(name: str, **kwargs: Any) -> tuple[Environment, Any]:
    """Jumanji's ``name`` built with ``kwargs`` (e.g. ``num_rows=6``), observation flattened."""
    import jumanji

    known = jumanji.registered_environments()
    if name not in known:
        raise ValueError(f"unknown jumanji env {name!r}; jumanji envs: {', '.join(sorted(known))}")
    env = FlattenObservation(env=JumanjiEnv(name=f"jumanji:{name}", inner=jumanji.make(name, **kwargs)))
    return env, env.default_params
