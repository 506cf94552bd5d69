"""On PYTHONPATH, hides this project's packages (harness, envs, algos, studies) from a Python
process when they would come from RL_HARNESS_HIDE_ROOT (the checkout, or its editable install):
a Ray node started with it has only the dependencies, like a fresh cluster node. Copies that
Ray ships through a runtime environment (elsewhere on disk) still import."""

import importlib.machinery
import os
import sys

_HIDDEN = {"harness", "envs", "algos", "studies"}
_ROOT = os.path.abspath(os.environ.get("RL_HARNESS_HIDE_ROOT", "/nonexistent"))


class _HideProject:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in _HIDDEN:
            return None
        paths = [p for p in sys.path if os.path.abspath(p or ".") != _ROOT]
        spec = importlib.machinery.PathFinder.find_spec(name, paths)
        if spec is None or (spec.origin or "").startswith(_ROOT + os.sep):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden on this node)", name=name)
        return spec


sys.meta_path.insert(0, _HideProject)
