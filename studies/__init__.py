"""Named studies: ``studies.get(name) -> Study``.

Built in: one module per study in this package, each defining ``STUDY``. Installed packages
add theirs through the entry-point group ``rl_harness.studies`` (each entry point names a
``Study`` or a module defining ``STUDY``). ``get`` also accepts the path of a Python file that
defines ``STUDY`` (a user's own study), whose env may be defined in that file or next to it, and
whose algorithm may be a file beside it (``algo="my_algo.py:SPEC"``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import pkgutil
from pathlib import Path
from types import ModuleType

from harness import Study, StudyError

ENTRY_POINTS = "rl_harness.studies"


def _builtin() -> dict[str, Study]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        study = getattr(importlib.import_module(f"studies.{info.name}"), "STUDY", None)
        if isinstance(study, Study):
            found[study.name] = study
    return found


def _plugins() -> dict[str, Study]:
    """Studies registered by installed packages. A broken entry point is reported, not skipped."""
    found = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINTS):
        where = f"entry point {ep.name!r} ({ep.value}) of {ENTRY_POINTS}"
        try:
            obj = ep.load()
        except Exception as err:
            raise StudyError(f"{where} failed to load: {type(err).__name__}: {err}") from None
        study = getattr(obj, "STUDY", None) if isinstance(obj, ModuleType) else obj
        if not isinstance(study, Study):
            raise StudyError(f"{where} must name a harness.space.Study or a module defining STUDY")
        found[study.name] = _with_env_name(study, f"{ep.module}:{ep.attr or 'STUDY'}")
    return found


def registered() -> dict[str, Study]:
    """Every built-in and installed study, by name (sorted). A built-in name wins a clash."""
    return dict(sorted({**_plugins(), **_builtin()}.items()))


def get(name: str) -> Study:
    """The study called ``name``, or the ``STUDY`` of the file ``name`` (ends in ``.py``).

    Raises:
        StudyError: unknown name; the message lists the known studies.
    """
    if name.endswith(".py"):
        return load_file(Path(name))
    builtin = _builtin()
    if name in builtin:
        return builtin[name]
    studies = registered()
    if name not in studies:
        raise StudyError(f"unknown study {name!r}; known studies: {', '.join(studies)} "
                         "(or the path of a study file, my_study.py)")
    return studies[name]


def load_file(path: Path) -> Study:
    """The ``STUDY`` defined by the Python file at ``path`` (its folder goes on ``sys.path``).

    An env the study holds as an object becomes the name ``"/abs/path/file.py:STUDY.env"``,
    which any process (a Ray worker) can rebuild.

    Raises:
        StudyError: the file is missing, does not run, or defines no ``STUDY``.
    """
    from envs.custom import EnvSpecError
    from envs.custom import load_file as run_file

    if not path.is_file():
        raise StudyError(f"no study file at {path}")
    try:
        module = run_file(path)
    except EnvSpecError as err:
        raise StudyError(f"study file {err}") from None
    study = getattr(module, "STUDY", None)
    if not isinstance(study, Study):
        raise StudyError(f"study file {path} must define STUDY = harness.space.Study(...)")
    study = _with_algo_beside(study, path.resolve().parent)
    return dataclasses.replace(_with_env_name(study, f"{path.resolve()}:STUDY"), source=str(path.resolve()))


def _with_algo_beside(study: Study, folder: Path) -> Study:
    """``study`` with a relative ``algo="file.py:attr"`` made absolute when the file is beside the study
    file (where a user keeps it), so any working directory and any worker finds it."""
    where, sep, attr = study.algo.rpartition(":") if isinstance(study.algo, str) else ("", "", "")
    if not sep or not where.endswith(".py") or Path(where).is_absolute() or not (folder / where).is_file():
        return study
    return dataclasses.replace(study, algo=f"{(folder / where).resolve()}:{attr}")


def _with_env_name(study: Study, where: str) -> Study:
    """``study`` with its env as a name: an env object is named by the study's own place
    (``where``, ``"module:STUDY"`` or ``"/path/file.py:STUDY"``) plus ``.env``."""
    return study if isinstance(study.env, str) else dataclasses.replace(study, env=f"{where}.env")
