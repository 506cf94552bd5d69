"""harness.reports.render: a picture for every registered env, changing as the episode moves; the
adapters' envs drawn by their own libraries (bench/env_coverage.py checks every registry's).

The GIF itself (one frame per step plus the first) is checked end to end in test_study.py.
"""

from __future__ import annotations

import json
import os
import re
import sys

import jax
import numpy as np
import pytest

import envs
from harness.reports.render import RENDERERS


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
    from harness.reports.render import brax_frames

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


def _keep_untrained_policy(folder, env_name, static):
    """A results folder holding an untrained PPO policy for ``env_name`` as the final phase keeps
    one (configuration t0000c0, seed 0)."""
    from dataclasses import asdict

    from flax import serialization

    from algos.ppo import PPOHParams
    from harness.kernel.compile import build_config, make_algo
    from harness.kernel.plan import FINAL, TrialPlan
    from harness.store.folder import ResultsFolder, StudyMeta

    ResultsFolder(folder).write_meta(StudyMeta(study="s", env=env_name, algo="ppo"))
    algo = make_algo(env_name, "ppo", build_config("ppo", static))
    params = algo.policy_params(jax.jit(algo.init)(jax.random.key(0), PPOHParams.default()))
    (folder / "p.msgpack").write_bytes(serialization.to_bytes(params))
    plan = TrialPlan(env_name, "ppo", static, [{}], 1, 0, stream=FINAL)
    ResultsFolder(folder).keep_policies("t0000c0", [folder / "p.msgpack"], {
        "config_id": "t0000c0", "study": "s", "env": env_name, "algo": "ppo", "config": static, "hparams": {},
        "seeds": [{"seed": 0, "score": 0.0, "plan": asdict(plan), "config_index": 0, "seed_index": 0}]})


def _first_and_last(gif):
    from PIL import Image

    with Image.open(gif) as im:
        n, size = im.n_frames, im.size
        first = np.asarray(im.convert("RGB"))
        im.seek(im.n_frames - 1)
        return n, size, first, np.asarray(im.convert("RGB"))


def test_play__a_kept_robot_policy_is_re_evaluated_and_drawn_by_mujoco_at_most_200_frames(tmp_path):
    """What ``harness.play`` does with a Brax study's kept policy (the final phase keeps one the
    same way), on the cheapest robot: an untrained policy on the inverted pendulum."""
    pytest.importorskip("brax")
    from harness.play import play

    _keep_untrained_policy(tmp_path, "brax:inverted_pendulum", dict(
        num_envs=2, num_steps=8, hidden=[16, 16], eval_episodes=1, normalize_observations=True, squash="tanh"))
    out = play(tmp_path, gif=tmp_path / "robot.gif")
    assert 1 <= out["frames"] <= 200 and out["steps"] >= 1
    n, size, first, last = _first_and_last(tmp_path / "robot.gif")
    assert n == out["frames"] and size == (320, 240)
    assert first.std() > 10 and (out["frames"] == 1 or not np.array_equal(first, last))


@pytest.mark.parametrize("env_name, episode_seed", [
    ("jumanji:Minesweeper-v0", 2),  # an episode of 6 clicks (from seed 0: a mine at the first)
    ("gymnax:Catch-bsuite", 0),
    ("gymnax:CartPole-v1", 0)])  # a classic-control env: gymnasium's renderer, as gymnax's Visualizer means to
def test_play__a_kept_jumanji_or_gymnax_policy_is_drawn_from_its_states(env_name, episode_seed, tmp_path):
    """Jumanji's ``render``, gymnax's ``Visualizer`` and, for gymnax's classic-control envs,
    gymnasium's renderer draw the episode from its states, off screen (no window opens here:
    pyplot's Agg, pygame's dummy video driver), one frame per step before the end, 320 pixels wide."""
    pytest.importorskip(env_name.split(":")[0])
    if env_name == "gymnax:CartPole-v1":
        pytest.importorskip("pygame")  # gymnasium's renderer
    from harness.play import play

    _keep_untrained_policy(tmp_path, env_name, dict(num_envs=2, num_steps=8, hidden=[16, 16], eval_episodes=1))
    out = play(tmp_path, gif=tmp_path / "ep.gif", episode_seed=episode_seed)
    n, (width, _), first, last = _first_and_last(tmp_path / "ep.gif")
    assert n == out["frames"] == out["steps"] >= 2 and width == 320
    below_captions = slice(first.shape[0] // 4, None)  # the rows under our caption and the library's title
    assert first.std() > 10 and not np.array_equal(first[below_captions], last[below_captions])


@pytest.mark.parametrize("steps, stride", [(1, 1), (200, 1), (201, 2), (450, 3)])
def test_play__a_long_episode_is_drawn_in_at_most_200_evenly_spaced_frames(steps, stride, tmp_path, monkeypatch):
    """An env drawn from its states: every k-th state from the first, k the fewest that keeps 200
    or fewer frames; the GIF has them all (each captioned with its step, so none is merged)."""
    from PIL import Image

    from harness.play import Episode, _write_gif
    from harness.reports import render

    given = []

    def frames(env, env_params, states, width=320):  # the library's drawing, recording what it is asked
        given.extend(states)
        return [Image.new("RGB", (320, 60), "white") for _ in states]

    monkeypatch.setattr(render, "state_frames", frames)
    episode = Episode(obs=[None] * (steps + 1), returns=[float(t) for t in range(steps + 1)],
                      states=list(range(steps)))  # each state its own step number
    out = _write_gif(tmp_path / "long.gif", {"env": "gymnax:CartPole-v1", "config_id": "t0000c0"}, None, None,
                     episode)
    assert given == list(range(0, steps, stride)) and len(given) <= 200
    assert len(out) == len(given) == Image.open(tmp_path / "long.gif").n_frames


def test_render__an_env_its_library_cannot_draw_is_one_clear_error():
    pytest.importorskip("gymnax")
    from harness.reports.render import RenderError, state_frames

    env, params = envs.make("gymnax:DeepSea-bsuite")
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    with pytest.raises(RenderError, match=r"^gymnax's Visualizer has no picture of gymnax:DeepSea-bsuite$"):
        state_frames(env, params, [jax.device_get(state)])


def test_render__a_classic_control_env_without_pygame_is_one_line_saying_what_to_install(monkeypatch):
    pytest.importorskip("gymnax")
    from harness.reports.render import RenderError, state_frames

    env, params = envs.make("gymnax:Acrobot-v1")
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    monkeypatch.setitem(sys.modules, "pygame", None)  # `import pygame` fails, as where it is not installed
    expect = ("gymnasium draws gymnax:Acrobot-v1 with pygame, which is not installed here: pip install pygame "
              "(it comes with rl-harness[adapters])")
    with pytest.raises(RenderError, match=f"^{re.escape(expect)}$"):
        state_frames(env, params, [jax.device_get(state)])


def test_play__a_folder_or_kept_policy_it_cannot_use_is_one_line(tmp_path, capsys):
    """What ``python -m harness.play`` says for a folder that is not a study's, and for a kept
    policy changed or damaged on disk: one line each, exit status 2 (no traceback)."""
    pytest.importorskip("gymnax")
    from harness.play import main

    def said(folder):
        assert main([str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: "), err
        return err.strip()

    empty = tmp_path / "empty"
    empty.mkdir()
    assert said(empty) == f"error: {empty} is not a study's results folder (no study.json)"
    _keep_untrained_policy(tmp_path, "CartPole-v1", dict(num_envs=2, num_steps=8, hidden=[8], eval_episodes=1))
    kept = tmp_path / "checkpoints" / "t0000c0"
    policy = (kept / "policy.json").read_text()
    (kept / "policy.json").write_text(policy.replace('"seeds"', '"sedes"'))
    assert said(tmp_path).endswith("policy.json is not a kept policy's policy.json (KeyError: 'seeds')")
    (kept / "policy.json").write_text(policy.replace('"CartPole-v1"', '"gymnax:Cartpole-v1"'))
    assert ("the study's ppo on gymnax:Cartpole-v1 cannot be made here (UnknownEnvError: unknown gymnax env "
            "'Cartpole-v1'") in said(tmp_path)
    (kept / "policy.json").write_text(policy)
    weights = (kept / "seed_0.msgpack").read_bytes()
    (kept / "seed_0.msgpack").write_bytes(b"\x93garbage")
    assert said(tmp_path).startswith(f"error: the kept policy {kept / 'seed_0.msgpack'} cannot be read (")
    other = json.loads(policy)
    other["config"]["hidden"] = [8, 8]  # a layer more than the kept parameters have
    (kept / "policy.json").write_text(json.dumps(other))
    (kept / "seed_0.msgpack").write_bytes(weights)
    assert f"error: the kept policy {kept / 'seed_0.msgpack'} does not fit its network (" in said(tmp_path)


def test_render__no_opengl_for_mujoco_is_one_clear_error(tmp_path):
    pytest.importorskip("brax")
    import subprocess
    import sys

    code = ("import jax, envs\n"
            "from harness.reports.render import RenderError, brax_frames\n"
            "env, params = envs.make('brax:inverted_pendulum')\n"
            "try:\n"
            "    brax_frames(env, [jax.jit(env.reset)(jax.random.key(0), params)[1]])\n"  # jitted: eager is slow
            "except RenderError as err:\n"
            "    print('RenderError:', err)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MUJOCO_GL": "disable"})  # as where no OpenGL library loads
    assert "RenderError: MuJoCo cannot render with MUJOCO_GL=disable" in r.stdout, r.stdout + r.stderr
    assert "apt install libegl1 libegl-mesa0" in r.stdout


def test_play__a_gif_whose_folder_does_not_exist_is_refused_before_anything_runs(tmp_path):
    from harness.play import PlayError, play

    with pytest.raises(PlayError, match=r"^cannot write .*nowhere/ep.gif: no folder .*nowhere$"):
        play(tmp_path, gif=tmp_path / "nowhere" / "ep.gif")
    with pytest.raises(PlayError, match=r"^no results folder at "):  # with the folder there, the next check
        play(tmp_path / "results", gif=tmp_path / "ep.gif")
