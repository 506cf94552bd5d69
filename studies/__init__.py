"""Named studies, one module each: ``studies.get(name) -> Study``.

``get`` also accepts the path of a Python file that defines ``STUDY`` (a user's own study).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path

from harness.space import Study, StudyError


def registered() -> dict[str, Study]:
    """Every study module's ``STUDY``, by name (sorted)."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        study = getattr(importlib.import_module(f"studies.{info.name}"), "STUDY", None)
        if isinstance(study, Study):
            found[study.name] = study
    return dict(sorted(found.items()))


def get(name: str) -> Study:
    """The study called ``name``.

    Raises:
        StudyError: unknown name; the message lists the known studies.
    """
    if name.endswith(".py"):
        return load_file(Path(name))
    studies = registered()
    if name not in studies:
        raise StudyError(f"unknown study {name!r}; known studies: {', '.join(studies)}")
    return studies[name]


def load_file(path: Path) -> Study:
    """The ``STUDY`` defined by the Python file at ``path``.

    Raises:
        StudyError: the file is missing, does not run, or defines no ``STUDY``.
    """
    if not path.is_file():
        raise StudyError(f"no study file at {path}")
    spec = importlib.util.spec_from_file_location(f"_study_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as err:  # a user's file: any error is theirs, reported in one line
        line = getattr(err, "lineno", None)
        where = f"{path}:{line}" if line else str(path)
        raise StudyError(f"study file {where} failed: {type(err).__name__}: {err}") from None
    study = getattr(module, "STUDY", None)
    if not isinstance(study, Study):
        raise StudyError(f"study file {path} must define STUDY = harness.space.Study(...)")
    return study
