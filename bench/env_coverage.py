"""Coverage of the adapter registries: does every gymnax, Jumanji and Brax env run through the kernel here?

    python bench/env_coverage.py [--libraries gymnax jumanji brax] [--only NAME ...] [--csv out.csv]
                                 [--brax-backend positional] [--draws-only]

Each env goes through what a study does with it, in a process of its own (an env that hangs costs
its row after ``--timeout`` s, not the sweep) (``harness.reports.coverage.probe``): ``envs.make`` and
``envs.check``, then one trial's kernel (2 configurations x 2 seeds, one chunk of two tiny updates,
one evaluation episode) with PPO, and with SAC too where actions are continuous. One row per env
and algorithm: runs (no run diverged, every run's policy moved: not a claim that it learns; with
compile seconds and env steps/s of the compiled chunk, all lanes), or refused / failed with the
one-line reason a user would see; and whether ``harness.play`` can draw
the env (``harness.coverage.draws``: its reset state, as a GIF's frame). The last lines count each library's
rows by status. Env steps/s here are for a tiny kernel; bench/env_steps.py measures throughput.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import _common  # noqa: F401  (sets XLA flags before jax is imported)
import jax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.reports.coverage import LIBRARIES, Row, probe, registry  # noqa: E402


def _fmt(x: float, spec: str) -> str:
    return "" if math.isnan(x) else format(x, spec)


def _probe_apart(name: str, timeout: float) -> list[Row]:
    """``probe(name)`` in a process of its own: an env that hangs or crashes costs one row, not the sweep."""
    cmd = [sys.executable, __file__, "--one", name]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [Row(name, "-", "failed", reason=f"no result within {timeout:.0f} s (hangs or too slow here)")]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return [Row(name, "-", "failed", reason=f"the probe process exited {r.returncode}: {tail}")]
    return [Row(**json.loads(ln)) for ln in lines]


def _sweep_draws(names: list[str], libraries: list[str]) -> None:
    """Whether ``harness.play`` draws each env: one row each, with the reason where it does not."""
    import envs
    from harness.reports.coverage import draws

    print("| env | drawn by play | s |")
    print("|---|---|---|", flush=True)
    drawn: dict[str, list[bool]] = {lib: [] for lib in libraries}
    t0 = time.perf_counter()
    for name in names:
        t = time.perf_counter()
        try:
            env, params = envs.make(name)
        except ValueError as err:  # envs.UnknownEnvError: refused when made (Sokoban, MNISTBandit ...)
            found = f"not made: {str(err).splitlines()[0]}"
        else:
            found = draws(env, params)
        drawn[name.split(":", 1)[0]].append(found == "yes")
        print(f"| {name} | {found} | {time.perf_counter() - t:.1f} |", flush=True)
    print(f"\nswept in {time.perf_counter() - t0:.0f} s")
    for lib, got in drawn.items():
        print(f"{lib}: harness.play draws {sum(got)}/{len(got)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=LIBRARIES)
    ap.add_argument("--only", nargs="+", default=None, help="env names (e.g. gymnax:Acrobot-v1)")
    ap.add_argument("--csv", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--brax-backend", default="positional",
                    help="physics backend for the Brax envs (default positional, the cheapest to compile on a "
                         "CPU; an env that does not run on it gets its own default; '' for each env's own)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one env may take (default 600)")
    ap.add_argument("--same-process", action="store_true",
                    help="probe every env in this process (faster; no timeout, a hang stops the sweep)")
    ap.add_argument("--draws-only", action="store_true",
                    help="only whether harness.play draws each env (its reset state; no trial, one process)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: probe this env, rows as JSON lines
    args = ap.parse_args()
    if args.one:
        for row in probe(args.one):
            print(json.dumps(dataclasses.asdict(row)), flush=True)
        return
    if "brax" in args.libraries:  # before Brax (registry) imports MuJoCo, which reads MUJOCO_GL once
        from harness.reports.render import use_offscreen_gl

        use_offscreen_gl()
    names: list[str] = []
    for lib in args.libraries:
        try:
            found = registry(lib)
        except ImportError as err:
            sys.exit(f"{lib} is not installed ({err.name} missing): pip install -e '.[test]'")
        backend = args.brax_backend if lib == "brax" and not args.draws_only else ""  # drawn on its own
        names += [f"{n}:{backend}" for n in found] if backend else found
    if args.only:
        outside = [n for n in args.only if n.split(":", 1)[0] not in args.libraries]
        if outside:
            sys.exit(f"--only {' '.join(outside)}: not in the libraries swept ({', '.join(args.libraries)})")
        names = list(args.only)
    print(f"{len(names)} envs; jax {jax.__version__} on {jax.devices()[0].platform}", flush=True)
    if args.draws_only:
        _sweep_draws(names, args.libraries)
        return
    print("| env | algo | status | actions | obs | compile s | steps/s | return | drawn by play | reason |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    rows: list[Row] = []
    t0 = time.perf_counter()
    for name in names:
        found = probe(name) if args.same_process else _probe_apart(name, args.timeout)
        if name.startswith("brax:") and name.count(":") == 2 and "does not run on the" in found[0].reason:
            name = name.rpartition(":")[0]  # an env that has one backend only (swimmer): its own
            found = probe(name) if args.same_process else _probe_apart(name, args.timeout)
        for row in found:
            rows.append(row)
            print(f"| {row.env} | {row.algo} | {row.status} | {row.action_space} | {row.obs_shape} | "
                  f"{_fmt(row.compile_s, '.1f')} | {_fmt(row.steps_per_s, ',.0f')} | "
                  f"{_fmt(row.final_return, '.3g')} | {row.draws} | {row.reason} |", flush=True)
    if args.csv:
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, [fl.name for fl in dataclasses.fields(Row)])
            w.writeheader()
            w.writerows(dataclasses.asdict(r) for r in rows)
    print(f"\nswept in {time.perf_counter() - t0:.0f} s")
    for lib in args.libraries:
        mine = [r for r in rows if r.env.startswith(f"{lib}:")]
        envs_ = {r.env for r in mine}
        ran = {r.env for r in mine if r.status == "runs"}
        refused = {r.env for r in mine if r.status == "refused"}
        failed = {r.env for r in mine if r.status == "failed"}
        drawn = {r.env for r in mine if r.draws == "yes"}
        print(f"{lib}: {len(ran)}/{len(envs_)} envs run through the kernel, {len(refused)} refused with a reason, "
              f"{len(failed)} fail in the kernel" + (f" ({', '.join(sorted(failed))})" if failed else "")
              + f"; harness.play draws {len(drawn)}/{len(envs_)}")


if __name__ == "__main__":
    main()
