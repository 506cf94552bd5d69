"""The records of a results folder, typed (harness/store/records.py): what the code writes reads back key
for key, an older folder's records load with defaults and write back as they were, and a malformed
record is one line naming its file. No Ray: the trials and kernels are stood in for (tests/driver.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import studies
from harness import report
from harness.driver.guard import DiskGuard
from harness.phases import ablation, final_phase
from harness.store.folder import ResultsFolder, StudyMeta
from harness.store.records import (
    AblationRecord,
    AblationStep,
    ConfigRecord,
    FinalConfig,
    FinalRecord,
    RecordsError,
    TrialRecord,
    write_json,
)
from tests.driver import CPU, FakeTune, small
from tests.test_driver import _final_kernels, _search
from tests.test_lanes import _LaneTune


def _files(folder: ResultsFolder) -> list[tuple[type, Path, Any]]:
    """(its record type, its JSON as on disk) for every record file of ``folder``."""
    kinds = [(TrialRecord, p) for p in sorted((folder.root / "trials").glob("*.json"))]
    kinds += [(FinalRecord, folder.final_file), (AblationRecord, folder.ablation_file)]
    return [(kind, p, json.loads(p.read_text())) for kind, p in kinds if p.exists()]


def test_records__what_the_code_writes_reads_back_key_for_key(tmp_path, monkeypatch):
    written = []
    # a plain search with its re-training and ablation path; population-based training; a lane trial
    settings, folder, _ = _search(tmp_path / "plain", monkeypatch, FakeTune())
    run_plans, _ = _final_kernels(tmp_path / "plain")
    final_phase.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans)
    assert ablation.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans) is not None
    written += _files(folder)
    study = small(studies.get("cartpole_ppo"), trials=1, configs_per_trial=4, timesteps=30720)
    settings, folder, _ = _search(tmp_path / "pbt", monkeypatch, FakeTune(copies={3: 0}), study=study,
                                  scheduler="pbt")
    final_phase.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=_final_kernels(tmp_path / "pbt")[0])
    written += _files(folder)
    study = small(studies.get("cartpole_ppo"), trials=3, timesteps=20480)
    _, folder, _ = _search(tmp_path / "lanes", monkeypatch, _LaneTune(), study=study, scheduler="lanes")
    written += _files(folder)
    assert [k for k, _, _ in written].count(FinalRecord) == 2 and AblationRecord in [k for k, _, _ in written]
    for kind, path, data in written:
        rec = kind.from_dict(data, path)
        assert rec.to_dict() == data, path
        assert kind.from_dict(json.loads(json.dumps(rec.to_dict())), path) == rec
    by_kind = {kind: data for kind, _, data in written}
    # what the final phase and the ablation path build in code writes the keys they always wrote
    final = by_kind[FinalRecord]
    assert set(final) == {"trials", "configs", "control", "objective"}
    assert set(final["control"]) == {"config_id", "params", "hparams", "static", "failed", "scores",
                                     "final_returns", "diverged", "plans", "command"}
    assert any({"schedule", "lineage"} <= set(c) for c in final["configs"])  # the PBT study's copied one
    path = by_kind[AblationRecord]
    assert set(path) == {"trials", "target", "objective", "maximize", "steps", "kernels", "seconds", "seeds"}
    assert all(set(s) == {"step", "param", "value", "scores", "tried"} for s in path["steps"])
    lane = next(d for k, _, d in written if k is TrialRecord and d.get("lanes"))
    assert {"plan", "lanes"} <= set(lane)
    assert all({"status", "stopped", "curve"} <= set(c) for c in lane["configs"])


def test_records__a_record_written_before_the_types_loads_with_defaults_and_writes_back_as_it_was(tmp_path):
    # a trial record as the first versions wrote it: no metric, objective, threshold, pbt, nodes, final_returns
    old = {"trial": 0, "tune_trial_id": "a", "status": "complete", "static": {"num_envs": 4}, "seeds": 2,
           "env_steps": 100, "kernel_seconds": 3.0, "compile_seconds": 1.0,
           "configs": [{"index": 0, "optuna_number": 0, "params": {"lr": 0.1}, "hparams": {"lr": 0.1},
                        "scores": [10.0, 20.0], "diverged": [False, False], "pruned": False}],
           "curves": [{"chunk": 1, "env_steps": 50, "returns": [[1.0, 2.0]]}]}
    rec = TrialRecord.from_dict(old, "0000.json")
    assert (rec.metric, rec.objective, rec.threshold, rec.pbt, rec.lanes, rec.nodes) == ("mean", "final", None,
                                                                                         None, None, [])
    (c,) = rec.configs
    assert (c.final_returns, c.status, rec.status_of(c), rec.env_steps_of(c), c.value()) == (
        None, None, "complete", 100, 15.0)
    assert rec.to_dict() == old  # no key it did not have
    final = {"trials": [0], "command": "x", "configs": [  # before final_returns, control and objective
        {"config_id": "t0000c0", "params": {"lr": 0.1}, "hparams": {"lr": 0.1}, "static": {}, "failed": False,
         "scores": [30.0, 32.0], "diverged": [False, False], "command": "python -m harness.train ..."}]}
    loaded = FinalRecord.from_dict(final, "final.json")
    assert (loaded.control, loaded.objective, loaded.configs[0].plans, loaded.extra) == (None, "final", None,
                                                                                       {"command": "x"})
    assert loaded.to_dict() == final
    steps = {"steps": [{"step": 0, "param": None, "value": None, "scores": [1.0], "tried": {}}]}
    assert AblationRecord.from_dict(steps, "ablation.json").maximize is True
    assert AblationRecord.from_dict(steps, "ablation.json").to_dict() == steps
    # and the reports rebuild from such a folder
    write_json(tmp_path / "study.json", {"study": "s", "space": {"lr": "log"}})
    write_json(tmp_path / "trials" / "0000.json", old)
    write_json(tmp_path / "final.json", final)
    paths = report.build(tmp_path, plots=False)
    best = json.loads(paths["best"].read_text())
    assert best["config_id"] == "t0000c0" and best["search_score"] == 15.0 and best["reevaluation"]["mean"] == 31.0
    assert best["tuned_vs_default"] is None and best["reproduce"] == {"command": "python -m harness.train ...",
                                                                      "plans": None}


def test_records__keys_this_version_does_not_know_and_nulls_are_kept(tmp_path):
    data = {"trial": 3, "status": "failed", "seeds": 1, "from_the_future": {"x": 1}, "error": None,
            "configs": [{"index": 0, "optuna_number": 7, "params": {}, "hparams": None, "status": "failed",
                         "env_steps": None, "last_value": None, "new": 1}]}
    rec = TrialRecord.from_dict(data, "0003.json")
    assert rec.extra == {"from_the_future": {"x": 1}} and rec.configs[0].extra == {"new": 1}
    assert rec.env_steps_of(rec.configs[0]) is None  # a lane's refill that never trained: not its trial's steps
    assert rec.to_dict() == data
    folder = ResultsFolder(tmp_path)
    folder.record(rec)
    assert json.loads(folder.trial_file(3).read_text()) == data
    # one made here writes its usual keys and whatever is off its default; a changed field is written
    made = TrialRecord(1, "complete", 2, [ConfigRecord(0, {"lr": 0.1}, 4, hparams={"lr": 0.1})])
    assert set(made.to_dict()) == {"trial", "tune_trial_id", "status", "metric", "objective", "threshold", "pbt",
                                   "static", "seeds", "configs", "curves", "env_steps", "nodes"}
    assert set(made.to_dict()["configs"][0]) == {"index", "optuna_number", "params", "hparams", "pruned",
                                                 "scores", "final_returns", "diverged"}
    assert dataclasses.replace(rec, kernel_seconds=2.5).to_dict() == {**data, "kernel_seconds": 2.5}
    assert FinalRecord([FinalConfig("a")]).to_dict()["configs"][0]["plans"] is None
    assert AblationStep(0).to_dict() == {"step": 0, "param": None, "value": None, "scores": None, "tried": {}}


@pytest.mark.parametrize("kind, data, wrong", [
    (TrialRecord, [], "trial, status, seeds, configs"),
    (TrialRecord, {"trial": 0, "status": "complete", "seeds": True, "configs": []}, "seeds"),  # true: no count
    (TrialRecord, {"trial": 0, "status": "complete", "seeds": 1, "configs": [], "nodes": "n1"}, "nodes"),
    (TrialRecord, {"trial": 0, "status": "complete", "seeds": 1, "configs": [{"index": 0, "params": {}}]},
     "configs"),  # no Optuna number
    (TrialRecord, {"trial": 0, "status": "complete", "seeds": 1, "curves": None,
                   "configs": [{"index": 0, "params": {}, "optuna_number": 0, "scores": 7}]}, "configs, curves"),
    (FinalRecord, {"configs": [{"config_id": "t0000c0"}], "control": {"scores": []}}, "control"),
    (FinalRecord, {"configs": [{"config_id": "t0000c0", "failed": "no"}]}, "configs"),
    (AblationRecord, {"steps": [{"param": "lr"}]}, "steps"),  # no step number
    (AblationRecord, {"steps": [], "maximize": 1}, "maximize"),
])
def test_records__a_malformed_record_is_one_line_naming_its_file_and_what_is_wrong(tmp_path, kind, data, wrong):
    path = tmp_path / "trials" / "0000.json"
    with pytest.raises(RecordsError) as err:
        kind.from_dict(data, path)
    assert str(err.value) == f"{path} is not {kind._WHAT} (no valid {wrong})"


def test_records__a_malformed_file_in_a_folder_is_named_and_left_out_never_a_traceback(tmp_path, capsys):
    folder = ResultsFolder(tmp_path)
    folder.write_meta(StudyMeta(study="s", space={"lr": "log"}))
    good = TrialRecord(0, "complete", 1, [ConfigRecord(0, {"lr": 0.1}, 0, scores=[1.0], diverged=[False])])
    folder.record(good)
    write_json(folder.trial_file(1), {**good.to_dict(), "trial": 1, "env_steps": "many"})
    write_json(folder.final_file, {"configs": [{"config_id": "t0000c0"}], "control": {"scores": []}})
    write_json(folder.ablation_file, {"steps": [{"step": "one"}]})
    assert folder.trials() == [good] and folder.final() is None and folder.ablation() is None
    err = capsys.readouterr().err
    assert f"{folder.trial_file(1)} is not a trial record (no valid env_steps); left out" in err
    assert f"{folder.final_file} is not the study's final.json (no valid control); left out" in err
    assert f"{folder.ablation_file} is not the study's ablation.json (no valid steps); left out" in err
    assert len(folder.unreadable()) == 3 and "Traceback" not in err
    assert report.main([str(tmp_path)]) == 0
    assert len((tmp_path / "reports" / "problems.txt").read_text().splitlines()) == 4  # its head line and 3


def test_records__a_lane_trial_replays_from_its_typed_configurations_only_if_they_are_a_lane_trials():
    from harness.lanes.trial import replay

    searched = TrialRecord.from_dict({"trial": 0, "status": "complete", "seeds": 1, "configs": [
        {"index": 0, "params": {}, "optuna_number": 0}]}, "0000.json")  # no lane, no started chunk
    for configs in (searched.configs, [c.to_dict() for c in searched.configs]):
        with pytest.raises(ValueError, match="replay needs each configuration's lane and started_chunk"):
            replay(None, configs)
    with pytest.raises(RecordsError, match="a recorded lane configuration is not a trial record's configuration"):
        replay(None, [{"index": 0}])
