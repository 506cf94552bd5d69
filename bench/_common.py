"""Side-by-side timing helpers for the benchmarks: compile and run measured separately."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import re  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402

HLO_DIR: Path | None = None  # --hlo DIR: each compiled program's optimized HLO is written there


def compile_and_time(fn: Callable, *args: Any, name: str | None = None) -> tuple[Callable, float]:
    """AOT-compiles ``jax.jit(fn)`` for ``args``; returns the executable and seconds taken. With
    ``HLO_DIR`` set and a ``name``, writes the optimized program to ``HLO_DIR/name.hlo`` (read with
    no device time: which kernels each loop body launches)."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    seconds = time.perf_counter() - t0
    if HLO_DIR is not None and name:
        HLO_DIR.mkdir(parents=True, exist_ok=True)
        text = compiled.as_text()
        (HLO_DIR / f"{name}.hlo").write_text(text)
        count = lambda op: len(re.findall(rf" {op}\(", text))  # noqa: E731
        print(f"hlo {name}: {count('fusion')} fusions, {count('custom-call')} custom calls, "
              f"{count('while')} loops -> {HLO_DIR / (name + '.hlo')}", flush=True)
    return compiled, seconds


def time_whole_run(algo: Any, keys: jax.Array, hp: Any, eval_keys: jax.Array) -> tuple[Any, float, float]:
    """Compiles init + one chunk + evaluation of ``algo`` over ``[C, S]`` lanes as one function,
    then runs it; returns (evaluation return per lane, compile seconds, run seconds)."""
    from algos.common import batched

    def train(keys: jax.Array, hp: Any, eval_keys: jax.Array) -> jax.Array:
        state = batched(algo.init)(keys, hp)
        state, _ = batched(algo.chunk)(state, hp)
        return batched(algo.evaluate, hparams_argnum=None)(state, eval_keys).return_mean

    fn, compile_s = compile_and_time(train, keys, hp, eval_keys, name=f"us_{keys.size}")
    returns, run_s = timed(lambda: fn(keys, hp, eval_keys))
    return returns, compile_s, run_s


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Runs ``fn`` to completion (blocking on its arrays); returns its result and seconds."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


def run_rejax(algo: Any, seeds: int, steps_per_seed: int) -> dict:
    """Compiles and times a rejax algorithm's ``train`` vmapped over ``seeds``; one result row.

    Its single evaluation (``eval_freq = total_timesteps``) is part of the timed run.
    """
    keys = jax.random.split(jax.random.key(0), seeds)

    def train(keys: jax.Array) -> jax.Array:
        _, (_, returns) = jax.vmap(algo.train)(keys)
        return returns[:, -1].mean(-1)

    fn, compile_s = compile_and_time(train, keys, name=f"rejax_{seeds}")
    returns, run_s = timed(lambda: fn(keys))
    return dict(impl="rejax", seeds=seeds, compile_s=compile_s, run_s=run_s,
                sps=steps_per_seed * seeds / run_s, **{"return": float(returns.mean())})


def report(rows: list[dict], ratio_key: int) -> None:
    """Prints one line per run and the closing ``ratio us/rejax`` at ``ratio_key`` seeds."""
    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}")
    print(f"{'impl':6} {'seeds':>6} {'compile_s':>10} {'run_s':>8} {'steps/s':>12} {'return':>9}")
    for r in rows:
        print(f"{r['impl']:6} {r['seeds']:>6} {r['compile_s']:>10.2f} {r['run_s']:>8.2f} "
              f"{r['sps']:>12,.0f} {r['return']:>9.1f}")
    by = {(r["impl"], r["seeds"]): r for r in rows}
    for seeds in sorted({r["seeds"] for r in rows}):
        if ("us", seeds) in by and ("rejax", seeds) in by:
            print(f"ratio us/rejax at {seeds} seeds: "
                  f"{by['us', seeds]['sps'] / by['rejax', seeds]['sps']:.2f}")
    print(f"ratio us/rejax: {by['us', ratio_key]['sps'] / by['rejax', ratio_key]['sps']:.2f}")


def main(doc: str, run_ours: Callable, run_rejax: Callable, *, default_timesteps: int) -> None:
    """Parses ``--seeds``/``--timesteps``, runs ours then rejax per seed count, prints the report."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--timesteps", type=int, default=default_timesteps)
    parser.add_argument("--hlo", type=Path, help="write each compiled program's optimized HLO to this folder")
    args = parser.parse_args()
    global HLO_DIR
    HLO_DIR = args.hlo
    rows = []
    for seeds in args.seeds:
        for runner in (run_ours, run_rejax):
            rows.append(runner(seeds, args.timesteps))
            print(rows[-1], flush=True)
    report(rows, ratio_key=max(args.seeds))
