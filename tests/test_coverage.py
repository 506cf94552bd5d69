"""Others' environments: a representative subset of the gymnax, Jumanji and Brax registries through
the kernel a trial uses (the full sweep is ``bench/env_coverage.py``), the ones refused and why, and
multi-discrete actions."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from flax import struct

import envs
from algos import ppo
from envs import Box, Environment, MultiDiscrete, Transition
from harness.reports.coverage import probe

pytest.importorskip("gymnax")
pytest.importorskip("jumanji")

# One env of each gymnax family and Jumanji's single-discrete kind, run as bench/env_coverage.py runs them: every
# row must run (learning: tests/test_learning.py, below, tests/test_locomotion.py). bsuite's Catch is left to that
# bench's tiny run (tests/test_bench.py), so it is not compiled twice.
SUBSET = {
    "gymnax:Breakout-MinAtar": "MinAtar (a grid of bools)",
    "gymnax:FourRooms-misc": "misc",
    "jumanji:Maze-v0": "DiscreteArray with a mask",
}


@pytest.mark.slow
def test_registry__a_representative_subset_trains_through_the_kernel_a_study_uses(tmp_path):
    from tests.conftest import ROOT, fast_compile_env

    out = tmp_path / "rows.csv"
    env = fast_compile_env({**os.environ, "JAX_PLATFORMS": "cpu"})
    r = subprocess.run([sys.executable, "bench/env_coverage.py", "--libraries", "gymnax", "jumanji", "--only",
                        *SUBSET, "--same-process", "--csv", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = pd.read_csv(out)
    assert list(rows.env) == list(SUBSET) and set(rows.algo) == {"ppo"}
    bad = rows[rows.status != "runs"]
    assert bad.empty, bad[["env", "algo", "status", "reason"]].to_string()
    assert (rows.steps_per_s > 0).all() and np.isfinite(rows.final_return).all()
    assert (rows.draws == "yes").all(), rows[["env", "draws"]].to_string()  # harness.play draws each
    assert rows.set_index("env").action_space["jumanji:Maze-v0"] == "Discrete(4)"


@pytest.mark.parametrize("name, why", [
    ("jumanji:Sokoban-v0", "downloads its levels from the internet"),
    ("gymnax:MNISTBandit-bsuite", "downloads MNIST"),
    ("gymnax:SimpleBandit-bsuite", "is broken in gymnax itself"),
])
def test_registry__an_env_that_cannot_run_here_is_refused_in_one_line(name, why):
    (row,) = probe(name)
    assert row.status == "refused" and why in row.reason and "\n" not in row.reason, row


def test_jumanji__masks_map_to_the_policys_actions():
    sweeper, sp = envs.make("jumanji:Minesweeper-v0")  # a board-shaped joint mask: one Discrete
    assert sweeper.action_space(sp) == envs.Discrete(10 * 10)
    tetris, params = envs.make("jumanji:Tetris-v0", num_rows=6, num_cols=6)
    assert tetris.action_space(params) == envs.Discrete(4 * 6)  # rotation x column: a joint mask
    connector, cp = envs.make("jumanji:Connector-v3")  # 10 agents, 5 moves each: a mask row per agent
    assert connector.action_space(cp) == MultiDiscrete((5,) * 10)
    _, state = connector.reset(jax.random.key(0), cp)
    mask = connector.action_mask(state, cp)
    assert mask.shape == (10, 5) and mask.dtype == jnp.bool_ and bool(mask[:, 0].all())  # no-op: always legal
    _, state = tetris.reset(jax.random.key(0), params)
    _, ts = tetris.env.inner.reset(jax.random.key(0))  # Jumanji's own: [rotation, column]
    joint = np.asarray(ts.observation.action_mask).reshape(-1)
    assert tetris.action_mask(state, params).tolist() == joint.tolist()
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


def test_multidiscrete__an_env_goes_through_the_kernel_a_trial_uses():
    """The probe the coverage sweep runs (envs.check, then a trial's kernel: 2 configs x 2 seeds)."""
    (row,) = probe("tests.test_coverage:Bits")
    assert (row.algo, row.status, row.action_space) == ("ppo", "runs", "MultiDiscrete([2, 3])"), row
    assert row.steps_per_s > 0 and 0.0 <= row.final_return <= 1.0


def test_probe__a_policy_that_does_not_move_in_training_is_not_counted_as_training(monkeypatch):
    """"runs" means training reached the policy: with a learning rate of 0 (an update that never
    lands, as a broken adapter's rewards or gradients would give) the probe says it failed."""
    from algos import ppo

    plain = ppo.PPOHParams.default
    monkeypatch.setattr(ppo.PPOHParams, "default", classmethod(lambda cls, **kw: plain(**{"lr": 0.0, **kw})))
    (row,) = probe("tests.test_coverage:Bits")
    assert (row.status, row.reason) == ("failed", "its policy's parameters did not change in training"), row


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


def _jumanji_case(case):
    from jumanji.environments.logic.minesweeper.generator import UniformSamplingGenerator
    from jumanji.environments.routing.connector.generator.random_walk_generator import RandomWalkGenerator

    return {  # small boards, so a short run shows learning: (kwargs, env steps, margin over random play)
        "Minesweeper-v0": (dict(generator=UniformSamplingGenerator(num_rows=5, num_cols=5, num_mines=3)),
                           600_000, 3.0),  # joint mask, flattened: Discrete(25)
        "Tetris-v0": (dict(num_rows=6, num_cols=6), 200_000, 15.0),  # joint rotation x column mask
        "Connector-v3": (dict(generator=RandomWalkGenerator(grid_size=6, num_agents=3)), 200_000, 0.5),  # rows
    }[case]


# Minesweeper in the default suite; Tetris and Connector in `pytest -m extended`: the same masked path, and
# Connector's per-row masks are also proven, more cheaply, by
# test_ppo__multidiscrete_learns_one_categorical_per_sub_action_and_obeys_each_rows_mask.
@pytest.mark.slow
@pytest.mark.parametrize("case", ["Minesweeper-v0", pytest.param("Tetris-v0", marks=pytest.mark.extended),
                                  pytest.param("Connector-v3", marks=pytest.mark.extended)])
def test_ppo__jumanji_multi_discrete_envs_learn_above_random_play_and_never_act_illegally(case):
    """Random play is the untrained policy sampling (its logits start near uniform over the legal
    actions); the trained one acts greedily. 2 seeds of one kernel, every seed above random by the
    margin."""
    from algos.common import batched

    kwargs, steps, margin = _jumanji_case(case)
    env, params = envs.make(f"jumanji:{case}", **kwargs)
    config = ppo.PPOConfig(num_envs=32, num_steps=32, num_minibatches=4, update_epochs=2, hidden=(64, 64),
                           activation="relu", total_timesteps=steps, updates_per_chunk=10, eval_episodes=32,
                           eval_policy="sample")
    algo = ppo.make(config, env, params)
    greedy = ppo.make(dataclasses.replace(config, eval_policy="greedy"), env, params)
    hp = jax.tree.map(lambda x: x[None], ppo.PPOHParams.default(lr=1e-3))
    keys, eval_keys = (jax.random.split(jax.random.key(k), 2)[None] for k in (0, 1))
    state = jax.jit(batched(algo.init))(keys, hp)
    random_play = np.asarray(jax.jit(batched(algo.evaluate, hparams_argnum=None))(state, eval_keys).return_mean)
    chunk, illegal = jax.jit(batched(algo.chunk)), 0.0
    for _ in range(config.num_chunks):
        state, m = chunk(state, hp)
        illegal = max(illegal, float(np.max(m.illegal_actions)))
    trained = np.asarray(jax.jit(batched(greedy.evaluate, hparams_argnum=None))(state, eval_keys).return_mean)
    print(f"{case}: random play {random_play}, trained {trained}")
    assert illegal == 0.0
    assert (trained >= random_play.mean() + margin).all(), (trained, random_play)
