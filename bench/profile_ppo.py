"""Where PPO-CartPole's time goes: each phase of one update timed alone, 1 seed, on this device.

    python bench/profile_ppo.py [--updates 976]

Phases: env steps with random actions (incl. auto-reset and key splits), the policy forward
pass of the rollout, V(final_obs) + GAE, the shuffle/gather of the batch, and the 16
minibatch gradient steps (forward + backward + Adam). Each is a jitted ``lax.scan`` over
976 updates' worth of that work, so per-op dispatch costs are counted as in the real kernel.
"""

from __future__ import annotations

import argparse

import _common  # noqa: F401
import jax
import jax.numpy as jnp
import optax

import envs
from algos.common import adam
from algos.gae import gae
from algos.networks import ActorCritic, ppo_distribution

N, T, M, E = 4, 128, 4, 4
U = 976  # updates; --updates sets it
env, params = envs.make("CartPole-v1")
net = ActorCritic(2, True, (64, 64), "tanh")
p0 = net.init(jax.random.key(0), jnp.zeros(4))
step = jax.vmap(env.step, (0, 0, 0, None))


def env_only(key):
    _, s = jax.vmap(env.reset, (0, None))(jax.random.split(key, N), params)

    def body(s, k):
        k1, k2 = jax.random.split(k)
        out = step(jax.random.split(k2, N), s, jax.random.randint(k1, (N,), 0, 2), params)
        return out.state, out.obs.sum() + out.done.sum()
    return jax.lax.scan(body, s, jax.random.split(key, U * T))[1].sum()


def forward_only(key):
    obs = jax.random.normal(key, (U * T, N, 4))

    def body(c, o):
        pi, _, v = net.apply(p0, o)
        a = ppo_distribution(pi, None).sample(seed=jax.random.fold_in(key, c.astype(jnp.int32)))
        return c + v.sum() + a.sum(), None
    return jax.lax.scan(body, jnp.float32(0), obs)[0]


def gae_only(key):
    def body(c, k):
        obs = jax.random.normal(k, (T, N, 4))
        _, _, nv = net.apply(p0, obs)
        r = jnp.ones((T, N))
        d = jax.random.bernoulli(k, 0.05, (T, N))
        adv, tgt = gae(r, nv, nv, d, d, 0.99, 0.95)
        return c + adv.sum() + tgt.sum(), None
    return jax.lax.scan(body, jnp.float32(0), jax.random.split(key, U))[0]


def shuffle_only(key):
    batch = jax.random.normal(key, (T, N, 12))

    def body(c, k):
        perm = jax.random.permutation(k, T * N)
        x = batch.reshape(T * N, 12)[perm].reshape(M, T * N // M, 12)
        return c + x[0, 0].sum(), None
    return jax.lax.scan(body, jnp.float32(0), jax.random.split(key, U * E))[0]


def grads_only(key):
    obs = jax.random.normal(key, (T * N // M, 4))
    act = jax.random.randint(key, (T * N // M,), 0, 2)
    tx = adam(2.5e-4, 0.5)

    def loss(p):
        pi, _, v = net.apply(p, obs)
        d = ppo_distribution(pi, None)
        return -(d.log_prob(act) * v).mean() + (v ** 2).mean() - 0.01 * d.entropy().mean()

    def body(c, _):
        p, o = c
        g = jax.grad(loss)(p)
        u, o = tx.update(g, o, p)
        return (optax.apply_updates(p, u), o), None
    return jax.lax.scan(body, (p0, tx.init(p0)), None, length=U * E * M)[0][0]


def main() -> None:
    global U
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=U, help="updates' worth of work per phase")
    U = ap.parse_args().updates
    key = jax.random.key(0)
    total = 0.0
    rows = []
    for name, fn in [("env step (random actions)", env_only), ("policy forward + sample", forward_only),
                     ("V(final_obs) + GAE", gae_only), ("shuffle/gather", shuffle_only),
                     ("grad steps (fwd+bwd+adam)", grads_only)]:
        compiled, _ = _common.compile_and_time(fn, key)
        _, t = _common.timed(lambda: compiled(key))
        rows.append((name, t))
        total += t
    for name, t in rows:
        print(f"{name:28} {t:6.2f}s  {100 * t / total:5.1f}%")
    print(f"{'sum':28} {total:6.2f}s  (one seed, {U * N * T:,} steps)")


if __name__ == "__main__":
    main()
