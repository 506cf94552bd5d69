"""Brax environments through envs.adapters.brax: the contract, one-step agreement with Brax's own
``env.step`` from the same state, and falls (terminated) kept apart from time limits (truncated)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs

pytest.importorskip("brax", reason="the brax extra: pip install -e '.[brax]'")

NAME = "brax:inverted_pendulum:positional"  # the cheapest backend to compile on a CPU


@pytest.fixture(scope="module")
def pendulum():
    return envs.make(NAME)


def test_brax__contract_and_spaces(pendulum):
    env, params = pendulum
    envs.check(env, params)
    assert env.action_space(params) == envs.Box(-1.0, 1.0, (1,))
    assert env.observation_space(params).shape == (4,) and params.max_steps == 1000
    assert envs.make("brax:inverted_pendulum", backend="positional")[0] == env  # hashable by value


def test_brax__one_step_agrees_with_brax_env_step_from_the_same_state(pendulum):
    from brax import envs as brax_envs

    env, params = pendulum
    theirs = brax_envs.get_environment("inverted_pendulum", backend="positional")
    _, state = env.reset(jax.random.key(0), params)
    step = jax.jit(lambda k, s, a: env.step(k, s, a, params))
    their_step = jax.jit(theirs.step)
    for i, a in enumerate([0.3, -0.7, 1.0, 0.05]):
        action = jnp.array([a], jnp.float32)
        ours = step(jax.random.key(i), state, action)
        expect = their_step(state.inner, action)
        np.testing.assert_allclose(ours.final_obs, expect.obs, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ours.state.inner.pipeline_state.q, expect.pipeline_state.q, atol=1e-6)
        assert float(ours.reward) == pytest.approx(float(expect.reward))
        assert bool(ours.terminated) == bool(expect.done) and not bool(ours.truncated)
        state = ours.state
    assert int(state.time) == 4


def test_brax__a_fall_terminates_and_the_time_limit_truncates(pendulum):
    env, params = pendulum
    push = jnp.ones((1,), jnp.float32)

    def run(p, n):
        def body(s, k):
            out = env.step(k, s, push, p)
            return out.state, (out.terminated, out.truncated, out.state.time, out.obs, out.final_obs)

        _, s = env.reset(jax.random.key(1), p)
        return jax.lax.scan(body, s, jax.random.split(jax.random.key(2), n))[1]

    term, trunc, time, obs, final = jax.jit(lambda: run(params, 200))()
    first = int(np.argmax(np.asarray(term)))
    assert term[first] and not trunc[:first + 1].any(), "pushing the cart one way drops the pole: a fall"
    assert abs(float(final[first][1])) > 0.2 and int(time[first]) == 0  # Brax's fall angle; then reset
    assert abs(float(obs[first][1])) < 0.05  # the new episode starts upright

    short = params.replace(max_steps=5)
    term, trunc, time, obs, final = jax.jit(lambda: run(short, 5))()
    assert first > 5, "the pole must stay up for the first 5 steps for this check"
    assert not term.any() and trunc.tolist() == [False] * 4 + [True] and int(time[-1]) == 0
    assert not np.array_equal(obs[-1], final[-1])  # final_obs is what PPO bootstraps from


def test_brax__unknown_names_and_backends_list_the_choices():
    with pytest.raises(envs.UnknownEnvError, match="brax envs: ant, halfcheetah, hopper"):
        envs.make("brax:antt")
    with pytest.raises(envs.UnknownEnvError, match="backends: mjx, generalized, positional, spring"):
        envs.make("brax:ant:bullet")
    only_generalized = r"brax:swimmer does not run on the 'positional' backend \(Brax: Unsupported backend"
    with pytest.raises(envs.UnknownEnvError, match=only_generalized + r": positional\.\); use brax:swimmer"):
        envs.make("brax:swimmer:positional")


def test_brax__swimmers_water_drag_is_mujocos_inertia_box_model():
    """Brax's fluid drag (the swimmer's water) called ``jnp.clip(a_min=)``, which this jax rejects,
    so ``brax:swimmer`` failed in every backend; the adapter mends ``brax.fluid``. Its force on
    moving links against MuJoCo's inertia-box model written out here: each link a box with the
    link's mass and inertia, drag ``-3 pi mean(b) mu v`` plus ``-rho/2 (b_j b_k) |v| v`` per axis
    of the box, in the box's frame."""
    from envs.adapters.brax import brax_envs

    brax_envs()  # what envs.make imports first: mends brax.fluid
    from brax import base, fluid

    assert np.array_equal(fluid.jp.clip(jnp.array([-1.0, 2.0]), a_min=0.0, a_max=1.5), [0.0, 1.5])
    sys = envs.make("brax:swimmer")[0].inner.sys
    n, inertia = sys.num_links(), sys.link.inertia
    x = base.Transform.create(pos=jnp.zeros((n, 3)), rot=jnp.tile(jnp.array([1.0, 0.0, 0.0, 0.0]), (n, 1)))
    vel = np.array([[0.5, -0.2, 0.0], [-0.3, 0.4, 0.1], [0.0, 0.0, -0.6]][:n], np.float32)
    force = fluid.force(sys, x, base.Motion(ang=jnp.zeros((n, 3)), vel=jnp.asarray(vel)), inertia.mass, inertia.i)

    mu, rho = float(sys.viscosity), float(sys.density)
    assert mu > 0 and rho > 0  # the swimmer's water
    diag = np.stack([np.diag(i) for i in np.asarray(inertia.i)])
    boxes = np.sqrt(6 * (diag.sum(-1, keepdims=True) - 2 * diag) / np.asarray(inertia.mass)[:, None])
    for i, (b, v) in enumerate(zip(boxes, vel, strict=True)):
        w, qx, qy, qz = np.asarray(inertia.transform.rot[i], np.float64)  # the box's frame
        rot = np.array([[1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy - w * qz), 2 * (qx * qz + w * qy)],
                        [2 * (qx * qy + w * qz), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz - w * qx)],
                        [2 * (qx * qz - w * qy), 2 * (qy * qz + w * qx), 1 - 2 * (qx * qx + qy * qy)]])
        vb = rot.T @ v
        fb = -3 * np.pi * b.mean() * mu * vb - 0.5 * rho * np.array([b[1] * b[2], b[0] * b[2], b[0] * b[1]]) \
            * np.abs(vb) * vb
        np.testing.assert_allclose(force.vel[i], rot @ fb, rtol=1e-5, atol=1e-4)
    assert np.all(np.asarray(force.vel) * vel <= 1e-4)  # against the motion
