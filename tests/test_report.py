"""Report statistics and tables, from hand-made records (no Ray)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from harness import report
from harness.store.records import write_json


@pytest.mark.parametrize("x", [[1, 2, 3, 100], list(range(1, 9)), [9, 2, 7, 3, 8, 1, 6, 5, 4, 0, 11, 10]])
def test_iqm__equals_the_25pct_trimmed_mean_when_quartiles_fall_on_samples(x):
    assert report.iqm(np.array(x)) == pytest.approx(stats.trim_mean(x, 0.25))


def test_iqm__weights_the_samples_straddling_a_quartile_by_the_fraction_inside():
    assert report.iqm(np.array([5.0, 1.0, 3.0])) == pytest.approx((0.25 * 1 + 3 + 0.25 * 5) / 1.5)
    assert report.iqm(np.array([2.0, 7.0, 1.0, 9.0, 4.0])) == pytest.approx((0.75 * 2 + 4 + 0.75 * 7) / 2.5)


def test_bootstrap_ci__brackets_the_mean_and_collapses_for_constant_scores():
    x = np.random.default_rng(1).normal(100, 10, size=16)
    lo, hi = report.bootstrap_ci(x)
    assert lo < x.mean() < hi and hi - lo < 4 * 10 / 4 * 1.96
    assert report.bootstrap_ci(np.full(4, 500.0)) == (500.0, 500.0)
    assert report.bootstrap_ci(x) == report.bootstrap_ci(x)  # seeded: reports rebuild identically


def _record(trial, status, scores, diverged):
    return {"trial": trial, "tune_trial_id": f"id{trial}", "status": status, "static": {"num_envs": 4},
            "seeds": 2, "env_steps": 100,
            "configs": [{"index": i, "optuna_number": 2 * trial + i,
                         "params": {"lr": 0.1 * (i + 1), "hidden": [64, 64]}, "hparams": {"lr": 0.1},
                         "scores": sc, "diverged": dv, "pruned": status == "pruned"}
                        for i, (sc, dv) in enumerate(zip(scores, diverged))],
            "curves": [{"chunk": 1, "env_steps": 50, "returns": [[1.0, None], [2.0, 3.0]]}]}


def test_tables__rank_only_complete_finite_undiverged_configs(tmp_path):
    write_json(tmp_path / "study.json", {"study": "s", "direction": "maximize",
                                         "space": {"lr": "log", "hidden": "categorical"}})
    write_json(tmp_path / "trials" / "0000.json",
               _record(0, "complete", [[10.0, 20.0], [None, None]], [[False, False], [True, True]]))
    write_json(tmp_path / "trials" / "0001.json",
               _record(1, "complete", [[30.0, 40.0], [5.0, 5.0]], [[False, False], [False, False]]))
    write_json(tmp_path / "trials" / "0002.json", _record(2, "pruned", [None, None], [[False] * 2] * 2))
    configs, seeds, curves = report.tables(tmp_path)
    assert list(configs.config_id[:3]) == ["t0001c0", "t0000c0", "t0001c1"]
    assert list(configs["rank"][:3]) == [1, 2, 3] and configs["rank"][3:].isna().all()
    row = configs.set_index("config_id").loc["t0001c0"]
    assert row["mean"] == 35.0 and row["hidden"] == "64,64"
    assert row["std"] == pytest.approx(np.std([30, 40], ddof=1))
    assert configs.set_index("config_id").loc["t0000c1", "diverged"]
    assert len(seeds) == 3 * 2 * 2 and len(curves) == 3 * 2 * 2
    paths = report.build(tmp_path)
    assert "best" in paths  # no re-evaluation yet: the search's best, said so
    for name in ("curves", "params", "progress"):
        assert (tmp_path / "reports" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "reports" / "index.html").read_text()
    assert all(f'src="{n}.png"' in page for n in ("curves", "params", "progress")) and "t0001c0" in page
    # the answer first, the leaderboard after it; the records linked, not dumped
    assert page.index("The answer") < page.index("What mattered") < page.index("Leaderboard")
    assert '<a href="best.json">' in page and '"reproduce"' not in page and "<pre>" not in page


def _events(folder):
    """Every Event in the TensorBoard files of ``folder`` (TFRecord framing read by hand)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    out = []
    for f in sorted(folder.glob("events.out.tfevents.*")):
        data = f.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            out.append(Event.FromString(data[i + 12:i + 12 + n]))
            i += 12 + n + 4
    return out


def _scalars(events):
    return {(v.tag, e.step): v.simple_value for e in events for v in e.summary.value if v.HasField("simple_value")}


def test_tensorboard__each_configuration_is_a_run_with_curves_and_hparams(tmp_path):
    write_json(tmp_path / "study.json", {"study": "s", "direction": "maximize",
                                         "space": {"lr": "log", "hidden": "categorical"}})
    write_json(tmp_path / "trials" / "0000.json",
               _record(0, "complete", [[10.0, 20.0], [None, None]], [[False, False], [True, True]]))
    report.build(tmp_path)
    runs = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
    assert runs == ["t0000c0", "t0000c1"]
    events = _events(tmp_path / "tensorboard" / "t0000c0")
    scalars = _scalars(events)
    assert scalars[("return/mean", 50)] == 1.0 and scalars[("return/seed_0", 50)] == 1.0
    assert ("return/seed_1", 50) not in scalars  # no finished episode: nothing logged, not a zero
    assert scalars[("score/mean", 0)] == 15.0
    plugins = {v.metadata.plugin_data.plugin_name for e in events for v in e.summary.value}
    assert "hparams" in plugins
    hp = [v.metadata.plugin_data.content for e in events for v in e.summary.value
          if v.metadata.plugin_data.plugin_name == "hparams"]
    assert any(b"lr" in c and b"hidden" in c for c in hp)
    diverged = _scalars(_events(tmp_path / "tensorboard" / "t0000c1"))
    assert not any(tag.startswith("score/") for tag, _ in diverged)  # the diverged configuration: no score


def test_tensorboard__per_seed_curves_only_for_the_best_configurations(tmp_path, monkeypatch):
    from harness.reports import tensorboard

    monkeypatch.setattr(tensorboard, "PER_SEED", 1)
    write_json(tmp_path / "study.json", {"study": "s", "direction": "maximize", "space": {"lr": "log"}})
    write_json(tmp_path / "trials" / "0000.json",
               _record(0, "complete", [[10.0, 20.0], [30.0, 40.0]], [[False, False], [False, False]]))
    report.build(tmp_path)
    best, other = (_scalars(_events(tmp_path / "tensorboard" / c)) for c in ("t0000c1", "t0000c0"))
    assert best[("return/seed_0", 50)] == 2.0 and best[("return/seed_1", 50)] == 3.0
    assert other[("return/mean", 50)] == 1.0 and not any(tag.startswith("return/seed") for tag, _ in other)


def test_report__during_a_study_only_the_small_tables_are_rewritten(tmp_path):
    write_json(tmp_path / "study.json", {"study": "s", "direction": "maximize", "space": {"lr": "log"}})
    write_json(tmp_path / "trials" / "0000.json",
               _record(0, "complete", [[10.0, 20.0], [30.0, 40.0]], [[False, False], [False, False]]))
    paths = report.build(tmp_path, plots=False)
    assert set(paths) == {"configs", "seeds", "best"} and not (tmp_path / "reports" / "curves.csv").exists()
    import pandas as pd

    full = report.build(tmp_path)
    curves = pd.read_csv(full["curves"])
    assert curves.config_id.tolist() == ["t0000c0", "t0000c0", "t0000c1", "t0000c1"]
    assert curves.seed.tolist() == [0, 1, 0, 1] and curves.env_steps.tolist() == [50] * 4
    np.testing.assert_array_equal(curves.episode_return.to_numpy(), [1.0, np.nan, 2.0, 3.0])


def test_tables__ties_are_broken_by_the_training_curve_never_by_order(tmp_path):
    write_json(tmp_path / "study.json", {"study": "s", "direction": "maximize", "space": {"lr": "log"}})
    rec = _record(0, "complete", [[500.0, 500.0], [500.0, 500.0]], [[False, False], [False, False]])
    rec["curves"] = [{"chunk": 1, "env_steps": 50, "returns": [[100.0, 200.0], [400.0, 500.0]]},
                     {"chunk": 2, "env_steps": 100, "returns": [[500.0, 500.0], [500.0, 500.0]]}]
    write_json(tmp_path / "trials" / "0000.json", rec)
    tied = _record(1, "complete", [[500.0, 500.0], [400.0, 400.0]], [[False, False], [False, False]])
    tied["curves"] = rec["curves"]  # t0001c0 learns exactly like t0000c0
    write_json(tmp_path / "trials" / "0001.json", tied)
    configs, _, _ = report.tables(tmp_path)
    # t0000c1 got to 500 sooner: ranked first although its id comes later
    assert configs.config_id.tolist()[:3] == ["t0000c1", "t0000c0", "t0001c0"]
    assert configs["rank"].tolist() == [1, 2, 2, 4]  # equal on both: the same rank
    assert configs.set_index("config_id").train_auc.to_dict() == pytest.approx(
        {"t0000c1": 475.0, "t0000c0": 325.0, "t0001c0": 325.0, "t0001c1": 475.0})
    best = report.build(tmp_path)["best"].read_text()
    assert "ties broken by train_auc" in best


def test_report__unreadable_trial_records_are_named_and_the_rest_reported(tmp_path, capsys):
    write_json(tmp_path / "study.json", {"study": "s", "direction": "maximize", "space": {"lr": "log"}})
    for t in range(4):
        write_json(tmp_path / "trials" / f"{t:04d}.json",
                   _record(t, "complete", [[10.0 + t, 20.0], [30.0, 40.0]], [[False, False], [False, False]]))
    text = (tmp_path / "trials" / "0002.json").read_text()
    (tmp_path / "trials" / "0002.json").write_text(text[: len(text) // 2])  # cut short by a full disk
    write_json(tmp_path / "trials" / "0003.json", {"trial": 3, "status": "complete"})  # not a whole record
    assert report.main([str(tmp_path)]) == 0  # the report is built ...
    err = capsys.readouterr().err
    assert "0002.json is not valid JSON" in err
    assert "0003.json is not a trial record (no valid seeds, configs)" in err
    configs = pd.read_csv(tmp_path / "reports" / "configs.csv")
    assert sorted(set(configs.trial)) == [0, 1]  # ... from the readable records
    problems = (tmp_path / "reports" / "problems.txt").read_text()
    assert "0002.json" in problems and "0003.json" in problems
    write_json(tmp_path / "trials" / "0002.json", _record(2, "complete", [[1.0, 2.0]] * 2, [[False] * 2] * 2))
    (tmp_path / "trials" / "0003.json").unlink()
    paths = report.build(tmp_path, plots=False)
    assert "problems" not in paths and not (tmp_path / "reports" / "problems.txt").exists()
    assert sorted(set(pd.read_csv(paths["configs"]).trial)) == [0, 1, 2]


def test_report__bytes_that_are_not_text_a_config_without_its_index_and_a_cut_final_json_are_named(
        tmp_path, capsys):
    """Every unreadable file is named and left out; the reports still rebuild from the rest, and
    the answer that final.json names keeps its re-evaluation when its own trial record is lost."""
    import json

    write_json(tmp_path / "study.json", {"study": "s", "direction": "maximize", "space": {"lr": "log"}})
    for t in range(3):
        write_json(tmp_path / "trials" / f"{t:04d}.json",
                   _record(t, "complete", [[10.0 + t, 20.0], [30.0, 40.0]], [[False, False], [False, False]]))
    (tmp_path / "trials" / "0001.json").write_bytes(b"\xff\xfe\x00garbage")  # a corrupt disk block
    broken = _record(2, "complete", [[1.0, 2.0]] * 2, [[False] * 2] * 2)
    del broken["configs"][0]["index"]
    write_json(tmp_path / "trials" / "0002.json", broken)
    answer = {"config_id": "t0001c1", "params": {"lr": 0.2}, "scores": [50.0, 52.0], "final_returns": [50.0, 52.0],
              "diverged": [False, False], "plans": [], "command": "python -m harness.train ..."}
    write_json(tmp_path / "final.json", {"trials": [0, 1, 2], "configs": [answer], "control": None})
    (tmp_path / "ablation.json").write_text('{"steps": [')  # cut short
    assert report.main([str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "0001.json is not valid JSON (not UTF-8 text: byte 0)" in err
    assert "0002.json is not a trial record (no valid configs)" in err
    assert "ablation.json is not valid JSON" in err and "Traceback" not in err
    best = json.loads((tmp_path / "reports" / "best.json").read_text())
    assert best["config_id"] == "t0001c1" and best["search_score"] is None
    assert best["reevaluation"]["mean"] == 51.0
    problems = (tmp_path / "reports" / "problems.txt").read_text()
    assert all(f in problems for f in ("0001.json", "0002.json", "ablation.json")), problems
    (tmp_path / "final.json").write_text("[]")
    assert report.main([str(tmp_path)]) == 0
    assert "final.json is not the study's final.json (no valid configs)" in capsys.readouterr().err
    assert json.loads((tmp_path / "reports" / "best.json").read_text())["reevaluation"] is None


def test_report__a_study_json_with_fields_of_the_wrong_type_is_one_line(tmp_path, capsys):
    write_json(tmp_path / "study.json", {"study": "s", "space": ["lr"], "direction": 3})
    assert report.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    where = tmp_path / "study.json"
    assert err.strip() == f"error: {where} is not a study's study.json (no valid direction, space)"
    write_json(where, {"study": "s", "budget": {"trials": 2}})  # a resumed study reads all four
    assert report.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {where} is not a study's study.json (no valid budget)"
    write_json(where, {"study": "s", "budget": {"trials": 2, "configs_per_trial": 2, "seeds": True,
                                                 "timesteps": 64}})  # true is not a seed count
    assert report.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {where} is not a study's study.json (no valid budget)"


def test_report__values_a_study_cannot_have_and_files_where_folders_go_are_one_line(tmp_path, capsys):
    where = tmp_path / "study.json"
    for field, value, choices in (("metric", "median", "mean, iqm"), ("objective", "best", "final, auc, steps"),
                                  ("direction", "sideways", "maximize, minimize")):
        write_json(where, {"study": "s", field: value})
        assert report.main([str(tmp_path)]) == 2
        assert capsys.readouterr().err.strip() == f"error: {where}: {field} {value!r} is not one of {choices}"
    where.unlink()
    where.mkdir()  # a folder where study.json goes
    assert report.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {where} cannot be read (Is a directory)"
    where.rmdir()
    write_json(where, {"study": "s", "direction": "maximize", "space": {"lr": "log"}})
    (tmp_path / "reports").write_text("")  # a file where the reports folder goes
    assert report.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"error: the reports cannot be built: File exists: {tmp_path / 'reports'}", err
    (tmp_path / "reports").unlink()
    (tmp_path / "trials").write_text("")  # a file where the trial records go: said, not read as none
    assert report.main([str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'trials'} is not a folder, so no trial record was read; left out" in err, err


def test_report__records_of_the_wrong_shape_or_a_trial_recorded_twice_are_named_and_left_out(tmp_path, capsys):
    """Valid JSON, wrong contents: named once each, the reports built from the rest (a trial
    recorded under two file names: the first kept)."""
    write_json(tmp_path / "study.json", {"study": "s", "direction": "maximize", "space": {"lr": "log"}})
    for t in range(2):
        write_json(tmp_path / "trials" / f"{t:04d}.json",
                   _record(t, "complete", [[10.0 + t, 20.0], [30.0, 40.0]], [[False, False], [False, False]]))
    write_json(tmp_path / "trials" / "0002.json", _record(0, "complete", [[1.0, 2.0]] * 2, [[False] * 2] * 2))
    write_json(tmp_path / "trials" / "0000.bak.json", _record(0, "complete", [[3.0, 4.0]] * 2, [[False] * 2] * 2))
    wrong = _record(3, "complete", [[1.0, 2.0]] * 2, [[False] * 2] * 2)
    wrong["configs"][1]["scores"] = 7
    write_json(tmp_path / "trials" / "0003.json", wrong)
    write_json(tmp_path / "final.json", {"configs": [{"config_id": 5}], "control": None})
    assert report.main([str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "0002.json is not a trial record of its own (trial 0 again, as in 0000.json)" in err
    assert "0000.bak.json is not a trial record of its own (trial 0 again, as in 0000.json)" in err
    assert "0003.json is not a trial record (no valid configs)" in err
    assert "final.json is not the study's final.json (no valid configs)" in err and "Traceback" not in err
    configs = pd.read_csv(tmp_path / "reports" / "configs.csv")
    assert sorted(set(configs.trial)) == [0, 1] and configs.set_index("config_id")["mean"]["t0000c0"] == 15.0


def test_disk_problem__names_a_full_or_read_only_disk_wherever_it_hides_and_nothing_else(tmp_path, monkeypatch):
    import errno
    import os
    import sqlite3

    from harness.store.records import disk_problem

    full = os.strerror(errno.ENOSPC)
    assert disk_problem(OSError(errno.ENOSPC, full)) == full
    try:  # wrapped, as Tune and SQLAlchemy pass it on
        try:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("An exception is raised during the commit") from inner
    except RuntimeError as err:
        assert disk_problem(err) == os.strerror(errno.EROFS)
    assert disk_problem("OSError: [Errno 28] Error writing bytes to file. Detail: No space left on device") == full
    assert disk_problem(sqlite3.OperationalError("database or disk is full")) == full
    assert disk_problem(OSError(errno.ENOENT, "No such file or directory")) is None
    # an unrecognised OSError or SQLite error counts only when the results folder refuses a write now
    assert disk_problem(OSError(errno.ENOENT, "No such file or directory"), tmp_path) is None
    assert disk_problem(ValueError("bad config"), tmp_path) is None
    import harness.store.records

    # a read-only disk
    monkeypatch.setattr(harness.store.records, "writable", lambda folder: os.strerror(errno.EROFS))
    assert disk_problem(OSError(errno.ENOENT, "No such file or directory"), tmp_path) == os.strerror(errno.EROFS)
    assert disk_problem(ValueError("bad config"), tmp_path) is None
    assert disk_problem(ValueError("bad config")) is None
    try:  # SQLite cannot create its journal beside optuna.db, wrapped as SQLAlchemy does
        try:
            raise sqlite3.OperationalError("unable to open database file")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("(sqlite3.OperationalError) unable to open database file") from inner
    except RuntimeError as err:
        assert disk_problem(err, tmp_path) == os.strerror(errno.EROFS)
        assert disk_problem(err) is None


def test_curves_plot__marks_where_each_lane_configuration_stopped_or_diverged(tmp_path):
    """A lane study's curves: each configuration stopped at a rung or diverged is marked at its last
    chunk (its mean there, or its last finite one; a configuration with none sits at the bottom),
    and the plot draws one mark per such configuration; those trained to the end have none."""
    import matplotlib.axes

    from harness.reports import plots

    nan = np.nan
    configs = pd.DataFrame({"config_id": ["a", "b", "c", "d"],
                            "status": ["complete", "pruned", "diverged", "diverged"],
                            "stopped": ["trained its whole budget", "stopped at rung 1 (200 env steps)",
                                        "diverged", "diverged"], "rank": [1.0, nan, nan, nan]})
    rows = [("a", s, e, 0.0, 10.0 * e / 100 + s) for e in (100, 200, 300) for s in (0, 1)]
    rows += [("b", s, e, 0.0, 5.0 + s) for e in (100, 200) for s in (0, 1)]
    rows += [("c", 0, 100, 0.0, 7.0), ("c", 1, 100, 0.0, 9.0), ("c", 0, 200, 0.0, nan), ("c", 1, 200, 0.0, nan)]
    rows += [("d", s, 100, 0.0, nan) for s in (0, 1)]
    curves = pd.DataFrame(rows, columns=["config_id", "seed", "env_steps", "episode_return", "eval_return"])
    marks = plots.stopped_marks(configs, curves).set_index("config_id")
    assert marks.status.to_dict() == {"b": "pruned", "c": "diverged", "d": "diverged"}
    assert marks.env_steps.to_dict() == {"b": 200, "c": 200, "d": 100}
    assert marks.value["b"] == 5.5 and marks.value["c"] == 8.0 and np.isnan(marks.value["d"])
    assert plots.stopped_marks(configs.drop(columns="stopped"), curves).empty  # trial-level: none

    drawn = []
    real = matplotlib.axes.Axes.scatter
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.axes.Axes, "scatter",
                   lambda ax, x, y, **kw: drawn.append((list(x), kw.get("color"))) or real(ax, x, y, **kw))
        assert plots.curves_plot(configs, curves, tmp_path / "curves.png").exists()
    assert sorted(drawn, key=str) == sorted([([200], "grey"), ([200], "tab:red"), ([100], "tab:red")], key=str)
