"""Lanes refilled inside a trial's kernel (harness.kernel.runners.LaneRunner.refill): a configuration
started in a lane mid-trial trains exactly as it would have from the trial's start, its
neighbours are untouched, and a snapshot taken with lanes at different progress resumes bit for bit."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import optuna
import pytest

from harness.kernel.plan import TrialPlan
from harness.kernel.runners import LaneRunner, run_trial

HP = [{"lr": 3e-4, "ent_coef": 0.0}, {"lr": 1e-3, "ent_coef": 0.01}, {"lr": 3e-3, "ent_coef": 0.02},
      {"lr": 2e-4, "ent_coef": 0.05}]
BASE = TrialPlan(
    env="CartPole-v1", algo="ppo",
    config=dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1, updates_per_chunk=2,
                hidden=[16, 16], eval_episodes=4, total_timesteps=4 * 32 * 2 * 3),
    hparams=HP[:3], seeds=2, trial=5, study_seed=3, config_keys=[10, 11, 12], chunks=6)


def _lane_curve(runner, lane, start, chunks):
    return np.stack([runner.curves[k].evals[lane] for k in range(start, start + chunks)])


def test_refill__a_lane_started_mid_trial_trains_as_it_would_from_the_start():
    late = LaneRunner(BASE)  # lane 0 runs config 10 for 2 chunks, then config 13 for 3 (its whole budget)
    for _ in range(2):
        late.chunk()
    late.refill([0], [HP[3]], [13])
    assert late.lane_chunks(0) == 0 and late.lane_chunks(1) == 2
    for _ in range(3):
        late.chunk()
    early = LaneRunner(dataclasses.replace(BASE, hparams=[HP[3], *HP[1:3]], config_keys=[13, 11, 12]))
    for _ in range(5):
        early.chunk()
    # the new configuration: the same curve and env steps as from chunk 0, and the same final score
    np.testing.assert_array_equal(_lane_curve(late, 0, 2, 3), _lane_curve(early, 0, 0, 3))
    assert [int(r.lane_steps[0]) for r in late.curves[2:]] == [int(r.lane_steps[0]) for r in early.curves[:3]]
    assert late.lane_chunks(0) == 3 and int(late.curves[-1].lane_steps[0]) == late.budget_steps
    scores_late, final_late, _ = late.lane_results([0])
    early3 = LaneRunner(dataclasses.replace(BASE, hparams=[HP[3], *HP[1:3]], config_keys=[13, 11, 12]))
    for _ in range(3):
        early3.chunk()
    scores_early, final_early, _ = early3.lane_results([0])
    np.testing.assert_array_equal(final_late, final_early)
    np.testing.assert_array_equal(scores_late, scores_early)
    # its neighbours never noticed
    np.testing.assert_array_equal(np.stack([r.evals[1:] for r in late.curves]),
                                  np.stack([r.evals[1:] for r in early.curves]))


@pytest.mark.xla_emitters  # two programs compared: a lane of a 3-wide kernel and the configuration alone
def test_refill__keys_are_the_configurations_not_the_trials_or_lanes():
    """Configuration 11 in lane 1 of trial 5 trains as in lane 0 of trial 9, and (within float
    tolerance: another kernel width) as one configuration alone in plain run_trial."""
    a = run_trial(dataclasses.replace(BASE, chunks=None))
    b = run_trial(dataclasses.replace(BASE, trial=9, hparams=[HP[1], HP[0], HP[2]], config_keys=[11, 10, 12],
                                      chunks=None))
    np.testing.assert_array_equal(a.final_returns[1], b.final_returns[0])
    alone = run_trial(dataclasses.replace(BASE, hparams=[HP[1]], config_keys=[11], chunks=None))
    np.testing.assert_allclose(alone.final_returns[0], a.final_returns[1], rtol=1e-4)
    np.testing.assert_allclose(np.stack([r.evals[0] for r in alone.curves]),
                               np.stack([r.evals[1] for r in a.curves]), rtol=1e-4)


def test_refill__snapshot_with_lanes_at_different_progress_resumes_bit_for_bit():
    def run(stop_after=None):
        r = LaneRunner(BASE)
        blob = None
        for k in range(6):
            if k == 1:
                r.refill([2], [HP[3]], [13])
            if k == 3:
                r.refill([0, 2], [HP[0], HP[2]], [14, 15])
            r.chunk()
            if stop_after == k + 1:
                blob = r.snapshot()
                r = LaneRunner(BASE)
                r.restore(blob)
        return r

    whole, resumed = run(), run(stop_after=2)
    assert resumed.lane_start == whole.lane_start == [3, 0, 3] and resumed.lane_ids == [14, 11, 15]
    np.testing.assert_array_equal(np.stack([r.evals for r in whole.curves]),
                                  np.stack([r.evals for r in resumed.curves]))
    np.testing.assert_array_equal(whole.lane_results([0, 1, 2])[1], resumed.lane_results([0, 1, 2])[1])


def test_refill__is_refused_where_lanes_cannot_be_refilled():
    with pytest.raises(ValueError, match="config_keys"):
        LaneRunner(dataclasses.replace(BASE, config_keys=None))
    with pytest.raises(ValueError, match="needs chunks"):
        LaneRunner(dataclasses.replace(BASE, chunks=None))


# ---- the broker: Optuna's successive-halving pruner decides, stopped lanes get new proposals ----

def _broker(tmp_path, min_steps=100):
    import studies
    from harness.lanes.broker import LaneBroker
    from harness.search.searcher import open_study
    from tests.driver import settings_for

    settings = settings_for(studies.get("cartpole_ppo"), tmp_path, scheduler="lanes")
    driver_side = open_study(settings.study, settings.storage)
    broker = LaneBroker(settings.study, settings.storage, static_names=settings.static_names,
                        hparams=settings.hparams, min_steps=min_steps)
    return settings, driver_side, broker


def _at(lane, number, steps, value, **kw):
    return {"lane": lane, "number": number, "steps": steps, "rung": 0, "values": [value], "diverged": False,
            "finished": False, "last": False, "reach": True, "scores": None, **kw}


def test_broker__promotes_the_top_third_at_a_rung_and_refills_the_others_with_the_trials_static_values(tmp_path):
    import optuna

    settings, ostudy, broker = _broker(tmp_path)
    first = [ostudy.ask() for _ in range(6)]
    static = {"num_minibatches": "8"}  # as Optuna holds a categorical choice: its label
    # values reach rung 0 (100 steps) one after another: asynchronous successive halving keeps a
    # configuration while it is in the top 1/3 of those judged there so far (the best, for the first two)
    values = [10.0, 5.0, 20.0, 1.0, 30.0, 2.0]
    stopped, answers = [], []
    for i, (t, v) in enumerate(zip(first, values, strict=True)):
        answer = broker.step(0, i + 1, static, [_at(i % 2, t.number, 128, v)], True)
        answers.append(answer)
        if answer["ended"]:
            stopped.append(v)
            assert answer["ended"][i % 2]["why"] == "stopped at rung 1 (128 env steps)"
            new = answer["new"][i % 2]
            assert new["params"]["num_minibatches"] == 8 and new["number"] > first[-1].number
            assert new["hparams"] == settings.hparams(new["params"])
            assert set(new["params"]) == set(settings.study.space)
        else:
            assert answer["new"] == {}
    assert stopped == [5.0, 1.0, 2.0]
    states = {t.number: t.state for t in ostudy.get_trials()}
    assert [states[t.number] == optuna.trial.TrialState.PRUNED for t in first] == [False, True, False, True,
                                                                                    False, True]
    # the same (trial, chunk) again (a trial replaying chunks after a restart): the same answer, no new asks
    trials_before = len(ostudy.get_trials())
    again = broker.step(0, 2, static, [_at(1, first[1].number, 128, 5.0)], True)
    assert again == answers[1] and len(ostudy.get_trials()) == trials_before
    # ... also from a new broker (its driver was killed and the study resumed): it reads what was told
    # and asked from the study, and stops nothing early: a lane stopped at 128 steps still runs at 64
    _, _, fresh = _broker(tmp_path)
    assert fresh.step(0, 2, static, [_at(1, first[1].number, 128, 5.0)], True) == answers[1]
    early = fresh.step(0, 1, static, [_at(0, first[1].number, 64, None, rung=None)], True)
    assert early == {"ended": {}, "new": {}}
    assert len(ostudy.get_trials()) == trials_before


def test_broker__lanes_at_a_rung_in_one_chunk_are_judged_together_whatever_their_lane(tmp_path):
    """Four lanes reach rung 1 after the same chunk, the worst in lane 0: only the best goes on
    (top 1/3 of 4; judged in lane order, lane 0 went on for being first and lane 1 for beating it).
    On the trial's last chunk, a lane at a rung is still judged: stopped there, or cut short if
    promoted."""
    _, ostudy, broker = _broker(tmp_path)
    first = [ostudy.ask() for _ in range(6)]
    values = [1.0, 5.0, 3.0, 20.0]
    answer = broker.step(0, 1, {"num_minibatches": "4"},
                         [_at(lane, t.number, 128, v) for lane, (t, v) in enumerate(zip(first, values))], True)
    assert sorted(answer["ended"]) == [0, 1, 2] and sorted(answer["new"]) == [0, 1, 2]
    ending = [_at(0, first[4].number, 128, 0.5, last=True, reach=False),
              _at(1, first[5].number, 128, 50.0, last=True, reach=False)]
    last = broker.step(1, 9, {"num_minibatches": "4"}, ending, False)
    assert last == {"ended": {0: {"status": "pruned", "why": "stopped at rung 1 (128 env steps)"},
                              1: {"status": "pruned", "why": "cut short at rung 1: the trial ends before its "
                                                             "next judgement"}}, "new": {}}
    assert ostudy.get_trials()[first[5].number].intermediate_values == {128: 50.0}


@pytest.mark.parametrize("killed_at", ["the tell", "the rung values"])
def test_broker__a_broker_killed_between_its_verdict_and_the_tell_is_answered_as_it_judged(tmp_path, monkeypatch,
                                                                                           killed_at):
    """The broker dies (its driver killed) after the pruner judged a lane at a rung and before
    Optuna was told: the broker after it answers that chunk as the first one judged. (Judged again,
    the rung value the pruner had written made Optuna count the lane a rung further: promoted.)"""
    from harness.lanes.broker import LaneBroker

    _, ostudy, broker = _broker(tmp_path)
    first = [ostudy.ask() for _ in range(4)]
    static = {"num_minibatches": "4"}
    reports = [_at(lane, t.number, 128, v) for lane, (t, v) in enumerate(zip(first, [1.0, 5.0, 3.0, 20.0]))]

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the driver's process ends here

    if killed_at == "the tell":
        monkeypatch.setattr(LaneBroker, "_stop", killed)
    else:  # after the verdict, before the rung values the pruner decided on are written
        monkeypatch.setattr(broker.ostudy._storage, "set_trial_system_attr", killed)
    with pytest.raises(KeyboardInterrupt):
        broker.step(0, 1, static, reports, True)
    monkeypatch.undo()
    _, _, fresh = _broker(tmp_path)
    answer = fresh.step(0, 1, static, reports, True)
    assert sorted(answer["ended"]) == [0, 1, 2] and sorted(answer["new"]) == [0, 1, 2]
    assert {lane: e["why"] for lane, e in answer["ended"].items()} == {
        lane: "stopped at rung 1 (128 env steps)" for lane in (0, 1, 2)}
    # the rung values the first broker's verdicts held back are written: a later lane is judged against all four
    later = ostudy.ask()
    assert fresh.step(1, 1, static, [_at(0, later.number, 128, 4.0)], False)["ended"][0]["status"] == "pruned"


def test_broker__a_wide_batch_keeps_the_top_third_of_all_that_reached_the_rung(tmp_path):
    """64 lanes (a GPU's kernel) reach a study's first rung at once: the best 21 go on, as ASHA's
    "top 1/eta of those that reached the rung" reads (judged one after another, best first, only
    the best went on; in lane order, those in the top third of the lanes before them). A second
    batch is judged with the first counted."""
    import optuna

    _, ostudy, broker = _broker(tmp_path)
    rng = np.random.default_rng(0)
    first = [ostudy.ask() for _ in range(64)]
    values = rng.permutation(64).astype(float)
    answer = broker.step(0, 1, {"num_minibatches": "4"},
                         [_at(lane, t.number, 128, v) for lane, (t, v) in enumerate(zip(first, values))], False)
    kept = sorted(set(range(64)) - set(answer["ended"]))
    assert sorted(values[kept]) == list(range(43, 64))  # the top 21 of 64, wherever their lanes
    second = [ostudy.ask() for _ in range(8)]
    more = [10.5, 60.5, 42.5, 70.0, 0.5, 50.5, 44.5, 30.5]
    answer = broker.step(1, 1, {"num_minibatches": "4"},
                         [_at(lane, t.number, 128, v) for lane, (t, v) in enumerate(zip(second, more))], False)
    # 72 at the rung: the top 24 are values 70, 63..44, 60.5, 50.5, 44.5: of these 8, those four go on
    assert sorted(set(range(8)) - set(answer["ended"])) == [1, 3, 5, 6]
    pruned = {t.number for t in ostudy.get_trials() if t.state == optuna.trial.TrialState.PRUNED}
    assert len(pruned) == 43 + 4


def test_lane_trial__says_whether_a_configuration_promoted_now_reaches_its_next_judgement_in_time():
    """A trial of 27 chunks, configurations of 9 (rungs after 1 and 3): a lane at its second rung
    with 6 chunks left can train to its budget if promoted; with 5 left it cannot (the broker
    then stops it at the rung and refills its lane instead of training it until the trial ends)."""
    from types import SimpleNamespace

    from harness.lanes.trial import Lane, LaneTrial

    def runner(chunk: int) -> SimpleNamespace:
        row = SimpleNamespace(lane_steps=np.array([768, 256]), diverged=np.zeros((2, 2), bool))
        config = SimpleNamespace(num_chunks=9, env_steps_after=lambda n: 256 * n)
        return SimpleNamespace(curves=[row] * chunk, total_chunks=27, budget_steps=2304, config=config,
                               lane_chunks=lambda c: [3, 1][c], lane_objective=lambda lanes: np.ones((1, 2)))

    def reach(chunk: int) -> list:
        lanes = [Lane(0, {}, {}, chunk - 3, 0, judged=1), Lane(1, {}, {}, chunk - 1, 1)]
        trial = LaneTrial(0, {}, [256, 768], lanes)
        return [(r["rung"], r["reach"]) for r in trial.reports(runner(chunk), last=False)]

    assert reach(21) == [(1, True), (0, True)]
    assert reach(22) == [(1, False), (0, True)]  # 3 + 5 chunks: 2048 of 2304 steps
    assert reach(26) == [(1, False), (0, False)]  # 1 + 1 chunks: not at the next rung (768)


def test_broker__refills_numbered_0_mod_3_are_proposed_at_random_the_others_by_tpe(tmp_path):
    """TPE fitted on a study whose good configurations all have lr near 1e-4 proposes there;
    refills numbered 0 mod 3 come from Optuna's random sampler, over the whole space (BOHB's
    random fraction), with the trial's static values all the same."""
    import optuna

    from harness.lanes.broker import EXPLORE

    _, ostudy, broker = _broker(tmp_path)
    dists = {"lr": optuna.distributions.FloatDistribution(1e-4, 3e-3, log=True)}
    for k in range(40):  # the best near lr 1e-4, the worst near 3e-3
        lr = 1e-4 * 30 ** (k / 39)
        ostudy.add_trial(optuna.trial.create_trial(params={"lr": lr}, distributions=dists, value=-k))
    read, asked = ostudy.get_trials(deepcopy=False), []
    for _ in range(24):
        broker._ask({"num_minibatches": "4"}, read, asked)
    lrs = {t.number: t.suggest_float("lr", 1e-4, 3e-3, log=True) for t in asked}
    assert all(t.suggest_categorical("num_minibatches", ["4", "8"]) == "4" for t in asked)
    by_tpe = [lr for n, lr in lrs.items() if n % EXPLORE]
    at_random = [lr for n, lr in lrs.items() if n % EXPLORE == 0]
    assert len(at_random) == 8 and max(by_tpe) < 3e-4, lrs
    assert sum(lr > 3e-4 for lr in at_random) >= 2, lrs  # uniform in log space: 68% of draws land there


def test_broker__tpe_counts_running_lanes_promoted_at_a_rung_as_good_not_as_its_constant_liars_worst(tmp_path):
    """The study's best so far are running lanes promoted at rung 2 (lr near 1e-4); the lanes
    stopped at rung 1 all have lr near 3e-3. TPE's refills follow the running ones: seen as its
    constant liar sees running trials (the worst), they would be the bad group and TPE would
    propose near 3e-3. Running lanes not judged yet stay running, whatever curve they have; a
    judged one shows its curve up to its judgement."""
    import optuna

    from harness.lanes.broker import EXPLORE, VERDICT_ATTR, as_judged

    _, ostudy, broker = _broker(tmp_path)
    dists = {"lr": optuna.distributions.FloatDistribution(1e-4, 3e-3, log=True)}
    for k in range(30):  # stopped at rung 1 (100 env steps), lr 2e-3..3e-3
        ostudy.add_trial(optuna.trial.create_trial(params={"lr": 2e-3 + k * 3e-5}, distributions=dists,
                                                   state=optuna.trial.TrialState.PRUNED,
                                                   intermediate_values={100: float(k)}))
    for k in range(7):  # running: 6 promoted at rungs 1 and 2 (at 300 env steps now), lr 1e-4..1.5e-4; 1 new
        ostudy.enqueue_trial({"lr": 1e-4 + k * 1e-5})
        t = ostudy.ask()
        t.suggest_float("lr", 1e-4, 3e-3, log=True)
        t.report(40.0 + k, step=50)  # its curve: a chunk before the first rung
        if k < 6:
            t.report(50.0 + k, step=100)
            t.report(60.0 + k, step=300)
            t.set_user_attr(VERDICT_ATTR, {"at": 300, "prune": False, "attrs": {}})
            t.report(0.0, step=350)  # a chunk after its last judgement: not what the judgement saw
    read, asked = ostudy.get_trials(deepcopy=False), []
    S = optuna.trial.TrialState
    assert [t.state for t in as_judged(read)][-7:] == [S.PRUNED] * 6 + [S.RUNNING]
    assert [max(t.intermediate_values) for t in as_judged(read)[-7:-1]] == [300] * 6
    assert [t.state for t in read][-7:] == [S.RUNNING] * 7  # the study itself is untouched
    for _ in range(12):
        broker._ask({"num_minibatches": "4"}, read, asked)
    by_tpe = [t.suggest_float("lr", 1e-4, 3e-3, log=True) for t in asked if t.number % EXPLORE]
    # (counted as the worst, all 8 were above 7e-4: 7.5e-4..1.8e-3)
    assert len(by_tpe) == 8 and max(by_tpe) < 7e-4, by_tpe
    cut = ostudy.ask()  # promoted at rung 2, then cut short by its trial's end: shown up to its judgement
    cut.suggest_float("lr", 1e-4, 3e-3, log=True)
    for step, value in ((100, 55.0), (300, 65.0), (350, 0.0)):
        cut.report(value, step=step)
    cut.set_user_attr(VERDICT_ATTR, {"at": 300, "prune": False, "attrs": {}})
    cut.set_user_attr("stopped", {"status": "pruned", "why": "cut short: the trial's budget ended", "at": 350})
    ostudy.tell(cut, state=optuna.trial.TrialState.PRUNED)
    (shown,) = [t for t in as_judged(ostudy.get_trials(deepcopy=False)) if t.number == cut.number]
    assert shown.intermediate_values == {100: 55.0, 300: 65.0}
    assert ostudy.trials[cut.number].intermediate_values[350] == 0.0  # the study itself keeps its curve


def test_lane_trial__a_chunk_past_two_rungs_reports_the_last_and_its_next_judgement_is_the_budget():
    """Chunks of 384 steps, rungs at 100 and 300, a budget of 1152: after its first chunk a lane
    has passed both rungs (Optuna's pruner judges it at each in one call), so it reports rung 1
    (the second) and whether it reaches its whole budget, not the rung it already passed; the
    next chunk judges it nowhere (it was reported at rung 1 after chunk 1 and always promoted)."""
    from types import SimpleNamespace

    from harness.lanes.trial import Lane, LaneTrial

    def runner(chunk: int, steps: int) -> SimpleNamespace:
        row = SimpleNamespace(lane_steps=np.array([steps]), diverged=np.zeros((1, 1), bool))
        config = SimpleNamespace(num_chunks=3, env_steps_after=lambda n: 384 * n)
        return SimpleNamespace(curves=[row] * chunk, total_chunks=3, budget_steps=1152, config=config,
                               lane_chunks=lambda c: chunk, lane_objective=lambda lanes: np.ones((1, 1)))

    trial = LaneTrial(0, {}, [100, 300], [Lane(0, {}, {}, 0, 0)])
    assert [(r["rung"], r["reach"]) for r in trial.reports(runner(1, 384), last=False)] == [(1, True)]
    assert trial.lanes[0].judged == 2
    assert [r["rung"] for r in trial.reports(runner(2, 768), last=False)] == [None]


def test_lane_trial__rungs_are_the_studys_budgets_not_the_chunks_rounding_of_it():
    """ant_ppo's GPU budget: 10M steps, chunks of 81,920 ending at 9,994,240 (122 chunks). Its
    rungs are at 1/9 and 1/3 of the 10M (the pruner's min_resource and the study's first lines):
    the rounding down must not drop the rung at 1/3 (3,333,333 x 3 > 9,994,240)."""
    from types import SimpleNamespace

    from harness.lanes.trial import LaneTrial

    plan = SimpleNamespace(trial=0, config_keys=[0], hparams=[{}], lanes={
        "eta": 3, "min_steps": 10_000_000 // 9, "budget": 10_000_000, "static": {}, "params": [{}]})
    assert LaneTrial.start(plan, 9_994_240).rungs == [1_111_111, 3_333_333]


def test_broker__a_lane_past_two_rungs_and_stopped_at_the_first_is_recorded_as_stopped_there(tmp_path):
    """A lane that passed rungs 0 and 1 in one chunk (reported at rung 1) and is stopped at rung 0
    is "stopped at rung 1", and one promoted at rung 0 but stopped at rung 1 "stopped at rung 2":
    the rung where Optuna's pruner stopped it, not the last it passed."""
    settings, ostudy, broker = _broker(tmp_path)  # rungs at 100 and 300 env steps, top 1/3 go on
    static = {"num_minibatches": "8"}
    low = [ostudy.ask() for _ in range(9)]
    for i, t in enumerate(low):  # 9 configurations judged at rung 0 only, all behind the rest
        broker.step(0, i + 1, static, [_at(0, t.number, 128, float(i))], False)
    best, second, worst = ostudy.ask(), ostudy.ask(), ostudy.ask()
    assert broker.step(1, 1, static, [_at(0, best.number, 384, 100.0, rung=1)], False)["ended"] == {}
    # rung 0: 11 values, the top 3 go on (60 is second); rung 1: 100 and 60, only the best goes on
    assert broker.step(2, 1, static, [_at(0, second.number, 384, 60.0, rung=1)], False)["ended"] == {
        0: {"status": "pruned", "why": "stopped at rung 2 (384 env steps)"}}
    assert broker.step(3, 1, static, [_at(0, worst.number, 384, -1.0, rung=1)], False)["ended"] == {
        0: {"status": "pruned", "why": "stopped at rung 1 (384 env steps)"}}


def test_broker__a_lane_judged_at_two_rungs_in_a_chunk_counts_for_the_lanes_judged_after_it(tmp_path):
    """The study's trials are read once per batch: the rung values its verdicts write must still
    count for the lanes judged after them, as they would read from the storage."""
    settings, ostudy, broker = _broker(tmp_path)  # rungs at 100 and 300 env steps, top 1/3 go on
    a, b = ostudy.ask(), ostudy.ask()
    static = {"num_minibatches": "8"}
    assert broker.step(0, 1, static, [_at(1, b.number, 128, 10.0)], False)["ended"] == {}  # alone: goes on
    # a, new and at 384 steps, passes rungs 0 and 1 in one judgement (the best at both); b, judged
    # after it at rung 1, is behind a there and stops
    answer = broker.step(0, 2, static, [_at(0, a.number, 384, 50.0, rung=1), _at(1, b.number, 384, 10.0, rung=1)],
                         False)
    assert answer["ended"] == {1: {"status": "pruned", "why": "stopped at rung 2 (384 env steps)"}}


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_broker__lanes_past_two_rungs_in_a_chunk_are_judged_together_at_both_whatever_their_lane(tmp_path, order):
    """Two new lanes pass rungs 0 and 1 in one chunk: at rung 0 both are in the top third (behind
    them, 9 configurations judged there before); at rung 1, judged together, only the better goes
    on, whichever lane it is in. (Judged at the second rung one after another, the first judged
    went on alone: with the worse one first, both went on.)"""
    settings, ostudy, broker = _broker(tmp_path)  # rungs at 100 and 300 env steps, top 1/3 go on
    static = {"num_minibatches": "8"}
    for i, t in enumerate([ostudy.ask() for _ in range(9)]):
        broker.step(0, i + 1, static, [_at(0, t.number, 128, float(i))], False)
    good, bad = ostudy.ask(), ostudy.ask()
    reports = [_at(0, good.number, 384, 50.0, rung=1), _at(1, bad.number, 384, 10.0, rung=1)]
    answer = broker.step(1, 1, static, [reports[i] for i in order], False)
    assert answer["ended"] == {1: {"status": "pruned", "why": "stopped at rung 2 (384 env steps)"}}
    frozen = {t.number: t for t in ostudy.get_trials()}
    assert frozen[good.number].system_attrs.keys() >= {"completed_rung_0", "completed_rung_1"}
    assert frozen[bad.number].user_attrs["verdict"] == {
        "at": 384, "prune": True, "attrs": {"completed_rung_0": 10.0, "completed_rung_1": 10.0}}


def test_broker__answers_as_a_broker_reading_the_storage_for_every_judgement_and_proposal(tmp_path, monkeypatch):
    """The broker reads the study once per judged batch and once per refill step. With TPE past its
    random start-up (12 finished trials), refills from TPE and at random (numbers 0 mod 3), and
    lanes crossing two rungs in a chunk, it answers as a broker reading the storage each time."""
    import random
    import shutil

    import studies
    from harness.lanes import broker as lanes
    from harness.lanes.broker import LaneBroker
    from harness.search.searcher import suggest
    from tests.driver import settings_for

    study = studies.get("cartpole_ppo")
    settings, ostudy, _ = _broker(tmp_path / "a")
    for k in range(12):
        t = ostudy.ask()
        suggest(t, settings.study.space)
        ostudy.tell(t, float(k))
    first = [ostudy.ask().number for _ in range(9)]
    shutil.copytree(tmp_path / "a", tmp_path / "b")

    def stored(self, deepcopy=True, states=None):  # what the pruner read before: the storage, the batch laid over
        out = []
        for t in self._reference.get_trials(deepcopy=False, states=states):
            if t.number in self._batch and t.number != self._judged and self._key not in t.system_attrs:
                t = copy.copy(t)
                t.system_attrs = {**t.system_attrs, self._key: self._batch[t.number]}
            out.append(t)
        return out

    def answers(where, reading):
        s = settings_for(study, where, scheduler="lanes")
        broker = LaneBroker(s.study, s.storage, static_names=s.static_names, hparams=s.hparams, min_steps=100)
        numbers, rnd, out = list(first), random.Random(0), []
        with monkeypatch.context() as m:
            if reading:
                m.setattr(lanes._WithBatch, "_reference", broker.ostudy, raising=False)
                m.setattr(lanes._WithBatch, "get_trials", stored)
                m.setattr(lanes._StepView, "_get_trials", lambda self, deepcopy=True, states=None, use_cache=False:
                          [t for t in lanes.as_judged(self.inner._get_trials(deepcopy, use_cache=False))
                           if states is None or t.state in states])
            for chunk in range(1, 5):
                rows = [_at(i, n, 128 * chunk, rnd.random() * 100) for i, n in enumerate(numbers)]
                out.append(broker.step(0, chunk, {"num_minibatches": "8"}, rows, True))
                numbers = [out[-1]["new"].get(i, {"number": n})["number"] for i, n in enumerate(numbers)]
        return out

    ours, reference = answers(tmp_path / "a", False), answers(tmp_path / "b", True)
    assert sum(len(a["new"]) for a in ours) >= 12 and ours == reference


def test_broker__a_steps_samplers_see_the_study_as_its_storage_holds_it_after_each_ask(tmp_path):
    """A step's refills are proposed from the trials read once at its first proposal plus its own
    new ones (TPE reads the study for each parameter, and each read from SQLite is slow with many
    lanes running); what the samplers see must be what the storage would give them, the constant
    liar's running trials with their values so far included (none has reported at a rung here:
    those are shown as pruned, tested above)."""
    import optuna

    from harness.search.searcher import suggest

    settings, ostudy, broker = _broker(tmp_path)
    for k in range(6):  # finished, pruned and running trials before the step
        t = ostudy.ask()
        suggest(t, settings.study.space)
        if k < 6:
            ostudy.tell(t, float(k)) if k % 2 else ostudy.tell(t, state=optuna.trial.TrialState.PRUNED)
    S = optuna.trial.TrialState
    seen = lambda trials: [(t.number, t.state, t.params) for t in trials]  # noqa: E731
    read, asked = ostudy.get_trials(deepcopy=False), []
    for k in range(4):
        t = broker._ask({"num_minibatches": "8"}, read, asked)
        view = t.study
        if k % 2:  # the view also holds a new trial's values sampled so far
            suggest(t, settings.study.space)
        for states in (None, (S.COMPLETE, S.PRUNED), (S.COMPLETE, S.PRUNED, S.RUNNING)):
            assert seen(view._get_trials(deepcopy=False, states=states)) == seen(ostudy.get_trials(states=states))
    assert len(ostudy.get_trials()) == 10 and len(asked) == 4


def test_broker__a_step_that_failed_after_asking_a_refill_hands_that_refill_out_when_replayed(tmp_path,
                                                                                               monkeypatch):
    """The broker's step fails between its two refills (a storage error); the trial is retried and
    replays the chunk to the same broker: the first refill asked is handed out again, and no
    configuration is left RUNNING that no lane trains."""
    import optuna

    from harness.lanes.broker import LaneBroker

    _, ostudy, broker = _broker(tmp_path)
    first = [ostudy.ask() for _ in range(4)]
    static = {"num_minibatches": "4"}
    reports = [_at(lane, t.number, 128, v) for lane, (t, v) in enumerate(zip(first, [1.0, 5.0, 3.0, 20.0]))]
    ask, asked = LaneBroker._ask, []

    def first_then_fail(self, *args):
        if asked:
            raise optuna.exceptions.StorageInternalError("database is locked")
        t = ask(self, *args)
        asked.append(t.number)
        return t

    monkeypatch.setattr(LaneBroker, "_ask", first_then_fail)
    with pytest.raises(optuna.exceptions.StorageInternalError):
        broker.step(0, 1, static, reports, True)
    monkeypatch.undo()
    answer = broker.step(0, 1, static, reports, True)
    assert sorted(answer["new"]) == [0, 1, 2] and answer["new"][0]["number"] == asked[0]
    going = {first[3].number} | {n["number"] for n in answer["new"].values()}
    running = {t.number for t in ostudy.get_trials() if t.state == optuna.trial.TrialState.RUNNING}
    assert running == going


def test_broker__tells_finished_diverged_and_cut_short_configurations_and_refills_only_when_asked(tmp_path):
    import optuna

    _, ostudy, broker = _broker(tmp_path)
    a, b, c = (ostudy.ask() for _ in range(3))
    answer = broker.step(1, 5, {"num_minibatches": "4"}, [
        _at(0, a.number, 900, None, rung=None, finished=True, scores=[400.0, 420.0]),
        _at(1, b.number, 900, None, rung=None, diverged=True),
        _at(2, c.number, 300, None, rung=None)], True)
    assert {k: v["status"] for k, v in answer["ended"].items()} == {0: "complete", 1: "diverged"}
    assert sorted(answer["new"]) == [0, 1]
    last = broker.step(1, 6, {"num_minibatches": "4"}, [_at(2, c.number, 400, None, rung=None, last=True)], False)
    assert last == {"ended": {2: {"status": "pruned", "why": "cut short: the trial's budget ended"}}, "new": {}}
    by_number = {t.number: t for t in ostudy.get_trials()}
    assert by_number[a.number].value == 410.0
    assert by_number[b.number].state == optuna.trial.TrialState.FAIL
    assert by_number[c.number].state == optuna.trial.TrialState.PRUNED


# ---- one trial's lanes through the kernel and the broker, as a study's trial runs them ----------

def _lane_trial(tmp_path, lrs, timesteps, chunks):
    """A lane trial of 3 lanes at learning rates ``lrs`` (a tiny CartPole kernel, chunks of 256 env
    steps, rungs at 256 and 768), served by a broker in this process: (its Optuna study, the broker,
    the first lanes' Optuna trials, the plan, its LaneRunner, its LaneTrial)."""
    from harness.lanes.trial import LaneTrial
    from harness.phases.search_phase import plan_factory
    from harness.space import Budget

    settings, ostudy, broker = _broker(tmp_path, min_steps=256)
    budget = Budget(trials=3, configs_per_trial=3, seeds=2, timesteps=timesteps)
    first = [ostudy.ask() for _ in range(3)]
    default = settings.control(budget.timesteps)[0]
    points = [{**default, "lr": lr, "num_minibatches": 4} for lr in lrs]
    plan = plan_factory(settings, budget, "local")(points, 0)
    config = {**plan.config, "num_envs": 4, "num_steps": 32, "update_epochs": 1, "updates_per_chunk": 2,
              "hidden": [16, 16]}
    plan = dataclasses.replace(plan, config=config, seeds=2, chunks=chunks, config_keys=[t.number for t in first],
                               lanes={**plan.lanes, "static": {"num_minibatches": "4"}, "params": points})
    runner = LaneRunner(plan)
    return ostudy, broker, first, plan, runner, LaneTrial.start(plan, runner.budget_steps)


@pytest.mark.xla_emitters  # two programs compared: a lane of the lane kernel and the configuration alone
def test_lane_trial__evaluates_more_configurations_than_lanes_each_as_it_would_train_alone(tmp_path, capsys):
    import optuna

    from harness.kernel.runners import run_trial
    from harness.lanes.trial import LaneTrial

    ostudy, broker, first, plan, runner, lanes = _lane_trial(tmp_path, (3e-4, 1e-3, 3e-3), 2304, 27)
    config = plan.config
    assert lanes.rungs == [256, 768] and runner.total_chunks == 27
    calls = []

    def step(*args):  # the broker keeping its last answer only, and each chunk's two before replayed
        calls.append((copy.deepcopy(args), broker.step(*args)))  # to it as a restarted trial replays them
        replayed = [broker.step(*copy.deepcopy(a)) for a, _ in calls[-3:-1]]
        assert replayed == [answer for _, answer in calls[-3:-1]] and len(broker.answers) == 1
        return calls[-1][1]

    with pytest.MonkeyPatch.context() as m:
        m.setattr("harness.lanes.broker.ANSWERS_KEPT", 1)  # older answers: from the study's storage
        while not runner.done:
            runner.chunk()
            lanes.after_chunk(runner, step)
    records = lanes.records()
    broker.answers.clear()  # and every chunk replayed once the trial has ended
    assert [broker.step(*args) for args, _ in calls] == [answer for _, answer in calls]
    assert len(records) > 3 and [r["index"] for r in records] == list(range(len(records)))
    kept = LaneTrial.from_state(lanes.state())  # as a checkpoint keeps it, where its time went too
    assert kept.records() == records and (kept.broker_s, kept.lanes_s) == (lanes.broker_s, lanes.lanes_s)
    assert lanes.broker_s > 0 and lanes.lanes_s > 0
    states = {t.number: t.state.name for t in ostudy.get_trials()}
    assert "RUNNING" not in states.values()  # every configuration that started was told
    trials = {t.number: t for t in ostudy.get_trials()}
    for r in records:
        told = {"complete": "COMPLETE", "pruned": "PRUNED", "diverged": "FAIL"}[r["status"]]
        assert states[r["optuna_number"]] == told
        # its curve in Optuna: its objective so far after each of its chunks (9 of them at most here)
        values = trials[r["optuna_number"]].intermediate_values
        assert sorted(values) == [c["env_steps"] for c in r["curve"]]
        if r["status"] == "pruned":
            assert values[r["env_steps"]] == pytest.approx(r["last_value"])
        assert r["curve"][-1]["env_steps"] == r["env_steps"] and len(r["curve"]) == r["env_steps"] // 256
        if r["status"] == "complete":
            assert r["env_steps"] == runner.budget_steps
    # the trial trained again from its record alone (harness.lanes.trial.replay): bit for bit
    from harness.lanes.trial import replay

    again = replay(plan, records)
    for r, x in zip(records, again, strict=True):
        assert x == {k: r[k] for k in x}, r["optuna_number"]
    done = [r for r in records if r["status"] == "complete"][-1]
    alone = run_trial(dataclasses.replace(plan, hparams=[done["hparams"]], config_keys=[done["optuna_number"]],
                                          chunks=None, lanes=None))
    np.testing.assert_allclose(alone.scores[0], done["scores"], rtol=1e-4)
    # and from the shell: harness.train with its values, the study's seed and its Optuna number
    from harness import train

    sets = [f"--set={k}={v}" for k, v in {**config, **done["hparams"]}.items() if k != "total_timesteps"]
    sets = [s.replace("[16, 16]", "16,16") for s in sets]
    steps = str(config["total_timesteps"])
    assert train.main(["--seeds", "2", "--seed", str(plan.study_seed), "--timesteps", steps,
                       "--config-key", str(done["optuna_number"]), *sets]) == 0
    out = capsys.readouterr().out.splitlines()
    printed = [float(line.split()[-1]) for line in out if line.startswith("seed ")]
    np.testing.assert_allclose(printed, done["final_returns"], rtol=1e-4)
    assert optuna.trial.TrialState.PRUNED in {t.state for t in ostudy.get_trials()}


def test_lane_trial__a_lane_that_diverges_in_the_kernel_is_recorded_refilled_and_its_neighbours_go_on(tmp_path):
    """Not a made-up report: lane 1 trains at lr 1e3 and its seeds' NaNs set the kernel's sticky flag;
    the broker tells it FAIL, the record says diverged, and the lane's next configuration trains
    from a fresh start (flag cleared, finite curve) while lanes 0 and 2 never notice."""
    ostudy, broker, first, _, runner, lanes = _lane_trial(tmp_path, (3e-4, 1e3, 1e-3), 768, 6)
    while lanes.lanes[1].number == first[1].number:  # until its configuration ends
        runner.chunk()
        answer = lanes.after_chunk(runner, broker.step)
    assert runner.curves[-1].diverged[1].all() and not runner.curves[-1].diverged[[0, 2]].any()
    assert answer["ended"][1] == {"status": "diverged", "why": "diverged"} and 1 in answer["new"]
    assert ostudy.trials[first[1].number].state == optuna.trial.TrialState.FAIL
    refilled_at = len(runner.curves)
    while not runner.done:
        runner.chunk()
        lanes.after_chunk(runner, broker.step)
    records = lanes.records()
    bad = [r for r in records if r["status"] == "diverged"]
    assert [r["optuna_number"] for r in bad] == [first[1].number] and bad[0]["diverged"] == [True, True]
    assert bad[0]["scores"] is None
    after = [r for r in records if r["lane"] == 1 and r["started_chunk"] == refilled_at]
    assert len(after) == 1 and after[0]["diverged"] == [False, False]
    assert all(v is not None for row in after[0]["curve"] for v in row["evals"])
    assert not np.stack([r.diverged[[0, 2]] for r in runner.curves]).any()


# ---- the driver's side: lane plans, the broker's life, records and reports ----------------------

def test_settings__lane_trials_fill_the_slots_and_the_static_points_at_most_one_per_three_trials(tmp_path):
    """Fewer, longer lane trials end fewer times (a new configuration started in a lane trial's
    last stretch cannot finish). A resumed study keeps its lane trials' length, whatever the
    machine it resumes on; one from before the length was stored keeps the rule it started with."""
    import studies
    from harness.space import Budget
    from tests.driver import settings_for

    lanes = settings_for(studies.get("cartpole_ppo"), tmp_path, scheduler="lanes")

    def shape(trials: int, slots: int, stored=None, settings=lanes) -> tuple[int, float]:
        b = Budget(trials=trials, configs_per_trial=4, seeds=2, timesteps=300_000)
        s = settings.with_rounds(b, slots, stored)
        return s.tune_trials(b), s.lane_rounds(b)

    assert shape(12, 2) == (2, 6.0)  # a 2-core laptop at the registered CPU budget
    assert shape(12, 8) == (4, 3.0)  # more slots than 12 / 3: lane trials of 3
    assert shape(5, 2) == (2, 2.5) and shape(2, 2) == (1, 2.0) and shape(16, 4) == (4, 4.0)
    # one slot: still a lane trial for each of the study's 2 static points (num_minibatches 4 or 8) ...
    assert shape(12, 1) == (2, 6.0)
    # ... and one lane trial where nothing is static
    study = studies.get("cartpole_ppo")
    plain = dataclasses.replace(study, space={k: v for k, v in study.space.items() if k != "num_minibatches"})
    assert shape(12, 1, settings=settings_for(plain, tmp_path, scheduler="lanes")) == (1, 12.0)
    b = Budget(trials=12, configs_per_trial=4, seeds=2, timesteps=300_000)
    meta = lanes.with_rounds(b, 2, None).meta(b, None, "2026-11-27T12:00:00")
    assert meta.rounds == 6.0
    assert shape(12, 8, meta) == (2, 6.0)  # resumed on another machine: the same lane trials
    assert shape(24, 8, meta) == (4, 6.0)  # --trials grown: by whole lane trials of the same length
    older = dataclasses.replace(meta, rounds=None)  # study.json written before the length was stored
    assert shape(12, 2, older) == (4, 3.0)
    asha = settings_for(studies.get("cartpole_ppo"), tmp_path, scheduler="asha")
    assert shape(12, 2, settings=asha)[0] == 12 and asha.with_rounds(b, 2, None).rounds is None
    # resumed once without --scheduler lanes: study.json keeps the length for the next lanes run
    assert asha.meta(b, meta, "2026-11-27T13:00:00").rounds == 6.0


class _LaneTune:
    """Stands in for ``harness.cluster.tuning.run`` for a lane study: each proposed trial reaches its broker
    once (as a trial does after each chunk) and ends with its first configurations trained to the
    end, configuration i scoring 10 * (trial + 1) + i on every seed."""

    def __init__(self):
        self.configs, self.calls = [], []

    def __call__(self, settings, folder, placement, guard, *, kind, searcher=None, num_samples=1, **kwargs):
        from harness.lanes.trial import broker_call

        self.calls.append(num_samples)
        for n in range(num_samples):
            config = searcher.suggest(f"lane{n}")
            plan = config["plan"]
            self.configs.append(config)
            assert broker_call(plan["lanes"]["broker"])(plan["trial"], 1, plan["lanes"]["static"], [], True) == {
                "ended": {}, "new": {}}
            s = plan["seeds"]
            lane_configs = [{"index": i, "lane": i, "optuna_number": number, "params": plan["lanes"]["params"][i],
                             "hparams": plan["hparams"][i], "status": "complete",
                             "stopped": "trained its whole budget",
                             "pruned": False, "started_chunk": 0, "env_steps": 20480,
                             "scores": [10.0 * (plan["trial"] + 1) + i] * s, "final_returns": [1.0] * s,
                             "diverged": [False] * s, "last_value": None,
                             "curve": [{"env_steps": 5120 * (k + 1), "returns": [1.0] * s, "evals": [2.0] * s}
                                       for k in range(4)]}
                            for i, number in enumerate(plan["config_keys"])]
            searcher.on_trial_complete(f"lane{n}", {"final": True, "done": True, "env_steps": 61440,
                                                    "lane_configs": json.dumps(lane_configs)})


def test_searcher__a_lane_studys_first_trials_take_each_static_combination_in_turn(tmp_path):
    import studies
    from harness.search.searcher import BatchedOptunaSearcher, open_study
    from tests.driver import plan_maker, settings_for

    study = studies.get("cartpole_ppo")
    lanes = settings_for(study, tmp_path, scheduler="lanes")
    assert lanes.first_statics(study.cpu) == [{"num_minibatches": 4}, {"num_minibatches": 8}]  # 3 lane trials
    assert lanes.first_statics(dataclasses.replace(study.cpu, trials=2)) == []  # 1 lane trial: TPE chooses
    assert settings_for(study, tmp_path).first_statics(study.cpu) == []  # trial-level ASHA: the sampler's choice
    for order in ([4, 8], [8, 4]):  # one sampler seed cannot draw both orders
        ostudy = open_study(study, f"sqlite:///{tmp_path / f'o{order[0]}.db'}", seed=0)
        s = BatchedOptunaSearcher(study, ostudy, static_names=["num_minibatches"], configs_per_trial=2,
                                  make_plan=plan_maker(study, tmp_path, seeds=2, timesteps=2048), extra={},
                                  on_complete=lambda r: None, is_pruned=lambda t: False,
                                  first_statics=[{"num_minibatches": n} for n in order])
        plans = [s.suggest(str(k))["plan"] for k in range(3)]
        assert [p["config"]["num_minibatches"] for p in plans[:2]] == order
        shared = [{t.params["num_minibatches"] for t in ostudy.trials if t.user_attrs["tune_trial"] == k}
                  for k in range(3)]
        assert [len(v) for v in shared] == [1, 1, 1]  # each trial's configurations share it
        assert not ostudy.get_trials(states=(optuna.trial.TrialState.WAITING,))
    for t in ostudy.trials:  # the first trial (num_minibatches=8 in this order) failed: 8 is drawn again
        if t.user_attrs["tune_trial"] == 0:
            ostudy.tell(t.number, state=optuna.trial.TrialState.FAIL)
    assert s.suggest("3")["plan"]["config"]["num_minibatches"] == 8


def test_search_phase__lane_trials_are_planned_served_recorded_and_reported(tmp_path, monkeypatch, capsys):
    import studies
    from harness import report
    from harness.cluster import tuning
    from harness.driver.guard import DiskGuard
    from harness.lanes import trial as lanes
    from harness.phases import search_phase
    from harness.store.folder import ResultsFolder
    from tests.driver import CPU, settings_for, small

    study = small(studies.get("cartpole_ppo"), trials=3, timesteps=20480)
    settings = settings_for(study, tmp_path, scheduler="lanes")
    folder = ResultsFolder(tmp_path / study.name)
    folder.write_meta(settings.meta(settings.budget("cpu"), None, "now"))
    fake = _LaneTune()
    monkeypatch.setattr(tuning, "run", fake)
    outcome = search_phase.run(settings, folder, CPU, DiskGuard(folder, "resume"))
    assert fake.calls == [1] and (outcome.done, outcome.total) == (1, 1)  # one trial as long as the budget's 3
    plan = fake.configs[0]["plan"]
    assert plan["config_keys"] == [0, 1] and plan["chunks"] == 12  # 3 x 4 chunks of 5,120 steps
    assert plan["lanes"]["static"]["num_minibatches"] in ("4", "8") and plan["lanes"]["min_steps"] == 20480 // 9
    assert lanes._LOCAL == {}  # the broker (served in this process: no Ray here) ended with the search
    (rec,) = folder.trials()
    assert rec.status == "complete" and rec.plan["config_keys"] == [0, 1]
    told = optuna.load_study(study_name=study.name, storage=folder.optuna_url()).trials
    assert [t.value for t in told] == [10, 11]
    configs, seeds, curves = report.tables(folder)
    assert list(configs.config_id) == ["t0000c1", "t0000c0"] and list(configs["rank"]) == [1, 2]
    assert set(configs.stopped) == {"trained its whole budget"} and set(configs.env_steps) == {20480}
    assert len(curves) == 2 * 4 * 2 and curves.env_steps.max() == 20480
    assert "[1/1] trial 0: best of its 2 configs 11.0 (its lanes refilled: 2 trained to the end, 0 stopped " \
           "early)" in capsys.readouterr().out  # (a fake trial: no timings to say)
    # the final phase on lane records: the top configurations and the control on the same fresh seeds
    from harness.driver import summary
    from harness.phases import final_phase
    from tests.test_driver import _final_kernels

    run_plans, seen = _final_kernels(tmp_path)
    final = final_phase.run(settings, folder, CPU, DiskGuard(folder, ""), run_plans=run_plans)
    assert [c.config_id for c in final.configs] == ["t0000c1", "t0000c0"]
    by_index = {c.index: c for c in rec.configs}
    assert [c.hparams for c in final.configs] == [by_index[1].hparams, by_index[0].hparams]
    assert final.control.params == settings.control(20480)[0]
    keys = [[(p["plan"]["trial"], p["plan"]["stream"]) for p in c.plans] for c in [*final.configs, final.control]]
    assert keys[0] == keys[1] == keys[2] and keys[0]
    lines = summary.lines(report.build(folder), done=1, minutes=0.5)
    assert lines[1].startswith("best: t0000c1 re-evaluated ") and lines[4].startswith("tuned vs default (auc): ")


def test_search_phase__a_lane_trial_that_fails_keeps_what_ended_and_tells_its_running_refills(tmp_path,
                                                                                              monkeypatch):
    import studies
    from harness.cluster import tuning
    from harness.driver.guard import DiskGuard
    from harness.lanes.trial import broker_call
    from harness.phases import search_phase
    from harness.store.folder import ResultsFolder
    from tests.driver import CPU, settings_for, small

    study = small(studies.get("cartpole_ppo"), trials=3, timesteps=20480)
    settings = settings_for(study, tmp_path, scheduler="lanes")
    folder = ResultsFolder(tmp_path / study.name)
    folder.write_meta(settings.meta(settings.budget("cpu"), None, "now"))

    def fake(settings, folder, placement, guard, *, searcher=None, **kwargs):
        searcher.suggest("t")
        plan = searcher.live["t"][2]
        ostudy = searcher.ostudy
        ostudy.enqueue_trial({"num_minibatches": "4"})  # the driver's queue: the broker never pops it
        # after chunk 1 both first lanes reach the first rung: lane 1 (worse) is stopped and refilled
        call = broker_call(plan.lanes["broker"])
        reports = [_at(i, n, 5120, v) for i, (n, v) in enumerate(zip(plan.config_keys, (10.0, 5.0), strict=True))]
        answer = call(plan.trial, 1, plan.lanes["static"], reports, True)
        assert list(answer["ended"]) == [1] and list(answer["new"]) == [1]
        assert [t.state.name for t in ostudy.get_trials()].count("WAITING") == 1
        ended = {"index": 1, "lane": 1, "optuna_number": plan.config_keys[1], "params": plan.lanes["params"][1],
                 "hparams": plan.hparams[1], "status": "pruned", "stopped": answer["ended"][1]["why"],
                 "pruned": True, "started_chunk": 0, "env_steps": 5120, "scores": None, "final_returns": None,
                 "diverged": [False, False], "last_value": 5.0, "curve": []}
        searcher.on_trial_result("t", {"chunk": 1, "lane_ended": json.dumps([ended])})
        searcher.on_trial_complete("t", None, error=True)  # its worker failed for good: no last result

    monkeypatch.setattr(tuning, "run", fake)
    search_phase.run(settings, folder, CPU, DiskGuard(folder, "resume"))
    (rec,) = folder.trials()
    assert rec.status == "failed"
    assert [(c.index, c.status) for c in rec.configs] == [(0, "failed"), (1, "pruned"), (2, "failed")]
    states = {t.number: t.state.name for t in optuna.load_study(study_name=study.name,
                                                                  storage=folder.optuna_url()).trials}
    numbers = [c.optuna_number for c in rec.configs]
    assert [states[n] for n in numbers] == ["FAIL", "PRUNED", "FAIL"]  # none left RUNNING
    assert rec.configs[2].params["num_minibatches"] == rec.static["num_minibatches"]
