"""The Ray Tune trainable: one trial = one C x S kernel, reporting after every chunk.

This module must not import JAX at import time: the process setup (CPU core pinning, GPU memory
fraction, persistent compilation cache) has to happen before JAX starts its backend, and Ray
imports this module in every worker.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import threading
import time
from typing import Any

from ray import tune

from harness.kernel.device import configure_xla, use_compile_cache
from harness.kernel.plan import OutOfMemory, TrialPlan
from harness.kernel.stats import config_score, maximized
from harness.lanes.trial import LaneTrial, broker_call
from harness.store.folder import (
    KERNEL_FILE,  # a mid-run checkpoint: the trial's whole kernel (TrialRunner.snapshot)
)
from harness.store.records import config_id, write_bytes

LANES_FILE = "lanes.json"  # beside it, for a trial whose lanes are refilled: harness.lanes.trial.LaneTrial.state

_SETUP_DONE = False
CHECKPOINT_SECONDS = 60.0  # default interval between mid-run checkpoints
_CORE_LOCKS: list[Any] = []  # held for the process's lifetime


def _pin_cpu_cores(count: int) -> list[int]:
    """Pins this process to ``count`` cores no other trial process holds (file locks in /tmp).

    XLA's CPU backend uses every core in the affinity mask, so concurrent trials would
    oversubscribe the machine; a lock per core hands each trial its own. Returns the cores
    pinned ([] when none were free: the process keeps every core).
    """
    got = []
    if not hasattr(os, "sched_getaffinity"):  # no affinity masks on this OS (macOS): unpinned
        return got
    for core in sorted(os.sched_getaffinity(0)):
        if len(got) == count:
            break
        f = open(f"/tmp/rl-harness-core-{core}.lock", "w")  # noqa: SIM115 - held while we live
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        _CORE_LOCKS.append(f)
        got.append(core)
    if got:
        os.sched_setaffinity(0, got)
    return got


def setup_process(device: dict[str, Any]) -> None:
    """Once per worker process, before JAX runs: device placement and the compile cache."""
    global _SETUP_DONE
    if _SETUP_DONE:
        return
    configure_xla()  # no GPU preallocation: a process holds what its kernels need
    if device.get("gpu_fraction"):  # a cap, so one trial cannot starve the others on its GPU
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.95 * device['gpu_fraction']:.3f}")
    elif device.get("pin_cores"):
        _pin_cpu_cores(int(device.get("cpus", 1)))
    if device.get("cache_dir"):
        use_compile_cache(device["cache_dir"])
    _SETUP_DONE = True


def _floats(rows: Any) -> list[list[float | None]]:
    """A [C, S] array as nested lists, NaN as None (JSON has no NaN)."""
    return [[None if not math.isfinite(float(x)) else float(x) for x in row] for row in rows]


def _best(rows: list[list[float | None]], diverged: list[list[bool]], maximize: bool = True) -> float:
    """The best configuration's mean over seeds (what Tune and ASHA see); NaN if none has one."""
    means = [m for row, div in zip(rows, diverged, strict=True) if (m := config_score(row, div)) is not None]
    if not means:
        return float("nan")
    return max(means) if maximize else min(means)


class _Watchdog:
    """Ends the process if one step (a chunk, or a trial's setup) runs longer than ``limit`` s.

    XLA on CPU has hung in a first call; a dead worker makes Tune retry the
    trial, and a trial that keeps failing is recorded as failed, instead of a study that
    waits forever. An idle worker (between trials) is never ended.
    """

    def __init__(self, limit: float) -> None:
        self.limit, self.since = limit, None
        threading.Thread(target=self._watch, daemon=True).start()

    def busy(self) -> None:
        self.since = time.monotonic()

    def idle(self) -> None:
        self.since = None

    def _watch(self) -> None:
        while True:
            time.sleep(5)
            since = self.since
            if since is not None and time.monotonic() - since > self.limit:
                print(f"rl-harness: a step made no progress for {self.limit:.0f}s; ending this worker", flush=True)
                os._exit(3)


_GAUGES: dict[str, Any] = {}


def _export(study: str, trial: int, values: dict[str, list[float | None]], sps: float) -> None:
    """Per-configuration metrics for the Ray dashboard's Metrics page (Prometheus), tagged by
    study, trial and configuration: ``rl_harness_<name>{study, trial, config}``."""
    from ray.util.metrics import Gauge

    if not _GAUGES:
        for name, desc in (("return", "mean training episode return over seeds, last chunk"),
                           ("score", "score under the study's objective, mean over seeds"),
                           ("env_steps", "env steps per seed so far"), ("diverged", "1 if any seed diverged"),
                           ("steps_per_sec", "env steps per second of the whole trial kernel")):
            _GAUGES[name] = Gauge(f"rl_harness_{name}", description=desc, tag_keys=("study", "trial", "config"))
    for name, per_config in values.items():
        for i, v in enumerate(per_config):
            if v is not None and math.isfinite(v):
                _GAUGES[name].set(v, tags={"study": study, "trial": str(trial), "config": config_id(trial, i)})
    _GAUGES["steps_per_sec"].set(sps, tags={"study": study, "trial": str(trial), "config": "all"})


class StudyTrial(tune.Trainable):
    """A Tune trial: one C x S kernel (``harness.kernel.runners.TrialRunner``), one chunk per ``step``.

    Subclassed per study by :func:`trainable_for`, so the Ray dashboard's Actors page (and
    ``ray.util.state.list_actors()``) names the study in the class and the trial in the repr.
    With actor reuse, ``reset_config`` starts the next trial in the same warm process.
    """

    def setup(self, config: dict[str, Any]) -> None:
        device = config.get("device", {})
        share = shape_of(config).get("gpu")
        setup_process({**device, "gpu_fraction": share} if share else device)
        self.watchdog = _Watchdog(float(device.get("chunk_timeout", 900)))
        self._start(config)

    def _start(self, config: dict[str, Any]) -> None:
        from harness.kernel.runners import runner_for  # JAX: after the process setup, never at import

        self.plan = TrialPlan(**config["plan"])
        self.device = config.get("device", {})
        self.study_name = config.get("study", "")
        self.started = time.perf_counter()
        self.last: dict[str, Any] = {}
        self.failure: str | None = None
        self.last_checkpoint = (time.monotonic(), 0)  # (when, after how many chunks)
        self.checkpoint_seconds, self.checkpoints = 0.0, 0
        self.watchdog.busy()
        self.lanes = self.broker = None
        self.lanes_sent: set[int] = set()  # configurations whose records went out with a result
        try:  # compiles on first use of a static config
            self.runner = runner_for(self.plan, config_batch=shape_of(config).get("config_batch"))
            if self.plan.lanes:  # lane-level successive halving: the lanes' side, and the broker's line
                self.lanes = LaneTrial.start(self.plan, self.runner.budget_steps)
                self.broker = broker_call(self.plan.lanes["broker"])
        except (OutOfMemory, *DETERMINISTIC) as err:
            self.failure = failure_text(err)
        self.restored_curves = ""
        for path in config.get("resume_from") or []:  # a killed driver's trial, newest checkpoint first
            if self.failure is None and self._restore(path):
                break
        self.watchdog.idle()

    def _restore(self, path: str) -> bool:
        """Continues from the kernel checkpoint at ``path``; False (and a line in the worker's log)
        where it cannot be read, e.g. cut short when its driver was killed."""
        try:
            lanes = None
            if self.lanes is not None:  # read first: a runner restored without its lanes would be half-restored
                with open(os.path.join(os.path.dirname(path), LANES_FILE)) as f:
                    lanes = LaneTrial.from_state(f.read())
            with open(path, "rb") as f:
                self.runner.restore(f.read())
            self.lanes = lanes or self.lanes
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"rl-harness: trial {self.plan.trial}: checkpoint {path} not used ({err})", flush=True)
            return False
        self.last_checkpoint = (time.monotonic(), len(self.runner.curves))
        rows = []
        for k, r in enumerate(self.runner.curves if self.lanes is None else [], start=1):  # the searcher's rows
            rows.append({"chunk": r.chunk, "env_steps": r.env_steps, "returns": _floats(r.returns),
                         "evals": _floats(r.evals), "objective": _floats(self.runner.objective_so_far(k)),
                         **({"pbt": r.pbt} if r.pbt else {})})
        self.restored_curves = json.dumps(rows)  # sent with the next result (a string: Tune flattens dicts)
        print(f"rl-harness: trial {self.plan.trial} resumed after chunk {self.runner.restored_chunks}", flush=True)
        return True

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._start(new_config)
        return True

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Mid-run: the whole kernel (``kernel.msgpack``, ``TrialRunner.snapshot``), so a retried
        trial goes on from here with the same results. At the end: each run's policy parameters,
        ``c{config}_s{seed}.msgpack``."""
        if self.failure is not None:
            return None
        t = time.perf_counter()
        if not self.runner.done:
            if self.lanes is not None:
                write_bytes(os.path.join(checkpoint_dir, LANES_FILE), self.lanes.state().encode())
            write_bytes(os.path.join(checkpoint_dir, KERNEL_FILE), self.runner.snapshot())
            self.checkpoint_seconds += time.perf_counter() - t
            self.checkpoints += 1
            self.last_checkpoint = (time.monotonic(), len(self.runner.curves))
            return None
        import jax
        from flax import serialization

        params = self.runner.policy_params()
        for c in range(len(self.plan.hparams)):
            for s in range(self.plan.seeds):
                one = jax.tree.map(lambda x, c=c, s=s: x[c, s], params)
                write_bytes(os.path.join(checkpoint_dir, f"c{c}_s{s}.msgpack"), serialization.to_bytes(one))
        return None

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """A retried trial (its worker died): continues from the kernel saved mid-run."""
        path = os.path.join(checkpoint_dir, KERNEL_FILE)
        if self.failure is None and os.path.exists(path) and not self._restore(path):
            raise RuntimeError(f"trial {self.plan.trial}: its checkpoint {path} cannot be read")

    def _checkpoint_due(self) -> bool:
        """Whether to checkpoint after this chunk: every ``checkpoint_chunks`` chunks when set,
        else every ``checkpoint_seconds`` s, stretched to 20 x the last save's cost so saving
        stays under 5% of the trial's time."""
        if self.runner.done:
            return False
        since, at = self.last_checkpoint
        every_chunks = int(self.device.get("checkpoint_chunks", 0))
        if every_chunks:
            return len(self.runner.curves) - at >= every_chunks
        seconds = float(self.device.get("checkpoint_seconds", CHECKPOINT_SECONDS))
        if seconds <= 0:
            return False
        cost = self.checkpoint_seconds / self.checkpoints if self.checkpoints else 0.0
        return time.monotonic() - since >= max(seconds, 20 * cost)

    def _lane_configs(self) -> dict[str, Any]:
        """The configurations whose lanes ended so far (JSON: Tune flattens nested results)."""
        return {"lane_configs": json.dumps(self.lanes.records())} if self.lanes is not None else {}

    def _lane_step(self, r: Any) -> dict[str, Any]:
        """A chunk's result for a trial whose lanes are refilled: the best configuration that
        ended so far (Tune's view), progress, and at the end every configuration's record."""
        _maybe_crash(self.plan, r.chunk)
        self.watchdog.idle()
        records = self.lanes.records()
        new = [c for c in records if c["optuna_number"] not in self.lanes_sent]  # also the searcher's, as they end
        self.lanes_sent |= {c["optuna_number"] for c in new}
        scores = [v for c in records if c["status"] == "complete"
                  and (v := config_score(c["scores"], c["diverged"])) is not None]
        best = (max(scores) if maximized(self.plan.objective) else min(scores)) if scores else float("nan")
        out = {"score": best, "chunk": r.chunk, "num_chunks": r.num_chunks, "env_steps": r.env_steps,
               "steps_per_sec": r.steps_per_sec, "kernel_seconds": r.kernel_seconds,
               "configs_ended": len(records), "lane_ended": json.dumps(new), "checkpoints": self.checkpoints,
               "broker_seconds": self.lanes.broker_s, "lanes_seconds": self.lanes.lanes_s,
               "checkpoint_seconds": self.checkpoint_seconds, "resumed_after_chunk": self.runner.restored_chunks}
        if not self.runner.done:
            return {**out, "should_checkpoint": self._checkpoint_due()}
        return {**out, **self._lane_configs(), "final": True, "done": True,
                "compile_seconds": self.runner.compile_s, "trial_seconds": time.perf_counter() - self.started}

    def __repr__(self) -> str:
        plan = getattr(self, "plan", None)
        return f"{getattr(self, 'study_name', 'study')} trial {plan.trial if plan else '?'}"

    def step(self) -> dict[str, Any]:
        if self.failure is None:
            self.watchdog.busy()
            try:
                r = self.runner.chunk()
                if self.lanes is not None:
                    self.lanes.after_chunk(self.runner, self.broker)
                    result = None
                else:
                    result = self.runner.finish() if self.runner.done else None
            except (OutOfMemory, *DETERMINISTIC) as err:
                self.failure = failure_text(err)
        if self.failure is not None:  # a result, not an exception: Tune must not retry what fails again
            self.watchdog.idle()
            return {"done": True, "error": self.failure, "score": float("nan"), **self._lane_configs()}
        if self.lanes is not None:
            return self._lane_step(r)
        _maybe_crash(self.plan, r.chunk)
        _maybe_hold(r.chunk)
        self.last.update(resumed_after_chunk=self.runner.restored_chunks, checkpoints=self.checkpoints,
                         checkpoint_seconds=self.checkpoint_seconds, restored_curves=self.restored_curves)
        self.restored_curves = ""
        returns, diverged = _floats(r.returns), r.diverged.tolist()
        so_far = _floats(self.runner.objective_so_far())  # the objective at this rung, per run
        self.last.update(env_steps=r.env_steps, returns=returns, evals=_floats(r.evals), objective=so_far,
                         diverged=diverged, steps_per_sec=r.steps_per_sec, kernel_seconds=r.kernel_seconds,
                         chunk=r.chunk, num_chunks=r.num_chunks,
                         pbt=json.dumps(r.pbt) if r.pbt else None)  # a string: Tune flattens dicts
        per_config = {"return": [config_score(row) for row in returns],
                      "env_steps": [float(r.env_steps)] * len(returns),
                      "diverged": [float(any(d)) for d in diverged]}
        maximize = maximized(self.plan.objective)
        if not self.runner.done:  # the last chunk is reported with the evaluation
            _export(self.study_name, self.plan.trial, per_config, r.steps_per_sec)
            self.watchdog.idle()
            return {"score": _best(so_far, diverged, maximize), **self.last,
                    "should_checkpoint": self._checkpoint_due()}
        self.watchdog.idle()
        assert result is not None  # the runner is done
        scores, diverged = _floats(result.scores), result.diverged.tolist()
        _export(self.study_name, self.plan.trial, {**per_config, "score": [config_score(row) for row in scores]},
                r.steps_per_sec)
        return {**self.last, "score": _best(scores, diverged, maximize), "scores": scores,
                "final_returns": _floats(result.final_returns), "diverged": diverged,
                "final_hparams": result.final_hparams,
                "final": True, "done": True, "compile_seconds": result.compile_seconds,
                "kernel_seconds": result.kernel_seconds, "trial_seconds": time.perf_counter() - self.started}


# What fails the same way on every retry (JAX's tracing errors are TypeErrors); out of memory and lost
# workers or nodes are retried by Tune
DETERMINISTIC: tuple[type[BaseException], ...] = (TypeError, ValueError, LookupError, AttributeError,
                                                   ArithmeticError, NotImplementedError, AssertionError, NameError)
BOILERPLATE = ("For simplicity, JAX has removed its internal frames", "-----", "The above exception",
                "Traceback (most recent call last)", "This BatchTracer with object id")


def failure_text(err: BaseException) -> str:
    """``Type: message``: the exception's type and the first line of its message that is not a
    framework's boilerplate (what a trial's record and progress line say). A Ray actor call's
    failure (``RayTaskError``: the lane broker's) says its own exception."""
    for _ in range(8):  # (bounded: a cause is never its own, but a loop must end)
        if not isinstance(cause := getattr(err, "cause", None), BaseException) or cause is err:
            break
        err = cause
    if err.__class__.__name__ == "OutOfMemory":
        return str(err)
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    first = next((ln for ln in lines if not ln.startswith(BOILERPLATE)), "")
    return f"{type(err).__name__}: {first}"[:300] if first else type(err).__name__


def shape_key(static: dict[str, Any]) -> str:
    """The key of a trial shape (its static config) in the placement's ``shapes``."""
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in static.items()}, sort_keys=True)


def shape_of(config: dict[str, Any]) -> dict[str, Any]:
    """What the placement decided for this trial's shape: ``gpu`` (share of a GPU) and
    ``config_batch`` (configurations per sub-batch); {} where it decided nothing."""
    shapes = config.get("device", {}).get("shapes", {})
    return shapes.get(shape_key(config["plan"]["config"]), {}) if "plan" in config else {}


def trainable_for(study: str, resources: dict[str, float]) -> type[StudyTrial]:
    """``StudyTrial`` under a class name that names the study (what the dashboard shows),
    asking for ``resources`` per trial (``tune.with_resources`` would rename the class); a
    trial whose shape the placement measured asks for its own share of a GPU."""
    from ray.tune.execution.placement_groups import PlacementGroupFactory

    def default_resource_request(cls: type, config: dict) -> PlacementGroupFactory:
        share = shape_of(config).get("gpu")
        res = {**resources, "gpu": share} if share else resources
        return PlacementGroupFactory([{k.upper() if k in ("cpu", "gpu") else k: v for k, v in res.items()}])

    name = "".join(ch if ch.isalnum() else "_" for ch in study).strip("_") or "study"
    attrs = {"__module__": __name__, "default_resource_request": classmethod(default_resource_request)}
    return type(f"{name}_trial", (StudyTrial,), attrs)


def _maybe_crash(plan: Any, chunk: int) -> None:
    """Fault injection for the reliability tests: ``RL_HARNESS_CRASH=TRIAL:TIMES:DIR`` makes
    search trial TRIAL's worker die after its first chunk (``RL_HARNESS_CRASH_CHUNK``: that chunk),
    the first TIMES attempts (counted in DIR); several such specs are separated by commas."""
    spec = os.environ.get("RL_HARNESS_CRASH")
    if not spec or chunk != int(os.environ.get("RL_HARNESS_CRASH_CHUNK", "1")) or plan.stream != 0:
        return
    trial = plan.trial
    for one in spec.split(","):
        target, times, folder = one.split(":", 2)
        if int(target) != trial:
            continue
        attempts = len([p for p in os.listdir(folder) if p.startswith(f"crash-{trial}-")])
        if attempts < int(times):
            open(os.path.join(folder, f"crash-{trial}-{attempts}"), "w").close()
            os._exit(1)


def _maybe_hold(chunk: int) -> None:
    """Fault injection for the two-node test: ``RL_HARNESS_HOLD=IP:DIR`` makes a trial on the node
    at IP stop after its second chunk (its first checkpointed), say so in ``DIR/hold-PID`` and wait
    there, up to 300 s, for the test to kill its node."""
    spec = os.environ.get("RL_HARNESS_HOLD")
    if not spec or chunk != 2:
        return
    import ray

    ip, folder = spec.split(":", 1)
    if ray.util.get_node_ip_address() != ip:
        return
    open(os.path.join(folder, f"hold-{os.getpid()}"), "w").close()
    time.sleep(300)
