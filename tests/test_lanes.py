"""Lanes refilled inside a trial's kernel (harness.kernel.TrialRunner.refill): a configuration
started in a lane mid-trial trains exactly as it would have from the trial's start, its
neighbours are untouched, and a snapshot taken with lanes at different progress resumes bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from harness.kernel import TrialPlan, TrialRunner, run_trial

HP = [{"lr": 3e-4, "ent_coef": 0.0}, {"lr": 1e-3, "ent_coef": 0.01}, {"lr": 3e-3, "ent_coef": 0.02},
      {"lr": 2e-4, "ent_coef": 0.05}]
BASE = TrialPlan(
    env="CartPole-v1", algo="ppo",
    config=dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1, updates_per_chunk=2,
                hidden=[16, 16], eval_episodes=4, total_timesteps=4 * 32 * 2 * 3),
    hparams=HP[:3], seeds=2, trial=5, study_seed=3, config_keys=[10, 11, 12], chunks=6)


def _lane_curve(runner, lane, start, chunks):
    return np.stack([runner.curves[k].evals[lane] for k in range(start, start + chunks)])


def test_refill__a_lane_started_mid_trial_trains_as_it_would_from_the_start():
    late = TrialRunner(BASE)  # lane 0 runs config 10 for 2 chunks, then config 13 for 3 (its whole budget)
    for _ in range(2):
        late.chunk()
    late.refill([0], [HP[3]], [13])
    assert late.lane_chunks(0) == 0 and late.lane_chunks(1) == 2
    for _ in range(3):
        late.chunk()
    early = TrialRunner(dataclasses.replace(BASE, hparams=[HP[3], *HP[1:3]], config_keys=[13, 11, 12]))
    for _ in range(5):
        early.chunk()
    # the new configuration: the same curve and env steps as from chunk 0, and the same final score
    np.testing.assert_array_equal(_lane_curve(late, 0, 2, 3), _lane_curve(early, 0, 0, 3))
    assert [int(r.lane_steps[0]) for r in late.curves[2:]] == [int(r.lane_steps[0]) for r in early.curves[:3]]
    assert late.lane_chunks(0) == 3 and int(late.curves[-1].lane_steps[0]) == late.budget_steps
    scores_late, final_late, _ = late.lane_results([0])
    early3 = TrialRunner(dataclasses.replace(BASE, hparams=[HP[3], *HP[1:3]], config_keys=[13, 11, 12]))
    for _ in range(3):
        early3.chunk()
    scores_early, final_early, _ = early3.lane_results([0])
    np.testing.assert_array_equal(final_late, final_early)
    np.testing.assert_array_equal(scores_late, scores_early)
    # its neighbours never noticed
    np.testing.assert_array_equal(np.stack([r.evals[1:] for r in late.curves]),
                                  np.stack([r.evals[1:] for r in early.curves]))


def test_refill__keys_are_the_configurations_not_the_trials_or_lanes():
    """Configuration 11 in lane 1 of trial 5 trains as in lane 0 of trial 9, and (within float
    tolerance: another kernel width) as one configuration alone in plain run_trial."""
    a = run_trial(dataclasses.replace(BASE, chunks=None))
    b = run_trial(dataclasses.replace(BASE, trial=9, hparams=[HP[1], HP[0], HP[2]], config_keys=[11, 10, 12],
                                      chunks=None))
    np.testing.assert_array_equal(a.final_returns[1], b.final_returns[0])
    alone = run_trial(dataclasses.replace(BASE, hparams=[HP[1]], config_keys=[11], chunks=None))
    np.testing.assert_allclose(alone.final_returns[0], a.final_returns[1], rtol=1e-4)
    np.testing.assert_allclose(np.stack([r.evals[0] for r in alone.curves]),
                               np.stack([r.evals[1] for r in a.curves]), rtol=1e-4)


def test_refill__snapshot_with_lanes_at_different_progress_resumes_bit_for_bit():
    def run(stop_after=None):
        r = TrialRunner(BASE)
        blob = None
        for k in range(6):
            if k == 1:
                r.refill([2], [HP[3]], [13])
            if k == 3:
                r.refill([0, 2], [HP[0], HP[2]], [14, 15])
            r.chunk()
            if stop_after == k + 1:
                blob = r.snapshot()
                r = TrialRunner(BASE)
                r.restore(blob)
        return r

    whole, resumed = run(), run(stop_after=2)
    assert resumed.lane_start == whole.lane_start == [3, 0, 3] and resumed.lane_ids == [14, 11, 15]
    np.testing.assert_array_equal(np.stack([r.evals for r in whole.curves]),
                                  np.stack([r.evals for r in resumed.curves]))
    np.testing.assert_array_equal(whole.lane_results([0, 1, 2])[1], resumed.lane_results([0, 1, 2])[1])


def test_refill__is_refused_where_lanes_cannot_be_refilled():
    with pytest.raises(ValueError, match="config_keys"):
        TrialRunner(dataclasses.replace(BASE, config_keys=None))
    with pytest.raises(ValueError, match="refill"):
        TrialRunner(dataclasses.replace(BASE, chunks=None)).refill([0], [HP[3]], [13])
