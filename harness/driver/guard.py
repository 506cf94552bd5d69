"""The disk-error policy: a full or read-only results disk stops the study in one line.

One :class:`DiskGuard` per invocation, handed to each phase. It decides whether an error is the
results disk refusing writes, remembers the first such problem, and says so in one line with
the resume command. The Tune-facing adapters (a searcher wrapper, a callback, a stopper, a log
filter) are thin shells over it in :mod:`harness.cluster.tuning`. Nothing here imports Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from harness.space import StudyError
from harness.store.folder import ResultsFolder
from harness.store.records import disk_problem, writable

T = TypeVar("T")


class DiskGuard:
    """Whether the results disk has refused a write, and what to do then.

    Args:
        folder: the study's results folder.
        resume_command: printed in the error, so the user can go on once the disk is fixed.
    """

    def __init__(self, folder: ResultsFolder, resume_command: str) -> None:
        self.folder, self.resume_command = folder, resume_command
        self.problem: str | None = None  # "No space left on device", ...: the study stops

    @property
    def tripped(self) -> bool:
        return self.problem is not None

    def note(self, err: BaseException | str | None, *, probe: bool = True) -> bool:
        """Records ``err`` if it says the results disk refuses writes (with ``probe``, also an I/O
        error while the folder refuses a test write); True when it did."""
        problem = disk_problem(err, self.folder.root if probe else None)
        if problem and not self.problem:
            self.problem = problem
        return problem is not None

    def note_if_unwritable(self) -> None:
        """After a trial failed: the disk may be why (its checkpoint could not be saved)."""
        self.problem = self.problem or writable(self.folder.root)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """``fn(*args, **kwargs)``, unless the guard has tripped (then None); a disk error inside it
        trips the guard and returns None, any other error propagates."""
        if self.tripped:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            if not self.note(err):
                raise
            return None

    def error(self) -> StudyError:
        """The one line a tripped guard ends the study with."""
        recorded = len(self.folder.read_trials()[0])
        return StudyError(f"cannot write to the results folder {self.folder.root} ({self.problem}); the trials "
                          f"recorded so far ({recorded}) are intact. Free space (or make it writable), then "
                          f"resume with: {self.resume_command}")

    def raise_if_tripped(self) -> None:
        if self.tripped:
            raise self.error() from None
