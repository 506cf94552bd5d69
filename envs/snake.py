"""Snake-v1: eat apples on a square board without hitting a wall or yourself.

Rules:
- The board is ``size x size`` (default 10, static). The snake starts with length 3 in a
  straight line at a uniformly random place and heading; one apple lies on a uniformly chosen
  free cell.
- Actions: 0 up, 1 right, 2 down, 3 left. Reversing onto the neck is illegal (masked by
  :meth:`Snake.action_mask`); if sent anyway the snake keeps its heading.
- Each step the head moves one cell. Entering the apple's cell grows the snake by one (the tail
  stays) and places a new apple on a free cell; otherwise the tail leaves its cell, so moving
  into the cell the tail is leaving is legal.
- The episode terminates when the head leaves the board or enters its own body (reward
  ``death_reward``), or when the snake fills the board (a win; the last apple's
  ``eat_reward``). It is truncated after ``max_steps`` steps or after ``starve_steps`` steps
  without eating. Every step also gives ``step_reward``.

State: ``body[r, c]`` is 0 on free cells and, on the snake, how many more steps the segment
stays (tail 1 ... head ``length``), so a step without eating is ``max(body - 1, 0)`` plus the new
head. Observation ``[size, size, 5]`` per cell: empty, body (head included), head, apple, and order
along the body (``body / length``: 1 at the head, falling to ``1 / length`` at the tail, so the
policy sees where the tail goes). Flattened it suits an MLP; as ``size*size`` cells of 5
features it suits a transformer.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import Box, Discrete, Environment, Transition

FEATURES = ("empty", "body", "head", "apple", "order")


@struct.dataclass
class SnakeState:
    body: jax.Array  # [size, size] int32: steps each segment stays; 0 = free
    head: jax.Array  # [2] int32 (row, col)
    heading: jax.Array  # [] int32 action of the last move
    length: jax.Array  # [] int32
    apple: jax.Array  # [2] int32 (row, col); (-1, -1) once the board is full
    hunger: jax.Array  # [] int32 steps since the last apple
    time: jax.Array  # [] int32


@struct.dataclass
class SnakeParams:
    eat_reward: float = 1.0
    death_reward: float = -1.0
    step_reward: float = 0.0
    starve_steps: int = 100  # truncate after this many steps without eating
    size: int = struct.field(pytree_node=False, default=10)
    max_steps: int = struct.field(pytree_node=False, default=1000)


# Boards are read and written through one-hot cell masks rather than gathers and scatters:
# under vmap on CPU the elementwise form is faster on these small grids.


def _at(size: int, rc: jax.Array) -> jax.Array:
    """``[size, size]`` bool, True only at cell ``rc``."""
    rows, cols = jnp.arange(size)[:, None], jnp.arange(size)[None, :]
    return (rows == rc[0]) & (cols == rc[1])


def random_cell(u: jax.Array, allowed: jax.Array) -> jax.Array:
    """A uniformly chosen cell ``[2]`` among ``allowed [H, W]`` (cell 0 when none is).

    ``u`` is one uniform draw in [0, 1): it picks the k-th allowed cell, so the cost of
    randomness does not grow with the board.
    """
    # Row first, then column: XLA's CPU cumsum costs the square of its length (two of length size,
    # not one of size^2), and masked sums because per-env gathers are slow under vmap.
    rows = jnp.arange(allowed.shape[0])
    per_row = jnp.sum(allowed, axis=1, dtype=jnp.int32)
    k = jnp.floor(u * jnp.sum(per_row)).astype(jnp.int32)
    row = jnp.argmax(jnp.cumsum(per_row) > k)
    k_in_row = k - jnp.sum(jnp.where(rows < row, per_row, 0))
    in_row = jnp.sum(jnp.where((rows == row)[:, None], allowed, False), axis=0, dtype=jnp.int32)
    col = jnp.argmax(jnp.cumsum(in_row) > k_in_row)
    return jnp.stack([row, col]).astype(jnp.int32)


def _move(action: jax.Array) -> jax.Array:
    """``envs.core.MOVES[action]`` as arithmetic (a gather per env is slow under vmap on CPU)."""
    a = jnp.asarray(action, jnp.int32)
    return jnp.stack([(a == 2).astype(jnp.int32) - (a == 0), (a == 1).astype(jnp.int32) - (a == 3)])


def observe(state: SnakeState) -> jax.Array:
    """The ``[size, size, 5]`` float32 feature grid (see :data:`FEATURES`)."""
    body = state.body
    size = body.shape[0]
    head, apple = _at(size, state.head), _at(size, state.apple)
    on = body > 0
    feats = [~on & ~apple, on, head, apple,
             body.astype(jnp.float32) / state.length.astype(jnp.float32)]
    return jnp.stack([f.astype(jnp.float32) for f in feats], axis=-1)


@dataclasses.dataclass(frozen=True)
class Snake(Environment[SnakeState, SnakeParams]):
    """Classic Snake with reverse moves masked. See the module docstring for the rules."""

    name: str = "Snake-v1"

    @property
    def default_params(self) -> SnakeParams:
        return SnakeParams()

    def observation_space(self, params: SnakeParams) -> Box:
        return Box(0.0, 1.0, (params.size, params.size, len(FEATURES)))

    def action_space(self, params: SnakeParams) -> Discrete:
        return Discrete(4)

    def observe(self, state: SnakeState, params: SnakeParams) -> jax.Array:
        return observe(state)

    def action_mask(self, state: SnakeState, params: SnakeParams) -> jax.Array:
        return jnp.arange(4) != (state.heading + 2) % 4

    def reset(self, key: jax.Array, params: SnakeParams) -> tuple[jax.Array, SnakeState]:
        u = jax.random.uniform(key, (4,))  # heading, head row, head col, apple cell
        n = params.size
        heading = jnp.minimum(jnp.floor(u[0] * 4), 3).astype(jnp.int32)
        back = -_move(heading)
        # the head is uniform over the cells whose two trailing segments fit on the board:
        # along the body's axis the head keeps 2 cells from the edge behind it
        span = n - 2 * jnp.abs(back)  # [2] choices per axis
        offset = jnp.where(back < 0, 2, 0)
        head = (jnp.floor(u[1:3] * span).astype(jnp.int32) + offset).astype(jnp.int32)
        rows, cols = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
        along = (rows - head[0]) * back[0] + (cols - head[1]) * back[1]  # cells behind the head
        on_line = (rows - head[0]) * back[1] == (cols - head[1]) * back[0]
        body = jnp.where(on_line & (along >= 0) & (along < 3), 3 - along, 0).astype(jnp.int32)
        state = SnakeState(body, head, heading, jnp.int32(3), random_cell(u[3], body == 0),
                           jnp.int32(0), jnp.int32(0))
        return observe(state), state

    def transition(
        self, key: jax.Array, state: SnakeState, action: jax.Array, params: SnakeParams
    ) -> Transition:
        n = params.size
        action = jnp.asarray(action, jnp.int32)
        heading = jnp.where(action == (state.heading + 2) % 4, state.heading, action)
        head = state.head + _move(heading)
        inside = jnp.all((head >= 0) & (head < n))
        head = jnp.clip(head, 0, n - 1)  # only read while dead
        eats = inside & jnp.all(head == state.apple)
        body = jnp.where(eats, state.body, jnp.maximum(state.body - 1, 0))
        head_cell = _at(n, head)
        hits_self = jnp.any(head_cell & (body > 0))
        dead = ~inside | hits_self
        length = state.length + eats.astype(jnp.int32)
        body = jnp.where(head_cell & ~dead, length, body)
        won = length >= n * n
        apple = jnp.where(eats, random_cell(jax.random.uniform(key), body == 0), state.apple)
        apple = jnp.where(won, -1, apple)  # no free cell left: no apple
        hunger = jnp.where(eats, 0, state.hunger + 1)
        new = SnakeState(body, jnp.where(dead, state.head, head), heading, length, apple, hunger,
                         state.time + 1)
        reward = (params.step_reward + jnp.where(eats, params.eat_reward, 0.0)
                  + jnp.where(dead, params.death_reward, 0.0))
        return Transition(observe(new), new, reward, dead | won,
                          {"apples": eats.astype(jnp.float32), "won": won},
                          truncated=hunger >= params.starve_steps)
