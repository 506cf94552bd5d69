"""SAC for continuous actions: twin critics, Polyak-averaged targets, a learned temperature,
a device-resident replay buffer and many parallel environments.

``init`` fills the buffer with ``config.learning_starts`` uniformly random steps; each
iteration of ``chunk`` then takes one step in every environment and makes
``config.updates_per_step`` gradient updates. Actions are squashed to ``[-1, 1]`` and scaled to
the environment's bounds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from algos.buffer import ReplayBuffer
from algos.common import (
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    Algo,
    EpisodeTracker,
    EvalMetrics,
    Range,
    adam,
    evaluate_policy,
    finished_means,
    float32_hparams,
    is_diverged,
    require_layers,
    require_positive,
    track_episodes,
)
from algos.networks import SACActor, TwinQ, squashed_gaussian
from envs import Box, Environment


@dataclasses.dataclass(frozen=True)
class SACConfig:
    """Static settings: shapes, loop counts, architecture."""

    num_envs: int = 4
    buffer_size: int = 100_000
    batch_size: int = 256
    learning_starts: int = 1_000
    updates_per_step: int = 4  # gradient updates per step of all num_envs envs
    total_timesteps: int = 20_000
    steps_per_chunk: int = 250  # iterations (vectorized env steps) per chunk
    hidden: tuple[int, ...] = (256, 256)
    eval_episodes: int = 8
    divergence_loss: float = 1e7  # |loss| above this (or non-finite) marks a run diverged

    def __post_init__(self) -> None:
        require_positive(self, "num_envs", "batch_size", "updates_per_step", "steps_per_chunk",
                         "eval_episodes")
        require_layers(self)
        if self.buffer_size % self.num_envs:
            raise ValueError(f"num_envs={self.num_envs} must divide buffer_size={self.buffer_size}")
        if self.warmup_steps * self.num_envs > self.buffer_size:
            raise ValueError("learning_starts must not exceed buffer_size")
        if self.num_iterations < 1:
            raise ValueError(f"total_timesteps={self.total_timesteps} leaves no step to learn from after the "
                             f"random warm-up (learning_starts={self.learning_starts}, {self.num_envs} envs)")

    @property
    def warmup_steps(self) -> int:
        """Vectorized random steps taken by ``init`` (at least one, so the buffer is never empty)."""
        return max(1, -(-self.learning_starts // self.num_envs))

    @property
    def num_iterations(self) -> int:
        return max(0, self.total_timesteps // self.num_envs - self.warmup_steps)

    @property
    def num_chunks(self) -> int:
        return -(-self.num_iterations // self.steps_per_chunk)

    def env_steps_after(self, chunks: int) -> int:
        """Env steps per seed once ``chunks`` chunks have run (random warm-up steps included)."""
        return (self.warmup_steps + chunks * self.steps_per_chunk) * self.num_envs


@struct.dataclass
class SACHParams:
    """Traced hyperparameters (float32)."""

    actor_lr: jax.Array
    critic_lr: jax.Array
    alpha_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array
    target_entropy_scale: jax.Array  # target entropy = -scale * action_dim
    init_alpha: jax.Array

    # alpha_lr=0 keeps the temperature at init_alpha; a negative entropy scale targets a positive entropy
    RANGES: ClassVar[dict[str, Range]] = dict(
        actor_lr=POSITIVE, critic_lr=POSITIVE, alpha_lr=NON_NEGATIVE, gamma=FRACTION,
        tau=Range(0.0, 1.0, low_open=True), target_entropy_scale=Range(-math.inf, math.inf, True, True),
        init_alpha=POSITIVE)

    @classmethod
    def default(cls, **overrides: float) -> SACHParams:
        defaults = dict(actor_lr=3e-4, critic_lr=1e-3, alpha_lr=3e-4, gamma=0.99, tau=0.005,
                        target_entropy_scale=1.0, init_alpha=1.0)
        return float32_hparams(cls, defaults, overrides)


class _Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array  # in [-1, 1]
    reward: jax.Array
    next_obs: jax.Array  # the observation reached (final_obs), for bootstrapping
    terminated: jax.Array


@struct.dataclass
class SACState:
    actor: Any
    critic: Any
    target_critic: Any
    log_alpha: jax.Array  # []
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any
    buffer: ReplayBuffer
    env_state: Any  # leaves [N, ...]
    obs: jax.Array  # [N, *obs_shape]
    tracker: EpisodeTracker
    key: jax.Array
    env_steps: jax.Array  # [] int32 per seed
    diverged: jax.Array  # [] bool, sticky


class SACMetrics(NamedTuple):
    """One row per iteration (stacked to ``[K]`` by ``chunk``)."""

    env_steps: jax.Array
    episode_return: jax.Array  # mean over episodes finished at this step; NaN if none
    episode_length: jax.Array
    episodes: jax.Array
    critic_loss: jax.Array
    actor_loss: jax.Array
    alpha: jax.Array
    entropy: jax.Array
    diverged: jax.Array


def make(config: SACConfig, env: Environment, env_params: Any) -> Algo:
    """Builds SAC's pure functions for one continuous-action environment."""
    space = env.action_space(env_params)
    if not isinstance(space, Box):
        raise ValueError(f"SAC needs continuous actions; {env.name} has {space}")
    action_dim = space.shape[0]
    obs_shape = env.observation_space(env_params).shape  # once, outside any trace
    actor, critic = SACActor(action_dim, config.hidden), TwinQ(config.hidden)
    step_envs = jax.vmap(env.step, (0, 0, 0, None))
    n = config.num_envs

    def scale(a: jax.Array) -> jax.Array:
        return space.low + (a + 1.0) * 0.5 * (space.high - space.low)

    def policy(params: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean, log_std = actor.apply(params, obs)
        return squashed_gaussian(mean, log_std).sample_and_log_prob(seed=key)

    def env_step(state: SACState, action: jax.Array, key: jax.Array) -> tuple[SACState, Any]:
        s = step_envs(jax.random.split(key, n), state.env_state, scale(action), env_params)
        tracker, fin = track_episodes(state.tracker, s.reward, s.done)
        buffer = state.buffer.add(_Transition(state.obs, action, s.reward, s.final_obs,
                                              s.terminated))
        state = state.replace(env_state=s.state, obs=s.obs, tracker=tracker, buffer=buffer,
                              env_steps=state.env_steps + n)
        return state, fin

    def init(key: jax.Array, hp: SACHParams) -> SACState:
        k_a, k_c, k_env, k_warm, k_run = jax.random.split(key, 5)
        obs0, act0 = jnp.zeros(obs_shape), jnp.zeros(action_dim)
        actor_p, critic_p = actor.init(k_a, obs0), critic.init(k_c, obs0, act0)
        log_alpha = jnp.log(hp.init_alpha)
        example = _Transition(obs0, act0, jnp.float32(0), obs0, jnp.bool_(False))
        obs, env_state = jax.vmap(env.reset, (0, None))(jax.random.split(k_env, n), env_params)
        state = SACState(
            actor_p, critic_p, critic_p, log_alpha,
            adam(hp.actor_lr).init(actor_p), adam(hp.critic_lr).init(critic_p),
            adam(hp.alpha_lr).init(log_alpha),
            ReplayBuffer.create(example, config.buffer_size), env_state, obs,
            EpisodeTracker.zeros(n), k_run, jnp.int32(0), jnp.bool_(False))

        def warm(s: SACState, k: jax.Array) -> tuple[SACState, None]:
            k_a, k_e = jax.random.split(k)
            action = jax.random.uniform(k_a, (n, action_dim), minval=-1.0, maxval=1.0)
            return env_step(s, action, k_e)[0], None

        state, _ = jax.lax.scan(warm, state, jax.random.split(k_warm, config.warmup_steps))
        return state

    def critic_loss(critic_p: Any, s: SACState, hp: SACHParams, b: _Transition,
                    key: jax.Array) -> jax.Array:
        next_a, next_logp = policy(s.actor, b.next_obs, key)
        next_q = jnp.min(critic.apply(s.target_critic, b.next_obs, next_a), axis=0)
        next_v = next_q - jnp.exp(s.log_alpha) * next_logp
        target = b.reward + hp.gamma * (1.0 - b.terminated) * next_v
        q = critic.apply(critic_p, b.obs, b.action)
        return 0.5 * jnp.mean(jnp.sum((q - jax.lax.stop_gradient(target)) ** 2, axis=0))

    def actor_loss(actor_p: Any, s: SACState, b: _Transition, key: jax.Array) -> tuple:
        a, logp = policy(actor_p, b.obs, key)
        q = jnp.min(critic.apply(s.critic, b.obs, a), axis=0)
        return jnp.mean(jnp.exp(s.log_alpha) * logp - q), logp

    def gradient_step(s: SACState, hp: SACHParams, key: jax.Array) -> tuple[SACState, tuple]:
        k_b, k_c, k_a = jax.random.split(key, 3)
        b = s.buffer.sample(k_b, config.batch_size)
        c_loss, c_grads = jax.value_and_grad(critic_loss)(s.critic, s, hp, b, k_c)
        c_upd, critic_opt = adam(hp.critic_lr).update(c_grads, s.critic_opt, s.critic)
        critic_p = optax.apply_updates(s.critic, c_upd)
        s = s.replace(critic=critic_p, critic_opt=critic_opt)
        (a_loss, logp), a_grads = jax.value_and_grad(actor_loss, has_aux=True)(s.actor, s, b, k_a)
        a_upd, actor_opt = adam(hp.actor_lr).update(a_grads, s.actor_opt, s.actor)
        target_entropy = -hp.target_entropy_scale * action_dim
        entropy = -jnp.mean(jax.lax.stop_gradient(logp))
        alpha_grad = entropy - target_entropy  # d/d(log_alpha) of -log_alpha*(logp+target)
        al_upd, alpha_opt = adam(hp.alpha_lr).update(alpha_grad, s.alpha_opt, s.log_alpha)
        target = optax.incremental_update(critic_p, s.target_critic, hp.tau)
        s = s.replace(actor=optax.apply_updates(s.actor, a_upd), actor_opt=actor_opt,
                      log_alpha=optax.apply_updates(s.log_alpha, al_upd), alpha_opt=alpha_opt,
                      target_critic=target)
        return s, (c_loss, a_loss, jnp.exp(s.log_alpha), entropy)

    def iteration(s: SACState, hp: SACHParams) -> tuple[SACState, SACMetrics]:
        key, k_act, k_env, k_upd = jax.random.split(s.key, 4)
        action, _ = policy(s.actor, s.obs, k_act)
        s, fin = env_step(s.replace(key=key), action, k_env)
        s, losses = jax.lax.scan(lambda c, k: gradient_step(c, hp, k), s,
                                 jax.random.split(k_upd, config.updates_per_step))
        losses = [jnp.mean(x) for x in losses]
        diverged = s.diverged | is_diverged(losses, (s.actor, s.critic),
                                                 config.divergence_loss)
        s = s.replace(diverged=diverged)
        ep_return, ep_length = finished_means(fin)
        return s, SACMetrics(s.env_steps, ep_return, ep_length, fin.count, *losses, diverged)

    def chunk(state: SACState, hp: SACHParams) -> tuple[SACState, SACMetrics]:
        return jax.lax.scan(lambda s, _: iteration(s, hp), state, None,
                            length=config.steps_per_chunk)

    def act(actor_params: Any, obs: jax.Array, mask: jax.Array | None = None,
            key: jax.Array | None = None) -> jax.Array:
        return scale(jnp.tanh(actor.apply(actor_params, obs)[0]))

    def evaluate(state: SACState, key: jax.Array, num_episodes: int | None = None) -> EvalMetrics:
        return evaluate_policy(env, env_params, lambda o, m, k: act(state.actor, o), key,
                               num_episodes or config.eval_episodes)

    return Algo(init, chunk, evaluate, act, lambda state: state.actor,
                ("actor", "critic", "target_critic", "log_alpha", "actor_opt", "critic_opt", "alpha_opt",
                 "diverged"))
