"""gymnax and Jumanji environments through envs.adapters: interface, ends kept apart, masks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from algos import ppo

pytest.importorskip("gymnax")  # both are in the test extras; a bare install lacks them
pytest.importorskip("jumanji")


def _rollout(env, params, n_steps, key=0):
    space = env.action_space(params)

    def body(state, k):
        k_a, k_s = jax.random.split(k)
        mask = env.action_mask(state, params)
        logits = jnp.zeros(space.n) if mask is None else jnp.where(mask, 0.0, -jnp.inf)
        s = env.step(k_s, state, jax.random.categorical(k_a, logits), params)
        return s.state, s

    _, state = env.reset(jax.random.key(key), params)
    return jax.jit(lambda k: jax.lax.scan(body, state, jax.random.split(k, n_steps))[1])(
        jax.random.key(key + 1))


def test_gymnax__time_limit_is_truncation_and_failure_is_termination():
    env, params = envs.make("gymnax:CartPole-v1")
    assert env.name == "gymnax:CartPole-v1" and env.observation_space(params).shape == (4,)
    steps = _rollout(env, params, 3000)
    assert int(steps.terminated.sum()) > 20, "random CartPole falls"
    assert not bool(steps.truncated.any())
    env, params = envs.make("gymnax:Acrobot-v1", max_steps_in_episode=50)
    steps = _rollout(env, params, 500)
    assert int(steps.truncated.sum()) == 10 and not bool(steps.terminated.any())


def test_gymnax__cartpole_matches_ours_step_for_step():
    theirs, tp = envs.make("gymnax:CartPole-v1")
    ours, op = envs.make("CartPole-v1")
    obs_t, st_t = theirs.reset(jax.random.key(0), tp)
    _, st_o = ours.reset(jax.random.key(0), op)
    g = st_t.inner  # gymnax's own state
    st_o = st_o.replace(x=g.x, x_dot=g.x_dot, theta=g.theta, theta_dot=g.theta_dot)
    for i in range(30):
        a = jnp.int32(i % 3 == 0)
        t = theirs.transition(jax.random.key(i), st_t, a, tp)
        o = ours.transition(jax.random.key(i), st_o, a, op)
        np.testing.assert_allclose(t.obs, o.obs, atol=1e-5)
        assert bool(t.terminated) == bool(o.terminated)
        st_t, st_o = t.state, o.state


def test_jumanji__snake_mask_passes_through_and_masked_ppo_obeys_it():
    env, params = envs.make("jumanji:Snake-v1", num_rows=6, num_cols=6)
    assert params.max_steps == env.env.inner.time_limit, "Jumanji's own limit bounds episodes"
    steps = _rollout(env, params, 2000)
    assert int(steps.terminated.sum()) > 5
    assert not bool((steps.terminated & steps.truncated).any())
    _, state = env.reset(jax.random.key(0), params)
    assert env.action_mask(state, params).shape == (4,)
    config = ppo.PPOConfig(num_envs=8, num_steps=32, total_timesteps=8 * 32 * 3, updates_per_chunk=3,
                           num_minibatches=2, update_epochs=1)
    algo = ppo.make(config, env, params)
    hp = ppo.PPOHParams.default()
    _, m = jax.jit(algo.chunk)(algo.init(jax.random.key(0), hp), hp)
    assert float(m.illegal_actions.max()) == 0.0
    unmasked = ppo.make(config.__class__(**{**config.__dict__, "use_action_mask": False}), env, params)
    _, m = jax.jit(unmasked.chunk)(unmasked.init(jax.random.key(0), hp), hp)
    assert float(m.illegal_actions.mean()) > 0.0


def test_adapters__unknown_names_list_the_choices():
    with pytest.raises(envs.UnknownEnvError, match="gymnax envs: .*Acrobot-v1"):
        envs.make("gymnax:Acrobat-v1")
    with pytest.raises(envs.UnknownEnvError, match="jumanji envs: .*Snake-v1"):
        envs.make("jumanji:Snaek-v1")
    with pytest.raises(envs.UnknownEnvError, match=r"'mujoco_gym' is neither an adapter library "
                                                   r"\(gymnax, jumanji, brax\)"):
        envs.make("mujoco_gym:ant")


@pytest.mark.parametrize("name", ["MetaMaze-misc", "BernoulliBandit-misc"])
def test_gymnax__an_env_that_keeps_a_float_time_passes_the_contract(name):
    """gymnax's own state goes back to gymnax untouched (MetaMaze reads its float `time` back
    with lax.select); the contract's int32 time is kept beside it."""
    env, params = envs.make(f"gymnax:{name}")
    envs.check(env, params)
    _, state = env.reset(jax.random.key(0), params)
    assert state.time.dtype == jnp.int32 and jnp.asarray(state.inner.time).dtype == jnp.float32
