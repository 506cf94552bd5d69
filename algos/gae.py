"""Generalized advantage estimation, shared by every on-policy algorithm."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    done: jax.Array,
    gamma: jax.Array,
    gae_lambda: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets over a rollout.

    Terminated steps do not bootstrap; truncated ones bootstrap from the value of the
    observation the episode actually reached (``next_values`` = V(final_obs)). Either ends
    the advantage's recursion, since the next row belongs to a new episode.

    Args:
        rewards, values, next_values: ``[T, ...]`` float.
        terminated, done: ``[T, ...]`` bool; ``done`` = terminated or truncated.
        gamma, gae_lambda: scalars.

    Returns:
        ``(advantages, targets)``, each ``[T, ...]``; ``targets = advantages + values``.
    """
    not_term = 1.0 - terminated.astype(values.dtype)
    not_done = 1.0 - done.astype(values.dtype)
    deltas = rewards + gamma * next_values * not_term - values

    def back(carry: jax.Array, x: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta, cont = x
        adv = delta + gamma * gae_lambda * cont * carry
        return adv, adv

    _, advantages = jax.lax.scan(
        back, jnp.zeros_like(values[0]), (deltas, not_done), reverse=True
    )
    return advantages, advantages + values
