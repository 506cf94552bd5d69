"""PPO on a Brax env: rl-harness against Brax's own trainer (brax.training.agents.ppo.train).

Same env (Brax's, here through our adapter), env steps, networks (64x64 tanh actor and critic,
tanh-squashed Gaussian), hyperparameters (lr 1e-3 constant, entropy 1e-3, discount 0.97, GAE 0.95,
clip 0.2, unclipped value loss, reward scale 0.1, observation normalisation, no gradient clipping)
and batch shape (E envs x T steps per update, M minibatches, 4 epochs). Brax runs one
configuration per call; we run 1 configuration and C configurations x 1 seed in one kernel.
Steps/s exclude compilation: ours is compiled ahead of time; Brax's is its last epoch's
``training/sps`` (its first epoch includes compiling). Returns are deterministic-policy
evaluation returns (Brax: ``eval/episode_reward`` with ``deterministic_eval``).

    python bench/brax_ppo.py [--env inverted_pendulum:positional] [--timesteps 300000] [--configs 1 8]
"""

from __future__ import annotations

import argparse
import functools

import _common  # noqa: F401  (sets XLA_FLAGS before jax is imported)
import jax
import jax.numpy as jnp

import envs
from algos import ppo

E, T, M, EPOCHS = 64, 16, 8, 4
HP = dict(lr=1e-3, gamma=0.97, gae_lambda=0.95, clip_eps=0.2, ent_coef=1e-3, vf_coef=0.5, max_grad_norm=1e9,
          reward_scale=0.1)


def run_ours(name: str, timesteps: int, configs: int, episode_length: int) -> dict:
    env, params = envs.make(f"brax:{name}", max_steps=episode_length)
    base = ppo.PPOConfig(num_envs=E, num_steps=T, num_minibatches=M, update_epochs=EPOCHS, anneal_lr=False,
                         normalize_observations=True, squash="tanh", clip_value_loss=False,
                         eval_episodes=8, total_timesteps=timesteps)
    config = ppo.PPOConfig(**{**base.__dict__, "updates_per_chunk": base.num_updates})
    algo = ppo.make(config, env, params)
    hp = jax.tree.map(lambda x: jnp.broadcast_to(x, (configs,)), ppo.PPOHParams.default(**HP))
    keys = jax.random.split(jax.random.key(0), configs)[:, None]
    eval_keys = jax.random.split(jax.random.key(1), configs)[:, None]

    returns, compile_s, run_s = _common.time_whole_run(algo, keys, hp, eval_keys)
    steps = config.num_updates * config.batch_size * configs
    return dict(impl="us", configs=configs, compile_s=compile_s, sps=steps / run_s,
                **{"return": float(jnp.mean(returns))})


def _shim_removed_jax_apis() -> None:
    """Brax 0.14.2's trainer calls ``jax.device_put_replicated``, which JAX 0.10 removed: the
    replacement JAX's migration guide gives (stack one copy per device, then put)."""
    try:
        jax.device_put_replicated  # noqa: B018
    except AttributeError:
        def device_put_replicated(x, devices):
            stacked = jax.tree.map(lambda a: jnp.stack([jnp.asarray(a)] * len(devices)), x)
            return jax.device_put(stacked, devices[0]) if len(devices) == 1 else stacked

        jax.device_put_replicated = device_put_replicated


def run_brax(name: str, timesteps: int, episode_length: int) -> dict:
    _shim_removed_jax_apis()
    from envs.adapters.brax import brax_envs

    registry = brax_envs()  # first: brax.envs without MuJoCo's "Failed to import warp" lines
    from brax.training.agents.ppo import networks as ppo_networks
    from brax.training.agents.ppo import train as brax_ppo

    brax_name, _, backend = name.partition(":")
    env = registry.get_environment(brax_name, **({"backend": backend} if backend else {}))
    seen: list[dict] = []
    networks = functools.partial(ppo_networks.make_ppo_networks, policy_hidden_layer_sizes=(64, 64),
                                 value_hidden_layer_sizes=(64, 64), activation=jax.nn.tanh)
    brax_ppo.train(
        environment=env, num_timesteps=timesteps, episode_length=episode_length, num_envs=E,
        unroll_length=T, batch_size=E // M, num_minibatches=M, num_updates_per_batch=EPOCHS,
        learning_rate=HP["lr"], entropy_cost=HP["ent_coef"], discounting=HP["gamma"],
        gae_lambda=HP["gae_lambda"], clipping_epsilon=HP["clip_eps"], vf_loss_coefficient=HP["vf_coef"],
        reward_scaling=HP["reward_scale"], normalize_observations=True, network_factory=networks,
        num_evals=3, num_eval_envs=8, deterministic_eval=True, seed=0,
        progress_fn=lambda step, metrics: seen.append({k: float(v) for k, v in metrics.items()}))
    sps = [m["training/sps"] for m in seen if "training/sps" in m]
    return dict(impl="brax", configs=1, compile_s=float("nan"), sps=sps[-1],
                **{"return": seen[-1]["eval/episode_reward"]})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="inverted_pendulum:positional", help="Brax env[:backend]")
    p.add_argument("--timesteps", type=int, default=300_000, help="env steps per configuration")
    p.add_argument("--configs", type=int, nargs="+", default=[1, 8], help="configurations per kernel (ours)")
    p.add_argument("--episode-length", type=int, default=1000)
    a = p.parse_args()
    rows = [run_brax(a.env, a.timesteps, a.episode_length)]
    print(rows[-1], flush=True)
    for c in a.configs:
        rows.append(run_ours(a.env, a.timesteps, c, a.episode_length))
        print(rows[-1], flush=True)
    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}; "
          f"brax:{a.env}, {a.timesteps:,} steps per configuration")
    print(f"{'impl':6} {'configs':>8} {'compile_s':>10} {'steps/s':>12} {'return':>9}")
    for r in rows:
        print(f"{r['impl']:6} {r['configs']:>8} {r['compile_s']:>10.2f} {r['sps']:>12,.0f} {r['return']:>9.1f}")
    brax_sps = rows[0]["sps"]
    for r in rows[1:]:
        print(f"ratio us/brax at {r['configs']} configs per kernel: {r['sps'] / brax_sps:.2f}")
    print(f"ratio us/brax: {rows[1]['sps'] / brax_sps:.2f}")


if __name__ == "__main__":
    main()
