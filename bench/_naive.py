"""The competitor in bench/study_throughput.py: one configuration x one seed per Tune trial.

What a user writes first with Ray Tune and OptunaSearch: a function trainable that builds and
jits its own train step, trains one seed, evaluates, reports. Default Tune settings (a fresh
actor per trial, no compilation cache). It runs the same PPO code as the harness.
"""

from __future__ import annotations

import os
import time


def naive_trial(config: dict) -> None:
    flag = "--xla_cpu_enable_concurrency_optimized_scheduler=false"  # avoids a hang: harness/kernel/device.py
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    import jax
    from ray import tune

    import envs
    from algos import ppo

    t0 = time.perf_counter()
    env, params = envs.make("CartPole-v1")
    cfg = ppo.PPOConfig(total_timesteps=config["timesteps"], num_minibatches=4)
    algo = ppo.make(cfg, env, params)
    hp = ppo.PPOHParams.default(**{k: config[k] for k in ("lr", "gamma", "gae_lambda", "clip_eps",
                                                          "ent_coef", "vf_coef")})
    key = jax.random.key(hash(tune.get_context().get_trial_id()) % 2**31)
    state = jax.jit(algo.init)(key, hp)
    chunk = jax.jit(algo.chunk)
    kernel = 0.0
    for i in range(cfg.num_chunks):
        t = time.perf_counter()
        state, m = chunk(state, hp)
        steps = int(m.env_steps[-1])
        if i:
            kernel += time.perf_counter() - t
        if i < cfg.num_chunks - 1:
            tune.report({"score": float(jax.numpy.nanmean(m.episode_return)), "env_steps": steps})
    ev = jax.jit(algo.evaluate)(state, jax.random.fold_in(key, 1))
    tune.report({"score": float(ev.return_mean), "env_steps": steps, "kernel_seconds": kernel,
                 "trial_seconds": time.perf_counter() - t0})
