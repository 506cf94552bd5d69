"""Coverage of the adapter registries: does every gymnax, Jumanji and Brax env train here?

    python bench/env_coverage.py [--libraries gymnax jumanji brax] [--only NAME ...] [--csv out.csv]

Each env goes through what a study does with it (``harness.coverage.probe``): ``envs.make`` and
``envs.check``, then one trial's kernel (2 configurations x 2 seeds, one chunk of two tiny updates,
one evaluation episode) with PPO, and with SAC too where actions are continuous. One row per env
and algorithm: trains (with compile seconds and env steps/s of the compiled chunk, all lanes), or
refused / failed with the one-line reason a user would see. The last lines count each library's
rows by status. Env steps/s here are for a tiny kernel; bench/env_steps.py measures throughput.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
import time
from pathlib import Path

import _common  # noqa: F401  (sets XLA flags before jax is imported)
import jax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.coverage import LIBRARIES, Row, probe, registry  # noqa: E402


def _fmt(x: float, spec: str) -> str:
    return "" if math.isnan(x) else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=LIBRARIES)
    ap.add_argument("--only", nargs="+", default=None, help="env names (e.g. gymnax:Acrobot-v1)")
    ap.add_argument("--csv", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    names: list[str] = []
    for lib in args.libraries:
        try:
            names += registry(lib)
        except ImportError as err:
            sys.exit(f"{lib} is not installed ({err.name} missing): pip install -e '.[test]'")
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            sys.exit(f"not in the registries swept: {', '.join(unknown)}")
        names = [n for n in names if n in args.only]
    print(f"{len(names)} envs; jax {jax.__version__} on {jax.devices()[0].platform}", flush=True)
    print("| env | algo | status | actions | obs | compile s | steps/s | return | reason |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    rows: list[Row] = []
    t0 = time.perf_counter()
    for name in names:
        for row in probe(name):
            rows.append(row)
            print(f"| {row.env} | {row.algo} | {row.status} | {row.action_space} | {row.obs_shape} | "
                  f"{_fmt(row.compile_s, '.1f')} | {_fmt(row.steps_per_s, ',.0f')} | "
                  f"{_fmt(row.final_return, '.3g')} | {row.reason} |", flush=True)
        jax.clear_caches()  # one kernel per env: keep memory flat over the sweep
    if args.csv:
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, [fl.name for fl in dataclasses.fields(Row)])
            w.writeheader()
            w.writerows(dataclasses.asdict(r) for r in rows)
    print(f"\nswept in {time.perf_counter() - t0:.0f} s")
    for lib in args.libraries:
        mine = [r for r in rows if r.env.startswith(f"{lib}:")]
        envs_ = {r.env for r in mine}
        trains = {r.env for r in mine if r.status == "trains"}
        refused = {r.env for r in mine if r.status == "refused"}
        failed = {r.env for r in mine if r.status == "failed"}
        print(f"{lib}: {len(trains)}/{len(envs_)} envs train, {len(refused)} refused with a reason, "
              f"{len(failed)} fail in the kernel" + (f" ({', '.join(sorted(failed))})" if failed else ""))


if __name__ == "__main__":
    main()
