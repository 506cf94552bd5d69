"""Algorithms of one's own: named by file, import path or entry point, checked against the contract
before Ray starts (algos.check), and the example of docs/own-algo.md tuned end to end as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import algos
import envs
from algos.check import AlgoContractError, check

ROOT = Path(__file__).resolve().parent.parent


def _doc(name: str) -> str:
    text = (ROOT / "docs" / "own-algo.md").read_text()
    match = re.search(rf"<!-- example: {re.escape(name)} -->\n```python\n(.*?)```", text, re.S)
    assert match, f"docs/own-algo.md lost its example {name}"
    return match.group(1)


def _run(module: str, *args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def _one_error_line(result: subprocess.CompletedProcess, *expect: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and all(e in lines[0] for e in expect), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def _spec_from(tmp_path: Path, source: str, name: str = "algo_under_test.py") -> algos.AlgoSpec:
    (tmp_path / name).write_text(source)
    return algos.get(f"{tmp_path / name}:SPEC")


# -- naming an algorithm -----------------------------------------------------------------------------

def test_get__by_file_by_import_path_and_by_a_module_defining_spec(tmp_path, monkeypatch):
    (tmp_path / "my_reinforce.py").write_text(_doc("reinforce.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    by_file = algos.get(f"{tmp_path / 'my_reinforce.py'}:SPEC")
    by_module = algos.get("my_reinforce:SPEC")
    assert by_file.name == by_module.name == "reinforce" and by_module.actions == "discrete"
    with pytest.raises(algos.UnknownAlgoError, match="has no 'SPECS'; it defines SPEC"):
        algos.get("my_reinforce:SPECS")
    with pytest.raises(algos.UnknownAlgoError, match="must name an algos.AlgoSpec"):
        algos.get("my_reinforce:Config")
    with pytest.raises(algos.UnknownAlgoError, match="no Python file at"):
        algos.get(f"{tmp_path / 'missing.py'}:SPEC")


def test_get__an_unknown_name_lists_the_built_ins_and_the_import_forms(tmp_path):
    with pytest.raises(algos.UnknownAlgoError) as err:
        algos.get("dqn")
    assert "known algos: ppo, pqn, sac" in str(err.value) and "file.py:attr" in str(err.value)
    r = _run("harness.train", "--algo", "dqn", cwd=tmp_path)
    _one_error_line(r, "unknown algo 'dqn'", "ppo, pqn, sac", "module:attr")


def _fake_distribution(site: Path, target: str) -> None:
    info = site / "reinforce_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: reinforce-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[rl_harness.algos]\nplugin_reinforce = {target}\n")


def test_entry_points__an_installed_algorithm_is_listed_and_found_by_name(tmp_path, monkeypatch):
    (tmp_path / "plugin_reinforce_mod.py").write_text(_doc("reinforce.py"))
    _fake_distribution(tmp_path, "plugin_reinforce_mod")  # a module defining SPEC
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "plugin_reinforce" in algos.registered()
    assert algos.get("plugin_reinforce").name == "reinforce"
    broken = tmp_path / "broken" / "reinforce_plugin-1.0.dist-info"
    _fake_distribution(broken.parent, "no_such_module_here")
    monkeypatch.syspath_prepend(str(broken.parent))
    with pytest.raises(algos.UnknownAlgoError, match=r"entry point 'plugin_reinforce' \(no_such_module_here\) of "
                                                     r"rl_harness.algos failed to load: ModuleNotFoundError"):
        algos.get("plugin_reinforce")


# -- the contract, checked before Ray starts ---------------------------------------------------------

def test_check__the_built_ins_and_the_docs_example_keep_the_contract(tmp_path):
    cartpole = envs.make("CartPole-v1")
    for name in ("ppo", "pqn"):
        assert check(algos.get(name), *cartpole) is not None
    assert check(algos.get("sac"), *envs.make("Pendulum-v1")) is not None
    assert check(_spec_from(tmp_path, _doc("reinforce.py")), *cartpole) is not None


@pytest.mark.parametrize("old, new, expect", [
    ("        key, k_roll = jax.random.split(s.key)\n",
     "        key, k_roll = jax.random.split(s.key)\n        if hp.lr > 0.1:\n            key = k_roll\n",
     r"chunk\(state, hparams\) works only eagerly: it uses a traced value as a Python value "
     r"at .*algo_under_test.py:\d+"),
    ("jnp.int32(0), jnp.bool_(False))", "0, jnp.bool_(False))",
     r"init returned a Python number at state.steps"),
    ("return cls(**{k: jnp.float32(v) for k, v in values.items()})", "return cls(**values)",
     r"HParams.default\(\).lr is float, not a float32 scalar"),
    ("steps = s.steps + n * config.num_steps", "steps = s.steps + n * config.num_steps * 1.0",
     r"chunk\(state, hparams\) failed under jit at .*algo_under_test.py:\d+: TypeError: scan body function carry "
     r"input and carry output must have equal types.*steps"),
    ("return jax.lax.scan(lambda c, _: update(c, hp), s, None, length=config.updates_per_chunk)",
     "s, m = jax.lax.scan(lambda c, _: update(c, hp), s, None, length=config.updates_per_chunk)\n"
     "        return s.replace(steps=s.steps * 1.0), m",
     r"chunk changes state.steps from int32\[\] to float32\[\]; the next chunk would not fit"),
    ("    episode_return: jax.Array\n    diverged: jax.Array\n",
     "    episode_return: jax.Array\n    failed: jax.Array\n",
     r"chunk's metrics have no 'diverged'"),
    ("return jax.lax.scan(lambda c, _: update(c, hp), s, None, length=config.updates_per_chunk)",
     "return jax.lax.scan(lambda c, _: update(c, hp), s, None, length=config.updates_per_chunk)[0]",
     r"chunk must return \(state, metrics\)"),
    ('ent_coef=Range(0, 1))', 'ent_coef=Range(0.5, 1))', r"default\(\).ent_coef=0.01 is outside its own RANGES"),
    ('("params", "opt_state", "diverged"))', '("params", "optimizer", "diverged"))',
     r"learner_fields names optimizer, which the state \(State\) does not have"),
    ("def evaluate(s: State, key: jax.Array, num_episodes: int | None = None) -> Any:",
     "def evaluate(s: State, key: jax.Array) -> Any:",
     r"evaluate\(state, key, num_episodes\) failed under jit: TypeError"),
    ("def act(params: Any, obs: jax.Array, mask: Any = None, key: Any = None) -> jax.Array:",
     "def act(params: Any, obs: jax.Array) -> jax.Array:",
     r"act\(policy_params, obs, mask, key\) failed under jit: TypeError"),
])
def test_check__a_broken_promise_is_one_line_naming_the_function(tmp_path, old, new, expect):
    source = _doc("reinforce.py")
    assert old in source, old
    spec = _spec_from(tmp_path, source.replace(old, new))
    with pytest.raises(AlgoContractError, match=expect):
        check(spec, *envs.make("CartPole-v1"))


def test_get__a_spec_whose_classes_the_harness_cannot_read_is_refused_when_named(tmp_path):
    source = _doc("reinforce.py").replace('AlgoSpec("reinforce", Config,', 'AlgoSpec("reinforce", dict,')
    (tmp_path / "bad_classes.py").write_text(source)
    with pytest.raises(algos.UnknownAlgoError, match="algo reinforce: config_cls must be a frozen dataclass"):
        algos.get(f"{tmp_path / 'bad_classes.py'}:SPEC")
    _one_error_line(_run("harness.train", "--algo", f"{tmp_path / 'bad_classes.py'}:SPEC", cwd=tmp_path),
                    "config_cls must be a frozen dataclass")


def test_check__an_algorithm_for_one_kind_of_action_refuses_the_other_naming_both(tmp_path):
    with pytest.raises(AlgoContractError, match=r"algo pqn is for discrete actions; env Pendulum-v1 has "
                                                r"continuous ones \(Box"):
        check(algos.get("pqn"), *envs.make("Pendulum-v1"), trace=False)
    with pytest.raises(AlgoContractError, match=r"algo sac is for continuous actions; env CartPole-v1 has "
                                                r"discrete ones \(Discrete\(2\)\)"):
        check(algos.get("sac"), *envs.make("CartPole-v1"), trace=False)


def _study_files(folder: Path, **replace: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reinforce.py").write_text(_doc("reinforce.py"))
    study = _doc("reinforce_study.py")
    for old, new in replace.items():
        assert old in study, old
        study = study.replace(old, new)
    (folder / "reinforce_study.py").write_text(study)
    return folder / "reinforce_study.py"


def test_study__a_broken_algorithm_or_space_stops_before_ray_in_one_line(tmp_path):
    """From another working directory: the algorithm's file is found beside the study file."""
    cases = [
        ({'env="CartPole-v1"': 'env="Pendulum-v1"'}, ("algo reinforce is for discrete actions", "Pendulum-v1")),
        ({"lr=LogUniform(3e-4, 3e-2)": "lr=LogUniform(3e-4, 3.0)"}, ("space['lr'] cannot work", "lr=3")),
        ({'algo="reinforce.py:SPEC"': 'algo="dqn"'}, ("unknown algo 'dqn'", "ppo, pqn, sac")),
    ]
    for k, (replace, expect) in enumerate(cases):
        study = _study_files(tmp_path / f"s{k}", **replace)
        _one_error_line(_run("harness.study", str(study), "--smoke", "--out", "results", cwd=tmp_path), *expect)
    broken = _study_files(tmp_path / "eager")
    (broken.parent / "reinforce.py").write_text(_doc("reinforce.py").replace(
        "        key, k_roll = jax.random.split(s.key)\n",
        "        key, k_roll = jax.random.split(s.key)\n        if hp.lr > 0.1:\n            key = k_roll\n"))
    line = _one_error_line(_run("harness.study", str(broken), "--smoke", "--out", "results", cwd=tmp_path),
                           "chunk(state, hparams) works only eagerly", "reinforce.py:")
    assert "lax.cond" in line
    assert not (tmp_path / "results").exists(), "nothing may start before the algorithm is checked"


# -- the docs' example, tuned end to end -------------------------------------------------------------

@pytest.mark.slow
def test_docs_example__own_algorithm_is_tuned_end_to_end_and_beats_its_untrained_policy(tmp_path, ray_env):
    study = _study_files(tmp_path / "mine")
    # every configuration completes (no early stopping), so that the importance has its 8
    r = _run("harness.study", str(study), "--smoke", "--no-asha", "--out", "results", cwd=tmp_path, env=ray_env)
    assert r.returncode == 0, r.stdout + r.stderr
    root = tmp_path / "results" / "cartpole_reinforce-smoke"
    meta = json.loads((root / "study.json").read_text())
    assert meta["algo"] == f"{study.parent / 'reinforce.py'}:SPEC"
    best = json.loads((root / "reports" / "best.json").read_text())
    # a random policy (and this untrained one, near-uniform) keeps CartPole up about 22 steps
    assert best["reevaluation"]["final_return"] > 60, best
    for report in ("configs.csv", "final.csv", "importance.csv", "ablation.csv", "index.html"):
        assert (root / "reports" / report).is_file(), (report, r.stdout[-3000:], r.stderr[-2000:])
    played = _run("harness.play", str(root), cwd=tmp_path, env=ray_env)
    assert played.returncode == 0, played.stdout + played.stderr


# -- PBT, lanes and snapshots on PQN and on a user's algorithm (the kernel's runners, no Ray) ---------

def _plan(tmp_path: Path, which: str, **kw: object) -> object:
    from harness.kernel.plan import TrialPlan

    if which == "pqn":
        algo, config = "pqn", dict(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, hidden=[16])
    else:
        (tmp_path / "reinforce.py").write_text(_doc("reinforce.py"))
        algo, config = f"{tmp_path / 'reinforce.py'}:SPEC", dict(num_envs=4, num_steps=16)
    config.update(updates_per_chunk=1, eval_episodes=4, total_timesteps=4 * 16 * 6)
    return TrialPlan(env="CartPole-v1", algo=algo, config=config, seeds=2, trial=1, study_seed=7,
                     hparams=[{"lr": lr} for lr in (1e-4, 3e-4, 1e-3, 3e-3)], objective="auc", curve_episodes=2,
                     **kw)


@pytest.mark.parametrize("which", ["pqn", "reinforce"])
def test_runners__pbt_lanes_and_snapshots_work_on_pqn_and_a_users_algorithm(tmp_path, which):
    import dataclasses

    import numpy as np

    from harness.kernel.runners import LaneRunner, PbtRunner, run_trial, runner_for

    pbt = PbtRunner(_plan(tmp_path, which, pbt={"interval": 2, "fraction": 0.25, "perturb": "multiply",
                                                "bounds": [["lr", 1e-4, 3e-3, True]]}))
    while not pbt.done:
        pbt.chunk()
    events = [c.pbt for c in pbt.finish().curves if c.pbt]
    assert [e["chunk"] for e in events] == [2, 4]
    assert all(sum(s != i for i, s in enumerate(e["source"])) == 1 for e in events)  # the worst copied the best

    lanes = LaneRunner(_plan(tmp_path, which, config_keys=[10, 11, 12, 13], chunks=9))
    for _ in range(3):
        lanes.chunk()
    lanes.refill([0], [{"lr": 5e-4}], [14])
    while not lanes.done:
        lanes.chunk()
    assert lanes.lane_chunks(0) == 6 and lanes.lane_chunks(1) == 9

    plan = _plan(tmp_path, which)
    whole = run_trial(plan)
    first = runner_for(plan)
    for _ in range(2):
        first.chunk()
    resumed = runner_for(dataclasses.replace(plan))
    resumed.restore(first.snapshot())
    while not resumed.done:
        resumed.chunk()
    np.testing.assert_array_equal(resumed.finish().scores, whole.scores)
