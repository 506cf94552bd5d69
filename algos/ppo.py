"""PPO for discrete and continuous actions, as pure functions over a static config.

``make(config, env, env_params)`` returns :class:`Algo` with ``init(key, hparams)``,
``chunk(state, hparams)`` (a ``lax.scan`` over ``config.updates_per_chunk`` updates) and
``evaluate(state, key)``. All searchable hyperparameters are float32 leaves of
:class:`PPOHParams`, so one compiled kernel serves any of their values and can be vmapped
over configurations and seeds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal, NamedTuple

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from algos.common import (
    FRACTION,
    NON_NEGATIVE,
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
from algos.gae import gae
from algos.networks import ACTIVATIONS, Activation, ActorCritic, Network, TransformerActorCritic, ppo_distribution
from algos.normalize import RunningStats, policy_of, split_policy
from envs import Box, Discrete, Environment, MultiDiscrete


@dataclasses.dataclass(frozen=True)
class PPOConfig(RolloutShape):
    """Static settings: anything that changes a shape, a loop count or the code path."""

    num_envs: int = 4
    num_steps: int = 128
    num_minibatches: int = 4
    update_epochs: int = 4
    total_timesteps: int = 500_000
    updates_per_chunk: int = 10
    hidden: tuple[int, ...] = (64, 64)
    activation: Activation = "tanh"
    network: Network = "mlp"  # "transformer": attention over grid cells (needs a grid obs)
    embed_dim: int = 32  # transformer only
    num_heads: int = 2
    num_layers: int = 2
    patch: int = 1  # transformer on a 2-D grid: each patch x patch square of cells is one token
    use_action_mask: bool = True  # False: ignore the env's action mask (for comparison)
    normalize_observations: bool = False  # running mean/var per run, updated from each rollout
    squash: Literal["clip", "tanh"] = "clip"  # continuous actions: a Gaussian clipped to the box,
    # or tanh-squashed into it
    anneal_lr: bool = True
    normalize_advantages: bool = True
    clip_value_loss: bool = True  # PPO's clipped value loss; off for large returns (it moves V by at
    # most clip_eps per step)
    eval_episodes: int = 16
    eval_policy: Literal["greedy", "sample"] = "greedy"  # how evaluation (and play) acts: the
    # distribution's mode, or a draw from it (for games where the greedy policy loops or stalls)
    divergence_loss: float = 1e7  # |loss| above this (or non-finite) marks a run diverged

    def __post_init__(self) -> None:
        require_positive(self, "num_envs", "num_steps", "num_minibatches", "update_epochs",
                         "updates_per_chunk", "eval_episodes", "embed_dim", "num_heads",
                         "num_layers", "patch")
        require_layers(self)
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r}; choose from {', '.join(ACTIVATIONS)}")
        if self.squash not in ("clip", "tanh"):
            raise ValueError(f"squash={self.squash!r}; choose from clip, tanh")
        if self.eval_policy not in ("greedy", "sample"):
            raise ValueError(f"eval_policy={self.eval_policy!r}; choose from greedy, sample")
        if self.network not in ("mlp", "transformer"):
            raise ValueError(f"network={self.network!r}; choose from mlp, transformer")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide embed_dim={self.embed_dim}")
        self.check_shape()


@struct.dataclass
class PPOHParams:
    """Traced hyperparameters: float32 scalars (or ``[C]`` when batched over configs)."""

    lr: jax.Array
    gamma: jax.Array
    gae_lambda: jax.Array
    clip_eps: jax.Array
    ent_coef: jax.Array
    vf_coef: jax.Array
    max_grad_norm: jax.Array
    reward_scale: jax.Array  # rewards are multiplied by it for learning (returns are reported unscaled)

    RANGES: ClassVar[dict[str, Range]] = dict(
        lr=POSITIVE, gamma=FRACTION, gae_lambda=FRACTION, clip_eps=POSITIVE, ent_coef=NON_NEGATIVE,
        vf_coef=NON_NEGATIVE, max_grad_norm=POSITIVE, reward_scale=POSITIVE)

    @classmethod
    def default(cls, **overrides: float) -> PPOHParams:
        defaults = dict(lr=2.5e-4, gamma=0.99, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01,
                        vf_coef=0.5, max_grad_norm=0.5, reward_scale=1.0)
        return float32_hparams(cls, defaults, overrides)


@struct.dataclass
class PPOState:
    params: Any  # network parameters
    opt_state: Any
    env_state: Any  # leaves [N, ...]
    obs: jax.Array  # [N, *obs_shape]
    tracker: EpisodeTracker
    key: jax.Array
    update: jax.Array  # [] int32 updates done
    diverged: jax.Array  # [] bool, sticky
    obs_stats: RunningStats | None = None  # with normalize_observations


class PPOMetrics(NamedTuple):
    """One row per update (stacked to ``[K]`` by ``chunk``)."""

    env_steps: jax.Array  # per seed, cumulative
    episode_return: jax.Array  # mean over episodes finished in this update; NaN if none
    episode_length: jax.Array
    episodes: jax.Array
    total_loss: jax.Array
    value_loss: jax.Array
    policy_loss: jax.Array
    entropy: jax.Array
    approx_kl: jax.Array
    diverged: jax.Array
    illegal_actions: jax.Array  # fraction of this update's actions the env's mask forbade (0: no mask)


class _Traj(NamedTuple):
    obs: jax.Array  # [T, N, ...]
    action: jax.Array
    log_prob: jax.Array
    mask: jax.Array | None  # [T, N, A] legal actions the policy was restricted to, or None
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array
    final_obs: jax.Array


def network(config: PPOConfig, env: Environment, env_params: Any) -> nn.Module:
    """The actor-critic ``config.network`` names, for this env's observation and action spaces.

    Raises:
        ValueError: a transformer was asked for a non-grid observation or continuous actions.
    """
    space = env.action_space(env_params)
    obs_shape = env.observation_space(env_params).shape
    if config.network == "mlp":
        if isinstance(space, MultiDiscrete):  # one row of logits per sub-action
            return ActorCritic(len(space.nvec) * space.width, True, config.hidden, config.activation,
                               obs_ndim=len(obs_shape))
        action_dim = space.n if isinstance(space, Discrete) else space.shape[0]
        return ActorCritic(action_dim, isinstance(space, Discrete), config.hidden, config.activation,
                           obs_ndim=len(obs_shape))
    if len(obs_shape) < 2 or not isinstance(space, Discrete):
        raise ValueError(f"network='transformer' needs a grid observation [..., cells, features] and "
                         f"discrete actions; {env.name} has observation shape {obs_shape} and {space}")
    if config.patch > 1 and (len(obs_shape) != 3 or obs_shape[0] % config.patch or obs_shape[1] % config.patch):
        raise ValueError(f"patch={config.patch} needs a 2-D grid observation [H, W, features] whose sides it "
                         f"divides; {env.name} has observation shape {obs_shape}")
    return TransformerActorCritic(space.n, len(obs_shape), config.embed_dim, config.num_heads,
                                  config.num_layers, patch=config.patch)


def make(config: PPOConfig, env: Environment, env_params: Any) -> Algo:
    """Builds PPO's pure functions for one environment and static config.

    The spaces are asked for here, once, outside any trace (an env's space may be computed from
    its params, which are traced inside the kernel).
    """
    space = env.action_space(env_params)
    obs_shape = env.observation_space(env_params).shape
    discrete = isinstance(space, Discrete | MultiDiscrete)
    multi = space if isinstance(space, MultiDiscrete) else None
    net = network(config, env, env_params)
    step_envs = jax.vmap(env.step, (0, 0, 0, None))
    reset_envs = jax.vmap(env.reset, (0, None))
    env_masks = jax.vmap(env.action_mask, (0, None))

    def policy_mask(env_state: Any) -> tuple[jax.Array | None, jax.Array | None]:
        """(mask the policy obeys, the env's own mask): ``[N, A]`` each, or None."""
        mask = env_masks(env_state, env_params)
        return (mask if config.use_action_mask else None), mask

    def distribution(pi_out: jax.Array, log_std: jax.Array | None, mask: jax.Array | None) -> distrax.Distribution:
        """The policy: a categorical (one per sub-action for MultiDiscrete) or a Gaussian."""
        if multi is None:
            return ppo_distribution(pi_out, log_std, mask)
        logits = pi_out.reshape(*pi_out.shape[:-1], len(multi.nvec), multi.width)
        legal = multi.valid() if mask is None else mask & multi.valid()
        return distrax.Independent(distrax.Categorical(logits=jnp.where(legal, logits, -1e9)), 1)

    def env_action(action: jax.Array) -> jax.Array:
        """The env's action for the policy's (a Gaussian sample or mean, pre-squash for tanh)."""
        if isinstance(space, Box) and config.squash == "tanh":
            return space.low + (jnp.tanh(action) + 1.0) * 0.5 * (space.high - space.low)
        if isinstance(space, Box):
            return jnp.clip(action, space.low, space.high)
        return action

    def apply(params: Any, stats: RunningStats | None, obs: jax.Array) -> tuple:
        return net.apply(params, obs if stats is None else stats.normalize(obs))

    def optimizer(hp: PPOHParams) -> optax.GradientTransformation:
        lr: Any = hp.lr
        if config.anneal_lr:
            lr = optax.linear_schedule(hp.lr, 0.0, config.num_updates * config.update_epochs
                                       * config.num_minibatches)
        return adam(lr, hp.max_grad_norm)

    def init(key: jax.Array, hp: PPOHParams) -> PPOState:
        k_net, k_env, k_run = jax.random.split(key, 3)
        params = net.init(k_net, jnp.zeros(obs_shape))
        obs, env_state = reset_envs(jax.random.split(k_env, config.num_envs), env_params)
        stats = RunningStats.empty(obs_shape) if config.normalize_observations else None
        return PPOState(params, optimizer(hp).init(params), env_state, obs,
                        EpisodeTracker.zeros(config.num_envs), k_run, jnp.int32(0),
                        jnp.bool_(False), stats)

    def rollout(state: PPOState) -> tuple[PPOState, _Traj, Finished, jax.Array]:
        def one_step(carry: PPOState, key: jax.Array) -> tuple[PPOState, tuple]:
            k_act, k_env = jax.random.split(key)
            pi_out, log_std, value = apply(carry.params, carry.obs_stats, carry.obs)
            mask, env_mask = policy_mask(carry.env_state)
            dist = distribution(pi_out, log_std, mask)
            action = dist.sample(seed=k_act)
            illegal = (jnp.float32(0.0) if env_mask is None  # a fraction of (sub-)actions
                       else 1.0 - jnp.take_along_axis(env_mask, action[..., None], -1).mean())
            s = step_envs(jax.random.split(k_env, config.num_envs), carry.env_state,
                          env_action(action), env_params)
            tracker, fin = track_episodes(carry.tracker, s.reward, s.done)
            tr = _Traj(carry.obs, action, dist.log_prob(action), mask, value, s.reward,
                       s.terminated, s.done, s.final_obs)
            return carry.replace(env_state=s.state, obs=s.obs, tracker=tracker), (tr, fin, illegal)

        key, k_roll = jax.random.split(state.key)
        state, (traj, fin, illegal) = jax.lax.scan(
            one_step, state.replace(key=key), jax.random.split(k_roll, config.num_steps))
        return state, traj, Finished(*(jnp.sum(x) for x in fin)), jnp.mean(illegal)

    def loss_fn(params: Any, hp: PPOHParams, batch: tuple,
                stats: RunningStats | None) -> tuple[jax.Array, tuple]:
        traj, adv, targets = batch
        pi_out, log_std, value = apply(params, stats, traj.obs)
        dist = distribution(pi_out, log_std, traj.mask)  # the rollout's mask: same support
        log_ratio = dist.log_prob(traj.action) - traj.log_prob
        ratio = jnp.exp(log_ratio)
        if config.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - hp.clip_eps, 1 + hp.clip_eps)
                               * adv).mean()
        v_loss = (value - targets) ** 2
        if config.clip_value_loss:
            v_clipped = traj.value + jnp.clip(value - traj.value, -hp.clip_eps, hp.clip_eps)
            v_loss = jnp.maximum(v_loss, (v_clipped - targets) ** 2)
        v_loss = 0.5 * v_loss.mean()
        entropy = dist.entropy().mean()
        total = pg_loss + hp.vf_coef * v_loss - hp.ent_coef * entropy
        approx_kl = ((ratio - 1) - log_ratio).mean()
        return total, (v_loss, pg_loss, entropy, approx_kl)

    def epoch(carry: tuple, key: jax.Array, hp: PPOHParams, batch: tuple,
              stats: RunningStats | None) -> tuple[tuple, tuple]:
        params, opt_state = carry
        flat = jax.tree.map(lambda x: x.reshape(config.batch_size, *x.shape[2:]), batch)
        perm = jax.random.permutation(key, config.batch_size)

        def minibatch(c: tuple, idx: jax.Array) -> tuple[tuple, tuple]:
            p, o = c
            mb = jax.tree.map(lambda x: x[idx], flat)  # gathered here: no shuffled copy of the batch
            (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, hp, mb, stats)
            updates, o = optimizer(hp).update(grads, o, p)
            return (optax.apply_updates(p, updates), o), (loss, *aux)

        return jax.lax.scan(minibatch, (params, opt_state),
                            perm.reshape(config.num_minibatches, config.minibatch_size))

    def update(state: PPOState, hp: PPOHParams) -> tuple[PPOState, PPOMetrics]:
        state, traj, fin, illegal = rollout(state)
        # bootstrap values with the statistics the rollout acted with (those its values used)
        _, _, next_values = apply(state.params, state.obs_stats, traj.final_obs)
        adv, targets = gae(traj.reward * hp.reward_scale, traj.value, next_values, traj.terminated,
                           traj.done, hp.gamma, hp.gae_lambda)
        # then the statistics take in this rollout's observations (as Brax's PPO does), and
        # the updates see observations normalised by them
        stats = None if state.obs_stats is None else state.obs_stats.update(traj.obs)
        key, k_epochs = jax.random.split(state.key)
        (params, opt_state), losses = jax.lax.scan(
            lambda c, k: epoch(c, k, hp, (traj, adv, targets), stats),
            (state.params, state.opt_state),
            jax.random.split(k_epochs, config.update_epochs))
        losses = [jnp.mean(x) for x in losses]
        diverged = state.diverged | is_diverged(losses, params, config.divergence_loss)
        ep_return, ep_length = finished_means(fin)
        update_idx = state.update + 1
        state = state.replace(params=params, opt_state=opt_state, key=key, update=update_idx,
                              diverged=diverged, obs_stats=stats)
        metrics = PPOMetrics(update_idx * config.batch_size, ep_return, ep_length, fin.count,
                             *losses, diverged, illegal)
        return state, metrics

    def chunk(state: PPOState, hp: PPOHParams) -> tuple[PPOState, PPOMetrics]:
        return jax.lax.scan(lambda s, _: update(s, hp), state, None,
                            length=config.updates_per_chunk)

    def policy_params(state: PPOState) -> Any:
        return policy_of(state.params, state.obs_stats)

    def act(policy: Any, obs: jax.Array, mask: jax.Array | None = None, key: jax.Array | None = None) -> jax.Array:
        pi_out, log_std, _ = apply(*split_policy(policy, config.normalize_observations), obs)
        if config.eval_policy == "sample":
            if key is None:
                raise ValueError("eval_policy='sample' acts from a random key: pass key=")
            dist = distribution(pi_out, log_std, mask if discrete and config.use_action_mask else None)
            return env_action(dist.sample(seed=key))
        if not discrete:
            return env_action(pi_out)
        if multi is not None:
            pi_out = pi_out.reshape(*pi_out.shape[:-1], len(multi.nvec), multi.width)
            pi_out = jnp.where(multi.valid(), pi_out, -jnp.inf)
        if mask is not None and config.use_action_mask:
            pi_out = jnp.where(mask, pi_out, -jnp.inf)
        return jnp.argmax(pi_out, -1)

    def evaluate(state: PPOState, key: jax.Array, num_episodes: int | None = None) -> EvalMetrics:
        return evaluate_policy(env, env_params, lambda o, m, k: act(policy_params(state), o, m, k), key,
                               num_episodes or config.eval_episodes)

    learner = ("params", "opt_state", "diverged") + (("obs_stats",) if config.normalize_observations else ())
    return Algo(init, chunk, evaluate, act, policy_params, learner)

