"""The trial kernel: C configurations x S seeds of one static config, trained in chunks.

No Ray or Optuna here: :func:`run_trial` takes a :class:`TrialPlan` (plain data), calls
``on_chunk`` between compiled chunks and returns per-configuration, per-seed results. Compiled
functions are cached per process, so a reused worker compiles a static config once.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Key streams: (study seed, trial, stream, seed index) -> PRNG key. Training and evaluation use
# different streams, so a configuration is scored on episodes it never trained on; the final
# re-training of the best configurations uses streams of its own (fresh seeds).
SEARCH, FINAL = 0, 1


@dataclass(frozen=True)
class TrialPlan:
    """Everything a worker needs to run one trial, as plain data (it travels through Ray)."""

    env: str
    algo: str
    config: dict[str, Any]  # static config fields (total_timesteps included)
    hparams: list[dict[str, float]]  # one dict of traced values per configuration: C of them
    seeds: int
    trial: int
    study_seed: int = 0
    stream: int = SEARCH


@dataclass
class ChunkReport:
    """What one chunk produced, on the host."""

    chunk: int  # 1-based
    num_chunks: int
    env_steps: int  # per seed, cumulative
    returns: np.ndarray  # [C, S] mean return of episodes finished in this chunk (NaN: none)
    diverged: np.ndarray  # [C, S] bool, sticky
    steps_per_sec: float  # all C x S runs together, this chunk
    kernel_seconds: float  # time spent in compiled chunks so far (compile excluded)


@dataclass
class TrialResult:
    scores: np.ndarray  # [C, S] deterministic evaluation return (NaN where diverged)
    diverged: np.ndarray  # [C, S] bool
    env_steps: int  # per seed
    kernel_seconds: float
    compile_seconds: float
    curves: list[ChunkReport] = field(default_factory=list)


def keys_for(plan: TrialPlan) -> tuple[Any, Any]:
    """Training and evaluation keys ``[C, S]``; every configuration of a trial shares its seeds."""
    import jax

    base = jax.random.fold_in(jax.random.key(plan.study_seed), plan.trial)

    def stream(tag: int) -> Any:
        k = jax.random.fold_in(base, 2 * plan.stream + tag)
        keys = jax.vmap(lambda s: jax.random.fold_in(k, s))(np.arange(plan.seeds))
        return jax.numpy.broadcast_to(keys, (len(plan.hparams), plan.seeds))

    return stream(0), stream(1)


def make_algo(env_name: str, algo_name: str, config: Any) -> Any:
    """The algorithm's pure functions for a registered env and a static config instance."""
    import algos
    import envs

    env, env_params = envs.make(env_name)
    return algos.get(algo_name).make(config, env, env_params)


@functools.lru_cache(maxsize=16)
def _compiled(env_name: str, algo_name: str, config: Any) -> tuple[Callable, Callable, Callable, Any]:
    import jax

    import algos

    algo = make_algo(env_name, algo_name, config)
    return (jax.jit(algos.batched(algo.init)), jax.jit(algos.batched(algo.chunk)),
            jax.jit(algos.batched(algo.evaluate, hparams_argnum=None)), algo)


def build_config(algo_name: str, config: dict[str, Any]) -> Any:
    import algos

    spec = algos.get(algo_name)
    return spec.config_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})


def _stack_hparams(algo_name: str, hparams: list[dict[str, float]]) -> Any:
    import jax
    import jax.numpy as jnp

    import algos

    cls = algos.get(algo_name).hparams_cls
    return jax.tree.map(lambda *x: jnp.stack(x), *[cls.default(**h) for h in hparams])


class TrialRunner:
    """One trial's kernel driven step by step: ``chunk()`` until ``done``, then ``finish()``.

    The state stays on the device between chunks; only the per-chunk metrics come back.
    """

    def __init__(self, plan: TrialPlan) -> None:
        import jax

        self.plan = plan
        self.config = build_config(plan.algo, plan.config)
        init, self._chunk, self._evaluate, self.algo = _compiled(plan.env, plan.algo, self.config)
        self.hp = _stack_hparams(plan.algo, plan.hparams)
        train_keys, self.eval_keys = keys_for(plan)
        self.runs = len(plan.hparams) * plan.seeds
        t0 = time.perf_counter()
        self.state = jax.block_until_ready(init(train_keys, self.hp))
        self.compile_s, self.kernel_s, self.steps = time.perf_counter() - t0, 0.0, 0
        self.curves: list[ChunkReport] = []

    @property
    def done(self) -> bool:
        return len(self.curves) >= self.config.num_chunks

    def chunk(self) -> ChunkReport:
        import jax

        t = time.perf_counter()
        self.state, m = self._chunk(self.state, self.hp)
        m = jax.device_get(m)  # waits for the chunk
        dt = time.perf_counter() - t
        if self.curves:
            self.kernel_s += dt
        else:  # the first call compiles; count it as overhead, not kernel time
            self.compile_s += dt
        new_steps = int(np.asarray(m.env_steps)[0, 0, -1])
        report = ChunkReport(
            chunk=len(self.curves) + 1, num_chunks=self.config.num_chunks, env_steps=new_steps,
            returns=_nanmean_last_axis(np.asarray(m.episode_return)),
            diverged=np.asarray(m.diverged)[..., -1].astype(bool),
            steps_per_sec=(new_steps - self.steps) * self.runs / max(dt, 1e-9), kernel_seconds=self.kernel_s)
        self.steps = new_steps
        self.curves.append(report)
        return report

    def policy_params(self) -> Any:
        """The deterministic policy's parameters of every run, on the host: leaves ``[C, S, ...]``."""
        import jax

        return jax.device_get(self.algo.policy_params(self.state))

    def finish(self) -> TrialResult:
        """Deterministic evaluation of every run on the evaluation seeds."""
        import jax

        t = time.perf_counter()
        ev = jax.device_get(self._evaluate(self.state, self.eval_keys))
        self.compile_s += time.perf_counter() - t
        diverged = np.asarray(jax.device_get(self.state.diverged)).astype(bool)
        scores = np.where(diverged, np.nan, np.asarray(ev.return_mean, np.float64))
        return TrialResult(scores, diverged, self.steps, self.kernel_s, self.compile_s, self.curves)


def run_trial(plan: TrialPlan, on_chunk: Callable[[ChunkReport], None] | None = None) -> TrialResult:
    """Trains the plan's C x S runs in one kernel, chunk by chunk, then evaluates each run.

    ``on_chunk`` is called on the host after every chunk; it may raise to stop the trial.
    """
    runner = TrialRunner(plan)
    while not runner.done:
        report = runner.chunk()
        if on_chunk is not None:
            on_chunk(report)
    return runner.finish()


def _nanmean_last_axis(x: np.ndarray) -> np.ndarray:
    finite = np.isfinite(x)
    total = np.where(finite, x, 0.0).sum(-1)
    count = finite.sum(-1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)
