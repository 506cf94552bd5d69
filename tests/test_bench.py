"""Every benchmark under bench/ runs, as its docstring says, at a tiny budget.

Each is run the way a user runs it (``python bench/NAME.py ...`` from the repository root, so the
script's own folder is first on ``sys.path``), and must print its closing side-by-side ratio.
A benchmark that stops working fails here instead of rotting unnoticed.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# script -> (tiny arguments, a line its output must contain)
TINY = {
    "ppo_cartpole.py": (["--seeds", "1", "2", "--timesteps", "2048", "--hlo", "{tmp}"], "ratio us/rejax:"),
    "sac_pendulum.py": (["--seeds", "1", "--timesteps", "1500"], "ratio us/rejax:"),
    "pqn_cartpole.py": (["--seeds", "1", "--timesteps", "4096"], "ratio us/rejax:"),
    "env_steps.py": (["--envs", "1", "8", "--size", "6", "--steps", "400"], "ratio snake us/jumanji:"),
    "profile_ppo.py": (["--updates", "2"], "sum"),
    "report_scale.py": (["--trials", "2", "--configs", "12", "--seeds", "2", "--chunks", "3"],
                        "ratio tensorboard before/now:"),
    "eval_overhead.py": (["--studies", "cartpole_ppo", "--chunks", "1"],
                         "ratio kernel time evaluated/train-only:"),
    "pbt_search.py": (["--population", "8", "--seeds", "1", "--timesteps", "10240", "--interval", "1",
                                     "--methods", "kernel-pbt,tune-pbt"],
                      "ratio wall time tune-pbt/kernel-pbt:"),
    "checkpoint_cost.py": (["--studies", "cartpole_ppo", "--chunks", "1"],
                           "ratio wall time checkpoint-every-chunk/bare:"),
    "study_load.py": (["--trials", "4"], "ratio last/first:"),
    "lane_broker.py": (["--lanes", "6", "--steps", "2"], "ratio optuna/us"),
    "env_coverage.py": (["--libraries", "gymnax", "--only", "gymnax:Catch-bsuite"],
                        "gymnax: 1/1 envs run through the kernel, 0 refused with a reason, 0 fail in the kernel; "
                        "harness.play draws 1/1"),
    # spring: the Brax pipeline both trainers compile fastest
    "brax_ppo.py": (["--env", "inverted_pendulum:spring", "--timesteps", "10240", "--configs", "1"],
                    "ratio us/brax:"),
    "search_efficiency.py": (["--tiny", "--envs", "cartpole", "--study-seeds", "1", "--methods", "trial,lane",
                              "--top-k", "1"],
                             ("ratio configs lane/trial cartpole:", "ratio best lane/trial cartpole:")),
    "time_to_answer.py": (["--tiny", "--studies", "cartpole_ppo"],
                          ("ratio time today/new cartpole_ppo:", "ratio answer new/today cartpole_ppo:")),
    "study_throughput.py": (["--configs", "2", "--seeds", "1", "--timesteps", "2048",
                             "--configs-per-trial", "1", "--no-warm"], "ratio evals/min us/naive:"),
}


def test_bench__every_script_is_covered():
    scripts = {p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(TINY)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(TINY))
def test_bench__runs_from_the_repository_root_at_a_tiny_budget(script, ray_env, tmp_path):
    args, expect = TINY[script]
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    # ray_env: the run's compile cache, a private Ray temp folder whose processes must all have
    # stopped afterwards, no dashboard, XLA's lowest optimisation level (tests/conftest.py)
    env = {**ray_env, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)  # as a user runs it: the package comes from the installed project
    r = subprocess.run([sys.executable, f"bench/{script}", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    for line in [expect] if isinstance(expect, str) else expect:
        assert line in r.stdout, r.stdout[-2000:]
        if line.startswith("ratio"):  # its figures are numbers, not nan or inf
            figures = re.findall(r"[-+]?(?:\d+\.?\d*|nan|inf)\b", r.stdout.split(line, 1)[1].split("\n")[0], re.I)
            assert figures and all(math.isfinite(float(f)) for f in figures), r.stdout[-2000:]
    if "--hlo" in args:  # each compiled program's HLO written, its kernels counted
        written = sorted(p.name for p in tmp_path.glob("*.hlo"))
        assert written == ["rejax_1.hlo", "rejax_2.hlo", "us_1.hlo", "us_2.hlo"], written
        assert "hlo us_2: " in r.stdout and " fusions, " in r.stdout
