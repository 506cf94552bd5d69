"""PPO on CartPole-v1: rl-harness against rejax, same process, same hyperparameters.

4 envs x 128 steps, 4 epochs x 4 minibatches, 64x64 tanh MLPs, lr 2.5e-4 (constant: rejax does
not anneal), ~500k steps per seed; 1 seed and N seeds vmapped in one kernel. Steps/s exclude
compilation and include one final evaluation of 128 episodes in both.

    python bench/ppo_cartpole.py [--seeds 1 8] [--timesteps 499712] [--hlo DIR]

``--hlo DIR`` also writes both compiled programs (optimized HLO, this device's) to DIR and counts
their kernels: on a GPU, which loop bodies launch more kernels in ours is read from them here.
"""

from __future__ import annotations

import _common  # noqa: F401  (sets XLA_FLAGS before jax is imported)
import jax
import jax.numpy as jnp
import numpy as np
from rejax import PPO

import envs
from algos import ppo

HP = dict(lr=2.5e-4, gamma=0.99, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5,
          max_grad_norm=0.5)
EVAL_EPISODES = 128


def run_ours(seeds: int, timesteps: int) -> dict:
    env, params = envs.make("CartPole-v1")
    base = ppo.PPOConfig(anneal_lr=False, eval_episodes=EVAL_EPISODES, total_timesteps=timesteps)
    config = ppo.PPOConfig(**{**base.__dict__, "updates_per_chunk": base.num_updates})
    algo = ppo.make(config, env, params)
    hp = jax.tree.map(lambda x: x[None], ppo.PPOHParams.default(**HP))
    keys = jax.random.split(jax.random.key(0), seeds)[None]
    eval_keys = jax.random.split(jax.random.key(1), seeds)[None]

    returns, compile_s, run_s = _common.time_whole_run(algo, keys, hp, eval_keys)
    steps = config.num_updates * config.batch_size * seeds
    return dict(impl="us", seeds=seeds, compile_s=compile_s, run_s=run_s, sps=steps / run_s,
                **{"return": float(jnp.mean(returns))})


def run_rejax(seeds: int, timesteps: int) -> dict:
    algo = PPO.create(
        env="CartPole-v1", num_envs=4, num_steps=128, num_epochs=4, num_minibatches=4,
        learning_rate=HP["lr"], max_grad_norm=HP["max_grad_norm"], gamma=HP["gamma"],
        gae_lambda=HP["gae_lambda"], clip_eps=HP["clip_eps"], ent_coef=HP["ent_coef"],
        vf_coef=HP["vf_coef"], total_timesteps=timesteps, eval_freq=timesteps,
        skip_initial_evaluation=True,
        agent_kwargs={"activation": "tanh", "hidden_layer_sizes": (64, 64)})
    return _common.run_rejax(algo, seeds, int(np.ceil(timesteps / 512)) * 512)


if __name__ == "__main__":
    _common.main(__doc__, run_ours, run_rejax, default_timesteps=976 * 512)
