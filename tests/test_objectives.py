"""Objectives that separate configurations, the evaluation after every chunk inside the kernel,
Optuna's intermediate values, and the default-configuration control with paired statistics."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest

from harness import report
from harness.kernel import plan as kernel
from harness.kernel.plan import TrialPlan
from harness.kernel.runners import TrialRunner, run_trial
from harness.kernel.stats import objective_values, paired_difference
from harness.space import Budget, LogUniform, Study, StudyError, validate
from harness.store.records import write_json

PLAN = TrialPlan(
    env="CartPole-v1", algo="ppo",
    config=dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1, updates_per_chunk=2,
                hidden=[16, 16], eval_episodes=4, total_timesteps=4 * 32 * 2 * 3),
    hparams=[{"lr": 3e-4}, {"lr": 3e-3}, {"lr": 1e-2}], seeds=2, trial=4, study_seed=1, objective="auc",
    curve_episodes=3)


# -- the arithmetic ----------------------------------------------------------------------------

EVALS = np.array([[10.0, 50.0, np.nan], [60.0, 50.0, 20.0], [100.0, 50.0, 30.0]])  # [K=3, runs=3]


def test_objective__auc_is_the_mean_evaluation_over_chunks():
    np.testing.assert_allclose(objective_values(EVALS, [100, 200, 300], "auc"), [170 / 3, 50.0, np.nan])


def test_objective__final_is_the_fuller_last_evaluation_when_given():
    np.testing.assert_allclose(objective_values(EVALS, [100, 200, 300], "final"), [100.0, 50.0, 30.0])
    final = np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(objective_values(EVALS, [100, 200, 300], "final", final=final), final)


def test_objective__steps_to_threshold_is_censored_at_the_budget():
    got = objective_values(EVALS, [100, 200, 300], "steps", threshold=50.0, budget=300)
    # first run reaches 50 at chunk 2 (200 steps); second at chunk 1; third has a NaN evaluation
    np.testing.assert_allclose(got, [200.0, 100.0, np.nan])
    never = objective_values(EVALS[:, :2], [100, 200, 300], "steps", threshold=1e9, budget=320)
    np.testing.assert_array_equal(never, [320.0, 320.0])
    with pytest.raises(ValueError, match="needs a threshold"):
        objective_values(EVALS, [1, 2, 3], "steps")
    with pytest.raises(ValueError, match="unknown objective 'best'; choose from final, auc, steps"):
        objective_values(EVALS, [1, 2, 3], "best")


def test_paired_difference__resamples_pairs_so_a_constant_gain_has_no_spread():
    rng = np.random.default_rng(0)
    b = rng.normal(100, 50, size=8)  # seeds differ a lot ...
    mean, lo, hi = paired_difference(b + 10.0, b)  # ... but the gain on each seed is exactly 10
    assert mean == pytest.approx(10.0) and lo == pytest.approx(10.0) and hi == pytest.approx(10.0)
    mean, lo, hi = paired_difference([1.0, np.nan, 3.0], [0.0, 5.0, 1.0])  # the NaN pair is left out
    assert mean == pytest.approx(1.5) and lo <= mean <= hi


# -- the kernel: an evaluation after every chunk, in the same compiled call ------------------------

def test_kernel__evaluating_every_chunk_does_not_change_training():
    plain = run_trial(dataclasses.replace(PLAN, objective="final", curve_episodes=0))
    evaluated = run_trial(PLAN)
    for a, b in zip(plain.curves, evaluated.curves, strict=True):
        np.testing.assert_array_equal(a.returns, b.returns)
        assert np.isnan(a.evals).all() and np.isfinite(b.evals).all()
    np.testing.assert_array_equal(plain.final_returns, evaluated.final_returns)


@pytest.mark.xla_emitters  # two programs compared: the chunk's evaluation and a separate one
def test_kernel__chunk_evaluation_equals_evaluating_the_state_after_that_chunk():
    runner = TrialRunner(PLAN)
    algo = runner.algo
    import algos

    evaluate = jax.jit(algos.batched(functools.partial(algo.evaluate, num_episodes=PLAN.curve_episodes),
                                     hparams_argnum=None))
    for k in range(runner.config.num_chunks):
        report_k = runner.chunk()
        keys = jax.vmap(jax.vmap(lambda key, k=k: jax.random.fold_in(
            jax.random.fold_in(key, kernel.CURVE_TAG), k)))(runner.eval_keys)
        np.testing.assert_allclose(report_k.evals, np.asarray(evaluate(runner.states[0], keys).return_mean),
                                   rtol=1e-6)
    result = runner.finish()
    evals = np.stack([c.evals for c in result.curves])
    np.testing.assert_allclose(result.scores, evals.mean(axis=0))  # objective auc
    assert result.final_returns.shape == (3, 2)


def test_kernel__steps_objective_counts_env_steps_and_censors_at_the_budget():
    plan = dataclasses.replace(PLAN, objective="steps", threshold=25.0)
    result = run_trial(plan)
    steps = [c.env_steps for c in result.curves]
    budget = TrialRunner(plan).budget_steps
    assert budget == steps[-1] == 4 * 32 * 2 * 3
    evals = np.stack([c.evals for c in result.curves])
    for c in range(3):
        for s in range(2):
            hit = np.flatnonzero(evals[:, c, s] >= 25.0)
            assert result.scores[c, s] == (steps[hit[0]] if len(hit) else budget)


def test_kernel__an_objective_needing_curves_without_them_is_refused():
    with pytest.raises(ValueError, match="needs an evaluation after every chunk"):
        TrialRunner(dataclasses.replace(PLAN, curve_episodes=0))
    with pytest.raises(ValueError, match="needs a threshold"):
        TrialRunner(dataclasses.replace(PLAN, objective="steps"))


def test_trainable__a_minimized_objective_reports_the_smallest_score():
    from harness.cluster.trainable import _best

    rows, div = [[3.0, 5.0], [1.0, 1.0], [None, None]], [[False] * 2, [False] * 2, [True] * 2]
    assert _best(rows, div) == 4.0 and _best(rows, div, maximize=False) == 1.0


# -- the study's declaration ---------------------------------------------------------------------

def _study(**kw):
    base = dict(name="s", description="d", env="CartPole-v1", algo="ppo", space=dict(lr=LogUniform(1e-4, 1e-3)),
                cpu=Budget(1, 1, 1, 2048), gpu=Budget(1, 1, 1, 2048), smoke=Budget(1, 1, 1, 2048))
    return Study(**{**base, **kw})


def _validate(study):
    from algos.ppo import PPOConfig, PPOHParams

    validate(study, PPOConfig, PPOHParams, timesteps=2048)


def test_study__steps_objective_is_minimized_and_needs_a_threshold():
    assert _study(objective="steps", threshold=400).direction == "minimize"
    assert _study(objective="auc").direction == "maximize"
    with pytest.raises(StudyError, match="objective 'steps' needs a threshold"):
        _validate(_study(objective="steps"))
    with pytest.raises(StudyError, match="objective 'steps' is minimized; direction='maximize' contradicts it"):
        _validate(_study(objective="steps", threshold=1, direction="maximize"))
    with pytest.raises(StudyError, match="objective must be one of final, auc, steps, got 'best'"):
        _validate(_study(objective="best"))
    with pytest.raises(StudyError, match="curve_episodes must be >= 1 for objective 'auc'"):
        _validate(_study(objective="auc", curve_episodes=0))
    with pytest.raises(StudyError, match="reference must be a finite return, got 'random'"):
        _validate(_study(reference="random"))
    _validate(_study(reference=-0.86))


def test_study__baseline_names_searched_settings_and_must_build():
    from harness.space import Categorical

    with pytest.raises(StudyError, match="baseline sets 'gamma', which is not searched; searched: lr"):
        _validate(_study(baseline={"gamma": 0.9}))
    bad = _study(space=dict(lr=LogUniform(1e-4, 1e-3), num_minibatches=Categorical((4, 8))),
                 config=dict(num_envs=4, num_steps=128), baseline={"num_minibatches": 3})
    with pytest.raises(StudyError, match="cannot work at num_minibatches=3"):
        _validate(bad)


def test_control__algorithm_defaults_unless_the_study_states_a_baseline(tmp_path):
    import studies
    from tests.driver import settings_for

    settings = settings_for(studies.get("cartpole_ppo"), tmp_path)
    params, static, hparams = settings.control(20480)
    assert params == {"lr": 2.5e-4, "gamma": 0.99, "gae_lambda": 0.95, "clip_eps": 0.2, "ent_coef": 0.01,
                      "vf_coef": 0.5, "num_minibatches": 4}
    assert static["num_minibatches"] == 4 and static["total_timesteps"] == 20480 and "lr" not in static
    assert hparams["lr"] == 2.5e-4 and "num_minibatches" not in hparams
    settings = dataclasses.replace(settings, study=dataclasses.replace(
        studies.get("cartpole_ppo"), baseline={"lr": 1e-3, "num_minibatches": 8}))
    params, static, hparams = settings.control(20480)
    assert params["lr"] == 1e-3 and static["num_minibatches"] == 8 and hparams["gamma"] == 0.99


# -- Optuna sees the curves ------------------------------------------------------------------------

def test_searcher__every_configuration_reports_its_objective_curve_to_optuna(tmp_path):
    import studies
    from harness.search.searcher import BatchedOptunaSearcher, open_study
    from tests.driver import plan_maker

    study = studies.get("cartpole_ppo")
    ostudy = open_study(study, f"sqlite:///{tmp_path / 'o.db'}", seed=0)
    s = BatchedOptunaSearcher(study, ostudy, static_names=["num_minibatches"], configs_per_trial=2,
                              make_plan=plan_maker(study, tmp_path, seeds=2, timesteps=2048),
                              extra={}, on_complete=lambda r: None, is_pruned=lambda t: t == "b")
    cfg = s.suggest("a")
    assert cfg["plan"]["objective"] == "auc" and cfg["plan"]["curve_episodes"] == study.curve_episodes
    for k, steps in ((1, 1024), (2, 2048)):
        s.on_trial_result("a", {"chunk": k, "num_chunks": 2, "env_steps": steps, "returns": [[1, 1], [2, 2]],
                                "evals": [[k, k], [3 * k, 3 * k]], "objective": [[k, k], [2 * k, 4 * k]]})
        live = ostudy.trials  # told as each chunk arrives: optuna-dashboard shows running trials' curves
        assert [t.state.name for t in live] == ["RUNNING"] * 2
        assert live[1].intermediate_values == ({1024: 3.0, 2048: 6.0} if k == 2 else {1024: 3.0})
    s.on_trial_complete("a", {"final": True, "scores": [[2.0, 2.0], [4.0, 8.0]], "final_returns": [[1, 1], [2, 2]],
                              "diverged": [[False, False], [False, False]], "env_steps": 2048})
    a0, a1 = ostudy.trials
    assert a0.intermediate_values == {1024: 1.0, 2048: 2.0} and a1.intermediate_values == {1024: 3.0, 2048: 6.0}
    assert a1.value == 6.0
    s.suggest("b")  # stopped by the scheduler after one chunk: PRUNED, with the curve it had
    last = {"chunk": 1, "env_steps": 1024, "returns": [[1, 1], [2, 2]], "evals": [[5, 5], [7, 7]],
            "objective": [[5, 5], [7, 7]]}
    s.on_trial_result("b", last)
    s.on_trial_complete("b", last)
    b0, b1 = ostudy.trials[2:]
    assert b0.state.name == "PRUNED" and b0.intermediate_values == {1024: 5.0} and b1.intermediate_values == {
        1024: 7.0}


def test_searcher__a_long_trial_reports_50_evenly_spaced_chunks_the_last_included_and_each_step_once(tmp_path):
    import warnings

    import studies
    from harness.kernel.stats import MAX_REPORTS, reported_chunks
    from harness.search.searcher import BatchedOptunaSearcher, open_study
    from tests.driver import plan_maker

    assert reported_chunks(7) == set(range(1, 8)) and reported_chunks(1) == {1}
    assert len(reported_chunks(200)) == MAX_REPORTS and {1, 200} <= reported_chunks(200)
    study = studies.get("cartpole_ppo")
    ostudy = open_study(study, f"sqlite:///{tmp_path / 'o.db'}", seed=0)
    s = BatchedOptunaSearcher(study, ostudy, static_names=["num_minibatches"], configs_per_trial=1,
                              make_plan=plan_maker(study, tmp_path, seeds=1, timesteps=200 * 64),
                              extra={}, on_complete=lambda r: None, is_pruned=lambda t: True)
    s.suggest("a")

    def row(k):
        return {"chunk": k, "num_chunks": 200, "env_steps": 64 * k, "returns": [[k]], "evals": [[k]],
                "objective": [[float(k)]]}

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna warns when a step is reported twice
        for k in range(1, 120):
            s.on_trial_result("a", row(k))
        s.on_trial_result("a", row(119))  # a result sent again (as after a restore)
        s.on_trial_complete("a", row(119))  # stopped at chunk 119 by the scheduler
    (t,) = ostudy.trials
    told = sorted(t.intermediate_values)
    assert told == sorted({64 * k for k in reported_chunks(200) if k < 119} | {64 * 119})
    assert all(t.intermediate_values[step] == step / 64 for step in told)


# -- the reports -------------------------------------------------------------------------------------

def _final_config(cid, scores, diverged=None):
    return {"config_id": cid, "params": {"lr": 1e-3}, "hparams": {"lr": 1e-3}, "static": {}, "failed": False,
            "scores": scores, "final_returns": scores, "diverged": diverged or [False] * len(scores),
            "plans": [], "command": "python -m harness.train"}


def test_report__tuned_vs_default_pairs_the_seeds(tmp_path):
    write_json(tmp_path / "study.json", {"study": "s", "direction": "maximize", "objective": "auc", "space": {}})
    rec = {"trial": 0, "tune_trial_id": "a", "status": "complete", "static": {}, "seeds": 2, "env_steps": 100,
           "objective": "auc",
           "configs": [{"index": 0, "optuna_number": 0, "params": {"lr": 1e-3}, "hparams": {}, "scores": [9, 9],
                        "final_returns": [10, 12], "diverged": [False, False]}],
           "curves": [{"chunk": 1, "env_steps": 100, "returns": [[1.0, 2.0]], "evals": [[3.0, 4.0]]}]}
    write_json(tmp_path / "trials" / "0000.json", rec)
    default = [100.0, 300.0, 50.0, 400.0]
    tuned = _final_config("t0000c0", [v + 20 for v in default])
    write_json(tmp_path / "final.json",
               {"trials": [0], "configs": [tuned], "control": _final_config("default", default)})
    paths = report.build(tmp_path)
    import json

    import pandas as pd

    best = json.loads(paths["best"].read_text())
    t = best["tuned_vs_default"]
    assert t["difference"]["mean"] == pytest.approx(20.0) and t["difference"]["ci95"] == pytest.approx([20, 20])
    assert t["better"] and t["difference"]["paired_seeds"] == 4
    assert t["tuned"]["ci95"][0] < 100 < t["tuned"]["ci95"][1]  # unpaired, the seeds' spread swamps the gain
    assert "area under the evaluation curve" in best["ranked_by"] and best["objective"] == "auc"
    final = pd.read_csv(paths["final"])
    assert final.role.tolist() == ["tuned", "default"] and final["mean"].tolist() == [232.5, 212.5]
    curves = pd.read_csv(paths["curves"])
    assert curves.eval_return.tolist() == [3.0, 4.0]
    configs = pd.read_csv(paths["configs"])
    assert configs.final_return.tolist() == [11.0]
    page = (tmp_path / "reports" / "index.html").read_text()
    assert "Tuned vs default" in page and "Tuning helps" in page

    control = _final_config("default", [v + 20 for v in default])  # the same as tuned: no gain
    write_json(tmp_path / "final.json", {"trials": [0], "configs": [_final_config("t0000c0", control["scores"])],
                                         "control": control})
    t = json.loads(report.build(tmp_path)["best"].read_text())["tuned_vs_default"]
    assert t["difference"]["mean"] == 0.0 and not t["better"] and not t["worse"]
    write_json(tmp_path / "final.json", {"trials": [0], "configs": [_final_config("t0000c0", default)],
                                         "control": _final_config("default", [v + 5 for v in default])})
    t = json.loads(report.build(tmp_path)["best"].read_text())["tuned_vs_default"]
    assert t["worse"] and not t["better"]
    assert "The default is better" in (tmp_path / "reports" / "index.html").read_text()
    assert "above_reference" not in t
    # with a reference return (random play's), each mean's margin over it and their ratio
    write_json(tmp_path / "study.json", {"study": "s", "direction": "maximize", "objective": "auc", "space": {},
                                         "reference": {"label": "random play", "return": -50.0}})
    write_json(tmp_path / "final.json", {"trials": [0], "configs": [_final_config("t0000c0", default)],
                                         "control": _final_config("default", [v - 200 for v in default])})
    r = json.loads(report.build(tmp_path)["best"].read_text())["tuned_vs_default"]["above_reference"]
    assert r == {"label": "random play", "return": -50.0, "tuned": 262.5, "default": 62.5, "ratio": 4.2}
    page = (tmp_path / "reports" / "index.html").read_text()
    assert "Above random play (-50): tuned 262.5, default 62.5: 4.2x." in page


def test_summary__tuned_vs_default_line_says_whether_tuning_helped():
    from harness.driver.summary import tuned_vs_default_line

    t = {"tuned": {"mean": 480.0, "ci95": [470.0, 490.0]}, "default": {"mean": 300.0, "ci95": [250.0, 350.0]},
         "difference": {"mean": 180.0, "ci95": [120.0, 230.0], "paired_seeds": 6}, "better": True}
    line = tuned_vs_default_line(t, "auc")
    assert line == ("tuned vs default (auc): 480.0 (95% CI 470.0..490.0) vs 300.0 (95% CI 250.0..350.0); "
                    "paired difference +180.0 (95% CI +120.0..+230.0) over 6 seeds: tuning helps")
    t["above_reference"] = {"label": "random play", "return": -1.0, "tuned": 481.0, "default": 301.0, "ratio": 1.6}
    assert tuned_vs_default_line(t, "auc").endswith("tuning helps; above random play (-1): 481.00 vs 301.00, 1.6x")


def test_docs__study_file_example_loads_and_validates(tmp_path):
    import re
    from pathlib import Path

    import studies
    from algos.ppo import PPOConfig, PPOHParams

    page = (Path(__file__).resolve().parent.parent / "docs" / "own-env.md").read_text()
    code = re.search(r"```python\n(from harness import .*?STUDY = Study\(.*?)```", page, re.S)[1]
    (tmp_path / "my_study.py").write_text(code)
    study = studies.get(str(tmp_path / "my_study.py"))
    assert study.objective == "steps" and study.direction == "minimize" and study.baseline == {"lr": 1e-3}
    for budget in (study.cpu, study.gpu, study.smoke):
        validate(study, PPOConfig, PPOHParams, timesteps=budget.timesteps)


def test_readme__study_example_loads_and_validates_at_every_budget(tmp_path):
    import re
    from pathlib import Path

    import studies
    from algos.ppo import PPOConfig, PPOHParams

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    code = re.search(r"<!-- example: README -->\n```python\n(.*?)```", readme, re.S)[1]
    (tmp_path / "my_study.py").write_text(code)
    study = studies.get(str(tmp_path / "my_study.py"))
    assert study.name == "my_study" and sorted(study.space) == ["ent_coef", "lr"]
    for budget in (study.cpu, study.gpu, study.smoke):
        validate(study, PPOConfig, PPOHParams, timesteps=budget.timesteps)
