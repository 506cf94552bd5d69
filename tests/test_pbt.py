"""Population-based training inside the kernel: exploit copies learner state bit for bit,
explore perturbs within bounds, nothing recompiles between exploits, runs are reproducible, and a
lineage's hyperparameter schedule can be replayed."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import algos
import envs
from algos import ppo
from algos.pbt import Bound, PBTConfig, exploit_explore
from harness.kernel.plan import TrialPlan
from harness.kernel.runners import PbtRunner, run_trial

BOUNDS = (Bound("lr", 1e-4, 3e-3, True), Bound("ent_coef", 0.0, 0.05))
C, S = 8, 2


def _population():
    env, params = envs.make("CartPole-v1")
    algo = ppo.make(ppo.PPOConfig(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1,
                                  updates_per_chunk=1, hidden=(8,)), env, params)
    hp = jax.tree.map(lambda *x: jnp.stack(x), *[ppo.PPOHParams.default(lr=1e-3 + 1e-4 * i, ent_coef=0.01)
                                                  for i in range(C)])
    keys = jax.random.split(jax.random.key(0), C * S).reshape(C, S)
    state = jax.jit(algos.batched(algo.init))(keys, hp)
    state, _ = jax.jit(algos.batched(algo.chunk))(state, hp)
    return algo, state, hp


@pytest.mark.parametrize("perturb", ["multiply", "resample"])
def test_exploit__worst_copy_learner_state_of_the_best_bit_for_bit_then_perturb(perturb):
    algo, state, hp = _population()
    fitness = jnp.array([5.0, 1.0, 7.0, jnp.nan, 3.0, 8.0, 2.0, 6.0])  # worst two: 3 (NaN) and 1
    config = PBTConfig(bounds=BOUNDS, fraction=0.25, perturb=perturb)
    new, new_hp, source = jax.jit(lambda s, h, k, f: exploit_explore(
        k, s, h, f, config=config, learner_fields=algo.learner_fields))(state, hp, jax.random.key(3), fitness)
    source = np.asarray(source)
    replaced = [i for i in range(C) if source[i] != i]
    assert sorted(replaced) == [1, 3] and set(source[replaced]) <= {5, 2}  # copied from the best two
    for i in range(C):
        for f in algo.learner_fields:  # network, optimizer, divergence flag: the source's, bit for bit
            for a, b in zip(jax.tree.leaves(getattr(new, f)), jax.tree.leaves(getattr(state, f)), strict=True):
                np.testing.assert_array_equal(np.asarray(a)[i], np.asarray(b)[source[i]])
    # its own environments and keys: a copy does not replay its source's episodes
    for a, b in zip(jax.tree.leaves((new.env_state, new.obs)), jax.tree.leaves((state.env_state, state.obs)),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(jax.random.key_data(new.key), jax.random.key_data(state.key))
    lr, old_lr = np.asarray(new_hp.lr), np.asarray(hp.lr)
    for i in range(C):
        if i in replaced:
            assert 1e-4 <= lr[i] <= 3e-3 and lr[i] != old_lr[source[i]]
            if perturb == "multiply":
                assert lr[i] / old_lr[source[i]] == pytest.approx(0.8, rel=1e-5) or lr[i] / old_lr[
                    source[i]] == pytest.approx(1.25, rel=1e-5)
        else:
            assert lr[i] == old_lr[i]
    np.testing.assert_array_equal(new_hp.gamma, hp.gamma)  # not perturbed: no bound given


def test_exploit__multiplying_stays_inside_the_bounds():
    """A copy's hyperparameter at a bound, multiplied out of the range (x1.25 at the top, x0.8 at
    the bottom), is clipped back to the bound; multiplied into the range, it is kept."""
    algo, state, hp = _population()
    config = PBTConfig(bounds=BOUNDS, fraction=0.5)
    (lr, ent) = config.bounds
    for b, at, inside in ((lr, lr.high, 0.8), (lr, lr.low, 1.25), (ent, ent.high, 0.8)):
        start = hp.replace(**{b.name: jnp.full(C, at)})
        ratios = []
        for seed in range(6):
            fitness = jnp.arange(C, dtype=jnp.float32)
            _, new_hp, source = exploit_explore(jax.random.key(seed), state, start, fitness, config=config,
                                                learner_fields=algo.learner_fields)
            copied = np.asarray(source) != np.arange(C)
            ratios += [round(float(x) / at, 4) for x in np.asarray(getattr(new_hp, b.name))[copied]]
        # clipped (1.0: a copy's factor is never 1) and kept (inside) both happened; nothing left the range
        assert set(ratios) == {1.0, inside}, (b.name, at, ratios)


def test_pbt_config__rejects_settings_that_cannot_work():
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 0.5\]"):
        PBTConfig(bounds=BOUNDS, fraction=0.7)
    with pytest.raises(ValueError, match="perturb must be 'multiply' or 'resample'"):
        PBTConfig(bounds=BOUNDS, perturb="jitter")


PLAN = TrialPlan(
    env="CartPole-v1", algo="ppo",
    config=dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1, updates_per_chunk=1,
                hidden=[16], eval_episodes=4, total_timesteps=4 * 32 * 8),
    hparams=[{"lr": lr, "ent_coef": 0.01} for lr in (1e-4, 3e-4, 1e-3, 3e-3)], seeds=2, trial=2, study_seed=5,
    objective="auc", curve_episodes=2,
    pbt={"interval": 2, "fraction": 0.25, "perturb": "multiply",
         "bounds": [["lr", 1e-4, 3e-3, True], ["ent_coef", 0.0, 0.05, False]]})


def test_kernel__pbt_exploits_every_interval_without_recompiling_and_is_reproducible():
    runner = PbtRunner(PLAN)
    while not runner.done:
        runner.chunk()
    result = runner.finish()
    events = [c.pbt for c in result.curves if c.pbt]
    assert [e["chunk"] for e in events] == [2, 4, 6]  # not after the last chunk
    for e in events:
        moved = [i for i, s in enumerate(e["source"]) if s != i]
        assert len(moved) == 1 and np.argsort(e["fitness"])[0] == moved[0]  # the worst one copies
    assert runner._exploit._cache_size() == 1 and runner._chunk._cache_size() == 1  # no retrace
    assert result.final_hparams == events[-1]["hparams"]
    again = run_trial(PLAN)
    np.testing.assert_array_equal(result.scores, again.scores)
    assert [c.pbt for c in again.curves if c.pbt] == events


def test_kernel__pbt_refuses_a_split_population():
    with pytest.raises(ValueError, match="needs the whole population in one kernel"):
        PbtRunner(PLAN, config_batch=2)


def test_kernel__a_schedule_changes_hyperparameters_between_chunks():
    plain = dataclasses.replace(PLAN, pbt=None)
    same = dataclasses.replace(plain, schedule=[{"chunk": 4, "hparams": plain.hparams}])
    np.testing.assert_array_equal(run_trial(plain).scores, run_trial(same).scores)  # a no-op schedule
    changed = dataclasses.replace(plain, schedule=[{"chunk": 4, "hparams": [{"lr": 2e-3}] * 4}])
    a, b = run_trial(plain), run_trial(changed)
    for k in range(4):  # identical until the change takes effect after chunk 4
        np.testing.assert_array_equal(a.curves[k].returns, b.curves[k].returns)
    assert not np.array_equal(a.curves[-1].returns, b.curves[-1].returns)
    assert b.final_hparams == [{"lr": 2e-3, "ent_coef": 0.01}] * 4


def test_lineage__a_configuration_inherits_the_schedule_of_the_networks_it_copied():
    from harness.reports import lineage
    from harness.store.records import ConfigRecord, TrialRecord

    h = [{"lr": 0.1 * (i + 1)} for i in range(3)]
    record = TrialRecord(0, "complete", 1, [ConfigRecord(i, {}, i, hparams=x) for i, x in enumerate(h)],
                         pbt={"interval": 4},
                         curves=[{"chunk": 4, "pbt": {"chunk": 4, "source": [0, 1, 0], "fitness": [3, 2, 1],
                                                      "hparams": [h[0], h[1], {"lr": 0.08}]}},
                                 {"chunk": 8, "pbt": {"chunk": 8, "source": [0, 2, 2], "fitness": [3, 1, 2],
                                                      "hparams": [h[0], {"lr": 0.1}, {"lr": 0.08}]}}])
    initial, changes, chain = lineage.schedule(record, 1)
    # configuration 1's network began in 0, was copied into 2 after chunk 4, then into 1 after chunk 8
    assert chain == [0, 2, 1] and initial == h[0]
    assert changes == [{"chunk": 4, "hparams": {"lr": 0.08}}, {"chunk": 8, "hparams": {"lr": 0.1}}]
    assert lineage.schedule(record, 0) == (h[0], [], [0])  # never copied: no schedule
    merged = lineage.merge([changes, []], [initial, h[0]])
    assert merged == [{"chunk": 4, "hparams": [{"lr": 0.08}, h[0]]}, {"chunk": 8, "hparams": [{"lr": 0.1}, h[0]]}]
    rows = lineage.table([record])
    assert len(rows) == 3 * 3 and rows.copied.sum() == 2
    assert rows[(rows.chunk == 8) & rows.copied].source.tolist() == ["t0000c2"]


def test_train_cli__replays_a_schedule_and_rejects_a_malformed_one(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import fast_compile_env

    good = tmp_path / "s.json"
    good.write_text(json.dumps([{"chunk": 1, "hparams": {"lr": 1e-3}}]))
    args = [sys.executable, "-m", "harness.train", "--env", "CartPole-v1", "--seeds", "1", "--timesteps", "4096",
            "--set", "updates_per_chunk=2", "--set", "num_minibatches=2"]
    env = fast_compile_env(dict(os.environ))  # a tiny kernel: compiled at XLA's lowest level
    r = subprocess.run([*args, "--schedule", str(good)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "from chunk 2: lr=0.001" in r.stdout, r.stdout + r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"chunk": 1, "hparams": {"learning_rate": 1e-3}}]))
    r = subprocess.run([*args, "--schedule", str(bad)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2 and "chunk 1 sets unknown hyperparameters learning_rate; known:" in r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run([*args, "--schedule", str(tmp_path / "none.json")], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "No such file or directory" in r.stderr


def test_kernel__pbt_replaces_a_diverged_configuration_and_records_it_as_json():
    import json

    plan = dataclasses.replace(PLAN, hparams=[*PLAN.hparams[:3], {"lr": 1e3, "ent_coef": 0.01}])  # lr 1e3 diverges
    result = run_trial(plan)
    first = next(c.pbt for c in result.curves if c.pbt)
    assert first["fitness"][3] is None and first["source"][3] != 3  # ranked last, replaced by a healthy one
    json.dumps([c.pbt for c in result.curves if c.pbt], allow_nan=False)  # what the record writer demands
    assert not result.diverged[3].any() and np.isfinite(result.scores[3]).all()  # it trained on from the copy
    assert 1e-4 <= result.final_hparams[3]["lr"] <= 3e-3
