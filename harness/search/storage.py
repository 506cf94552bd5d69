"""Where a study's Optuna records live: the storage for a URL (an SQLite file shared safely by
concurrent processes), the one line for one that cannot be opened, a free study name in it.
Imports Optuna only (no Ray, no JAX): processes that just read or write records start fast."""

from __future__ import annotations

import fcntl
import functools
from pathlib import Path
from typing import Any

import optuna

from harness.space import StudyError

SQLITE_TIMEOUT = 60.0  # seconds a write waits for another process's lock on an SQLite storage


@functools.cache
def storage(url: str) -> optuna.storages.BaseStorage | str:
    """Optuna storage for ``url``. An SQLite file is shared safely by concurrent processes (several
    studies with one ``--storage``, optuna-dashboard reading): its tables are created under a file
    lock (processes creating them at once fail otherwise) and a write waits up to SQLITE_TIMEOUT s
    for another's lock. Other URLs go to Optuna as they are.

    The file is in SQLite's write-ahead-log mode (kept in the file) and this process commits with
    ``synchronous=NORMAL``: a commit appends to the log without waiting for the disk, so a
    process killed at any point loses no committed write (the next opener reads the log); only
    an operating-system crash or power cut can lose the last commits, never corrupt the file.
    The default rollback-journal mode creates, syncs and deletes a journal file per commit, and a
    lane broker commits several times per configuration it judges or refills (``bench/lane_broker.py``)."""
    if not url.startswith("sqlite:///"):
        return url
    import sqlite3

    import sqlalchemy

    path = Path(url.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with sqlite3.connect(path, timeout=SQLITE_TIMEOUT) as db:  # the log mode, once for the file
            db.execute("pragma journal_mode=wal")
        db.close()
        rdb = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": SQLITE_TIMEOUT}})
    sqlalchemy.event.listen(rdb.engine, "connect", _commit_without_sync)
    rdb.engine.dispose()  # the connections opened before the listener: every later one has it
    return rdb


def _commit_without_sync(connection: Any, _record: Any) -> None:
    connection.execute("pragma synchronous=normal")


def storage_error(url: str, err: BaseException) -> StudyError:
    """The one line for an Optuna storage that cannot be opened (sqlalchemy and Optuna raise many
    kinds for a bad URL): the URL and the error's first line."""
    return StudyError(f"cannot open Optuna storage {url!r}: {str(err).splitlines()[0]}")


def check_storage(url: str) -> None:
    """That the storage at ``url`` can be opened: connected to once and let go (no tables made,
    nothing kept open). An SQLite file is made where its URL says when the study first opens it.

    Raises:
        StudyError: it cannot be opened (an unknown database kind, a server that does not answer).
    """
    if url.startswith("sqlite:///"):
        return
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(url)
        try:
            engine.connect().close()
        finally:
            engine.dispose()
    except Exception as err:  # sqlalchemy raises many kinds for a bad URL
        raise storage_error(url, err) from None


def free_study_name(name: str, url: str) -> str:
    """``name``, or where the storage at ``url`` holds a study of that name already, the first
    free ``name-2``, ``name-3``, ...

    Raises:
        StudyError: the storage cannot be opened.
    """
    try:
        taken = set(optuna.get_all_study_names(storage(url)))
    except Exception as err:  # sqlalchemy/optuna raise many kinds for a bad URL
        raise storage_error(url, err) from None
    out, n = name, 1
    while out in taken:
        n += 1
        out = f"{name}-{n}"
    return out
