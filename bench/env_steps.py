"""Environment steps/s with random legal actions: our Snake vs Jumanji's, our CartPole vs gymnax's.

    python bench/env_steps.py [--envs 1 256 4096] [--size 12] [--steps 400000]

Both sides run the same loop in one jitted ``lax.scan``: N parallel envs, automatic reset
(ours: ``Environment.step``; Jumanji: its ``AutoResetWrapper`` keeping the final observation;
gymnax: its own ``step``), actions drawn uniformly among the legal ones (Snake's reverse move is
illegal in both). Compilation is excluded; each configuration runs ``--steps`` env steps
(at least 50 loop iterations). The last lines are the ratios at the largest N.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import _common  # noqa: F401  (sets XLA flags before jax is imported)
import jax
import jax.numpy as jnp
from _common import compile_and_time, timed

import envs


def sample(key: jax.Array, mask: jax.Array) -> jax.Array:
    """One action per row of ``mask [N, A]``, uniform over the legal ones."""
    return jax.random.categorical(key, jnp.where(mask, 0.0, -jnp.inf))


def loop(n: int, iters: int, reset: Callable, step: Callable, mask: Callable) -> Callable:
    """A function of a key running ``iters`` steps of ``n`` envs; returns the reward sum.

    ``step(keys, state, action) -> (state, reward, obs)``.
    """

    def run(key: jax.Array) -> jax.Array:
        state = reset(jax.random.split(key, n))

        def body(state: Any, k: jax.Array) -> tuple[Any, jax.Array]:
            k_act, k_env = jax.random.split(k)
            state, reward, obs = step(jax.random.split(k_env, n), state, sample(k_act, mask(state)))
            # the observation is part of the result, so no side's env work is dead code
            return state, reward.sum() + sum(x.sum() for x in jax.tree.leaves(obs))

        return jax.lax.scan(body, state, jax.random.split(key, iters))[1].sum()

    return run


def ours(name: str, n: int, iters: int, **params: Any) -> Callable:
    env, p = envs.make(name, **params)
    num = env.action_space(p).n

    def reset(keys: jax.Array) -> Any:
        return jax.vmap(env.reset, (0, None))(keys, p)[1]

    def step(keys: jax.Array, state: Any, action: jax.Array) -> tuple[Any, jax.Array]:
        s = jax.vmap(env.step, (0, 0, 0, None))(keys, state, action, p)
        return s.state, s.reward, s.obs

    def mask(state: Any) -> jax.Array:
        m = jax.vmap(env.action_mask, (0, None))(state, p)
        return jnp.ones((n, num), bool) if m is None else m

    return loop(n, iters, reset, step, mask)


def jumanji_snake(n: int, iters: int, size: int) -> Callable:
    import jumanji
    from jumanji.wrappers import AutoResetWrapper

    env = AutoResetWrapper(jumanji.make("Snake-v1", num_rows=size, num_cols=size),
                           next_obs_in_extras=True)

    def reset(keys: jax.Array) -> Any:
        return jax.vmap(env.reset)(keys)

    def step(keys: jax.Array, carry: Any, action: jax.Array) -> tuple[Any, jax.Array]:
        state, ts = jax.vmap(env.step)(carry[0], action)
        return (state, ts), ts.reward, ts.observation.grid

    return loop(n, iters, reset, step, lambda carry: carry[1].observation.action_mask)


def gymnax_cartpole(n: int, iters: int) -> Callable:
    import gymnax

    env, p = gymnax.make("CartPole-v1")

    def reset(keys: jax.Array) -> Any:
        return jax.vmap(env.reset, (0, None))(keys, p)[1]

    def step(keys: jax.Array, state: Any, action: jax.Array) -> tuple[Any, jax.Array]:
        obs, state, reward, _, _ = jax.vmap(env.step, (0, 0, 0, None))(keys, state, action, p)
        return state, reward, obs

    return loop(n, iters, reset, step, lambda state: jnp.ones((n, 2), bool))


def measure(label: str, n: int, iters: int, fn: Callable) -> float:
    key = jax.random.key(0)
    compiled, compile_s = compile_and_time(fn, key)
    timed(lambda: compiled(key))  # warm-up
    _, run_s = min((timed(lambda: compiled(key)) for _ in range(3)), key=lambda r: r[1])
    sps = n * iters / run_s
    print(f"{label:<16} envs={n:<5} compile {compile_s:5.1f}s  {sps:>14,.0f} steps/s", flush=True)
    return sps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 256, 4096])
    ap.add_argument("--size", type=int, default=12, help="Snake board side (Jumanji's default 12)")
    ap.add_argument("--steps", type=int, default=400_000, help="env steps per measurement")
    args = ap.parse_args()
    print(f"device: {jax.devices()[0].device_kind}; Snake {args.size}x{args.size}")
    rows = {}
    for n in args.envs:
        iters = max(50, args.steps // n)
        rows["snake us", n] = measure("snake us", n, iters, ours("Snake-v1", n, iters, size=args.size))
        rows["snake jumanji", n] = measure("snake jumanji", n, iters, jumanji_snake(n, iters, args.size))
        rows["cartpole us", n] = measure("cartpole us", n, iters, ours("CartPole-v1", n, iters))
        rows["cartpole gymnax", n] = measure("cartpole gymnax", n, iters, gymnax_cartpole(n, iters))
    for n in args.envs:
        print(f"envs={n}: snake us/jumanji {rows['snake us', n] / rows['snake jumanji', n]:.2f}, "
              f"cartpole us/gymnax {rows['cartpole us', n] / rows['cartpole gymnax', n]:.2f}")
    n = max(args.envs)
    print(f"ratio snake us/jumanji: {rows['snake us', n] / rows['snake jumanji', n]:.2f}")
    print(f"ratio cartpole us/gymnax: {rows['cartpole us', n] / rows['cartpole gymnax', n]:.2f}")


if __name__ == "__main__":
    main()
