"""Networks shared by every algorithm: an MLP torso, PPO's actor-critic, SAC's actor and twin Q."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Activation = Literal["tanh", "relu"]
ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}  # the names a config may give


@jax.custom_batching.sequential_vmap
def _orthonormal_columns_lapack(z: jax.Array) -> jax.Array:
    """``Q`` of ``z = QR`` (``z`` ``[m, n]``, ``m >= n``) with ``R``'s diagonal made positive, as
    ``jax.random.orthogonal`` computes it; under ``vmap`` one matrix at a time (a loop), never
    LAPACK's batched QR, which deadlocked SAC's vmapped init on jumanji:SearchAndRescue-v0
    (jaxlib 0.10, CPU)."""
    q, r = jnp.linalg.qr(z)
    return q * jnp.sign(jnp.diagonal(r))[None, :]


_EXACT = jax.lax.Precision.HIGHEST  # float32 products on a GPU (its default may use TF32)


def _orthonormal_columns_householder(z: jax.Array) -> jax.Array:
    """The same ``Q`` (to float rounding) by Householder reflections in plain jnp: ``n`` steps of
    matrix-vector work that ``vmap`` batches, where the solver's QR is one call per matrix: on a
    GPU those calls run as a loop over the lanes, which dominated a many-seed init."""
    m, n = z.shape
    rows = jnp.arange(m)

    def reflect(j: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]) -> tuple:
        r, vs, signs = carry
        x = jnp.where(rows >= j, r[:, j], 0.0)
        alpha = -jnp.where(x[j] < 0, -1.0, 1.0) * jnp.linalg.norm(x)  # R[j, j]: no cancellation
        v = x.at[j].add(-alpha)
        v = v / jnp.maximum(jnp.linalg.norm(v), jnp.finfo(z.dtype).tiny)
        r = r - 2.0 * jnp.outer(v, jnp.dot(v, r, precision=_EXACT))
        return r, vs.at[j].set(v), signs.at[j].set(jnp.where(alpha < 0, -1.0, 1.0))

    _, vs, signs = jax.lax.fori_loop(0, n, reflect, (z, jnp.zeros((n, m), z.dtype), jnp.ones(n, z.dtype)))
    def apply(i: jax.Array, q: jax.Array) -> jax.Array:  # H_1 ... H_n applied to I[:, :n], last first
        v = vs[n - 1 - i]
        return q - 2.0 * jnp.outer(v, jnp.dot(v, q, precision=_EXACT))

    q = jax.lax.fori_loop(0, n, apply, jnp.eye(m, n, dtype=z.dtype))
    return q * signs


def _orthonormal_columns(z: jax.Array) -> jax.Array:
    """On a CPU, flax's QR bit for bit (LAPACK, one matrix at a time); elsewhere (a GPU) the
    Householder version, batched over the lanes."""
    return jax.lax.platform_dependent(z, cpu=_orthonormal_columns_lapack,
                                      default=_orthonormal_columns_householder)


def orthogonal(scale: float = 1.0) -> nn.initializers.Initializer:
    """``nn.initializers.orthogonal(scale)`` for 2-D kernels: on a CPU bit for bit (the same normal
    draw and QR), on a GPU the same matrix to float rounding (:func:`_orthonormal_columns`)."""

    def init(key: jax.Array, shape: Sequence[int], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        if len(shape) != 2:
            raise ValueError(f"orthogonal: a 2-D kernel shape, got {tuple(shape)}")
        rows, cols = shape
        q = _orthonormal_columns(jax.random.normal(key, (max(rows, cols), min(rows, cols)), dtype))
        return jnp.asarray(scale, dtype) * (q.T if rows < cols else q)

    return init


def dense(features: int, scale: float = np.sqrt(2)) -> nn.Dense:
    return nn.Dense(features, kernel_init=orthogonal(scale))


class MLP(nn.Module):
    """Dense layers with an activation after each; the last layer's output is returned."""

    hidden: Sequence[int]
    activation: Activation = "tanh"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = ACTIVATIONS[self.activation](dense(width)(x))
        return x


Network = Literal["mlp", "transformer"]


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (PPO).

    Returns ``(policy_out, log_std, value)``: logits ``[A]`` and ``log_std=None`` for discrete
    actions; for continuous ones the Gaussian mean ``[A]`` and a state-independent log-std.
    Observations of ``obs_ndim`` dimensions (e.g. a grid ``[H, W, F]``) are flattened.
    """

    action_dim: int
    discrete: bool
    hidden: Sequence[int] = (64, 64)
    activation: Activation = "tanh"
    obs_ndim: int = 1

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array | None, jax.Array]:
        obs = obs.reshape(*obs.shape[: obs.ndim - self.obs_ndim], -1)
        pi = dense(self.action_dim, 0.01)(MLP(self.hidden, self.activation)(obs))
        value = dense(1, 1.0)(MLP(self.hidden, self.activation)(obs))
        log_std = None
        if not self.discrete:
            log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        return pi, log_std, value[..., 0]


class CellTransformer(nn.Module):
    """Pre-norm transformer encoder over a set of cells ``[..., L, F]`` -> pooled ``[..., 2D]``.

    Each cell's features are embedded and a learned position embedding (one per cell) added;
    the output is the mean and max over cells of the last layer.
    """

    embed_dim: int = 32
    num_heads: int = 2
    num_layers: int = 2

    @nn.compact
    def __call__(self, cells: jax.Array) -> jax.Array:
        pos = self.param("position", nn.initializers.normal(0.02), cells.shape[-2:-1] + (self.embed_dim,))
        x = nn.Dense(self.embed_dim)(cells) + pos
        for _ in range(self.num_layers):
            y = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads)(y, y)
            y = nn.LayerNorm()(x)
            x = x + nn.Dense(self.embed_dim)(nn.relu(nn.Dense(2 * self.embed_dim)(y)))
        x = nn.LayerNorm()(x)
        return jnp.concatenate([x.mean(-2), x.max(-2)], axis=-1)


class TransformerActorCritic(nn.Module):
    """A :class:`CellTransformer` torso shared by a policy head and a value head (discrete).

    ``obs`` is a grid ``[..., *cells, F]`` (``obs_ndim`` dims, e.g. ``[H, W, F]``) whose cells
    become the transformer's tokens; with ``patch`` > 1 (a 2-D grid), each ``patch x patch`` square
    of cells is one token (attention's cost falls with the square of the tokens). Returns
    ``(logits, None, value)`` like :class:`ActorCritic`.
    """

    action_dim: int
    obs_ndim: int = 3
    embed_dim: int = 32
    num_heads: int = 2
    num_layers: int = 2
    head_hidden: int = 64
    patch: int = 1

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, None, jax.Array]:
        lead = obs.shape[: obs.ndim - self.obs_ndim]
        if self.patch > 1:  # [..., H, W, F] -> [..., H/p * W/p, p * p * F]
            h, w, f, p = *obs.shape[-3:], self.patch
            squares = jnp.moveaxis(obs.reshape(*lead, h // p, p, w // p, p, f), -4, -3)
            cells = squares.reshape(*lead, (h // p) * (w // p), p * p * f)
        else:
            cells = obs.reshape(*lead, -1, obs.shape[-1])
        h = CellTransformer(self.embed_dim, self.num_heads, self.num_layers)(cells)
        pi = dense(self.action_dim, 0.01)(nn.relu(dense(self.head_hidden)(h)))
        value = dense(1, 1.0)(nn.relu(dense(self.head_hidden)(h)))
        return pi, None, value[..., 0]


def ppo_distribution(
    policy_out: jax.Array, log_std: jax.Array | None, mask: jax.Array | None = None
) -> distrax.Distribution:
    """A categorical over logits (illegal actions, where ``mask`` is False, get probability 0),
    or a diagonal Gaussian with the given log-std."""
    if log_std is None:
        logits = policy_out if mask is None else jnp.where(mask, policy_out, -1e9)
        return distrax.Categorical(logits=logits)
    return distrax.MultivariateNormalDiag(policy_out, jnp.exp(log_std) * jnp.ones_like(policy_out))


class SACActor(nn.Module):
    """A tanh-squashed Gaussian policy; actions lie in ``[-1, 1]^A``."""

    action_dim: int
    hidden: Sequence[int] = (256, 256)
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = MLP(self.hidden, "relu")(obs)
        mean = nn.Dense(self.action_dim)(x)
        log_std = jnp.clip(nn.Dense(self.action_dim)(x), self.log_std_min, self.log_std_max)
        return mean, log_std


def squashed_gaussian(mean: jax.Array, log_std: jax.Array) -> distrax.Distribution:
    base = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))
    return distrax.Transformed(base, distrax.Block(distrax.Tanh(), ndims=1))


class TwinQ(nn.Module):
    """Two independent Q-networks evaluated at once: returns ``[2, ...]``."""

    hidden: Sequence[int] = (256, 256)

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        ensemble = nn.vmap(
            _QNet,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=None,
            out_axes=0,
            axis_size=2,
        )
        return ensemble(self.hidden)(obs, action)


class _QNet(nn.Module):
    hidden: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = MLP(self.hidden, "relu")(jnp.concatenate([obs, action], axis=-1))
        return nn.Dense(1)(x)[..., 0]
