"""DungeonCrawl-v1: a turn-based dungeon on a small grid where most actions are illegal.

Rules (one turn = the player's action, then the enemies'):
- The board is ``size x size`` (default 6, static). A level holds the player, an exit, some
  wall cells, ``min(level, max_enemies)`` enemies and ``pickups`` ability pickups, all on
  distinct uniformly random cells. Level 1 has one enemy; each exit leads to a harder level.
- The player has health (starts at ``max_health``), energy (starts at ``start_energy``, +1 per
  turn up to ``max_energy``), shield turns left and an inventory of abilities. Walking onto a
  pickup adds its ability to the inventory (reward ``pickup_reward``); abilities are kept
  from level to level and can be used any number of times while energy lasts.
- Actions (15): 0-3 move up/right/down/left; 4 wait; 5-8 ``strike`` up/right/down/left (kills
  the adjacent enemy there); 9-12 ``push`` up/right/down/left (shoves the adjacent enemy there
  one cell further; an enemy pushed into a wall, another enemy or off the board dies);
  13 ``teleport`` (to a uniformly random free cell); 14 ``shield`` (blocks damage during the
  next ``shield_turns`` enemy turns). Kills give ``kill_reward``.
- Legal: a move onto a free cell, pickup or the exit (not a wall, an enemy or off the board);
  waiting, always (so some action is always legal); an ability that is owned, affordable
  (energy >= its cost, ``ABILITY_COST``) and has a target (an enemy in that direction for
  strike and push; a free cell for teleport; no shield already up for shield).
  :meth:`DungeonCrawl.action_mask` gives these; an illegal action sent anyway is a no-op
  costing ``illegal_reward``, and the enemies still move.
- Enemies then act in order: one next to the player hits it (1 damage unless shielded), any
  other steps one cell towards the player (along the longer axis first, then the other) when
  that cell is free.
- Reaching the exit gives ``exit_reward`` and starts the next level (player's health, energy
  and inventory kept). Health 0 terminates with ``death_reward``; finishing level
  ``max_levels`` terminates as a win. Every turn costs ``step_reward``; ``max_steps`` truncates.

The observation is a struct: ``player [4]`` (health, energy, shield, level, each scaled to
[0, 1]), ``inventory [4]`` (owned abilities) and ``grid [size, size, 8]`` (wall, player, enemy,
exit, one pickup channel per ability). ``envs.make("DungeonCrawl-v1")`` wraps it in
:class:`envs.wrappers.FlattenObservation` for MLP policies.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import MOVES, Box, Discrete, Environment, Transition

ABILITIES = ("strike", "push", "teleport", "shield")
STRIKE, PUSH, TELEPORT, SHIELD = range(4)
ABILITY_COST = jnp.array([2, 1, 3, 2], jnp.int32)
NUM_ACTIONS = 15
WAIT = 4
ACTION_ABILITY = jnp.array([-1] * 5 + [STRIKE] * 4 + [PUSH] * 4 + [TELEPORT, SHIELD], jnp.int32)
ACTION_DIR = jnp.array([0, 1, 2, 3, 0, 0, 1, 2, 3, 0, 1, 2, 3, 0, 0], jnp.int32)  # index into MOVES
MAX_ENEMIES = 3  # array slots; ``max_enemies`` <= this


@struct.dataclass
class DungeonState:
    walls: jax.Array  # [size, size] bool
    pickups: jax.Array  # [size, size] int32: ability index + 1, 0 = none
    exit: jax.Array  # [2] int32
    player: jax.Array  # [2] int32
    enemies: jax.Array  # [MAX_ENEMIES, 2] int32
    alive: jax.Array  # [MAX_ENEMIES] bool
    health: jax.Array  # [] int32
    energy: jax.Array  # [] int32
    shield: jax.Array  # [] int32 turns left
    inventory: jax.Array  # [4] bool
    level: jax.Array  # [] int32, from 1
    time: jax.Array  # [] int32


@struct.dataclass
class DungeonParams:
    exit_reward: float = 1.0
    kill_reward: float = 0.2
    pickup_reward: float = 0.1
    death_reward: float = -1.0
    illegal_reward: float = -0.1
    step_reward: float = -0.01
    max_health: int = 3
    start_energy: int = 3
    max_energy: int = 6
    shield_turns: int = 3
    size: int = struct.field(pytree_node=False, default=6)
    num_walls: int = struct.field(pytree_node=False, default=4)
    pickups: int = struct.field(pytree_node=False, default=2)
    max_enemies: int = struct.field(pytree_node=False, default=3)
    max_levels: int = struct.field(pytree_node=False, default=5)
    max_steps: int = struct.field(pytree_node=False, default=200)


def _inside(rc: jax.Array, size: int) -> jax.Array:
    return jnp.all((rc >= 0) & (rc < size), axis=-1)


def _enemy_grid(state: DungeonState, size: int) -> jax.Array:
    """``[size, size]`` bool: cells holding a live enemy."""
    grid = jnp.zeros((size, size), jnp.bool_)
    return grid.at[state.enemies[:, 0], state.enemies[:, 1]].max(state.alive)


def _at(grid: jax.Array, rc: jax.Array) -> jax.Array:
    """``grid[rc]`` for in-board ``rc`` and ``True`` (blocked) off the board."""
    size = grid.shape[0]
    inside = _inside(rc, size)
    safe = jnp.clip(rc, 0, size - 1)
    return jnp.where(inside, grid[safe[..., 0], safe[..., 1]], True)


def _enemy_index(state: DungeonState, rc: jax.Array) -> jax.Array:
    """``[MAX_ENEMIES]`` one-hot of the live enemy at ``rc`` (all False when none)."""
    return state.alive & jnp.all(state.enemies == rc, axis=-1)


def _free_cells(state: DungeonState, size: int) -> jax.Array:
    """``[size, size]``: cells a player could stand on (no wall, enemy or player)."""
    rows, cols = jnp.arange(size)[:, None], jnp.arange(size)[None, :]
    player = (rows == state.player[0]) & (cols == state.player[1])
    return ~state.walls & ~_enemy_grid(state, size) & ~player


def _new_level(key: jax.Array, state: DungeonState, level: jax.Array, params: DungeonParams) -> DungeonState:
    """Lays out level ``level`` on fresh random cells, keeping the player's stats."""
    n = params.size
    cells = jax.random.permutation(key, n * n)
    rc = jnp.stack(jnp.divmod(cells, n), axis=-1).astype(jnp.int32)  # [n*n, 2]
    e0 = 2
    p0 = e0 + MAX_ENEMIES
    w0 = p0 + params.pickups
    walls = jnp.zeros((n, n), jnp.bool_).at[rc[w0:w0 + params.num_walls, 0],
                                            rc[w0:w0 + params.num_walls, 1]].set(True)
    kinds = jax.random.randint(jax.random.fold_in(key, 1), (params.pickups,), 0, len(ABILITIES))
    pickups = jnp.zeros((n, n), jnp.int32).at[rc[p0:w0, 0], rc[p0:w0, 1]].set(kinds + 1)
    alive = jnp.arange(MAX_ENEMIES) < jnp.minimum(level, params.max_enemies)
    return state.replace(walls=walls, pickups=pickups, exit=rc[1], player=rc[0],
                         enemies=rc[e0:p0], alive=alive, level=level)


def legal_actions(state: DungeonState, params: DungeonParams) -> jax.Array:
    """``[15]`` bool: which actions are legal in ``state`` (see the module docstring)."""
    n = params.size
    targets = state.player + MOVES  # [4, 2]
    enemies = _enemy_grid(state, n)
    blocked = _at(state.walls | enemies, targets)
    enemy_next = _at(enemies, targets) & _inside(targets, n)
    usable = state.inventory & (state.energy >= ABILITY_COST)
    return jnp.concatenate([
        ~blocked,
        jnp.ones(1, jnp.bool_),
        usable[STRIKE] & enemy_next,
        usable[PUSH] & enemy_next,
        jnp.stack([usable[TELEPORT] & jnp.any(_free_cells(state, n)),
                   usable[SHIELD] & (state.shield == 0)]),
    ])


def _player_turn(key: jax.Array, state: DungeonState, action: jax.Array, params: DungeonParams
                 ) -> tuple[DungeonState, jax.Array]:
    """Applies a legal ``action``; returns the new state and the number of kills."""
    n = params.size
    d = MOVES[ACTION_DIR[action]]
    target = state.player + d
    ability = ACTION_ABILITY[action]
    # move
    moved = jnp.where(action < 4, target, state.player)
    # strike: kill the enemy at target
    hit = _enemy_index(state, target) & (ability == STRIKE)
    # push: the enemy at target goes one further, or dies when that cell is blocked
    beyond = target + d
    blocked = _at(state.walls | _enemy_grid(state, n), beyond)
    shoved = _enemy_index(state, target) & (ability == PUSH)
    crushed = shoved & blocked
    enemies = jnp.where((shoved & ~blocked)[:, None], beyond, state.enemies)
    # teleport: a uniformly random free cell
    free = _free_cells(state, n).ravel()
    idx = jax.random.categorical(key, jnp.where(free, 0.0, -jnp.inf))
    jump = jnp.stack(jnp.divmod(idx, n)).astype(jnp.int32)
    player = jnp.where(ability == TELEPORT, jump, moved)
    killed = hit | crushed
    cost = jnp.where(ability >= 0, ABILITY_COST[jnp.maximum(ability, 0)], 0)
    shield = jnp.where(ability == SHIELD, params.shield_turns, state.shield)
    state = state.replace(player=player, enemies=enemies, alive=state.alive & ~killed,
                          energy=state.energy - cost, shield=shield)
    return state, jnp.sum(killed)


def _enemy_turn(state: DungeonState, params: DungeonParams) -> tuple[DungeonState, jax.Array]:
    """Enemies hit (if adjacent) or step towards the player, one after another; returns damage."""
    n = params.size

    def one(i: int, carry: tuple) -> tuple:
        st, damage = carry
        pos = st.enemies[i]
        delta = st.player - pos
        adjacent = jnp.sum(jnp.abs(delta)) == 1
        step_long = jnp.where(jnp.abs(delta[0]) >= jnp.abs(delta[1]),
                              jnp.array([1, 0]), jnp.array([0, 1])) * jnp.sign(delta)
        step_short = jnp.sign(delta) - step_long
        occupied = st.walls | _enemy_grid(st, n)
        occupied = occupied.at[st.player[0], st.player[1]].set(True)
        first_ok = ~_at(occupied, pos + step_long) & jnp.any(step_long != 0)
        second_ok = ~_at(occupied, pos + step_short) & jnp.any(step_short != 0)
        new = jnp.where(first_ok, pos + step_long, jnp.where(second_ok, pos + step_short, pos))
        acts = st.alive[i]
        new = jnp.where(acts & ~adjacent, new, pos)
        hits = acts & adjacent
        return st.replace(enemies=st.enemies.at[i].set(new)), damage + hits.astype(jnp.int32)

    state, hits = jax.lax.fori_loop(0, MAX_ENEMIES, one, (state, jnp.int32(0)))
    damage = jnp.where(state.shield > 0, 0, hits)
    return state, damage


def observe(state: DungeonState, params: DungeonParams) -> dict[str, jax.Array]:
    """The structured observation (see the module docstring)."""
    n = params.size
    rows, cols = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
    at = lambda rc: (rows == rc[0]) & (cols == rc[1])  # noqa: E731
    pickup = state.pickups[..., None] == jnp.arange(1, len(ABILITIES) + 1)
    grid = jnp.concatenate([
        jnp.stack([state.walls, at(state.player), _enemy_grid(state, n), at(state.exit)], -1),
        pickup], -1).astype(jnp.float32)
    player = jnp.stack([state.health / params.max_health, state.energy / params.max_energy,
                        state.shield / params.shield_turns, state.level / params.max_levels])
    return {"player": player.astype(jnp.float32), "inventory": state.inventory.astype(jnp.float32),
            "grid": grid}


@dataclasses.dataclass(frozen=True)
class DungeonCrawl(Environment[DungeonState, DungeonParams]):
    """The structured-observation dungeon; see the module docstring for the rules."""

    name: str = "DungeonCrawl-v1"

    @property
    def default_params(self) -> DungeonParams:
        return DungeonParams()

    def observation_space(self, params: DungeonParams) -> dict[str, Box]:  # type: ignore[override]
        return {"player": Box(0.0, 1.0, (4,)), "inventory": Box(0.0, 1.0, (len(ABILITIES),)),
                "grid": Box(0.0, 1.0, (params.size, params.size, 4 + len(ABILITIES)))}

    def action_space(self, params: DungeonParams) -> Discrete:
        return Discrete(NUM_ACTIONS)

    def observe(self, state: DungeonState, params: DungeonParams) -> dict[str, jax.Array]:
        return observe(state, params)

    def action_mask(self, state: DungeonState, params: DungeonParams) -> jax.Array:
        return legal_actions(state, params)

    def reset(self, key: jax.Array, params: DungeonParams) -> tuple[dict, DungeonState]:
        n = params.size
        blank = DungeonState(
            walls=jnp.zeros((n, n), jnp.bool_), pickups=jnp.zeros((n, n), jnp.int32),
            exit=jnp.zeros(2, jnp.int32), player=jnp.zeros(2, jnp.int32),
            enemies=jnp.zeros((MAX_ENEMIES, 2), jnp.int32), alive=jnp.zeros(MAX_ENEMIES, jnp.bool_),
            health=jnp.int32(params.max_health), energy=jnp.int32(params.start_energy),
            shield=jnp.int32(0), inventory=jnp.zeros(len(ABILITIES), jnp.bool_),
            level=jnp.int32(1), time=jnp.int32(0))
        state = _new_level(key, blank, jnp.int32(1), params)
        return observe(state, params), state

    def transition(
        self, key: jax.Array, state: DungeonState, action: jax.Array, params: DungeonParams
    ) -> Transition:
        k_turn, k_level = jax.random.split(key)
        action = jnp.asarray(action, jnp.int32)
        legal = legal_actions(state, params)[action]
        played, kills = _player_turn(k_turn, state, action, params)
        st = jax.tree.map(lambda a, b: jnp.where(legal, a, b), played, state)
        kills = jnp.where(legal, kills, 0)
        # pickups
        kind = st.pickups[st.player[0], st.player[1]]
        picked = kind > 0
        st = st.replace(
            inventory=st.inventory | (picked & (jnp.arange(len(ABILITIES)) == kind - 1)),
            pickups=st.pickups.at[st.player[0], st.player[1]].set(0))
        exited = jnp.all(st.player == st.exit)
        # enemies act unless the player left the level
        after, damage = _enemy_turn(st, params)
        damage = jnp.where(exited, 0, damage)
        st = jax.tree.map(lambda a, b: jnp.where(exited, a, b), st, after)
        health = st.health - damage
        won = exited & (st.level >= params.max_levels)
        next_level = _new_level(k_level, st, st.level + 1, params)
        st = jax.tree.map(lambda a, b: jnp.where(exited & ~won, a, b), next_level, st)
        dead = health <= 0
        st = st.replace(health=jnp.maximum(health, 0),
                        energy=jnp.minimum(st.energy + 1, params.max_energy),
                        shield=jnp.maximum(st.shield - 1, 0), time=state.time + 1)
        reward = (params.step_reward + jnp.where(legal, 0.0, params.illegal_reward)
                  + kills * params.kill_reward + jnp.where(picked, params.pickup_reward, 0.0)
                  + jnp.where(exited, params.exit_reward, 0.0)
                  + jnp.where(dead, params.death_reward, 0.0))
        info = {"illegal": (~legal).astype(jnp.float32), "levels": exited.astype(jnp.float32),
                "kills": kills.astype(jnp.float32)}
        return Transition(observe(st, params), st, reward, dead | won, info)
