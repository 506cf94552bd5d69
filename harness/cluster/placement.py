"""What each trial gets of the machine: its Ray resources and how many run at once
(:class:`Placement`), fitted to device memory: how much a trial's kernel needs, and how trials
share a device.

A trial's need comes from its compiled executables' memory analysis (``init``, ``chunk`` and
``evaluate`` at its shape), measured on the device the trials will use, before the trial runs:

    need(b) = G * state(b) + max(chunk(b), evaluate(b)) - state(b),   G = ceil(C / b)

where ``b`` is the number of configurations per sub-batch (``harness.kernel.runners.TrialRunner``),
``state(b)`` the training state of one sub-batch (resident between chunks) and ``chunk(b)``
the peak while one sub-batch's chunk runs (its state donated, so it is counted once). From
the needs and the device's memory, :func:`fit` decides how many trials share a device and
whether a trial must run its configurations in sub-batches; :func:`fit_trials` has every static
shape of a study measured where the trials run (:func:`probe_shapes`, a one-off Ray task) and
decides. Nothing here imports Ray or JAX at import (the phases import :class:`Placement` before
Ray starts).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.cluster.session import run_once
from harness.driver.progress import say as progress_say
from harness.driver.settings import Settings
from harness.kernel.plan import TrialPlan
from harness.space import Budget, StudyError, label, static_points

HEADROOM = 0.9  # of the device's available memory: XLA's own buffers, fragmentation
GPU_PROCESS_BYTES = 512 * 2**20  # a trial process's CUDA context and libraries, beyond its kernels
MAX_PER_DEVICE = 4  # a GPU time-slices concurrent kernels: more trials add processes, not throughput
@dataclass(frozen=True)
class KernelMemory:
    """Bytes of one sub-batch of ``width`` configurations x S seeds."""

    width: int
    state: int  # training state, resident between chunks
    peak: int  # while its widest executable runs (state included)

    def need(self, configs: int) -> int:
        """Bytes for a trial of ``configs`` configurations run in sub-batches of ``width``."""
        groups = math.ceil(configs / self.width)
        return groups * self.state + self.peak - self.state


@dataclass(frozen=True)
class Fit:
    """How one trial shape runs on a device."""

    config_batch: int  # configurations per sub-batch (== C: one batch)
    per_device: int  # trials of this shape that fit on one device together
    need: int  # bytes one trial needs
    available: int  # bytes of the device that trials may use


@dataclass(frozen=True)
class Placement:
    """Resources per trial and how many trials run at once."""

    kind: str  # "cpu" or "gpu"
    resources: dict[str, float]
    slots: int
    device: dict[str, Any]  # handed to each trial's process setup


def placement(cache_dir: str, *, gpus_per_trial: float = 0.5) -> Placement:
    """One CPU core per trial on CPU machines (pinned); a share of a GPU where there are GPUs."""
    import ray

    res = ray.cluster_resources()
    gpus, cpus = res.get("GPU", 0.0), max(1, int(res.get("CPU", 1)))
    device: dict[str, Any] = {"cache_dir": cache_dir, "chunk_timeout": 900}
    if gpus > 0:
        device["gpu_fraction"] = gpus_per_trial
        return Placement("gpu", {"cpu": 1, "gpu": gpus_per_trial},
                         max(1, int(gpus / gpus_per_trial)), device)
    return Placement("cpu", {"cpu": 1}, cpus, {**device, "pin_cores": True, "cpus": 1})


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fit(measure: Callable[[int], KernelMemory], configs: int, available: int, *, shape: str,
        overhead: int = 0) -> Fit:
    """Sub-batch and trials per device for a trial of ``configs`` configurations.

    ``measure(b)`` gives the memory of a sub-batch of ``b`` configurations (it compiles, so it is
    called as few times as possible: at ``configs``, then at 1 and at the widest ``b`` a linear
    model of the two predicts to fit, stepping down until one really fits). ``overhead``: bytes
    each trial process holds beyond its kernels. At most ``MAX_PER_DEVICE`` trials share a device.

    Raises:
        StudyError: even one configuration does not fit; the message names the shape, the bytes
            needed and available, and what to lower.
    """
    usable = int(available * HEADROOM) - overhead
    whole = measure(configs)
    if whole.need(configs) <= usable:
        per_device = min(MAX_PER_DEVICE, max(1, (usable + overhead) // (whole.need(configs) + overhead)))
        return Fit(configs, per_device, whole.need(configs), available)
    one = measure(1)
    if one.need(configs) > usable:
        raise StudyError(
            f"{shape}: one configuration needs {fmt_bytes(one.peak)} of device memory and the whole trial "
            f"{fmt_bytes(one.need(configs))} in sub-batches of 1, but {fmt_bytes(usable)} is usable "
            f"({fmt_bytes(available)} x {HEADROOM}" + (f" - {fmt_bytes(overhead)} per process" if overhead else "")
            + "); lower --seeds, num_envs or num_steps, or raise "
            "num_minibatches")
    # peak is close to linear in the width: interpolate, then check by measuring
    slope = (whole.peak - one.peak) / max(configs - 1, 1)
    b = max(1, min(configs - 1, int((usable - one.peak) / slope) + 1 if slope > 0 else configs - 1))
    while b > 1:
        m = measure(b)
        if m.need(configs) <= usable:
            return Fit(b, 1, m.need(configs), available)
        b = max(1, int(b * usable / m.need(configs)))
    return Fit(1, 1, one.need(configs), available)


def fit_trials(settings: Settings, budget: Budget, place: Placement, *, say: Any = None) -> Placement:
    """Measures each static shape's device memory where the trials run (a one-off worker on a
    GPU) and decides trials per device and configurations per sub-batch; the placement with the
    checkpoint cadence. Nothing is measured on a CPU unless ``--device-memory`` states a size. On
    the embedded Ray, a study of fewer trials than cores gives each trial a share of the cores.

    Raises:
        StudyError: a shape cannot fit even one configuration at a time (or PBT's whole population).
    """
    from harness.cluster.trainable import shape_key  # Ray Tune: not at import

    say = say or progress_say
    place = dataclasses.replace(place, device={**place.device, **settings.checkpoint})
    trials = settings.tune_trials(budget)
    if place.kind == "cpu" and not settings.address and trials < place.slots:
        share = place.slots // trials  # fewer trials than cores: each compiles and runs on several
        place = dataclasses.replace(place, resources={**place.resources, "cpu": share}, slots=trials,
                                    device={**place.device, "cpus": share})
    if place.kind == "cpu" and settings.device_bytes is None:
        return place
    plans, names = {}, {}
    for point in static_points(settings.study, set(settings.config_fields)):
        config = settings.static_config(point, budget.timesteps)
        key = shape_key(config)
        hparams = [dict(settings.study.hparams)] * budget.configs_per_trial
        plans[key] = dataclasses.asdict(settings.plan(config, hparams, seeds=budget.seeds, trial=0))
        where = ", ".join(f"{k}={label(v)}" for k, v in point.items())
        names[key] = (f"study {settings.study.name}" + (f" ({where})" if where else "") +
                      f", {budget.configs_per_trial} configs x {budget.seeds} seeds")
    say("measuring each trial shape's device memory ...")
    fits = run_once(probe_shapes, plans, names, settings.device_bytes, place.device, gpu=place.kind == "gpu")
    if isinstance(fits, str):
        raise StudyError(fits)
    if fits is None:
        return place
    shapes, per_device = {}, []
    for key, f in fits.items():
        if settings.scheduler in ("pbt", "lanes") and f["config_batch"] < budget.configs_per_trial:
            what = ("population-based training" if settings.scheduler == "pbt"
                    else "refilling lanes (--scheduler lanes)")
            raise StudyError(f"{names[key]}: {what} needs a trial's {budget.configs_per_trial} "
                             f"configurations in one kernel, but only {f['config_batch']} fit; lower "
                             "--configs-per-trial or --seeds")
        per_device.append(f["per_device"])
        shapes[key] = {"config_batch": f["config_batch"]}
        if place.kind == "gpu":
            shapes[key]["gpu"] = math.floor(10_000 / f["per_device"]) / 10_000  # Ray's resource quantum
        split = (f", configurations in sub-batches of {f['config_batch']}"
                 if f["config_batch"] < budget.configs_per_trial else "")
        say(f"  {names[key]}: {fmt_bytes(f['need'])} per trial of {fmt_bytes(f['available'])}; "
            f"{f['per_device']} at a time per device{split}")
    if place.kind == "gpu":
        slots = int(round(place.slots * place.resources["gpu"])) * max(per_device)  # 1 / share trials per GPU
    else:
        slots = min(place.slots, min(per_device))
    return dataclasses.replace(place, slots=max(1, slots), device={**place.device, "shapes": shapes})


def measure_kernel(plan: Any, width: int) -> KernelMemory:
    """Compiles the plan's kernels for ``width`` configurations (on this process's default
    device, without running them) and reads their memory analysis."""
    import jax
    import numpy as np

    from harness.kernel.compile import _compiled, _stack_hparams, build_config, keys_for

    plan = dataclasses.replace(plan, hparams=[plan.hparams[0]] * width)
    init, chunk, evaluate, _ = _compiled(plan.env, plan.algo, build_config(plan.algo, plan.config),
                                         plan.curve_episodes)
    hp = _stack_hparams(plan.algo, plan.hparams)
    train_keys, eval_keys = keys_for(plan)
    state = jax.eval_shape(init, train_keys, hp)

    def peak(compiled: Any) -> tuple[int, int]:
        m = compiled.memory_analysis()
        return (m.argument_size_in_bytes,
                m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes)

    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
    peaks = [peak(init.lower(train_keys, hp).compile())[1] + state_bytes,
             peak(chunk.lower(state, hp, eval_keys, np.zeros(width, np.int32)).compile())[1],
             peak(evaluate.lower(state, eval_keys).compile())[1]]
    return KernelMemory(width, state_bytes, max(peaks))


def device_memory() -> int | None:
    """Bytes this process's accelerator can give trials: the smaller of its allocator's limit
    and the memory the driver reports free (``nvidia-smi``); None on a CPU."""
    import jax

    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return None
    stats = dev.memory_stats() or {}
    limit = stats.get("bytes_limit")
    free = _nvidia_query("memory.free")
    known = [v for v in (limit, free) if v]
    return min(known) if known else None


def _nvidia_query(field: str) -> int | None:
    """``nvidia-smi``'s figure in MiB for this process's first GPU, as bytes; None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits",
                              "-i", gpu], capture_output=True, text=True, timeout=20, check=True).stdout
        return int(float(out.split()[0]) * 2**20)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def probe_failure(err: BaseException) -> str:
    """One line for a device that failed while the shapes were measured (out of memory in XLA's
    autotuner, a GPU JAX cannot open): the error's own words, and where another process holds
    the GPU's memory, how much is free and the usual cause."""
    words = " ".join(ln.strip() for ln in str(err).splitlines() if ln.strip())
    words = words if len(words) <= 400 else words[:400] + " ..."
    held = ""
    free, total = _nvidia_query("memory.free"), _nvidia_query("memory.total")
    if free is not None and total and free < total / 2:
        held = (f" (the GPU has {fmt_bytes(free)} of {fmt_bytes(total)} free; another JAX process on it takes "
                "75% of it unless it runs with XLA_PYTHON_CLIENT_PREALLOCATE=false)")
    return f"measuring the trial shapes on the device failed{held}: {type(err).__name__}: {words}"


def probe(plans: dict[str, Any], device_bytes: int | None, names: dict[str, str]) -> dict[str, Fit] | None:
    """Fits every static shape (``{key: TrialPlan}``, ``names[key]`` what errors call it) to this
    process's device; None where the device's memory is unknown (a CPU, no ``device_bytes``).

    Run where the trials run (a worker with the trials' GPU), never in the driver.
    """
    measured = device_memory()
    available = device_bytes or measured
    if available is None:
        return None
    overhead = GPU_PROCESS_BYTES if measured is not None else 0
    return {key: fit(lambda b, p=plan: measure_kernel(p, b), len(plan.hparams), available, shape=names[key],
                     overhead=overhead) for key, plan in plans.items()}


def probe_shapes(plans: dict[str, dict[str, Any]], names: dict[str, str], device_bytes: int | None,
                 device: dict[str, Any]) -> dict[str, dict[str, int]] | str | None:
    """Run as a one-off Ray task on the trials' device: each shape's memory fit
    (:func:`probe`) as plain data, the one-line error when a shape cannot fit,
    or None where the device's memory is unknown. Its compiles land in the persistent cache."""
    from harness.cluster.trainable import setup_process  # Ray Tune: not at import

    # the whole GPU, whatever share a trial gets: the device's memory is what is measured
    setup_process({**device, "gpu_fraction": 1.0} if device.get("gpu_fraction") else device)
    try:
        fits = probe({k: TrialPlan(**v) for k, v in plans.items()}, device_bytes, names)
    except StudyError as err:
        return str(err)
    except RuntimeError as err:  # the device failed (XLA/CUDA: out of memory, no usable GPU): one line
        return probe_failure(err)
    return None if fits is None else {k: dataclasses.asdict(f) for k, f in fits.items()}


def final_width(needed: int, configs: int, *, rounds: int, kernel_s: float | None, compile_s: float | None) -> int:
    """Configurations per kernel for re-training ``needed`` configurations (``rounds`` rounds of
    fresh seeds each) after a search whose trials ran ``configs`` wide.

    The search's width costs no compile (its executables are cached) and ``rounds`` kernels of
    ``kernel_s`` (a search trial's kernel time); a width of ``needed`` costs one compile
    (``compile_s``, a search trial's first compile) plus kernels estimated as ``needed / configs``
    of that time (optimistic on a GPU below saturation, so a short kernel keeps the search's
    width). Without timings the narrow width is taken.
    """
    if needed >= configs:
        return configs
    if kernel_s is None or compile_s is None:
        return needed
    wide = rounds * kernel_s
    narrow = compile_s + rounds * kernel_s * needed / configs
    return needed if narrow < wide else configs
