"""What locomotion PPO needs, as static config: observation normalisation inside the kernel (against
numpy, in acting, in saved policies), tanh-squashed actions, reward scaling; and (in -m extended)
Brax's inverted pendulum learned to a threshold on every seed of one kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

import envs
from algos import ppo
from algos.common import batched
from algos.normalize import CLIP, RunningStats


def test_running_stats__equal_numpy_over_the_same_data():
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=[3.0, -1.0, 0.0], scale=[0.5, 4.0, 1e-3], size=(n, 3)).astype(np.float32)
               for n in (1, 7, 256, 33)]
    stats = RunningStats.empty((3,))
    for b in batches:
        stats = jax.jit(RunningStats.update)(stats, jnp.asarray(b))
    data = np.concatenate(batches).astype(np.float64)
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-4, atol=1e-9)
    assert int(stats.count) == len(data)
    z = np.asarray(stats.normalize(jnp.asarray(data[:5], jnp.float32)))
    np.testing.assert_allclose(z, np.clip((data[:5] - data.mean(0)) / np.sqrt(data.var(0) + 1e-8), -CLIP, CLIP),
                               rtol=1e-3, atol=1e-3)


def _pendulum_ppo(max_steps: int | None = None, **overrides):
    env, params = envs.make("Pendulum-v1") if max_steps is None else envs.make("Pendulum-v1", max_steps=max_steps)
    cfg = ppo.PPOConfig(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2, updates_per_chunk=3,
                        total_timesteps=4 * 32 * 3, normalize_observations=True, squash="tanh", **overrides)
    return env, params, cfg, ppo.make(cfg, env, params)


def test_normalized_ppo__statistics_cover_every_rollout_observation():
    env, params, cfg, algo = _pendulum_ppo()
    state = algo.init(jax.random.key(0), ppo.PPOHParams.default())
    state, _ = jax.jit(algo.chunk)(state, ppo.PPOHParams.default())
    assert int(state.obs_stats.count) == 3 * cfg.batch_size
    # Pendulum's observation is (cos, sin, thdot): the statistics are those of real observations
    assert np.all(np.abs(np.asarray(state.obs_stats.mean[:2])) <= 1.0) and float(state.obs_stats.var[2]) > 0.1


def test_normalized_ppo__a_saved_policy_acts_the_same_after_reload():
    env, params, cfg, algo = _pendulum_ppo()
    state = algo.init(jax.random.key(1), ppo.PPOHParams.default())
    state, _ = jax.jit(algo.chunk)(state, ppo.PPOHParams.default(lr=3e-3))
    policy = algo.policy_params(state)
    restored = serialization.msgpack_restore(serialization.to_bytes(policy))  # what play/checkpoints do
    obs = jax.random.normal(jax.random.key(2), (64, 3)) * jnp.array([1.0, 1.0, 4.0])
    np.testing.assert_array_equal(jax.jit(algo.act)(policy, obs), jax.jit(algo.act)(restored, obs))
    # the statistics matter: the same network without them acts differently
    plain = ppo.make(ppo.PPOConfig(**{**cfg.__dict__, "normalize_observations": False}), env, params)
    assert not np.allclose(plain.act(policy["params"], obs), algo.act(policy, obs))


def test_tanh_squash__actions_stay_in_the_box_and_the_mean_maps_through_tanh():
    env, params, cfg, algo = _pendulum_ppo()
    state = algo.init(jax.random.key(3), ppo.PPOHParams.default())
    policy = algo.policy_params(state)
    net = ppo.network(cfg, env, params)
    obs = jax.random.normal(jax.random.key(4), (16, 3))
    mean = net.apply(policy["params"], state.obs_stats.normalize(obs))[0]
    np.testing.assert_allclose(algo.act(policy, obs), 2.0 * np.tanh(np.asarray(mean)), rtol=1e-5, atol=1e-6)
    huge = jax.tree.map(lambda x: x * 1e3, policy)  # saturated: still inside [-2, 2]
    a = np.asarray(algo.act(huge, obs))
    assert np.all(np.abs(a) <= 2.0) and np.abs(a).max() > 1.99


def test_reward_scale__changes_learning_not_reported_returns():
    env, params, cfg, algo = _pendulum_ppo(max_steps=20)  # episodes of 20 steps: each rollout of 32 ends one
    chunk = jax.jit(algo.chunk)
    out = {}
    for scale in (1.0, 10.0):
        hp = ppo.PPOHParams.default(reward_scale=scale)
        out[scale] = chunk(algo.init(jax.random.key(5), hp), hp)[1]
    # the first rollout is the same policy on the same keys: same episodes, same reported returns
    first = np.asarray(out[1.0].episode_return[0])
    assert np.isfinite(first) and -20 * 16.3 <= first < 0  # a Pendulum episode's return: 20 steps of cost
    np.testing.assert_array_equal(first, out[10.0].episode_return[0])
    assert float(out[10.0].value_loss[0]) > 20 * float(out[1.0].value_loss[0])


# in -m extended, being mostly Brax's compile: the default suite covers continuous PPO (tests/test_learning.py),
# Brax through the kernel (bench/brax_ppo.py's tiny run) and Brax's dynamics (tests/test_brax.py)
@pytest.mark.slow
@pytest.mark.extended
def test_brax_inverted_pendulum__every_seed_of_one_kernel_balances():
    pytest.importorskip("brax")
    env, params = envs.make("brax:inverted_pendulum:positional")
    # enough steps for every seed to balance; the learning rate anneals over the run, so fewer chunks
    # is a different run, not an earlier point of this one
    cfg = ppo.PPOConfig(num_envs=64, num_steps=16, num_minibatches=8, update_epochs=4, updates_per_chunk=50,
                        total_timesteps=153_600, normalize_observations=True, squash="tanh", eval_episodes=4)
    algo = ppo.make(cfg, env, params)
    hp = ppo.PPOHParams.default(lr=1e-3, gamma=0.97, ent_coef=1e-3, reward_scale=0.1)
    seeds = 3
    hps = jax.tree.map(lambda x: x[None], hp)  # [C=1]
    keys = jax.random.split(jax.random.key(0), seeds).reshape(1, seeds)
    state = jax.jit(batched(algo.init))(keys, hps)
    evaluate = jax.jit(batched(algo.evaluate, hparams_argnum=None))
    untrained = np.asarray(evaluate(state, keys).return_mean)
    chunk = jax.jit(batched(algo.chunk))
    for _ in range(cfg.num_chunks):
        state, _ = chunk(state, hps)
    returns = np.asarray(evaluate(state, keys).return_mean)
    assert returns.shape == (1, seeds) and np.all(returns >= 950), returns  # 1000: never fell
    assert np.all(untrained < 500), untrained  # the untrained policy falls
