"""`python -m harness.study` as a user runs it: bad input, end to end, resume after SIGINT/SIGKILL,
crashing workers, diverging configurations, an existing Ray cluster. Every Ray process a test
starts is stopped (each test runs Ray under its own RAY_TMPDIR and checks nothing is left)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest

import studies
from harness import report
from harness.store.folder import ResultsFolder
from tests.conftest import _ray_processes, listening, optimised, stop_ray_processes

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--trials", "3", "--configs-per-trial", "2", "--seeds", "1", "--timesteps", "20480", "--no-asha"]
NO_FINAL = ["--top-k", "0"]  # for promises about the search (faults, resume): the final phase has its own tests


STUDY_NAMES = ["ant_ppo", "breakout_pqn", "cartpole_ppo", "cartpole_pqn", "cartpole_sac", "dungeon_ppo",
               "pendulum_sac", "snake_ppo"]


def _study(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.study", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def _one_error_line(result: subprocess.CompletedProcess, expect: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and expect in lines[0], result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def _write_study(path: Path, body: str) -> Path:
    path.write_text("from harness.space import *\n" + textwrap.dedent(body))
    return path


# -- bad input: one line, exit 2, no Ray started --------------------------------------------------

def test_study_cli__unknown_study_lists_known_ones(tmp_path):
    _one_error_line(_study("nope", "--out", str(tmp_path)),
                    "unknown study 'nope'; known studies: ant_ppo, breakout_pqn, cartpole_ppo, cartpole_pqn, "
                    "cartpole_sac, dungeon_ppo, pendulum_sac, snake_ppo")


def test_study_cli__search_space_that_cannot_work(tmp_path):
    f = _write_study(tmp_path / "bad.py", """
        STUDY = Study(name="bad", description="x", env="CartPole-v1", algo="ppo",
                      config=dict(num_envs=4, num_steps=128),
                      space=dict(lr=LogUniform(1e-4, 1e-3), num_minibatches=Categorical((4, 3))),
                      cpu=Budget(1, 1, 1, 2048), gpu=Budget(1, 1, 1, 2048), smoke=Budget(1, 1, 1, 2048))
    """)
    _one_error_line(_study(str(f), "--out", str(tmp_path), "--address", "127.0.0.1:1"),
                    "search space cannot work at num_minibatches=3: num_minibatches=3 does not divide")


def test_study_cli__malformed_study_file(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text("STUDY = Study(\n")
    _one_error_line(_study(str(f), "--out", str(tmp_path)), "broken.py:1 failed: SyntaxError")


def test_study_cli__results_folder_of_another_study(tmp_path):
    (tmp_path / "cartpole_ppo").mkdir()
    (tmp_path / "cartpole_ppo" / "study.json").write_text(json.dumps({"study": "pendulum_sac"}))
    _one_error_line(_study("cartpole_ppo", "--out", str(tmp_path)),
                    "holds study 'pendulum_sac', not 'cartpole_ppo'")


def test_study_cli__unreachable_address(tmp_path):
    with socket.socket() as s:  # a port held (bound, never listening) for the whole call: nobody listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        _one_error_line(_study("cartpole_ppo", "--smoke", "--out", str(tmp_path), "--address",
                               f"127.0.0.1:{port}"), f"cannot reach a Ray cluster at 127.0.0.1:{port}")


def test_study_cli__bad_budget_value(tmp_path):
    _one_error_line(_study("cartpole_ppo", "--seeds", "0", "--out", str(tmp_path)), "seeds must be >= 1, got 0")


def test_report_cli__missing_results_folder(tmp_path):
    r = subprocess.run([sys.executable, "-m", "harness.report", str(tmp_path / "nothing")],
                       capture_output=True, text=True, cwd=ROOT)
    _one_error_line(r, f"no results folder at {tmp_path / 'nothing'}")


def test_study_cli__list_names_every_study():
    r = _study("--list")
    assert r.returncode == 0
    assert [ln.split()[0] for ln in r.stdout.splitlines()] == STUDY_NAMES


def _timed_out_start(monkeypatch, times: int) -> tuple[list, list]:
    """ray.init for ``cluster.start`` that misses Ray's startup wait ``times`` times, each time
    leaving a process behind as a failed start leaves its raylet."""
    import ray

    monkeypatch.setattr(os, "environ", os.environ.copy())  # start() sets Ray's variables
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    calls, left = [], []

    def init(**kwargs):
        calls.append(kwargs)
        if len(calls) <= times:
            left.append(subprocess.Popen(["sleep", "120"]))
            raise Exception("The current node timed out during startup. This could happen because "
                            "some of the raylet failed to startup or the GCS has become overloaded.")
        return type("Ctx", (), {"dashboard_url": "127.0.0.1:8265"})()

    monkeypatch.setattr(ray, "init", init)
    return calls, left


def test_cluster__a_local_ray_that_misses_its_startup_wait_is_started_again_without_the_first_try(
        monkeypatch):
    from harness.cluster import session as cluster

    calls, left = _timed_out_start(monkeypatch, times=1)
    try:
        dashboard, _ = cluster.start(None)
        assert len(calls) == 2 and calls[0] == calls[1]
        assert dashboard == "http://127.0.0.1:8265"
        assert left[0].poll() is not None, "the failed try's process is still running"
    finally:
        left[0].kill()
        left[0].wait()


def test_cluster__a_local_ray_that_never_starts_is_one_line_not_a_traceback(monkeypatch):
    from harness.cluster import session as cluster

    calls, left = _timed_out_start(monkeypatch, times=2)
    try:
        with pytest.raises(cluster.ClusterError, match=r"^cannot start or reach a local Ray: The current "
                                                       r"node timed out during startup\. [^\n]*$"):
            cluster.start(None)
        assert len(calls) == 2
    finally:
        for p in left:
            p.kill()
            p.wait()


def test_cluster__the_embedded_ray_has_its_dashboard_unless_told_otherwise(monkeypatch):
    from harness.cluster import session as cluster

    calls, _ = _timed_out_start(monkeypatch, times=0)
    for value, wanted in ((None, True), ("1", True), ("0", False)):
        if value is None:
            os.environ.pop("RL_HARNESS_DASHBOARD", None)
        else:
            os.environ["RL_HARNESS_DASHBOARD"] = value
        dashboard, _ = cluster.start(None)
        assert calls[-1]["include_dashboard"] is wanted
    os.environ["RL_HARNESS_DASHBOARD"] = "off"
    with pytest.raises(cluster.ClusterError, match=r"^RL_HARNESS_DASHBOARD must be 0 or 1, not 'off'$"):
        cluster.start(None)


@pytest.mark.parametrize("chunks", [3, 4, 10, 24, 25, 50])
def test_asha__one_rung_in_the_middle_of_a_trial(chunks):
    from ray.tune.schedulers import ASHAScheduler

    from harness.phases.search_phase import halfway_rung

    asha = ASHAScheduler(time_attr="training_iteration", metric="score", mode="max", max_t=chunks,
                         grace_period=halfway_rung(chunks), reduction_factor=2)
    rungs = [milestone for milestone, _ in asha._brackets[0]._rungs]  # Tune's own rung placement
    assert len(rungs) == 1 and chunks / 2 <= rungs[0] <= chunks / 2 + 1, rungs


# -- the searcher tells Optuna each configuration's own result ------------------------------------

def test_searcher__diverged_config_fails_in_optuna_while_sibling_completes(tmp_path):
    import studies
    from harness.search.searcher import BatchedOptunaSearcher, open_study
    from tests.driver import plan_maker

    study = studies.get("cartpole_ppo")
    ostudy = open_study(study, f"sqlite:///{tmp_path / 'o.db'}", seed=0)
    records = []
    s = BatchedOptunaSearcher(study, ostudy, static_names=["num_minibatches"], configs_per_trial=3,
                              make_plan=plan_maker(study, tmp_path, seeds=2, timesteps=2048),
                              extra={}, on_complete=records.append, is_pruned=lambda t: False)
    cfg = s.suggest("a")
    assert len({h["lr"] for h in cfg["plan"]["hparams"]}) == 3  # three proposals ...
    assert len({t.params["num_minibatches"] for t in ostudy.trials}) == 1  # ... sharing the static choice
    s.on_trial_complete("a", {"final": True, "scores": [[1.0, 3.0], [None, None], [5.0, 5.0]],
                              "diverged": [[False, False], [True, True], [False, False]],
                              "env_steps": 2048, "chunk": 1, "returns": [[1, 1], [None, None], [2, 2]]})
    states = [t.state.name for t in ostudy.trials]
    assert states == ["COMPLETE", "FAIL", "COMPLETE"]
    assert [t.value for t in ostudy.trials if t.value is not None] == [2.0, 5.0]
    assert records[0].status == "complete" and records[0].configs[1].diverged == [True, True]


# -- end to end ------------------------------------------------------------------------------------

_WRITER = """
import sys, time
from pathlib import Path
import optuna
from harness.search.storage import storage

url, name, ready, go = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
ready.touch()
while not go.exists():
    time.sleep(0.01)
study = optuna.create_study(study_name=name, storage=storage(url), load_if_exists=True,
                            sampler=optuna.samplers.RandomSampler(seed=int(ready.stem)))
for i in range(25):
    trial = study.ask()
    x = trial.suggest_float("x", 0.0, 1.0)
    trial.report(x, step=1)
    study.tell(trial, x)
"""


_KILLED_AFTER_COMMITS = """
import os, signal, sys
import optuna
from harness.search.storage import storage
study = optuna.create_study(study_name="s", storage=storage(sys.argv[1]))
for i in range(5):
    study.tell(study.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), float(i))
print(sorted(os.listdir(os.path.dirname(sys.argv[1].removeprefix("sqlite:///")))), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no close, no checkpoint of the log into the file
"""


def test_optuna_storage__commits_through_sqlites_log_survive_a_process_killed_right_after_them(tmp_path):
    """The study's SQLite file commits through a write-ahead log without waiting for the disk
    (harness.search.storage.storage): a process SIGKILLed just after its tells loses none of them."""
    url = f"sqlite:///{tmp_path / 'db' / 'optuna.db'}"
    r = subprocess.run([sys.executable, "-c", _KILLED_AFTER_COMMITS, url], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert "'optuna.db-wal'" in r.stdout  # the commits were in the log when it died
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [(t.state.name, t.value) for t in trials] == [("COMPLETE", float(i)) for i in range(5)]
    from harness.search.storage import storage

    with storage(url).engine.connect() as c:  # this process's connections commit the same way
        assert c.exec_driver_sql("pragma journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("pragma synchronous").scalar() == 1  # NORMAL


def test_optuna_storage__opens_without_ray_or_jax():
    """Processes that only read or write a study's records (the writers below) start fast: no Ray, no JAX."""
    code = "import sys, harness.search.storage; print(sorted({'ray', 'jax'} & set(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_optuna_storage__one_sqlite_file_holds_under_concurrent_writers(tmp_path):
    """Eight processes (two studies sharing one --storage) create the same fresh SQLite storage at
    once, then each asks and tells 25 trials: none fails (without the creation lock some die on
    "table studies already exists"), and every trial is stored once."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    go = tmp_path / "go"
    args = [[sys.executable, str(script), url, f"s{i % 2}", str(tmp_path / f"{i}.ready"), str(go)]
            for i in range(8)]
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}) for a in args]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.ready"))) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    ready = len(list(tmp_path.glob("*.ready")))
    go.touch()  # all at once (also when some never got ready: the others must not wait forever)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert ready == 8, f"{ready} of 8 writers ready within 120 s, so they did not race:\n" + "\n".join(outs)
    assert [p.returncode for p in procs] == [0] * 8, "\n".join(outs)
    for name in ("s0", "s1"):
        trials = optuna.load_study(study_name=name, storage=url).trials
        assert len(trials) == 100 and {t.state.name for t in trials} == {"COMPLETE"}
        assert sorted(t.number for t in trials) == list(range(100))
        assert all(t.value == t.params["x"] == t.intermediate_values[1] for t in trials)


@pytest.mark.slow
def test_study__smoke_run_writes_reports(tmp_path, ray_env, capsys):
    ray_env = optimised(ray_env)
    r = _study("cartpole_ppo", "--smoke", "--out", str(tmp_path), env=ray_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "results:" in r.stdout and "best:" in r.stdout and "[2/2]" in r.stdout
    root = tmp_path / "cartpole_ppo-smoke"
    configs = pd.read_csv(root / "reports" / "configs.csv")
    seeds = pd.read_csv(root / "reports" / "seeds.csv")
    curves = pd.read_csv(root / "reports" / "curves.csv")
    assert {"config_id", "lr", "gamma", "mean", "std", "iqm", "ci_low", "ci_high",
            "diverged", "pruned", "rank"} <= set(configs.columns)
    assert "num_minibatches" not in configs.columns  # --smoke fixes static choices: one kernel shape
    assert len(configs) == 2 * 2 and len(seeds) == len(configs) * 2
    assert sorted(seeds.groupby("config_id").size().unique()) == [2]
    complete = seeds[seeds.status == "complete"]
    assert len(complete) and complete.score.notna().all() and (complete.score > 0).all()
    assert curves.env_steps.max() == 20_480 and curves.episode_return.notna().any()
    assert curves.eval_return.notna().all()  # an evaluation after every chunk, for every run
    assert configs[configs.status == "complete"].final_return.notna().all()
    best = json.loads((root / "reports" / "best.json").read_text())
    assert best["reevaluation"]["seeds"] == 4 and best["reevaluation"]["mean"] > 0
    assert "harness.train" in best["reproduce"]["command"]
    assert best["objective"] == "auc" and "area under the evaluation curve" in best["ranked_by"]
    # the default configuration, re-trained on the same fresh seeds as the tuned ones
    final = json.loads((root / "final.json").read_text())
    control, top = final["control"], next(c for c in final["configs"] if c["config_id"] == best["config_id"])
    assert control["params"]["lr"] == 2.5e-4 and len(control["scores"]) == len(top["scores"]) == 4
    keys = [(p["plan"]["trial"], p["plan"]["stream"], p["plan"]["seeds"]) for p in top["plans"]]
    assert [(p["plan"]["trial"], p["plan"]["stream"], p["plan"]["seeds"]) for p in control["plans"]] == keys
    t = best["tuned_vs_default"]
    assert t["difference"]["paired_seeds"] == 4 and t["default"]["mean"] == pytest.approx(
        sum(control["scores"]) / 4)
    assert "tuned vs default (auc): " in r.stdout
    assert set(pd.read_csv(root / "reports" / "final.csv").role) == {"tuned", "default"}
    # the ablation path: default -> best on the same fresh seeds, ending at the best's re-evaluation
    path = pd.read_csv(root / "reports" / "ablation.csv")
    assert path["param"].iloc[0] == "(default)" and path["mean"].iloc[0] == pytest.approx(t["default"]["mean"])
    assert path["mean"].iloc[-1] == pytest.approx(best["reevaluation"]["mean"])
    switched = sorted(n for n in top["params"] if top["params"][n] != control["params"][n])
    assert sorted(path["param"].iloc[1:]) == switched
    assert "ablation path (default " in r.stdout and " extra kernels, " in r.stdout
    assert re.search(r"hyperparameter importance needs at least 8 completed configurations; this study has "
                     r"[0-4]\n*$", r.stdout)  # too few for it: said instead, last
    page = (root / "reports" / "index.html").read_text()
    assert 'src="curves.png"' in page and best["config_id"] in page
    # the best configuration's policies are kept; loading one gives its evaluation at save time
    gif = tmp_path / "best.gif"
    r = subprocess.run([sys.executable, "-m", "harness.play", str(root), "--seed", "1", "--gif", str(gif)],
                       capture_output=True, text=True, cwd=ROOT, env=ray_env)
    assert r.returncode == 0, r.stderr
    m = re.search(r"evaluation return (\S+) \(at save time (\S+)\); episode return \S+ in (\d+) steps", r.stdout)
    assert m and float(m[1]) == pytest.approx(float(m[2]), rel=1e-5), r.stdout
    from PIL import Image

    assert Image.open(gif).n_frames == int(m[3]) + 1
    # in this process (the CLIs as a user runs them: the play above; harness.report's in test_report.py)
    from harness import play

    capsys.readouterr()
    assert play.main([str(root), "--config", "t9999c0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: no checkpoint for configuration 't9999c0'; kept: "), err
    # the reports rebuild from disk without Ray, identically
    before = {p.name: p.read_bytes() for p in (root / "reports").glob("*.[cj]s*")}
    assert report.main([str(root)]) == 0
    assert {p.name: p.read_bytes() for p in (root / "reports").glob("*.[cj]s*")} == before


@pytest.mark.slow
@pytest.mark.extended  # mostly compiling Ant: Brax through the kernel is tested by
def test_study__robot_study_smoke_runs(tmp_path, ray_env):  # test_locomotion.py and test_render.py
    pytest.importorskip("brax")
    # the search only: the final phase's re-training (more Ant kernels) is the same code on every env,
    # tested end to end by the cartpole smoke study above
    r = _study("ant_ppo", "--smoke", "--trials", "1", *NO_FINAL, "--out", str(tmp_path), env=ray_env)
    assert r.returncode == 0, r.stdout + r.stderr
    root = tmp_path / "ant_ppo-smoke"
    assert [rec.status for rec in ResultsFolder(root).trials()] == ["complete"]
    best = json.loads((root / "reports" / "best.json").read_text())
    # a smoke budget checks the robot's trial runs to a real score, not learning (an untrained Ant scores by
    # standing); Brax's learning is tested on the inverted pendulum (tests/test_locomotion.py)
    assert math.isfinite(best["search_score"]) and best["reevaluation"] is None, best
    assert "search score" in r.stdout and "(not re-evaluated)" in r.stdout
    # keeping and watching a robot policy (harness.play draws it with MuJoCo): tests/test_render.py


@pytest.mark.slow
@pytest.mark.extended
def test_study__population_based_training_end_to_end(tmp_path, ray_env):
    r = _study("cartpole_ppo", "--scheduler", "pbt", "--trials", "1", "--configs-per-trial", "4", "--seeds", "2",
               "--timesteps", "30720", "--out", str(tmp_path), env=ray_env)
    assert r.returncode == 0, r.stdout + r.stderr
    root = tmp_path / "cartpole_ppo"
    (record,) = ResultsFolder(root).trials()
    events = [c["pbt"] for c in record.curves if c.get("pbt")]
    assert [e["chunk"] for e in events] == [4] and sum(s != i for i, s in enumerate(events[0]["source"])) == 1
    pbt = pd.read_csv(root / "reports" / "pbt.csv")
    assert len(pbt) == 4 * 2 and pbt.copied.sum() == 1
    assert (root / "reports" / "pbt.png").read_bytes()[:4] == b"\x89PNG"
    ostudy = optuna.load_study(study_name="cartpole_ppo", storage=f"sqlite:///{root / 'optuna.db'}")
    assert {t.state.name for t in ostudy.trials} == {"FAIL"}  # kept out of TPE's model ...
    assert all("pbt" in t.user_attrs and "pbt_value" in t.user_attrs for t in ostudy.trials)  # ... but kept
    assert all(len(t.intermediate_values) == 6 for t in ostudy.trials)
    final = json.loads((root / "final.json").read_text())
    copied = [c for c in final["configs"] if c.get("schedule")]
    for c in copied:  # a copied configuration's re-training replays its lineage's schedule
        assert "--schedule" in c["command"] and c["plans"][0]["plan"]["schedule"]
        assert json.loads((root / "schedules" / f"{c['config_id']}.json").read_text()) == c["schedule"]
    bad = _study("cartpole_ppo", "--scheduler", "pbt", "--configs-per-trial", "2", "--out", str(tmp_path / "x"))
    _one_error_line(bad, "needs --configs-per-trial >= 4, got 2")


def _fault_once(args: list[str], env: dict, ready, fault) -> subprocess.CompletedProcess:
    """Runs the study until ``ready()``, then ``fault(proc)``; waits for it to end."""
    proc = subprocess.Popen([sys.executable, "-m", "harness.study", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    fault(proc)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _interrupt_then_resume(tmp_path, env, sig):
    args = ["cartpole_ppo", *TINY, "--out", str(tmp_path), "--checkpoint-every", "1chunk", *NO_FINAL]
    root = tmp_path / "cartpole_ppo"

    def in_flight_with_checkpoint():  # a trial recorded, and one running that has checkpointed
        if not list((root / "trials").glob("*.json")):
            return {}
        going = {int(p.stem): json.loads(p.read_text()) for p in (root / "inflight").glob("*.json")}
        return {n: e for n, e in going.items() if any(
            (root / "tune").glob(f"*/trial_{e['tune_trial_ids'][-1]}/checkpoint_*/kernel.msgpack"))}

    flying: dict = {}

    def ready() -> bool:
        flying.update(in_flight_with_checkpoint() if root.exists() else {})
        return bool(flying)

    first = _fault_once(args, env, ready, lambda proc: proc.send_signal(sig))
    out = first.stdout + first.stderr
    kept = {p.name: p.read_text() for p in (root / "trials").glob("*.json")}
    assert 1 <= len(kept) < 3, out
    if sig == signal.SIGINT:
        assert first.returncode == 130, out
        assert "Resume with: python -m harness.study cartpole_ppo" in out
    else:
        assert first.returncode == -signal.SIGKILL
        assert _ray_processes(env["RAY_TMPDIR"])  # a SIGKILLed driver leaves Ray processes behind ...
    r = _study(*args, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resuming: {len(kept)} trials recorded" in r.stdout
    if sig == signal.SIGKILL:  # ... which the next run stops (the fixture checks that none is left)
        assert "Ray processes a killed run of this study left behind" in r.stdout, r.stdout
    records = ResultsFolder(root).trials()
    assert len(records) == 3
    assert all((root / "trials" / name).read_text() == text for name, text in kept.items())  # not re-run
    resumed = [rec for rec in records if rec.trial in flying and f"{rec.trial:04d}.json" not in kept]
    assert resumed, (flying, kept)
    for rec in resumed:  # in flight when stopped: went on from its checkpoint, under its own number
        assert rec.resumed_after_chunk >= 1, rec
        assert len(rec.curves) == rec.curves[-1]["chunk"]  # every chunk's curve, the restored ones too
    ostudy = optuna.load_study(study_name="cartpole_ppo", storage=f"sqlite:///{root / 'optuna.db'}")
    numbers = [c.optuna_number for rec in records for c in rec.configs]
    assert len(numbers) == len(set(numbers)) == 6  # no configuration run or counted twice
    states = {t.number: t.state.name for t in ostudy.trials}
    assert {n: states[n] for n in numbers} == dict.fromkeys(numbers, "COMPLETE")
    # the only others: proposed in the instant of the kill, before the trial started (nothing ran)
    started = {n for e in flying.values() for n in e["optuna_numbers"]}
    assert all(s == "FAIL" and n not in started for n, s in states.items() if n not in numbers), (states, out)
    assert not list((root / "inflight").glob("*.json"))
    before = {p.name: p.read_bytes() for p in (root / "reports").glob("*.[cj]s*")}
    report.build(root)
    assert {p.name: p.read_bytes() for p in (root / "reports").glob("*.[cj]s*")} == before


@pytest.mark.slow
@pytest.mark.extended
def test_study__sigint_then_same_command_finishes_without_rerunning(tmp_path, ray_env):
    _interrupt_then_resume(tmp_path, ray_env, signal.SIGINT)


@pytest.mark.slow
def test_study__sigkill_then_same_command_finishes_without_rerunning(tmp_path, ray_env):
    _interrupt_then_resume(tmp_path, ray_env, signal.SIGKILL)


@pytest.mark.slow
def test_study__killed_worker_resumes_from_its_checkpoint_and_one_that_keeps_failing_is_recorded(tmp_path,
                                                                                                 ray_env):
    # one study of 2 trials: trial 1's worker dies once, after its second chunk (it checkpointed after
    # the first); trial 0's always dies there (each retry resumes from chunk 1 and dies again)
    every = ["--checkpoint-every", "1chunk", "--sampler", "random", *NO_FINAL]
    env = {**ray_env, "RL_HARNESS_CRASH": f"1:1:{tmp_path},0:99:{tmp_path}", "RL_HARNESS_CRASH_CHUNK": "2"}
    r = _study("cartpole_ppo", *TINY, "--trials", "2", *every, "--out", str(tmp_path / "a"), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    root = tmp_path / "a" / "cartpole_ppo"
    records = ResultsFolder(root).trials()
    assert [rec.status for rec in records] == ["failed", "complete"]
    assert "trial 0: FAILED" in r.stdout and "Trials did not complete" not in r.stdout + r.stderr  # not Tune's
    # its record and line say what failed (the worker died: Ray's words), as each retry's line did
    assert "died" in records[0].error and f"trial 0: FAILED: {records[0].error}" in r.stdout, r.stdout
    assert (tmp_path / "crash-1-0").exists() and not (tmp_path / "crash-1-1").exists()
    assert len(list(tmp_path.glob("crash-0-*"))) == 3  # first attempt + 2 retries
    assert records[1].resumed_after_chunk == 1
    assert not list((tmp_path / "a").rglob("kernel.msgpack"))  # recorded trials keep no kernel checkpoints
    ostudy = optuna.load_study(study_name="cartpole_ppo", storage=f"sqlite:///{root / 'optuna.db'}")
    assert [t.state.name for t in ostudy.trials][:2] == ["FAIL", "FAIL"]
    configs = pd.read_csv(root / "reports" / "configs.csv")
    failed = configs[configs.trial == 0]
    assert set(failed.status) == {"failed"} and failed["rank"].isna().all()

    # the resumed trial's results are bit-identical to its plan trained without interruption, in a
    # process on one core as the trial's worker was (XLA's rounding depends on its thread count)
    from tests.driver import settings_for

    resumed = records[1]
    plan = settings_for(studies.get("cartpole_ppo"), tmp_path / "ref").plan(
        resumed.static, [c.hparams for c in resumed.configs], seeds=resumed.seeds, trial=1)
    code = ("import json, sys\n"
            "from harness.kernel.plan import TrialPlan\n"
            "from harness.kernel.runners import run_trial\n"
            "r = run_trial(TrialPlan(**json.loads(sys.argv[1])))\n"
            "print(json.dumps([r.scores.tolist(), r.final_returns.tolist(), [c.evals.tolist() for c in r.curves],"
            " r.env_steps]))")
    core = min(os.sched_getaffinity(0))
    whole = subprocess.run([sys.executable, "-c", code, json.dumps(dataclasses.asdict(plan))], capture_output=True,
                           text=True, cwd=ROOT, env=ray_env, preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    assert whole.returncode == 0, whole.stderr[-3000:]
    scores, finals, evals, steps = json.loads(whole.stdout.splitlines()[-1])
    assert [c.scores for c in resumed.configs] == scores
    assert [c.final_returns for c in resumed.configs] == finals
    assert [row["evals"] for row in resumed.curves] == evals and resumed.env_steps == steps


@pytest.mark.slow
def test_study__lanes_through_ray_refill_judge_and_resume_bit_for_bit_after_a_killed_worker(tmp_path, ray_env):
    # one lane trial as long as two (--trials 2), 2 lanes of 4-chunk configurations; its worker dies
    # once after chunk 3 and goes on from its checkpoint after chunk 2: the broker (a Ray actor on
    # the driver's node) answers the replayed chunk as it did, so the trial is as if never killed
    env = {**ray_env, "RL_HARNESS_CRASH": f"0:1:{tmp_path}", "RL_HARNESS_CRASH_CHUNK": "3"}
    r = _study("cartpole_ppo", "--scheduler", "lanes", "--trials", "2", "--configs-per-trial", "2", "--seeds", "2",
               "--timesteps", "20480", "--checkpoint-every", "1chunk", *NO_FINAL, "--out", str(tmp_path / "a"),
               env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "scheduler: lanes: 1 trial, each as long as 2, its 2 lanes refilled" in r.stdout
    root = tmp_path / "a" / "cartpole_ppo"
    (rec,) = ResultsFolder(root).trials()
    assert rec.status == "complete" and rec.resumed_after_chunk == 2 and (tmp_path / "crash-0-0").exists()
    configs = rec.configs
    assert len(configs) > 2 and [c.index for c in configs] == list(range(len(configs)))
    ostudy = optuna.load_study(study_name="cartpole_ppo", storage=f"sqlite:///{root / 'optuna.db'}")
    states = {t.number: t.state.name for t in ostudy.trials}
    assert sorted(states) == sorted(c.optuna_number for c in configs)  # every proposal ran and was told
    for c in configs:
        assert states[c.optuna_number] == {"complete": "COMPLETE", "pruned": "PRUNED"}[c.status]
        assert c.stopped and c.curve[-1]["env_steps"] == c.env_steps
    table = pd.read_csv(root / "reports" / "configs.csv")
    assert len(table) == len(configs) and set(table.status) <= {"complete", "pruned"} and "stopped" in table
    # where its time went, through its checkpoint's restore too
    assert rec.broker_seconds > 0 and rec.lanes_seconds > 0 and rec.kernel_seconds > 0
    assert re.search(r"\(its lanes refilled: \d+ trained to the end, \d+ stopped early; [\d.]+ s in its kernel, "
                     r"[\d.]+ s waiting for the broker, [\d.]+ s judging and refilling\)", r.stdout), r.stdout
    # bit for bit: the trial trained again from its record, in a process on the cores its worker had
    # (XLA's rounding depends on its thread count): the study's one trial took every core this test may
    # use (one under -n 2, each xdist worker pinned to its own; all of them under -n 0)
    code = ("import json, sys; from harness.kernel.plan import TrialPlan; from harness.lanes.trial import replay\n"
            "rec = json.load(open(sys.argv[1]))\n"
            "print(json.dumps(replay(TrialPlan(**rec['plan']), rec['configs'])))")
    (path,) = (root / "trials").glob("*.json")
    again = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT,
                           env=ray_env)
    assert again.returncode == 0, again.stderr[-3000:]
    for c, x in zip(configs, json.loads(again.stdout.splitlines()[-1]), strict=True):
        assert x == {k: getattr(c, k) for k in x}, c.optuna_number


# In -m extended: the driver's side of a full disk (one line, the records intact, resume) is tested without Ray
# in tests/test_driver.py and tests/test_report.py, as is a disk that turns read-only mid-study (EROFS).
@pytest.mark.slow
@pytest.mark.extended
def test_study__results_disk_full_mid_study_stops_in_one_line_and_resumes(tmp_path, ray_env):
    if os.geteuid() != 0:
        pytest.skip("mounting a small results disk (tmpfs) needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], check=True)
    root = disk / "cartpole_ppo"
    args = ["cartpole_ppo", *TINY, "--trials", "4", "--checkpoint-every", "1chunk", "--out", str(disk), *NO_FINAL]

    def recorded() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in (root / "trials").glob("*.json")} if root.exists() else {}

    def fill() -> None:
        with open(disk / "filler", "wb") as f:
            try:
                while True:
                    f.write(bytes(1 << 20))
                    f.flush()
            except OSError:
                pass

    try:
        # the disk fills up mid-study
        r = _fault_once(args, ray_env, lambda: len(recorded()) >= 1, lambda _: fill())
        _one_error_line(r, "No space left on device")
        assert "trials recorded so far (" in r.stderr and ") are intact" in r.stderr, r.stderr
        assert "resume with: python -m harness.study cartpole_ppo" in r.stderr
        kept = recorded()
        assert 1 <= len(kept) < 4, r.stdout
        (disk / "filler").unlink()  # space is back
        r = _study(*args, env=ray_env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"resuming: {len(kept)} trials recorded" in r.stdout
        # (a proposal refused its inflight/ file when the disk failed never ran:
        records = ResultsFolder(root).trials()
        assert len({rec.trial for rec in records}) == len(records) == 4  # its trial number is skipped)
        assert {rec.status for rec in records} == {"complete"}
        assert {k: v for k, v in recorded().items() if k in kept} == kept  # records already written: intact
        numbers = [c.optuna_number for rec in records for c in rec.configs]
        ostudy = optuna.load_study(study_name="cartpole_ppo", storage=f"sqlite:///{root / 'optuna.db'}")
        states = {t.number: t.state.name for t in ostudy.trials}
        assert len(numbers) == len(set(numbers)) == 8  # no configuration counted twice
        assert {n: states[n] for n in numbers} == dict.fromkeys(numbers, "COMPLETE")
        assert sum(s == "COMPLETE" for s in states.values()) == 8, states  # the others FAIL, never run
        assert {s for n, s in states.items() if n not in numbers} <= {"FAIL"}, states
        assert len(pd.read_csv(root / "reports" / "configs.csv")) == 8
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.slow
@pytest.mark.extended
def test_study__diverging_configurations_are_recorded_as_diverged(tmp_path, ray_env):
    f = _write_study(tmp_path / "explode.py", """
        STUDY = Study(name="explode", description="lr far too large", env="CartPole-v1", algo="ppo",
                      space=dict(lr=LogUniform(1e2, 1e3)), config=dict(updates_per_chunk=2),
                      cpu=Budget(1, 2, 2, 4096), gpu=Budget(1, 2, 2, 4096), smoke=Budget(1, 2, 2, 4096))
    """)
    r = _study(str(f), "--out", str(tmp_path), "--no-asha", env=ray_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all configs diverged" in r.stdout
    configs = pd.read_csv(tmp_path / "explode" / "reports" / "configs.csv")
    assert configs.diverged.all() and configs["rank"].isna().all()
    ostudy = optuna.load_study(study_name="explode", storage=f"sqlite:///{tmp_path / 'explode' / 'optuna.db'}")
    assert [t.state.name for t in ostudy.trials] == ["FAIL", "FAIL"]


@pytest.mark.slow
def test_study__runs_on_an_existing_ray_cluster_whose_node_has_only_the_dependencies(tmp_path, ray_env):
    from tests.test_custom_envs import write_side_study

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the node's Python cannot import this project (the driver's can): code must come with the job
    node_env = {**ray_env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RL_HARNESS_HIDE_ROOT": str(ROOT),
                "PYTHONPATH": str(ROOT / "tests" / "hide_project")}
    hidden = subprocess.run([sys.executable, "-c", "import harness"], env=node_env, cwd=tmp_path,
                            capture_output=True, text=True)
    assert "No module named 'harness' (hidden on this node)" in hidden.stderr, hidden.stderr
    write_side_study(tmp_path)  # a study file with its env in a module beside it, neither installed anywhere
    ray = str(Path(sys.executable).parent / "ray")
    subprocess.run([ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                    "--include-dashboard=false", "--num-cpus", "2", "--disable-usage-stats"],
                   check=True, env=node_env, capture_output=True, timeout=120, cwd=tmp_path)
    try:
        # the search only: the final phase runs the same remote tasks (the smoke study tests it)
        r = _study(str(tmp_path / "side_study.py"), "--smoke", "--trials", "1", *NO_FINAL,
                   "--out", str(tmp_path / "out"), "--address", f"127.0.0.1:{port}",
                   env={**ray_env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
        assert r.returncode == 0, r.stdout + r.stderr
        assert [rec.status for rec in ResultsFolder(tmp_path / "out" / "side-smoke").trials()] == ["complete"]
        best = json.loads((tmp_path / "out" / "side-smoke" / "reports" / "best.json").read_text())
        assert best["search_score"] > 0.9  # 3 steps to the exit: 0.98 at best
    finally:  # by PID, this test's processes only: `ray stop` would stop every Ray on the machine
        stop_ray_processes(ray_env["RAY_TMPDIR"])


@pytest.mark.parametrize("name", STUDY_NAMES)
def test_registered_studies__every_static_choice_builds_at_every_budget(name):
    import algos
    import studies
    from harness.space import validate

    study = studies.get(name)
    spec = algos.get(study.algo)
    for budget in (study.cpu, study.gpu, study.smoke):
        validate(study, spec.config_cls, spec.hparams_cls, timesteps=budget.timesteps)
    assert study.static_names({f for f in spec.config_cls.__dataclass_fields__}) in (
        [], ["num_minibatches"], ["batch_size"], ["network"], ["num_steps"])


@pytest.mark.slow
def test_study__trials_are_named_actors_and_export_tagged_metrics(tmp_path, ray_env):
    import urllib.error
    import urllib.request

    port = _free_port()
    env = {**ray_env, "RL_HARNESS_METRICS_PORT": str(port), "RL_HARNESS_DASHBOARD": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "harness.study", "cartpole_ppo", *TINY, "--trials", "2",
                             "--timesteps", "3000000", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    lines = []
    while not any(ln.startswith("Prometheus metrics:") for ln in lines):
        line = proc.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
    dashboard = next(ln.split()[2] for ln in lines if ln.startswith("Ray dashboard:"))
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    found_actors = found_metrics = None
    deadline = time.monotonic() + 240
    try:
        while (found_actors is None or found_metrics is None) and time.monotonic() < deadline:
            time.sleep(2)
            req = urllib.request.Request(f"{dashboard}/api/v0/actors?limit=100&detail=true",
                                         headers={"Authorization": f"Bearer {token}"})
            try:  # the dashboard and the metrics agent come up a little after the study starts
                actors = json.loads(urllib.request.urlopen(req, timeout=10).read())["data"]["result"]["result"]
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            except OSError:
                continue
            named = [a for a in actors if a.get("class_name") == "cartpole_ppo_trial" and a["state"] == "ALIVE"]
            if named:
                sockets = listening([proc.pid, *_ray_processes(env["RAY_TMPDIR"])])
                try:
                    urllib.request.urlopen(f"{dashboard}/api/v0/actors?limit=1", timeout=10)
                    no_token = 200
                except urllib.error.HTTPError as err:
                    no_token = err.code
                except OSError:  # a slow dashboard: asked again on the next round
                    continue
                found_actors = named
            rows = [ln for ln in text.splitlines() if ln.startswith("ray_rl_harness_return{")]
            if rows:
                found_metrics = rows
    finally:
        running = proc.poll() is None  # 3M steps a trial: minutes, where finding the actors takes seconds
        proc.send_signal(signal.SIGTERM)  # `kill` mid-study does what Ctrl-C does: Tune stops the trials, the
        # driver says how to go on (SIGINT itself: test_study__sigint_then_same_command_... and test_driver)
        rest = proc.communicate(timeout=120)[0]
    assert running, "the study ended before SIGTERM; give it more steps"
    assert proc.returncode == 130, rest
    assert "Resume with: python -m harness.study cartpole_ppo" in rest, rest
    assert found_actors, "no actor of class cartpole_ppo_trial"
    # nothing of the study (driver, Ray's processes, the trials) listens beyond loopback ...
    assert len(sockets) >= 5 and {port, int(dashboard.rpartition(":")[2])} <= {p for _, _, p in sockets}, sockets
    assert all(addr in ("127.0.0.1", "::1") for _, addr, _ in sockets), sorted(set(sockets))
    assert no_token == 401  # ... and the dashboard still asks for its token
    assert any("cartpole_ppo trial" in (a.get("repr_name") or "") for a in found_actors), found_actors
    assert found_metrics and all('study="cartpole_ppo"' in r and 'config="t000' in r and 'trial="' in r
                                 for r in found_metrics), found_metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
