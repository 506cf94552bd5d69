"""Files written atomically (a crash never leaves half a file), and what a disk error looks like.

The layout of a results folder is :mod:`harness.store.folder`'s alone.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any


class RecordsError(ValueError):
    """A results folder that is missing or does not hold what it should."""


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
