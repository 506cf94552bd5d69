"""A study's results folder: the one place that knows its layout (Ray Train's ``StorageContext``).

    NAME/study.json          StudyMeta: what the study is and the options it was started with
    NAME/trials/NNNN.json    TrialRecord: one per finished Tune trial (C configurations)
    NAME/inflight/NNNN.json  a trial proposed and not yet recorded: what a resumed study needs to
                             go on with it (plan, points, Optuna trial numbers, Tune trial ids)
    NAME/final.json          FinalRecord: the re-training of the best configurations and the control
    NAME/ablation.json       AblationRecord: the ablation path from the control to the best configuration
    NAME/optuna.db           the Optuna study (SQLite), unless --storage says otherwise
    NAME/tune/run-K/         Ray Tune's experiment folder of the K-th search run (mid-run kernel
    NAME/tune/final-K/       checkpoints of trials not yet recorded), and of the K-th re-training
    NAME/checkpoints/CID/    the re-trained policies of a top configuration (seed_K.msgpack,
                             policy.json), for harness.play
    NAME/schedules/CID.json  a PBT configuration's hyperparameter schedule (harness.train --schedule)
    NAME/ray-session.json    the driver and session folder of the embedded Ray
    NAME/reports/            CSV reports, best.json, plots and index.html, rebuilt from the above
    NAME/tensorboard/        one TensorBoard run per configuration

Nothing else in the harness joins a path inside a results folder. Nothing here imports Ray,
Optuna or JAX.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from harness.kernel.stats import OBJECTIVES
from harness.space import DIRECTIONS, METRICS, SCHEDULERS, Budget
from harness.store.records import AblationRecord, FinalRecord, RecordsError, TrialRecord, read_json, write_json

KERNEL_FILE = "kernel.msgpack"  # a mid-run checkpoint inside a Tune trial's checkpoint folder
_Derived = TypeVar("_Derived", FinalRecord, AblationRecord)
# the values study.json's fields may take where there are few (None: a field left to its default)
_META_CHOICES = {"direction": DIRECTIONS, "metric": METRICS, "objective": OBJECTIVES, "scheduler": SCHEDULERS}
# study.json's fields and the types they must have (None allowed where the default is None)
_META_TYPES = {"study": str, "env": str, "algo": str, "direction": str, "metric": str, "objective": str,
               "threshold": (int, float), "scheduler": str, "seed": int, "budget": dict, "smoke": bool,
               "created": str, "space": dict, "eval_policy": str, "reference": dict, "rounds": (int, float),
               "optuna_study": str}


@dataclass(frozen=True)
class StudyMeta:
    """``study.json``: what a study is and how it was started. Defaults (for folders written by
    older versions) are here and nowhere else."""

    study: str
    env: str = ""
    algo: str = ""
    direction: str = "maximize"
    metric: str = "mean"
    objective: str = "final"
    threshold: float | None = None
    scheduler: str = "asha"
    seed: int = 0
    budget: dict[str, int] = field(default_factory=dict)  # Budget as a dict
    smoke: bool = False
    created: str = ""
    space: dict[str, str] = field(default_factory=dict)  # searched name -> "log", "uniform", "int", "categorical"
    eval_policy: str = "greedy"
    reference: dict[str, Any] | None = None  # {"label", "return"}
    rounds: float | None = None  # a lane study: its lane trials' length in trials (Settings.with_rounds)
    optuna_study: str = ""  # its Optuna study's name in the storage (Settings.with_optuna_study); "": the study's
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # keys this version does not know: kept

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    @classmethod
    def from_dict(cls, data: Any, where: Path) -> StudyMeta:
        if not isinstance(data, dict) or not isinstance(data.get("study"), str):
            raise RecordsError(f"{where} is not a study's study.json (no study name)")
        wrong = [k for k, t in _META_TYPES.items() if k in data and data[k] is not None
                 and (not isinstance(data[k], t) or isinstance(data[k], bool) and t is not bool)]
        budget = data.get("budget")
        if "budget" not in wrong and budget and not all(  # a resumed study reads every one of them
                type(budget.get(f.name)) is int for f in dataclasses.fields(Budget)):
            wrong.append("budget")
        if wrong:
            raise RecordsError(f"{where} is not a study's study.json (no valid {', '.join(wrong)})")
        for k, choices in _META_CHOICES.items():
            if data.get(k) is not None and data[k] not in choices:
                raise RecordsError(f"{where}: {k} {data[k]!r} is not one of {', '.join(choices)}")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in data.items() if k in known},
                   extra={k: v for k, v in data.items() if k not in known})

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return {**out.pop("extra"), **out}


@dataclass(frozen=True)
class InFlight:
    """A trial proposed and not yet recorded (``inflight/NNNN.json``)."""

    trial: int
    plan: dict[str, Any]
    points: list[dict[str, Any]]
    optuna_numbers: list[int]
    tune_trial_ids: list[str]
    resume_from: tuple[str, ...] = ()  # its kernel checkpoints, newest first (set when adopted)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "resume_from"}


class Unreadable(NamedTuple):
    """A file of the folder that cannot be read as what it should be."""

    path: Path
    error: str


class ResultsFolder:
    """The results folder of one study (:mod:`harness.store.folder`'s layout)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"ResultsFolder({str(self.root)!r})"

    def __str__(self) -> str:
        return str(self.root)

    # -- paths -----------------------------------------------------------------------------------
    @property
    def study_file(self) -> Path:
        return self.root / "study.json"

    @property
    def final_file(self) -> Path:
        return self.root / "final.json"

    @property
    def ablation_file(self) -> Path:
        return self.root / "ablation.json"

    @property
    def session_file(self) -> Path:
        return self.root / "ray-session.json"

    @property
    def tune_dir(self) -> Path:
        return self.root / "tune"

    @property
    def reports_dir(self) -> Path:
        return self.root / "reports"

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard"

    def optuna_url(self) -> str:
        return f"sqlite:///{self.root / 'optuna.db'}"

    def trial_file(self, trial: int) -> Path:
        return self.root / "trials" / f"{trial:04d}.json"

    def inflight_file(self, trial: int) -> Path:
        return self.root / "inflight" / f"{trial:04d}.json"

    def report(self, name: str) -> Path:
        return self.reports_dir / name

    def policy_dir(self, config_id: str) -> Path:
        return self.root / "checkpoints" / config_id

    def schedule_file(self, config_id: str) -> Path:
        return self.root / "schedules" / f"{config_id}.json"

    @staticmethod
    def tune_trial_dirname(trial_id: str) -> str:
        """The folder Tune makes for a trial (``trial_dirname_creator``)."""
        return f"trial_{trial_id}"

    # -- the study -------------------------------------------------------------------------------
    def is_study(self) -> bool:
        return self.study_file.exists()

    def meta(self) -> StudyMeta:
        """study.json as :class:`StudyMeta`.

        Raises:
            RecordsError: no such folder, or no (valid) study.json in it.
        """
        if not self.root.is_dir():
            raise RecordsError(f"no results folder at {self.root}")
        if not self.study_file.exists():
            raise RecordsError(f"{self.root} is not a study's results folder (no study.json)")
        return StudyMeta.from_dict(read_json(self.study_file), self.study_file)

    def write_meta(self, meta: StudyMeta) -> None:
        write_json(self.study_file, meta.to_dict())

    def set_aside(self) -> Path:
        """Renames the folder to ``NAME.old-STAMP`` (``--fresh``); returns where it went."""
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        aside = self.root.with_name(f"{self.root.name}.old-{stamp}")
        self.root.rename(aside)
        return aside

    # -- trial records ---------------------------------------------------------------------------
    def read_trials(self) -> tuple[list[TrialRecord], list[str]]:
        """The readable trial records by trial number, and one line for each file that is not one
        (truncated, corrupt, or missing a field), naming it."""
        records: dict[int, tuple[Path, TrialRecord]] = {}
        problems = []
        folder = self.root / "trials"
        if folder.exists() and not folder.is_dir():
            return [], [f"{folder} is not a folder, so no trial record was read"]
        for path in sorted(folder.glob("*.json")):
            try:
                rec = TrialRecord.from_dict(read_json(path), path)
            except (RecordsError, OSError) as err:
                problems.append(str(err))
                continue
            if rec.trial in records:  # a trial in two files: the one in the trial's own file is kept
                first = records[rec.trial][0]
                own = path.name == self.trial_file(rec.trial).name
                keep, drop = (path, first) if own else (first, path)
                problems.append(f"{drop} is not a trial record of its own (trial {rec.trial} again, as in "
                                f"{keep.name})")
                if not own:
                    continue
            records[rec.trial] = (path, rec)
        return [rec for _, (_, rec) in sorted(records.items())], problems

    def trials(self) -> list[TrialRecord]:
        """Every readable trial record, by trial number. A file that cannot be read is left out
        and named on stderr (once per process and version of the file); the reports list it in
        ``reports/problems.txt``."""
        records, problems = self.read_trials()
        for line in problems:
            _warn(f"{line}; left out")
        return records

    def record(self, record: TrialRecord) -> None:
        """Writes a finished trial's record; it is no longer in flight, and no retry needs its
        mid-run kernel checkpoints (they can be large: SAC's replay buffers)."""
        write_json(self.trial_file(record.trial), record.to_dict())
        self.inflight_file(record.trial).unlink(missing_ok=True)
        self.drop_kernel_checkpoints(record.tune_trial_id)

    def final(self) -> FinalRecord | None:
        return self._derived(self.final_file, FinalRecord)

    def _derived(self, path: Path, kind: type[_Derived]) -> _Derived | None:
        """A file the study derives from its records (final.json, ablation.json), or None where
        there is none yet. One that cannot be read (truncated, corrupt) counts as none: named on
        stderr and in ``reports/problems.txt`` (:meth:`unreadable`), and the study makes it again."""
        if not path.exists():
            return None
        try:
            return kind.from_dict(read_json(path), path)
        except (RecordsError, OSError) as err:
            _warn(f"{err}; left out (the study makes it again from its records)")
            return None

    def unreadable(self) -> list[str]:
        """One line for each file that the reports leave out because it cannot be read: trial
        records, final.json, ablation.json."""
        lines = self.read_trials()[1]
        kinds: list[tuple[Path, type[FinalRecord | AblationRecord]]] = [
            (self.final_file, FinalRecord), (self.ablation_file, AblationRecord)]
        for path, kind in kinds:
            try:
                if path.exists():
                    kind.from_dict(read_json(path), path)
            except (RecordsError, OSError) as err:
                lines.append(str(err))
        return lines

    def write_final(self, final: FinalRecord) -> None:
        write_json(self.final_file, final.to_dict())

    def ablation(self) -> AblationRecord | None:
        return self._derived(self.ablation_file, AblationRecord)

    def write_ablation(self, ablation: AblationRecord) -> None:
        write_json(self.ablation_file, ablation.to_dict())

    # -- trials in flight ------------------------------------------------------------------------
    def note_inflight(self, entry: InFlight) -> None:
        write_json(self.inflight_file(entry.trial), entry.to_dict())

    def inflight(self) -> list[InFlight | Unreadable]:
        """Every in-flight entry by trial number (a file that cannot be read as :class:`Unreadable`),
        each with ``resume_from``: its Tune trials' kernel checkpoints, newest first."""
        out: list[InFlight | Unreadable] = []
        for path in sorted((self.root / "inflight").glob("*.json")):
            try:
                data = read_json(path)
                entry = InFlight(**{k: v for k, v in data.items() if k != "resume_from"})
            except RecordsError as err:
                out.append(Unreadable(path, str(err)))
                continue
            except (TypeError, AttributeError) as err:
                out.append(Unreadable(path, f"{path} is not an in-flight entry ({err})"))
                continue
            found = [p for tid in entry.tune_trial_ids for p in self.tune_dir.glob(
                f"*/{self.tune_trial_dirname(tid)}/checkpoint_*/{KERNEL_FILE}")]
            newest = sorted(found, key=lambda p: (p.stat().st_mtime, p.parent.name), reverse=True)
            out.append(dataclasses.replace(entry, resume_from=tuple(str(p) for p in newest)))
        return out

    def drop_inflight(self, entry: InFlight | Unreadable) -> None:
        """Forgets an in-flight entry."""
        path = entry.path if isinstance(entry, Unreadable) else self.inflight_file(entry.trial)
        path.unlink(missing_ok=True)

    # -- Ray Tune's folders ----------------------------------------------------------------------
    def next_run(self, kind: str) -> str:
        """The name of the next Tune experiment of ``kind`` (``run``: a search, ``final``: a
        re-training): one more than the highest so far, so no run reuses another's folder."""
        taken = [int(m[1]) for p in self.tune_dir.glob(f"{kind}-*")
                 if (m := re.fullmatch(rf"{kind}-(\d+)", p.name))]
        return f"{kind}-{max(taken, default=-1) + 1}"

    def drop_kernel_checkpoints(self, tune_trial_id: str | None = None, run: str = "*") -> None:
        """Deletes the mid-run kernel checkpoints of one Tune trial (or of every trial of ``run``)."""
        trials = self.tune_trial_dirname(tune_trial_id) if tune_trial_id else "trial_*"
        for path in self.tune_dir.glob(f"{run}/{trials}/checkpoint_*/{KERNEL_FILE}"):
            path.unlink(missing_ok=True)

    # -- kept policies ---------------------------------------------------------------------------
    def kept_policies(self) -> list[str]:
        """The configuration ids with kept re-trained policies (``checkpoints/CID/policy.json``)."""
        folder = self.root / "checkpoints"
        return sorted(p.name for p in folder.iterdir() if (p / "policy.json").exists()) if folder.is_dir() else []

    def keep_policies(self, config_id: str, files: list[Path], policy: dict[str, Any]) -> None:
        """``checkpoints/CID/seed_K.msgpack`` (copies of ``files``, in seed order) and ``policy.json``."""
        folder = self.policy_dir(config_id)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for k, src in enumerate(files):
            shutil.copyfile(src, folder / f"seed_{k}.msgpack")
        write_json(folder / "policy.json", policy)

    def drop_policies(self, config_id: str) -> None:
        shutil.rmtree(self.policy_dir(config_id), ignore_errors=True)

    def policy_file(self, config_id: str, seed: int) -> Path:
        return self.policy_dir(config_id) / f"seed_{seed}.msgpack"


_warned: set[tuple[str, float]] = set()


def _warn(line: str) -> None:
    """``line`` (which starts with a file's path) on stderr, once per process and version of the file."""
    path = line.split(" ", 1)[0]
    key = (path, os.path.getmtime(path) if os.path.exists(path) else 0.0)
    if key not in _warned:
        _warned.add(key)
        print(f"warning: {line}", file=sys.stderr)


def as_folder(where: ResultsFolder | Path | str) -> ResultsFolder:
    return where if isinstance(where, ResultsFolder) else ResultsFolder(where)
