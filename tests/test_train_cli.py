"""`python -m harness.train`: bad input gives one clear line and exit status 2; a tiny run works."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import fast_compile_env


def _run(*args: str) -> subprocess.CompletedProcess:
    # a tiny kernel: compiled at XLA's lowest level, as the benchmarks' tiny runs (tests/conftest.py)
    return subprocess.run([sys.executable, "-m", "harness.train", *args], capture_output=True,
                          text=True, timeout=300, env=fast_compile_env(dict(os.environ)))


@pytest.mark.parametrize("args, expect", [
    (["--env", "Foo-v0"], "known envs: CartPole-v1, ContinuousCartPole-v1, DungeonCrawl-v1, Pendulum-v1, "
                          "Snake-v1"),
    (["--algo", "dqn"], "known algos: ppo, pqn, sac"),
    (["--set", "num_minibatches=3"], "num_minibatches=3 does not divide the batch"),
    (["--set", "lrr=1"], "unknown setting 'lrr' for ppo; known:"),
    (["--algo", "sac", "--env", "CartPole-v1"], "algo sac is for continuous actions; env CartPole-v1 has"),
    (["--set", "lr=abc"], "--set lr=abc"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--set", "num_envs=0"], "PPOConfig.num_envs must be >= 1, got 0"),
    (["--set", "gamma=1.5"], "--set gamma=1.5: gamma=1.5 is outside [0, 1]"),
    (["--algo", "sac", "--env", "Pendulum-v1", "--set", "tau=0"], "--set tau=0: tau=0.0 is outside (0, 1]"),
    (["--config-key", "-1"], "--config-key and --seed must be >= 0 with --config-key"),
    (["--config-key", "0", "--seed", "-2"], "got 0 and -2"),
    (["--schedule", ""], "--schedule : No such file or directory"),  # not "no schedule": a run of its own
    (["--schedule", "{tmp}/early.json"], "chunk 0 is not in this run (chunks 1 to 97 have one after them)"),
    (["--schedule", "{tmp}/negative.json"], "chunk 3: lr=-0.001 is outside (0, inf)"),
])
def test_train_cli__bad_input_is_one_line_and_exit_2(args, expect, capsys, monkeypatch, tmp_path):
    # in this process, sparing an interpreter per case: main() is what `python -m harness.train` runs
    # (the tiny run below goes through the real entry point)
    from harness import train

    (tmp_path / "early.json").write_text('[{"chunk": 0, "hparams": {"lr": 0.001}}]')
    (tmp_path / "negative.json").write_text('[{"chunk": 3, "hparams": {"lr": -0.001}}]')
    monkeypatch.setattr(os, "environ", os.environ.copy())  # main() sets XLA's variables
    assert train.main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and expect in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("env, extra", [("gymnax:Acrobot-v1", "adapters"), ("jumanji:Snake-v1", "adapters"),
                                        ("brax:ant", "brax")])
def test_train_cli__an_adapter_whose_library_is_missing_names_the_extra(env, extra, capsys, monkeypatch):
    from harness import train

    library = env.split(":")[0]
    monkeypatch.setitem(sys.modules, library, None)  # `import LIBRARY` fails, as where it is not installed
    monkeypatch.setattr(os, "environ", os.environ.copy())
    assert train.main(["--env", env]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"error: {env} needs {library}, which is not installed ({library} missing): "
                           f"pip install -e '.[{extra}]'"), err


def test_train_cli__bad_input_exits_2_through_the_module_entry_point():
    result = _run("--seeds", "0")
    assert result.returncode == 2 and "error: --seeds must be >= 1" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_train_cli__tiny_run_prints_progress_and_evaluation():
    result = _run("--algo", "ppo", "--seeds", "2", "--timesteps", "2048",
                  "--set", "updates_per_chunk=2")
    assert result.returncode == 0, result.stderr
    assert "chunk   2/2" in result.stdout and "steps/s" in result.stdout
    assert "seed 1: evaluation return" in result.stdout
