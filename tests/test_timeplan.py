"""A wall-clock budget (``--time``): its parsing, its plan's arithmetic, the open-ended search it
closes, and where the summary says the time went."""

from __future__ import annotations

import pytest

import studies
from harness.driver import summary, timeplan
from harness.driver.guard import DiskGuard
from harness.driver.progress import Progress
from harness.phases import search_phase
from harness.space import StudyError
from harness.store.records import TrialRecord
from harness.study import main
from tests.driver import CPU, FakeTune, settings_for, small


def test_parse_duration__units_and_mistakes():
    assert [timeplan.parse_duration(t) for t in ("90s", "5m", "1h30m", "2", "1.5m")] == [90, 300, 5400, 120, 90]
    for bad, why in (("soon", "expected a duration"), ("0s", "more than zero"), ("5x", "expected a duration")):
        with pytest.raises(StudyError, match=why):
            timeplan.parse_duration(bad)
    assert timeplan.fmt_duration(59.2) == "1m00s" and timeplan.fmt_duration(42) == "42s"


def _plan(**kw):
    base = dict(total_s=300.0, started=1000.0, kernel_s=10.0, compile_s=20.0, slots=2, final_kernels=4,
                ablation_kernels=5)
    return timeplan.TimePlan(**{**base, **kw})


def test_time_plan__keeps_the_reserve_and_closes_the_search_when_a_trial_would_run_into_it():
    p = _plan()
    # waves: 4 final kernels on 2 slots (2), 5 ablation kernels (3) and its second batch (1); 3 batches
    assert p.reserve_s() == 6 * 10 + 3 * timeplan.PHASE_OVERHEAD_S + timeplan.REPORTS_S
    # the ablation path's second batch waits for its first, however many slots
    assert _plan(slots=8).reserve_s() == 3 * 10 + 3 * timeplan.PHASE_OVERHEAD_S + timeplan.REPORTS_S
    last_start = p.deadline - p.reserve_s() - p.trial_s()
    assert p.search_open(now=last_start) and not p.search_open(now=last_start + 0.1)
    assert p.minimum_s() == timeplan.RAY_START_S + 20 + p.trial_s() + p.reserve_s() < p.total_s
    assert p.planned_trials() == 2 * int((p.search_s() - 20) // p.trial_s())
    assert _plan(total_s=p.minimum_s() - 1).planned_trials() <= 2
    # the search's own trials replace the measurement taken alone (a lane trial's kernel is not one budget)
    p.learn([TrialRecord(0, "complete", 1, [], env_steps=100, kernel_seconds=30.0),
             TrialRecord(1, "complete", 1, [], env_steps=50, kernel_seconds=20.0),
             TrialRecord(2, "pruned", 1, [], env_steps=50, kernel_seconds=1.0),
             TrialRecord(3, "complete", 1, [], env_steps=100, kernel_seconds=1.0, lanes={"eta": 3})], 100)
    assert p.kernel_s == 35.0


def test_kernels_after_search__the_re_training_and_the_two_batches_of_the_ablation_path():
    # cartpole_ppo: top 3 and the default on 2 rounds, 7 searched names (one static) in kernels of 4
    assert timeplan.kernels_after_search(3, 2, 4, 7, True, True) == (4, 5)
    assert timeplan.kernels_after_search(3, 2, 4, 7, True, False) == (4, 0)
    assert timeplan.kernels_after_search(0, 2, 4, 7, True, True) == (0, 0)


class _Trials(timeplan.TimePlan):
    """A plan open for ``n`` trials (a clock would make the test wait)."""

    def __init__(self, n: int) -> None:
        super().__init__(total_s=60, started=0, kernel_s=1, compile_s=1, slots=1, final_kernels=0,
                         ablation_kernels=0)
        self.left = n

    def search_open(self, now=None) -> bool:
        self.left -= 1
        return self.left >= 0


def test_search_phase__with_a_time_plan_proposes_trials_until_it_closes_and_is_not_interrupted(
        tmp_path, monkeypatch, capsys):
    study = small(studies.get("cartpole_ppo"), trials=2, timesteps=20480)
    settings = settings_for(study, tmp_path, time="5m")
    settings, _ = settings.with_open_trials("cpu")
    from harness.cluster import tuning
    from harness.store.folder import ResultsFolder

    fake = FakeTune(chunks=2)
    monkeypatch.setattr(tuning, "run", fake)
    folder = ResultsFolder(tmp_path / study.name)
    folder.write_meta(settings.meta(settings.budget("cpu"), None, "now"))
    outcome = search_phase.run(settings, folder, CPU, DiskGuard(folder, ""), timeplan=_Trials(5))
    assert fake.calls[0]["num_samples"] == -1
    # a study's first trial always starts, then 5 more while the plan is open; not the study's 2
    assert (outcome.done, outcome.interrupted) == (6, False) and len(folder.trials()) == 6
    out = capsys.readouterr().out
    assert "[6] trial 5: " in out and "[6/" not in out


def test_study_cli__time_mistakes_are_one_line_before_ray(tmp_path, capsys):
    for args, why in ((["--time", "soon"], "--time 'soon': expected a duration"),
                      (["--time", "5m", "--trials", "3"], "--time and --trials cannot go together"),
                      (["--time", "5m", "--scheduler", "lanes"], "use --scheduler asha, none or pbt with --time")):
        assert main(["cartpole_ppo", "--out", str(tmp_path), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err


def test_summary__says_where_the_time_went():
    records = [TrialRecord(0, "complete", 1, [], compile_seconds=20.0, kernel_seconds=40.0),
               TrialRecord(1, "complete", 1, [], compile_seconds=0.5, kernel_seconds=39.5)]
    line = summary.time_line(150.0, {"search": 70.0, "final": 20.0, "ablation": 30.0}, records, slots=2)
    # compile 20.5 / 2 slots, training 79.5 / 2, evaluating 50, waiting the rest (150 - 10.25 - 39.75 - 50)
    assert line == ("time: compiling 0.2 min (7%), training 0.7 min (26%), evaluating 0.8 min (33%), waiting "
                    "0.8 min (33%) (evaluating: re-training 0.3 min, ablation path 0.5 min)")


def test_progress__a_running_trials_score_shows_before_any_trial_ends(monkeypatch):
    lines = []
    p = Progress(None, metric="mean", maximize=True, say=lines.append)
    monkeypatch.setattr(p, "last_print", -1e9)
    p.result("a", 1000, running=2, score=float("nan"))
    assert "leading" not in lines[-1] and lines[-1].startswith("  0 trials done, 2 running; 1,000 env steps")
    p.result("a", 2000, running=2, score=412.5)  # the first score: said at once, not 15 s later
    assert lines[-1] == "  0 trials done, 2 running, leading running trial 412.5 so far; 2,000 env steps"
    p.result("b", 3000, running=2, score=300.0)
    assert len(lines) == 2  # then every 15 s again
    p.last_print = -1e9
    p.result("b", 4000, running=2, score=450.0)
    assert lines[-1].startswith("  0 trials done, 2 running, leading running trial 450.0 so far; ")
