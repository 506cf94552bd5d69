"""Learning to a threshold, each run as one kernel vmapped over 4 seeds (the suite's slow part)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import envs
from algos import ppo, sac
from algos.common import batched

pytestmark = pytest.mark.slow
SEEDS = 4


def _train_and_evaluate(algo, hparams, num_chunks, seed=0):
    """1 config x SEEDS seeds in one kernel; returns the evaluation return per seed and metrics."""
    hp = jax.tree.map(lambda x: x[None], hparams)
    keys = jax.random.split(jax.random.key(seed), SEEDS)[None]
    state = jax.jit(batched(algo.init))(keys, hp)
    run = jax.jit(batched(algo.chunk))
    for _ in range(num_chunks):
        state, metrics = run(state, hp)
    eval_keys = jax.random.split(jax.random.key(10_000 + seed), SEEDS)[None]
    evals = jax.jit(batched(algo.evaluate, hparams_argnum=None))(state, eval_keys)
    return np.asarray(evals.return_mean[0]), metrics


def test_ppo__solves_cartpole_on_every_seed_within_500k_steps():
    env, params = envs.make("CartPole-v1")
    config = ppo.PPOConfig(updates_per_chunk=61)  # 16 chunks x 61 updates x 512 = 499,712 steps
    assert config.num_chunks * config.updates_per_chunk * config.batch_size <= 500_000
    returns, metrics = _train_and_evaluate(ppo.make(config, env, params), ppo.PPOHParams.default(),
                                           config.num_chunks)
    assert int(metrics.env_steps[0, 0, -1]) <= 500_000
    assert (returns >= 475).all(), returns


def test_sac__swings_up_pendulum_on_every_seed_within_20k_steps():
    env, params = envs.make("Pendulum-v1")
    config = sac.SACConfig(hidden=(64, 64), total_timesteps=20_000, steps_per_chunk=250)
    returns, metrics = _train_and_evaluate(sac.make(config, env, params), sac.SACHParams.default(),
                                           config.num_chunks)
    assert int(metrics.env_steps[0, 0, -1]) <= 20_000
    assert (returns >= -200).all(), returns


def test_sac__balances_continuous_cartpole_on_every_seed():
    env, params = envs.make("ContinuousCartPole-v1")
    config = sac.SACConfig(hidden=(64, 64), batch_size=128, total_timesteps=60_000,
                           steps_per_chunk=500)
    returns, _ = _train_and_evaluate(sac.make(config, env, params), sac.SACHParams.default(),
                                     config.num_chunks)
    assert (returns >= 450).all(), returns
