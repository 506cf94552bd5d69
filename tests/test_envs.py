"""Environment contracts for every registered env, and step-for-step parity with gymnasium."""

from __future__ import annotations

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.cartpole import CartPoleState
from envs.pendulum import PendulumState

ALL = envs.registered()


def test_make__unknown_name_lists_known_envs():
    with pytest.raises(envs.UnknownEnvError) as err:
        envs.make("CartPool-v1")
    for name in ALL:
        assert name in str(err.value)


@pytest.mark.parametrize("name", ALL)
def test_contract__reset_and_step_trace_once_under_jit(name):
    env, params = envs.make(name)
    chex.clear_trace_counter()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def reset(key):
        return env.reset(key, params)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(key, state, action):
        return env.step(key, state, action, params)

    space = env.action_space(params)
    _, state = reset(jax.random.key(0))
    _, state = reset(jax.random.key(1))
    for i in range(3):
        key = jax.random.key(10 + i)
        state = step(key, state, space.sample(key)).state


def _random_rollout(env, params, key, n_steps):
    space = env.action_space(params)

    def body(state, k):
        k_a, k_s = jax.random.split(k)
        action = space.sample(k_a)
        s = env.step(k_s, state, action, params)
        return s.state, (s, action)

    _, state = env.reset(key, params)
    return jax.lax.scan(body, state, jax.random.split(key, n_steps))[1]


@pytest.mark.parametrize("name", ALL)
def test_contract__outputs_finite_and_inside_spaces(name):
    env, params = envs.make(name)
    steps, actions = jax.jit(lambda k: _random_rollout(env, params, k, 2000))(jax.random.key(3))
    obs_space, act_space = env.observation_space(params), env.action_space(params)
    assert bool(jax.vmap(act_space.contains)(actions).all())
    for obs in (steps.obs, steps.final_obs):
        assert np.isfinite(np.asarray(obs)).all()
        assert bool(jax.vmap(obs_space.contains)(obs).all())
    assert np.isfinite(np.asarray(steps.reward)).all()
    assert steps.reward.dtype == jnp.float32
    assert not bool((steps.terminated & steps.truncated).any())
    assert int(steps.done.sum()) > 0, "2000 random steps should end an episode"
    first_obs, _ = env.reset(jax.random.key(0), params)
    assert bool(obs_space.contains(first_obs))


@pytest.mark.parametrize("name", ALL)
def test_contract__same_key_same_trajectory(name):
    env, params = envs.make(name)
    run = jax.jit(lambda k: _random_rollout(env, params, k, 300)[0].obs)
    a, b, c = run(jax.random.key(7)), run(jax.random.key(7)), run(jax.random.key(8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("name", ALL)
def test_contract__time_limit_truncates_keeps_final_obs_and_resets(name):
    env, params = envs.make(name)
    params = params.replace(max_steps=3)
    space = env.action_space(params)
    _, state = env.reset(jax.random.key(0), params)
    zero = jnp.zeros(space.shape, space.dtype)
    candidates = [jnp.asarray(a, space.dtype) for a in range(space.n)] if hasattr(space, "n") else [zero]
    for i in range(3):
        key = jax.random.key(100 + i)
        k_tr = jax.random.split(key)[0]
        # an action that does not end the episode by itself (Snake could hit a wall)
        action = next((a for a in candidates
                       if not bool(env.transition(k_tr, state, a, params).terminated)), zero)
        s = env.step(key, state, action, params)
        expect_final = env.transition(k_tr, state, action, params).obs
        np.testing.assert_array_equal(s.final_obs, expect_final)
        if i < 2:
            assert not bool(s.done)
            np.testing.assert_array_equal(s.obs, s.final_obs)
        state = s.state
    assert bool(s.truncated) and not bool(s.terminated)
    assert int(s.state.time) == 0, "the episode is reset after truncation"
    assert not np.array_equal(np.asarray(s.obs), np.asarray(s.final_obs))


# ---- parity with gymnasium, from matched states, step for step ----------------------------

def _balancing_action(obs: np.ndarray, rng: np.random.Generator) -> int:
    """Mostly balances the pole (so episodes also reach the 500-step limit), sometimes random."""
    if rng.random() < 0.4:
        return int(rng.integers(2))
    x, x_dot, theta, theta_dot = obs
    return int(theta + 0.3 * theta_dot + 0.01 * x + 0.05 * x_dot > 0)


def _check_parity(gym_env, our_env, params, to_state, policy, n_steps, seed):
    """Steps gymnasium and our env side by side, copying gymnasium's state into ours each step."""
    step = jax.jit(lambda k, s, a: our_env.step(k, s, a, params))
    rng = np.random.default_rng(seed)
    obs, _ = gym_env.reset(seed=seed)
    t, ends = 0, {"terminated": 0, "truncated": 0}
    for i in range(n_steps):
        state = to_state(gym_env.unwrapped.state, t)
        action = policy(obs, rng)
        ours = step(jax.random.key(i), state, jnp.asarray(action))
        obs, reward, terminated, truncated, _ = gym_env.step(action)
        t += 1
        np.testing.assert_allclose(ours.final_obs, obs, atol=1e-5)
        # float32 against float64: Pendulum costs reach ~16, so allow 1e-6 relative as well
        np.testing.assert_allclose(ours.reward, reward, atol=1e-5, rtol=1e-6)
        assert bool(ours.terminated) == terminated, f"step {i}"
        assert bool(ours.truncated) == (truncated and not terminated), f"step {i}"
        if not (terminated or truncated):
            np.testing.assert_allclose(ours.obs, obs, atol=1e-5)
        else:
            ends["terminated" if terminated else "truncated"] += 1
            obs, _ = gym_env.reset(seed=seed + i)
            t = 0
    return ends


def test_cartpole__matches_gymnasium_step_for_step():
    env, params = envs.make("CartPole-v1")

    def to_state(s, t):
        return CartPoleState(*(jnp.float32(v) for v in s), jnp.int32(t))

    ends = _check_parity(gym.make("CartPole-v1"), env, params, to_state, _balancing_action,
                         n_steps=4000, seed=0)
    assert ends["terminated"] >= 3 and ends["truncated"] >= 1, ends


def test_pendulum__matches_gymnasium_step_for_step():
    env, params = envs.make("Pendulum-v1")

    def to_state(s, t):
        return PendulumState(jnp.float32(s[0]), jnp.float32(s[1]), jnp.int32(t))

    def policy(obs, rng):
        return rng.uniform(-2.0, 2.0, size=(1,)).astype(np.float32)

    ends = _check_parity(gym.make("Pendulum-v1"), env, params, to_state, policy,
                         n_steps=2000, seed=1)
    assert ends == {"terminated": 0, "truncated": 10}


def test_continuous_cartpole__is_cartpole_with_scaled_force():
    cont, params = envs.make("ContinuousCartPole-v1")
    disc, _ = envs.make("CartPole-v1")
    _, state = disc.reset(jax.random.key(0), params)
    for a_cont, a_disc in ((1.0, 1), (-1.0, 0), (5.0, 1)):
        ours = cont.transition(jax.random.key(0), state, jnp.array([a_cont]), params)
        ref = disc.transition(jax.random.key(0), state, jnp.int32(a_disc), params)
        np.testing.assert_allclose(ours.obs, ref.obs, atol=1e-7)
    half = cont.transition(jax.random.key(0), state, jnp.array([0.5]), params).obs
    ref = disc.transition(jax.random.key(0), state, jnp.int32(1), params.replace(force_mag=5.0))
    np.testing.assert_allclose(half, ref.obs, atol=1e-7)


@pytest.mark.parametrize("name", ["Snake-v1", "DungeonCrawl-v1"])
def test_contract__observe_hook_agrees_with_reset_and_transition(name):
    """Envs with ``observe`` let step observe the next state; it must match their own obs."""
    env, params = envs.make(name)
    obs, state = env.reset(jax.random.key(0), params)
    observe = jax.jit(lambda s: env.observe(s, params))  # compiled once: eager dungeon steps are slow
    np.testing.assert_array_equal(observe(state), obs)

    @jax.jit
    def transition_and_step(key, state):
        action = jnp.argmax(env.action_mask(state, params))
        return env.transition(key, state, action, params), env.step(key, state, action, params).state

    for i in range(20):
        tr, state = transition_and_step(jax.random.key(i), state)
        np.testing.assert_array_equal(observe(tr.state), tr.obs)
