"""Running observation statistics kept inside the kernel (one per run), as locomotion PPO needs.

Batches are merged with Chan et al.'s parallel update of mean and variance, so the statistics
after any sequence of batches equal those of all the data at once (up to float32 rounding).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

CLIP = 10.0  # normalised observations are clipped to [-CLIP, CLIP]
EPS = 1e-8


@struct.dataclass
class RunningStats:
    """Mean and (population) variance per observation feature over ``count`` observations."""

    mean: jax.Array  # [*obs_shape] float32
    var: jax.Array  # [*obs_shape] float32
    count: jax.Array  # [] int32

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> RunningStats:
        return cls(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32), jnp.int32(0))

    def update(self, batch: jax.Array) -> RunningStats:
        """The statistics with ``batch`` ``[..., *obs_shape]`` added (leading axes are samples)."""
        x = batch.reshape(-1, *self.mean.shape).astype(jnp.float32)
        n = x.shape[0]
        b_mean, b_var = jnp.mean(x, 0), jnp.var(x, 0)
        total = self.count + n
        w = n / total.astype(jnp.float32)  # the new batch's weight
        delta = b_mean - self.mean
        mean = self.mean + delta * w
        var = self.var * (1.0 - w) + b_var * w + delta**2 * w * (1.0 - w)
        return RunningStats(mean, var, total)

    def normalize(self, obs: jax.Array) -> jax.Array:
        return jnp.clip((obs - self.mean) / jnp.sqrt(self.var + EPS), -CLIP, CLIP)


def policy_of(params: Any, stats: RunningStats | None) -> Any:
    """What a policy acts from: the network's parameters, with the statistics where observations are
    normalised (``{"params", "obs_stats"}``)."""
    return params if stats is None else {"params": params, "obs_stats": stats}


def split_policy(policy: Any, normalized: bool) -> tuple[Any, RunningStats | None]:
    """``(params, stats)`` of a :func:`policy_of` policy, also as restored from msgpack (plain dicts)."""
    if not normalized:
        return policy, None
    s = policy["obs_stats"]
    return policy["params"], s if isinstance(s, RunningStats) else RunningStats(s["mean"], s["var"], s["count"])
