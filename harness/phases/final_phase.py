"""The final phase: the top-k configurations and the default one (the control) re-trained on fresh seeds.

    final = final_phase.run(settings, folder, placement, guard)

Round r of every re-training kernel uses the same keys, so each configuration and the control
train and evaluate on the same seeds (common random numbers) and their differences are paired.
It runs once per set of recorded trials (``final.json`` names them); the re-trained policies of
the top configurations are kept for ``harness.play``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from harness import report
from harness.cluster.placement import Placement, final_width
from harness.driver import progress
from harness.driver.guard import DiskGuard
from harness.driver.settings import Settings
from harness.kernel.plan import FINAL, TrialPlan
from harness.reports import lineage
from harness.space import Budget, label
from harness.store.folder import ResultsFolder
from harness.store.records import FinalConfig, FinalRecord, TrialRecord, config_id, write_json

CONTROL = "default"  # the control's id in final.json and the reports
NEW_SHAPE_COMPILE_S = 30.0  # a kernel shape the search never compiled, on a CPU: init, chunk and evaluation
T = TypeVar("T")
RunPlans = Callable[[list[TrialPlan]], list[dict[str, Any] | None]]  # each plan's last result (None: failed)


@dataclass(frozen=True)
class Candidate:
    """A configuration to re-train: its searched values, static config, initial hyperparameters,
    and (a PBT configuration) the schedule of its lineage and the configurations it came from."""

    params: dict[str, Any]
    static: dict[str, Any]
    hparams: dict[str, float]
    schedule: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    lineage: list[str] | None = None


def run(settings: Settings, folder: ResultsFolder, placement: Placement, guard: DiskGuard, *,
        run_plans: RunPlans | None = None, say: Callable[[str], None] = progress.say) -> FinalRecord | None:
    """Re-trains the top configurations and the control; returns what it wrote to final.json
    (None when the study keeps no top-k, nothing finished, or final.json is already up to date).

    ``run_plans`` runs the kernels (default: a grid of Tune trials, :func:`tune_plans`).
    """
    budget = settings.budget(placement.kind)
    if settings.study.top_k < 1:
        return None
    records = folder.trials()
    numbers = sorted(r.trial for r in records)
    old = folder.final()
    if old and old.trials == numbers:
        return None
    configs, _, _ = report.tables(folder)
    top = configs[configs["rank"].notna()].head(settings.study.top_k) if len(configs) else configs
    if not len(top):
        say("no configuration finished without diverging; nothing to re-evaluate")
        return None
    candidates = {cid: candidate(records, cid) for cid in top["config_id"]}
    params, static, hparams = settings.control(budget.timesteps)
    candidates[CONTROL] = Candidate(params, static, hparams)
    rounds = rounds_of(settings, budget)
    plans, members = final_plans(settings, budget, candidates, records, rounds)
    widths = ", ".join(sorted({str(len(p.hparams)) for p in plans}))
    say(f"re-training the top {len(top)} configurations and the default one on {rounds * budget.seeds} fresh "
        f"seeds ({len(plans)} kernels, {widths} configs x {budget.seeds} seeds) ...")
    run_plans = run_plans or (lambda p: tune_plans(settings, folder, placement, guard, p))
    runs = collect(plans, members, run_plans(plans))
    out = {}
    for cid, c in candidates.items():
        parts = runs[cid]
        out[cid] = FinalConfig(
            cid, params=c.params, hparams=c.hparams, static=c.static, **joined(parts)._asdict(),
            plans=[{"plan": dataclasses.asdict(plan), "config_index": i} for plan, i, _ in parts],
            command=train_command(settings, folder, c, rounds * budget.seeds, cid),
            schedule=c.schedule or None, lineage=c.lineage if c.schedule else None)
        if not out[cid].failed and cid != CONTROL:
            keep_policies(settings, folder, cid, c, parts)
    control = out.pop(CONTROL)
    final = FinalRecord(list(out.values()), trials=numbers, control=control, objective=settings.study.objective)
    folder.write_final(final)
    return final


Part = tuple[TrialPlan, int, dict[str, Any] | None]  # a kernel, a candidate's index in it, its result


def collect(plans: list[TrialPlan], members: list[list[str]],
            results: list[dict[str, Any] | None]) -> dict[str, list[Part]]:
    """Each candidate's parts: the kernels that trained it (one per round of seeds)."""
    runs: dict[str, list[Part]] = {}
    for plan, batch, res in zip(plans, members, results, strict=True):
        for i, cid in enumerate(batch):
            runs.setdefault(cid, []).append((plan, i, res))
    return runs


class Joined(NamedTuple):
    """A candidate's per-seed results over its rounds, in seed order (None: a kernel failed)."""

    failed: bool
    scores: list[float | None] | None
    final_returns: list[float | None] | None
    diverged: list[bool | None] | None


def joined(parts: list[Part]) -> Joined:
    failed = any(res is None for _, _, res in parts)
    return Joined(failed, *(None if failed else [v for _, i, res in parts for v in res[key][i]]  # type: ignore[index]
                            for key in ("scores", "final_returns", "diverged")))


def rounds_of(settings: Settings, budget: Budget) -> int:
    """Rounds of S fresh seeds the re-training runs (at least the study's final_seeds in all)."""
    return -(-settings.study.final_seeds // budget.seeds)


def candidate(records: list[TrialRecord], cid: str) -> Candidate:
    """A recorded configuration as a candidate: a PBT configuration replays its lineage's schedule."""
    rec, conf = next((r, c) for r in records for c in r.configs if config_id(r.trial, c.index) == cid)
    if not rec.pbt:
        return Candidate(conf.params, rec.static, conf.hparams or {})
    initial, schedule, chain = lineage.schedule(rec, conf.index)
    return Candidate(conf.params, rec.static, initial, schedule, [config_id(rec.trial, i) for i in chain])


def final_plans(settings: Settings, budget: Budget, candidates: dict[str, Candidate],
                records: list[TrialRecord], rounds: int) -> tuple[list[TrialPlan], list[list[str]]]:
    """The re-training kernels and the candidates each holds (in order; a short batch padded with
    its first). Candidates sharing a static config share kernels, ``rounds`` rounds of S fresh
    seeds each; as wide as the search (its kernels are compiled) or as narrow as the group,
    whichever costs less (:func:`harness.cluster.placement.final_width`, from the search's own timings)."""
    groups: dict[str, list[str]] = {}
    for cid, c in candidates.items():
        groups.setdefault(json.dumps(c.static, sort_keys=True), []).append(cid)
    plans, members = [], []
    for ids in groups.values():
        static = candidates[ids[0]].static
        timed = [r for r in records if r.static == static and r.status == "complete"
                 and r.kernel_seconds is not None and r.compile_seconds is not None]
        # a kernel's time for one configuration's budget (a lane trial trains several budgets' worth)
        kernel_s = [r.kernel_seconds * budget.timesteps / max(r.env_steps, 1) for r in timed]  # type: ignore[operator]
        # a new width compiles from scratch: at least the study's slowest compile, which the
        # persistent cache can make a load of a few seconds (NEW_SHAPE_COMPILE_S as the floor)
        compiled = [r.compile_seconds for r in records if r.compile_seconds is not None]
        width = final_width(len(ids), budget.configs_per_trial, rounds=rounds,
                            kernel_s=statistics.median(kernel_s) if timed else None,
                            compile_s=max([NEW_SHAPE_COMPILE_S, *compiled]) if timed else None)
        for start in range(0, len(ids), width):
            batch = ids[start:start + width]
            padded = batch + [batch[0]] * (width - len(batch))
            hps = [candidates[i].hparams for i in padded]
            schedule = lineage.merge([candidates[i].schedule for i in padded], hps) or None
            for r in range(rounds):
                plans.append(settings.plan(static, hps, seeds=budget.seeds, trial=r, stream=FINAL,
                                           schedule=schedule))
                members.append(batch)
    return plans, members


def tune_plans(settings: Settings, folder: ResultsFolder, placement: Placement, guard: DiskGuard,
               plans: list[TrialPlan]) -> list[dict[str, Any] | None]:
    """Runs each plan as a Tune trial; the last result of each (None where it failed), with the
    folder of its final checkpoint (the trained policies)."""
    from ray import tune  # Ray: once the study's session has started it, never at import

    from harness.cluster import tuning

    grid = tuning.run(settings, folder, placement, guard, kind="final",
                      param_space={"plan": tune.grid_search([dataclasses.asdict(p) for p in plans]),
                                   **_trial_context(settings, placement)})
    folder.drop_kernel_checkpoints(run="final-*")  # once re-trained, no retry needs them
    done = {}
    for r in grid:  # type: ignore[attr-defined]  # ResultGrid is iterable (it has __getitem__ and __len__)
        if r.error is None and r.metrics.get("final"):
            done[json.dumps(r.config["plan"], sort_keys=True)] = {
                **r.metrics, "checkpoint": r.checkpoint.path if r.checkpoint else ""}
    return [done.get(json.dumps(dataclasses.asdict(p), sort_keys=True)) for p in plans]


def _trial_context(settings: Settings, placement: Placement) -> dict[str, Any]:
    """What a re-training trial's config holds beside its plan."""
    return {"device": placement.device, "study": settings.study.name}


def tune_streamed(settings: Settings, folder: ResultsFolder, placement: Placement, guard: DiskGuard,
                  work: Callable[[RunPlans], T]) -> T:
    """``work(run_plans)``, where every call of ``run_plans`` becomes trials of ONE Tune run, so
    the same actors (their imports, their compiled kernels) serve call after call: for work that
    decides its next plans from the last ones' results (the ablation path, one call per step).
    ``work`` runs in a thread while Tune drives the trials in this one (Ctrl-C reaches Tune).

    Raises:
        KeyboardInterrupt: the run was stopped (Ctrl-C, SIGTERM) before ``work`` finished.
        StudyError: the results disk refused a write meanwhile.
    """
    import threading

    from harness.cluster import tuning  # Ray Tune: never at import

    feed = tuning.PlanFeed(lambda plan: {"plan": dataclasses.asdict(plan), **_trial_context(settings, placement)})
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["value"] = work(feed.run)
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread below
            out["error"] = err
        finally:
            feed.close()

    thread = threading.Thread(target=body, name="plan-feed", daemon=True)
    thread.start()
    try:
        tuning.run(settings, folder, placement, guard, kind="final", searcher=feed, num_samples=-1)
    finally:
        feed.close()  # the run ended first: a batch still waiting raises FeedStopped in ``work``
        thread.join()
        folder.drop_kernel_checkpoints(run="final-*")
    if isinstance(out.get("error"), tuning.FeedStopped):
        raise KeyboardInterrupt
    if "error" in out:
        raise out["error"]
    return out["value"]


def keep_policies(settings: Settings, folder: ResultsFolder, cid: str, c: Candidate, parts: list) -> None:
    """Keeps the re-trained policies of ``cid`` (seed_K.msgpack) with ``policy.json``: everything
    needed to rebuild the policy, and each seed's evaluation. Keeps none rather than half when
    a checkpoint did not come back (e.g. a retried trial)."""
    files: list[Path] = []
    seeds: list[dict[str, Any]] = []
    for plan, i, res in parts:
        for s in range(plan.seeds):
            src = Path(res.get("checkpoint") or "") / f"c{i}_s{s}.msgpack"
            if not res.get("checkpoint") or not src.exists():
                folder.drop_policies(cid)  # never an older re-training's policies under this id
                return
            # "score": the deterministic evaluation at save time (harness.play repeats it); the
            # objective's value is "objective_value"
            seeds.append({"seed": len(files), "score": res["final_returns"][i][s],
                          "objective_value": res["scores"][i][s], "diverged": res["diverged"][i][s],
                          "plan": dataclasses.asdict(plan), "config_index": i, "seed_index": s})
            files.append(src)
    study = settings.study
    folder.keep_policies(cid, files, {"config_id": cid, "study": study.name, "env": study.env, "algo": study.algo,
                                      "config": c.static, "hparams": c.hparams, "seeds": seeds})


def train_command(settings: Settings, folder: ResultsFolder, c: Candidate, seeds: int, cid: str) -> str:
    """The ``harness.train`` command that trains this configuration (a schedule is written to
    ``schedules/<cid>.json`` and replayed with ``--schedule``)."""
    sets = [f"{k}={label(tuple(v) if isinstance(v, list) else v)}" for k, v in c.static.items()
            if k != "total_timesteps"] + [f"{k}={v:.6g}" for k, v in c.hparams.items()]
    args = ["python", "-m", "harness.train", "--algo", settings.study.algo, "--env", settings.study.env,
            "--seeds", str(seeds), "--timesteps", str(c.static["total_timesteps"])]
    for s in sets:
        args += ["--set", s]
    if c.schedule:
        path = folder.schedule_file(cid)
        write_json(path, c.schedule)
        args += ["--schedule", str(path)]
    return shlex.join(args)
