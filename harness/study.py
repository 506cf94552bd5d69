"""Run (or resume) a named hyperparameter study: Ray Tune trials of C configs x S seeds per kernel.

    python -m harness.study cartpole_ppo              # embedded local Ray on 127.0.0.1
    python -m harness.study cartpole_ppo --smoke      # a tiny budget: about a minute on a laptop
    python -m harness.study cartpole_ppo --address auto   # an existing Ray cluster
    python -m harness.study --list

The same command resumes an interrupted study: finished trials are kept, the rest are run.
Results go to OUT/NAME (OUT/NAME-smoke for --smoke): the Optuna study (SQLite), Ray Tune's
experiment folders, one JSON record per trial, and reports/ (configs.csv, seeds.csv,
curves.csv, best.json), rebuilt at any time by `python -m harness.report OUT/NAME`.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from harness.cli import Parser
from harness.cluster.placement import Placement
from harness.cluster.session import ClusterError
from harness.driver.settings import Options, Settings, prepare_folder, resolve
from harness.space import SCHEDULERS, Budget, StudyError
from harness.store.folder import ResultsFolder, StudyMeta
from harness.store.records import RecordsError, disk_problem


def _parser() -> argparse.ArgumentParser:
    p = Parser("python -m harness.study", __doc__)
    p.add_argument("name", nargs="?", help="a registered study (see --list)")
    p.add_argument("--list", action="store_true", help="list the studies with one-line descriptions")
    p.add_argument("--trials", type=int, help="Ray Tune trials in total (the study's default for the device)")
    p.add_argument("--configs-per-trial", type=int, help="configurations C trained together in one kernel")
    p.add_argument("--seeds", type=int, help="training seeds S per configuration")
    p.add_argument("--timesteps", type=int, help="env steps per seed")
    p.add_argument("--out", default="results", help="results folder (default: results/)")
    p.add_argument("--address", help="an existing Ray cluster ('auto', host:port or ray://host:port); "
                                     "default: embedded local Ray")
    p.add_argument("--storage", help="Optuna storage URL (default: SQLite in the results folder)")
    p.add_argument("--sampler", choices=("tpe", "random", "qmc"), default="tpe",
                   help="Optuna sampler proposing configurations (default: tpe)")
    p.add_argument("--fresh", action="store_true", help="start over; the old results folder is kept aside")
    p.add_argument("--smoke", action="store_true", help="a tiny budget (about a minute on a laptop CPU)")
    p.add_argument("--scheduler", choices=SCHEDULERS,
                   help="asha: stop the worse half of the trials at the halfway rung; lanes: successive "
                        "halving of each configuration at 1/9 and 1/3 of its budget inside the trial's kernel, "
                        "whose stopped lanes take new configurations; pbt: population-based "
                        "training inside each trial's kernel; none: run every trial to the end (default: the "
                        "study's, usually asha)")
    p.add_argument("--no-asha", action="store_true", help="the same as --scheduler none")
    p.add_argument("--time", metavar="DURATION",
                   help="a wall-clock budget for the whole study on this machine ('5m', '90s', '1h30m'): trials "
                        "of the study's shape run until the search's share is spent, the rest is kept for the "
                        "re-training, the ablation path and the reports. A resumed study gets it anew for what "
                        "is left. A time too short for one trial is refused with the shortest that fits")
    p.add_argument("--checkpoint-every", metavar="EVERY", default="60s",
                   help="how often a running trial saves its whole kernel, so a trial whose worker or driver "
                        "died goes on from there: seconds ('60s', the default; stretched to keep saving under "
                        "5%% of a trial's time), chunks ('4chunks') or 'never'")
    p.add_argument("--top-k", type=int, metavar="K",
                   help="configurations re-trained on fresh seeds at the end, beside the default one "
                        "(default: the study's, usually 3; 0: no final re-training)")
    p.add_argument("--no-ablation", action="store_true",
                   help="skip the ablation path (the default configuration switched to the best one "
                        "hyperparameter by hyperparameter, re-trained after the top-k)")
    p.add_argument("--device-memory", metavar="SIZE",
                   help="memory a device gives trials (e.g. 40GiB); default: measured on a GPU, unlimited on "
                        "a CPU. Trial shapes that do not fit run their configurations in sub-batches")
    return p


def main(argv: list[str] | None = None) -> int:
    from harness.kernel.device import driver_on_cpu

    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    driver_on_cpu()  # the driver never takes GPU memory; the trials' processes do
    resume = resume_command(argv)
    try:
        if args.list:
            import studies

            if args.name:  # a name and --list: which was meant is unclear
                raise StudyError(f"--list takes no study name (got {args.name!r}); python -m harness.study "
                                 "--list lists the studies, python -m harness.study NAME runs one")

            for name, s in studies.registered().items():
                print(f"{name:16} {s.description}")
            return 0
        if not args.name:
            raise StudyError("name a study (python -m harness.study --list shows them)")
        settings, folder, stored = _resolve(args, resume)
        return execute(settings, folder, stored)
    except (StudyError, RecordsError, ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the results disk full or read-only before the study ran
        if disk_problem(err) is None:
            raise
        print(f"error: cannot write {err.filename or 'the results'} ({err.strerror})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted; finished trials are saved. Resume with: {resume}", file=sys.stderr)
        return 130


def resume_command(argv: list[str]) -> str:
    """The command that goes on with this study (the same one, without ``--fresh``)."""
    return shlex.join(["python", "-m", "harness.study", *[a for a in argv if a != "--fresh"]])


def _resolve(args: argparse.Namespace, resume: str) -> tuple[Settings, ResultsFolder, StudyMeta | None]:
    """argv's last stop: the study, its results folder (set aside with --fresh) and the settings."""
    import studies

    if args.no_asha and args.scheduler not in (None, "none"):
        raise StudyError(f"--no-asha is --scheduler none: it cannot go with --scheduler {args.scheduler}")
    study = studies.get(args.name)
    folder = ResultsFolder(Path(args.out).resolve() / (study.name + ("-smoke" if args.smoke else "")))
    options = Options(trials=args.trials, configs_per_trial=args.configs_per_trial, seeds=args.seeds,
                      timesteps=args.timesteps, scheduler="none" if args.no_asha else args.scheduler,
                      checkpoint_every=args.checkpoint_every, device_memory=args.device_memory,
                      sampler=args.sampler, storage=args.storage, address=args.address, smoke=args.smoke,
                      top_k=args.top_k, ablation=not args.no_ablation, time=args.time)
    if args.fresh:  # checked in full before the old results are moved aside
        settings = resolve(study, options, stored=None, folder=folder, resume_command=resume)
        stored, aside = prepare_folder(folder, study.name, fresh=True)
        if aside:
            print(f"kept the previous results aside in {aside}")
        return settings, folder, stored
    stored, _ = prepare_folder(folder, study.name, fresh=False)
    return resolve(study, options, stored=stored, folder=folder, resume_command=resume), folder, stored


def execute(settings: Settings, folder: ResultsFolder, stored: StudyMeta | None) -> int:
    """Runs a resolved study: Ray up, the missing trials searched, the best re-trained, reports
    and a summary. Returns the exit status (130: interrupted, resumable).

    Raises:
        StudyError: the results disk refused a write (one line; nothing recorded is lost), and
            every error a phase raises in one line.
    """
    from harness import report
    from harness.cluster import placement, session
    from harness.driver import summary
    from harness.driver.guard import DiskGuard
    from harness.kernel.device import cache_dir
    from harness.phases import ablation, final_phase, search_phase

    started = time.monotonic()
    guard = DiskGuard(folder, settings.resume_command)
    try:
        with session.session(settings, folder) as urls:
            place = placement.placement(cache_dir())
            budget = settings.budget(place.kind)
            place = placement.fit_trials(settings, budget, place)
            settings = settings.with_rounds(budget, place.slots, stored)  # the slots the trials fit in
            settings = settings.with_optuna_study(stored, own_storage=settings.storage == folder.optuna_url())
            created = datetime.datetime.now().isoformat(timespec="seconds")
            folder.write_meta(settings.meta(budget, stored, created))  # its own trials: a resume without --time
            plan = time_plan(settings, budget, place, started) if settings.time_s else None
            if plan:
                settings, budget = settings.with_open_trials(place.kind)
            for line in header(settings, budget, place, folder, *urls):
                print(line, flush=True)
            if plan:
                print(plan.describe(budget.configs_per_trial, budget.seeds, budget.timesteps), flush=True)
            before = {r.trial for r in folder.trials()}
            phases, mark = {}, time.monotonic()
            outcome = search_phase.run(settings, folder, place, guard, timeplan=plan)
            phases["search"], mark = time.monotonic() - mark, time.monotonic()
            if outcome.interrupted:
                report.build(folder)
                print(f"\ninterrupted: {outcome.done}/{outcome.total} trials saved in {folder}. "
                      f"Resume with: {settings.resume_command}", file=sys.stderr)
                return 130
            final_phase.run(settings, folder, place, guard)
            phases["final"], mark = time.monotonic() - mark, time.monotonic()
            ablation.run(settings, folder, place, guard)
            phases["ablation"] = time.monotonic() - mark
            paths = report.build(folder)
            total = time.monotonic() - started
            searched = [r for r in folder.trials() if r.trial not in before]
            summary.show(paths, done=outcome.done, minutes=total / 60, ablation=folder.ablation(),
                         timing=summary.time_line(total, phases, searched, place.slots))
            return 0
    except (StudyError, RecordsError, ClusterError, KeyboardInterrupt):
        raise
    except Exception as err:  # the results disk full or read-only: one line, nothing recorded is lost
        if guard.note(err):
            raise guard.error() from None
        raise


def time_plan(settings: Settings, budget: Budget, place: Placement, started: float) -> Any:
    """The ``--time`` plan: one trial's kernel compiled and timed here (on a CPU; on a GPU the
    driver cannot time the trials' device, so the plan starts from the first trials' own times).

    Raises:
        StudyError: the time is too short for one trial, the re-training and the ablation path.
    """
    from harness.driver import timeplan
    from harness.kernel.device import cache_dir
    from harness.phases import final_phase
    from harness.space import static_points

    s = settings.study
    statics = list(static_points(s, set(settings.config_fields)))
    final_k, abl_k = timeplan.kernels_after_search(
        s.top_k, final_phase.rounds_of(settings, budget), budget.configs_per_trial, len(s.space),
        len(statics) > 1, settings.ablation)
    compile_s = kernel_s = 0.0
    if place.kind == "cpu":
        params, static, hparams = settings.control(budget.timesteps)
        probe = settings.plan(static, [hparams] * budget.configs_per_trial, seeds=budget.seeds, trial=0)
        print(f"--time: timing one trial's kernel on this machine ({budget.configs_per_trial} configs x "
              f"{budget.seeds} seeds; its compile is kept for the trials) ...", flush=True)
        try:
            compile_s, kernel_s = timeplan.calibrate(probe, cache_dir())
        except Exception as err:  # the study's own kernel fails: said here as a trial would say it
            why = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
            raise StudyError(f"--time: timing one trial's kernel of {s.name} failed: {why}") from None
    plan = timeplan.TimePlan(total_s=settings.time_s or 0.0, started=started, kernel_s=kernel_s,
                             compile_s=compile_s, slots=place.slots, final_kernels=final_k,
                             ablation_kernels=abl_k, shapes=max(len(statics), 1))
    if place.kind == "cpu" and plan.total_s < plan.minimum_s():
        need = timeplan.fmt_duration(plan.minimum_s())
        raise StudyError(f"--time {timeplan.fmt_duration(plan.total_s)} is too short for even one trial of "
                         f"{s.name} on this machine (a trial's kernel {kernel_s:.0f} s, its compile "
                         f"{compile_s:.0f} s, then the re-training and the ablation path): give --time {need} "
                         "or more")
    return plan


def header(settings: Settings, budget: Budget, place: Placement, folder: ResultsFolder,
           dashboard: str | None, metrics: str | None) -> list[str]:
    """What a study prints before its first trial: shape, objective, where results and Ray are."""
    from harness.kernel.stats import describe_objective

    s = settings.study
    trials = "trials for --time" if settings.time_s else f"{budget.trials} trials"
    out = [f"study {s.name}: {trials} x {budget.configs_per_trial} configs x {budget.seeds} seeds x "
           f"{budget.timesteps:,} steps on {place.kind} ({place.slots} trial{'s' * (place.slots != 1)} at a time)",
           f"objective: {describe_objective(s.objective, s.threshold, s.config.get('eval_policy', 'greedy'))}; "
           f"{s.metric} over seeds, {s.direction}d",
           f"results: {folder}"]
    if settings.scheduler == "lanes":
        from harness.lanes.trial import ETA, rungs

        steps = ", ".join(f"{x:,}" for x in rungs(max(1, budget.timesteps // ETA**2), budget.timesteps))
        n, rounds = settings.tune_trials(budget), settings.lane_rounds(budget)
        out.insert(1, f"scheduler: lanes: {n} trial{'s' * (n != 1)}, each as long as {rounds:.3g}, "
                      f"its {budget.configs_per_trial} lanes refilled with new configurations; each configuration "
                      f"judged at {steps} env steps (successive halving: the top 1/{ETA} go on)")
    if dashboard:
        out.append(f"Ray dashboard: {dashboard} (token: `ray get-auth-token`; trials are the actors named "
                   f"{s.name}_trial)")
    if metrics:
        out.append(f"Prometheus metrics: {metrics} (rl_harness_* by study, trial, config)")
    return out


if __name__ == "__main__":
    sys.exit(main())
