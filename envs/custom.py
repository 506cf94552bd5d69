"""Environments named by where their code is: ``"package.module:attr"`` or ``"path/file.py:attr"``.

``attr`` may be a dotted path (``"my_study.py:STUDY.env"``) and may name an
:class:`~envs.core.Environment` instance, an ``Environment`` subclass (built with no
arguments), or a factory returning an ``Environment`` or ``(env, params)``.

A file is executed once per process (cached by its absolute path) with its folder on
``sys.path``, so a module next to it can be imported by it and by ``"module:attr"`` names.
A file that is not found at its absolute path is looked up by its name in the working
directory (where Ray puts shipped code on a worker).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

from envs.core import Environment

_FILES: dict[str, ModuleType] = {}


class EnvSpecError(ValueError):
    """A ``module:attr`` or ``file.py:attr`` env name that cannot be built."""


def is_code_spec(name: str) -> bool:
    """Whether ``name`` points at code rather than at a registered env or an adapter library."""
    if ":" not in name:
        return False
    where = name.rsplit(":", 1)[0]
    return where.endswith(".py") or "." in where or "/" in where or _importable(where)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def load_file(path: Path, module_name: str | None = None) -> ModuleType:
    """Executes the Python file at ``path`` once per process (its folder goes on ``sys.path``).

    Raises:
        EnvSpecError: no such file, or it raised while running (the error in one line).
    """
    if not path.is_file() and (Path.cwd() / path.name).is_file():
        path = Path.cwd() / path.name  # shipped to a Ray worker's working directory
    if not path.is_file():
        raise EnvSpecError(f"no Python file at {path}")
    path = path.resolve()
    if str(path) in _FILES:
        return _FILES[str(path)]
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = module_name or f"_rl_harness_file_{path.stem}_{zlib.crc32(str(path).encode()):08x}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module  # dataclasses and pickling look classes up by module name
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as err:  # a user's file: any error is theirs, reported in one line
        del sys.modules[name]
        line = getattr(err, "lineno", None) or _user_line(err, path)
        where = f"{path}:{line}" if line else str(path)
        raise EnvSpecError(f"{where} failed: {type(err).__name__}: {err}") from None
    _FILES[str(path)] = module
    return module


def _user_line(err: BaseException, path: Path) -> int | None:
    tb, line = err.__traceback__, None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename) == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def build(obj: Any, what: str) -> tuple[Environment, Any]:
    """``(env, params)`` from an env instance, an env class or a factory (``what`` names it in errors)."""
    if isinstance(obj, type) and issubclass(obj, Environment):
        obj = obj()
    elif callable(obj) and not isinstance(obj, Environment):
        try:
            obj = obj()
        except Exception as err:
            raise EnvSpecError(f"{what}() failed: {type(err).__name__}: {err}") from None
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], Environment):
        return obj[0], obj[1]
    if isinstance(obj, Environment):
        return obj, obj.default_params
    raise EnvSpecError(f"{what} must be an envs.Environment, an Environment class, or a factory returning "
                       f"one or (env, params); got {type(obj).__name__}")


def make_from_code(name: str) -> tuple[Environment, Any]:
    """``(env, params)`` for ``"module:attr"`` or ``"file.py:attr"``.

    Raises:
        EnvSpecError: the module or file cannot be loaded, ``attr`` is missing, or it is not an env.
    """
    where, attr = name.rsplit(":", 1)
    if where.endswith(".py") or "/" in where:
        module = load_file(Path(where))
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            raise EnvSpecError(f"env {name!r}: cannot import {where!r} ({err})") from None
        except Exception as err:
            raise EnvSpecError(f"env {name!r}: importing {where!r} failed: {type(err).__name__}: {err}") from None
    obj: Any = module
    parts = attr.split(".")
    for k, part in enumerate(parts):
        if not hasattr(obj, part):
            inside = ".".join([where, *parts[:k]]) if k else where
            found = _env_like(obj)
            has = f"has {', '.join(found)}" if found else "defines no env class, env or function"
            raise EnvSpecError(f"env {name!r}: {where} has no {attr!r}; {inside} {has}")
        obj = getattr(obj, part)
    return build(obj, name)


def _env_like(obj: Any) -> list[str]:
    """The public names of ``obj`` (a module, or a class on the way to ``attr``) that ``build`` could
    take: Environment classes and instances, and functions defined there (a factory may be one)."""
    import inspect

    names = []
    for key in sorted(vars(obj) if hasattr(obj, "__dict__") else dir(obj)):
        try:
            value = getattr(obj, key, None)
        except Exception:  # noqa: BLE001 - a property that raises: not a candidate
            continue
        if key.startswith("_") or value is Environment:
            continue
        if (isinstance(value, type) and issubclass(value, Environment) or isinstance(value, Environment)
                or inspect.isfunction(value) and value.__module__ == getattr(obj, "__name__", None)):
            names.append(key)
    return names
