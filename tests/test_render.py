"""harness.render: a picture for every registered env, changing as the episode moves.

The GIF itself (one frame per step plus the first) is checked end to end in test_study.py.
"""

from __future__ import annotations

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
