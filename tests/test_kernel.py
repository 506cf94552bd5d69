"""The trial driver's promises: sub-batches of configurations give the results of one batch,
and an out-of-memory error shrinks the sub-batch instead of failing (or retrying the same shape)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from harness import kernel
from harness.kernel import OutOfMemory, TrialPlan, TrialRunner, config_groups, run_trial

PLAN = TrialPlan(
    env="CartPole-v1", algo="ppo",
    config=dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1, updates_per_chunk=2,
                hidden=[16, 16], eval_episodes=4, total_timesteps=4 * 32 * 2 * 3),
    hparams=[{"lr": lr, "ent_coef": e} for lr, e in ((3e-4, 0.0), (1e-3, 0.01), (3e-3, 0.02), (2e-4, 0.05),
                                                       (5e-4, 0.03))],
    seeds=2, trial=7, study_seed=3)


def _same(a, b):
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(a.diverged, b.diverged)
    assert len(a.curves) == len(b.curves) == 3
    for x, y in zip(a.curves, b.curves, strict=True):
        np.testing.assert_allclose(x.returns, y.returns, rtol=1e-5, atol=1e-5)
        assert x.env_steps == y.env_steps


def test_config_groups__cover_every_configuration_once():
    assert config_groups(5, 2) == [[0, 1], [2, 3], [4]]
    assert config_groups(4, 4) == [[0, 1, 2, 3]]
    assert sum(config_groups(64, 7), []) == list(range(64))


# sub-batches of 2: 2 + 2 + 1, the last one padded to the width (3 + 2, 10 s more, showed nothing
# that 2 + 2 + 1 does not); width 1 (22 s) is not compared here: -m extended's sub-batch study
# trains in sub-batches of 1, without this equality check
@pytest.mark.parametrize("batch", [2])
def test_runner__sub_batches_give_the_results_of_one_batch(batch):
    whole = run_trial(PLAN)
    split = run_trial(PLAN, config_batch=batch)
    assert whole.scores.shape == (5, 2)
    _same(whole, split)
    # the policies too, configuration by configuration
    a, b = TrialRunner(PLAN), TrialRunner(PLAN, config_batch=batch)
    while not a.done:
        a.chunk(), b.chunk()
    for x, y in zip(jax.tree.leaves(a.policy_params()), jax.tree.leaves(b.policy_params()), strict=True):
        assert x.shape[:2] == (5, 2)
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def _oom_above(monkeypatch, widest):
    """Makes the compiled chunk fail like XLA out of memory for sub-batches wider than ``widest``;
    returns the widths it was called with."""
    real = kernel._compiled
    widths = []

    def compiled(*args):
        init, chunk, evaluate, algo = real(*args)

        def tight_chunk(state, hp, *rest):
            width = jax.tree.leaves(hp)[0].shape[0]
            widths.append(width)
            if width > widest:
                raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                                                 "39.08GiB")
            return chunk(state, hp, *rest)
        return init, tight_chunk, evaluate, algo

    monkeypatch.setattr(kernel, "_compiled", compiled)
    return widths


def test_runner__out_of_memory_halves_the_sub_batch_and_keeps_the_results(monkeypatch):
    whole = run_trial(PLAN)
    widths = _oom_above(monkeypatch, 2)
    seen = []
    shrunk = run_trial(PLAN, on_chunk=seen.append)
    _same(whole, shrunk)
    assert [r.chunk for r in seen] == [1, 2, 3]  # each chunk reported once
    # 5 wide failed once, 2 wide ran from then on (3 chunks x 3 sub-batches); 5 was never retried
    assert widths == [5] + [2] * 9


def test_runner__out_of_memory_at_one_configuration_is_a_clear_error(monkeypatch):
    _oom_above(monkeypatch, 0)
    with pytest.raises(OutOfMemory, match="one configuration x 2 seeds does not fit in device memory"):
        run_trial(PLAN)


def test_runner__other_errors_are_not_taken_for_out_of_memory(monkeypatch):
    real = kernel._compiled

    def compiled(*args):
        init, _, evaluate, algo = real(*args)

        def broken(state, hp, *rest):
            raise jax.errors.JaxRuntimeError("INTERNAL: something else")
        return init, broken, evaluate, algo

    monkeypatch.setattr(kernel, "_compiled", compiled)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        run_trial(PLAN)
