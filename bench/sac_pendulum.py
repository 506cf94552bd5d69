"""SAC on Pendulum-v1: rl-harness against rejax, same process, same hyperparameters.

4 envs, 4 gradient steps per vectorized env step (UTD 1), batch 256, 64x64 relu MLPs, lr 3e-4
for actor, critics and temperature, tau 0.005 per gradient step (rejax: polyak 0.995^4 once per
4 gradient steps, the same), 1000 random warm-up steps, 20k steps per seed;
1 seed and N seeds vmapped. Steps/s exclude compilation and include one final evaluation.

    python bench/sac_pendulum.py [--seeds 1 8] [--timesteps 20000]
"""

from __future__ import annotations

import _common  # noqa: F401  (sets XLA_FLAGS before jax is imported)
import jax
import jax.numpy as jnp
from rejax import SAC

import envs
from algos import sac
from algos.common import batched

NUM_ENVS, UPDATES, BATCH, WARMUP, LR = 4, 4, 256, 1000, 3e-4
TAU = 0.005
# rejax moves its target once per iteration, after its UPDATES gradient steps; ours after each one:
# (1 - TAU) ** UPDATES gives both the same target-network update per gradient step
POLYAK = (1 - TAU) ** UPDATES
EVAL_EPISODES = 32


def run_ours(seeds: int, timesteps: int) -> dict:
    env, params = envs.make("Pendulum-v1")
    base = sac.SACConfig(num_envs=NUM_ENVS, updates_per_step=UPDATES, batch_size=BATCH,
                         learning_starts=WARMUP, total_timesteps=timesteps, hidden=(64, 64),
                         eval_episodes=EVAL_EPISODES)
    # driven in chunks, as the harness does: the whole run as one scan hung in its first call on a CPU
    # (jax 0.10.2, several seeds)
    config = sac.SACConfig(**{**base.__dict__, "steps_per_chunk": 250})
    algo = sac.make(config, env, params)
    hp = jax.tree.map(lambda x: x[None], sac.SACHParams.default(
        actor_lr=LR, critic_lr=LR, alpha_lr=LR, gamma=0.99, tau=TAU))
    keys = jax.random.split(jax.random.key(0), seeds)[None]
    eval_keys = jax.random.split(jax.random.key(1), seeds)[None]

    init, c1 = _common.compile_and_time(batched(algo.init), keys, hp)
    state0 = init(keys, hp)
    chunk, c2 = _common.compile_and_time(batched(algo.chunk), state0, hp)
    evaluate, c3 = _common.compile_and_time(batched(algo.evaluate, hparams_argnum=None), state0,
                                            eval_keys)
    compile_s = c1 + c2 + c3

    def train():
        state = init(keys, hp)
        for _ in range(config.num_chunks):
            state, _ = chunk(state, hp)
        return evaluate(state, eval_keys).return_mean

    returns, run_s = _common.timed(train)
    steps = (config.warmup_steps + config.num_chunks * config.steps_per_chunk) * NUM_ENVS * seeds
    return dict(impl="us", seeds=seeds, compile_s=compile_s, run_s=run_s, sps=steps / run_s,
                **{"return": float(jnp.mean(returns))})


def run_rejax(seeds: int, timesteps: int) -> dict:
    algo = SAC.create(
        env="Pendulum-v1", num_envs=NUM_ENVS, num_epochs=UPDATES, batch_size=BATCH,
        fill_buffer=WARMUP, buffer_size=100_000, learning_rate=LR, gamma=0.99, polyak=POLYAK,
        total_timesteps=timesteps, eval_freq=timesteps, skip_initial_evaluation=True,
        hidden_layer_sizes=(64, 64))
    return _common.run_rejax(algo, seeds, timesteps)


if __name__ == "__main__":
    _common.main(__doc__, run_ours, run_rejax, default_timesteps=20_000)
