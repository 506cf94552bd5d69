"""Train one algorithm on one environment over several seeds in one kernel, from the shell.

    python -m harness.train --algo ppo --env CartPole-v1 --seeds 4
    python -m harness.train --algo sac --env Pendulum-v1 --timesteps 20000 --set hidden=64,64

Prints progress after every chunk (env steps, mean return of finished episodes, steps/s)
and each seed's evaluation return at the end (the deterministic policy's unless the config
sets eval_policy=sample).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

from harness.cli import Parser
from harness.kernel.device import configure_xla
from harness.space import out_of_range


class UsageError(Exception):
    """A user mistake: reported as one line, exit status 2."""


def _parse_value(text: str, default: Any) -> Any:
    if isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"expected true/false, got {text!r}")
        return text.lower() in ("true", "1")
    if isinstance(default, tuple):
        return tuple(int(x) for x in text.split(",") if x)
    return type(default)(text) if default is not None else text


def split_overrides(spec: Any, items: list[str]) -> tuple[dict, dict]:
    """``key=value`` strings into (static config overrides, hyperparameter overrides)."""
    config_fields = {f.name: f.default for f in dataclasses.fields(spec.config_cls)}
    hp_fields = [f.name for f in dataclasses.fields(spec.hparams_cls)]
    config, hparams = {}, {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError("expected key=value")
            if key in config_fields:
                config[key] = _parse_value(value, config_fields[key])
            elif key in hp_fields:
                hparams[key] = float(value)
                if why := out_of_range(spec.hparams_cls, key, hparams[key]):
                    raise UsageError(f"--set {item}: {why}")
            else:
                known = ", ".join(sorted([*config_fields, *hp_fields]))
                raise UsageError(f"--set {item}: unknown setting {key!r} for {spec.name}; "
                                 f"known: {known}")
        except ValueError as err:
            raise UsageError(f"--set {item}: {err}") from None
    return config, hparams


def main(argv: list[str] | None = None) -> int:
    parser = Parser("python -m harness.train", __doc__)
    parser.add_argument("--algo", default="ppo",
                        help="ppo, sac, pqn, an installed one, or your own: module:attr or file.py:attr "
                             "(default ppo)")
    parser.add_argument("--env", default="CartPole-v1", help="a registered environment")
    parser.add_argument("--seeds", type=int, default=4, help="seeds trained in one kernel")
    parser.add_argument("--seed", type=int, default=0,
                        help="base seed (default 0); with --config-key, the study's seed")
    parser.add_argument("--config-key", type=int, metavar="N",
                        help="the keys a study gives its configuration N (the Optuna number in configs.csv; a "
                             "study with --scheduler lanes keys every configuration so): with that study's "
                             "--seed, its values and --timesteps, the search's seeds and final evaluation again")
    parser.add_argument("--timesteps", type=int, help="env steps per seed (config default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a static config field or hyperparameter, e.g. lr=3e-4")
    parser.add_argument("--schedule", metavar="FILE",
                        help='hyperparameters that change between chunks, a JSON list of {"chunk": K, '
                             '"hparams": {...}} each in effect after chunk K (a PBT lineage: a study writes '
                             "results/NAME/schedules/<config>.json)")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    configure_xla()
    import jax
    import numpy as np

    import algos
    import envs

    try:
        spec = algos.get(args.algo)
        env, env_params = envs.make(args.env)
    except (algos.UnknownAlgoError, envs.UnknownEnvError) as err:
        raise UsageError(str(err)) from None
    if args.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {args.seeds}")
    if args.config_key is not None and min(args.config_key, args.seed) < 0:
        raise UsageError(f"--config-key and --seed must be >= 0 with --config-key (an Optuna number and a "
                         f"study's seed), got {args.config_key} and {args.seed}")
    config_kw, hp_kw = split_overrides(spec, args.set)
    if args.timesteps is not None:
        config_kw["total_timesteps"] = args.timesteps
    from algos.check import AlgoContractError, check

    try:
        config = spec.config_cls(**config_kw)
        algo = check(spec, env, env_params, config, trace=not algos.is_builtin(args.algo))
        algo = algo or spec.make(config, env, env_params)
    except AlgoContractError as err:
        raise UsageError(str(err)) from None
    except ValueError as err:
        raise UsageError(f"{spec.name} on {args.env}: {err}") from None
    schedule = _schedule(args.schedule, spec, config.num_chunks) if args.schedule is not None else {}

    def stacked(overrides: dict[str, float]) -> Any:
        return jax.tree.map(lambda x: x[None], spec.hparams_cls.default(**{**hp_kw, **overrides}))

    hp = stacked({})
    if args.config_key is not None:  # the keys a study gives this configuration
        from harness.kernel.compile import config_keys
        from harness.kernel.plan import SEARCH

        keys, eval_keys = config_keys(args.seed, [args.config_key], SEARCH, args.seeds)
    else:
        keys = jax.random.split(jax.random.key(args.seed), args.seeds)[None]
        eval_keys = jax.random.split(jax.random.key(args.seed + 1_000_003), args.seeds)[None]
    init = jax.jit(algos.batched(algo.init))
    run = jax.jit(algos.batched(algo.chunk))
    print(f"{spec.name} on {args.env}: {args.seeds} seeds x {config.total_timesteps:,} steps, "
          f"{config.num_chunks} chunks")
    t0 = time.perf_counter()
    state = init(keys, hp)
    steps_done = 0
    for i in range(config.num_chunks):
        t = time.perf_counter()
        state, m = run(state, hp)
        steps = np.asarray(m.env_steps)[0, 0, -1]
        ret = np.nanmean(np.asarray(m.episode_return)) if np.isfinite(
            np.asarray(m.episode_return)).any() else float("nan")
        sps = (steps - steps_done) * args.seeds / (time.perf_counter() - t)
        steps_done = steps
        print(f"chunk {i + 1:>3}/{config.num_chunks}  steps {steps:>9,}  return {ret:9.2f}  "
              f"{sps:>10,.0f} steps/s" + ("  (incl. compile)" if i == 0 else ""), flush=True)
        if i + 1 in schedule:
            hp = stacked(schedule[i + 1])
            print(f"  from chunk {i + 2}: {', '.join(f'{k}={v:.4g}' for k, v in schedule[i + 1].items())}")
    evals = jax.jit(algos.batched(algo.evaluate, hparams_argnum=None))(state, eval_keys)
    diverged = np.asarray(state.diverged)[0]
    for s, r in enumerate(np.asarray(evals.return_mean)[0]):
        print(f"seed {s}: evaluation return {r:.2f}" + ("  DIVERGED" if diverged[s] else ""))
    print(f"mean evaluation return {np.mean(evals.return_mean):.2f} "
          f"({time.perf_counter() - t0:.1f}s)")
    return 0


def _schedule(path: str, spec: Any, num_chunks: int) -> dict[int, dict[str, float]]:
    """``--schedule FILE`` as {chunk: hyperparameters}; a missing or malformed file, a chunk outside
    the run or a value outside a hyperparameter's range is a UsageError."""
    import json

    known = {f.name for f in dataclasses.fields(spec.hparams_cls)}
    try:
        with open(path) as f:
            entries = json.load(f)
        out = {int(e["chunk"]): {k: float(v) for k, v in e["hparams"].items()} for e in entries}
    except OSError as err:
        raise UsageError(f"--schedule {path}: {err.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise UsageError(f'--schedule {path}: expected a JSON list of {{"chunk": K, "hparams": {{...}}}} '
                         f"({type(err).__name__}: {err})") from None
    for k, h in out.items():
        if unknown := set(h) - known:
            raise UsageError(f"--schedule {path}: chunk {k} sets unknown hyperparameters "
                             f"{', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        if not 1 <= k < num_chunks:  # in effect after chunk k: the last chunk has none after it
            raise UsageError(f"--schedule {path}: chunk {k} is not in this run (chunks 1 to {num_chunks - 1} "
                             f"have one after them)")
        for name, value in h.items():
            if why := out_of_range(spec.hparams_cls, name, value):
                raise UsageError(f"--schedule {path}: chunk {k}: {why}")
    return out


if __name__ == "__main__":
    sys.exit(main())
