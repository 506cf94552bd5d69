"""Snake-v1 and DungeonCrawl-v1 rules on hand-made boards, and their masks on random play."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs import dungeon
from envs.snake import FEATURES, SnakeState, observe

UP, RIGHT, DOWN, LEFT = range(4)


def snake_state(cells, apple, size=6, heading=None, hunger=0):
    """A state whose body runs head first through ``cells`` [(row, col), ...]."""
    body = np.zeros((size, size), np.int32)
    n = len(cells)
    for i, (r, c) in enumerate(cells):
        body[r, c] = n - i
    if heading is None:  # from the neck to the head
        dr, dc = np.subtract(cells[0], cells[1])
        heading = {(-1, 0): UP, (0, 1): RIGHT, (1, 0): DOWN, (0, -1): LEFT}[(int(dr), int(dc))]
    return SnakeState(jnp.asarray(body), jnp.asarray(cells[0], jnp.int32), jnp.int32(heading),
                      jnp.int32(n), jnp.asarray(apple, jnp.int32), jnp.int32(hunger), jnp.int32(0))


def snake_step(state, action, size=6, **params):
    env, p = envs.make("Snake-v1", size=size, **params)
    return env.step(jax.random.key(0), state, jnp.int32(action), p), p


def cells_of(state):
    body = np.asarray(state.body)
    order = sorted(zip(*np.nonzero(body)), key=lambda rc: -body[rc])
    return [tuple(int(v) for v in rc) for rc in order]


def test_snake__eating_grows_body_and_moves_apple_to_a_free_cell():
    state = snake_state([(2, 2), (2, 1), (2, 0)], apple=(2, 3))
    s, p = snake_step(state, RIGHT)
    assert float(s.reward) == p.eat_reward and float(s.info["apples"]) == 1.0
    assert not bool(s.done)
    assert cells_of(s.state) == [(2, 3), (2, 2), (2, 1), (2, 0)], "the tail stays when eating"
    assert int(s.state.length) == 4 and int(s.state.hunger) == 0
    assert int(np.asarray(s.state.body)[tuple(np.asarray(s.state.apple))]) == 0


def test_snake__moving_without_eating_keeps_length_and_drops_tail():
    state = snake_state([(2, 2), (2, 1), (2, 0)], apple=(5, 5))
    s, p = snake_step(state, DOWN)
    assert cells_of(s.state) == [(3, 2), (2, 2), (2, 1)]
    assert float(s.reward) == p.step_reward and int(s.state.hunger) == 1


def test_snake__head_may_enter_the_cell_the_tail_leaves():
    # a 2x2 loop: head (0,0), then (1,0), (1,1), tail (0,1); moving right enters the tail's cell
    state = snake_state([(0, 0), (1, 0), (1, 1), (0, 1)], apple=(5, 5))
    s, _ = snake_step(state, RIGHT)
    assert not bool(s.done)
    assert cells_of(s.state) == [(0, 1), (0, 0), (1, 0), (1, 1)]


def test_snake__hitting_own_body_terminates_with_death_reward():
    # head (1,1) moving up into (0,1), which is body that does not leave this step
    state = snake_state([(1, 1), (1, 2), (0, 2), (0, 1), (0, 0)], apple=(5, 5), heading=LEFT)
    s, p = snake_step(state, UP)
    assert bool(s.terminated) and float(s.reward) == p.death_reward + p.step_reward


@pytest.mark.parametrize("cells,action", [([(0, 2), (1, 2), (2, 2)], UP),
                                          ([(3, 5), (3, 4), (3, 3)], RIGHT),
                                          ([(5, 0), (4, 0), (3, 0)], DOWN),
                                          ([(2, 0), (2, 1), (2, 2)], LEFT)])
def test_snake__leaving_the_board_terminates(cells, action):
    s, p = snake_step(snake_state(cells, apple=(4, 4)), action)
    assert bool(s.terminated) and float(s.reward) == p.death_reward + p.step_reward


def test_snake__reverse_is_masked_and_ignored_if_sent():
    env, p = envs.make("Snake-v1", size=6)
    state = snake_state([(2, 2), (2, 1), (2, 0)], apple=(5, 5))  # heading right
    np.testing.assert_array_equal(env.action_mask(state, p), [True, True, True, False])
    s, _ = snake_step(state, LEFT)
    assert cells_of(s.state) == [(2, 3), (2, 2), (2, 1)], "keeps going right"


def test_snake__filling_the_board_is_a_win():
    # 2x2 board: a snake of 3 and the apple on the last free cell
    state = snake_state([(0, 1), (0, 0), (1, 0)], apple=(1, 1), size=2)
    s, p = snake_step(state, DOWN, size=2)
    assert bool(s.terminated) and bool(s.info["won"])
    assert float(s.reward) == p.eat_reward + p.step_reward
    assert (np.asarray(s.final_obs)[..., FEATURES.index("apple")] == 0).all()


def test_snake__starving_truncates():
    state = snake_state([(2, 2), (2, 1), (2, 0)], apple=(5, 5), hunger=9)
    s, _ = snake_step(state, DOWN, starve_steps=10)
    assert bool(s.truncated) and not bool(s.terminated)


def test_snake__observation_shows_head_tail_apple_and_order():
    state = snake_state([(2, 2), (2, 1), (2, 0)], apple=(4, 4))
    obs = np.asarray(observe(state))
    f = {name: obs[..., i] for i, name in enumerate(FEATURES)}
    assert f["head"][2, 2] == 1 and f["head"].sum() == 1
    assert f["apple"][4, 4] == 1 and f["body"].sum() == 3
    np.testing.assert_allclose([f["order"][2, c] for c in range(3)], [1 / 3, 2 / 3, 1.0])
    np.testing.assert_array_equal(f["empty"], 1 - f["body"] - f["apple"])


def test_snake__random_play_never_puts_apple_on_body_and_starts_length_three():
    env, p = envs.make("Snake-v1", size=5)

    def body(state, k):
        k_a, k_s = jax.random.split(k)
        legal = env.action_mask(state, p)
        a = jax.random.categorical(k_a, jnp.where(legal, 0.0, -jnp.inf))
        s = env.step(k_s, state, a, p)
        apple_on_body = s.state.body[s.state.apple[0], s.state.apple[1]] > 0
        return s.state, (apple_on_body, s.info["apples"], s.done,
                         jnp.where(s.done, s.state.length, 3), jnp.sum(s.state.body > 0))

    _, state = env.reset(jax.random.key(0), p)
    on_body, apples, done, start_len, cells = jax.jit(
        lambda k: jax.lax.scan(body, state, jax.random.split(k, 20_000))[1])(jax.random.key(1))
    assert apples.sum() > 100 and done.sum() > 100
    assert not bool(on_body.any())
    assert bool((start_len == 3).all())
    assert int(cells.min()) >= 3


# ---- DungeonCrawl ------------------------------------------------------------------------

def dungeon_state(player, enemies=(), walls=(), exit=(5, 5), inventory=(), energy=3, size=6,
                  health=3, level=1, pickups=()):
    walls_a = np.zeros((size, size), bool)
    for r, c in walls:
        walls_a[r, c] = True
    pick = np.zeros((size, size), np.int32)
    for (r, c), kind in pickups:
        pick[r, c] = dungeon.ABILITIES.index(kind) + 1
    pos = np.zeros((dungeon.MAX_ENEMIES, 2), np.int32)
    alive = np.zeros(dungeon.MAX_ENEMIES, bool)
    for i, rc in enumerate(enemies):
        pos[i], alive[i] = rc, True
    inv = np.array([a in inventory for a in dungeon.ABILITIES])
    return dungeon.DungeonState(
        jnp.asarray(walls_a), jnp.asarray(pick), jnp.asarray(exit, jnp.int32),
        jnp.asarray(player, jnp.int32), jnp.asarray(pos), jnp.asarray(alive), jnp.int32(health),
        jnp.int32(energy), jnp.int32(0), jnp.asarray(inv), jnp.int32(level), jnp.int32(0))


def dungeon_step(state, action):
    env, p = envs.make("DungeonCrawl-v1")
    return env.step(jax.random.key(0), state, jnp.int32(action), p), p


def legal(state):
    return set(np.nonzero(np.asarray(dungeon.legal_actions(state, dungeon.DungeonParams())))[0].tolist())


def test_dungeon__moves_blocked_by_walls_enemies_and_edges():
    state = dungeon_state(player=(0, 0), enemies=[(3, 3)], walls=[(1, 0)])
    assert legal(state) == {RIGHT, dungeon.WAIT}
    state = dungeon_state(player=(2, 2), enemies=[(2, 3)])
    assert legal(state) == {UP, DOWN, LEFT, dungeon.WAIT}, "no abilities owned"


def test_dungeon__abilities_need_owning_energy_and_a_target():
    strike_right, push_right = 5 + RIGHT, 9 + RIGHT
    state = dungeon_state(player=(2, 2), enemies=[(2, 3)], inventory=("strike", "push"), energy=2)
    assert {strike_right, push_right} <= legal(state)
    assert not {5 + UP, 9 + UP} & legal(state), "no enemy up there"
    assert strike_right not in legal(dungeon_state(player=(2, 2), enemies=[(2, 3)],
                                                   inventory=("strike",), energy=1))
    full = dungeon_state(player=(2, 2), inventory=dungeon.ABILITIES, energy=6)
    assert legal(full) == {UP, RIGHT, DOWN, LEFT, dungeon.WAIT, 13, 14}


def test_dungeon__strike_kills_and_push_into_wall_crushes():
    s, p = dungeon_step(dungeon_state(player=(2, 2), enemies=[(2, 3)], inventory=("strike",)), 5 + RIGHT)
    assert not bool(s.state.alive[0]) and float(s.info["kills"]) == 1
    assert int(s.state.energy) == 3 - 2 + 1
    np.testing.assert_allclose(s.reward, p.kill_reward + p.step_reward)
    s, _ = dungeon_step(dungeon_state(player=(2, 2), enemies=[(2, 3)], walls=[(2, 4)],
                                      inventory=("push",)), 9 + RIGHT)
    assert not bool(s.state.alive[0])
    s, _ = dungeon_step(dungeon_state(player=(2, 2), enemies=[(2, 3)], inventory=("push",)), 9 + RIGHT)
    assert bool(s.state.alive[0]), "pushed to (2,4) then steps back towards the player"
    np.testing.assert_array_equal(s.state.enemies[0], [2, 3])


def test_dungeon__illegal_action_is_a_penalised_no_op_and_enemies_still_act():
    state = dungeon_state(player=(2, 2), enemies=[(2, 3)])
    s, p = dungeon_step(state, 5 + RIGHT)  # strike not owned
    assert float(s.info["illegal"]) == 1
    np.testing.assert_array_equal(s.state.player, [2, 2])
    assert int(s.state.health) == 2, "the adjacent enemy hit"
    np.testing.assert_allclose(s.reward, p.illegal_reward + p.step_reward)


def test_dungeon__enemy_steps_towards_player_and_shield_blocks_hits():
    s, _ = dungeon_step(dungeon_state(player=(0, 0), enemies=[(3, 1)]), dungeon.WAIT)
    np.testing.assert_array_equal(s.state.enemies[0], [2, 1])
    state = dungeon_state(player=(2, 2), enemies=[(2, 3)], inventory=("shield",))
    s, _ = dungeon_step(state, 14)
    assert int(s.state.health) == 3 and int(s.state.shield) == 2


def test_dungeon__pickup_then_exit_starts_a_harder_level():
    state = dungeon_state(player=(0, 0), pickups=[((0, 1), "teleport")], exit=(0, 2))
    s, p = dungeon_step(state, RIGHT)
    assert bool(s.state.inventory[dungeon.TELEPORT])
    np.testing.assert_allclose(s.reward, p.pickup_reward + p.step_reward)
    s, p = dungeon_step(s.state, RIGHT)
    assert int(s.state.level) == 2 and int(s.state.alive.sum()) == 2
    assert bool(s.state.inventory[dungeon.TELEPORT]), "inventory kept across levels"
    np.testing.assert_allclose(s.reward, p.exit_reward + p.step_reward)


def test_dungeon__last_level_exit_wins_and_zero_health_dies():
    s, p = dungeon_step(dungeon_state(player=(5, 4), exit=(5, 5), level=5), RIGHT)
    assert bool(s.terminated) and float(s.info["levels"]) == 1
    s, p = dungeon_step(dungeon_state(player=(2, 2), enemies=[(2, 3)], health=1), dungeon.WAIT)
    assert bool(s.terminated)
    np.testing.assert_allclose(s.reward, p.death_reward + p.step_reward)


def test_dungeon__most_actions_illegal_and_masked_play_never_illegal():
    env, p = envs.make("DungeonCrawl-v1")

    def body(state, k):
        k_a, k_s = jax.random.split(k)
        mask = env.action_mask(state, p)
        a = jax.random.categorical(k_a, jnp.where(mask, 0.0, -jnp.inf))
        s = env.step(k_s, state, a, p)
        return s.state, (mask.sum(), s.info["illegal"], s.info["levels"])

    _, state = env.reset(jax.random.key(0), p)
    n_legal, illegal, levels = jax.jit(
        lambda k: jax.lax.scan(body, state, jax.random.split(k, 5000))[1])(jax.random.key(2))
    assert float(n_legal.mean()) < dungeon.NUM_ACTIONS / 2
    assert float(illegal.sum()) == 0 and float(levels.sum()) > 10


@pytest.mark.xla_optimized  # 4000 episodes: slow compiled unoptimised
@pytest.mark.parametrize("name", ["dungeon_ppo", "snake_ppo"])
def test_grid_study__reference_is_random_masked_plays_return(name):
    """The grid studies' reference return (tuned vs default is also stated above it) is random
    masked play's mean episode return under the study's own evaluation."""
    import studies
    from algos.common import evaluate_policy

    study = studies.get(name)
    env, p = envs.make(study.env)
    act = lambda obs, mask, k: jax.random.categorical(k, jnp.where(mask, 0.0, -jnp.inf))  # noqa: E731
    r = np.asarray(jax.jit(lambda k: evaluate_policy(env, p, act, k, 4000))(jax.random.key(7)).returns)
    assert np.isclose(r.mean(), study.reference, atol=4 * r.std() / np.sqrt(r.size) + 0.005)


def test_snake__random_cell_is_uniform_over_allowed_cells():
    from envs.snake import random_cell

    rng = np.random.default_rng(0)
    allowed = rng.random((7, 7)) < 0.4
    n = int(allowed.sum())
    us = (np.arange(n * 50) + 0.5) / (n * 50)  # an even grid of uniform draws
    cells = np.asarray(jax.jit(jax.vmap(lambda u: random_cell(u, jnp.asarray(allowed))))(jnp.asarray(us)))
    counts = np.zeros((7, 7), int)
    np.add.at(counts, (cells[:, 0], cells[:, 1]), 1)
    np.testing.assert_array_equal(counts, np.where(allowed, 50, 0))


def test_snake__moves_by_arithmetic_match_the_shared_move_table():
    from envs.core import MOVES
    from envs.snake import _move

    for a in range(4):
        np.testing.assert_array_equal(_move(jnp.int32(a)), MOVES[a])
