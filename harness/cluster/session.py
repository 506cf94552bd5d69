"""Starting or joining Ray, and what each trial gets of the machine.

The embedded local Ray stays on 127.0.0.1 (RAY_FACTS.md: ``_node_ip_address`` alone is not
enough; ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps every port on loopback, single node).
``ray.init`` runs before the driver uses JAX.
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.folder import ResultsFolder
    from harness.settings import Settings
    from harness.space import Budget


class ClusterError(RuntimeError):
    """Ray could not be started or reached."""


@dataclass(frozen=True)
class Placement:
    """Resources per trial and how many trials run at once."""

    kind: str  # "cpu" or "gpu"
    resources: dict[str, float]
    slots: int
    device: dict[str, Any]  # handed to each trial's process setup


def check_address(address: str) -> None:
    """That ``--address`` is ``auto``/``local``, or a host:port (``ray://`` too: Ray's client) that
    accepts a connection now: said in one line at once, not after Ray's own timeouts (35 s for a
    client).

    Raises:
        ClusterError: neither.
    """
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--address {address!r} is not host:port, 'auto' or ray://host:port")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as err:
        raise ClusterError(f"cannot reach a Ray cluster at {address} ({err.strerror or err}); "
                           "start one with `ray start --head` or leave out --address") from None


def _use_token_if_any() -> None:
    """Ray 2.60 clusters require a token by default, but a connecting driver sends one only
    when RAY_AUTH_MODE=token; turn that on when a token is at hand (env or ~/.ray/auth_token)."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.exists(path):
        os.environ["RAY_AUTH_MODE"] = "token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask where the OS has one (``taskset``, a
    batch scheduler's allocation, a container's cpuset), else every core of the machine."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def start(address: str | None, code_dir: str | None = None) -> tuple[str | None, str | None]:
    """Joins the Ray cluster at ``address``, or starts an embedded one on 127.0.0.1.

    ``code_dir`` (a study file's folder) reaches the trials: on the embedded Ray its workers
    import from it; on a cluster it is shipped as the job's working directory, with this
    project's packages, so a worker node needs only the dependencies.

    Returns the dashboard URL and (for the embedded Ray) the node's Prometheus metrics URL.
    """
    metrics_port = int(os.environ.get("RL_HARNESS_METRICS_PORT", "0")) or _free_port()
    dashboard_wanted = _dashboard_wanted()  # checked on a cluster too, where the head decides
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no phoning home
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's tables off: the harness prints progress
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")  # and a line per failed trial, not a traceback
    loopback = not address or address.rpartition(":")[0] in ("127.0.0.1", "localhost")
    if loopback:  # read by ray at import: keeps Ray from swapping 127.0.0.1 for the routable address
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if address:
        _use_token_if_any()  # read at import too
    # The driver has used JAX (the env check) before Ray forks its processes; they exec at once,
    # so JAX's fork warning does not apply.
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    if code_dir and not address:  # the embedded Ray's workers inherit the driver's environment
        paths = [code_dir, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    import ray

    kwargs: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.ERROR,
                                  configure_logging=True)
    if address:
        kwargs["runtime_env"] = _shipped_code(code_dir)
    try:
        if address:
            check_address(address)
            if loopback:
                kwargs["_node_ip_address"] = "127.0.0.1"  # a head on loopback: join it there
            ctx = ray.init(address=address, **kwargs)
        else:
            ctx = _init_embedded(ray, num_cpus=usable_cores(), _node_ip_address="127.0.0.1",
                                 dashboard_host="127.0.0.1", include_dashboard=dashboard_wanted,
                                 _metrics_export_port=metrics_port, **kwargs)
    except ClusterError:
        raise
    except (ConnectionError, RuntimeError, ValueError) as err:
        where = address or "a local Ray"
        raise ClusterError(f"cannot start or reach {where}: {str(err).splitlines()[0]}") from None
    url = getattr(ctx, "dashboard_url", None)
    dashboard = f"http://{url}" if url and not url.startswith("http") else url
    return dashboard, None if address else f"http://127.0.0.1:{metrics_port}/metrics"


def _dashboard_wanted() -> bool:
    """The embedded Ray's dashboard, unless ``RL_HARNESS_DASHBOARD=0`` (it costs about 3 s of CPU
    per start: the test suite's many short studies go without it)."""
    value = os.environ.get("RL_HARNESS_DASHBOARD", "1")
    if value not in ("0", "1"):
        raise ClusterError(f"RL_HARNESS_DASHBOARD must be 0 or 1, not {value!r}")
    return value == "1"


def _init_embedded(ray: Any, **kwargs: Any) -> Any:
    """``ray.init`` for the embedded Ray, tried twice: Ray gives its raylet a fixed 30 s to
    register, which a loaded machine can miss (a bare ``Exception``: "The current node timed out
    during startup"). The processes a failed try started are stopped before the next; a second
    miss is raised as a ``RuntimeError``."""
    import psutil

    me = psutil.Process()
    for attempt in (1, 2):
        before = {p.pid for p in me.children(recursive=True)}
        try:
            return ray.init(**kwargs)
        except Exception as err:
            if "timed out during startup" not in str(err):
                raise
            if attempt == 2:
                raise RuntimeError(str(err)) from None
            print("the local Ray missed its startup wait; starting it again", flush=True)
            ray.shutdown()
            _stop_processes([p.pid for p in me.children(recursive=True) if p.pid not in before], grace=10)


def note_session(path: Any) -> None:
    """Writes which driver runs the embedded Ray and its session folder, so a later run of the
    same study can stop what a killed driver left behind (:func:`stop_leftovers`)."""
    import ray

    from harness.records import write_json

    node = ray._private.worker._global_node  # the only handle on the session folder
    write_json(path, {"driver_pid": os.getpid(), "session_dir": node.get_session_dir_path()})


def stop_leftovers(path: Any, *, grace: float = 5.0) -> list[int]:
    """Stops the processes of the embedded Ray recorded at ``path`` (:func:`note_session`) whose
    driver is dead: Ray's own processes of that session and their workers, found by their command
    line or open files in its session folder (a killed driver leaves some running). Returns their
    PIDs. A driver still running the study is an error: two drivers must not share a study."""
    import json
    from pathlib import Path

    try:
        info = json.loads(Path(path).read_text())
        pid, session = int(info["driver_pid"]), str(info["session_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if pid != os.getpid() and "harness.study" in _cmdline(pid):
        raise ClusterError(f"another driver (pid {pid}) is running this study in {Path(path).parent}; "
                           "wait for it or stop it first")
    found = [p for p in _session_processes(session) if p != os.getpid()]
    _stop_processes(found, grace=grace)
    Path(path).unlink(missing_ok=True)
    if found:
        print(f"stopped {len(found)} Ray processes a killed run of this study left behind")
    return found


def _stop_processes(pids: list[int], *, grace: float) -> None:
    """SIGTERM, then SIGKILL for those still running after ``grace`` s."""
    import signal
    import time

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while any(_state(p) not in ("", "Z") for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def _session_processes(session: str) -> list[int]:
    """PIDs whose command line names ``session`` or that hold a file open in it (Linux /proc;
    elsewhere nothing is found)."""
    out = []
    if not session or not os.path.isdir("/proc"):
        return out
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if session in _cmdline(pid):
            out.append(pid)
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(session):
                    out.append(pid)
                    break
            except OSError:
                continue
    return out


PACKAGES = ("algos", "envs", "harness", "studies")  # this project's packages, shipped to a cluster's workers


def _shipped_code(code_dir: str | None) -> dict[str, Any]:
    """Ray runtime environment carrying this project's packages (and ``code_dir``) to workers."""
    import importlib.util

    env: dict[str, Any] = {"py_modules": [os.path.dirname(importlib.util.find_spec(p).origin) for p in PACKAGES]}
    if code_dir:
        env["working_dir"] = code_dir
        env["excludes"] = ["results/", "*.sqlite3", ".git/", "__pycache__/", ".venv/"]
    return env


def run_once(fn: Any, *args: Any, gpu: bool) -> Any:
    """``fn(*args)`` in a fresh Ray worker that exits afterwards (so whatever device memory it
    took is given back), with a whole GPU when ``gpu``."""
    import ray

    return ray.get(ray.remote(max_calls=1, num_cpus=1, num_gpus=1 if gpu else 0)(fn).remote(*args))


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


@contextmanager
def session(settings: Settings, folder: ResultsFolder) -> Iterator[tuple[str | None, str | None]]:
    """Ray for the length of a study: the cluster at ``settings.address``, or an embedded one
    (first stopping what a killed driver of this study left running, and noting this one so
    the next run can do the same). Yields the dashboard and metrics URLs; Ray is shut down after.

    Raises:
        ClusterError: Ray cannot be started or reached, or another driver runs this study.
    """
    if not settings.address:
        stop_leftovers(folder.session_file)
    source = settings.study.source
    # start() sets the variables Ray reads when it is first imported: no import of ray before it
    dashboard, metrics = start(settings.address, code_dir=source and os.path.dirname(source))
    # after ray.init, whose crash handler would print a C++ stack on SIGTERM
    with terminate_as_interrupt(settings.resume_command):
        try:
            if not settings.address:
                note_session(folder.session_file)
            yield dashboard, metrics
        finally:
            import ray

            ray.shutdown()


@contextmanager
def terminate_as_interrupt(resume: str, grace: float = 20.0) -> Iterator[None]:
    """SIGTERM (``kill``, ``timeout``, a batch scheduler's stop) does what Ctrl-C does: whatever
    handles SIGINT at that moment (Tune's graceful stop while trials run, else KeyboardInterrupt),
    so finished trials are kept and the driver says how to resume. A signal sent to the whole
    process group also stops Ray's own processes (they block only SIGINT), and a graceful stop
    would then wait on a dead cluster: after ``grace`` s the driver says the same and exits at
    once (130), as a killed driver would, which the next run resumes. The block should end
    after Ray is shut down. Main thread only."""
    import signal
    import sys
    import threading

    def hard_exit() -> None:
        print(f"\ninterrupted; finished trials are saved. Resume with: {resume}", file=sys.stderr, flush=True)
        os._exit(130)

    timers: list[threading.Timer] = []

    def as_ctrl_c(signum: int, frame: Any) -> None:
        timer = threading.Timer(grace, hard_exit)
        timer.daemon, timer.name = True, "sigterm-grace"
        timers.append(timer)
        timer.start()
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _quiet_ray_monitor_stack()  # now: the monitor's message may come before this handler runs
    previous = signal.signal(signal.SIGTERM, as_ctrl_c)
    try:
        yield
    finally:  # the graceful stop got here: Ray is shut down
        signal.signal(signal.SIGTERM, previous)
        for timer in timers:
            timer.cancel()
            timer.join()


def _quiet_ray_monitor_stack() -> None:
    """Ray's autoscaler monitor, stopped by a group signal (the one that stops the study),
    publishes its Python stack to the driver ("(raylet) The autoscaler failed with the following
    error: Terminated with signal 15 ..."): a stop, not a failure, so the driver does not print
    that message. Installed when the study starts (the message can arrive before the driver's own
    handler runs); every other message Ray sends still prints."""
    try:
        from ray._private import worker
    except ImportError:
        return
    printer = worker.print_to_stdstream
    if getattr(printer, "_rl_harness_quiet", False):
        return

    def quiet(data: dict, ignore_prefix: bool) -> None:
        lines = data.get("lines") or []
        if data.get("pid") == "raylet" and any("Terminated with signal" in line for line in lines):
            return
        printer(data, ignore_prefix)

    quiet._rl_harness_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = quiet


def cache_dir() -> str:
    """JAX's persistent compilation cache, shared by every study and trial process on a node."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rl-harness", "jax")


def fit_trials(settings: Settings, budget: Budget, place: Placement, *, say: Any = None) -> Placement:
    """Measures each static shape's device memory where the trials run (a one-off worker on a
    GPU) and decides trials per device and configurations per sub-batch; the placement with the
    checkpoint cadence. Nothing is measured on a CPU unless ``--device-memory`` states a size. On
    the embedded Ray, a study of fewer trials than cores gives each trial a share of the cores.

    Raises:
        StudyError: a shape cannot fit even one configuration at a time (or PBT's whole population).
    """
    import dataclasses
    import math

    from harness.placement import fmt_bytes
    from harness.progress import say as progress_say
    from harness.space import StudyError, label, static_points
    from harness.trainable import probe_shapes, shape_key

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
