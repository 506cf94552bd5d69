"""Pieces shared by every algorithm: episode bookkeeping, divergence, evaluation, batching."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from envs import Environment


def require_positive(config: Any, *names: str) -> None:
    """Raises ValueError naming the first of ``config``'s fields ``names`` that is below 1."""
    for name in names:
        if getattr(config, name) < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be >= 1, "
                             f"got {getattr(config, name)}")


def require_layers(config: Any) -> None:
    """Raises ValueError unless ``config.hidden`` is a sequence of positive layer widths."""
    hidden = config.hidden
    if not isinstance(hidden, tuple | list) or not all(isinstance(w, int) and w >= 1 for w in hidden):
        raise ValueError(f"{type(config).__name__}.hidden must be layer widths >= 1, got {hidden!r}")


class RolloutShape:
    """What a config of ``num_envs`` x ``num_steps`` rollouts, ``num_minibatches``, ``total_timesteps`` and
    ``updates_per_chunk`` derives from them (PPO, PQN): its batch, updates, chunks and their env steps."""

    num_envs: int
    num_steps: int
    num_minibatches: int
    total_timesteps: int
    updates_per_chunk: int

    def check_shape(self) -> None:
        """Raises ValueError when the minibatches do not divide the batch or the budget is under one update."""
        if self.batch_size % self.num_minibatches:
            raise ValueError(f"num_minibatches={self.num_minibatches} does not divide the batch "
                             f"num_envs*num_steps={self.batch_size}")
        if self.num_updates < 1:
            raise ValueError(f"total_timesteps={self.total_timesteps} is less than one update "
                             f"({self.batch_size} steps)")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size

    @property
    def num_chunks(self) -> int:
        """Chunks needed to cover ``total_timesteps`` (the last may overshoot)."""
        return -(-self.num_updates // self.updates_per_chunk)

    def env_steps_after(self, chunks: int) -> int:
        """Env steps per seed once ``chunks`` chunks have run (what the metrics' ``env_steps`` says)."""
        return chunks * self.updates_per_chunk * self.batch_size


class Range(NamedTuple):
    """Where a traced hyperparameter makes sense: from ``low`` to ``high``, each end included unless
    marked open (``Range(0, math.inf, low_open=True)``: above 0)."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below and math.isfinite(value)

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


POSITIVE = Range(0.0, math.inf, low_open=True, high_open=True)
NON_NEGATIVE = Range(0.0, math.inf, high_open=True)
FRACTION = Range(0.0, 1.0)  # a discount or a GAE lambda


def float32_hparams(cls: type, defaults: dict[str, float], overrides: dict[str, float]) -> Any:
    """``cls`` built from ``defaults`` updated by ``overrides``, every value a float32 scalar."""
    return cls(**{k: jnp.float32(v) for k, v in {**defaults, **overrides}.items()})


@struct.dataclass
class EpisodeTracker:
    """Running return and length of each parallel environment's current episode."""

    returns: jax.Array  # [N] float32
    lengths: jax.Array  # [N] int32

    @classmethod
    def zeros(cls, num_envs: int) -> EpisodeTracker:
        return cls(jnp.zeros(num_envs, jnp.float32), jnp.zeros(num_envs, jnp.int32))


class Finished(NamedTuple):
    """Sums over the episodes that ended in one step of N environments."""

    return_sum: jax.Array  # []
    length_sum: jax.Array  # []
    count: jax.Array  # [] int32


def track_episodes(
    tracker: EpisodeTracker, reward: jax.Array, done: jax.Array
) -> tuple[EpisodeTracker, Finished]:
    """Adds one step's rewards ``[N]``; episodes that ended (``done [N]``) are reported and reset."""
    returns = tracker.returns + reward
    lengths = tracker.lengths + 1
    finished = Finished(
        jnp.sum(jnp.where(done, returns, 0.0)),
        jnp.sum(jnp.where(done, lengths, 0)).astype(jnp.float32),
        jnp.sum(done).astype(jnp.int32),
    )
    return EpisodeTracker(jnp.where(done, 0.0, returns), jnp.where(done, 0, lengths)), finished


def finished_means(f: Finished) -> tuple[jax.Array, jax.Array]:
    """Mean return and length of finished episodes; NaN where none finished. ``f`` summed."""
    count = jnp.maximum(f.count, 1).astype(jnp.float32)
    nan = jnp.float32(jnp.nan)
    return (
        jnp.where(f.count > 0, f.return_sum / count, nan),
        jnp.where(f.count > 0, f.length_sum / count, nan),
    )


def is_diverged(losses: Any, params: Any, max_loss: float) -> jax.Array:
    """True when a loss or a parameter is not finite, or a loss's magnitude exceeds ``max_loss``.

    Adam bounds each step, so a huge learning rate often saturates the network (loss ~1e8)
    without ever producing a NaN; the loss bound catches that too.
    """
    finite = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves((losses, params))]
    small = [jnp.all(jnp.abs(x) <= max_loss) for x in jax.tree.leaves(losses)]
    return ~jnp.all(jnp.stack(finite + small))


def adam(lr: jax.Array | optax.Schedule, max_grad_norm: jax.Array | None = None) -> optax.GradientTransformation:
    """Adam (eps 1e-5), after global-norm clipping when ``max_grad_norm`` is given.

    Hyperparameters may be traced arrays: the optimizer's state layout does not depend on
    their values, so it is rebuilt from the hyperparameters wherever it is needed.
    """
    opt = optax.adam(lr, eps=1e-5)
    return opt if max_grad_norm is None else optax.chain(optax.clip_by_global_norm(max_grad_norm), opt)


class Algo(NamedTuple):
    """An algorithm's pure functions for one env and static config.

    ``init(key, hparams) -> state``; ``chunk(state, hparams) -> (state, metrics [K])``;
    ``evaluate(state, key, num_episodes=None) -> EvalMetrics`` (``num_episodes`` is static: the
    config's ``eval_episodes`` when None); ``act(policy_params, obs, mask=None, key=None) -> env
    action`` (the evaluation policy: deterministic unless the config says to sample, which needs
    ``key``; ``mask`` is the env's action mask where it has one);
    ``policy_params(state)``: what ``act`` needs (what a checkpoint keeps);
    ``learner_fields``: the state's fields that make up the learner (networks, optimizer states,
    the divergence flag), what population-based training copies between configurations.
    """

    init: Callable[..., Any]
    chunk: Callable[..., Any]
    evaluate: Callable[..., Any]
    act: Callable[..., Any]
    policy_params: Callable[..., Any]
    learner_fields: tuple[str, ...] = ()


class EvalMetrics(NamedTuple):
    return_mean: jax.Array  # []
    returns: jax.Array  # [N] one per episode
    lengths: jax.Array  # [N]


def evaluate_policy(
    env: Environment,
    env_params: Any,
    act: Callable[[jax.Array, jax.Array | None, jax.Array], jax.Array],
    key: jax.Array,
    num_episodes: int,
) -> EvalMetrics:
    """Runs ``num_episodes`` episodes in parallel with the policy ``act(obs [N, ...], mask [N, A]
    or None, key)``; ``mask`` is the env's action mask, if it has one; ``key``, fresh each step
    and shared by the batch (a distribution over ``[N, ...]`` draws each row apart), is for a
    policy that samples.

    Each environment plays exactly one episode (at most ``env_params.max_steps`` steps). The
    loop stops once every episode has ended (a ``while_loop``: vmapped, once every lane's have),
    so evaluating a policy whose episodes are short costs only as many steps as they last.
    """
    reset_keys = jax.random.split(jax.random.fold_in(key, 0), num_episodes)
    obs, state = jax.vmap(env.reset, (0, None))(reset_keys, env_params)
    step = jax.vmap(env.step, (0, 0, 0, None))
    masks = jax.vmap(env.action_mask, (0, None))
    step_key = jax.random.fold_in(key, 1)
    act_key = jax.random.fold_in(key, 2)

    def body(carry: tuple) -> tuple:
        t, obs, state, ret, length, active = carry
        action = act(obs, masks(state, env_params), jax.random.fold_in(act_key, t))
        s = step(jax.random.split(jax.random.fold_in(step_key, t), num_episodes), state, action, env_params)
        ret = ret + jnp.where(active, s.reward, 0.0)
        length = length + active.astype(jnp.int32)
        return t + 1, s.obs, s.state, ret, length, active & ~s.done

    def running(carry: tuple) -> jax.Array:
        return (carry[0] < env_params.max_steps) & jnp.any(carry[-1])

    init = (jnp.int32(0), obs, state, jnp.zeros(num_episodes), jnp.zeros(num_episodes, jnp.int32),
            jnp.ones(num_episodes, jnp.bool_))
    _, _, _, ret, length, _ = jax.lax.while_loop(running, body, init)
    return EvalMetrics(jnp.mean(ret), ret, length)


def batched(fn: Callable, *, hparams_argnum: int | None = 1) -> Callable:
    """``vmap(vmap(fn, seeds), configs)``: leaves of state/key args ``[C, S, ...]``, hparams ``[C]``.

    ``hparams_argnum`` names the positional argument holding the hyperparameters, which are
    shared across seeds; every other argument carries both axes.
    """

    def outer(*args: Any) -> Any:
        n = len(args)
        inner_axes = tuple(None if i == hparams_argnum else 0 for i in range(n))
        lanes = jax.tree.leaves([a for i, a in enumerate(args) if i != hparams_argnum])[0].shape[:2]
        if 1 not in lanes:
            return jax.vmap(jax.vmap(fn, in_axes=inner_axes), in_axes=0)(*args)
        # a unit axis is squeezed and vmapped over once: XLA's CPU fusions of a [1, S, ...] or [C, 1, ...]
        # batch run several times slower than of [S, ...] (bench/RESULTS.md, PQN)
        if lanes == (1, 1):
            out = fn(*[jax.tree.map(lambda x, k=(0,) if i == hparams_argnum else (0, 0): x[k], a)
                       for i, a in enumerate(args)])
            return jax.tree.map(lambda x: x[None, None], out)
        axis = 0 if lanes[0] == 1 else 1
        if axis == 0:  # one configuration: its hyperparameters are shared by the seeds
            args = tuple(jax.tree.map(lambda x: x[0], a) for a in args)
            out = jax.vmap(fn, in_axes=inner_axes)(*args)
        else:  # one seed of each configuration
            args = tuple(a if i == hparams_argnum else jax.tree.map(lambda x: x[:, 0], a)
                         for i, a in enumerate(args))
            out = jax.vmap(fn)(*args)
        return jax.tree.map(lambda x: jnp.expand_dims(x, axis), out)

    return outer


def refill_lanes(init: Callable, state: Any, hparams: Any, keys: Any, mask: jax.Array) -> Any:
    """``state`` (leaves ``[C, S, ...]``) with the lanes where ``mask [C]`` is True started afresh:
    ``init(keys, hparams)`` (the batched init: fresh parameters, optimiser state, envs, RNG keys
    and statistics) for those configurations, every other lane as it was. The lane-level
    counterpart of PBT's copy (``algos.pbt``): a traced mask, so one compile serves any refill."""
    fresh = init(keys, hparams)

    def pick(new: jax.Array, old: jax.Array) -> jax.Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (old.ndim - 1)), new, old)

    return jax.tree.map(pick, fresh, state)
