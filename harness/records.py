"""What a study keeps on disk, written atomically so a crash never leaves half a file.

    results/NAME/study.json          the study's name and the options it was started with
    results/NAME/trials/NNNN.json    one record per finished Tune trial (C configurations)
    results/NAME/final.json          the re-training of the best configurations on fresh seeds
    results/NAME/optuna.db           the Optuna study (SQLite)
    results/NAME/tune/run-K/         Ray Tune's experiment folder, one per (re)start (mid-run
                                     kernel checkpoints of trials not yet recorded)
    results/NAME/inflight/NNNN.json  a trial proposed and not yet recorded: what a resumed study
                                     needs to go on with it (plan, Optuna trials, Tune trial ids)
    results/NAME/ray-session.json    the driver and session folder of the embedded Ray
    results/NAME/reports/            CSV reports and best.json, rebuilt from the above
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


class RecordsError(ValueError):
    """A results folder that is missing or does not hold what it should."""


def write_json(path: Path, data: Any) -> None:
    """Writes ``data`` to ``path`` via a temporary file and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RecordsError(f"{path} is not valid JSON ({err.msg} at line {err.lineno})") from None


def config_id(trial: int, index: int) -> str:
    return f"t{trial:04d}c{index}"


def trial_path(root: Path, trial: int) -> Path:
    return root / "trials" / f"{trial:04d}.json"


def load_meta(root: Path) -> dict[str, Any]:
    path = root / "study.json"
    if not path.exists():
        raise RecordsError(f"{root} is not a study's results folder (no study.json)")
    return read_json(path)


def load_trials(root: Path) -> list[dict[str, Any]]:
    """Every trial record under ``root/trials``, by trial number."""
    return sorted((read_json(p) for p in (root / "trials").glob("*.json")), key=lambda r: r["trial"])


def load_final(root: Path) -> dict[str, Any] | None:
    path = root / "final.json"
    return read_json(path) if path.exists() else None
