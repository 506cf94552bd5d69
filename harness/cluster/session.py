"""Ray's lifetime for a study: starting or joining it, stopping what a killed driver left behind,
shutting it down; a SIGTERM taken as Ctrl-C. (What each trial gets of the machine:
:mod:`harness.cluster.placement`.)

The embedded local Ray stays on 127.0.0.1: ``_node_ip_address`` alone is not enough, and
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps every port on loopback, single node (docs/cluster.md).
``ray.init`` runs after the driver has used JAX (checking the env and the algorithm); Ray's workers
exec a fresh interpreter, so they inherit no JAX state.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.cluster import ray_private
from harness.driver.settings import Settings, check_address
from harness.space import StudyError
from harness.store.folder import ResultsFolder
from harness.store.records import write_json


class ClusterError(RuntimeError):
    """Ray could not be started or reached."""


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
            try:
                check_address(address)
            except StudyError as err:  # said as the cluster's error: Ray is not reached
                raise ClusterError(str(err)) from None
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
    """The embedded Ray's dashboard, unless ``RL_HARNESS_DASHBOARD=0`` (its start costs CPU: the
    test suite's many short studies go without it)."""
    value = os.environ.get("RL_HARNESS_DASHBOARD", "1")
    if value not in ("0", "1"):
        raise ClusterError(f"RL_HARNESS_DASHBOARD must be 0 or 1, not {value!r}")
    return value == "1"


def _init_embedded(ray: Any, **kwargs: Any) -> Any:
    """``ray.init`` for the embedded Ray, tried twice: Ray gives its raylet a fixed time to
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
    write_json(path, {"driver_pid": os.getpid(), "session_dir": ray_private.session_dir()})


def stop_leftovers(path: Any, *, grace: float = 5.0) -> list[int]:
    """Stops the processes of the embedded Ray recorded at ``path`` (:func:`note_session`) whose
    driver is dead: Ray's own processes of that session and their workers, found by their command
    line or open files in its session folder (a killed driver leaves some running). Returns their
    PIDs. A driver still running the study is an error: two drivers must not share a study."""
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
    so finished trials are kept and the driver says how to resume. A signal to the whole process
    group also stops Ray's own processes, which a graceful stop would wait on forever: after
    ``grace`` s the driver says the same and exits at once (130). The block should end after Ray
    is shut down. Main thread only."""
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
    def monitor_stopped(data: dict) -> bool:
        lines = data.get("lines") or []
        return data.get("pid") == "raylet" and any("Terminated with signal" in line for line in lines)

    ray_private.drop_driver_messages(monitor_stopped)


