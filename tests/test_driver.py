"""The driver's units without Ray: the results folder, settings resolution, the disk guard, the
search phase (Ray Tune stood in for by tests/driver.FakeTune, the searcher and Optuna real), the
final phase (its kernels stood in for), the summary, and the CLI's handling of Ctrl-C."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pytest

import studies
from harness import report
from harness.cluster import tuning
from harness.driver import summary
from harness.driver.guard import DiskGuard
from harness.driver.settings import Options, prepare_folder, resolve
from harness.kernel.plan import FINAL
from harness.phases import final_phase, search_phase
from harness.space import Budget, Categorical, Int, LogUniform, StudyError, Uniform
from harness.store.folder import InFlight, ResultsFolder, StudyMeta, Unreadable
from harness.store.records import RecordsError, TrialRecord, write_json
from tests.driver import CPU, FakeTune, settings_for, small

ROOT = Path(__file__).resolve().parent.parent


# -- the results folder ---------------------------------------------------------------------------

def test_folder__paths_follow_the_layout(tmp_path):
    f = ResultsFolder(tmp_path / "s")
    assert f.trial_file(3) == tmp_path / "s" / "trials" / "0003.json"
    assert f.inflight_file(3) == tmp_path / "s" / "inflight" / "0003.json"
    assert f.policy_file("t0001c0", 2) == tmp_path / "s" / "checkpoints" / "t0001c0" / "seed_2.msgpack"
    assert f.schedule_file("t0001c0") == tmp_path / "s" / "schedules" / "t0001c0.json"
    assert f.report("best.json") == tmp_path / "s" / "reports" / "best.json"
    assert f.optuna_url() == f"sqlite:///{tmp_path / 's' / 'optuna.db'}"


def test_folder__study_json_reads_back_with_defaults_for_what_older_versions_left_out(tmp_path):
    f = ResultsFolder(tmp_path / "s")
    with pytest.raises(RecordsError, match="no results folder at"):
        f.meta()
    f.root.mkdir()
    with pytest.raises(RecordsError, match=r"is not a study's results folder \(no study.json\)"):
        f.meta()
    write_json(f.study_file, {"study": "s", "from_the_future": 1})
    meta = f.meta()
    assert (meta.direction, meta.metric, meta.objective, meta.eval_policy, meta.space, meta.reference) == (
        "maximize", "mean", "final", "greedy", {}, None) and meta.maximize
    full = dataclasses.replace(meta, direction="minimize", objective="steps", threshold=400.0,
                               reference={"label": "random play", "return": -1.0},
                               budget={"trials": 2, "configs_per_trial": 4, "seeds": 3, "timesteps": 1000})
    f.write_meta(full)
    assert f.meta() == full and not full.maximize
    assert json.loads(f.study_file.read_text())["from_the_future"] == 1  # what a newer version wrote is kept
    write_json(f.study_file, ["not", "a", "study"])
    with pytest.raises(RecordsError, match="is not a study's study.json"):
        f.meta()


def test_folder__the_run_counter_never_reuses_a_tune_folder(tmp_path):
    f = ResultsFolder(tmp_path)
    assert f.next_run("run") == "run-0" and f.next_run("final") == "final-0"
    for name in ("run-0", "run-3", "final-0", "run-x"):
        (f.tune_dir / name).mkdir(parents=True)
    assert f.next_run("run") == "run-4" and f.next_run("final") == "final-1"


def test_folder__in_flight_entries_carry_their_checkpoints_newest_first_and_a_record_ends_them(tmp_path):
    f = ResultsFolder(tmp_path)
    f.note_inflight(InFlight(trial=2, plan={"trial": 2}, points=[{}], optuna_numbers=[4],
                             tune_trial_ids=["a", "b"]))
    old = f.tune_dir / "run-0" / "trial_a" / "checkpoint_000000" / "kernel.msgpack"
    new = f.tune_dir / "run-1" / "trial_b" / "checkpoint_000001" / "kernel.msgpack"
    for i, path in enumerate((old, new)):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"k")
        os.utime(path, (1000 + i, 1000 + i))
    (f.root / "inflight" / "0007.json").write_text("{cut sho")
    entry, broken = f.inflight()
    assert entry.trial == 2 and entry.resume_from == (str(new), str(old))
    assert isinstance(broken, Unreadable) and broken.path.name == "0007.json" and "not valid JSON" in broken.error
    f.record(TrialRecord(2, "complete", 1, [], tune_trial_id="b"))
    assert [r.trial for r in f.trials()] == [2]
    assert not f.inflight_file(2).exists() and not new.exists() and old.exists()


# -- settings, resolved once before Ray -----------------------------------------------------------

def test_settings__the_budget_is_the_studys_for_the_device_with_the_options_over_it(tmp_path):
    study = studies.get("cartpole_ppo")
    s = settings_for(study, tmp_path)
    assert s.budget("cpu") == study.cpu and s.budget("gpu") == study.gpu
    s = settings_for(study, tmp_path, smoke=True, seeds=3, scheduler="none")
    assert s.budget("cpu") == s.budget("gpu") == dataclasses.replace(study.smoke, seeds=3)
    assert s.scheduler == "none" and s.storage == f"sqlite:///{tmp_path / 'cartpole_ppo' / 'optuna.db'}"


def test_settings__a_resumed_study_keeps_its_shape_and_may_grow_its_trials(tmp_path):
    study = studies.get("cartpole_ppo")
    folder = ResultsFolder(tmp_path)
    stored = StudyMeta(study="cartpole_ppo", budget={"trials": 5, "configs_per_trial": 2, "seeds": 2,
                                                     "timesteps": 20480})
    s = resolve(study, Options(trials=7), stored=stored, folder=folder, resume_command="")
    assert s.budget("cpu") == s.budget("gpu") == Budget(7, 2, 2, 20480)
    assert resolve(study, Options(), stored=stored, folder=folder, resume_command="").budget("gpu").trials == 5
    with pytest.raises(StudyError, match=r"was started with --seeds 2; resume with the same value or use --fresh"):
        resolve(study, Options(seeds=3), stored=stored, folder=folder, resume_command="")


@pytest.mark.parametrize("options, expect", [
    (dict(checkpoint_every="soon"), r"--checkpoint-every 'soon': give seconds \('60s'\), chunks"),
    (dict(device_memory="lots"), r"--device-memory 'lots' is not a size"),
    (dict(timesteps=0), r"^--timesteps must be >= 1, got 0$"),
    (dict(scheduler="pbt", configs_per_trial=2), r"needs --configs-per-trial >= 4, got 2"),
    (dict(scheduler="pbt", timesteps=20480), r"exploits every 4 chunks but a trial runs 4"),
])
def test_settings__what_cannot_work_is_refused_before_ray_in_one_line(tmp_path, options, expect):
    with pytest.raises(StudyError, match=expect) as err:
        settings_for(studies.get("cartpole_ppo"), tmp_path, **options)
    assert "\n" not in str(err.value)


def test_settings__lanes_need_evaluations_during_training_to_judge_configurations(tmp_path):
    study = dataclasses.replace(studies.get("cartpole_ppo"), objective="final", curve_episodes=0)
    with pytest.raises(StudyError, match=r"--scheduler lanes judges each configuration by its evaluations during "
                                         r"training, and curve_episodes=0 evaluates none"):
        settings_for(study, tmp_path, scheduler="lanes")
    assert settings_for(study, tmp_path, scheduler="asha").scheduler == "asha"


@pytest.mark.parametrize("change, expect", [
    (dict(space={}), r"the search space is empty; search at least one setting"),
    (dict(space=dict(lr=1e-3)), r"space\['lr'\] must be LogUniform, Uniform, Int or Categorical, got 0.001 "),
    (dict(space=[("lr", 1e-3)]), r"space must be a dict of setting names"),
    (dict(space=dict(num_minibatches=Int(0, 8, log=True))), r"integer range on a log scale but low=0 < 1"),
    (dict(space=dict(lr=Uniform(1e-4, float("inf")))), r"space\['lr'\] bounds must be finite numbers"),
    (dict(space=dict(num_minibatches=Int(2, 8.5))), r"space\['num_minibatches'\] bounds must be integers"),
    (dict(cpu=dict(trials=2, configs_per_trial=2, seeds=1, timesteps=1)), r"cpu must be a harness.space.Budget"),
    (dict(config=["num_envs", 4]), r"config must be a dict of setting names"),
    (dict(seed=-1), r"seed must be a whole number >= 0, got -1"),
    (dict(top_k=-1), r"top_k must be a whole number >= 0, got -1"),
    (dict(final_seeds=0), r"final_seeds must be a whole number >= 1, got 0"),
])
def test_study__a_field_of_the_wrong_shape_is_refused_where_the_study_is_made(change, expect):
    with pytest.raises(StudyError, match=expect) as err:
        dataclasses.replace(studies.get("cartpole_ppo"), **change)
    assert "\n" not in str(err.value) and str(err.value).startswith("study cartpole_ppo: ")


@pytest.mark.parametrize("change, expect", [
    (dict(space=dict(gamma=Uniform(0.9, 1.1))), r"space\['gamma'\] cannot work: gamma=1.1 is outside \[0, 1\]"),
    (dict(space=dict(lr=LogUniform(1e-4, 1e-2), clip_eps=Categorical((0.1, 0.0)))),
     r"space\['clip_eps'\] cannot work: clip_eps=0.0 is outside \(0, inf\)"),
    (dict(hparams=dict(gae_lambda=-0.5)),
     r"hparams\['gae_lambda'\] cannot work: gae_lambda=-0.5 is outside \[0, 1\]"),
    (dict(baseline=dict(lr=-1e-3)), r"baseline\['lr'\] cannot work: lr=-0.001 is outside \(0, inf\)"),
])
def test_settings__a_hyperparameter_range_the_algorithm_cannot_use_is_refused(tmp_path, change, expect):
    study = dataclasses.replace(studies.get("cartpole_ppo"), **change)
    with pytest.raises(StudyError, match=expect) as err:
        settings_for(study, tmp_path)
    assert "\n" not in str(err.value) and str(err.value).startswith("study cartpole_ppo: ")


def test_space__every_registered_study_searches_inside_its_algorithms_ranges():
    """The ranges are not so tight that a registered study (or SAC's alpha_lr=0: a fixed temperature)
    is refused."""
    import algos
    from harness.space import validate

    for study in studies.registered().values():
        spec = algos.get(study.algo)
        validate(study, spec.config_cls, spec.hparams_cls, timesteps=study.cpu.timesteps)
    sac = studies.get("pendulum_sac")
    spec = algos.get("sac")
    validate(dataclasses.replace(sac, hparams={**sac.hparams, "alpha_lr": 0.0}), spec.config_cls, spec.hparams_cls,
             timesteps=sac.cpu.timesteps)
    assert "alpha_lr" in spec.hparams_cls.RANGES and "gamma" in algos.get("ppo").hparams_cls.RANGES


def test_settings__each_results_folder_has_its_own_optuna_study_in_a_shared_storage(tmp_path):
    """A second folder of the same study in a shared --storage (--smoke, another --out, --fresh)
    gets NAME-2, so starting it cannot mark the first one's running trials failed as stale; a
    resumed folder keeps the name its study.json holds (a folder from before: the study's name)."""
    from harness.search.searcher import open_study, reconcile

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    study = studies.get("cartpole_ppo")
    first = settings_for(study, tmp_path / "a", storage=url).with_optuna_study(None, own_storage=False)
    assert first.optuna_name == "cartpole_ppo"
    running = open_study(first.study, url, name=first.optuna_name).ask()
    second = settings_for(study, tmp_path / "b", storage=url).with_optuna_study(None, own_storage=False)
    assert second.optuna_name == "cartpole_ppo-2"
    meta = second.meta(Budget(1, 1, 1, 64), None, "now")
    ResultsFolder(tmp_path).write_meta(meta)
    assert ResultsFolder(tmp_path).meta().optuna_study == "cartpole_ppo-2"
    ostudy = open_study(second.study, url, name=second.optuna_name)
    assert reconcile(ostudy, []) == 0  # nothing of the first folder's is touched
    assert optuna.load_study(study_name="cartpole_ppo", storage=url).trials[running.number].state.name == "RUNNING"
    again = settings_for(study, tmp_path / "b", storage=url).with_optuna_study(meta, own_storage=False)
    assert again.optuna_name == "cartpole_ppo-2"
    old = StudyMeta(study="cartpole_ppo")  # written before the name was stored
    resumed = settings_for(study, tmp_path / "c", storage=url).with_optuna_study(old, own_storage=False)
    assert resumed.optuna_name == "cartpole_ppo"
    with pytest.raises(StudyError, match=r"^cannot open Optuna storage 'nosuchdb://x': "):  # (resolve says so too)
        dataclasses.replace(settings_for(study, tmp_path / "d"), storage="nosuchdb://x").with_optuna_study(
            None, own_storage=False)


def test_settings__a_results_folder_that_cannot_be_written_is_one_line_and_nothing_is_left_made(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(StudyError, match=r"cannot write results to .*a_file/x/cartpole_ppo: Not a directory"):
        prepare_folder(ResultsFolder(tmp_path / "a_file" / "x" / "cartpole_ppo"), "cartpole_ppo", fresh=False)
    assert prepare_folder(ResultsFolder(tmp_path / "new" / "deeper" / "cartpole_ppo"), "cartpole_ppo",
                          fresh=False) == (None, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # the try made nothing that stays


@pytest.mark.parametrize("name", ["cartpole_ppo", "cartpole_sac", "dungeon_ppo", "pendulum_sac", "snake_ppo"])
def test_settings__smoke_runs_with_population_based_training_for_every_study(tmp_path, name):
    study = studies.get(name)
    s = settings_for(study, tmp_path, smoke=True, scheduler="pbt")  # refused before: C < 4, then chunks
    budget = s.budget("cpu")
    assert budget.configs_per_trial >= 4 and budget.timesteps >= study.smoke.timesteps
    assert 1 <= s.pbt()["interval"] < min(s.chunks(budget))


def test_settings__smoke_fixes_static_choices_at_the_controls_so_one_kernel_shape_compiles(tmp_path):
    for name, fixed in (("snake_ppo", {"network": "mlp"}), ("cartpole_ppo", {"num_minibatches": 4})):
        study = studies.get(name)
        s = settings_for(study, tmp_path, smoke=True)
        assert s.static_names == [] and s.study.config.items() >= fixed.items()
        assert set(s.study.space) == set(study.space) - set(fixed)  # the rest is still searched
        params, static, _ = s.control(1000)
        assert static.items() >= fixed.items() and params.keys() == s.study.space.keys()
        assert settings_for(study, tmp_path).static_names == list(fixed)  # not without --smoke


def test_settings__the_folder_must_be_this_studys_or_new(tmp_path):
    folder = ResultsFolder(tmp_path / "cartpole_ppo")
    assert prepare_folder(folder, "cartpole_ppo", fresh=False) == (None, None)
    folder.root.mkdir()
    (folder.root / "notes.txt").write_text("mine")
    with pytest.raises(StudyError, match="exists and is not a study's results folder"):
        prepare_folder(folder, "cartpole_ppo", fresh=False)
    folder.write_meta(StudyMeta(study="snake_ppo"))
    with pytest.raises(StudyError, match="holds study 'snake_ppo', not 'cartpole_ppo'"):
        prepare_folder(folder, "cartpole_ppo", fresh=False)
    meta, aside = prepare_folder(folder, "cartpole_ppo", fresh=True)
    assert meta is None and Path(aside).name.startswith("cartpole_ppo.old-")
    assert (Path(aside) / "notes.txt").read_text() == "mine"


def test_settings__one_factory_makes_every_plan_from_the_study(tmp_path):
    study = studies.get("cartpole_ppo")
    s = settings_for(study, tmp_path)
    make = search_phase.plan_factory(s, Budget(1, 2, 3, 20480))
    points = [{"lr": 1e-3, "gamma": 0.9, "num_minibatches": 8}, {"lr": 2e-3, "gamma": 0.95, "num_minibatches": 8}]
    plan = make(points, 5)
    assert plan.config == {**study.config, "num_minibatches": 8, "total_timesteps": 20480}
    assert plan.hparams == [{"lr": 1e-3, "gamma": 0.9}, {"lr": 2e-3, "gamma": 0.95}]
    assert (plan.trial, plan.seeds, plan.study_seed, plan.objective, plan.curve_episodes, plan.pbt) == (
        5, 3, study.seed, "auc", study.curve_episodes, None)


# -- the disk guard -------------------------------------------------------------------------------

class _Searcher:
    metric, mode = "score", "max"

    def __init__(self, err: Exception) -> None:
        self.err, self.calls = err, 0

    def suggest(self, trial_id):
        self.calls += 1
        raise self.err


def test_guard__a_full_disk_in_the_searcher_stops_the_study_in_one_line_and_other_errors_propagate(tmp_path):
    folder = ResultsFolder(tmp_path)
    guard = DiskGuard(folder, "python -m harness.study x")
    inner = _Searcher(OSError(errno.ENOSPC, "No space left on device"))
    wrapped = tuning.GuardedSearcher(inner, guard)
    # the search is over (a None would have Tune wait up to 10 min for a trial when none is running)
    assert wrapped.suggest("a") == tuning.Searcher.FINISHED and guard.problem == "No space left on device"
    assert wrapped.suggest("b") == tuning.Searcher.FINISHED and inner.calls == 1  # tripped: nothing more asked
    assert tuning.StopOnDiskError(guard).stop_all()
    err = str(guard.error())
    assert err == (f"cannot write to the results folder {tmp_path} (No space left on device); the trials "
                   "recorded so far (0) are intact. Free space (or make it writable), then resume with: "
                   "python -m harness.study x")
    other = tuning.GuardedSearcher(_Searcher(ValueError("a bug")), DiskGuard(folder, ""))
    with pytest.raises(ValueError, match="a bug"):
        other.suggest("a")
    quiet = DiskGuard(folder, "")
    log = tuning.DiskErrorLog(quiet)
    assert log.filter(logging.LogRecord("x", logging.ERROR, "", 0, "saving failed: [Errno 30] Read-only "
                                                                    "file system", None, None)) is False
    assert quiet.problem == "Read-only file system"
    assert log.filter(logging.LogRecord("x", logging.ERROR, "", 0, "something else", None, None)) is True
    # Tune's state file renamed from its temp name while Tune copied its folder: not printed, not the disk
    for name, shown in [("/tmp/ray/s/driver_artifacts/.4dcd-tmp-basic-variant-state-2026.json", False),
                        ("/results/x/trials/0001.json", True)]:
        try:
            raise FileNotFoundError(2, f"Failed to open local file '{name}'")
        except FileNotFoundError:
            info = sys.exc_info()
        record = logging.LogRecord("x", logging.ERROR, "", 0, "Saving experiment state failed", None, info)
        assert log.filter(record) is shown and quiet.problem == "Read-only file system"


# -- the search phase, Tune stood in for ------------------------------------------------------------

def _search(tmp_path, monkeypatch, fake, study=None, **options):
    study = study or small(studies.get("cartpole_ppo"), trials=3, timesteps=20480)
    settings = settings_for(study, tmp_path, **options)
    folder = ResultsFolder(tmp_path / study.name)
    folder.write_meta(settings.meta(settings.budget("cpu"), None, "now"))
    monkeypatch.setattr(tuning, "run", fake)
    return settings, folder, search_phase.run(settings, folder, CPU, DiskGuard(folder, "resume"))


def _optuna(folder, name="cartpole_ppo"):
    return optuna.load_study(study_name=name, storage=folder.optuna_url()).trials


def test_search_phase__records_every_trial_and_tells_optuna_each_configurations_own_result(tmp_path, monkeypatch,
                                                                                             capsys):
    _, folder, outcome = _search(tmp_path, monkeypatch, FakeTune(chunks=2))
    assert (outcome.done, outcome.total, outcome.interrupted) == (3, 3, False)
    records = folder.trials()
    assert [(r.trial, r.status) for r in records] == [(0, "complete"), (1, "complete"), (2, "complete")]
    assert records[2].configs[1].scores == [31.0, 31.0] and len(records[2].curves) == 2
    assert not list((folder.root / "inflight").glob("*"))
    trials = _optuna(folder)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6
    assert [t.value for t in trials] == [10, 11, 20, 21, 30, 31]
    assert trials[5].intermediate_values == {10240: 31.0, 20480: 31.0}
    out = capsys.readouterr().out
    assert "[3/3] trial 2: best of its 2 configs 31.0 | study best 31.0 (t0002c1: " in out


def test_search_phase__a_stopped_search_resumes_its_in_flight_trial_from_its_checkpoint(tmp_path, monkeypatch,
                                                                                        capsys):
    _, folder, outcome = _search(tmp_path, monkeypatch, FakeTune(stop_after=2))
    assert (outcome.done, outcome.interrupted) == (1, True)
    (entry,) = folder.inflight()
    assert entry.trial == 1 and [t.state.name for t in _optuna(folder)] == ["COMPLETE"] * 2 + ["RUNNING"] * 2
    ckpt = folder.tune_dir / "run-0" / f"trial_{entry.tune_trial_ids[0]}" / "checkpoint_000000" / "kernel.msgpack"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"k")
    again = FakeTune()
    _, _, outcome = _search(tmp_path, monkeypatch, again)
    assert outcome.done == 3 and not outcome.interrupted and again.calls[0]["num_samples"] == 2
    adopted = again.configs[0]
    assert adopted["plan"]["trial"] == 1 and adopted["resume_from"] == [str(ckpt)]
    assert adopted["plan"] == entry.plan  # the same plan, under its own trial number
    out = capsys.readouterr().out
    assert "resuming: 1 trials recorded; in flight when stopped: trial 1 from its checkpoint" in out
    records = folder.trials()
    assert [r.trial for r in records] == [0, 1, 2]
    numbers = [c.optuna_number for r in records for c in r.configs]
    assert numbers == [0, 1, 2, 3, 4, 5]  # the in-flight trial kept its Optuna trials
    assert [t.state.name for t in _optuna(folder)] == ["COMPLETE"] * 6
    assert not list((folder.root / "inflight").glob("*"))


# a real disk filling up under a running study, through Ray and Tune: tests/test_study.py
@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "No space left on device"),
                                         (errno.EROFS, "Read-only file system")])
def test_search_phase__a_disk_that_fills_mid_search_stops_it_in_one_line_and_keeps_the_records(tmp_path,
                                                                                               monkeypatch, code,
                                                                                               words):
    real = ResultsFolder.record

    def record(self, rec):
        if rec.trial == 1:
            raise OSError(code, words)
        real(self, rec)

    monkeypatch.setattr(ResultsFolder, "record", record)
    with pytest.raises(StudyError, match=rf"\({words}\); the trials recorded so far \(1\) are intact"):
        _search(tmp_path, monkeypatch, FakeTune())
    folder = ResultsFolder(tmp_path / "cartpole_ppo")
    assert [r.trial for r in folder.trials()] == [0]
    (entry,) = folder.inflight()  # neither recorded nor told: the next run adopts it
    assert entry.trial == 1 and [t.state.name for t in _optuna(folder)][2:] == ["RUNNING"] * 2


def test_search_phase__diverged_configurations_are_recorded_as_diverged(tmp_path, monkeypatch, capsys):
    _, folder, _ = _search(tmp_path, monkeypatch, FakeTune(value=float("nan")))
    assert "[1/3] trial 0: all configs diverged" in capsys.readouterr().out
    assert {t.state.name for t in _optuna(folder)} == {"FAIL"}
    configs, _, _ = report.tables(folder)
    assert configs.diverged.all() and configs["rank"].isna().all()


def test_search_phase__a_study_whose_every_trial_fails_the_same_way_stops_in_one_line(tmp_path, monkeypatch,
                                                                                      capsys):
    fake = FakeTune(error="TypeError: float() argument must be a string or a real number, not 'Tracer'")
    with pytest.raises(StudyError, match=r"^every trial failed the same way, so the study stopped: TypeError: "
                                         r"float\(\) argument .* resume with: python -m harness.study x\)$"):
        _search(tmp_path, monkeypatch, fake)
    assert len(fake.configs) == 2  # of 3: the budget is not burnt
    folder = ResultsFolder(tmp_path / "cartpole_ppo")
    assert [(r.status, r.error) for r in folder.trials()] == [("failed", fake.error)] * 2
    assert f"[1/3] trial 0: FAILED: {fake.error}" in capsys.readouterr().out


def test_failures__say_the_exception_and_its_message_not_the_frameworks_boilerplate():
    import jax
    import jax.numpy as jnp

    from harness.cluster.trainable import DETERMINISTIC, failure_text
    from harness.cluster.tuning import error_line

    try:
        jax.jit(lambda x: float(jnp.min(x)))(jnp.ones(3))
    except Exception as err:  # what gymnax's spaces did inside the kernel's trace
        assert isinstance(err, DETERMINISTIC)  # recorded at once, never retried
        text = failure_text(err)
    assert text.startswith("ConcretizationTypeError: Abstract tracer value encountered where concrete value is "
                           "expected"), text
    from ray.exceptions import RayTaskError  # a trial's call to a Ray actor (the lane broker) that raised

    remote = RayTaskError("LaneBroker.step", "Traceback (most recent call last):\n  ...\nKeyError: 7",
                          KeyError(7)).as_instanceof_cause()
    assert isinstance(remote, DETERMINISTIC) and failure_text(remote) == "KeyError: 7"
    ray_text = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in step\n    r = f()\n"
                "ray.exceptions.RayTaskError(ValueError): ray::cartpole_ppo_trial.train() (pid=1)\n"
                "ValueError: num_minibatches must divide the batch\n"
                "--------------------\nFor simplicity, JAX has removed its internal frames from the traceback "
                "of the following exception. Set JAX_TRACEBACK_FILTERING=off to include these.")
    assert error_line(ray_text) == "ValueError: num_minibatches must divide the batch"
    assert error_line("") == "no error text"
    died = "The actor died unexpectedly before finishing this task."
    assert error_line(f"ray.exceptions.ActorDiedError: {died}") == f"ActorDiedError: {died}"


def test_trial_error__read_from_the_trials_local_error_file_before_storage_has_its_copy(tmp_path):
    """Tune writes a failure to the trial's local folder, then calls back; the copy in storage
    (what ``Trial.get_error`` reads) comes later: a trial whose node died read "no error text"."""
    from harness.cluster.tuning import trial_error

    class Trial:
        error_file = str(tmp_path / "error.txt")

        def get_error(self):
            return None  # storage has no copy yet

    (tmp_path / "error.txt").write_text("Failure # 1 (occurred at 2026-11-26)\nThe actor died unexpectedly before "
                                        "finishing this task.\n\tclass_name: cartpole_ppo_trial\n")
    assert trial_error(Trial()) == "class_name: cartpole_ppo_trial"  # the last line that is not boilerplate
    (tmp_path / "error.txt").write_text("Failure # 1 (occurred at 2026-11-26)\nValueError: bad lr\n")
    assert trial_error(Trial()) == "ValueError: bad lr"
    Trial.error_file = None  # no local file: storage's copy
    assert trial_error(Trial()) == "no error text"


# -- the final phase, its kernels stood in for ------------------------------------------------------

def _final_kernels(tmp_path):
    """Stands in for the re-training kernels: configuration i of a plan scores its first
    hyperparameter's lr x 1e4 + the round, and writes its policies' files."""
    seen = []

    def run_plans(plans):
        first = len(seen)
        seen.extend(plans)
        out = []
        for n, plan in enumerate(plans):
            ckpt = tmp_path / "ckpt" / str(first + n)
            ckpt.mkdir(parents=True)
            grid = [[h["lr"] * 1e4 + plan.trial] * plan.seeds for h in plan.hparams]
            for i in range(len(plan.hparams)):
                for s in range(plan.seeds):
                    (ckpt / f"c{i}_s{s}.msgpack").write_bytes(b"p")
            out.append({"scores": grid, "final_returns": grid, "diverged": [[False] * plan.seeds] * len(grid),
                        "checkpoint": str(ckpt)})
        return out
    return run_plans, seen


def test_final_phase__the_top_configurations_and_the_control_train_on_the_same_fresh_seeds(tmp_path, monkeypatch,
                                                                                           capsys):
    settings, folder, _ = _search(tmp_path, monkeypatch, FakeTune())
    run_plans, seen = _final_kernels(tmp_path)
    final = final_phase.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans)
    assert [c.config_id for c in final.configs] == ["t0002c1", "t0002c0", "t0001c1"]
    control = final.control
    assert control.config_id == "default" and control.params == settings.control(20480)[0]
    rounds = -(-settings.study.final_seeds // 2)
    keys = [(p["plan"]["trial"], p["plan"]["stream"], p["plan"]["seeds"]) for p in control.plans]
    assert keys == [(r, FINAL, 2) for r in range(rounds)]
    for c in final.configs:  # round r of every kernel: the same keys (common random numbers)
        assert [(p["plan"]["trial"], p["plan"]["stream"], p["plan"]["seeds"]) for p in c.plans] == keys
        assert len(c.scores) == rounds * 2 and f"--seeds {rounds * 2}" in c.command
    assert folder.kept_policies() == ["t0001c1", "t0002c0", "t0002c1"]  # not the control's
    policy = json.loads((folder.policy_dir("t0002c1") / "policy.json").read_text())
    assert [s["seed"] for s in policy["seeds"]] == list(range(rounds * 2))
    assert final_phase.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans) is None  # up to date
    assert "re-training the top 3 configurations and the default one on 4 fresh seeds" in capsys.readouterr().out
    text = folder.final_file.read_text()
    folder.final_file.write_text(text[: len(text) // 2])  # cut short (a full disk, a kill mid-write elsewhere)
    again = final_phase.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans)  # made again
    assert again is not None and folder.final() == again and again.configs == final.configs
    assert "final.json is not valid JSON" in capsys.readouterr().err
    # and the summary a study ends with, from the reports
    lines = summary.lines(report.build(folder), done=3, minutes=0.5)
    assert lines[0] == "done: 3 trials in 0.5 min"
    assert re.fullmatch(r"best: t\d{4}c\d re-evaluated \S+ \(95% CI \S+\) on 4 fresh seeds, final return \S+; "
                        r"search score \S+", lines[1]), lines
    assert lines[3].startswith("  reproduce: python -m harness.train --algo ppo --env CartPole-v1 --seeds 4 ")
    assert lines[4].startswith("tuned vs default (auc): ")
    assert lines[5].startswith(f"reports: {folder.reports_dir}/ (configs.csv, seeds.csv, curves.csv, final.csv, ")


def test_final_phase__top_k_0_re_trains_nothing_and_the_summary_says_the_search_score(tmp_path, monkeypatch):
    settings, folder, _ = _search(tmp_path, monkeypatch, FakeTune())
    assert settings_for(settings.study, tmp_path, top_k=0).study.top_k == 0  # --top-k 0
    with pytest.raises(StudyError, match="--top-k must be 0 or more, got -1"):
        settings_for(settings.study, tmp_path, top_k=-1)
    none = dataclasses.replace(settings, study=dataclasses.replace(settings.study, top_k=0))
    run_plans, seen = _final_kernels(tmp_path)
    assert final_phase.run(none, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans) is None and not seen
    lines = summary.lines(report.build(folder), done=3, minutes=0.5)
    assert lines[1] == "best: t0002c1 search score 31.0 (not re-evaluated)", lines


def test_phases__population_based_training_is_kept_out_of_tpe_and_its_schedules_are_replayed(tmp_path,
                                                                                            monkeypatch):
    study = small(studies.get("cartpole_ppo"), trials=1, configs_per_trial=4, timesteps=30720)
    settings, folder, _ = _search(tmp_path, monkeypatch, FakeTune(copies={3: 0}), study=study, scheduler="pbt")
    (record,) = folder.trials()
    assert record.pbt == settings.pbt() and [c["chunk"] for c in record.curves if c.get("pbt")] == [1]
    trials = _optuna(folder)
    assert {t.state.name for t in trials} == {"FAIL"}  # hyperparameters changed mid-run: kept out of TPE ...
    assert [t.user_attrs["pbt_value"] for t in trials] == [10.0, 11.0, 12.0, 13.0]  # ... but kept
    paths = report.build(folder)
    import pandas as pd

    pbt = pd.read_csv(paths["pbt"])
    assert len(pbt) == 4 * 2 and pbt.copied.sum() == 1 and paths["pbt_png"].read_bytes()[:4] == b"\x89PNG"
    run_plans, _ = _final_kernels(tmp_path)
    final = final_phase.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans)
    copied = next(c for c in final.configs if c.config_id == "t0000c3")
    lr = record.configs[0].hparams["lr"]  # c3 trained with c0's network: c0's values, then its own
    assert copied.hparams["lr"] == lr and copied.lineage == ["t0000c0", "t0000c3"]
    assert copied.schedule == [{"chunk": 1, "hparams": {**record.configs[0].hparams, "lr": 2 * lr}}]
    assert copied.plans[0]["plan"]["schedule"][0]["chunk"] == 1
    assert f"--schedule {folder.schedule_file('t0000c3')}" in copied.command
    assert json.loads(folder.schedule_file("t0000c3").read_text()) == copied.schedule
    assert not any(c.schedule for c in final.configs if c.config_id != "t0000c3")


# -- empty and interrupted studies ------------------------------------------------------------------

def test_report__a_study_with_no_record_yet_builds_its_reports(tmp_path):
    folder = ResultsFolder(tmp_path)
    folder.write_meta(StudyMeta(study="s", space={"lr": "log"}))
    paths = report.build(folder)
    assert "best" not in paths and paths["configs"].exists()
    assert "No configuration has been scored yet" in paths["index"].read_text()


def test_study_cli__ctrl_c_before_any_record_prints_the_resume_line(tmp_path, monkeypatch, capsys):
    from harness import study as cli

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "execute", interrupted)
    argv = ["cartpole_ppo", "--smoke", "--out", str(tmp_path), "--fresh"]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert f"Resume with: python -m harness.study cartpole_ppo --smoke --out {tmp_path}\n" in err
    assert "Traceback" not in err


def test_cluster__sigterm_during_a_study_does_what_ctrl_c_does():
    import signal

    from harness.cluster.session import terminate_as_interrupt

    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt("resume"):  # Python's own SIGINT handler
        os.kill(os.getpid(), signal.SIGTERM)
    seen = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))  # as Tune's, mid-fit
    try:
        with terminate_as_interrupt("resume"):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        signal.signal(signal.SIGINT, before)
    assert seen == [signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # given back after the study
    # Ray's monitor, stopped by the same signal, publishes its stack to the driver: not printed
    from ray._private import worker
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        worker.print_to_stdstream({"lines": ["The autoscaler failed with the following error:\nTerminated with "
                                             "signal 15\n  File monitor.py"], "pid": "raylet", "is_err": False},
                                  ignore_prefix=False)
        worker.print_to_stdstream({"lines": ["a worker died"], "pid": "raylet", "is_err": False},
                                  ignore_prefix=False)
    assert "Terminated" not in out.getvalue() and "a worker died" in out.getvalue()
    assert not any(t.name == "sigterm-grace" and t.is_alive() for t in threading.enumerate())


def test_cluster__sigterm_whose_graceful_stop_hangs_exits_after_its_grace_with_the_resume_line():
    # a signal to the whole process group also stops Ray's processes, and Tune's stop then waits
    code = ("import os, signal, time\n"
            "from harness.cluster.session import terminate_as_interrupt\n"
            "with terminate_as_interrupt('python -m harness.study x', grace=0.5):\n"
            "    signal.signal(signal.SIGINT, lambda *a: None)  # a stop that never finishes\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(60)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).parents[1])
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip() == "interrupted; finished trials are saved. Resume with: python -m harness.study x"


def test_study_cli__fresh_with_a_study_that_cannot_work_leaves_the_old_results_where_they_are(tmp_path, capsys):
    from harness import study as cli

    (tmp_path / "bad.py").write_text(
        "from harness.space import *\n"
        "STUDY = Study(name='bad', description='d', env='CartPole-v1', algo='nope', "
        "space=dict(lr=LogUniform(1e-4, 1e-2)), "
        "cpu=Budget(1, 1, 1, 64), gpu=Budget(1, 1, 1, 64), smoke=Budget(1, 1, 1, 64))\n")
    ResultsFolder(tmp_path / "out" / "bad").write_meta(StudyMeta(study="bad"))
    assert cli.main([str(tmp_path / "bad.py"), "--fresh", "--out", str(tmp_path / "out")]) == 2
    assert "error: study bad: unknown algo 'nope'; known algos: ppo, pqn, sac" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["bad"]


@pytest.mark.parametrize("args, expect", [
    (["--no-asha", "--scheduler", "pbt"], "--no-asha is --scheduler none: it cannot go with --scheduler pbt"),
    (["--address", ""], "--address is empty: give a value or leave it out"),
    (["--storage", " "], "--storage is empty: give a value or leave it out"),
    (["--address", "127.0.0.1:{closed}"], "cannot reach a Ray cluster at 127.0.0.1:{closed} (Connection refused)"),
    (["--address", "ray://127.0.0.1:{closed}"], "cannot reach a Ray cluster at ray://127.0.0.1:{closed}"),
    (["--storage", "bogus://nothing"], "cannot open Optuna storage 'bogus://nothing': Can't load plugin"),
])
def test_study_cli__flags_that_cannot_work_are_one_line_before_ray_and_fresh_moves_nothing(args, expect, tmp_path,
                                                                                            capsys):
    """Said before Ray starts (none runs in this process) and before --fresh would set the old
    results aside: an --address that does not answer (at once, also for Ray's client), a --storage
    that cannot be opened, an empty value, --no-asha against another scheduler."""
    import socket

    from harness import study as cli

    ResultsFolder(tmp_path / "cartpole_ppo").write_meta(StudyMeta(study="cartpole_ppo"))
    with socket.socket() as s:  # a loopback port held, never listening, for the whole call
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
        argv = ["cartpole_ppo", "--fresh", "--out", str(tmp_path), *[a.format(closed=closed) for a in args]]
        assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and expect.format(closed=closed) in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["cartpole_ppo"]


@pytest.mark.parametrize("module, argv", [
    ("study", ["cartpole_ppo", "--scheduler", "bogus"]), ("study", ["cartpole_ppo", "--trails", "3"]),
    ("report", []), ("report", [""]), ("play", ["results/x", "--seed", "one"]), ("train", ["--seeds", "x"]),
])
def test_clis__a_command_line_argparse_refuses_is_one_line_not_the_usage(module, argv, capsys):
    import importlib

    with pytest.raises(SystemExit) as out:
        importlib.import_module(f"harness.{module}").main(argv)
    err = capsys.readouterr().err
    assert out.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: ") and err.rstrip().endswith(f"(python -m harness.{module} --help for usage)")


def test_study_cli__list_with_a_study_name_is_one_line_not_a_list(capsys):
    from harness import study

    assert study.main(["--list", "cartpole_ppo"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == ("error: --list takes no study name (got 'cartpole_ppo'); python -m "
                                         "harness.study --list lists the studies, python -m harness.study NAME "
                                         "runs one\n")


@pytest.mark.parametrize("name", ["../elsewhere", "", ".hidden", "a b"])
def test_study__a_name_that_is_not_a_folder_name_is_refused_where_the_study_is_made(name):
    with pytest.raises(StudyError, match=rf"^study name {re.escape(repr(name))} must name its results folder: "):
        dataclasses.replace(studies.get("cartpole_ppo"), name=name)


def test_study__a_budget_counts_in_whole_numbers():
    with pytest.raises(StudyError, match=r"^budget trials must be a whole number, got 2.5$"):
        Budget(2.5, 2, 2, 1024)
    with pytest.raises(StudyError, match=r"^budget timesteps must be a whole number, got '10k'$"):
        Budget(2, 2, 2, "10k")


# -- the shape of the driver ----------------------------------------------------------------------

def test_driver__only_the_cli_imports_studies_and_sees_argv():
    for path in (ROOT / "harness").rglob("*.py"):
        text, name = path.read_text(), path.relative_to(ROOT / "harness").as_posix()
        if name != "study.py":
            assert not re.search(r"^\s*(import studies|from studies)", text, re.M), path
        if name not in ("study.py", "report.py", "train.py", "play.py", "cli.py"):  # the CLIs, their parser
            assert "sys.argv" not in text and "argparse" not in text, path


def test_driver__no_module_but_the_folder_builds_paths_inside_a_results_folder():
    layout = re.compile(r"""/\s*f?["'](study\.json|final\.json|optuna\.db|inflight|trials|checkpoints|schedules|"""
                        r"""ray-session\.json|reports|tensorboard|tune)\b""")  # joined as a path: root / "trials"
    offenders = [p.relative_to(ROOT).as_posix() for p in (ROOT / "harness").rglob("*.py")
                 if p != ROOT / "harness" / "store" / "folder.py" and layout.search(p.read_text())]
    assert offenders == []


def test_study_cli__ray_is_first_imported_after_its_variables_are_set(tmp_path):
    """Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER (every port on loopback) and RAY_AUTH_MODE when
    it is first imported: nothing on the way to ``harness.cluster.session.start`` may import it."""
    code = f"""
import sys
from harness import study
from harness.cluster import session
from harness.cluster.session import ClusterError

def start(address, code_dir=None):
    print("ray imported before cluster.start:", "ray" in sys.modules)
    raise ClusterError("stop here")

session.start = start
sys.exit(study.main(["cartpole_ppo", "--smoke", "--out", {str(tmp_path)!r}]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "error: stop here" in r.stderr, r.stdout + r.stderr
    assert "ray imported before cluster.start: False" in r.stdout, r.stdout


def test_core_and_driver_units__import_without_starting_ray():
    code = ("import harness.store.folder, harness.driver.settings, harness.driver.guard, "
            "harness.driver.progress, harness.driver.summary, sys; "
            "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if m.startswith('ray'))")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_settings__an_algorithm_that_cannot_take_the_env_is_refused_before_ray_starts(tmp_path):
    study = dataclasses.replace(studies.get("cartpole_sac"), env="CartPole-v1")
    with pytest.raises(StudyError, match=r"study cartpole_sac: algo sac is for continuous actions; env "
                                         r"CartPole-v1 has discrete ones \(Discrete\(2\)\)$"):
        settings_for(study, tmp_path)


def test_tuning__tunes_closing_list_of_incomplete_trials_is_not_printed():
    """Each failed trial has its own line with its error; Tune's "Trials did not complete: [ids]"
    after them is boilerplate and stays out of the study's output. Other errors still show."""
    from harness.cluster import tuning

    log, seen = logging.getLogger("ray.tune.tune"), []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log.addHandler(handler)
    try:
        log.addFilter(tuning._not_incomplete_trials)
        log.error("Trials did not complete: %s", ["cartpole_ppo_trial_5a943cf5"])
        log.error("Experiment state could not be saved")
    finally:
        log.removeHandler(handler)
        log.removeFilter(tuning._not_incomplete_trials)
    assert seen == ["Experiment state could not be saved"]


def test_progress__says_every_15_s_what_runs_also_before_the_first_chunk(monkeypatch):
    from harness.driver import progress

    now, lines = [100.0], []
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    p = progress.Progress(4, metric="mean", maximize=True, say=lines.append)
    now[0] += 10
    p.tick(running=2)
    assert lines == []  # not yet 15 s
    now[0] += 6
    p.tick(running=2)  # workers starting, kernels compiling: no chunk reported yet
    assert lines == ["  0/4 trials done, 2 running; waiting for their first chunk (each worker compiles its "
                     "kernel first)"]
    now[0] += 5
    p.result("a", 3000, running=2)  # within 15 s of the last line: silent
    now[0] += 10
    p.result("b", 1000, running=2)
    assert lines[1:] == ["  0/4 trials done, 2 running; 4,000 env steps, 267 steps/s"]
