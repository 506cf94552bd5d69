"""Any Jumanji environment as an :class:`envs.Environment` (``envs.make("jumanji:NAME")``).

Jumanji ends an episode with discount 0 on termination and discount 1 on truncation (its own
time limit); those become our ``terminated`` and ``truncated``. The observation's
``action_mask`` field, when present, is served by :meth:`JumanjiEnv.action_mask`, and the other
fields form the (structured) observation, flattened by :class:`envs.FlattenObservation`.
Jumanji keeps its random key in its state, so the keys we pass in are used only to reset.
Multi-agent envs (Connector, Cleaner, RobotWarehouse ...) give a reward and a discount per agent:
the reward is their sum (the team's), and the episode terminates when every discount is 0.

Actions, decided once when the env is made (``ACTIONS`` names the kinds):

- ``DiscreteArray``: a :class:`Discrete`, its mask as is (Snake, Game2048, Maze, PacMan ...).
- ``MultiDiscreteArray`` whose mask has the action's own shape (Minesweeper's board, Tetris's
  rotation x column, BinPack's space x item, Sudoku's row x column x digit): the mask is *joint*,
  so legality is a property of the whole action, and one categorical over the flattened product
  is the only policy that can obey it exactly; the action is one :class:`Discrete` of that
  product (refused above ``JOINT_LIMIT`` choices).
- ``MultiDiscreteArray`` whose mask has a row per sub-action (Connector, Cleaner, RobotWarehouse,
  JobShop, LevelBasedForaging: one row per agent or machine), or no mask: a
  :class:`MultiDiscrete`, one categorical per sub-action, each masked by its own row.
- ``BoundedArray`` of integers from 0 (MultiCVRP's node per vehicle): as ``MultiDiscreteArray``.
- ``BoundedArray`` of floats: a :class:`Box` of the flattened action (one low and one high bound).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import Box, Discrete, Environment, MultiDiscrete, Space, Transition
from envs.wrappers import FlattenObservation

JOINT_LIMIT = 16_384  # most choices a joint mask is flattened into (FlatPack's 25 x 4 x 9 x 9 fits)
ACTIONS = ("discrete", "joint", "multi", "box")

# envs that cannot run here, with the reason (refused when made, so before Ray starts)
REFUSED = {
    "Sokoban-v0": "downloads its levels from the internet (huggingface_hub) on first use; this "
                  "harness trains without network access, so it is refused (try jumanji:Maze-v0)",
}


@struct.dataclass
class JumanjiState:
    inner: Any  # Jumanji's state
    mask: jax.Array  # the observation's action mask in our action's shape (all True if it has none)
    time: jax.Array  # [] int32


@struct.dataclass
class JumanjiParams:
    # Jumanji's own time limit where it has one; episodes also bound evaluation's scan length
    max_steps: int = struct.field(pytree_node=False, default=10_000)


def _fields(observation: Any) -> dict[str, Any]:
    if hasattr(observation, "_asdict"):
        return dict(observation._asdict())
    if dataclasses.is_dataclass(observation):
        return {f.name: getattr(observation, f.name) for f in dataclasses.fields(observation)}
    return dict(vars(observation))


@dataclasses.dataclass(frozen=True)
class JumanjiEnv(Environment):
    """A Jumanji env; ``actions`` (one of ``ACTIONS``) and ``inner_shape`` (Jumanji's action
    shape, or the joint mask's) say how our action maps to Jumanji's."""

    inner: Any = None
    act_space: Space = Discrete(1)
    actions: str = "discrete"
    inner_shape: tuple[int, ...] = ()
    obs_shapes: tuple[tuple[int, ...], ...] = ()  # every leaf of the observation but its mask

    def __hash__(self) -> int:
        return hash((type(self), self.name, self.actions, self.inner_shape))

    @property
    def default_params(self) -> JumanjiParams:
        return JumanjiParams(int(getattr(self.inner, "time_limit", 10_000)))

    def _split(self, observation: Any) -> tuple[dict, jax.Array]:
        fields = _fields(observation)
        mask = fields.pop("action_mask", None)
        obs = {k: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), v) for k, v in fields.items()}
        return obs, self._our_mask(mask)

    def _our_mask(self, mask: Any) -> jax.Array:
        space = self.act_space
        if self.actions == "box":
            return jnp.ones((), jnp.bool_)
        if mask is None:
            return (space.valid() if isinstance(space, MultiDiscrete)
                    else jnp.ones(space.n, jnp.bool_))  # type: ignore[union-attr]
        mask = jnp.asarray(mask, jnp.bool_)
        if self.actions == "joint":
            return mask.reshape(-1)
        if self.actions == "multi":  # pad each row to the widest sub-action
            return jnp.pad(mask, ((0, 0), (0, space.width - mask.shape[-1])))  # type: ignore[union-attr]
        return mask

    def observation_space(self, params: JumanjiParams) -> dict[str, Box]:  # type: ignore[override]
        return {str(i): Box(-np.inf, np.inf, shape) for i, shape in enumerate(self.obs_shapes)}

    def action_space(self, params: JumanjiParams) -> Space:
        return self.act_space

    def action_mask(self, state: JumanjiState, params: JumanjiParams) -> jax.Array | None:
        return None if self.actions == "box" else state.mask

    def _inner_action(self, action: jax.Array) -> jax.Array:
        if self.actions == "joint":
            return jnp.stack(jnp.unravel_index(action, self.inner_shape)).astype(jnp.int32)
        if self.actions == "box":
            return action.reshape(self.inner_shape)
        return action

    def reset(self, key: jax.Array, params: JumanjiParams) -> tuple[dict, JumanjiState]:
        inner, ts = self.inner.reset(key)
        obs, mask = self._split(ts.observation)
        return obs, JumanjiState(inner, mask, jnp.int32(0))

    def transition(self, key: jax.Array, state: JumanjiState, action: jax.Array,
                   params: JumanjiParams) -> Transition:
        inner, ts = self.inner.step(state.inner, self._inner_action(action))
        obs, mask = self._split(ts.observation)
        last = ts.last()
        terminated = last & jnp.all(ts.discount == 0)  # multi-agent: a discount per agent
        reward = jnp.sum(jnp.asarray(ts.reward, jnp.float32))  # multi-agent: the team's reward
        return Transition(obs, JumanjiState(inner, mask, state.time + 1), reward, terminated, {},
                          truncated=last & ~terminated)


def _actions(name: str, spec: Any, mask_shape: tuple[int, ...] | None) -> tuple[Space, str, tuple[int, ...]]:
    """(our action space, how it maps to Jumanji's, Jumanji's action or joint-mask shape)."""
    from jumanji import specs

    if isinstance(spec, specs.DiscreteArray):
        return Discrete(int(spec.num_values)), "discrete", ()
    if isinstance(spec, specs.MultiDiscreteArray):
        nvec = tuple(int(v) for v in np.asarray(spec.num_values).reshape(-1))
        if len(nvec) == 1:
            return Discrete(nvec[0]), "joint", nvec
        if mask_shape == nvec:  # one legality per whole action
            if math.prod(nvec) > JOINT_LIMIT:
                raise ValueError(f"jumanji:{name}'s action mask is joint over {' x '.join(map(str, nvec))} = "
                                 f"{math.prod(nvec)} actions, more than the {JOINT_LIMIT} this adapter flattens "
                                 "into one categorical; build it smaller (envs.make keyword arguments)")
            return Discrete(math.prod(nvec)), "joint", nvec
        if mask_shape is None or mask_shape == (len(nvec), max(nvec)):
            return MultiDiscrete(nvec), "multi", nvec
        raise ValueError(f"jumanji:{name}'s action mask has shape {mask_shape}, which is neither the action's "
                         f"shape {nvec} (joint) nor one row per sub-action {(len(nvec), max(nvec))}")
    if isinstance(spec, specs.BoundedArray) and np.issubdtype(np.dtype(spec.dtype), np.integer):
        low, high = np.asarray(spec.minimum), np.broadcast_to(np.asarray(spec.maximum), spec.shape)
        if low.min() != 0 or len(spec.shape) != 1:  # MultiCVRP: one node 0..N per vehicle
            raise ValueError(f"jumanji:{name}'s integer actions must be a vector starting at 0, got "
                             f"{spec.shape} from {low.min()}")
        nvec = high.astype(np.int32) + 1
        if mask_shape is not None and len(mask_shape) == 2 and mask_shape[0] == len(nvec):
            nvec = np.full(len(nvec), mask_shape[1], np.int32)  # the mask's rows say how many choices
        return _actions(name, specs.MultiDiscreteArray(nvec), mask_shape)
    if isinstance(spec, specs.BoundedArray):
        low, high = np.asarray(spec.minimum, np.float32), np.asarray(spec.maximum, np.float32)
        if low.min() != low.max() or high.min() != high.max():
            raise ValueError(f"jumanji:{name}'s action bounds differ per dimension; envs.Box has one low "
                             "and one high")
        shape = tuple(int(d) for d in spec.shape)
        return Box(float(low.min()), float(high.max()), (math.prod(shape),)), "box", shape
    raise ValueError(f"jumanji:{name}'s action spec {type(spec).__name__} is not supported "
                     "(DiscreteArray, MultiDiscreteArray and BoundedArray are)")


def make_jumanji(name: str, **kwargs: Any) -> tuple[Environment, Any]:
    """Jumanji's ``name`` built with ``kwargs`` (e.g. ``num_rows=6``), observation flattened.

    Its spaces are read here, once, outside any trace.
    """
    import jumanji

    known = jumanji.registered_environments()
    if name not in known:
        raise ValueError(f"unknown jumanji env {name!r}; jumanji envs: {', '.join(sorted(known))}")
    if name in REFUSED:
        raise ValueError(f"jumanji:{name} {REFUSED[name]}")
    inner = jumanji.make(name, **kwargs)
    fields = jax.eval_shape(lambda k: _fields(inner.reset(k)[1].observation), jax.random.key(0))
    mask = fields.pop("action_mask", None)
    space, actions, inner_shape = _actions(name, inner.action_spec, None if mask is None else tuple(mask.shape))
    shapes = tuple(tuple(x.shape) for x in jax.tree.leaves(fields))  # nested fields too (BinPack's)
    env = JumanjiEnv(name=f"jumanji:{name}", inner=inner, act_space=space, actions=actions,
                     inner_shape=inner_shape, obs_shapes=shapes)
    flat = FlattenObservation(env=env)
    return flat, flat.default_params
