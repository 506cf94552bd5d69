"""Any gymnax environment as an :class:`envs.Environment` (``envs.make("gymnax:NAME")``).

gymnax folds its time limit into ``done``; here a ``done`` that comes only from reaching
``max_steps_in_episode`` is a truncation (our :meth:`Environment.step` applies that limit), and
every other ``done`` is a termination. gymnax's own auto-reset is not used.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import Box, Discrete, Environment, Space, Transition

# gymnax 0.0.9's MinAtar games scatter ints into bool grids; JAX warns at every trace, in every process
warnings.filterwarnings("ignore", message="scatter inputs have incompatible types", category=FutureWarning)

# envs that cannot run here, with the reason (a study refuses them before Ray starts)
REFUSED = {
    "MNISTBandit-bsuite": "downloads MNIST through torchvision on first use (not installed here, and needs the "
                          "internet); try gymnax:Catch-bsuite or a MinAtar env",
    "SimpleBandit-bsuite": "is broken in gymnax itself: its reset builds EnvState positionally, so the "
                           "rewards land in `time` and the first step fails with IndexError, eagerly too; "
                           "try gymnax:BernoulliBandit-misc",
}


@struct.dataclass
class GymnaxParams:
    inner: Any  # gymnax's EnvParams
    max_steps: int = struct.field(pytree_node=False, default=500)


def _action_space(name: str, space: Any) -> Space:
    """Our space for gymnax's action space (asked for once, eagerly, at ``make``)."""
    if hasattr(space, "n"):
        return Discrete(int(space.n))
    low, high = np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)
    if low.min() != low.max() or high.min() != high.max():
        raise ValueError(f"gymnax:{name}'s action bounds differ per dimension ({low} .. {high}); "
                         "envs.Box has one low and one high")
    return Box(float(low.min()), float(high.max()), tuple(space.shape))


@struct.dataclass
class GymnaxState:
    """gymnax's own state, untouched (some envs keep ``time`` as a float and read it back as
    one), beside the int32 ``time`` the contract asks for."""

    inner: Any
    time: jax.Array


@dataclasses.dataclass(frozen=True)
class GymnaxEnv(Environment):
    """A gymnax env; its state is gymnax's beside an int32 ``time``. Both spaces are
    fixed when it is made (``make_gymnax``): gymnax computes some from its params, which are
    traced inside a compiled trial."""

    inner: Any = None
    obs_space: Box = Box(-np.inf, np.inf, ())
    act_space: Space = Discrete(1)

    def __hash__(self) -> int:
        return hash((type(self), self.name))

    @property
    def default_params(self) -> GymnaxParams:
        p = self.inner.default_params
        return GymnaxParams(p, int(p.max_steps_in_episode))

    def observation_space(self, params: GymnaxParams) -> Box:
        return self.obs_space

    def action_space(self, params: GymnaxParams) -> Space:
        return self.act_space

    def reset(self, key: jax.Array, params: GymnaxParams) -> tuple[jax.Array, Any]:
        obs, state = self.inner.reset_env(key, params.inner)
        return jnp.asarray(obs, jnp.float32), GymnaxState(state, jnp.int32(0))

    def transition(self, key: jax.Array, state: GymnaxState, action: jax.Array,
                   params: GymnaxParams) -> Transition:
        obs, new, reward, done, info = self.inner.step_env(key, state.inner, action, params.inner)
        time = state.time + 1
        out_of_time = time >= params.inner.max_steps_in_episode
        terminated = jnp.logical_and(done, ~out_of_time)
        info = {k: v for k, v in info.items() if k != "discount"}
        return Transition(jnp.asarray(obs, jnp.float32), GymnaxState(new, time),
                          jnp.asarray(reward, jnp.float32), terminated,
                          info, truncated=jnp.logical_and(done, out_of_time))


def make_gymnax(name: str, **param_overrides: Any) -> tuple[Environment, Any]:
    import gymnax

    if name not in gymnax.registered_envs:
        raise ValueError(f"unknown gymnax env {name!r}; gymnax envs: {', '.join(gymnax.registered_envs)}")
    if name in REFUSED:
        raise ValueError(f"gymnax:{name} {REFUSED[name]}")
    inner, inner_params = gymnax.make(name)
    if param_overrides:
        inner_params = inner_params.replace(**param_overrides)
    obs = jax.eval_shape(lambda k: inner.reset_env(k, inner_params)[0], jax.random.key(0))
    env = GymnaxEnv(name=f"gymnax:{name}", inner=inner, obs_space=Box(-np.inf, np.inf, tuple(obs.shape)),
                    act_space=_action_space(name, inner.action_space(inner_params)))
    return env, GymnaxParams(inner_params, int(inner_params.max_steps_in_episode))
