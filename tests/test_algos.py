"""Algorithm math, probe environments and the kernel's promises (vmap, chunking, no recompile,
divergence isolation) for PPO, SAC and PQN."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from algos import ppo, pqn, sac
from algos.common import batched
from algos.gae import gae
from algos.networks import ActorCritic, CellTransformer, SACActor, TransformerActorCritic, TwinQ, orthogonal
from envs import dungeon
from tests.probe_envs import PointAtTheCell, Probe


def test_core_does_not_import_orchestrators():
    code = ("import envs, algos.ppo, algos.sac, algos.pqn, algos.check, sys; "
            "assert not {'ray', 'optuna', 'pandas'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- GAE -----------------------------------------------------------------------------------

def _gae_numpy(rewards, values, next_values, terminated, done, gamma, lam):
    T = len(rewards)
    adv = np.zeros(T)
    last = 0.0
    for t in reversed(range(T)):
        bootstrap = 0.0 if terminated[t] else gamma * next_values[t]
        delta = rewards[t] + bootstrap - values[t]
        last = delta + (0.0 if done[t] else gamma * lam * last)
        adv[t] = last
    return adv, adv + values


def test_gae__matches_numpy_loop_with_terminated_and_truncated_steps():
    rng = np.random.default_rng(0)
    T, B = 50, 3
    rewards, values, next_values = (rng.normal(size=(T, B)).astype(np.float32) for _ in range(3))
    terminated = rng.random((T, B)) < 0.1
    truncated = (rng.random((T, B)) < 0.1) & ~terminated
    done = terminated | truncated
    adv, targets = gae(jnp.array(rewards), jnp.array(values), jnp.array(next_values),
                       jnp.array(terminated), jnp.array(done), 0.97, 0.9)
    for b in range(B):
        ref_adv, ref_t = _gae_numpy(rewards[:, b], values[:, b], next_values[:, b],
                                    terminated[:, b], done[:, b], 0.97, 0.9)
        np.testing.assert_allclose(adv[:, b], ref_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(targets[:, b], ref_t, rtol=1e-5, atol=1e-5)


def test_gae__truncation_bootstraps_but_termination_does_not():
    ones = jnp.ones((1, 1))
    kw = dict(rewards=ones, values=0 * ones, next_values=10 * ones, gamma=0.5, gae_lambda=1.0)
    adv_trunc, _ = gae(terminated=ones < 0, done=ones > 0, **kw)
    adv_term, _ = gae(terminated=ones > 0, done=ones > 0, **kw)
    assert float(adv_trunc[0, 0]) == pytest.approx(1 + 0.5 * 10)
    assert float(adv_term[0, 0]) == pytest.approx(1.0)


def _q_lambda_numpy(rewards, next_q, terminated, done, gamma, lam):
    g, out = next_q[-1], np.zeros(len(rewards))
    for t in reversed(range(len(rewards))):
        if terminated[t]:
            g = rewards[t]
        elif done[t] or t == len(rewards) - 1:  # cut by time, or the rollout's end: the greedy value alone
            g = rewards[t] + gamma * next_q[t]
        else:
            g = rewards[t] + gamma * (lam * g + (1 - lam) * next_q[t])
        out[t] = g
    return out


def test_q_lambda__matches_numpy_loop_with_terminated_and_truncated_steps():
    rng = np.random.default_rng(0)
    T = 12
    rewards, next_q = rng.normal(size=T), rng.normal(size=T)
    terminated = np.zeros(T, bool)
    done = np.zeros(T, bool)
    terminated[3] = done[3] = True
    done[7] = True  # truncated
    got = pqn.q_lambda_returns(*(jnp.asarray(x)[:, None] for x in (rewards, next_q, terminated, done)),
                               jnp.float32(0.9), jnp.float32(0.7))
    np.testing.assert_allclose(got[:, 0], _q_lambda_numpy(rewards, next_q, terminated, done, 0.9, 0.7),
                               rtol=1e-5)
    one = pqn.q_lambda_returns(*(jnp.asarray(x)[:, None] for x in (rewards, next_q, terminated, done)),
                               jnp.float32(0.9), jnp.float32(0.0))  # lambda 0: one-step Q-learning targets
    want = rewards + 0.9 * np.where(terminated, 0.0, next_q)
    np.testing.assert_allclose(one[:, 0], want, rtol=1e-5)


# ---- probes --------------------------------------------------------------------------------

PROBE_PPO = ppo.PPOConfig(num_envs=16, num_steps=8, num_minibatches=2, update_epochs=4,
                          total_timesteps=16 * 8 * 150, updates_per_chunk=150,
                          anneal_lr=False, hidden=(32, 32))


def _train_ppo_probe(kind, discrete, **hp):
    env = Probe(kind=kind, discrete=discrete)
    params = env.default_params
    algo = ppo.make(PROBE_PPO, env, params)
    hparams = ppo.PPOHParams.default(lr=3e-3, **hp)
    state = jax.jit(algo.init)(jax.random.key(0), hparams)
    state, _ = jax.jit(algo.chunk)(state, hparams)
    net = ActorCritic(1 if not discrete else 2, discrete, PROBE_PPO.hidden)
    return lambda obs: net.apply(state.params, jnp.array(obs, jnp.float32))


@pytest.mark.parametrize("discrete", [True, False])
def test_ppo_probe__constant_reward_value_is_one(discrete):
    apply = _train_ppo_probe("constant", discrete)
    assert float(apply([0.0])[2]) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("discrete", [True, False])
def test_ppo_probe__two_step_value_is_gamma(discrete):
    apply = _train_ppo_probe("two_step", discrete, gamma=0.9, gae_lambda=1.0)
    assert float(apply([0.0])[2]) == pytest.approx(0.9, abs=0.05)
    assert float(apply([1.0])[2]) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("discrete", [True, False])
def test_ppo_probe__action_dependent_reward_gives_right_greedy_action(discrete):
    apply = _train_ppo_probe("action", discrete, ent_coef=0.0)
    pos, neg = apply([1.0])[0], apply([-1.0])[0]
    if discrete:
        assert int(jnp.argmax(pos)) == 1 and int(jnp.argmax(neg)) == 0
    else:
        assert float(pos[0]) == pytest.approx(0.5, abs=0.15)
        assert float(neg[0]) == pytest.approx(-0.5, abs=0.15)


PROBE_SAC = sac.SACConfig(num_envs=8, buffer_size=4000, batch_size=64, learning_starts=256,
                          updates_per_step=1, total_timesteps=8 * 1032, steps_per_chunk=1000,
                          hidden=(32, 32))


def _train_sac_probe(kind, **hp):
    env = Probe(kind=kind, discrete=False)
    algo = sac.make(PROBE_SAC, env, env.default_params)
    hparams = sac.SACHParams.default(actor_lr=3e-3, critic_lr=3e-3, init_alpha=1e-3,
                                     alpha_lr=0.0, **hp)
    state = jax.jit(algo.init)(jax.random.key(0), hparams)
    state, _ = jax.jit(algo.chunk)(state, hparams)
    q = lambda obs, a: TwinQ(PROBE_SAC.hidden).apply(state.critic, jnp.array(obs), jnp.array(a))
    mean = lambda obs: SACActor(1, PROBE_SAC.hidden).apply(state.actor, jnp.array(obs))[0]
    return q, mean


def test_sac_probe__constant_reward_q_is_one():
    q, _ = _train_sac_probe("constant")
    np.testing.assert_allclose(q([0.0], [0.3]), [1.0, 1.0], atol=0.05)


def test_sac_probe__two_step_q_is_gamma():
    q, _ = _train_sac_probe("two_step", gamma=0.9)
    np.testing.assert_allclose(q([0.0], [0.0]), [0.9, 0.9], atol=0.05)
    np.testing.assert_allclose(q([1.0], [0.0]), [1.0, 1.0], atol=0.05)


def test_sac_probe__action_dependent_reward_gives_right_greedy_action():
    _, mean = _train_sac_probe("action")
    assert float(jnp.tanh(mean([1.0]))[0]) == pytest.approx(0.5, abs=0.1)
    assert float(jnp.tanh(mean([-1.0]))[0]) == pytest.approx(-0.5, abs=0.1)


PROBE_PQN = pqn.PQNConfig(num_envs=16, num_steps=8, num_minibatches=2, update_epochs=4,
                          total_timesteps=16 * 8 * 150, updates_per_chunk=150, anneal_lr=False, hidden=(32, 32))


def _train_pqn_probe(kind, **hp):
    env = Probe(kind=kind, discrete=True)
    algo = pqn.make(PROBE_PQN, env, env.default_params)
    hparams = pqn.PQNHParams.default(lr=3e-3, **hp)
    state = jax.jit(algo.init)(jax.random.key(0), hparams)
    state, _ = jax.jit(algo.chunk)(state, hparams)
    return lambda obs: pqn.QNetwork(2, PROBE_PQN.hidden).apply(state.params, jnp.array(obs, jnp.float32))


def test_pqn_probe__constant_reward_q_is_one():
    q = _train_pqn_probe("constant", eps_start=0.5, eps_end=0.5)  # both actions tried throughout
    np.testing.assert_allclose(q([0.0]), [1.0, 1.0], atol=0.05)


def test_pqn_probe__two_step_q_is_gamma():
    q = _train_pqn_probe("two_step", gamma=0.9, td_lambda=0.5, eps_start=0.5, eps_end=0.5)
    np.testing.assert_allclose(q([0.0]), [0.9, 0.9], atol=0.05)
    np.testing.assert_allclose(q([1.0]), [1.0, 1.0], atol=0.05)


def test_pqn_probe__action_dependent_reward_gives_right_greedy_action():
    q = _train_pqn_probe("action")
    assert int(jnp.argmax(q([1.0]))) == 1 and int(jnp.argmax(q([-1.0]))) == 0
    np.testing.assert_allclose([q([1.0])[1], q([-1.0])[0]], [1.0, 1.0], atol=0.1)


# ---- the kernel's promises -----------------------------------------------------------------

SMALL_PPO = ppo.PPOConfig(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2,
                          total_timesteps=4 * 32 * 8, updates_per_chunk=2)
SMALL_SAC = sac.SACConfig(num_envs=2, buffer_size=1000, batch_size=32, learning_starts=64,
                          updates_per_step=2, total_timesteps=400, steps_per_chunk=10,
                          hidden=(32, 32))
SMALL_PQN = pqn.PQNConfig(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2,
                          total_timesteps=4 * 32 * 8, updates_per_chunk=2)


def _setup(name):
    if name == "ppo":
        env, params = envs.make("CartPole-v1")
        return ppo.make(SMALL_PPO, env, params), ppo.PPOHParams.default, "lr"
    if name == "pqn":
        env, params = envs.make("CartPole-v1")
        return pqn.make(SMALL_PQN, env, params), pqn.PQNHParams.default, "lr"
    env, params = envs.make("Pendulum-v1")
    return sac.make(SMALL_SAC, env, params), sac.SACHParams.default, "critic_lr"


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _arrays(tree):
    """Leaves of a state as plain arrays (PRNG keys as their key data)."""
    return [jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
            for x in jax.tree.leaves(tree)]


def _close(a, b, **kw):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), **kw)


@pytest.mark.xla_emitters  # two programs compared: the vmapped kernel and one configuration x seed
@pytest.mark.parametrize("algo_name", ["ppo", "sac", "pqn"])
def test_kernel__vmapped_configs_by_seeds_equals_one_at_a_time(algo_name):
    algo, default, lr = _setup(algo_name)
    lrs = [3e-4, 1e-3]
    hps = [default(**{lr: v}) for v in lrs]
    keys = [[jax.random.fold_in(jax.random.key(c), s) for s in range(3)] for c in range(2)]
    hp_batch = _stack(hps)
    key_batch = jnp.stack([jnp.stack(k) for k in keys])
    state = jax.jit(batched(algo.init))(key_batch, hp_batch)
    run = jax.jit(batched(algo.chunk))
    for _ in range(2):
        state, metrics = run(state, hp_batch)
    init1, chunk1 = jax.jit(algo.init), jax.jit(algo.chunk)
    for c in range(2):
        for s in range(3):
            st = init1(keys[c][s], hps[c])
            for _ in range(2):
                st, m = chunk1(st, hps[c])
            pick = lambda t: jax.tree.map(lambda x: x[c, s], t)
            np.testing.assert_array_equal(jax.random.key_data(pick(state).key),
                                          jax.random.key_data(st.key))
            params_of = (lambda t: (t.actor, t.critic)) if algo_name == "sac" else (lambda t: t.params)
            _close(params_of(pick(state)), params_of(st), rtol=1e-4, atol=1e-5)
            _close(pick(metrics), m, rtol=1e-4, atol=1e-4)


@pytest.mark.xla_emitters  # two programs compared
@pytest.mark.parametrize("lanes", [(1, 3), (2, 1), (1, 1)])
def test_batched__a_unit_config_or_seed_axis_gives_what_one_at_a_time_gives(lanes):
    """``batched`` vmaps once over the other axis (or not at all) where one has size 1."""
    configs, seeds = lanes
    algo, default, lr = _setup("pqn")
    hps = [default(**{lr: v}) for v in (3e-4, 1e-3)[:configs]]
    keys = jnp.stack([jnp.stack([jax.random.fold_in(jax.random.key(c), s) for s in range(seeds)])
                      for c in range(configs)])
    state = jax.jit(batched(algo.init))(keys, _stack(hps))
    state, metrics = jax.jit(batched(algo.chunk))(state, _stack(hps))
    evals = jax.jit(batched(algo.evaluate, hparams_argnum=None))(state, keys)
    assert evals.return_mean.shape == (configs, seeds) and metrics.env_steps.shape[:2] == (configs, seeds)
    for c in range(configs):
        for s in range(seeds):
            st, m = jax.jit(algo.chunk)(jax.jit(algo.init)(keys[c, s], hps[c]), hps[c])
            pick = lambda t: jax.tree.map(lambda x: x[c, s], t)
            _close(pick(state).params, st.params, rtol=1e-4, atol=1e-5)
            _close(pick(metrics), m, rtol=1e-4, atol=1e-4)
            ev = jax.jit(algo.evaluate)(st, keys[c, s])
            np.testing.assert_allclose(evals.return_mean[c, s], ev.return_mean, rtol=1e-5)


@pytest.mark.parametrize("algo_name", ["ppo", "sac", "pqn"])
def test_kernel__init_plus_chunks_equals_one_long_chunk(algo_name):
    env_name = "Pendulum-v1" if algo_name == "sac" else "CartPole-v1"
    env, params = envs.make(env_name)
    mod, cfg = {"ppo": (ppo, SMALL_PPO), "sac": (sac, SMALL_SAC), "pqn": (pqn, SMALL_PQN)}[algo_name]
    field = "steps_per_chunk" if algo_name == "sac" else "updates_per_chunk"
    k = getattr(cfg, field)
    short = mod.make(cfg, env, params)
    long = mod.make(cfg.__class__(**{**cfg.__dict__, field: 3 * k}), env, params)
    hp = {"ppo": ppo.PPOHParams, "sac": sac.SACHParams, "pqn": pqn.PQNHParams}[algo_name].default()
    s1 = jax.jit(short.init)(jax.random.key(5), hp)
    parts = []
    for _ in range(3):
        s1, m = jax.jit(short.chunk)(s1, hp)
        parts.append(m)
    s2, m2 = jax.jit(long.chunk)(jax.jit(long.init)(jax.random.key(5), hp), hp)
    _close(jax.tree.map(lambda *x: jnp.concatenate(x), *parts), m2, rtol=1e-5, atol=1e-5)
    _close(_arrays(s1), _arrays(s2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algo_name", ["ppo", "sac", "pqn"])
def test_kernel__changing_hyperparameter_values_does_not_recompile(algo_name):
    algo, default, lr = _setup(algo_name)
    chex.clear_trace_counter()
    chunk = jax.jit(chex.assert_max_traces(algo.chunk, n=1))
    state = jax.jit(algo.init)(jax.random.key(0), default())
    for value in (1e-4, 3e-3, 0.1):
        hp = default(**{lr: value, "gamma": 0.9 + value})
        state, _ = chunk(state, hp)


@pytest.mark.parametrize("algo_name", ["ppo", "sac", "pqn"])
def test_kernel__diverging_config_is_flagged_and_siblings_are_untouched(algo_name):
    algo, default, lr = _setup(algo_name)
    good, bad = default(**{lr: 1e-3}), default(**{lr: 1e3})
    keys = jnp.stack([jnp.stack([jax.random.key(1), jax.random.key(2)])] * 2)
    init, run = jax.jit(batched(algo.init)), jax.jit(batched(algo.chunk))

    def train(hps):
        state = init(keys, hps)
        for _ in range(3):
            state, metrics = run(state, hps)
        return state, metrics

    s_mixed, m_mixed = train(_stack([good, bad]))
    s_clean, m_clean = train(_stack([good, good]))
    assert bool(m_mixed.diverged[1, :, -1].all()), "lr=1e3 must be flagged as diverged"
    assert not bool(m_mixed.diverged[0].any())
    first = lambda t: jax.tree.map(lambda x: np.asarray(x[0]), t)
    for x, y in zip(jax.tree.leaves(first(m_mixed)), jax.tree.leaves(first(m_clean))):
        np.testing.assert_array_equal(x, y)
    s1 = jax.jit(algo.init)(jax.random.key(1), good)
    for _ in range(3):
        s1, m1 = jax.jit(algo.chunk)(s1, good)
    _close(jax.tree.map(lambda x: x[0, 0], m_mixed), m1, rtol=1e-4, atol=1e-4)


# ---- masked PPO and the transformer policy -------------------------------------------------

def _dungeon_ppo(use_action_mask, lr, updates=13):
    env, p = envs.make("DungeonCrawl-v1")
    config = ppo.PPOConfig(num_envs=64, num_steps=128, num_minibatches=4, update_epochs=1,
                           total_timesteps=64 * 128 * updates, updates_per_chunk=updates,
                           use_action_mask=use_action_mask)
    algo = ppo.make(config, env, p)
    hp = ppo.PPOHParams.default(lr=lr)
    _, metrics = jax.jit(algo.chunk)(algo.init(jax.random.key(0), hp), hp)
    return metrics


def test_masked_ppo__no_illegal_action_in_100k_samples_and_loss_uses_the_stored_mask():
    m = _dungeon_ppo(use_action_mask=True, lr=0.0)
    assert 64 * 128 * 13 >= 100_000
    assert float(m.illegal_actions.max()) == 0.0
    # with lr 0 the policy never changes: the loss's log-probabilities, under the mask stored
    # with each transition, equal the rollout's exactly (an unmasked loss would not)
    np.testing.assert_allclose(m.approx_kl, 0.0, atol=1e-6)
    # entropy over the legal actions only (about 4 of 15), not log(15)
    assert float(m.entropy.mean()) < np.log(dungeon.NUM_ACTIONS) - 1.0


def test_masked_ppo__unmasked_run_takes_illegal_actions():
    m = _dungeon_ppo(use_action_mask=False, lr=0.0, updates=2)
    assert float(m.illegal_actions.mean()) > 0.5
    np.testing.assert_allclose(m.entropy, np.log(dungeon.NUM_ACTIONS), atol=0.01)


def test_masked_pqn__acts_only_legally_exploring_or_greedy_and_unmasked_does_not():
    env, p = envs.make("DungeonCrawl-v1")
    for use_mask, check in ((True, lambda x: x == 0.0), (False, lambda x: x > 0.5)):
        config = pqn.PQNConfig(num_envs=64, num_steps=64, num_minibatches=4, update_epochs=1,
                               total_timesteps=64 * 64 * 12, updates_per_chunk=12, use_action_mask=use_mask)
        algo = pqn.make(config, env, p)
        hp = pqn.PQNHParams.default(exploration_fraction=0.5)  # epsilon from 1 to 0.05: random and greedy
        _, m = jax.jit(algo.chunk)(algo.init(jax.random.key(0), hp), hp)
        assert check(float(m.illegal_actions.max() if use_mask else m.illegal_actions.mean())), m.illegal_actions
    assert float(m.epsilon[0]) == 1.0 and float(m.epsilon[-1]) < 0.2


# The default suite's transformer learning test, Snake 6x6 (tests/test_learning.py) being too noisy across CPUs;
# trained at XLA's full optimisation, as unoptimised CPU code gives this transformer's gradient a NaN (jax 0.10.2).
@pytest.mark.xla_optimized
def test_transformer__learns_to_point_at_the_marked_cell_which_needs_each_cells_position():
    env = PointAtTheCell(size=3)
    p = env.default_params
    config = ppo.PPOConfig(num_envs=16, num_steps=8, num_minibatches=2, update_epochs=4,
                           total_timesteps=16 * 8 * 300, updates_per_chunk=300, anneal_lr=False,
                           network="transformer", embed_dim=16, num_heads=2, num_layers=1)
    algo, net = ppo.make(config, env, p), ppo.network(config, env, p)
    hp = ppo.PPOHParams.default(lr=1e-3)
    init, chunk = jax.jit(algo.init), jax.jit(algo.chunk)
    cells = jnp.arange(env.size**2)
    grids = jax.vmap(env.grid)(cells)
    right = []
    for seed in (0, 1):  # random play gets one of the 9 cells right
        state, _ = chunk(init(jax.random.key(seed), hp), hp)
        right.append(int((jnp.argmax(net.apply(state.params, grids)[0], -1) == cells).sum()))
    assert sum(right) / 2 >= 5, right  # five times random play, as the Snake test asked


def test_transformer__selected_by_static_config_with_its_cells_as_tokens():
    env, p = envs.make("Snake-v1", size=5)
    config = ppo.PPOConfig(num_envs=8, num_steps=16, num_minibatches=2, update_epochs=1,
                           total_timesteps=8 * 16 * 2, updates_per_chunk=2, network="transformer",
                           embed_dim=16, num_heads=2, num_layers=1)
    net = ppo.network(config, env, p)
    assert isinstance(net, TransformerActorCritic)
    state = jax.jit(ppo.make(config, env, p).init)(jax.random.key(0), ppo.PPOHParams.default())
    assert "CellTransformer_0" in state.params["params"]
    logits, _, value = net.apply(state.params, jnp.zeros((3, 5, 5, 5)))
    assert logits.shape == (3, 4) and value.shape == (3,)


def test_transformer__patches_make_each_square_of_cells_one_token():
    import flax.linen as nn

    env, p = envs.make("Snake-v1", size=6)
    config = ppo.PPOConfig(num_envs=8, num_steps=16, num_minibatches=2, update_epochs=1, total_timesteps=512,
                           network="transformer", embed_dim=16, num_heads=2, num_layers=1, patch=2)
    net = ppo.network(config, env, p)
    grid = jax.random.normal(jax.random.key(1), (6, 6, 5))
    params = net.init(jax.random.key(0), grid)
    cells = params["params"]["CellTransformer_0"]
    assert cells["position"].shape == (9, 16) and cells["Dense_0"]["kernel"].shape == (2 * 2 * 5, 16)
    # token k is square (k // 3, k % 3)'s four cells, row by row: the same encoding from tokens cut by hand
    tokens = jnp.stack([grid[2 * i:2 * i + 2, 2 * j:2 * j + 2].reshape(20) for i in range(3) for j in range(3)])
    h = CellTransformer(16, 2, 1).apply({"params": cells}, tokens)
    top = params["params"]
    hidden = nn.relu(nn.Dense(64).apply({"params": top["Dense_3"]}, h))  # built inside Dense_2's call
    value = nn.Dense(1).apply({"params": top["Dense_2"]}, hidden)
    assert jnp.allclose(net.apply(params, grid)[2], value[0], atol=1e-5)
    with pytest.raises(ValueError, match="patch=4 needs a 2-D grid observation"):
        ppo.network(dataclasses.replace(config, patch=4), env, p)
    flat, fp = envs.make("CartPole-v1")  # no grid at all
    with pytest.raises(ValueError, match="needs a grid observation"):
        ppo.network(config, flat, fp)


def test_transformer__needs_a_grid_observation():
    env, p = envs.make("CartPole-v1")
    with pytest.raises(ValueError, match="grid observation"):
        ppo.make(ppo.PPOConfig(network="transformer"), env, p)
    with pytest.raises(ValueError, match="network="):
        ppo.PPOConfig(network="cnn")


def test_ppo_eval_policy__sample_draws_legal_actions_in_proportion_and_greedy_takes_the_argmax():
    env, p = envs.make("DungeonCrawl-v1")
    config = ppo.PPOConfig(num_envs=4, num_steps=8, num_minibatches=1, update_epochs=1, total_timesteps=32,
                           eval_policy="sample", eval_episodes=8)
    algo = ppo.make(config, env, p)
    greedy = ppo.make(dataclasses.replace(config, eval_policy="greedy"), env, p)
    hp = ppo.PPOHParams.default()
    state = algo.init(jax.random.key(1), hp)
    obs, env_state = env.reset(jax.random.key(2), p)
    mask = env.action_mask(env_state, p)
    policy = algo.policy_params(state)
    logits = ppo.network(config, env, p).apply(policy, obs[None])[0][0]
    probs = np.asarray(jax.nn.softmax(jnp.where(mask, logits, -jnp.inf)))
    keys = jax.random.split(jax.random.key(3), 20_000)
    draws = np.asarray(jax.vmap(lambda k: algo.act(policy, obs, mask, k))(keys))
    freq = np.bincount(draws, minlength=dungeon.NUM_ACTIONS) / draws.size
    assert freq[~np.asarray(mask)].sum() == 0.0  # never an illegal action
    np.testing.assert_allclose(freq, probs, atol=0.015)
    assert int(greedy.act(policy, obs, mask)) == int(np.argmax(probs))
    with pytest.raises(ValueError, match="pass key="):
        algo.act(policy, obs, mask)
    with pytest.raises(ValueError, match="choose from greedy, sample"):
        ppo.PPOConfig(eval_policy="random")
    # evaluation is reproducible from its key, and sampling plays other episodes than the argmax
    a, b = jax.jit(algo.evaluate)(state, jax.random.key(4)), jax.jit(algo.evaluate)(state, jax.random.key(4))
    np.testing.assert_array_equal(a.returns, b.returns)
    g = jax.jit(greedy.evaluate)(state, jax.random.key(4))
    assert not np.array_equal(np.asarray(a.lengths), np.asarray(g.lengths))


@pytest.mark.parametrize("shape", [(774, 32), (32, 32), (64, 1), (3, 200)])
def test_orthogonal_init__is_flaxs_bit_for_bit_also_under_vmap(shape):
    """LAPACK's batched QR deadlocked SAC's vmapped init on jumanji:SearchAndRescue-v0 (jaxlib 0.10
    CPU); our orthogonal initializer gives flax's matrices exactly, one QR at a time under vmap."""
    import flax.linen as nn

    keys = jax.random.split(jax.random.key(0), 3)
    # both sides compiled here, under this test's XLA options (an op run eagerly reuses whatever an
    # earlier test compiled it with, optimised or not: a last-bit difference that says nothing)
    flax_one = jax.jit(lambda k: nn.initializers.orthogonal(1.5)(k, shape))
    theirs = np.stack([flax_one(k) for k in keys])  # unbatched QRs
    np.testing.assert_array_equal(jax.jit(jax.vmap(lambda k: orthogonal(1.5)(k, shape)))(keys), theirs)
    np.testing.assert_array_equal(jax.jit(lambda k: orthogonal(1.5)(k, shape))(keys[0]), theirs[0])
    with pytest.raises(ValueError, match="2-D"):
        orthogonal()(keys[0], (2, 3, 4))


@pytest.mark.parametrize("shape", [(774, 32), (64, 64), (64, 1), (3, 200)])
def test_orthogonal_init__for_a_gpu_is_batched_over_lanes_and_flaxs_matrix_to_rounding(shape):
    """On a GPU the solver's QR runs one call per lane (cuSOLVER geqrf + orgqr in a loop over the
    seeds), which dominated a many-seed PPO init. Lowered for CUDA here (no GPU needed), the vmapped
    init calls no solver and loops over the kernel's columns, not the lanes; the Householder
    matrices equal flax's to float rounding."""
    import re

    import flax.linen as nn

    from algos.networks import _orthonormal_columns_householder

    keys = jax.random.split(jax.random.key(0), 37)  # 37 lanes: a loop over them would count to 37
    init = jax.jit(jax.vmap(lambda k: orthogonal(1.5)(k, shape)))
    cuda = init.trace(keys).lower(lowering_platforms=("cuda",)).as_text()
    assert not re.findall(r"custom_call @\w*(geqrf|orgqr|qr)", cuda)
    assert "dense<37>" not in cuda and "stablehlo.while" in cuda  # loops over columns only
    cpu = init.trace(keys).lower(lowering_platforms=("cpu",)).as_text()  # flax's, a QR per lane
    assert "dense<37>" in cpu and re.findall(r"custom_call @\w*geqrf", cpu)
    z = jax.vmap(lambda k: jax.random.normal(k, (max(shape), min(shape))))(keys[:8])
    q = jax.jit(jax.vmap(_orthonormal_columns_householder))(z)
    flax_one = jax.jit(lambda k: nn.initializers.orthogonal(1.0)(k, shape))
    theirs = np.stack([flax_one(k) for k in keys[:8]])
    ours = np.asarray(q if shape[0] >= shape[1] else np.swapaxes(q, 1, 2))
    np.testing.assert_allclose(ours, theirs, atol=5e-6)
    np.testing.assert_allclose(np.swapaxes(q, 1, 2) @ q, np.broadcast_to(np.eye(min(shape)), (8, min(shape),
                               min(shape))), atol=5e-6)


def test_orthogonal_init__no_qr_in_the_lanes_init_takes_a_batch():
    import re

    env, p = envs.make("Pendulum-v1")
    algo = sac.make(sac.SACConfig(num_envs=2, buffer_size=64, batch_size=8, learning_starts=8,
                                  total_timesteps=32, steps_per_chunk=4, hidden=(16, 16)), env, p)
    lanes = jax.random.split(jax.random.key(0), 4).reshape(2, 2)
    hp = jax.tree.map(lambda x: jnp.full((2,), x), sac.SACHParams.default())
    hlo = jax.jit(batched(algo.init)).lower(lanes, hp).as_text()
    operands = re.findall(r"custom_call @\w*geqrf\w*\(.*: \(tensor<([0-9x]+?)xf32>\)", hlo)
    assert operands and all(o.count("x") == 1 for o in operands), operands  # [m, n]: one matrix each


@pytest.mark.parametrize("make, expect", [
    (lambda: ppo.PPOConfig(activation="swish"), r"activation='swish'; choose from tanh, relu"),
    (lambda: ppo.PPOConfig(hidden=(64, -1)), r"PPOConfig.hidden must be layer widths >= 1, got \(64, -1\)"),
    (lambda: sac.SACConfig(hidden=(0,)), r"SACConfig.hidden must be layer widths >= 1"),
    (lambda: sac.SACConfig(total_timesteps=1000, learning_starts=1000),
     r"total_timesteps=1000 leaves no step to learn from after the random warm-up \(learning_starts=1000"),
])
def test_configs__a_value_no_network_or_budget_can_use_is_refused_when_the_config_is_made(make, expect):
    """Refused as the config is made (a study's check and ``harness.train --set`` show it in one
    line), not inside a traced kernel (a KeyError, a negative dimension) or as a run of 0 chunks."""
    with pytest.raises(ValueError, match=expect):
        make()
    assert sac.SACConfig(total_timesteps=1004, learning_starts=1000).num_chunks == 1  # one step past it: runs
