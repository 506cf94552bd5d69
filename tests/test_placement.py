"""Memory-aware placement: the arithmetic against stated device sizes, the measurement from
compiled executables, and the study CLI splitting a shape that does not fit or refusing, in one
line, one that cannot fit at all."""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.cluster.placement import KernelMemory, final_width, fit, measure_kernel
from harness.driver.settings import parse_bytes
from harness.kernel.plan import TrialPlan
from harness.space import StudyError
from tests.test_study import _one_error_line, _study

GiB = 2**30


def _linear(fixed, per_config, state_per_config, calls):
    def measure(width):
        calls.append(width)
        return KernelMemory(width, state_per_config * width, fixed + per_config * width)
    return measure


def test_fit__a_shape_that_fits_shares_the_device_by_its_need():
    calls = []
    f = fit(_linear(1 * GiB, GiB // 4, 2**20, calls), 64, 80 * GiB, shape="s")
    need = 1 * GiB + 16 * GiB  # 64 configs at 1/4 GiB each, state included once
    assert (f.config_batch, f.need) == (64, need)
    assert f.per_device == int(80 * GiB * 0.9) // need == 4
    assert calls == [64]  # one measurement when the whole trial fits
    # small shapes: memory alone would allow hundreds of trials, a GPU profits from a few
    assert fit(_linear(GiB // 8, 2**20, 2**10, []), 64, 80 * GiB, shape="s").per_device == 4
    # each process's own overhead (a CUDA context) counts against the device too
    assert fit(_linear(GiB, 0, 2**10, []), 1, 10 * GiB, shape="s", overhead=2 * GiB).per_device == 3


def test_fit__a_shape_too_large_for_the_device_runs_in_sub_batches_that_fit():
    calls = []
    measure = _linear(1 * GiB, 1 * GiB, 64 * 2**20, calls)  # 32 configs: 33 GiB
    f = fit(measure, 32, 20 * GiB, shape="s")
    assert f.per_device == 1 and f.config_batch < 32
    assert f.need <= 0.9 * 20 * GiB
    assert measure(f.config_batch + 1).need(32) > 0.9 * 20 * GiB  # the widest sub-batch that fits
    assert len(calls) <= 5


def test_probe__a_device_that_fails_while_measuring_is_one_line_naming_the_error_and_the_held_memory(
        monkeypatch):
    # as seen on an H200 shared with a JAX process that had preallocated: XLA's autotuner ran out
    import harness.cluster.placement as placement
    from harness.cluster.placement import probe_shapes

    def oom(*_):
        raise RuntimeError("RESOURCE_EXHAUSTED: Failed to get configs for: 3 out of 145 instructions. "
                           "Example failure: \nOut of memory while trying to allocate 16.00MiB\n")

    monkeypatch.setattr(placement, "probe", oom)
    monkeypatch.setattr(placement, "_nvidia_query", lambda f: {"memory.free": 8, "memory.total": 140}[f] * GiB)
    msg = probe_shapes({}, {}, None, {})
    assert isinstance(msg, str) and "\n" not in msg
    assert msg.startswith("measuring the trial shapes on the device failed (the GPU has 8.00 GiB of 140.00 GiB "
                          "free; another JAX process on it takes 75% of it unless")
    assert msg.endswith("RuntimeError: RESOURCE_EXHAUSTED: Failed to get configs for: 3 out of 145 instructions. "
                        "Example failure: Out of memory while trying to allocate 16.00MiB")
    monkeypatch.setattr(placement, "_nvidia_query", lambda f: None)  # no nvidia-smi: the error alone
    msg = probe_shapes({}, {}, None, {})
    assert msg.startswith("measuring the trial shapes on the device failed: RuntimeError")


def test_fit__one_configuration_that_cannot_fit_is_one_clear_error():
    with pytest.raises(StudyError) as err:
        fit(_linear(30 * GiB, 1 * GiB, 2**20, []), 32, 16 * GiB, shape="study x (network=transformer)")
    msg = str(err.value)
    assert msg.startswith("study x (network=transformer): one configuration needs 31.00 GiB")
    assert "14.40 GiB is usable (16.00 GiB x 0.9)" in msg and "lower --seeds" in msg and "\n" not in msg
    with pytest.raises(StudyError, match=r"is usable \(16.00 GiB x 0.9 - 512.00 MiB per process\)"):
        fit(_linear(30 * GiB, 1 * GiB, 2**20, []), 32, 16 * GiB, shape="s", overhead=512 * 2**20)


def test_final_width__narrow_when_it_saves_more_than_its_compile():
    # CPU-like: 4 wide, 24 s kernels, 2 rounds; 3 configs narrow: 20 s compile + 2 x 18 s = 56 > 48
    assert final_width(3, 4, rounds=2, kernel_s=24.0, compile_s=20.0) == 4
    assert final_width(3, 4, rounds=2, kernel_s=24.0, compile_s=2.0) == 3  # warm compilation cache
    # GPU budget: 64 wide, 22 s kernel, 24 s compile: the search's width
    assert final_width(3, 64, rounds=1, kernel_s=22.0, compile_s=24.0) == 64
    # long kernels (minutes): narrow
    assert final_width(3, 64, rounds=1, kernel_s=600.0, compile_s=24.0) == 3
    assert final_width(3, 64, rounds=1, kernel_s=None, compile_s=None) == 3
    assert final_width(5, 4, rounds=1, kernel_s=1.0, compile_s=100.0) == 4  # more than the width: batches of C


def test_final_plans__a_lane_trial_is_timed_per_configuration_budget(tmp_path):
    """A trial whose lanes were refilled trained several configurations' budgets in its kernel
    time: the re-training width reads its time per budget, as a plain trial's."""
    import studies
    from harness.phases.final_phase import Candidate, final_plans
    from harness.store.records import TrialRecord
    from tests.driver import settings_for, small

    settings = settings_for(small(studies.get("cartpole_ppo"), configs_per_trial=4), tmp_path)
    budget = settings.budget("cpu")
    static = {"num_minibatches": 4}
    candidates = {f"t0000c{i}": Candidate({"lr": 1e-3}, static, {"lr": 1e-3}) for i in range(3)}

    def width(**record):
        rec = TrialRecord(trial=0, status="complete", seeds=budget.seeds, configs=[], static=static,
                          compile_seconds=20.0, **record)
        plans, _ = final_plans(settings, budget, candidates, [rec], rounds=2)
        return {len(p.hparams) for p in plans}

    plain = width(kernel_seconds=24.0, env_steps=budget.timesteps)  # 2 x 24 s wide < 20 s + 2 x 18 s narrow
    assert plain == width(kernel_seconds=72.0, env_steps=3 * budget.timesteps) == {4}
    assert width(kernel_seconds=72.0, env_steps=budget.timesteps) == {3}  # really 72 s a budget: narrow


def test_parse_bytes__sizes_and_mistakes():
    assert parse_bytes("80GiB") == 80 * GiB and parse_bytes("512 MB") == 512 * 2**20
    assert parse_bytes("1e9") == 10**9
    for bad in ("lots", "-1GiB", "12 parsecs"):
        with pytest.raises(StudyError, match="is not a size|must be positive"):
            parse_bytes(bad)


def test_measure_kernel__grows_with_width_and_counts_the_transformers_attention():
    config = dict(num_envs=8, num_steps=16, num_minibatches=2, update_epochs=1, updates_per_chunk=1,
                  eval_episodes=2, total_timesteps=128, embed_dim=8, num_heads=1, num_layers=1)
    # the MLP's widths on CartPole (its kernels compile faster than Snake's)
    mlp = TrialPlan("CartPole-v1", "ppo", {**config, "network": "mlp"}, [{}], seeds=2, trial=0)
    att = TrialPlan("Snake-v1", "ppo", {**config, "network": "transformer"}, [{}], seeds=2, trial=0)
    m1, m4 = measure_kernel(mlp, 1), measure_kernel(mlp, 4)
    assert 0 < m1.state < m1.peak and m4.state == 4 * m1.state and m4.peak > 2 * m1.peak
    # attention over 100 cells for a minibatch of 64 observations x 2 seeds: its scores and their
    # softmax, both kept for the backward pass, 2 x 64*2*100*100*4 bytes (far more than the MLP's peak)
    assert measure_kernel(att, 1).peak > max(m4.peak, 2 * 64 * 2 * 100 * 100 * 4)


def _fit(monkeypatch, tmp_path, name, device_memory):
    """``placement.fit_trials`` for study ``name``'s smoke budget with ``--device-memory``, its
    one-off probe run in this process instead of a Ray worker; (placement, search plan, lines)."""
    import studies
    from harness.cluster import placement, trainable
    from harness.phases.search_phase import plan_factory
    from tests.driver import CPU, settings_for

    monkeypatch.setattr(trainable, "setup_process", lambda device: None)
    monkeypatch.setattr(placement, "run_once", lambda fn, *args, gpu: fn(*args))
    # 1 MiB per configuration, state included (the measurement itself: test_measure_kernel__...)
    monkeypatch.setattr(placement, "measure_kernel", lambda plan, width: KernelMemory(width, 2**19 * width,
                                                                                      2**20 * width))
    settings = settings_for(studies.get(name), tmp_path, smoke=True, device_memory=device_memory)
    budget, lines = settings.budget("cpu"), []
    place = placement.fit_trials(settings, budget, CPU, say=lines.append)
    points = [{n: d.choices[0] for n, d in settings.study.space.items() if n in settings.static_names}] * 2
    return place, plan_factory(settings, budget)(points, 0), lines


def test_fit_trials__a_shape_larger_than_the_stated_device_runs_its_trials_in_sub_batches(monkeypatch, tmp_path):
    # cartpole_ppo's smoke shape (2 configs x 2 seeds), given room for one configuration only
    place, search_plan, lines = _fit(monkeypatch, tmp_path, "cartpole_ppo", "1.7MiB")
    assert any("2 configs x 2 seeds: " in ln and "configurations in sub-batches of 1" in ln for ln in lines), lines
    assert place.slots == 1 and place.device["checkpoint_seconds"] == 60.0
    from dataclasses import asdict

    from harness.cluster.trainable import shape_of

    # what the trial with that shape reads from its Tune config (harness.kernel.runners.TrialRunner runs
    # sub-batches to the same results as one batch: tests/test_kernel.py)
    assert shape_of({"plan": asdict(search_plan), "device": place.device}) == {"config_batch": 1}


def test_fit_trials__a_study_of_fewer_trials_than_cores_shares_them_on_the_embedded_ray(tmp_path):
    import studies
    from harness.cluster.placement import Placement, fit_trials
    from tests.driver import settings_for

    four = Placement("cpu", {"cpu": 1}, 4, {"cache_dir": "/x", "pin_cores": True, "cpus": 1})

    def fit(address=None, **options):  # (an address set after resolve, which would check that it answers)
        settings = dataclasses.replace(settings_for(studies.get("cartpole_ppo"), tmp_path, **options),
                                       address=address)
        return fit_trials(settings, settings.budget("cpu"), four, say=print)

    one, two, six = fit(trials=1), fit(trials=2), fit(trials=6)
    assert (one.slots, one.resources["cpu"], one.device["cpus"]) == (1, 4, 4)  # what the trial pins
    assert (two.slots, two.resources["cpu"], two.device["cpus"]) == (2, 2, 2)
    assert (six.slots, six.resources["cpu"], six.device["cpus"]) == (4, 1, 1)
    remote = fit(trials=1, address="127.0.0.1:6379")  # a cluster's nodes may each have fewer cores
    assert (remote.slots, remote.resources["cpu"]) == (4, 1)


def test_fit_trials__a_shape_that_cannot_fit_stops_the_study_in_one_line(monkeypatch, tmp_path):
    with pytest.raises(StudyError, match=r"study snake_ppo, 2 configs x 2 seeds: one "
                                         r"configuration needs 1.00 MiB .* usable \(64.00 KiB x 0.9\); "
                                         r"lower --seeds"):
        _fit(monkeypatch, tmp_path, "snake_ppo", "64KiB")


@pytest.mark.slow
@pytest.mark.extended
def test_study__shape_larger_than_the_stated_device_runs_in_sub_batches(tmp_path, ray_env):
    # cartpole_ppo's smoke shape (2 configs x 2 seeds), given room for one configuration only
    plan = TrialPlan("CartPole-v1", "ppo", dict(num_envs=4, num_steps=128, update_epochs=4, updates_per_chunk=10,
                                                num_minibatches=4, total_timesteps=20_480), [{}], 2, 0)
    one, two = measure_kernel(plan, 1), measure_kernel(plan, 2)
    size = int((one.need(2) + two.need(2)) / 2 / 0.9)
    r = _study("cartpole_ppo", "--smoke", "--out", str(tmp_path), "--device-memory", str(size), "--no-asha",
               env=ray_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 configs x 2 seeds: " in r.stdout and "configurations in sub-batches of 1" in r.stdout
    root = tmp_path / "cartpole_ppo-smoke"
    records = [json.loads(p.read_text()) for p in (root / "trials").glob("*.json")]
    assert len(records) == 2 and all(rec["status"] == "complete" for rec in records), r.stdout
    assert all(s is not None for rec in records for c in rec["configs"] for s in c["scores"])


@pytest.mark.slow
@pytest.mark.extended
def test_study__shape_that_cannot_fit_stops_before_any_trial_in_one_line(tmp_path, ray_env):
    r = _study("snake_ppo", "--smoke", "--out", str(tmp_path), "--device-memory", "64KiB", env=ray_env)
    _one_error_line(r, "study snake_ppo, 2 configs x 2 seeds: one configuration needs ")
    assert "usable (64.00 KiB x 0.9); lower --seeds" in r.stderr
    assert not (tmp_path / "snake_ppo-smoke" / "trials").exists()


def test_study_cli__device_memory_that_is_not_a_size(tmp_path):
    _one_error_line(_study("cartpole_ppo", "--smoke", "--out", str(tmp_path), "--device-memory", "lots"),
                    "--device-memory 'lots' is not a size")


def test_trainable__a_trial_asks_ray_for_its_shapes_share_of_a_gpu():
    from harness.cluster.trainable import shape_key, shape_of, trainable_for

    static = {"network": "transformer", "hidden": (64, 64), "total_timesteps": 100}
    device = {"shapes": {shape_key(static): {"gpu": 0.3333, "config_batch": 5}}}
    cls = trainable_for("snake_ppo", {"cpu": 1, "gpu": 0.5})
    trial = {"plan": {"config": {**static, "hidden": [64, 64]}}, "device": device}  # as it travels (JSON)
    assert shape_of(trial) == {"gpu": 0.3333, "config_batch": 5}
    assert cls.default_resource_request(trial).bundles == [{"CPU": 1, "GPU": 0.3333}]
    other = {"plan": {"config": {**static, "network": "mlp"}}, "device": device}  # a shape not measured
    assert shape_of(other) == {} and cls.default_resource_request(other).bundles == [{"CPU": 1, "GPU": 0.5}]


def test_embedded_ray__gets_the_cores_of_the_affinity_mask_not_the_machines(monkeypatch):
    """Under ``taskset`` or a batch scheduler's allocation, the embedded Ray runs as many trials as
    the process may use cores, not as many as the machine has."""
    import os

    import ray

    from harness.cluster import session as cluster

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 7}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # start() sets variables Ray reads
    seen = {}
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    cluster.start(None)
    assert seen["num_cpus"] == 2
    monkeypatch.delattr(os, "sched_getaffinity")  # an OS without affinity masks (macOS): every core
    assert cluster.usable_cores() == 16
