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
    """Jitted ``init``, ``chunk`` (its state argument donated: the old state is never read
    again, so the device holds one copy) and ``evaluate`` over ``[C, S]`` lanes."""
    import jax

    import algos

    algo = make_algo(env_name, algo_name, config)
    return (jax.jit(algos.batched(algo.init)), jax.jit(algos.batched(algo.chunk), donate_argnums=0),
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


class OutOfMemory(RuntimeError):
    """A trial's kernel does not fit in device memory even one configuration at a time."""


def is_out_of_memory(err: BaseException) -> bool:
    """True for XLA's out-of-memory error (``RESOURCE_EXHAUSTED``) on any backend."""
    import jax

    return isinstance(err, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(err)


def config_groups(configs: int, batch: int) -> list[list[int]]:
    """The configurations' indices in sub-batches of ``batch`` (the last one may be shorter)."""
    return [list(range(i, min(i + batch, configs))) for i in range(0, configs, batch)]


class TrialRunner:
    """One trial's kernel driven step by step: ``chunk()`` until ``done``, then ``finish()``.

    The state stays on the device between chunks; only the per-chunk metrics come back. The C
    configurations run as sub-batches of ``config_batch`` (all at once by default): every
    sub-batch is compiled for the same width (the last is padded with repeats, which are
    dropped) and gets exactly the keys and hyperparameters it would have had in one batch, so
    the results are those of one batch. On an out-of-memory error the runner halves the
    sub-batch and replays the chunks done so far (same results); it never retries a shape that
    did not fit, and raises :class:`OutOfMemory` when one configuration does not fit.
    """

    def __init__(self, plan: TrialPlan, *, config_batch: int | None = None) -> None:
        self.plan = plan
        self.config = build_config(plan.algo, plan.config)
        self._init, self._chunk, self._evaluate, self.algo = _compiled(plan.env, plan.algo, self.config)
        self.train_keys, self.eval_keys = keys_for(plan)
        self.configs = len(plan.hparams)
        self.runs = self.configs * plan.seeds
        self.compile_s, self.kernel_s, self.steps = 0.0, 0.0, 0
        self.curves: list[ChunkReport] = []
        self._start(min(config_batch or self.configs, self.configs))

    def _start(self, batch: int) -> None:
        """(Re)starts every sub-batch from its initial state; after an out-of-memory restart,
        replays the chunks already reported (their metrics are the ones already sent)."""
        import jax

        self.batch, self.groups, self.hps, self.states = batch, [], [], []
        t0 = time.perf_counter()
        try:
            for idx in config_groups(self.configs, batch):
                padded = idx + [idx[0]] * (batch - len(idx))
                hp = _stack_hparams(self.plan.algo, [self.plan.hparams[i] for i in padded])
                self.groups.append(idx)
                self.hps.append(hp)
                self.states.append(jax.block_until_ready(self._init(self.train_keys[np.array(padded)], hp)))
            for _ in range(len(self.curves)):
                self._run_chunk()
        except Exception as err:
            self._shrink(err)
            return
        self.compile_s += time.perf_counter() - t0

    def _shrink(self, err: BaseException) -> None:
        if not is_out_of_memory(err):
            raise err
        self.states = []  # free the device memory before trying a narrower shape
        if self.batch == 1:
            raise OutOfMemory(
                f"{self.plan.env}/{self.plan.algo} trial {self.plan.trial}: one configuration x "
                f"{self.plan.seeds} seeds does not fit in device memory; lower seeds, num_envs or "
                f"num_steps, or raise num_minibatches ({str(err).splitlines()[0][:200]})") from None
        self._start(self.batch // 2)

    def _run_chunk(self) -> Any:
        """One chunk of every sub-batch; metrics with leaves ``[C, S, K]``."""
        import jax

        metrics = []
        for g in range(len(self.groups)):  # every sub-batch is dispatched before any is waited on
            self.states[g], m = self._chunk(self.states[g], self.hps[g])
            metrics.append(m)
        parts = [_first(m, len(idx)) for m, idx in zip(jax.device_get(metrics), self.groups, strict=True)]
        return jax.tree.map(lambda *x: np.concatenate(x), *parts)

    @property
    def done(self) -> bool:
        return len(self.curves) >= self.config.num_chunks

    def chunk(self) -> ChunkReport:
        t = time.perf_counter()
        try:
            m = self._run_chunk()  # waits for the chunk
        except Exception as err:
            self._shrink(err)  # re-runs the chunks done so far in a narrower shape
            return self.chunk()
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

    def _gather(self, leaves_of: Callable[[Any], Any]) -> Any:
        """``leaves_of(state)`` of every sub-batch on the host, joined to leaves ``[C, S, ...]``."""
        import jax

        parts = [_first(jax.device_get(leaves_of(st)), len(idx))
                 for idx, st in zip(self.groups, self.states, strict=True)]
        return jax.tree.map(lambda *x: np.concatenate(x), *parts)

    def policy_params(self) -> Any:
        """The deterministic policy's parameters of every run, on the host: leaves ``[C, S, ...]``."""
        return self._gather(self.algo.policy_params)

    def finish(self) -> TrialResult:
        """Deterministic evaluation of every run on the evaluation seeds."""
        t = time.perf_counter()
        returns = []
        for idx, st in zip(self.groups, self.states, strict=True):
            padded = idx + [idx[0]] * (self.batch - len(idx))
            ev = self._evaluate(st, self.eval_keys[np.array(padded)])
            returns.append(np.asarray(ev.return_mean, np.float64)[: len(idx)])
        self.compile_s += time.perf_counter() - t
        diverged = self._gather(lambda st: st.diverged).astype(bool)
        scores = np.where(diverged, np.nan, np.concatenate(returns))
        return TrialResult(scores, diverged, self.steps, self.kernel_s, self.compile_s, self.curves)


def run_trial(plan: TrialPlan, on_chunk: Callable[[ChunkReport], None] | None = None, *,
              config_batch: int | None = None) -> TrialResult:
    """Trains the plan's C x S runs in one kernel (or sub-batches of ``config_batch``
    configurations), chunk by chunk, then evaluates each run.

    ``on_chunk`` is called on the host after every chunk; it may raise to stop the trial.
    """
    runner = TrialRunner(plan, config_batch=config_batch)
    while not runner.done:
        report = runner.chunk()
        if on_chunk is not None:
            on_chunk(report)
    return runner.finish()


def _first(tree: Any, n: int) -> Any:
    """The first ``n`` configurations of every leaf (a sub-batch without its padding)."""
    import jax

    return jax.tree.map(lambda x: np.asarray(x)[:n], tree)


def _nanmean_last_axis(x: np.ndarray) -> np.ndarray:
    finite = np.isfinite(x)
    total = np.where(finite, x, 0.0).sum(-1)
    count = finite.sum(-1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)
