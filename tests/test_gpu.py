"""On a GPU, with nothing exported: a smoke study runs, placement is measured on the device, a
shape too large runs in sub-batches, one that cannot fit stops in one line, and a kernel that
really runs out of device memory shrinks instead of failing.

These need a GPU that JAX can see; without one (CI, a laptop) they are skipped, and the CPU
tests (test_placement.py, test_kernel.py) cover the arithmetic, the split-equals-whole promise
and the out-of-memory fallback with a simulated error.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_study import _one_error_line

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _bare_env(extra: dict | None = None) -> dict:
    """The environment a new user has: none of the XLA/JAX variables this suite sets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    return {**env, **(extra or {})}


@functools.cache
def _gpu_platform() -> str:
    r = subprocess.run([sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"],
                       capture_output=True, text=True, env=_bare_env(), timeout=300)
    return r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else "none"


@pytest.fixture(autouse=True)
def _needs_gpu():
    if _gpu_platform() not in ("gpu", "cuda", "rocm"):
        pytest.skip("needs a GPU visible to JAX (this machine has none)")


def _study_bare(*args, ray_env, timeout=900):
    env = _bare_env({k: ray_env[k] for k in ("RAY_TMPDIR", "XDG_CACHE_HOME", "PYTHONPATH")})
    return subprocess.run([sys.executable, "-m", "harness.study", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def test_gpu__smoke_study_with_nothing_exported_measures_placement_and_finishes(tmp_path, ray_env):
    r = _study_bare("cartpole_ppo", "--smoke", "--out", str(tmp_path), ray_env=ray_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert " on gpu (" in r.stdout and "measuring each trial shape's device memory" in r.stdout
    assert "at a time per device" in r.stdout and "best:" in r.stdout
    records = [json.loads(p.read_text()) for p in (tmp_path / "cartpole_ppo-smoke" / "trials").glob("*.json")]
    assert len(records) == 2 and all(rec["status"] != "failed" for rec in records), r.stdout


def test_gpu__stated_device_too_small_for_the_shape_splits_it(tmp_path, ray_env):
    code = ("from harness.kernel.plan import TrialPlan\n"
            "from harness.cluster.placement import measure_kernel as m\n"
            "p = TrialPlan('CartPole-v1', 'ppo', dict(num_envs=4, num_steps=128, update_epochs=4, "
            "updates_per_chunk=10, num_minibatches=4, total_timesteps=20480), [{}], 2, 0)\n"
            "print(int(((m(p, 1).need(2) + m(p, 2).need(2)) / 2 + 512 * 2**20) / 0.9))")  # + a CUDA context
    size = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_bare_env(),
                          cwd=ROOT, check=True).stdout.split()[-1]
    r = _study_bare("cartpole_ppo", "--smoke", "--no-asha", "--out", str(tmp_path), "--device-memory", size,
                    ray_env=ray_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "configurations in sub-batches of 1" in r.stdout


def test_gpu__shape_that_cannot_fit_is_one_line_before_any_trial(tmp_path, ray_env):
    # 600 MiB leaves almost nothing beside a process's CUDA context; one configuration at 64 seeds needs more
    r = _study_bare("snake_ppo", "--smoke", "--seeds", "64", "--out", str(tmp_path), "--device-memory", "600MiB",
                    ray_env=ray_env)
    _one_error_line(r, "study snake_ppo, 2 configs x 64 seeds: one configuration needs ")
    assert not (tmp_path / "snake_ppo-smoke" / "trials").exists()


def test_gpu__kernel_out_of_memory_shrinks_its_sub_batch_and_finishes():
    # the transformer at 8 configs x 8 seeds needs far more than the 6% of the GPU this process may take
    code = ("from harness.kernel.plan import TrialPlan; from harness.kernel.runners import TrialRunner\n"
            "cfg = dict(num_envs=32, num_steps=64, num_minibatches=4, update_epochs=2, network='transformer', "
            "embed_dim=16, num_heads=2, num_layers=1, updates_per_chunk=1, eval_episodes=2, "
            "total_timesteps=4096)\n"
            "r = TrialRunner(TrialPlan('Snake-v1', 'ppo', cfg, [{}] * 8, 8, 0))\n"
            "while not r.done: r.chunk()\n"
            "res = r.finish(); print('batch', r.batch, 'scores', res.scores.shape)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=900,
                       env=_bare_env({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.06"}))
    assert r.returncode == 0, r.stderr[-3000:]
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("batch ") and int(line.split()[1]) < 8 and line.endswith("(8, 8)"), r.stdout
