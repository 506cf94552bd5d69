"""What mattered: hyperparameter importance (Optuna's evaluators) and the ablation path from the
default to the best configuration. No Ray: synthetic objectives, and the final phase's kernels
stood in for (tests/test_driver.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from harness import report
from harness.driver import summary
from harness.driver.guard import DiskGuard
from harness.kernel.plan import FINAL
from harness.phases import ablation, final_phase
from harness.reports import importance
from harness.reports.ablation import table as ablation_table
from harness.store.folder import StudyMeta
from harness.store.records import AblationRecord
from tests.driver import CPU, FakeTune
from tests.test_driver import _final_kernels, _search


def _configs(n: int, seed: int = 0) -> pd.DataFrame:
    """A synthetic study: ``lr`` decides the score, ``useless`` does nothing, ``mb`` a static choice."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(dict(lr=10 ** rng.uniform(-4, -2, n), useless=rng.uniform(0, 1, n),
                           mb=rng.choice([4, 8], n)))
    df["mean"] = 100 * np.log10(df.lr) + rng.normal(0, 1, n)
    df["status"], df["diverged"], df["pruned"] = "complete", False, False
    return df


META = StudyMeta(study="s", space={"lr": "log", "useless": "uniform", "mb": "categorical"})


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_importance__the_deciding_hyperparameter_ranks_first_and_the_useless_one_last_by_both(direction):
    configs = _configs(32)
    if direction == "minimize":
        configs["mean"] = -configs["mean"]
    meta = StudyMeta(**{**META.to_dict(), "direction": direction})
    imp = importance.table(configs, meta)
    for ev in importance.EVALUATORS:
        rows = imp[(imp.scope == "all") & (imp.evaluator == ev)].set_index("param")
        assert rows.loc["lr", "rank"] == 1 and rows.loc["lr", "importance"] > 0.6, rows
        assert rows.loc["useless", "importance"] < 0.2, rows
        assert abs(rows.importance.sum() - 1) < 1e-6
    # a scope per static choice with enough configurations, where the static choice is not a name
    scopes = set(imp.scope)
    assert scopes == {"all", "mb=4", "mb=8"}, scopes
    assert set(imp[imp.scope == "mb=4"].param) == {"lr", "useless"}
    fanova = imp[(imp.scope == "all") & (imp.evaluator == "fanova")].set_index("param")
    assert importance.top(imp, 1) == [("lr", fanova.loc["lr", "importance"])]  # fanova's, over all configs
    ped = imp[(imp.scope == "all") & (imp.evaluator == "ped_anova")].set_index("param")
    assert importance.top(imp, 3, "ped_anova") == [(p, ped.loc[p, "importance"])
                                                   for p in ped.sort_values("rank").index]


def test_importance__too_few_or_pruned_or_diverged_configurations_give_none_and_say_so():
    configs = _configs(12)
    configs.loc[:4, "pruned"] = True  # stopped early: its score is not comparable
    configs.loc[5, "diverged"] = True
    assert len(importance.usable(configs)) == 6
    assert importance.table(configs, META).empty
    assert importance.too_few(configs) == ("hyperparameter importance needs at least 8 completed configurations; "
                                           "this study has 6")


def test_ablation_path__orders_the_switches_by_their_gain_alone_and_ends_at_the_best_configurations_own_scores():
    start = {"a": 0, "b": 0.0, "c": "x", "d": 0, "same": 1}
    end = {"a": 1, "b": 1.0, "c": "y", "d": 1, "same": 1}
    weight = {"a": 10.0, "b": 1.0, "c": 0.0, "d": 0.5}
    calls = []

    def score(point, seed):  # b and d together gain 5 more than alone: the path's points measure it
        both = 5.0 if point["b"] == end["b"] and point["d"] == end["d"] else 0.0
        return sum(weight[n] for n in weight if point[n] == end[n]) + both + 0.01 * seed

    def measure(points):
        calls.append({n: dict(p) for n, p in points.items()})
        return {n: [score(p, s) for s in range(4)] for n, p in points.items()}

    end_scores = [16.5 + 0.01 * s for s in range(4)]
    steps = ablation.path(start, end, [0.01 * s for s in range(4)], end_scores, measure)
    assert [s.param for s in steps] == [None, "a", "b", "d", "c"]
    assert len(calls) == 2  # the single switches, then the path's inner points: one batch each
    assert sorted(calls[0]) == ["a", "b", "c", "d"] and calls[0]["c"] == {**start, "c": "y"}
    assert calls[1] == {"b": {**start, "a": 1, "b": 1.0}, "d": {**start, "a": 1, "b": 1.0, "d": 1}}
    assert steps[-1].scores == end_scores  # the last point is the best configuration's re-training
    assert steps[1].tried == pytest.approx({"a": 10.015, "b": 1.015, "c": 0.015, "d": 0.515})
    assert steps[3].tried == pytest.approx({"d": 16.515})
    # minimizing: the switch that lowers the score most comes first; a failed candidate gains least
    flip = ablation.path(start, end, [0.0] * 4, [0.0] * 4,
                         lambda pts: {n: None if n == "b" else [-score(p, s) for s in range(4)]
                                      for n, p in pts.items()}, maximize=False)
    assert [s.param for s in flip] == [None, "a", "d", "c", "b"]
    table = ablation_table(AblationRecord(steps, maximize=True))
    assert list(table.param) == ["(default)", "a", "b", "d", "c"] and list(table.value) == ["", "1", "1", "1", "y"]
    assert table.gain.round(6).tolist()[1:] == [10.0, 1.0, 5.5, 0.0]  # paired by seed: the noise cancels
    assert (table.gain_ci_low.round(6) == table.gain.round(6)).iloc[1:].all()
    # inner points on fewer seeds than the ends: gains are paired over the seeds both have
    short = [dataclasses.replace(s, scores=s.scores[:2]) if 0 < s.step < 4 else s for s in steps]
    table = ablation_table(AblationRecord(short, maximize=True))
    assert table.gain.round(6).tolist()[1:] == [10.0, 1.0, 5.5, 0.0] and table.seeds.tolist() == [4, 2, 2, 2, 4]


def test_ablation_path__one_or_two_differing_names_need_at_most_one_batch():
    calls = []

    def measure(points):
        calls.append(sorted(points))
        return {n: [float(p["a"] + 2 * p["b"])] for n, p in points.items()}

    one = ablation.path({"a": 0, "b": 0}, {"a": 1, "b": 0}, [0.0], [1.0], measure)
    assert [s.param for s in one] == [None, "a"] and calls == []
    two = ablation.path({"a": 0, "b": 0}, {"a": 1, "b": 1}, [0.0], [3.0], measure)
    assert [s.param for s in two] == [None, "b", "a"] and calls == [["a", "b"]]
    assert [s.scores for s in two] == [[0.0], [2.0], [3.0]]


def test_ablation__runs_after_the_final_phase_on_its_seeds_and_reports_the_path(tmp_path, monkeypatch, capsys):
    settings, folder, _ = _search(tmp_path, monkeypatch, FakeTune())
    run_plans, seen = _final_kernels(tmp_path)  # a configuration scores lr x 1e4 + the round
    final = final_phase.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans)
    before = len(seen)
    out = ablation.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans)
    best = report.reevaluated_best(final, "mean", True)
    names = ablation.differing(final.control.params, best.params)
    assert "lr" in names and len(names) >= 3
    steps = out.steps
    assert [s.param for s in steps][:2] == [None, "lr"]  # only lr changes the score here
    assert steps[0].scores == final.control.scores and steps[-1].scores == best.scores
    assert steps[1].tried["lr"] > max(v for k, v in steps[1].tried.items() if k != "lr")
    # every ablation kernel: the final phase's first round of seeds (trial 0 of the FINAL stream)
    rounds = final_phase.rounds_of(settings, settings.budget("cpu"))
    assert rounds > 1 and {(p.trial, p.stream, p.seeds) for p in seen[before:]} == {(0, FINAL, 2)}
    assert out.kernels == len(seen) - before > 0
    if "num_minibatches" in names:  # a static choice: switching it needs a kernel of its own
        want = {final.control.params["num_minibatches"], best.params["num_minibatches"]}
        assert {p.config["num_minibatches"] for p in seen[before:]} == want
    assert ablation.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans) is None  # up to date
    paths = report.build(folder)
    assert {"ablation", "ablation_png"} <= set(paths)
    table = pd.read_csv(paths["ablation"])
    assert table["mean"].iloc[-1] == pytest.approx(np.mean(best.scores))
    assert table.gain.iloc[1] > 0 and (table.gain.iloc[2:].abs() < 1e-9).all()
    lines = summary.lines(paths, done=3, minutes=0.5, ablation=folder.ablation())
    path_line = next(ln for ln in lines if ln.startswith("ablation path (default "))
    assert ", lr +" in path_line or "): lr +" in path_line
    assert f"; {out.kernels} extra kernels, " in path_line and "(--no-ablation skips it)" in path_line
    assert lines[-1] == "hyperparameter importance needs at least 8 completed configurations; this study has 6"
    out_text = capsys.readouterr().out
    passes = 1 if len(names) <= 2 else 2
    assert (f"ablation path, pass 1/{passes}: {len(names)} configurations (each switched alone from the default) "
            f"on 2 seeds ...") in out_text


def test_ablation__turned_off_or_without_a_final_phase_runs_nothing(tmp_path, monkeypatch):
    settings, folder, _ = _search(tmp_path, monkeypatch, FakeTune())
    run_plans, seen = _final_kernels(tmp_path)
    assert ablation.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans) is None  # no final.json
    final_phase.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans)
    before = len(seen)
    off = type(settings)(**{**settings.__dict__, "ablation": False})  # --no-ablation
    assert ablation.run(off, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans) is None
    assert len(seen) == before and folder.ablation() is None


def test_ablation__a_best_configuration_with_a_pbt_schedule_has_no_path_and_says_why(tmp_path, monkeypatch,
                                                                                     capsys):
    settings, folder, _ = _search(tmp_path, monkeypatch, FakeTune())
    run_plans, seen = _final_kernels(tmp_path)
    final = final_phase.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans)
    # as population-based training leaves them: hyperparameters that change
    folder.write_final(dataclasses.replace(final, configs=[
        dataclasses.replace(c, schedule=[{"chunk": 1, "hparams": [c.hparams]}]) for c in final.configs]))
    before = len(seen)
    assert ablation.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans) is None
    assert len(seen) == before and "population-based training" in folder.ablation().skipped
    assert "no ablation path: the best configuration changed its hyperparameters during training" in (
        capsys.readouterr().out)
    assert "ablation" not in report.build(folder)  # no path, no ablation.csv


# -- the path's steps as batches of one Tune run (harness.cluster.tuning.PlanFeed) --------------------------

def _drive(feed, complete, deadline_s=20.0):
    """What Tune does with a searcher: ask for a trial, run it, tell how it ended; until FINISHED.
    Returns the plans in the order they were asked for."""
    import time

    from ray.tune.search import Searcher

    seen, n, deadline = [], 0, time.monotonic() + deadline_s
    while (config := feed.suggest(f"t{n}")) != Searcher.FINISHED:
        assert time.monotonic() < deadline, "the feed neither handed a plan nor finished"
        if config is None:  # the work is deciding its next batch: Tune asks again later
            time.sleep(0.001)
            continue
        seen.append(config["plan"])
        result = complete(config["plan"])
        feed.on_trial_complete(f"t{n}", result, error=result is None)
        n += 1
    return seen


def test_plan_feed__batches_decided_from_the_last_results_run_as_trials_of_one_run():
    import threading

    from harness.cluster.tuning import PlanFeed

    feed, got = PlanFeed(lambda plan: {"plan": plan}), []

    def work():  # as the ablation path: the second batch depends on the first's results
        first = feed.run(["a", "b"])
        got.append(first)
        got.append(feed.run([f"after-{first[0]['score']}"]))
        feed.close()

    thread = threading.Thread(target=work)
    thread.start()
    seen = _drive(feed, lambda plan: None if plan == "b" else {"final": {"return": 1.0}, "score": plan})
    thread.join(timeout=20)
    assert seen == ["a", "b", "after-a"]
    assert got == [[{"final": {"return": 1.0}, "score": "a", "checkpoint": ""}, None],  # b failed
                   [{"final": {"return": 1.0}, "score": "after-a", "checkpoint": ""}]]


def test_plan_feed__a_run_that_ends_first_fails_the_batch_still_waiting():
    import threading
    import time

    from harness.cluster.tuning import FeedStopped, PlanFeed

    feed, errors = PlanFeed(lambda plan: {"plan": plan}), []

    def work():
        try:
            feed.run(["x"])
        except FeedStopped as err:
            errors.append(err)

    thread = threading.Thread(target=work)
    thread.start()
    deadline = time.monotonic() + 20
    while feed.suggest("t0") is None:  # x is handed out, then Tune stops (Ctrl-C) before it ends
        assert time.monotonic() < deadline
        time.sleep(0.001)
    feed.close()
    thread.join(timeout=20)
    assert not thread.is_alive() and len(errors) == 1
