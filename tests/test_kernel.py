"""The trial driver's promises: sub-batches of configurations give the results of one batch,
and an out-of-memory error shrinks the sub-batch instead of failing (or retrying the same shape)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from harness.kernel import compile, runners
from harness.kernel.plan import OutOfMemory, TrialPlan, config_groups
from harness.kernel.runners import TrialRunner, run_trial

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


# sub-batches of 2: 2 + 2 + 1, the last one padded to the width (other widths add time, not coverage;
# -m extended's sub-batch study trains in sub-batches of 1, without this equality check)
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
    real = runners._compiled
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

    monkeypatch.setattr(runners, "_compiled", compiled)
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
    real = runners._compiled

    def compiled(*args):
        init, _, evaluate, algo = real(*args)

        def broken(state, hp, *rest):
            raise jax.errors.JaxRuntimeError("INTERNAL: something else")
        return init, broken, evaluate, algo

    monkeypatch.setattr(runners, "_compiled", compiled)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        run_trial(PLAN)


def test_compile_once_per_node__of_two_starting_together_one_compiles_and_the_other_reads_the_cache():
    """Trials that start together with the same kernel compile it once on a node: the others wait
    for the program's lock and read the persistent cache (tests/conftest.py sets one up)."""
    import threading
    import uuid

    import jax.numpy as jnp

    salt = float(uuid.uuid4().int % 10_000)  # a program no other test (or earlier run) compiled

    def trial_kernel():  # a new function each time, as in another process: JAX's in-memory caches miss
        def slow_to_compile(x):
            return jax.lax.scan(lambda y, _: (jnp.tanh(y @ y.T + salt) @ y, None), x, None, length=64,
                                unroll=64)[0]
        return jax.jit(slow_to_compile)

    events: list[str] = []

    def listen(name: str, **_) -> None:
        events.append(name)

    jax.monitoring.register_event_listener(listen)
    start = threading.Barrier(2)

    def compile_() -> None:
        jitted = trial_kernel()
        start.wait()
        compile._compile_once_per_node(jitted, np.ones((32, 32), np.float32))

    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    try:
        threads = [threading.Thread(target=compile_) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
        jax.monitoring.unregister_event_listener(listen)
    assert not any(t.is_alive() for t in threads)
    assert events.count("/jax/compilation_cache/cache_misses") == 1, events
    assert events.count("/jax/compilation_cache/cache_hits") == 1, events
