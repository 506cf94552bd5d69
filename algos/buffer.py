"""A uniform replay buffer held in device memory, as a pytree of fixed-size arrays."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class ReplayBuffer:
    """A ring of ``capacity`` transitions; ``data`` leaves are ``[capacity, ...]``."""

    data: Any
    ptr: jax.Array  # [] int32 next row to write
    size: jax.Array  # [] int32 rows filled

    @classmethod
    def create(cls, example: Any, capacity: int) -> ReplayBuffer:
        """An empty buffer shaped like one transition ``example`` (no batch axis)."""
        data = jax.tree.map(lambda x: jnp.zeros((capacity, *jnp.shape(x)), jnp.asarray(x).dtype),
                            example)
        return cls(data, jnp.int32(0), jnp.int32(0))

    @property
    def capacity(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[0]

    def add(self, batch: Any) -> ReplayBuffer:
        """Writes a batch ``[B, ...]`` of transitions (B must divide the capacity)."""
        n = jax.tree.leaves(batch)[0].shape[0]
        data = jax.tree.map(
            lambda buf, x: jax.lax.dynamic_update_slice_in_dim(buf, x.astype(buf.dtype),
                                                               self.ptr, 0),
            self.data, batch)
        return ReplayBuffer(data, (self.ptr + n) % self.capacity,
                            jnp.minimum(self.size + n, self.capacity))

    def sample(self, key: jax.Array, batch_size: int) -> Any:
        """``batch_size`` transitions drawn uniformly (with replacement) from the filled rows."""
        idx = jax.random.randint(key, (batch_size,), 0, self.size)
        return jax.tree.map(lambda x: x[idx], self.data)
