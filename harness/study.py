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
import dataclasses
import datetime
import logging
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from harness import lineage
from harness.cluster import ClusterError
from harness.records import (
    RecordsError,
    config_id,
    disk_problem,
    load_final,
    load_meta,
    load_trials,
    trial_path,
    writable,
    write_json,
)
from harness.space import Budget, Study, StudyError, label

# Budget options that must stay the same when a study is resumed (trials may grow).
_FIXED = ("configs_per_trial", "seeds", "timesteps")
CONTROL = "default"  # the control's id in final.json and the reports
REPORT_EVERY = 10.0  # seconds between rebuilds of the CSV reports while trials finish
SESSION_FILE = "ray-session.json"  # the embedded Ray of the driver running this study


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="a registered study (see --list)")
    p.add_argument("--list", action="store_true", help="list the studies with one-line descriptions")
    p.add_argument("--trials", type=int, help="Ray Tune trials in total (the study's default for the device)")
    p.add_argument("--configs-per-trial", type=int, help="configurations C trained together in one kernel")
    p.add_argument("--seeds", type=int, help="training seeds S per configuration")
    p.add_argument("--timesteps", type=int, help="env steps per seed")
    p.add_argument("--out", default="results", help="results folder (default: results/)")
    p.add_argument("--address", help="an existing Ray cluster ('auto' or host:port); default: embedded local Ray")
    p.add_argument("--storage", help="Optuna storage URL (default: SQLite in the results folder)")
    p.add_argument("--sampler", choices=("tpe", "random", "qmc"), default="tpe",
                   help="Optuna sampler proposing configurations (default: tpe)")
    p.add_argument("--fresh", action="store_true", help="start over; the old results folder is kept aside")
    p.add_argument("--smoke", action="store_true", help="a tiny budget (about a minute on a laptop CPU)")
    p.add_argument("--scheduler", choices=("asha", "pbt", "none"),
                   help="asha: stop the worse half of the trials at the halfway rung; pbt: population-based "
                        "training inside each trial's kernel; none: run every trial to the end (default: the "
                        "study's, usually asha)")
    p.add_argument("--no-asha", action="store_true", help="the same as --scheduler none")
    p.add_argument("--checkpoint-every", metavar="EVERY", default="60s",
                   help="how often a running trial saves its whole kernel, so a trial whose worker or driver "
                        "died goes on from there: seconds ('60s', the default; stretched to keep saving under "
                        "5%% of a trial's time), chunks ('4chunks') or 'never'")
    p.add_argument("--device-memory", metavar="SIZE",
                   help="memory a device gives trials (e.g. 40GiB); default: measured on a GPU, unlimited on "
                        "a CPU. Trial shapes that do not fit run their configurations in sub-batches")
    return p


def main(argv: list[str] | None = None) -> int:
    from harness.device import driver_on_cpu

    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    driver_on_cpu()  # the driver never takes GPU memory; the trials' processes do
    try:
        if args.list:
            import studies

            for name, s in studies.registered().items():
                print(f"{name:16} {s.description}")
            return 0
        if not args.name:
            raise StudyError("name a study (python -m harness.study --list shows them)")
        return Runner(args, argv).run()
    except (StudyError, RecordsError, ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the results disk full or read-only before the study ran
        if disk_problem(err) is None:
            raise
        print(f"error: cannot write {err.filename or 'the results'} ({err.strerror})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted; finished trials are saved. Resume with: {_resume_cmd(argv)}", file=sys.stderr)
        return 130


def _resume_cmd(argv: list[str]) -> str:
    return shlex.join(["python", "-m", "harness.study", *[a for a in argv if a != "--fresh"]])


class Runner:
    """One invocation of a study: set up, run the missing trials, re-train the best, report."""

    def __init__(self, args: argparse.Namespace, argv: list[str]) -> None:
        import algos
        import envs
        import studies

        self.args, self.argv = args, argv
        self.study: Study = studies.get(args.name)
        try:
            self.spec = algos.get(self.study.algo)
            env, env_params = envs.make(self.study.env)
            envs.check(env, env_params)  # before Ray starts: a broken env fails here, in one line
        except (algos.UnknownAlgoError, envs.UnknownEnvError, envs.EnvContractError) as err:
            raise StudyError(f"study {self.study.name}: {err}") from None
        self.root = Path(args.out).resolve() / (self.study.name + ("-smoke" if args.smoke else ""))
        self.config_fields = {f.name for f in dataclasses.fields(self.spec.config_cls)}
        self.started = time.monotonic()
        self.scheduler = "none" if args.no_asha else (getattr(args, "scheduler", None) or self.study.scheduler)
        self.best: tuple[float, str, dict] | None = None
        self.running_steps: dict[str, int] = {}
        self.done = 0
        self.disk_error: str | None = None  # set when the results disk refuses writes: the study stops
        self.last_report = -math.inf

    # -- setup -------------------------------------------------------------------------------
    def _prepare_folder(self) -> dict[str, Any] | None:
        if self.args.fresh and self.root.exists():
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            aside = self.root.with_name(f"{self.root.name}.old-{stamp}")
            self.root.rename(aside)
            print(f"kept the previous results aside in {aside}")
        if not self.root.exists():
            return None
        if not (self.root / "study.json").exists():
            if any(self.root.iterdir()):
                raise StudyError(f"{self.root} exists and is not a study's results folder; "
                                 "choose another --out or use --fresh")
            return None
        meta = load_meta(self.root)
        if meta.get("study") != self.study.name:
            raise StudyError(f"{self.root} holds study {meta.get('study')!r}, not {self.study.name!r}; "
                             "choose another --out or use --fresh")
        return meta

    def _budget(self, kind: str, meta: dict[str, Any] | None) -> Budget:
        a = self.args
        base = self.study.smoke if a.smoke else (self.study.gpu if kind == "gpu" else self.study.cpu)
        given = {"trials": a.trials, "configs_per_trial": a.configs_per_trial, "seeds": a.seeds,
                 "timesteps": a.timesteps}
        values = {**dataclasses.asdict(base), **{k: v for k, v in given.items() if v is not None}}
        if meta:
            stored = meta["budget"]
            for k in _FIXED:
                if given[k] is not None and given[k] != stored[k]:
                    raise StudyError(f"{self.root} was started with --{k.replace('_', '-')} {stored[k]}; "
                                     f"resume with the same value or use --fresh")
                values[k] = stored[k]
            if given["trials"] is None:
                values["trials"] = stored["trials"]
        return Budget(**values)

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> int:
        from harness import cluster
        from harness.placement import parse_bytes
        from harness.space import validate
        from harness.stats import describe_objective

        meta = self._prepare_folder()
        self.checkpoint_every = parse_checkpoint_every(self.args.checkpoint_every)
        # Fail fast, before Ray starts: the budget's values and the search space at its size.
        early = self._budget("cpu", meta)
        validate(self.study, self.spec.config_cls, self.spec.hparams_cls, timesteps=early.timesteps)
        self._validate_pbt(early)
        self.device_bytes = parse_bytes(self.args.device_memory) if self.args.device_memory else None
        if not self.args.address:  # what a killed driver's embedded Ray left running is stopped first
            cluster.stop_leftovers(self.root / SESSION_FILE)
        dashboard, metrics = cluster.start(self.args.address, code_dir=self.study.source and
                                           str(Path(self.study.source).parent))
        if not self.args.address:
            cluster.note_session(self.root / SESSION_FILE)
        try:
            place = cluster.placement(_cache_dir())
            budget = self._budget(place.kind, meta)
            validate(self.study, self.spec.config_cls, self.spec.hparams_cls, timesteps=budget.timesteps)
            self._validate_pbt(budget)
            place = self._fit_memory(place, budget)
            place = dataclasses.replace(place, device={**place.device, **self.checkpoint_every})
            if meta is None:
                meta = {"study": self.study.name, "env": self.study.env, "algo": self.study.algo,
                        "direction": self.study.direction, "metric": self.study.metric,
                        "objective": self.study.objective, "threshold": self.study.threshold,
                        "scheduler": self.scheduler,
                        "seed": self.study.seed,
                        "budget": dataclasses.asdict(budget), "smoke": self.args.smoke,
                        "created": datetime.datetime.now().isoformat(timespec="seconds")}
            meta["budget"] = dataclasses.asdict(budget)
            meta["space"] = {name: _kind(dist) for name, dist in self.study.space.items()}
            meta["eval_policy"] = self.study.config.get("eval_policy", "greedy")
            meta["reference"] = (None if self.study.reference is None else
                                 {"label": self.study.reference_label, "return": self.study.reference})
            write_json(self.root / "study.json", meta)
            self.budget, self.place = budget, place
            print(f"study {self.study.name}: {budget.trials} trials x {budget.configs_per_trial} configs x "
                  f"{budget.seeds} seeds x {budget.timesteps:,} steps on {place.kind} "
                  f"({place.slots} trials at a time)")
            policy = self.study.config.get("eval_policy", "greedy")
            print(f"objective: {describe_objective(self.study.objective, self.study.threshold, policy)}; "
                  f"{self.study.metric} over seeds, {self.study.direction}d")
            print(f"results: {self.root}")
            if dashboard:
                print(f"Ray dashboard: {dashboard} (token: `ray get-auth-token`; trials are the actors "
                      f"named {self.study.name}_trial)")
            if metrics:
                print(f"Prometheus metrics: {metrics} (rl_harness_* by study, trial, config)")
            return self._search_and_finish()
        except (StudyError, RecordsError, ClusterError, KeyboardInterrupt):
            raise
        except Exception as err:  # the results disk full or read-only: one line, nothing recorded is lost
            if (problem := disk_problem(err, self.root)) is None:
                raise
            self.disk_error = problem
            self._stop_if_disk_error()
            raise
        finally:
            import ray

            ray.shutdown()

    def _search_and_finish(self) -> int:
        from harness import report
        from harness.search import open_study, reconcile

        storage = self.args.storage or f"sqlite:///{self.root / 'optuna.db'}"
        records = load_trials(self.root)
        for rec in records:
            self._note_best(rec)
        self.done = len(records)
        # The sampler's seed moves on with the study, so a resumed study does not replay the
        # proposals it made before it was interrupted.
        try:
            ostudy = open_study(self.study, storage,
                                seed=self.study.seed * 1_000_003 + _count_trials(storage, self.study.name),
                                sampler=self.args.sampler)
        except Exception as err:  # sqlalchemy/optuna raise many kinds for a bad URL
            raise StudyError(f"cannot open Optuna storage {storage!r}: {str(err).splitlines()[0]}") from None
        self.adopt = self._in_flight(ostudy, records)[:max(0, self.budget.trials - self.done)]
        stale = reconcile(ostudy, records, keep={n for e in self.adopt for n in e["optuna_numbers"]})
        if self.done or stale or self.adopt:
            going_on = ", ".join(f"trial {e['trial']} " + ("from its checkpoint" if e["resume_from"]
                                                            else "from the start (no checkpoint)")
                                 for e in self.adopt)
            print(f"resuming: {self.done} trials recorded" + (f", {stale} interrupted Optuna trials marked FAIL"
                                                            if stale else "") +
                  (f"; in flight when stopped: {going_on}" if going_on else ""))
        remaining = self.budget.trials - self.done
        if remaining > 0:
            interrupted = self._tune(ostudy, remaining)
            if interrupted:
                report.build(self.root)
                print(f"\ninterrupted: {self.done}/{self.budget.trials} trials saved in {self.root}. "
                      f"Resume with: {_resume_cmd(self.argv)}", file=sys.stderr)
                return 130
        self._final()
        paths = report.build(self.root)
        self._summary(paths)
        return 0

    def _in_flight(self, ostudy: Any, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The trials a stopped driver left running (``inflight/NNNN.json`` without a record, their
        Optuna trials still RUNNING), each with ``resume_from``: its kernel checkpoints, newest first."""
        import optuna

        from harness.records import read_json
        from harness.trainable import KERNEL_FILE

        recorded = {r["trial"] for r in records}
        running = {t.number for t in ostudy.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
        out = []
        for path in sorted((self.root / "inflight").glob("*.json")):
            try:
                entry = read_json(path)
            except RecordsError as err:
                print(f"warning: {err}; that trial starts over as a new one", file=sys.stderr)
                path.unlink()
                continue
            if entry["trial"] in recorded or not set(entry["optuna_numbers"]) <= running:
                path.unlink()  # finished after all, or its Optuna trials were told meanwhile
                continue
            found = [p for tid in entry["tune_trial_ids"]
                     for p in (self.root / "tune").glob(f"*/trial_{tid}/checkpoint_*/{KERNEL_FILE}")]
            entry["resume_from"] = [str(p) for p in sorted(found, key=lambda p: (p.stat().st_mtime, p.parent.name),
                                                           reverse=True)]
            out.append(entry)
        return out

    def _on_suggest(self, entry: dict[str, Any]) -> None:
        write_json(self.root / "inflight" / f"{entry['trial']:04d}.json", entry)

    def _validate_pbt(self, budget: Budget) -> None:
        if self.scheduler != "pbt":
            return
        from harness.space import validate_pbt

        self.budget = budget
        validate_pbt(self.study, self.config_fields, configs_per_trial=budget.configs_per_trial,
                     chunks=min(self._chunks()))

    def _tune(self, ostudy: Any, remaining: int) -> bool:
        """Runs ``remaining`` Tune trials; True when the run was interrupted."""
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler, TrialScheduler

        from harness.search import BatchedOptunaSearcher
        from harness.trainable import trainable_for

        class RecordingASHA(ASHAScheduler):
            stopped: set[str] = set()

            def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
                action = super().on_trial_result(tune_controller, trial, result)
                if action == TrialScheduler.STOP:
                    self.stopped.add(trial.trial_id)
                return action

        chunks = self._max_chunks()
        scheduler = None if self.scheduler != "asha" or chunks < 3 else RecordingASHA(
            time_attr="training_iteration", metric="score", mode="max" if self.study.direction == "maximize"
            else "min", max_t=chunks, grace_period=halfway_rung(chunks), reduction_factor=2)
        searcher = BatchedOptunaSearcher(
            self.study, ostudy, static_names=self.study.static_names(self.config_fields),
            configs_per_trial=self.budget.configs_per_trial,
            plan_defaults=dict(env=self.study.env, algo=self.study.algo, seeds=self.budget.seeds,
                               study_seed=self.study.seed),
            timesteps=self.budget.timesteps, extra={"device": self.place.device},
            pbt=self.study.pbt_plan(self.config_fields) if self.scheduler == "pbt" else None,
            on_complete=self._on_record, on_suggest=self._on_suggest, adopt=self.adopt,
            is_pruned=lambda tid: scheduler is not None and tid in RecordingASHA.stopped)
        self._guard_disk(searcher)
        _DiskErrorLog.install(self)
        runs = len(list((self.root / "tune").glob("run-*"))) if (self.root / "tune").exists() else 0
        tuner = tune.Tuner(
            trainable_for(self.study.name, self.place.resources),
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=remaining,
                                        max_concurrent_trials=self.place.slots, reuse_actors=True,
                                        trial_dirname_creator=_trial_dirname),
            run_config=tune.RunConfig(name=f"run-{runs}", storage_path=str(self.root / "tune"), verbose=0,
                                      callbacks=[_Progress(self), _DiskWatch(self)], stop=_DiskWatch.stopper(self),
                                      failure_config=tune.FailureConfig(max_failures=2),
                                      checkpoint_config=tune.CheckpointConfig(num_to_keep=2)))
        tuner.fit()  # trials still running when it stops stay in inflight/ and RUNNING in Optuna: resumed next run
        self._stop_if_disk_error()
        return self.done < self.budget.trials

    def _stop_if_disk_error(self) -> None:
        if self.disk_error:
            raise StudyError(f"cannot write to the results folder {self.root} ({self.disk_error}); the trials "
                             f"recorded so far ({len(load_trials(self.root))}) are intact. Free space (or make "
                             f"it writable), then resume with: {_resume_cmd(self.argv)}") from None

    def _guard_disk(self, searcher: Any) -> Any:
        """A write to a full or read-only results disk inside the searcher's calls (records, Optuna's
        storage, inflight/) stops the study through :class:`_DiskWatch`, rather than failing inside
        Tune, which logs such errors and goes on. From then on the searcher does nothing: the trials
        stopped on the way out are neither recorded nor told, so the next run adopts them."""
        def guard(method: Any) -> Any:
            def guarded(*args: Any, **kwargs: Any) -> Any:
                if self.disk_error:
                    return None
                try:
                    return method(*args, **kwargs)
                except Exception as err:
                    if (problem := disk_problem(err, self.root)) is None:
                        raise
                    self.disk_error = problem
                    return None
            return guarded

        for name in ("suggest", "on_trial_result", "on_trial_complete"):
            setattr(searcher, name, guard(getattr(searcher, name)))
        return searcher

    def _fit_memory(self, place: Any, budget: Budget) -> Any:
        """Measures each static shape's device memory where the trials run (a one-off worker on
        a GPU) and decides trials per GPU and configurations per sub-batch; a shape that cannot
        fit even one configuration at a time stops the study here, in one line."""
        from harness import cluster
        from harness.kernel import TrialPlan
        from harness.placement import fmt_bytes
        from harness.space import static_points
        from harness.trainable import probe_shapes, shape_key

        stated = self.device_bytes
        if place.kind == "cpu" and stated is None:
            return place
        plans, names = {}, {}
        for point in static_points(self.study, self.config_fields):
            config = {**self.study.config, **point, "total_timesteps": budget.timesteps}
            plan = TrialPlan(env=self.study.env, algo=self.study.algo, config=config, seeds=budget.seeds,
                             hparams=[dict(self.study.hparams)] * budget.configs_per_trial, trial=0,
                             study_seed=self.study.seed)
            key = shape_key(config)
            plans[key] = dataclasses.asdict(plan)
            where = ", ".join(f"{k}={label(v)}" for k, v in point.items())
            names[key] = (f"study {self.study.name}" + (f" ({where})" if where else "") +
                          f", {budget.configs_per_trial} configs x {budget.seeds} seeds")
        print("measuring each trial shape's device memory ...", flush=True)
        fits = cluster.run_once(probe_shapes, plans, names, stated, place.device, gpu=place.kind == "gpu")
        if isinstance(fits, str):
            raise StudyError(fits)
        if fits is None:
            return place
        shapes, per_device = {}, []
        for key, f in fits.items():
            if self.scheduler == "pbt" and f["config_batch"] < budget.configs_per_trial:
                raise StudyError(f"{names[key]}: population-based training needs a trial's "
                                 f"{budget.configs_per_trial} configurations in one kernel, but only "
                                 f"{f['config_batch']} fit; lower --configs-per-trial or --seeds")
            per_device.append(f["per_device"])
            shapes[key] = {"config_batch": f["config_batch"]}
            if place.kind == "gpu":
                shapes[key]["gpu"] = math.floor(10_000 / f["per_device"]) / 10_000  # Ray's resource quantum
            split = (f", configurations in sub-batches of {f['config_batch']}"
                     if f["config_batch"] < budget.configs_per_trial else "")
            print(f"  {names[key]}: {fmt_bytes(f['need'])} per trial of {fmt_bytes(f['available'])}; "
                  f"{f['per_device']} at a time per device{split}")
        if place.kind == "gpu":
            gpus = place.slots * place.resources["gpu"]  # the placement gave each GPU 1 / share trials
            slots = int(round(gpus)) * max(per_device)
        else:
            slots = min(place.slots, min(per_device))
        return dataclasses.replace(place, slots=max(1, slots), device={**place.device, "shapes": shapes})

    def _max_chunks(self) -> int:
        """The most chunks any static configuration of the study trains for (ASHA's max_t)."""
        return max(self._chunks())

    def _chunks(self) -> list[int]:
        """Chunks each static configuration of the study trains for."""
        from harness.space import static_points

        return [self.spec.config_cls(**{**self.study.config, **point,
                                        "total_timesteps": self.budget.timesteps}).num_chunks
                for point in static_points(self.study, self.config_fields)]

    # -- records and progress ----------------------------------------------------------------
    def _on_record(self, record: dict[str, Any]) -> None:
        from harness import report

        write_json(trial_path(self.root, record["trial"]), record)
        (self.root / "inflight" / f"{record['trial']:04d}.json").unlink(missing_ok=True)
        _drop_kernel_checkpoints(self.root / "tune", f"*/trial_{record['tune_trial_id']}")  # no retry needs them
        self.done += 1
        self.running_steps.pop(record["tune_trial_id"], None)
        self._note_best(record)
        now = time.monotonic()
        if now - self.last_report >= REPORT_EVERY:  # CSVs while it runs; all of it at the end
            report.build(self.root, plots=False)  # (its cost grows with the trials: not after each one)
            self.last_report = time.monotonic()
        from harness.search import config_value

        values = [v for c in record["configs"] if (v := config_value(c, self.study.metric)) is not None]
        pick = max if self.study.direction == "maximize" else min
        what = {"complete": f"best of its {len(record['configs'])} configs "
                            f"{pick(values):.1f}" if values else "all configs diverged",
                "pruned": "stopped early by ASHA",
                "failed": "FAILED" + (f": {record['error']}" if record.get("error") else "")}[record["status"]]
        best = ""
        if self.best:
            best = f" | study best {self.best[0]:.1f} ({self.best[1]}: {_fmt(self.best[2])})"
        print(f"[{self.done}/{self.budget.trials}] trial {record['trial']}: {what}{best}", flush=True)

    def _note_best(self, record: dict[str, Any]) -> None:
        from harness.search import config_value

        sign = 1 if self.study.direction == "maximize" else -1
        for c in record["configs"]:
            v = config_value(c, self.study.metric) if record["status"] == "complete" else None
            if v is not None and (self.best is None or sign * v > sign * self.best[0]):
                self.best = (v, config_id(record["trial"], c["index"]), c["params"])

    # -- the end ------------------------------------------------------------------------------
    def control(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
        """The default configuration (the control): its values for the searched names (the
        study's ``baseline``, else the algorithm's defaults), static config and hyperparameters."""
        import json

        statics = set(self.study.static_names(self.config_fields))
        config_defaults = {f.name: f.default for f in dataclasses.fields(self.spec.config_cls)}
        hp_defaults = self.spec.hparams_cls.default()
        params: dict[str, Any] = {}
        for name in self.study.space:
            if name in self.study.baseline:
                params[name] = self.study.baseline[name]
            elif name in statics:
                params[name] = self.study.config.get(name, config_defaults[name])
            else:
                params[name] = self.study.hparams.get(name, float(f"{float(getattr(hp_defaults, name)):.7g}"))
        static = json.loads(json.dumps({**self.study.config, **{n: params[n] for n in statics},
                                        "total_timesteps": self.budget.timesteps}))
        hparams = {**self.study.hparams, **{n: float(v) for n, v in params.items() if n not in statics}}
        return params, static, hparams

    def _final(self) -> None:
        """Re-trains the top-k configurations and the default one (the control) on fresh seeds
        (once per set of recorded trials). Round r of every kernel uses the same keys, so each
        configuration and the control train and evaluate on the same seeds (common random
        numbers) and their differences are paired."""
        import json
        import statistics

        from harness import report
        from harness.kernel import FINAL, TrialPlan
        from harness.placement import final_width

        if self.study.top_k < 1:
            return
        records = load_trials(self.root)
        numbers = sorted(r["trial"] for r in records)
        final = load_final(self.root)
        if final and final.get("trials") == numbers:
            return
        configs, _, _ = report.tables(self.root)
        top = configs[configs["rank"].notna()].head(self.study.top_k)
        if not len(top):
            print("no configuration finished without diverging; nothing to re-evaluate")
            return
        by_id = {config_id(r["trial"], c["index"]): (r, c) for r in records for c in r["configs"]}
        entries, schedules, chains = {}, {}, {}
        for cid in top["config_id"]:  # a PBT configuration replays its lineage's hyperparameter schedule
            rec, conf = by_id[cid]
            initial, schedules[cid], chains[cid] = (lineage.schedule(rec, conf["index"]) if rec.get("pbt")
                                                    else (conf["hparams"], [], None))
            entries[cid] = (conf["params"], rec["static"], initial)
        entries[CONTROL], schedules[CONTROL] = self.control(), []
        groups: dict[str, list[str]] = {}
        for cid, (_, static, _) in entries.items():
            groups.setdefault(json.dumps(static, sort_keys=True), []).append(cid)
        # S seeds per round, ceil(final_seeds / S) rounds of fresh seeds; as wide as the search
        # (its kernels are compiled) or as narrow as the group, whichever costs less
        # (harness.placement.final_width, from the search trials' own timings).
        seeds = self.budget.seeds
        rounds = -(-self.study.final_seeds // seeds)
        plans, members = [], []
        for ids in groups.values():
            static = entries[ids[0]][1]
            timed = [r for r in records if r["static"] == static and r["status"] == "complete"
                     and "kernel_seconds" in r and "compile_seconds" in r]
            c = final_width(len(ids), self.budget.configs_per_trial, rounds=rounds,
                            kernel_s=statistics.median(r["kernel_seconds"] for r in timed) if timed else None,
                            compile_s=max(r["compile_seconds"] for r in timed) if timed else None)
            for start in range(0, len(ids), c):
                batch = ids[start:start + c]
                padded = batch + [batch[0]] * (c - len(batch))
                hps = [entries[i][2] for i in padded]
                schedule = lineage.merge([schedules[i] for i in padded], hps) or None
                for r in range(rounds):
                    plans.append(TrialPlan(env=self.study.env, algo=self.study.algo, config=static,
                                           hparams=hps, seeds=seeds, trial=r, study_seed=self.study.seed,
                                           stream=FINAL, objective=self.study.objective,
                                           threshold=self.study.threshold, schedule=schedule,
                                           curve_episodes=self.study.curve_episodes))
                    members.append(batch)
        print(f"re-training the top {len(top)} configurations and the default one on {rounds * seeds} fresh "
              f"seeds ({len(plans)} kernels, {', '.join(sorted({str(len(p.hparams)) for p in plans}))} configs "
              f"x {seeds} seeds) ...", flush=True)
        results = self._run_plans(plans)
        runs: dict[str, list] = {cid: [] for cid in entries}
        for plan, batch, res in zip(plans, members, results, strict=True):
            for i, cid in enumerate(batch):
                runs[cid].append((plan, i, res))
        out = {}
        for cid, parts in runs.items():
            params, static, hparams = entries[cid]
            failed = any(res is None for _, _, res in parts)

            def joined(key: str, parts: list = parts, failed: bool = failed) -> list | None:
                return None if failed else [v for _, i, res in parts for v in res[key][i]]
            out[cid] = {"config_id": cid, "params": params, "hparams": hparams, "static": static,
                        "failed": failed, "scores": joined("scores"), "final_returns": joined("final_returns"),
                        "diverged": joined("diverged"),
                        "plans": [{"plan": dataclasses.asdict(plan), "config_index": i} for plan, i, _ in parts],
                        "command": self._train_command(static, hparams, rounds * seeds, cid, schedules[cid])}
            if schedules[cid]:
                out[cid].update(schedule=schedules[cid], lineage=[config_id(by_id[cid][0]["trial"], i)
                                                                  for i in chains[cid]])
            if not failed and cid != CONTROL:
                self._keep_checkpoints(cid, static, hparams, parts)
        control = out.pop(CONTROL)
        write_json(self.root / "final.json", {"trials": numbers, "configs": list(out.values()), "control": control,
                                              "objective": self.study.objective})

    def _keep_checkpoints(self, cid: str, static: dict, hparams: dict, parts: list) -> None:
        """Copies the re-trained policies of ``cid`` to ``checkpoints/<cid>/seed_K.msgpack`` with
        ``policy.json`` (everything needed to rebuild the policy, and each seed's evaluation)."""
        import shutil

        folder = self.root / "checkpoints" / cid
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        seeds = []
        for plan, i, res in parts:
            for s in range(plan.seeds):
                src = Path(res["checkpoint"]) / f"c{i}_s{s}.msgpack"
                if not src.exists():
                    return  # no checkpoint came back (e.g. a retried trial); keep none rather than half
                k = len(seeds)
                shutil.copyfile(src, folder / f"seed_{k}.msgpack")
                # "score": the deterministic evaluation at save time (harness.play repeats it); the
                # objective's value is "objective_value"
                seeds.append({"seed": k, "score": res["final_returns"][i][s],
                              "objective_value": res["scores"][i][s], "diverged": res["diverged"][i][s],
                              "plan": dataclasses.asdict(plan), "config_index": i, "seed_index": s})
        write_json(folder / "policy.json", {"config_id": cid, "study": self.study.name, "env": self.study.env,
                                            "algo": self.study.algo, "config": static, "hparams": hparams,
                                            "seeds": seeds})

    def _run_plans(self, plans: list[Any]) -> list[dict[str, Any] | None]:
        """Runs each plan as a Tune trial; the last result of each (None where it failed)."""
        import json
        from dataclasses import asdict

        from ray import tune

        from harness.trainable import trainable_for

        runs = len(list((self.root / "tune").glob("*"))) if (self.root / "tune").exists() else 0
        tuner = tune.Tuner(
            trainable_for(self.study.name, self.place.resources),
            param_space={"plan": tune.grid_search([asdict(p) for p in plans]), "device": self.place.device,
                         "study": self.study.name},
            tune_config=tune.TuneConfig(max_concurrent_trials=self.place.slots, reuse_actors=True,
                                        trial_dirname_creator=_trial_dirname),
            run_config=tune.RunConfig(name=f"final-{runs}", storage_path=str(self.root / "tune"), verbose=0,
                                      callbacks=[_DiskWatch(self)], stop=_DiskWatch.stopper(self),
                                      failure_config=tune.FailureConfig(max_failures=2),
                                      checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True,
                                                                              num_to_keep=2)))
        grid = tuner.fit()
        self._stop_if_disk_error()
        _drop_kernel_checkpoints(self.root / "tune" / f"final-{runs}", "trial_*")
        done = {}
        for r in grid:
            if r.error is None and r.metrics.get("final"):
                done[json.dumps(r.config["plan"], sort_keys=True)] = {
                    **r.metrics, "checkpoint": r.checkpoint.path if r.checkpoint else ""}
        return [done.get(json.dumps(asdict(p), sort_keys=True)) for p in plans]

    def _train_command(self, static: dict[str, Any], hparams: dict[str, float], seeds: int, cid: str = "",
                       schedule: list[dict[str, Any]] | None = None) -> str:
        """The ``harness.train`` command that trains this configuration (its schedule, written to
        ``schedules/<cid>.json``, replayed with ``--schedule``)."""
        sets = [f"{k}={label(tuple(v) if isinstance(v, list) else v)}" for k, v in static.items()
                if k != "total_timesteps"] + [f"{k}={v:.6g}" for k, v in hparams.items()]
        args = ["python", "-m", "harness.train", "--algo", self.study.algo, "--env", self.study.env,
                "--seeds", str(seeds), "--timesteps", str(static["total_timesteps"])]
        for s in sets:
            args += ["--set", s]
        if schedule:
            path = self.root / "schedules" / f"{cid}.json"
            write_json(path, schedule)
            args += ["--schedule", str(path)]
        return shlex.join(args)

    def _summary(self, paths: dict[str, Path]) -> None:
        import json

        minutes = (time.monotonic() - self.started) / 60
        print(f"done: {self.done} trials in {minutes:.1f} min")
        if "best" in paths:
            b = json.loads(paths["best"].read_text())
            ev = b.get("reevaluation")
            if ev and ev.get("mean") is not None:
                final = (f", final return {ev['final_return']:.1f}" if b.get("objective", "final") != "final"
                         and ev.get("final_return") is not None else "")
                print(f"best: {b['config_id']} re-evaluated {ev['mean']:.1f} (95% CI {ev['ci95'][0]:.1f}"
                      f"..{ev['ci95'][1]:.1f}) on {ev['seeds']} fresh seeds{final}; search score "
                      f"{b['search_score']:.1f}")
                print(f"  {_fmt(b['params'])}")
                print(f"  reproduce: {b['reproduce']['command']}")
            if b.get("tuned_vs_default"):
                print(tuned_vs_default_line(b["tuned_vs_default"], b.get("objective", "final")))
        print(f"reports: {paths['configs'].parent}/ ({', '.join(p.name for p in paths.values())})")


def tuned_vs_default_line(t: dict[str, Any], objective: str) -> str:
    """One line: tuned vs default on the same fresh seeds, CIs and the paired difference."""
    def side(x: dict[str, Any]) -> str:
        if x.get("mean") is None:
            return "no score" + (" (diverged)" if x.get("diverged") else "")
        return f"{x['mean']:.1f} (95% CI {x['ci95'][0]:.1f}..{x['ci95'][1]:.1f})"

    d = t["difference"]
    diff = ("no paired seeds" if d["mean"] is None else
            f"paired difference {d['mean']:+.1f} (95% CI {d['ci95'][0]:+.1f}..{d['ci95'][1]:+.1f}) over "
            f"{d['paired_seeds']} seeds")
    verdict = ("tuning helps" if t["better"] else "the default is better" if t.get("worse")
               else "no clear difference")
    line = f"tuned vs default ({objective}): {side(t['tuned'])} vs {side(t['default'])}; {diff}: {verdict}"
    if r := t.get("above_reference"):
        times = "" if r["ratio"] is None else f", {r['ratio']:.1f}x"
        line += (f"; above {r['label']} ({r['return']:g}): {r['tuned']:.2f} vs {r['default']:.2f}{times}")
    return line


def parse_checkpoint_every(text: str) -> dict[str, float]:
    """``--checkpoint-every``: '90s' / '90', '4chunks' or 'never' as the trials' device settings."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|seconds?|chunks?)?\s*", text or "")
    if text.strip().lower() in ("never", "off", "0"):
        return {"checkpoint_seconds": 0, "checkpoint_chunks": 0}
    if not m or float(m.group(1)) <= 0 or (m.group(2) or "").startswith("chunk") and not m.group(1).isdigit():
        raise StudyError(f"--checkpoint-every {text!r}: give seconds ('60s'), chunks ('4chunks') or 'never'")
    if (m.group(2) or "s").startswith("chunk"):
        return {"checkpoint_seconds": 0, "checkpoint_chunks": int(m.group(1))}
    return {"checkpoint_seconds": float(m.group(1)), "checkpoint_chunks": 0}


def _kind(dist: Any) -> str:
    """How a searched name is plotted: ``log``, ``uniform``, ``int`` or ``categorical``."""
    from harness.space import Categorical, Int, LogUniform

    if isinstance(dist, LogUniform) or (isinstance(dist, Int) and dist.log):
        return "log"
    return {Int: "int", Categorical: "categorical"}.get(type(dist), "uniform")


def halfway_rung(chunks: int) -> int:
    """ASHA's grace period for a single rung in the middle of a ``chunks``-chunk trial. Tune's ASHA
    puts a rung at every grace * 2**k below max_t, so the grace must exceed half of it:
    ``chunks // 2`` also gave a rung at 2 * grace (chunk 24 of 25), where trials that had
    nearly finished were stopped and went unranked."""
    return chunks // 2 + 1


def _cache_dir() -> str:
    """JAX's persistent compilation cache, shared by every study and trial process on a node."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rl-harness", "jax")


def _last_error_line(trial: Any) -> str:
    """The last line of a failed Tune trial's error (Tune's own log of it is turned off)."""
    try:
        text = trial.get_error() or ""
    except Exception:  # noqa: BLE001 - the error file may be unreadable (a full disk, say)
        text = ""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no error text"


class _DiskErrorLog(logging.Filter):
    """On Tune's loggers: an error logged because the results disk refuses writes (Tune saves its
    experiment state there, logs a traceback when that fails and goes on) stops the study in one
    line instead (:class:`_DiskWatch`); other records pass."""

    LOGGERS = ("ray.tune.execution.experiment_state", "ray.tune.execution.tune_controller")

    def __init__(self, runner: Runner) -> None:
        super().__init__()
        self.runner = runner

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        problem = disk_problem(err) or disk_problem(record.getMessage())
        if problem:
            self.runner.disk_error = self.runner.disk_error or problem
        return problem is None

    @classmethod
    def install(cls, runner: Runner) -> None:
        for name in cls.LOGGERS:
            log = logging.getLogger(name)
            for f in [f for f in log.filters if isinstance(f, cls)]:
                log.removeFilter(f)
            log.addFilter(cls(runner))


class _DiskWatch:
    """A Tune callback and stopper: a trial that fails while the results disk refuses writes
    (its checkpoint could not be saved, say) stops the study instead of being retried until it
    counts as failed; so does a disk error the searcher met (:meth:`Runner._guard_disk`)."""

    def __new__(cls, runner: Runner) -> Any:
        from ray import tune

        class DiskWatch(tune.Callback):
            def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
                runner.disk_error = runner.disk_error or writable(runner.root)

            on_trial_error = on_trial_recover

        return DiskWatch()

    @staticmethod
    def stopper(runner: Runner) -> Any:
        from ray import tune

        class StopOnDiskError(tune.Stopper):
            def __call__(self, trial_id: str, result: dict) -> bool:
                return False

            def stop_all(self) -> bool:
                return runner.disk_error is not None

        return StopOnDiskError()


def _drop_kernel_checkpoints(folder: Path, trials: str) -> None:
    """Deletes the mid-run kernel checkpoints of the Tune trial folders ``folder/trials`` (a glob):
    once a trial is recorded no retry needs them, and they can be large (SAC's replay buffers)."""
    from harness.trainable import KERNEL_FILE

    for path in folder.glob(f"{trials}/checkpoint_*/{KERNEL_FILE}"):
        path.unlink(missing_ok=True)


def _trial_dirname(trial: Any) -> str:
    return f"trial_{trial.trial_id}"


def _count_trials(url: str, name: str) -> int:
    import optuna

    from harness.search import storage

    try:
        return len(optuna.load_study(study_name=name, storage=storage(url)).get_trials(deepcopy=False))
    except KeyError:
        return 0


def _fmt(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={label(v)}" for k, v in params.items())


class _Progress:
    """A Tune callback printing throughput every 15 s: trials done, running, env steps/s."""

    def __new__(cls, runner: Runner) -> Any:
        from ray import tune

        class Progress(tune.Callback):
            def __init__(self) -> None:
                self.last_print = time.monotonic()
                self.steps_done = 0  # from finished trials
                self.last_steps = 0

            def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
                plan = trial.config["plan"]
                runner.running_steps[trial.trial_id] = int(result.get("env_steps", 0)) * plan["seeds"] * len(
                    plan["hparams"])
                now = time.monotonic()
                if now - self.last_print >= 15:
                    steps = self.steps_done + sum(runner.running_steps.values())
                    rate = (steps - self.last_steps) / (now - self.last_print)
                    self.last_print, self.last_steps = now, steps
                    best = f", best {runner.best[0]:.1f} ({runner.best[1]})" if runner.best else ""
                    print(f"  {runner.done}/{runner.budget.trials} trials done, "
                          f"{sum(t.status == 'RUNNING' for t in trials)} running{best}; "
                          f"{steps:,} env steps, {rate:,.0f} steps/s", flush=True)

            def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
                print(f"  trial {trial.config['plan']['trial']} failed ({_last_error_line(trial)}); "
                      f"retrying from its last checkpoint", flush=True)

            def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
                print(f"  trial {trial.config['plan']['trial']}: {_last_error_line(trial)}", flush=True)

            def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
                plan = trial.config["plan"]
                last = trial.last_result or {}
                self.steps_done += int(last.get("env_steps", 0)) * plan["seeds"] * len(plan["hparams"])

        return Progress()


if __name__ == "__main__":
    sys.exit(main())
