"""Learning to a threshold, each run as one kernel vmapped over 4 seeds, or 2 where the threshold
still separates and the kernel's cost grows with seeds (the suite's slow part)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
import studies
from algos import ppo, pqn, sac
from algos.common import batched

pytestmark = pytest.mark.slow
SEEDS = 4


def _train(algo, hparams, num_chunks, seed=0, seeds=SEEDS):
    """1 config x ``seeds`` seeds in one kernel; returns the trained state and the metrics
    ``[1, seeds, updates]``."""
    hp = jax.tree.map(lambda x: x[None], hparams)
    keys = jax.random.split(jax.random.key(seed), seeds)[None]
    state = jax.jit(batched(algo.init))(keys, hp)
    run = jax.jit(batched(algo.chunk))
    chunks = []
    for _ in range(num_chunks):
        state, metrics = run(state, hp)
        chunks.append(metrics)
    return state, jax.tree.map(lambda *x: np.concatenate(x, axis=-1), *chunks)


def _train_and_evaluate(algo, hparams, num_chunks, seed=0, seeds=SEEDS, evaluator=None):
    """:func:`_train`, then the evaluation return per seed; returns it and the metrics.

    ``evaluator``: another Algo (same network) whose ``evaluate`` scores the trained state.
    """
    state, metrics = _train(algo, hparams, num_chunks, seed, seeds)
    eval_keys = jax.random.split(jax.random.key(10_000 + seed), seeds)[None]
    evaluate = (evaluator or algo).evaluate
    evals = jax.jit(batched(evaluate, hparams_argnum=None))(state, eval_keys)
    return np.asarray(evals.return_mean[0]), metrics


def test_ppo__solves_cartpole_on_every_seed_within_500k_steps():
    env, params = envs.make("CartPole-v1")
    config = ppo.PPOConfig(updates_per_chunk=61)  # 16 chunks x 61 updates x 512 = 499,712 steps
    assert config.num_chunks * config.updates_per_chunk * config.batch_size <= 500_000
    returns, metrics = _train_and_evaluate(ppo.make(config, env, params), ppo.PPOHParams.default(),
                                           config.num_chunks)
    assert int(metrics.env_steps[0, 0, -1]) <= 500_000
    assert (returns >= 475).all(), returns


def test_pqn__solves_cartpole_on_every_seed_within_500k_steps():
    """The final evaluation, as PPO's test: lambda 0.95 (at the default 0.9 about one seed in twelve
    ends below 475 after reaching 500: Q-learning's greedy policy can dip late)."""
    env, params = envs.make("CartPole-v1")
    config = pqn.PQNConfig(total_timesteps=499_712, updates_per_chunk=61)  # 4 chunks x 61 updates x 2,048
    assert config.env_steps_after(config.num_chunks) <= 500_000
    returns, metrics = _train_and_evaluate(pqn.make(config, env, params), pqn.PQNHParams.default(td_lambda=0.95),
                                           config.num_chunks)
    assert int(metrics.env_steps[0, 0, -1]) <= 500_000 and not np.asarray(metrics.diverged).any()
    assert (returns >= 475).all(), returns


def test_pqn__breakout_minatar_from_gymnax_scores_8_on_every_seed_within_410k_steps():
    """purejaxql's MinAtar shape (mttga/purejaxql config/alg/pqn_minatar.yaml: 128 envs x 32 steps, 2 epochs
    of 32 minibatches, lr 5e-4, lambda 0.65, epsilon decayed over the first tenth) with a 128x128 MLP, at
    1/25 of its 10M steps. Random play scores 0.38 (256 episodes); this run scored 11 to 13 here."""
    env, params = envs.make("gymnax:Breakout-MinAtar")
    config = pqn.PQNConfig(num_envs=128, num_steps=32, num_minibatches=32, update_epochs=2, hidden=(128, 128),
                           total_timesteps=409_600, updates_per_chunk=20, eval_episodes=32)
    hp = pqn.PQNHParams.default(lr=5e-4, td_lambda=0.65, exploration_fraction=0.1)
    returns, metrics = _train_and_evaluate(pqn.make(config, env, params), hp, config.num_chunks, seeds=2)
    assert int(metrics.env_steps[0, 0, -1]) <= 409_600
    assert (returns >= 8).all(), returns


def test_sac__swings_up_pendulum_on_every_seed_within_20k_steps():
    env, params = envs.make("Pendulum-v1")
    # fewer, smaller updates per step than the default (4 of 256): much cheaper, the same returns
    config = sac.SACConfig(hidden=(64, 64), total_timesteps=20_000, steps_per_chunk=250, updates_per_step=2,
                           batch_size=128)
    returns, metrics = _train_and_evaluate(sac.make(config, env, params), sac.SACHParams.default(),
                                           config.num_chunks)
    assert int(metrics.env_steps[0, 0, -1]) <= 20_000
    assert (returns >= -200).all(), returns


# in -m extended: SAC's learning is proven by the Pendulum test above, this env's
# dynamics by test_envs (CartPole with a scaled force)
@pytest.mark.extended
def test_sac__balances_continuous_cartpole_on_every_seed():
    env, params = envs.make("ContinuousCartPole-v1")
    config = sac.SACConfig(hidden=(64, 64), batch_size=128, total_timesteps=60_000,
                           steps_per_chunk=500)
    returns, _ = _train_and_evaluate(sac.make(config, env, params), sac.SACHParams.default(),
                                     config.num_chunks, seeds=2)  # 4 would cost twice as much, no surer
    assert (returns >= 450).all(), returns


# ---- others' envs (gymnax), against published figures ---------------------------------------

def _gymnax_config(total_timesteps, **overrides):
    """The stated config for gymnax's classic control: 16 envs x 128 steps, 4 epochs of 4 minibatches."""
    base = dict(num_envs=16, num_steps=128, num_minibatches=4, update_epochs=4, updates_per_chunk=25,
                total_timesteps=total_timesteps)
    return ppo.PPOConfig(**{**base, **overrides})


# in -m extended: a gymnax env learning to its published figure is proven by MountainCarContinuous below, discrete
# actions through the adapter by tests/test_coverage.py; half the budget lands too close to the bar to cut it
@pytest.mark.extended
def test_ppo__acrobot_from_gymnax_reaches_minus_100_on_every_seed_within_500k_steps():
    pytest.importorskip("gymnax")
    env, params = envs.make("gymnax:Acrobot-v1")  # published, tuned: about -80
    config = _gymnax_config(500_000)
    returns, metrics = _train_and_evaluate(ppo.make(config, env, params), ppo.PPOHParams.default(lr=1e-3),
                                           config.num_chunks)
    assert int(metrics.env_steps[0, 0, -1]) <= 512_000  # 10 chunks of 51,200
    assert (returns >= -100).all(), returns


# Continuous PPO as locomotion studies run it (normalised observations, tanh-squashed actions) to a published
# figure; Brax's inverted pendulum proves the same at far more cost, in -m extended (tests/test_locomotion.py)
def test_ppo__mountain_car_continuous_from_gymnax_reaches_80_on_every_seed_within_500k_steps():
    pytest.importorskip("gymnax")
    env, params = envs.make("gymnax:MountainCarContinuous-v0")  # published, tuned: about 92
    # no entropy bonus and a long horizon: the goal's +100 must outweigh the action cost it takes
    config = _gymnax_config(200_000, normalize_observations=True, squash="tanh")
    hp = ppo.PPOHParams.default(lr=3e-4, gamma=0.999, ent_coef=0.0)
    returns, _ = _train_and_evaluate(ppo.make(config, env, params), hp, config.num_chunks)
    assert (returns >= 80).all(), returns


# ---- grid games ---------------------------------------------------------------------------

def _snake_config(**overrides):
    """PPO for Snake 6x6: 32 envs x 64 steps per update, 2 epochs of 4 minibatches."""
    base = dict(num_envs=32, num_steps=64, num_minibatches=4, update_epochs=2, hidden=(64, 64),
                activation="relu")
    return ppo.PPOConfig(**{**base, **overrides})


def _apples_evaluator(config, env, params):
    """PPO's evaluate on the same board with only apples rewarded: its return counts apples."""
    return ppo.make(config, env, params.replace(death_reward=0.0, step_reward=0.0, eat_reward=1.0))


def _random_policy_apples(env, params, episodes=1024):
    """Mean apples per episode of the uniform policy over legal moves (one episode per env)."""
    def body(carry, k):
        state, apples, active = carry
        k_a, k_s = jax.random.split(k)
        mask = jax.vmap(env.action_mask, (0, None))(state, params)
        action = jax.random.categorical(k_a, jnp.where(mask, 0.0, -jnp.inf))
        s = jax.vmap(env.step, (0, 0, 0, None))(jax.random.split(k_s, episodes), state, action, params)
        return (s.state, apples + jnp.where(active, s.info["apples"], 0.0), active & ~s.done), None

    _, state = jax.vmap(env.reset, (0, None))(jax.random.split(jax.random.key(1), episodes), params)
    init = (state, jnp.zeros(episodes), jnp.ones(episodes, bool))
    (_, apples, active), _ = jax.jit(lambda c: jax.lax.scan(
        body, c, jax.random.split(jax.random.key(2), params.max_steps)))(init)
    assert not bool(active.any())
    return float(apples.mean())


# in -m extended: PPO's learning on a grid game is proven by the dungeon test
@pytest.mark.extended
def test_ppo__mlp_eats_five_apples_on_snake_6x6_on_every_seed_within_2m_steps():
    env, params = envs.make("Snake-v1", size=6)
    config = _snake_config(total_timesteps=600_000, updates_per_chunk=73, eval_episodes=32)
    apples, metrics = _train_and_evaluate(ppo.make(config, env, params), ppo.PPOHParams.default(lr=1e-3),
                                          config.num_chunks, evaluator=_apples_evaluator(config, env, params))
    random_apples = _random_policy_apples(env, params)
    print(f"Snake 6x6 MLP: apples per episode {apples} (random policy {random_apples:.3f})")
    assert int(metrics.env_steps[0, 0, -1]) <= 2_000_000
    assert (apples >= 5).all(), apples


# in -m extended: the transformer's learning is proven in the default suite by a probe
# (tests/test_algos.py: point at the marked cell)
@pytest.mark.extended
def test_ppo__transformer_learns_snake_6x6_five_times_above_random():
    env, params = envs.make("Snake-v1", size=6)
    # one seed is noisy (float rounding differs across CPUs and thread counts, and it has ended under
    # the bar on one): more seeds or steps would make a bar that always holds
    config = _snake_config(total_timesteps=266_240, updates_per_chunk=65, eval_episodes=32,
                           network="transformer", embed_dim=16, num_heads=2, num_layers=1)
    apples, _ = _train_and_evaluate(ppo.make(config, env, params), ppo.PPOHParams.default(lr=2e-3),
                                    config.num_chunks, seeds=1,
                                    evaluator=_apples_evaluator(config, env, params))
    random_apples = _random_policy_apples(env, params)
    print(f"Snake 6x6 transformer: apples per episode {apples} (random policy {random_apples:.3f})")
    assert (apples >= 5 * random_apples).all(), (apples, random_apples)


def test_ppo__masked_learns_above_random_masked_play_and_beats_unmasked_on_dungeon_crawl():
    env, params = envs.make("DungeonCrawl-v1")
    random_masked = studies.get("dungeon_ppo").reference  # random masked play, checked in tests/test_grid_envs.py
    # the best configuration of a dungeon_ppo study: a default-lr policy gains too little in this budget for a bar
    hp = ppo.PPOHParams.default(lr=2.2e-3, ent_coef=6.3e-4, gae_lambda=0.911, gamma=0.985, clip_eps=0.13,
                                vf_coef=0.444)
    first, last = {}, {}
    for masked in (True, False):
        config = ppo.PPOConfig(num_envs=32, num_steps=64, num_minibatches=4, update_epochs=2,
                               hidden=(64, 64), activation="relu", total_timesteps=163_840,
                               updates_per_chunk=40, use_action_mask=masked)
        _, m = _train(ppo.make(config, env, params), hp, config.num_chunks, seeds=2)  # judged by its
        returns = m.episode_return[0]  # training returns [seeds, updates]: no evaluation compiled or run
        if masked:
            assert float(np.max(m.illegal_actions)) == 0.0
        first[masked] = float(np.nanmean(returns[:, :5]))
        last[masked] = np.nanmean(returns[:, -15:], axis=1)  # the last ~30k steps, per seed
    print(f"DungeonCrawl training return, first 5 updates -> last 15 per seed: masked {first[True]:.2f} -> "
          f"{np.round(last[True], 2)}, unmasked {first[False]:.2f} -> {np.round(last[False], 2)} "
          f"(random masked play {random_masked})")
    # masked PPO learns: every seed ends above random play over the legal actions, the mean by a margin
    assert (last[True] > random_masked).all() and last[True].mean() > random_masked + 0.25, last[True]
    assert last[True].mean() > first[True] + 0.25, (first[True], last[True])
    # and the mask is worth having: unmasked PPO spends its steps learning to stop choosing illegal
    # actions, and ends well below
    assert last[True].mean() > last[False].mean() + 0.3, (last[True], last[False])
