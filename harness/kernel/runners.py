"""The trial kernel driven chunk by chunk: C configurations x S seeds of one static config.

No Ray or Optuna here: :func:`run_trial` takes a :class:`~harness.kernel.plan.TrialPlan` (plain
data), calls ``on_chunk`` between compiled chunks (:mod:`harness.kernel.compile`) and returns
per-configuration, per-seed results; a runner's whole state goes to and comes back from a snapshot.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import serialization

from harness.kernel.compile import (
    _compile_once_per_node,
    _compile_soon,
    _compiled,
    _exploiter,
    _refiller,
    _stack_hparams,
    build_config,
    config_keys,
    is_out_of_memory,
    keys_for,
    pbt_config,
)
from harness.kernel.plan import (
    PBT_TAG,
    ChunkReport,
    OutOfMemory,
    TrialPlan,
    TrialResult,
    check_objective,
    config_groups,
)
from harness.kernel.stats import objective_values


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

    one_kernel = False  # PbtRunner and LaneRunner: every configuration in one kernel, never split

    def __init__(self, plan: TrialPlan, *, config_batch: int | None = None) -> None:
        if type(self) is TrialRunner and (plan.pbt or plan.chunks is not None):
            raise ValueError("a plan with PBT or refilled lanes runs in its own runner: runner_for(plan)")
        self.plan = plan
        self.config = build_config(plan.algo, plan.config)
        check_objective(plan)
        self._init, self._chunk, self._evaluate, self.algo = _compiled(plan.env, plan.algo, self.config,
                                                                        plan.curve_episodes)
        self.train_keys, self.eval_keys = keys_for(plan)
        self.budget_steps = self.config.env_steps_after(self.config.num_chunks)
        self.hparams = [dict(h) for h in plan.hparams]  # in effect now (PBT and schedules change them)
        self.schedule = {int(e["chunk"]): e["hparams"] for e in plan.schedule or []}
        self.configs = len(plan.hparams)
        self.runs = self.configs * plan.seeds
        self.total_chunks = plan.chunks or self.config.num_chunks
        self.compile_s, self.kernel_s, self.steps = 0.0, 0.0, 0
        self.curves: list[ChunkReport] = []
        self.restored_chunks = 0  # chunks that came from a snapshot (restore) rather than this process
        self._warm = False  # the chunk function has run once in this runner (its compile is paid)
        self._start(min(config_batch or self.configs, self.configs))

    def _start(self, batch: int) -> None:
        """(Re)starts every sub-batch from its initial state; after an out-of-memory restart,
        replays the chunks already reported (their metrics are the ones already sent)."""
        self.batch, self.groups, self.hps, self.states, self.group_eval_keys = batch, [], [], [], []
        self.hparams = [dict(h) for h in self.plan.hparams]
        t0 = time.perf_counter()
        try:
            keys, hp = self.train_keys[:batch], _stack_hparams(self.plan.algo, self.plan.hparams[:1] * batch)
            _compile_once_per_node(self._init, keys, hp)  # every sub-batch has this shape
            _compile_once_per_node(self._chunk, jax.eval_shape(self._init, keys, hp), hp,
                                   self.eval_keys[:batch], np.zeros(batch, np.int32))
            for idx in config_groups(self.configs, batch):
                padded = np.array(idx + [idx[0]] * (batch - len(idx)))
                hp = _stack_hparams(self.plan.algo, [self.plan.hparams[i] for i in padded])
                self.groups.append(idx)
                self.hps.append(hp)
                self.group_eval_keys.append(self.eval_keys[padded])
                self.states.append(jax.block_until_ready(self._init(self.train_keys[padded], hp)))
            for k in range(len(self.curves)):
                self._run_chunk(k)
        except Exception as err:
            self._shrink(err)
            return
        self.compile_s += time.perf_counter() - t0
        self._eval_compile = _compile_soon(self._evaluate, self.states[0], self.group_eval_keys[0])

    def _shrink(self, err: BaseException) -> None:
        if not is_out_of_memory(err):
            raise err
        self.states = []  # free the device memory before trying a narrower shape
        if self.batch == 1 or self.one_kernel:
            raise OutOfMemory(
                f"{self.plan.env}/{self.plan.algo} trial {self.plan.trial}: one configuration x "
                f"{self.plan.seeds} seeds does not fit in device memory; lower seeds, num_envs or "
                f"num_steps, or raise num_minibatches ({str(err).splitlines()[0][:200]})") from None
        self._start(self.batch // 2)

    def _run_chunk(self, k: int) -> tuple[Any, np.ndarray]:
        """Chunk ``k`` (0-based) of every sub-batch: metrics with leaves ``[C, S, K]`` and the
        evaluation after it ``[C, S]``."""
        out = []
        for g, idx in enumerate(self.groups):  # every sub-batch is dispatched before any is waited on
            ks = self._chunk_numbers(k, idx + [idx[0]] * (self.batch - len(idx)))
            self.states[g], m, ev = self._chunk(self.states[g], self.hps[g], self.group_eval_keys[g], ks)
            out.append((m, ev))
        if k + 1 in self.schedule:  # new hyperparameters from the next chunk on
            self._set_hparams([{**h, **new} for h, new in zip(self.hparams, self.schedule[k + 1], strict=True)])
        parts = [_first(o, len(idx)) for o, idx in zip(jax.device_get(out), self.groups, strict=True)]
        return jax.tree.map(lambda *x: np.concatenate(x), *parts)

    def _chunk_numbers(self, k: int, configs: list[int]) -> np.ndarray:
        """Each of ``configs``' own chunk number (0-based) at the trial's chunk ``k``: ``k`` for all."""
        return np.full(len(configs), k, np.int32)

    def _set_hparams(self, hparams: list[dict[str, float]]) -> None:
        """Every configuration's hyperparameters from now on (traced values: no recompile)."""
        self.hparams = hparams
        for g, idx in enumerate(self.groups):
            padded = idx + [idx[0]] * (self.batch - len(idx))
            self.hps[g] = _stack_hparams(self.plan.algo, [hparams[i] for i in padded])

    @property
    def done(self) -> bool:
        return len(self.curves) >= self.total_chunks

    def chunk(self) -> ChunkReport:
        t = time.perf_counter()
        try:
            m, evals = self._run_chunk(len(self.curves))  # waits for the chunk
        except Exception as err:
            self._shrink(err)  # re-runs the chunks done so far in a narrower shape
            return self.chunk()
        dt = time.perf_counter() - t
        if self._warm:
            self.kernel_s += dt
        else:  # the first call compiles; count it as overhead, not kernel time
            self.compile_s += dt
            self._warm = True
        lane_steps = np.asarray(m.env_steps)[:, 0, -1].astype(np.int64)  # per seed, of each configuration
        new_steps = self._trial_steps(lane_steps)
        report = ChunkReport(
            chunk=len(self.curves) + 1, num_chunks=self.total_chunks, env_steps=new_steps,
            returns=_nanmean_last_axis(np.asarray(m.episode_return)),
            evals=np.broadcast_to(np.asarray(evals, np.float64), (self.configs, self.plan.seeds)).copy(),
            diverged=np.asarray(m.diverged)[..., -1].astype(bool),
            steps_per_sec=self._steps_trained(lane_steps) * self.plan.seeds / max(dt, 1e-9),
            kernel_seconds=self.kernel_s, lane_steps=lane_steps)
        self.steps = new_steps
        self.curves.append(report)
        return report

    def _trial_steps(self, lane_steps: np.ndarray) -> int:
        """The trial's env steps per run after the chunk just run (``lane_steps``: each
        configuration's steps per seed after it): every configuration's, they train in step."""
        return int(lane_steps[0])

    def _steps_trained(self, lane_steps: np.ndarray) -> int:
        """Env steps per seed the chunk just run trained, over every configuration."""
        return int(lane_steps.sum()) - self.steps * self.configs

    # -- mid-run snapshots ------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """Everything this trial needs to go on in another process, as msgpack bytes: every
        run's state (parameters, optimiser states, env states, RNG keys, running statistics),
        the hyperparameters in effect, the chunks done and their reports. Independent of the
        sub-batch width: a snapshot restores into any ``config_batch``."""
        state = self._gather(_key_data)
        hps = self._gather_hps()
        curves = [_report_record(r) for r in self.curves]
        return serialization.msgpack_serialize({
            "format": SNAPSHOT_FORMAT, "plan": json.dumps(dataclasses.asdict(self.plan), sort_keys=True),
            "state": {str(i): x for i, x in enumerate(jax.tree.leaves(state))},
            "hps": {str(i): x for i, x in enumerate(jax.tree.leaves(hps))},
            "hparams": json.dumps(self.hparams), "curves": {str(i): c for i, c in enumerate(curves)},
            "steps": self.steps, "kernel_seconds": self.kernel_s, "compile_seconds": self.compile_s,
            **self._snapshot_extra()})

    def _snapshot_extra(self) -> dict[str, Any]:
        """What a subclass adds to :meth:`snapshot` (read back by :meth:`_restore_extra`)."""
        return {}

    def _restore_extra(self, snap: dict[str, Any]) -> None:
        """Restores what :meth:`_snapshot_extra` added."""

    def restore(self, blob: bytes) -> None:
        """Continues from :meth:`snapshot` ``blob`` of the same plan: the chunks after it give
        bit-identical results to a run that was never interrupted (same keys, same chunking).
        Raises ``ValueError`` for a snapshot of another plan or one that cannot be read."""
        try:
            snap = serialization.msgpack_restore(blob)
            ok = isinstance(snap, dict) and snap.get("format") == SNAPSHOT_FORMAT
        except Exception as err:  # a truncated or corrupt file: msgpack raises several kinds
            raise ValueError(f"unreadable trial snapshot ({type(err).__name__})") from None
        if not ok:
            raise ValueError("not a trial snapshot of this version")
        if snap["plan"] != json.dumps(dataclasses.asdict(self.plan), sort_keys=True):
            raise ValueError(f"the snapshot belongs to another trial than trial {self.plan.trial}")
        if self.curves:
            raise ValueError("restore() needs a runner that has not run a chunk")
        template_state, template_hps = self._gather(_key_data), self._gather_hps()
        state = _fill(template_state, snap["state"])
        hps = _fill(template_hps, snap["hps"])
        for g, idx in enumerate(self.groups):
            padded = np.array(idx + [idx[0]] * (self.batch - len(idx)))
            self.states[g] = jax.device_put(jax.tree.map(
                lambda new, old, p=padded: _rekey(new[p], old), state, self.states[g]))
            self.hps[g] = jax.device_put(jax.tree.map(lambda x, p=padded: x[p], hps))
        self.hparams = json.loads(snap["hparams"])
        self.curves = [_report_from_record(snap["curves"][str(i)]) for i in range(len(snap["curves"]))]
        self.steps = int(snap["steps"])
        self.kernel_s, self.compile_s = float(snap["kernel_seconds"]), float(snap["compile_seconds"])
        self.restored_chunks = len(self.curves)
        self._restore_extra(snap)

    def _gather_hps(self) -> Any:
        parts = [_first(jax.device_get(hp), len(idx)) for hp, idx in zip(self.hps, self.groups, strict=True)]
        return jax.tree.map(lambda *x: np.concatenate(x), *parts)

    def _gather(self, leaves_of: Callable[[Any], Any]) -> Any:
        """``leaves_of(state)`` of every sub-batch on the host, joined to leaves ``[C, S, ...]``."""
        parts = [_first(jax.device_get(leaves_of(st)), len(idx))
                 for idx, st in zip(self.groups, self.states, strict=True)]
        return jax.tree.map(lambda *x: np.concatenate(x), *parts)

    def policy_params(self) -> Any:
        """The deterministic policy's parameters of every run, on the host: leaves ``[C, S, ...]``."""
        return self._gather(self.algo.policy_params)

    def objective_so_far(self, chunks: int | None = None) -> np.ndarray:
        """``[C, S]`` each run's value under the plan's objective from the chunks done so far (or
        the first ``chunks``), the latest evaluation standing in for the final one: what the
        scheduler compares at a rung."""
        return self._objective(None, chunks)

    def _objective(self, final: np.ndarray | None, chunks: int | None = None) -> np.ndarray:
        curves = self.curves[:chunks] if chunks else self.curves
        evals = np.stack([r.evals for r in curves])
        values = objective_values(evals, [r.env_steps for r in curves], self.plan.objective, final=final,
                                  threshold=self.plan.threshold, budget=self.budget_steps)
        return np.where(curves[-1].diverged, np.nan, values)

    def finish(self) -> TrialResult:
        """Deterministic evaluation of every run on the evaluation seeds; each run's score
        under the plan's objective."""
        t = time.perf_counter()
        self._eval_compile.join()  # the evaluation compiled meanwhile; the call below finds it cached
        returns = []
        for idx, st, keys in zip(self.groups, self.states, self.group_eval_keys, strict=True):
            ev = self._evaluate(st, keys)
            returns.append(np.asarray(ev.return_mean, np.float64)[: len(idx)])
        self.compile_s += time.perf_counter() - t
        diverged = self._gather(lambda st: st.diverged).astype(bool)
        final = np.where(diverged, np.nan, np.concatenate(returns))
        return TrialResult(np.where(diverged, np.nan, self._objective(final)), final, diverged, self.steps,
                           self.kernel_s, self.compile_s, self.curves, self.hparams)


class PbtRunner(TrialRunner):
    """A trial that is one population (population-based training): every ``plan.pbt["interval"]``
    chunks (not after the last), the exploit/explore step on the device, reported in the chunk's
    ``pbt`` field."""

    one_kernel = True

    def __init__(self, plan: TrialPlan, *, config_batch: int | None = None) -> None:
        if not plan.pbt:
            raise ValueError("PbtRunner needs a plan with pbt set")
        if (config_batch or len(plan.hparams)) < len(plan.hparams):
            raise ValueError("population-based training needs the whole population in one kernel; "
                             f"{len(plan.hparams)} configurations do not run as one batch here")
        self.pbt = pbt_config(plan.pbt)
        self._exploit = _exploiter(plan.env, plan.algo, build_config(plan.algo, plan.config), self.pbt)
        self.pbt_key = jax.random.fold_in(jax.random.fold_in(
            jax.random.fold_in(jax.random.key(plan.study_seed), plan.trial), plan.stream), PBT_TAG)
        super().__init__(plan, config_batch=config_batch)

    def chunk(self) -> ChunkReport:
        report = super().chunk()
        if report.chunk % int(self.plan.pbt["interval"]) == 0 and not self.done:
            report.pbt = self._exploit_explore(report.chunk)
        return report

    def _exploit_explore(self, k: int) -> dict[str, Any]:
        """After chunk ``k``: the population's exploit/explore step, on the device. Fitness is each
        configuration's mean evaluation return over the last ``interval`` chunks and its seeds
        (NaN, ranked last, where a seed diverged)."""
        interval = int(self.plan.pbt["interval"])
        recent = np.stack([r.evals for r in self.curves[-interval:]])  # [interval, C, S]
        fitness = np.where(self.curves[-1].diverged.any(-1), np.nan, recent.mean(axis=(0, 2)))
        key = jax.random.fold_in(self.pbt_key, k)
        self.states[0], self.hps[0], source = self._exploit(self.states[0], self.hps[0], key,
                                                            np.asarray(fitness, np.float32))
        values = jax.device_get(self.hps[0])
        self.hparams = [{n: float(getattr(values, n)[i]) for n in self.plan.hparams[i]}
                        for i in range(self.configs)]
        return {"chunk": k, "source": [int(s) for s in np.asarray(source)],
                "fitness": [float(f) if np.isfinite(f) else None for f in fitness], "hparams": self.hparams}


class LaneRunner(TrialRunner):
    """A trial whose lanes are refilled (harness.lanes): ``plan.chunks`` chunks long, each lane
    (one configuration, its S seeds) at its own progress. :meth:`refill` starts chosen lanes
    afresh with new configurations on the device; every configuration's keys and chunk count are
    its own (``plan.config_keys``), so it trains as it would have alone from a trial's start."""

    one_kernel = True

    def __init__(self, plan: TrialPlan, *, config_batch: int | None = None) -> None:
        if plan.chunks is None or plan.config_keys is None or plan.pbt or plan.schedule:
            raise ValueError("a trial whose lanes are refilled needs chunks and config_keys, and neither PBT "
                             "nor a schedule")
        if (config_batch or len(plan.hparams)) < len(plan.hparams):
            raise ValueError("refilled lanes need every configuration in one kernel; "
                             f"{len(plan.hparams)} configurations do not run as one batch here")
        self.lane_ids = list(plan.config_keys)  # each lane's configuration key
        self.lane_start = [0] * len(plan.hparams)  # the chunk (0-based) where each lane's configuration began
        self.lane_steps = np.zeros(len(plan.hparams), np.int64)  # env steps per seed of each lane's configuration
        super().__init__(plan, config_batch=config_batch)

    def _chunk_numbers(self, k: int, configs: list[int]) -> np.ndarray:
        return np.array([k - self.lane_start[i] for i in configs], np.int32)

    def chunk(self) -> ChunkReport:
        report = super().chunk()
        self.lane_steps = report.lane_steps.copy()  # refill zeroes entries: never the report's
        return report

    def _trial_steps(self, lane_steps: np.ndarray) -> int:  # the trial's chunks, whatever its lanes' own
        return self.config.env_steps_after(len(self.curves) + 1)

    def _steps_trained(self, lane_steps: np.ndarray) -> int:
        return int((lane_steps - self.lane_steps).sum())

    def _snapshot_extra(self) -> dict[str, Any]:
        return {"lanes": json.dumps({"ids": self.lane_ids, "start": self.lane_start,
                                     "steps": [int(x) for x in self.lane_steps]})}

    def _restore_extra(self, snap: dict[str, Any]) -> None:
        lanes = json.loads(snap["lanes"])
        self.lane_ids, self.lane_start = lanes["ids"], lanes["start"]
        self.lane_steps = np.array(lanes["steps"], np.int64)
        self._lane_keys()

    def lane_chunks(self, lane: int) -> int:
        """Chunks the lane's current configuration has trained."""
        return len(self.curves) - self.lane_start[lane]

    def refill(self, lanes: list[int], hparams: list[dict[str, float]], ids: list[int]) -> None:
        """Starts ``lanes`` afresh with new configurations (their ``hparams`` and keys ``ids``), on
        the device, from the next chunk on; the other lanes go on untouched. Each new one trains
        as it would alone: its keys and its chunk count are its own."""
        for c, h, n in zip(lanes, hparams, ids, strict=True):
            self.hparams[c], self.lane_ids[c], self.lane_start[c] = dict(h), int(n), len(self.curves)
            self.lane_steps[c] = 0
        train_keys = self._lane_keys()
        self.hps[0] = _stack_hparams(self.plan.algo, self.hparams)
        mask = np.isin(np.arange(self.configs), lanes)
        try:
            self.states[0] = _refiller(self.plan.env, self.plan.algo, self.config)(self.states[0], self.hps[0],
                                                                                   train_keys, mask)
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            raise OutOfMemory(f"{self.plan.env}/{self.plan.algo} trial {self.plan.trial}: refilling a lane does "
                              f"not fit in device memory ({str(err).splitlines()[0][:200]})") from None

    def _lane_keys(self) -> Any:
        """Sets every lane's evaluation keys from its configuration key; returns the training keys."""
        train, evals = config_keys(self.plan.study_seed, self.lane_ids, self.plan.stream, self.plan.seeds)
        self.train_keys, self.eval_keys = train, evals
        self.group_eval_keys[0] = evals
        return train

    def lane_objective(self, lanes: list[int], final: np.ndarray | None = None) -> np.ndarray:
        """``[len(lanes), S]`` each lane's configuration's value under the plan's objective over its
        own chunks (``final``: its final evaluation, else its latest one); NaN where diverged."""
        out = []
        for j, c in enumerate(lanes):
            curve = self.curves[self.lane_start[c]:]
            evals = np.stack([r.evals[c] for r in curve])
            steps = [int(r.lane_steps[c]) if r.lane_steps is not None else r.env_steps for r in curve]
            values = objective_values(evals, steps, self.plan.objective, final=None if final is None else final[j],
                                      threshold=self.plan.threshold, budget=self.budget_steps)
            out.append(np.where(curve[-1].diverged[c], np.nan, values))
        return np.array(out, np.float64).reshape(len(lanes), self.plan.seeds)

    def lane_results(self, lanes: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(scores, final returns, diverged), each ``[len(lanes), S]``: the lanes' configurations
        evaluated now on their evaluation seeds (as :meth:`finish` does at a trial's end)."""
        self._eval_compile.join()
        ev = np.asarray(self._evaluate(self.states[0], self.group_eval_keys[0]).return_mean, np.float64)
        diverged = np.asarray(self.curves[-1].diverged)[lanes]
        final = np.where(diverged, np.nan, ev[lanes])
        return np.where(diverged, np.nan, self.lane_objective(lanes, final)), final, diverged


def runner_for(plan: TrialPlan, *, config_batch: int | None = None) -> TrialRunner:
    """The runner a plan needs: :class:`PbtRunner` for a population (``pbt`` set), :class:`LaneRunner`
    where its lanes are refilled (``chunks`` set), else :class:`TrialRunner`."""
    kind = PbtRunner if plan.pbt else LaneRunner if plan.chunks is not None else TrialRunner
    return kind(plan, config_batch=config_batch)


def _report_record(r: ChunkReport) -> dict[str, Any]:
    """A chunk's report as a snapshot holds it (msgpack: PBT's decisions as a JSON string)."""
    return {**{f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "pbt"},
            "pbt": json.dumps(r.pbt) if r.pbt else ""}


def _report_from_record(record: dict[str, Any]) -> ChunkReport:
    c = dict(record)
    c["pbt"] = json.loads(c["pbt"]) if c["pbt"] else None
    return ChunkReport(**{k: (v if isinstance(v, np.ndarray) or not hasattr(v, "item") else v.item())
                          for k, v in c.items()})


def run_trial(plan: TrialPlan, on_chunk: Callable[[ChunkReport], None] | None = None, *,
              config_batch: int | None = None) -> TrialResult:
    """Trains the plan's C x S runs in one kernel (or sub-batches of ``config_batch``
    configurations), chunk by chunk, then evaluates each run.

    ``on_chunk`` is called on the host after every chunk; it may raise to stop the trial.
    """
    runner = runner_for(plan, config_batch=config_batch)
    while not runner.done:
        report = runner.chunk()
        if on_chunk is not None:
            on_chunk(report)
    return runner.finish()


SNAPSHOT_FORMAT = "rl-harness trial snapshot 2"  # 2: lanes


def _key_data(tree: Any) -> Any:
    """``tree`` with every typed PRNG key array replaced by its raw ``uint32`` data."""
    def raw(x: Any) -> Any:
        return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    return jax.tree.map(raw, tree)


def _rekey(data: Any, like: Any) -> Any:
    """``data`` as a typed key array when ``like`` (the live leaf it replaces) is one."""
    if jax.dtypes.issubdtype(like.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(np.asarray(data), impl=jax.random.key_impl(like))
    return data


def _fill(template: Any, leaves: dict[str, Any]) -> Any:
    """``template``'s structure with the snapshot's leaves, each checked against its shape and dtype."""
    flat, treedef = jax.tree.flatten(template)
    if len(leaves) != len(flat):
        raise ValueError(f"the snapshot holds {len(leaves)} arrays where this trial has {len(flat)}")
    out = []
    for i, like in enumerate(flat):
        x = np.asarray(leaves[str(i)])
        if x.shape != np.shape(like) or x.dtype != np.asarray(like).dtype:
            raise ValueError(f"snapshot array {i} is {x.dtype}{list(x.shape)}, this trial expects "
                             f"{np.asarray(like).dtype}{list(np.shape(like))}")
        out.append(x)
    return jax.tree.unflatten(treedef, out)


def _first(tree: Any, n: int) -> Any:
    """The first ``n`` configurations of every leaf (a sub-batch without its padding)."""
    return jax.tree.map(lambda x: np.asarray(x)[:n], tree)


def _nanmean_last_axis(x: np.ndarray) -> np.ndarray:
    finite = np.isfinite(x)
    total = np.where(finite, x, 0.0).sum(-1)
    count = finite.sum(-1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)
