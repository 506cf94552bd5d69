"""Environments of one's own: named by import path or file, held by a study file, checked against the
contract before Ray starts; the example study of docs/own-env.md run as written; studies from entry points."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import envs
from envs.check import EnvContractError

ROOT = Path(__file__).resolve().parent.parent


def _doc_example() -> str:
    text = (ROOT / "docs" / "own-env.md").read_text()
    match = re.search(r"<!-- example: my_study.py -->\n```python\n(.*?)```", text, re.S)
    assert match, "docs/own-env.md lost its example study file"
    return match.group(1)


def _study(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.study", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd)


def _one_error_line(result: subprocess.CompletedProcess, expect: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and expect in lines[0], result.stderr
    assert "Traceback" not in result.stderr


# -- naming an env by where its code is -------------------------------------------------------------

@pytest.fixture
def corridor_module(tmp_path, monkeypatch):
    """``corridor_mod.py`` (the env of docs/own-env.md) importable as a module, and the same file by path."""
    (tmp_path / "corridor_mod.py").write_text(_doc_example() + textwrap.dedent("""
        def make_env():
            env = Corridor()
            return env, env.default_params.replace(length=5)
        INSTANCE = Corridor()
        NOT_AN_ENV = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "corridor_mod.py"


def test_make__by_import_path_or_file_builds_the_env(corridor_module):
    for name in ("corridor_mod:Corridor", "corridor_mod:INSTANCE", "corridor_mod:STUDY.env",
                 f"{corridor_module}:Corridor"):
        env, params = envs.make(name)
        assert env.name == "Corridor" and params.length == 8, name
        envs.check(env, params)
    env, params = envs.make("corridor_mod:make_env")  # a factory returning (env, params)
    assert params.length == 5 and env.observation_space(params).shape == (5,)
    assert envs.make("corridor_mod:Corridor", max_steps=9)[1].max_steps == 9


def test_make__bad_code_names_say_what_is_wrong(corridor_module, tmp_path):
    cases = {
        "corridor_mod:Nope": "has no 'Nope'; corridor_mod has Corridor, INSTANCE, make_env",  # what it could be
        "corridor_mod:STUDY.nop": "has no 'STUDY.nop'; corridor_mod.STUDY has env",
        "corridor_mod:NOT_AN_ENV": "must be an envs.Environment",
        f"{tmp_path}/missing.py:Env": "no Python file",
        "no_such_module_xyz:Env": "neither an adapter library",
    }
    for name, expect in cases.items():
        with pytest.raises(envs.UnknownEnvError, match=re.escape(expect)):
            envs.make(name)
    (tmp_path / "broken_mod.py").write_text("x = 1\nraise RuntimeError('boom')\n")
    with pytest.raises(envs.UnknownEnvError, match=r"broken_mod.py:2 failed: RuntimeError: boom"):
        envs.make(f"{tmp_path}/broken_mod.py:x")


# -- the contract check -----------------------------------------------------------------------------

BROKEN = {
    # what is changed in the docs' corridor -> what the check must say
    "obs_dtype": ("return jax.nn.one_hot(state.pos, params.length), state",
                  "return jax.nn.one_hot(state.pos, params.length).astype(jnp.int32), state",
                  "reset observation has shape (8,) dtype int32"),
    "obs_shape": ("return Box(0.0, 1.0, (params.length,))", "return Box(0.0, 1.0, (params.length + 1,))",
                  "the observation space says shape (9,)"),
    "no_time": ("new = CorridorState(pos=pos, time=state.time + 1)",
                "new = CorridorState(pos=pos, time=state.time)",
                "not truncated at max_steps"),
    "python_branch": ("pos = jnp.clip(", "pos = state.pos if action == 0 else jnp.clip(",
                      "step does not run under jit and vmap"),
    # an env that works only eagerly fails in the check, naming the method (not inside a trial)
    "eager_reset": ("state = CorridorState(pos=jnp.int32(0), time=jnp.int32(0))",
                    "state = CorridorState(pos=jnp.int32(int(jax.random.randint(key, (), 0, 1))), "
                    "time=jnp.int32(0))", "reset does not run under jit and vmap"),
    "eager_mask": ("        return Discrete(2)  # 0: left, 1: right\n",
                   "        return Discrete(2)\n\n    def action_mask(self, state, params):\n"
                   "        return jnp.array([bool(state.pos > 0), True])\n",
                   "action_mask does not run under jit and vmap"),
    "mask_shape": ("        return Discrete(2)  # 0: left, 1: right\n",
                   "        return Discrete(2)\n\n    def action_mask(self, state, params):\n"
                   "        return jnp.ones(3, jnp.bool_)\n",
                   "action_mask has shape (3,) dtype bool; Discrete(2) needs a bool mask of shape (2,)"),
    "reward_shape": ("reward=jnp.where(at_exit, 1.0, -0.01)",
                     "reward=jnp.where(at_exit, 1.0, -0.01) * jnp.ones(2)",
                     "reward has shape (2,)"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_check__names_what_is_wrong_in_one_line(case, tmp_path):
    old, new, expect = BROKEN[case]
    source = _doc_example()
    assert old in source
    path = tmp_path / f"broken_{case}.py"
    path.write_text(source.replace(old, new))
    env, params = envs.make(f"{path}:Corridor")
    with pytest.raises(EnvContractError) as err:
        envs.check(env, params)
    assert expect in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_check__params_are_traced_as_in_a_trial_so_a_python_branch_on_them_fails_there():
    from envs.cartpole import CartPole

    class EagerCartPole(CartPole):  # a Python branch on a params leaf: works eagerly only
        def transition(self, key, state, action, params):
            return super().transition(key, state, action if float(params.gravity) > 0 else 1 - action, params)

    env, params = EagerCartPole(), CartPole().default_params
    env.step(jax.random.key(0), env.reset(jax.random.key(0), params)[1], jnp.int32(0), params)  # eagerly: fine
    with pytest.raises(EnvContractError, match=r"step does not run under jit and vmap with traced params: "
                                               r"ConcretizationTypeError"):
        envs.check(env, params)


def test_check__accepts_every_registered_env():
    for name in envs.registered():
        envs.check(*envs.make(name))


def test_study_cli__broken_env_is_one_line_before_ray(tmp_path):
    old, new, _ = BROKEN["obs_dtype"]
    path = tmp_path / "my_study.py"
    path.write_text(_doc_example().replace(old, new))
    r = _study(str(path), "--smoke", "--out", str(tmp_path / "results"))
    _one_error_line(r, "study corridor_ppo: env 'Corridor': reset observation has shape (8,) dtype int32")
    assert not (tmp_path / "results").exists(), "nothing may start before the env is checked"


# -- the docs' example, run as written, and an env module next to a study file ---------------------

@pytest.mark.slow
def test_docs_example__custom_env_study_runs_and_learns(tmp_path, ray_env):
    (tmp_path / "my_study.py").write_text(_doc_example())
    # the docs' command, less the final phase and the ablation path (the registered smoke study
    # tests both end to end: the same remote tasks on any env)
    r = _study("my_study.py", "--smoke", "--top-k", "0", "--out", "results", env=ray_env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    root = tmp_path / "results" / "corridor_ppo-smoke"
    meta = json.loads((root / "study.json").read_text())
    assert meta["env"] == f"{tmp_path / 'my_study.py'}:STUDY.env"
    best = json.loads((root / "reports" / "best.json").read_text())
    # the exit is 7 steps away: 1 - 6 x 0.01 = 0.94 at best; walking at random rarely gets there
    assert best["search_score"] > 0.8, best


def write_side_study(folder: Path) -> Path:
    """The docs' example study as ``folder/side_study.py`` (study "side") whose env comes from the
    module beside it, ``corridor_envs.py`` (a 4-cell corridor); returns the study file."""
    (folder / "corridor_envs.py").write_text(_doc_example().split("STUDY = Study(")[0] + textwrap.dedent("""
        def make_env():
            env = Corridor()
            return env, env.default_params.replace(length=4)
    """))
    study = _doc_example().split("STUDY = Study(")[1]
    study = study.replace("env=Corridor(),", 'env="corridor_envs:make_env",').replace('"corridor_ppo"', '"side"')
    (folder / "side_study.py").write_text("from harness.space import *\nSTUDY = Study(" + study)
    return folder / "side_study.py"


def test_study_file__its_folder_reaches_the_embedded_rays_workers(tmp_path, monkeypatch):
    """The embedded Ray's workers inherit the driver's environment (Ray starts them from it), so
    a module beside a study file reaches them through PYTHONPATH; on a cluster the folder is
    shipped as the job's working directory (tests/test_study.py, existing cluster)."""
    import os

    import ray

    from harness.cluster import session as cluster

    monkeypatch.setattr(os, "environ", {**os.environ, "PYTHONPATH": "/elsewhere"})
    seen = {}
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw, env=dict(os.environ)) or None)
    cluster.start(None, code_dir=str(tmp_path))
    assert seen["env"]["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/elsewhere"]
    assert "runtime_env" not in seen and seen["_node_ip_address"] == "127.0.0.1"
    shipped = cluster._shipped_code(str(tmp_path))
    assert shipped["working_dir"] == str(tmp_path)
    assert {Path(p).name for p in shipped["py_modules"]} == {"algos", "envs", "harness", "studies"}


# -- studies from installed packages ----------------------------------------------------------------

def _plugin(tmp_path: Path, target: str, body: str) -> dict:
    """A fake installed distribution registering ``target`` in the rl_harness.studies group."""
    site = tmp_path / "site"
    (site / "harness_plugin_demo").mkdir(parents=True)
    (site / "harness_plugin_demo" / "__init__.py").write_text("")
    (site / "harness_plugin_demo" / "studies.py").write_text(textwrap.dedent(body))
    info = site / "harness_plugin_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: harness-plugin-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[rl_harness.studies]\nplugin_corridor = {target}\n")
    return {**__import__("os").environ, "PYTHONPATH": f"{site}:{ROOT}", "JAX_PLATFORMS": "cpu"}


PLUGIN = """
    from harness.space import Budget, LogUniform, Study

    STUDY = Study(name="plugin_corridor", description="a study from an installed package",
                  env="CartPole-v1", algo="ppo", space=dict(lr=LogUniform(1e-4, 1e-3)),
                  cpu=Budget(1, 1, 1, 1024), gpu=Budget(1, 1, 1, 1024), smoke=Budget(1, 1, 1, 1024))
"""


def test_entry_points__installed_studies_are_listed_and_found(tmp_path):
    env = _plugin(tmp_path, "harness_plugin_demo.studies:STUDY", PLUGIN)
    r = subprocess.run([sys.executable, "-m", "harness.study", "--list"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.splitlines()]
    assert "plugin_corridor" in names and "cartpole_ppo" in names
    check = ("import studies; s = studies.get('plugin_corridor'); print(s.name, s.env)")
    r = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.stdout.split() == ["plugin_corridor", "CartPole-v1"], r.stderr
    unknown = _study("nope", "--out", str(tmp_path / "o"), env=env, cwd=tmp_path)
    _one_error_line(unknown, "plugin_corridor")


def test_entry_points__a_broken_one_is_named(tmp_path):
    env = _plugin(tmp_path, "harness_plugin_demo.studies:NOT_THERE", PLUGIN)
    r = subprocess.run([sys.executable, "-m", "harness.study", "--list"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    _one_error_line(r, "entry point 'plugin_corridor' (harness_plugin_demo.studies:NOT_THERE) of "
                       "rl_harness.studies failed to load")

