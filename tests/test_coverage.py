"""Others' environments: a representative subset of the gymnax, Jumanji and Brax registries through
the kernel a trial uses (the full sweep is ``bench/env_coverage.py``), the ones refused and why, and
multi-discrete actions."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import envs
from algos import ppo
from envs import Box, Environment, MultiDiscrete, Transition
from harness.coverage import probe

pytest.importorskip("gymnax")
pytest.importorskip("jumanji")

# one env of each gymnax family, each kind of Jumanji action space, two Brax envs
SUBSET = {
    "gymnax:Acrobot-v1": "classic control",
    "gymnax:MountainCarContinuous-v0": "classic control, continuous actions (PPO and SAC)",
    "gymnax:Breakout-MinAtar": "MinAtar (a grid of bools)",
    "gymnax:Catch-bsuite": "bsuite",
    "gymnax:FourRooms-misc": "misc",
    "jumanji:Maze-v0": "DiscreteArray with a mask",
    "jumanji:Minesweeper-v0": "MultiDiscreteArray with a joint mask: one Discrete of rows x columns",
    "jumanji:LevelBasedForaging-v0": "MultiDiscreteArray with a mask row per agent: MultiDiscrete",
    "jumanji:SearchAndRescue-v0": "BoundedArray: a Box (PPO and SAC)",
    "brax:inverted_pendulum": "Brax, its default backend",
    "brax:reacher:positional": "Brax, another backend",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SUBSET))
def test_registry__a_tiny_trial_trains_through_the_kernel_a_study_uses(name):
    if name.startswith("brax:"):
        pytest.importorskip("brax")
    rows = probe(name)
    assert rows and all(r.status == "trains" for r in rows), [(r.algo, r.status, r.reason) for r in rows]
    assert all(np.isfinite(r.final_return) and r.steps_per_s > 0 for r in rows), rows
    continuous = "Box" in rows[0].action_space
    assert [r.algo for r in rows] == (["ppo", "sac"] if continuous else ["ppo"])


@pytest.mark.parametrize("name, why", [
    ("jumanji:Sokoban-v0", "downloads its levels from the internet"),
    ("gymnax:MNISTBandit-bsuite", "downloads MNIST"),
])
def test_registry__an_env_that_cannot_run_here_is_refused_in_one_line(name, why):
    (row,) = probe(name)
    assert row.status == "refused" and why in row.reason and "\n" not in row.reason, row


def test_jumanji__masks_map_to_the_policys_actions():
    tetris, params = envs.make("jumanji:Tetris-v0", num_rows=6, num_cols=6)
    assert tetris.action_space(params) == envs.Discrete(4 * 6)  # rotation x column: a joint mask
    connector, cp = envs.make("jumanji:Connector-v3")  # 10 agents, 5 moves each: a mask row per agent
    assert connector.action_space(cp) == MultiDiscrete((5,) * 10)
    _, state = connector.reset(jax.random.key(0), cp)
    mask = connector.action_mask(state, cp)
    assert mask.shape == (10, 5) and mask.dtype == jnp.bool_ and bool(mask[:, 0].all())  # no-op: always legal
    _, state = tetris.reset(jax.random.key(0), params)
    _, ts = tetris.env.inner.reset(jax.random.key(0))  # Jumanji's own: [rotation, column]
    assert tetris.action_mask(state, params).tolist() == np.asarray(ts.observation.action_mask).reshape(-1).tolist()
    flat = 3 * 6 + 4  # our action 22 is Jumanji's (rotation 3, column 4)
    assert tetris.env._inner_action(jnp.int32(flat)).tolist() == [3, 4]


# -- multi-discrete actions ----------------------------------------------------------------------------

@struct.dataclass
class BitsState:
    bits: jax.Array  # [2] int32, 0 or 1
    time: jax.Array


@struct.dataclass
class BitsParams:
    max_steps: int = struct.field(pytree_node=False, default=1)


@dataclasses.dataclass(frozen=True)
class Bits(Environment):
    """Two sub-actions (2 and 3 choices): each should copy its bit of the observation; reward is the
    fraction copied. Choice 2 of the second sub-action is never legal (masked)."""

    name: str = "Bits"

    @property
    def default_params(self) -> BitsParams:
        return BitsParams()

    def observation_space(self, params):
        return Box(0.0, 1.0, (2,))

    def action_space(self, params):
        return MultiDiscrete((2, 3))

    def action_mask(self, state, params):
        return jnp.array([[True, True, False], [True, True, False]])  # row 0's third: padding

    def reset(self, key, params):
        bits = jax.random.randint(key, (2,), 0, 2)
        return bits.astype(jnp.float32), BitsState(bits, jnp.int32(0))

    def transition(self, key, state, action, params):
        reward = jnp.mean((action == state.bits).astype(jnp.float32))
        return Transition(state.bits.astype(jnp.float32), state.replace(time=state.time + 1), reward,
                          jnp.bool_(True), {})


def test_multidiscrete__space_samples_inside_and_the_check_accepts_it():
    space = MultiDiscrete((2, 3))
    xs = jax.vmap(space.sample)(jax.random.split(jax.random.key(0), 500))
    assert xs.shape == (500, 2) and bool(jax.vmap(space.contains)(xs).all())
    assert set(np.unique(xs[:, 0])) == {0, 1} and set(np.unique(xs[:, 1])) == {0, 1, 2}
    assert space.valid().tolist() == [[True, True, False], [True, True, True]]
    with pytest.raises(ValueError, match="at least one"):
        MultiDiscrete(())
    envs.check(Bits(), BitsParams())


def test_ppo__multidiscrete_learns_one_categorical_per_sub_action_and_obeys_each_rows_mask():
    env, params = Bits(), BitsParams()
    config = ppo.PPOConfig(num_envs=16, num_steps=8, num_minibatches=2, update_epochs=4, updates_per_chunk=40,
                           total_timesteps=16 * 8 * 40, eval_episodes=64, hidden=(32,))
    hp = ppo.PPOHParams.default(lr=3e-3)
    algo = ppo.make(config, env, params)
    state, m = jax.jit(algo.chunk)(algo.init(jax.random.key(0), hp), hp)
    assert float(m.illegal_actions.max()) == 0.0
    assert float(m.episode_return[:3].mean()) < 0.8  # starts near random legal play (0.5)
    assert float(algo.evaluate(state, jax.random.key(1)).return_mean) == 1.0  # copies both bits
    unmasked = ppo.make(dataclasses.replace(config, use_action_mask=False, updates_per_chunk=1), env, params)
    s0 = unmasked.init(jax.random.key(0), hp)
    _, m = jax.jit(unmasked.chunk)(s0, hp)
    assert float(m.illegal_actions.mean()) > 0.05  # the second row's third choice, now taken
    acts = jax.vmap(lambda k: unmasked.act(unmasked.policy_params(s0), jnp.zeros((1, 2)), None, k))(
        jax.random.split(jax.random.key(2), 64))
    assert acts.shape == (64, 1, 2) and int(acts[..., 0].max()) <= 1  # padding is never an action
