"""PQN (parallel Q-learning; Gallici et al., 2024) for discrete actions, as pure functions.

Q-learning without a replay buffer or a target network: ``num_envs`` environments act
epsilon-greedily for ``num_steps`` steps, the rollout's Q(lambda) returns are the targets, and a
LayerNorm MLP is fitted to them for ``update_epochs`` epochs of ``num_minibatches`` minibatches.
Every searchable hyperparameter is a float32 leaf of :class:`PQNHParams`, so one compiled kernel
serves any of their values over configurations and seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from algos.common import (
    FRACTION,
    POSITIVE,
    Algo,
    EpisodeTracker,
    EvalMetrics,
    Finished,
    Range,
    RolloutShape,
    adam,
    evaluate_policy,
    finished_means,
    float32_hparams,
    is_diverged,
    require_layers,
    require_positive,
    track_episodes,
)
from algos.networks import dense
from algos.normalize import RunningStats, policy_of, split_policy
from envs import Discrete, Environment


@dataclasses.dataclass(frozen=True)
class PQNConfig(RolloutShape):
    """Static settings: anything that changes a shape, a loop count or the code path."""

    num_envs: int = 16
    num_steps: int = 128
    num_minibatches: int = 16
    update_epochs: int = 5
    total_timesteps: int = 500_000
    updates_per_chunk: int = 8
    hidden: tuple[int, ...] = (64, 64)
    layer_norm: bool = True  # PQN's stabiliser in place of a target network
    use_action_mask: bool = True  # False: ignore the env's action mask (for comparison)
    normalize_observations: bool = False
    anneal_lr: bool = True
    eval_episodes: int = 16
    divergence_loss: float = 1e7  # |loss| above this (or non-finite) marks a run diverged

    def __post_init__(self) -> None:
        require_positive(self, "num_envs", "num_steps", "num_minibatches", "update_epochs",
                         "updates_per_chunk", "eval_episodes")
        require_layers(self)
        self.check_shape()


@struct.dataclass
class PQNHParams:
    """Traced hyperparameters: float32 scalars (or ``[C]`` when batched over configurations)."""

    lr: jax.Array
    gamma: jax.Array
    td_lambda: jax.Array
    max_grad_norm: jax.Array
    eps_start: jax.Array  # epsilon falls linearly from eps_start to eps_end ...
    eps_end: jax.Array
    exploration_fraction: jax.Array  # ... over this fraction of total_timesteps, then stays
    reward_scale: jax.Array  # rewards are multiplied by it for learning (returns are reported unscaled)

    RANGES: ClassVar[dict[str, Range]] = dict(
        lr=POSITIVE, gamma=FRACTION, td_lambda=FRACTION, max_grad_norm=POSITIVE, eps_start=FRACTION,
        eps_end=FRACTION, exploration_fraction=Range(0.0, 1.0, low_open=True), reward_scale=POSITIVE)

    @classmethod
    def default(cls, **overrides: float) -> PQNHParams:
        defaults = dict(lr=1e-3, gamma=0.99, td_lambda=0.9, max_grad_norm=10.0, eps_start=1.0,
                        eps_end=0.05, exploration_fraction=0.5, reward_scale=1.0)
        return float32_hparams(cls, defaults, overrides)


class QNetwork(nn.Module):
    """An MLP with LayerNorm before each ReLU, one Q-value per action; grid observations are flattened."""

    action_dim: int
    hidden: Sequence[int] = (64, 64)
    layer_norm: bool = True
    obs_ndim: int = 1

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.reshape(*obs.shape[: obs.ndim - self.obs_ndim], -1)
        for width in self.hidden:
            x = dense(width)(x)
            x = nn.relu(nn.LayerNorm()(x) if self.layer_norm else x)
        return dense(self.action_dim, 1.0)(x)


@struct.dataclass
class PQNState:
    params: Any
    opt_state: Any
    env_state: Any  # leaves [N, ...]
    obs: jax.Array  # [N, *obs_shape]
    tracker: EpisodeTracker
    key: jax.Array
    update: jax.Array  # [] int32 updates done
    diverged: jax.Array  # [] bool, sticky
    obs_stats: RunningStats | None = None  # with normalize_observations


class PQNMetrics(NamedTuple):
    """One row per update (stacked to ``[K]`` by ``chunk``)."""

    env_steps: jax.Array  # per seed, cumulative
    episode_return: jax.Array  # mean over episodes finished in this update; NaN if none
    episode_length: jax.Array
    episodes: jax.Array
    loss: jax.Array
    q_mean: jax.Array  # mean Q of the actions taken
    epsilon: jax.Array
    diverged: jax.Array
    illegal_actions: jax.Array  # fraction of this update's actions the env's mask forbade (0: no mask)


class _Traj(NamedTuple):
    obs: jax.Array  # [T, N, ...]
    action: jax.Array
    mask: jax.Array | None  # [T, N, A] legal actions, or None
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array
    final_obs: jax.Array  # the observation the step reached (before an auto-reset)


def q_lambda_returns(reward: jax.Array, next_q: jax.Array, terminated: jax.Array, done: jax.Array,
                     gamma: jax.Array, lam: jax.Array) -> jax.Array:
    """Q(lambda) targets ``[T, N]``: ``G_t = r_t + gamma (1 - term_t) (lam G_{t+1} + (1 - lam) next_q_t)``,
    where ``next_q_t`` is the greedy value of the state step t reached. Where an episode ended by time
    (done, not terminated) the next step is another episode's, so ``G_t`` bootstraps from ``next_q_t`` alone;
    the last step has no successor and does the same."""

    def back(g_next: jax.Array, t: tuple) -> tuple[jax.Array, jax.Array]:
        r, q, term, d = t
        boot = jnp.where(d, q, lam * g_next + (1.0 - lam) * q)
        g = r + gamma * (1.0 - term) * boot
        return g, g

    _, returns = jax.lax.scan(back, next_q[-1], (reward, next_q, terminated.astype(jnp.float32), done),
                              reverse=True)
    return returns


def make(config: PQNConfig, env: Environment, env_params: Any) -> Algo:
    """Builds PQN's pure functions for one environment and static config.

    Raises:
        ValueError: the env's actions are not a single ``Discrete`` choice.
    """
    space = env.action_space(env_params)
    if not isinstance(space, Discrete):
        raise ValueError(f"PQN needs discrete actions; {env.name} has {space}")
    obs_shape = env.observation_space(env_params).shape
    net = QNetwork(space.n, config.hidden, config.layer_norm, obs_ndim=len(obs_shape))
    step_envs = jax.vmap(env.step, (0, 0, 0, None))
    reset_envs = jax.vmap(env.reset, (0, None))
    env_masks = jax.vmap(env.action_mask, (0, None))
    n = config.num_envs

    def q_values(params: Any, stats: RunningStats | None, obs: jax.Array) -> jax.Array:
        return net.apply(params, obs if stats is None else stats.normalize(obs))

    def greedy(q: jax.Array, mask: jax.Array | None) -> jax.Array:
        return jnp.argmax(q if mask is None else jnp.where(mask, q, -jnp.inf), -1)

    def best_value(q: jax.Array, mask: jax.Array | None) -> jax.Array:
        return jnp.max(q, -1) if mask is None else jnp.max(q, -1, where=mask, initial=-jnp.inf)

    def policy_mask(env_state: Any) -> tuple[jax.Array | None, jax.Array | None]:
        mask = env_masks(env_state, env_params)
        return (mask if config.use_action_mask else None), mask

    def epsilon(hp: PQNHParams, update: jax.Array) -> jax.Array:
        steps = (update * config.batch_size).astype(jnp.float32)
        span = jnp.maximum(hp.exploration_fraction * config.total_timesteps, 1.0)
        return hp.eps_end + (hp.eps_start - hp.eps_end) * jnp.clip(1.0 - steps / span, 0.0, 1.0)

    def optimizer(hp: PQNHParams) -> optax.GradientTransformation:
        lr: Any = hp.lr
        if config.anneal_lr:
            lr = optax.linear_schedule(hp.lr, 0.0, config.num_updates * config.update_epochs
                                       * config.num_minibatches)
        return adam(lr, hp.max_grad_norm)

    def init(key: jax.Array, hp: PQNHParams) -> PQNState:
        k_net, k_env, k_run = jax.random.split(key, 3)
        params = net.init(k_net, jnp.zeros(obs_shape))
        obs, env_state = reset_envs(jax.random.split(k_env, n), env_params)
        stats = RunningStats.empty(obs_shape) if config.normalize_observations else None
        return PQNState(params, optimizer(hp).init(params), env_state, obs, EpisodeTracker.zeros(n), k_run,
                        jnp.int32(0), jnp.bool_(False), stats)

    def rollout(state: PQNState, eps: jax.Array) -> tuple[PQNState, _Traj, Finished, jax.Array]:
        def one_step(carry: PQNState, key: jax.Array) -> tuple[PQNState, tuple]:
            k_act, k_mask, k_env = jax.random.split(key, 3)
            q = q_values(carry.params, carry.obs_stats, carry.obs)
            mask, env_mask = policy_mask(carry.env_state)
            u = jax.random.uniform(k_act, (2, n))  # one draw for both: each random call is a loop on a CPU
            if mask is None:
                random = jnp.minimum((u[1] * space.n).astype(jnp.int32), space.n - 1)
            else:  # uniform over the legal actions
                random = jax.random.categorical(k_mask, jnp.where(mask, 0.0, -jnp.inf))
            action = jnp.where(u[0] < eps, random, greedy(q, mask))
            illegal = (jnp.float32(0.0) if env_mask is None
                       else 1.0 - jnp.take_along_axis(env_mask, action[:, None], -1).mean())
            s = step_envs(jax.random.split(k_env, n), carry.env_state, action, env_params)
            tracker, fin = track_episodes(carry.tracker, s.reward, s.done)
            tr = _Traj(carry.obs, action, mask, s.reward, s.terminated, s.done, s.final_obs)
            return carry.replace(env_state=s.state, obs=s.obs, tracker=tracker), (tr, fin, illegal)

        key, k_roll = jax.random.split(state.key)
        state, (traj, fin, illegal) = jax.lax.scan(
            one_step, state.replace(key=key), jax.random.split(k_roll, config.num_steps))
        return state, traj, Finished(*(jnp.sum(x) for x in fin)), jnp.mean(illegal)

    def loss_fn(params: Any, batch: tuple, stats: RunningStats | None) -> tuple[jax.Array, jax.Array]:
        obs, action, target = batch
        q = jnp.take_along_axis(q_values(params, stats, obs), action[:, None], -1)[:, 0]
        return 0.5 * jnp.mean((q - target) ** 2), jnp.mean(q)

    def epoch(carry: tuple, key: jax.Array, hp: PQNHParams, flat: tuple,
              stats: RunningStats | None) -> tuple[tuple, tuple]:
        perm = jax.random.permutation(key, config.batch_size)

        def minibatch(c: tuple, idx: jax.Array) -> tuple[tuple, tuple]:
            p, o = c
            (loss, q_mean), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                p, jax.tree.map(lambda x: x[idx], flat), stats)  # gathered here: no shuffled copy of the batch
            updates, o = optimizer(hp).update(grads, o, p)
            return (optax.apply_updates(p, updates), o), (loss, q_mean)

        return jax.lax.scan(minibatch, carry, perm.reshape(config.num_minibatches, config.minibatch_size))

    def update(state: PQNState, hp: PQNHParams) -> tuple[PQNState, PQNMetrics]:
        eps = epsilon(hp, state.update)
        state, traj, fin, illegal = rollout(state, eps)
        final_mask, _ = policy_mask(state.env_state)
        # the legal actions of the state each step reached: the next step's (after an auto-reset
        # the reset state's, an approximation only where an episode was cut by time)
        next_mask = None if traj.mask is None else jnp.concatenate([traj.mask[1:], final_mask[None]])
        next_q = best_value(q_values(state.params, state.obs_stats, traj.final_obs), next_mask)
        targets = q_lambda_returns(traj.reward * hp.reward_scale, next_q, traj.terminated, traj.done,
                                   hp.gamma, hp.td_lambda)
        stats = None if state.obs_stats is None else state.obs_stats.update(traj.obs)
        flat = jax.tree.map(lambda x: x.reshape(config.batch_size, *x.shape[2:]),
                            (traj.obs, traj.action, jax.lax.stop_gradient(targets)))
        key, k_epochs = jax.random.split(state.key)
        (params, opt_state), (loss, q_mean) = jax.lax.scan(
            lambda c, k: epoch(c, k, hp, flat, stats), (state.params, state.opt_state),
            jax.random.split(k_epochs, config.update_epochs))
        loss, q_mean = jnp.mean(loss), jnp.mean(q_mean)
        diverged = state.diverged | is_diverged([loss], params, config.divergence_loss)
        ep_return, ep_length = finished_means(fin)
        update_idx = state.update + 1
        state = state.replace(params=params, opt_state=opt_state, key=key, update=update_idx,
                              diverged=diverged, obs_stats=stats)
        return state, PQNMetrics(update_idx * config.batch_size, ep_return, ep_length, fin.count, loss, q_mean,
                                 eps, diverged, illegal)

    def chunk(state: PQNState, hp: PQNHParams) -> tuple[PQNState, PQNMetrics]:
        return jax.lax.scan(lambda s, _: update(s, hp), state, None, length=config.updates_per_chunk)

    def policy_params(state: PQNState) -> Any:
        return policy_of(state.params, state.obs_stats)

    def act(policy: Any, obs: jax.Array, mask: jax.Array | None = None, key: jax.Array | None = None) -> jax.Array:
        q = q_values(*split_policy(policy, config.normalize_observations), obs)
        return greedy(q, mask if config.use_action_mask else None)

    def evaluate(state: PQNState, key: jax.Array, num_episodes: int | None = None) -> EvalMetrics:
        return evaluate_policy(env, env_params, lambda o, m, k: act(policy_params(state), o, m), key,
                               num_episodes or config.eval_episodes)

    learner = ("params", "opt_state", "diverged") + (("obs_stats",) if config.normalize_observations else ())
    return Algo(init, chunk, evaluate, act, policy_params, learner)
