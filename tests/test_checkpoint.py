"""Mid-run snapshots of a trial kernel: a trial stopped after any chunk and restored in a fresh
runner ends with results bit-identical to the same trial run without interruption."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from harness.kernel.plan import TrialPlan
from harness.kernel.runners import TrialRunner, runner_for
from tests.test_pbt import PLAN as PBT_PLAN

PPO = TrialPlan(
    env="CartPole-v1", algo="ppo",
    config=dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1, updates_per_chunk=2,
                hidden=[16, 16], eval_episodes=4, normalize_observations=True, total_timesteps=4 * 32 * 2 * 4),
    hparams=[{"lr": lr, "ent_coef": e} for lr, e in ((3e-4, 0.0), (1e-3, 0.01), (3e-3, 0.02))],
    seeds=2, trial=7, study_seed=3, objective="auc", curve_episodes=2)
SAC = TrialPlan(
    env="Pendulum-v1", algo="sac",
    config=dict(num_envs=2, buffer_size=1000, batch_size=32, learning_starts=64, updates_per_step=1,
                steps_per_chunk=40, hidden=[16], eval_episodes=2, total_timesteps=2 * (32 + 40 * 3)),
    hparams=[{"actor_lr": 1e-3}, {"actor_lr": 3e-3}], seeds=2, trial=1, study_seed=0, curve_episodes=1)
PBT = PBT_PLAN  # a population of 4 exploiting every 2 chunks


def _run(runner: TrialRunner):
    while not runner.done:
        runner.chunk()
    return runner.finish(), runner.policy_params()


def _identical(a, b):
    (ra, pa), (rb, pb) = a, b
    for name in ("scores", "final_returns", "diverged"):
        np.testing.assert_array_equal(getattr(ra, name), getattr(rb, name), err_msg=name)
    assert ra.env_steps == rb.env_steps and ra.final_hparams == rb.final_hparams
    assert len(ra.curves) == len(rb.curves)
    for x, y in zip(ra.curves, rb.curves, strict=True):
        for f in ("chunk", "env_steps", "returns", "evals", "diverged", "pbt"):
            np.testing.assert_array_equal(getattr(x, f), getattr(y, f), err_msg=f"chunk {x.chunk}: {f}")
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("plan", [PPO, SAC, PBT], ids=["ppo", "sac", "pbt"])
def test_snapshot__restored_trial_ends_bit_identical_to_an_uninterrupted_one(plan):
    whole = _run(runner_for(plan))
    num_chunks = len(whole[0].curves)
    assert num_chunks >= 3
    for stop in (1, num_chunks - 1):
        first = runner_for(plan)
        for _ in range(stop):
            first.chunk()
        blob = first.snapshot()
        del first  # the process that ran the first chunks is gone
        resumed = runner_for(plan)
        resumed.restore(blob)
        assert resumed.restored_chunks == stop and not resumed.done
        _identical(whole, _run(resumed))


def test_snapshot__restores_into_another_sub_batch_width():
    whole = _run(TrialRunner(PPO))
    first = TrialRunner(PPO)
    first.chunk()
    resumed = TrialRunner(PPO, config_batch=2)  # e.g. a retry on a device with less memory
    resumed.restore(first.snapshot())
    (ra, pa), (rb, pb) = whole, _run(resumed)
    np.testing.assert_allclose(ra.scores, rb.scores, rtol=1e-5, atol=1e-5)
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_snapshot__of_another_trial_or_truncated_is_refused():
    runner = TrialRunner(PPO)
    runner.chunk()
    blob = runner.snapshot()
    other = TrialRunner(dataclasses.replace(PPO, trial=8))
    with pytest.raises(ValueError, match="belongs to another trial than trial 8"):
        other.restore(blob)
    with pytest.raises(ValueError, match="unreadable trial snapshot"):
        TrialRunner(PPO).restore(blob[: len(blob) // 2])
    with pytest.raises(ValueError, match="has not run a chunk"):
        runner.restore(blob)
