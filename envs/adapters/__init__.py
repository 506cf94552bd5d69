"""Adapters to other JAX environment libraries (optional extras: ``pip install -e .[adapters]``).

``envs.make("gymnax:Acrobot-v1")``, ``envs.make("jumanji:Snake-v1")`` or ``envs.make("brax:ant")``
come here; nothing in ``envs`` or ``algos`` imports this package otherwise, so gymnax, Jumanji
and Brax stay optional (Brax: ``pip install -e .[brax]``).
"""

from __future__ import annotations

import importlib
from typing import Any

from envs.core import Environment

LIBRARIES = ("gymnax", "jumanji", "brax")


def make(library: str, name: str, **param_overrides: Any) -> tuple[Environment, Any]:
    """``library``'s env ``name`` behind our interface, with its default params.

    Raises:
        ValueError: unknown library, library not installed, or unknown name in it.
    """
    if library not in LIBRARIES:
        raise ValueError(f"unknown env library {library!r}; adapters: {', '.join(LIBRARIES)}")
    try:  # the library itself first: its builders import it only when called
        importlib.import_module(library)
    except ImportError as err:
        raise ValueError(f"{library}:{name} needs {library}, which is not installed ({err.name} missing): "
                         f"pip install -e '.[{'brax' if library == 'brax' else 'adapters'}]'") from None
    if library == "gymnax":
        from envs.adapters.gymnax import make_gymnax as build
    elif library == "brax":
        from envs.adapters.brax import make_brax as build
    else:
        from envs.adapters.jumanji import make_jumanji as build
    return build(name, **param_overrides)
