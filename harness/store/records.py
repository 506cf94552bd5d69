"""The records a results folder holds, typed (:class:`TrialRecord`, :class:`FinalRecord`,
:class:`AblationRecord`), files written atomically (a crash never leaves half a file), and what a
disk error looks like.

The layout of a results folder is :mod:`harness.store.folder`'s alone.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from harness.kernel.stats import config_score


class RecordsError(ValueError):
    """A results folder that is missing or does not hold what it should."""


_NUMBER = (int, float)
_LIST = (list,)
_DICT = (dict,)
_STR = (str,)
_INT = (int,)
_BOOL = (bool,)


@dataclass(frozen=True)
class _Record:
    """What the record types share. ``from_dict`` checks a file's fields and fills those that older
    versions did not write with the defaults (the class's, and nowhere else); ``to_dict`` writes back
    the keys its file had, or for a record made here ``_ALWAYS`` and the fields off their defaults."""

    extra: dict[str, Any] = field(default_factory=dict, compare=False, kw_only=True)  # keys unknown here: kept
    given: frozenset[str] | None = field(default=None, compare=False, repr=False, kw_only=True)  # its file's keys

    _WHAT: ClassVar[str] = "a record"  # in "{where} is not {_WHAT}"
    _TYPES: ClassVar[dict[str, tuple[type, ...]]] = {}  # fields checked: JSON types (or None, as their default)
    _ENTRIES: ClassVar[dict[str, type[_Record]]] = {}  # fields holding typed entries: a list of them, or one
    _ALWAYS: ClassVar[frozenset[str]] = frozenset()  # what a record made here writes even at its default

    @classmethod
    def from_dict(cls, data: Any, where: Path | str) -> Self:
        """The record in ``data``, read from ``where``.

        Raises:
            RecordsError: not a dict, or a field missing or of the wrong type (each named).
        """
        if wrong := cls._wrong(data):
            raise RecordsError(f"{where} is not {cls._WHAT} (no valid {', '.join(wrong)})")
        return cls._load(data)

    @classmethod
    def _wrong(cls, data: Any) -> list[str]:
        """The fields of ``data`` that are missing or of the wrong type (or hold an entry that has one)."""
        fields = [f for f in dataclasses.fields(cls) if f.name in cls._TYPES]
        if not isinstance(data, dict):
            return [f.name for f in fields if _default(f) is _REQUIRED]
        wrong = []
        for f in fields:
            if f.name not in data:
                if _default(f) is _REQUIRED:
                    wrong.append(f.name)
                continue
            value, entry = data[f.name], cls._ENTRIES.get(f.name)
            if value is None and f.default is None:
                continue
            if not _is(value, cls._TYPES[f.name]) or entry is not None and any(
                    entry._wrong(e) for e in (value if isinstance(value, list) else [value])):
                wrong.append(f.name)
        return wrong

    @classmethod
    def _load(cls, data: dict[str, Any]) -> Self:
        known = {f.name for f in dataclasses.fields(cls)} - {"extra", "given"}
        values = {k: v for k, v in data.items() if k in known}
        for k, entry in cls._ENTRIES.items():
            if isinstance(values.get(k), list):
                values[k] = [entry._load(e) for e in values[k]]
            elif isinstance(values.get(k), dict):
                values[k] = entry._load(values[k])
        return cls(**values, extra={k: v for k, v in data.items() if k not in known}, given=frozenset(data))

    def to_dict(self) -> dict[str, Any]:
        """The record as its file holds it: ``from_dict``'s inverse, key for key."""
        keys = self._ALWAYS if self.given is None else self.given
        out = dict(self.extra)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in ("extra", "given") and (f.name in keys or value != _default(f)):
                out[f.name] = ([v.to_dict() for v in value] if f.name in self._ENTRIES and isinstance(value, list)
                               else value.to_dict() if isinstance(value, _Record) else value)
        return out


_REQUIRED = object()  # a field without a default: every file has it


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return _REQUIRED if f.default_factory is dataclasses.MISSING else f.default_factory()


def _is(value: Any, types: tuple[type, ...]) -> bool:
    """``isinstance``, but JSON's true and false are no numbers."""
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))


@dataclass(frozen=True)
class ConfigRecord(_Record):
    """One configuration of a trial record (its ``configs``). A lane trial's has its own status,
    env steps and curve, and why it stopped: each configuration of a refilled lane ends on its own."""

    index: int
    params: dict[str, Any]  # the searched values
    optuna_number: int
    hparams: dict[str, Any] | None = None  # the kernel's traced hyperparameters (None: a refill never started)
    scores: list[float | None] | None = None  # the objective per seed (None: none, as pruned or failed)
    final_returns: list[float | None] | None = None  # the last evaluation's return per seed
    diverged: list[bool | None] | None = None  # per seed
    pruned: bool = False
    final_hparams: dict[str, Any] | None = None  # population-based training: its hyperparameters at the end
    last_value: float | None = None  # pruned: its objective where it was stopped
    status: str | None = None  # a lane trial's configuration: its own (None: its trial's, TrialRecord.status_of)
    stopped: str = ""  # a lane trial's configuration: why it stopped
    lane: int | None = None
    started_chunk: int | None = None
    env_steps: int | None = None  # a lane trial's configuration: its own per seed (TrialRecord.env_steps_of)
    curve: list[dict[str, Any]] = field(default_factory=list)  # a lane trial's configuration: its own chunks

    _WHAT = "a trial record's configuration"
    _TYPES = {"index": _INT, "params": _DICT, "optuna_number": _INT, "hparams": _DICT, "scores": _LIST,
              "final_returns": _LIST, "diverged": _LIST, "pruned": _BOOL, "final_hparams": _DICT,
              "last_value": _NUMBER, "status": _STR, "stopped": _STR, "lane": _INT, "started_chunk": _INT,
              "env_steps": _INT, "curve": _LIST}
    _ALWAYS = frozenset({"index", "optuna_number", "params", "hparams", "pruned", "scores", "final_returns",
                         "diverged"})

    def value(self, metric: str = "mean") -> float | None:
        """Its score: the mean (or IQM) of its objective over seeds; None if it diverged or has none."""
        return config_score(self.scores, self.diverged, metric)


@dataclass(frozen=True)
class TrialRecord(_Record):
    """A finished Tune trial (``trials/NNNN.json``): its C configurations, how it ended, its curves
    (per chunk: ``chunk``, ``env_steps``, ``returns`` and ``evals`` [C][S], ``objective``, ``pbt``)
    and what its last result said (timings, its error, how it was resumed)."""

    trial: int
    status: str  # complete, pruned or failed
    seeds: int
    configs: list[ConfigRecord]
    tune_trial_id: str = ""
    metric: str = "mean"
    objective: str = "final"
    threshold: float | None = None
    pbt: dict[str, Any] | None = None  # population-based training's settings
    lanes: dict[str, Any] | None = None  # a lane trial's: its lanes' settings
    plan: dict[str, Any] | None = None  # a lane trial's: its plan with its first lanes (lanes.trial.replay's)
    static: dict[str, Any] = field(default_factory=dict)  # its static config
    curves: list[dict[str, Any]] = field(default_factory=list)
    env_steps: int = 0  # per seed
    nodes: list[str] = field(default_factory=list)  # the Ray nodes it ran on, in order
    kernel_seconds: float | None = None
    compile_seconds: float | None = None
    trial_seconds: float | None = None
    error: str | None = None
    resumed_after_chunk: int | None = None
    checkpoints: int | None = None
    checkpoint_seconds: float | None = None
    broker_seconds: float | None = None
    lanes_seconds: float | None = None

    _WHAT = "a trial record"
    _TYPES = {"trial": _INT, "status": _STR, "seeds": _INT, "configs": _LIST, "tune_trial_id": _STR,
              "metric": _STR, "objective": _STR, "threshold": _NUMBER, "pbt": _DICT, "lanes": _DICT,
              "plan": _DICT, "static": _DICT, "curves": _LIST, "env_steps": _INT, "nodes": _LIST,
              "kernel_seconds": _NUMBER, "compile_seconds": _NUMBER, "trial_seconds": _NUMBER, "error": _STR,
              "resumed_after_chunk": _INT, "checkpoints": _INT, "checkpoint_seconds": _NUMBER,
              "broker_seconds": _NUMBER, "lanes_seconds": _NUMBER}
    _ENTRIES = {"configs": ConfigRecord}
    _ALWAYS = frozenset({"trial", "tune_trial_id", "status", "metric", "objective", "threshold", "pbt", "static",
                         "seeds", "configs", "curves", "env_steps", "nodes"})

    def status_of(self, c: ConfigRecord) -> str:
        """How configuration ``c`` ended: its own status (a lane trial's), else the trial's."""
        return self.status if c.status is None else c.status

    def env_steps_of(self, c: ConfigRecord) -> int | None:
        """The env steps per seed configuration ``c`` trained: a lane trial's its own (None: never
        trained), the others the trial's."""
        return self.env_steps if c.status is None else c.env_steps


@dataclass(frozen=True)
class FinalConfig(_Record):
    """A configuration re-trained on fresh seeds (an entry of ``final.json``'s configs, or its control)."""

    config_id: str  # its configuration's (final_phase.CONTROL: the default configuration)
    params: dict[str, Any] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    static: dict[str, Any] = field(default_factory=dict)
    failed: bool = False  # a kernel of its re-training failed: no scores
    scores: list[float | None] | None = None
    final_returns: list[float | None] | None = None
    diverged: list[bool | None] | None = None
    plans: list[dict[str, Any]] | None = None  # each kernel that trained it: {"plan", "config_index"}
    command: str | None = None  # the harness.train command that trains it
    schedule: list[dict[str, Any]] | None = None  # population-based training: its lineage's hyperparameters
    lineage: list[str] | None = None  # population-based training: the configurations it came from

    _WHAT = "a re-trained configuration"
    _TYPES = {"config_id": _STR, "params": _DICT, "hparams": _DICT, "static": _DICT, "failed": _BOOL,
              "scores": _LIST, "final_returns": _LIST, "diverged": _LIST, "plans": _LIST, "command": _STR,
              "schedule": _LIST, "lineage": _LIST}
    _ALWAYS = frozenset({"config_id", "params", "hparams", "static", "failed", "scores", "final_returns",
                         "diverged", "plans", "command"})


@dataclass(frozen=True)
class FinalRecord(_Record):
    """``final.json``: the top configurations and the control re-trained on the same fresh seeds."""

    configs: list[FinalConfig]
    trials: list[int] | None = None  # the recorded trials it was made from
    control: FinalConfig | None = None
    objective: str = "final"

    _WHAT = "the study's final.json"
    _TYPES = {"configs": _LIST, "trials": _LIST, "control": _DICT, "objective": _STR}
    _ENTRIES = {"configs": FinalConfig, "control": FinalConfig}
    _ALWAYS = frozenset({"trials", "configs", "control", "objective"})


@dataclass(frozen=True)
class AblationStep(_Record):
    """One point of the ablation path: the hyperparameter switched at this step (None at the
    start) and the scores per seed of the configuration it gives; ``tried``: at step 1 every
    single switch's score from the default (the order of the path), later this point's own."""

    step: int
    param: str | None = None
    value: Any = None
    scores: list[float | None] | None = None  # None: its kernels failed
    tried: dict[str, float | None] = field(default_factory=dict)

    _WHAT = "a step of the ablation path"
    _TYPES = {"step": _INT, "param": _STR, "scores": _LIST, "tried": _DICT}  # value: any JSON
    _ALWAYS = frozenset({"step", "param", "value", "scores", "tried"})


@dataclass(frozen=True)
class AblationRecord(_Record):
    """``ablation.json``: the path from the control to the best re-trained configuration, or why there is none."""

    steps: list[AblationStep]
    trials: list[int] | None = None  # the recorded trials of the final.json it was made from
    target: str | None = None  # the best re-trained configuration's id
    objective: str = "final"
    maximize: bool = True
    skipped: str | None = None  # why there is no path
    kernels: int | None = None  # what the path cost
    seconds: float | None = None
    seeds: int | None = None

    _WHAT = "the study's ablation.json"
    _TYPES = {"steps": _LIST, "trials": _LIST, "target": _STR, "objective": _STR, "maximize": _BOOL,
              "skipped": _STR, "kernels": _INT, "seconds": _NUMBER, "seeds": _INT}
    _ENTRIES = {"steps": AblationStep}
    _ALWAYS = frozenset({"trials", "target", "objective", "maximize", "steps"})


def write_bytes(path: Path | str, data: bytes) -> None:
    """Writes ``data`` to ``path`` via a temporary file, fsync and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, say: leave the old file as it was and no temporary behind
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    """Writes ``data`` as JSON to ``path`` atomically (:func:`write_bytes`)."""
    write_bytes(path, json.dumps(data, indent=1, sort_keys=True, allow_nan=False).encode())


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RecordsError(f"{path} is not valid JSON ({err.msg} at line {err.lineno})") from None
    except UnicodeDecodeError as err:  # bytes that are not text at all (a corrupt disk block, say)
        raise RecordsError(f"{path} is not valid JSON (not UTF-8 text: byte {err.start})") from None
    except OSError as err:  # a folder where the file should be, no permission to read it ...
        raise RecordsError(f"{path} cannot be read ({err.strerror or err})") from None


def config_id(trial: int, index: int) -> str:
    return f"t{trial:04d}c{index}"


_DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT}
_DISK_TEXTS = {t: t for t in map(os.strerror, _DISK_ERRNOS)} | {  # and SQLite's words for them
    "database or disk is full": os.strerror(errno.ENOSPC),
    "attempt to write a readonly database": os.strerror(errno.EROFS)}


def disk_problem(err: BaseException | str | None, folder: Path | None = None) -> str | None:
    """What in ``err`` (or the exceptions it wraps: Tune passes a worker's error on as text; or
    a message) says the disk refuses writes: full, read-only or over quota; None when not that.

    With ``folder``, an I/O error that says none of that (a file vanishing mid-write as the disk
    is remounted read-only; SQLite "unable to open database file" as it cannot create its journal)
    counts too when ``folder`` refuses a write now (:func:`writable`)."""
    if isinstance(err, str):
        err = RuntimeError(err)
    io_error = False
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _DISK_ERRNOS:
            return os.strerror(err.errno)
        text = str(err).lower()
        if found := next((name for t, name in _DISK_TEXTS.items() if t.lower() in text), None):
            return found
        io_error = io_error or isinstance(err, (OSError, sqlite3.Error))
        err = err.__cause__ or err.__context__
    return writable(folder) if folder is not None and io_error else None


def writable(folder: Path) -> str | None:
    """None when a small file can be written in ``folder``, else why not (full, read-only, over quota)."""
    probe = folder / ".write-probe"
    try:
        write_bytes(probe, b"ok" * 2048)
        probe.unlink()
    except OSError as err:
        if err.errno in _DISK_ERRNOS:
            return os.strerror(err.errno)
    return None
