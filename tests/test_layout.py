"""The layout of ``harness/`` (docs/architecture.md), read from the source with ``ast``: which
subpackage may import which (every import, at a module's top or inside a function), who imports
``studies``, where Ray and Optuna may be imported, and that the JAX core stays framework-free."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# High to low: a module may import modules of its own layer and of the layers below it, never above.
LAYERS = (
    "commands",  # harness.study, harness.play, harness.train (and the package's public API, harness/__init__.py)
    "phases",  # the search, the final re-training, the ablation path
    "cluster",  # Ray: the session, placement and device-memory fitting, the Tune wiring, the trainable
    "driver",  # the resolved settings, the disk guard, the console lines, the --time plan
    "lanes",  # lane-level successive halving: the broker (Optuna's side) and the trial's side
    "search",  # the Optuna searcher and storage
    "reports",  # what the records show, and harness.report: the reports' builder and its command
    "store",  # the results folder and the records in it
    "base",  # harness.space (the study-definition API) and harness.cli (the commands' parser)
    "kernel",  # the trial as plain data, its statistics, its compiled kernel, runners: imports none of the others
)
TOP_LEVEL = {"harness": "commands", "harness.study": "commands", "harness.play": "commands",
             "harness.train": "commands", "harness.report": "reports", "harness.space": "base",
             "harness.cli": "base"}
# Ray and Optuna imported at a module's top: only where the module is about them. Everywhere else they are
# imported inside functions, so the driver imports its modules before Ray reads the variables the session
# sets (harness.cluster.session.start) and a worker imports no Optuna.
TOP_RAY = {"harness.cluster.tuning", "harness.cluster.trainable", "harness.search.searcher"}
TOP_OPTUNA = {"harness.search.searcher", "harness.search.storage", "harness.search.optuna_private",
              "harness.lanes.broker"}


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


HARNESS = _modules("harness")


def _imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(what ``module`` imports, its line, at the module's top): ``from a.b import c`` is ``a.b.c``
    where that is a module, else ``a.b``; relative imports resolved."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    top |= {id(n) for node in tree.body if isinstance(node, ast.If | ast.Try) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in HARNESS else base for a in node.names]
        else:
            continue
        out += [(name, node.lineno, id(node) in top) for name in names]
    return out


def layer(module: str) -> str:
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    sub = module.split(".")[1]
    assert sub in LAYERS, f"{module}: harness/{sub}/ is in no layer of tests/test_layout.py's LAYERS"
    return sub


def _harness_target(name: str) -> str | None:
    """The harness module an import names (its longest prefix that is one), or None outside harness."""
    while name and name not in HARNESS:
        name = name.rpartition(".")[0]
    return name or None


def test_layout__every_module_of_harness_is_in_a_layer():
    for module in HARNESS:
        layer(module)


def test_layout__subpackages_import_only_their_own_layer_and_those_below_it():
    wrong = []
    for module, path in HARNESS.items():
        for name, line, _ in _imports(module, path):
            target = _harness_target(name)
            if target is None or target == module:
                continue
            a, b = layer(module), layer(target)
            if LAYERS.index(b) < LAYERS.index(a):
                allowed = ", ".join(LAYERS[LAYERS.index(a):])
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {module} ({a}) imports {name} ({b}); "
                             f"{a} may import only {allowed}")
    assert not wrong, "imports against the layers' order (docs/architecture.md):\n" + "\n".join(wrong)


def test_layout__no_module_of_harness_imports_itself_back_in_a_circle():
    edges = {m: set() for m in HARNESS}
    for module, path in HARNESS.items():
        for name, _, _ in _imports(module, path):
            if (target := _harness_target(name)) not in (None, module):
                edges[module].add(target)

    def reaches(start: str, goal: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in sorted(edges[node]):
                if nxt == goal:
                    return trail + [nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + [nxt]))
        return None

    circles = [" -> ".join(c) for m in HARNESS if (c := reaches(m, m))]
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_layout__only_the_study_command_imports_studies():
    wrong = [f"{path.relative_to(ROOT)}:{line}: {module} imports {name}"
             for module, path in HARNESS.items() if module != "harness.study"
             for name, line, _ in _imports(module, path) if name.split(".")[0] == "studies"]
    assert not wrong, "only harness.study (the CLI) reads the registered studies:\n" + "\n".join(wrong)


def test_layout__ray_and_optuna_are_imported_at_a_modules_top_only_where_it_is_about_them():
    wrong = []
    for module, path in HARNESS.items():
        for name, line, at_top in _imports(module, path):
            lib = name.split(".")[0]
            if at_top and (lib == "ray" and module not in TOP_RAY or lib == "optuna" and module not in TOP_OPTUNA):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {name} at its top")
    assert not wrong, "Ray or Optuna imported at import time outside their modules:\n" + "\n".join(wrong)


def test_layout__the_kernel_the_store_and_the_study_api_import_no_ray_or_optuna_and_the_reports_no_ray():
    wrong = []
    for module, path in HARNESS.items():
        banned = {"kernel": {"ray", "optuna"}, "store": {"ray", "optuna", "jax"}, "reports": {"ray"}}.get(
            layer(module), set())
        if module == "harness.space":
            banned = {"ray", "optuna", "jax", "numpy"}
        wrong += [f"{path.relative_to(ROOT)}:{line}: {module} imports {name}"
                  for name, line, _ in _imports(module, path) if name.split(".")[0] in banned]
    assert not wrong, "\n".join(wrong)


def test_layout__the_jax_core_imports_neither_harness_ray_nor_optuna():
    wrong = []
    for package in ("envs", "algos"):
        for module, path in _modules(package).items():
            wrong += [f"{path.relative_to(ROOT)}:{line}: {module} imports {name}"
                      for name, line, _ in _imports(module, path)
                      if name.split(".")[0] in ("harness", "studies", "ray", "optuna")]
    assert not wrong, "envs/ and algos/ are the pure JAX core:\n" + "\n".join(wrong)


def test_api__a_study_file_imports_its_names_from_harness_without_jax_ray_or_optuna():
    code = ("import sys, harness, harness.space as space\n"
            "assert sorted(harness.__all__) == sorted(n for n in harness.__all__ if hasattr(harness, n))\n"
            "assert all(getattr(harness, n) is getattr(space, n) for n in harness.__all__)\n"
            "print(sorted(harness.__all__))\n"
            "heavy = {'jax', 'ray', 'optuna', 'numpy', 'pandas'}\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    names, heavy = r.stdout.splitlines()
    assert names == str(sorted(["Budget", "Categorical", "Int", "LogUniform", "PBT", "Study", "StudyError",
                                "Uniform"]))
    assert heavy == "[]"
    for path in (ROOT / "studies").glob("*.py"):  # the registered studies use the package's names
        assert [n for n, _, _ in _imports("studies", path) if n.startswith("harness.")] == [], path
