"""harness.render: a picture for every registered env, changing as the episode moves.

The GIF itself (one frame per step plus the first) is checked end to end in test_study.py.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

import envs
from harness.render import RENDERERS


def test_render__every_registered_env_has_a_renderer():
    assert set(envs.registered()) <= set(RENDERERS)


@pytest.mark.parametrize("name", envs.registered())
def test_render__frames_have_one_size_and_follow_the_state(name):
    env, params = envs.make(name)
    space = env.action_space(params)
    obs, state = env.reset(jax.random.key(0), params)
    frames = [np.asarray(RENDERERS[name](np.asarray(obs), params))]
    for i in range(8):
        key = jax.random.key(i + 1)
        mask = env.action_mask(state, params)
        action = space.sample(key) if mask is None else jax.numpy.argmax(mask)  # a legal move
        s = env.step(key, state, action, params)
        frames.append(np.asarray(RENDERERS[name](np.asarray(s.obs), params)))
        state = s.state
    assert len({f.shape for f in frames}) == 1 and frames[0].ndim == 3
    assert not np.array_equal(frames[0], frames[-1]), "the picture follows the episode"


def test_render__a_brax_robot_is_drawn_from_its_states_and_follows_them():
    pytest.importorskip("brax")
    from harness.render import brax_frames

    assert os.environ.get("MUJOCO_GL") in ("egl", "osmesa"), "no libEGL or libOSMesa: install Mesa's EGL"
    env, params = envs.make("brax:inverted_pendulum")
    obs, state = env.reset(jax.random.key(0), params)
    states = [jax.device_get(state)]
    step = jax.jit(env.step)
    for i in range(30):  # push the cart one way: it moves, the pole tips
        s = step(jax.random.key(i), state, jax.numpy.ones(env.action_space(params).shape), params)
        state = s.state
        states.append(jax.device_get(state))
    frames = [np.asarray(f) for f in brax_frames(env, states[::10], width=160, height=120)]
    assert len(frames) == 4 and {f.shape for f in frames} == {(120, 160, 3)}
    assert all(f.std() > 10 for f in frames)  # a scene, not a blank picture
    assert not np.array_equal(frames[0], frames[-1]), "the picture follows the robot"


def test_render__no_opengl_for_mujoco_is_one_clear_error(tmp_path):
    pytest.importorskip("brax")
    import subprocess
    import sys

    code = ("import jax, envs\n"
            "from harness.render import RenderError, brax_frames\n"
            "env, params = envs.make('brax:inverted_pendulum')\n"
            "try:\n"
            "    brax_frames(env, [env.reset(jax.random.key(0), params)[1]])\n"
            "except RenderError as err:\n"
            "    print('RenderError:', err)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MUJOCO_GL": "disable"})  # as where no OpenGL library loads
    assert "RenderError: MuJoCo cannot render with MUJOCO_GL=disable" in r.stdout, r.stdout + r.stderr
    assert "apt install libegl1 libegl-mesa0" in r.stdout
