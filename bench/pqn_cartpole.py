"""PQN on CartPole-v1: rl-harness against rejax, same process, same shapes and hyperparameters.

rejax's own CartPole PQN config (configs/gymnax/cartpole.yaml): 16 envs x 128 steps, 5 epochs x 16
minibatches, 64x64 LayerNorm-ReLU MLP, lr 3e-4 constant, epsilon 1 -> 0.05 over half the run,
gamma 0.99, lambda 0.9, gradients clipped at 10 (rejax clips each element, we clip the global norm),
524,288 steps per seed; 1 seed and N seeds vmapped in one kernel. Steps/s exclude compilation and
include one final evaluation of 128 episodes in both.

    python bench/pqn_cartpole.py [--seeds 1 8] [--timesteps 524288] [--hlo DIR]
"""

from __future__ import annotations

import _common  # noqa: F401  (sets XLA_FLAGS before jax is imported)
import jax
import jax.numpy as jnp
from rejax import PQN

import envs
from algos import pqn

HP = dict(lr=3e-4, gamma=0.99, td_lambda=0.9, max_grad_norm=10.0, eps_start=1.0, eps_end=0.05,
          exploration_fraction=0.5)
SHAPE = dict(num_envs=16, num_steps=128, num_minibatches=16, update_epochs=5)
EVAL_EPISODES = 128


def run_ours(seeds: int, timesteps: int) -> dict:
    env, params = envs.make("CartPole-v1")
    base = pqn.PQNConfig(**SHAPE, anneal_lr=False, eval_episodes=EVAL_EPISODES, total_timesteps=timesteps)
    config = pqn.PQNConfig(**{**base.__dict__, "updates_per_chunk": base.num_updates})
    algo = pqn.make(config, env, params)
    hp = jax.tree.map(lambda x: x[None], pqn.PQNHParams.default(**HP))
    keys = jax.random.split(jax.random.key(0), seeds)[None]
    eval_keys = jax.random.split(jax.random.key(1), seeds)[None]
    returns, compile_s, run_s = _common.time_whole_run(algo, keys, hp, eval_keys)
    steps = config.num_updates * config.batch_size * seeds
    return dict(impl="us", seeds=seeds, compile_s=compile_s, run_s=run_s, sps=steps / run_s,
                **{"return": float(jnp.mean(returns))})


def run_rejax(seeds: int, timesteps: int) -> dict:
    batch = SHAPE["num_envs"] * SHAPE["num_steps"]
    algo = PQN.create(
        env="CartPole-v1", num_envs=SHAPE["num_envs"], num_steps=SHAPE["num_steps"],
        num_minibatches=SHAPE["num_minibatches"], num_epochs=SHAPE["update_epochs"],
        learning_rate=HP["lr"], max_grad_norm=HP["max_grad_norm"], eps_start=HP["eps_start"],
        eps_end=HP["eps_end"], exploration_fraction=HP["exploration_fraction"], gamma=HP["gamma"],
        td_lambda=HP["td_lambda"], total_timesteps=timesteps, eval_freq=timesteps,
        skip_initial_evaluation=True, normalize_observations=False)
    return _common.run_rejax(algo, seeds, timesteps // batch * batch)


if __name__ == "__main__":
    _common.main(__doc__, run_ours, run_rejax, default_timesteps=256 * 2048)
