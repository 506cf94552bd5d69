"""Test setup: CPU-only JAX with the XLA flag that avoids a first-call hang (harness/kernel/device.py), and
the fixtures of the tests that start Ray (each with a private RAY_TMPDIR, its processes stopped)."""

import os
import secrets
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from harness.reports.render import use_offscreen_gl

ROOT = Path(__file__).resolve().parent.parent


def _pin_xdist_worker() -> None:
    """Each xdist worker on its own share of the cores (2 workers on 2 cores: one each), set before
    JAX starts and inherited by what the worker starts (Ray's processes, studies, benchmarks).
    Unpinned, two workers' XLA thread pools each take every core and contend."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    cores = sorted(os.sched_getaffinity(0))
    if worker and count and len(cores) >= int(count) > 1:
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) % int(count)::int(count)])


_pin_xdist_worker()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
use_offscreen_gl()  # MuJoCo (imported by Brax) renders headless, as in harness.play


def pytest_configure(config):
    """Ray's token for local clusters (~/.ray/auth_token), made once by the controller before the
    xdist workers start: Ray writes it on a machine's first `ray.init` with a plain open("w"), so two
    workers starting their first Rays at once could each write their own, and a cluster started
    with one token would meet processes reading the other."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:  # there already (the usual case), or a HOME we cannot write: Ray's own doing then
        return
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


@pytest.fixture(scope="session")
def cache_home(tmp_path_factory):
    """XDG_CACHE_HOME of the studies these tests run (JAX's persistent compile cache): one folder
    for the whole run, shared by the xdist workers (the cache is safe for concurrent writers), so
    a kernel one worker compiled is read by the other."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the controller's folder, above each worker's popen-gwN
    path = root / "xdg-cache"
    path.mkdir(exist_ok=True)
    return str(path)


@pytest.fixture(scope="session", autouse=True)
def _shared_compile_cache(cache_home):
    """JAX's persistent compilation cache for the tests, in the run's cache folder: a kernel that
    another test (or the other xdist worker) compiled already is read, not compiled again (the key
    is the program and the compiler's options, not the Python function that traced it). In these
    processes and, through JAX_COMPILATION_CACHE_DIR, in the processes tests start (the benchmarks'
    tiny runs, the CLIs). One folder: the one a study's trials use (harness.cluster.cache_dir under
    the run's XDG_CACHE_HOME, which every process the tests start gets: never the user's), so a test
    re-training a trial's plan in a process of its own reads the kernels the trial compiled."""
    import jax

    from harness.kernel.device import cache_dir

    os.environ["XDG_CACHE_HOME"] = cache_home
    path = cache_dir()
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


# Tiny kernels (the benchmarks' tiny runs) compile at XLA's lowest level without the CPU fusion emitters,
# since compiling is most of their time; long-running kernels compile optimised, emitters kept.
# the XLA:CPU options, as flags here and per compile below
LEVEL, NO_EMITTERS = "xla_backend_optimization_level", "xla_cpu_use_fusion_emitters"
FAST_COMPILE = (f"--{LEVEL}=0", f"--{NO_EMITTERS}=false")

# Optimised means LLVM's level 1, not XLA's default 3: the learning tests' kernels compile faster and
# run as fast, with the same returns.
OPTIMISED_LEVEL = 1
OPTIMISED = (f"--{LEVEL}={OPTIMISED_LEVEL}",)


def fast_compile_env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "XLA_FLAGS": " ".join([*env.get("XLA_FLAGS", "").split(), *FAST_COMPILE])}


def optimised(env: dict[str, str]) -> dict[str, str]:
    """``env`` compiled :data:`OPTIMISED`, for a study that runs many kernels after its search (the
    smoke study), where running time outweighs compile time."""
    kept = [f for f in env.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE]
    return {**env, "XLA_FLAGS": " ".join([*kept, *OPTIMISED])}


_COMPILE = {"fast": False, "emitters": True}  # set per test by _fast_compile_unless_slow


def _compile_options_per_test() -> None:
    """In this process, what FAST_COMPILE's second flag and OPTIMISED do for the processes tests
    start: JAX reads XLA_FLAGS once per process, so they go in as per-compile options (part of the
    persistent cache's key: a test compiling with the emitters never reads a kernel compiled
    without them). Fast tests: no fusion emitters (unless marked xla_emitters); optimised ones:
    LLVM's level 1."""
    from jax._src import compiler

    plain = compiler.get_compile_options

    def get_compile_options(*args, env_options_overrides=None, backend=None, **kwargs):
        if getattr(backend, "platform", "cpu") == "cpu":  # XLA:CPU options
            if not _COMPILE["fast"]:
                ours = {LEVEL: OPTIMISED_LEVEL}
            else:
                ours = {} if _COMPILE["emitters"] else {NO_EMITTERS: False}
            env_options_overrides = {**ours, **(env_options_overrides or {})}
        return plain(*args, env_options_overrides=env_options_overrides, backend=backend, **kwargs)

    compiler.get_compile_options = get_compile_options


_compile_options_per_test()


@pytest.fixture(autouse=True)
def _fast_compile_unless_slow(request):
    """Tests in this process compile with most of XLA's optimisations off (JAX reads the option
    at every compile): their kernels are tiny, so compiling is most of their time. The learning
    tests (marked slow) run long kernels, which run slower unoptimised: they compile
    :data:`OPTIMISED`. The flag is read at compile time and is not part of JAX's cache key, so a
    function compiled in a fast test and called again in a slow one keeps its unoptimised code: the
    learning tests build their own."""
    import jax

    keep = request.node.get_closest_marker("slow") or request.node.get_closest_marker("xla_optimized")
    jax.config.update("jax_disable_most_optimizations", not keep)
    # Without the emitters two programs computing the same thing round differently, so tests that compare
    # two programs keep them; jax's in-memory caches ignore the option, so they are cleared before and after.
    marked = request.node.get_closest_marker("xla_emitters")
    if marked:
        _settle_background_compiles()  # an earlier test's evaluation, compiling after the clear
        jax.clear_caches()
    _COMPILE.update(fast=not keep, emitters=bool(keep or marked))
    yield
    if marked:
        _settle_background_compiles()
        jax.clear_caches()


def _settle_background_compiles() -> None:
    """Waits for the evaluation compiles trial runners start on a thread (harness.kernel._compile_soon)."""
    import threading

    from harness.kernel.compile import COMPILE_THREAD

    for thread in threading.enumerate():
        if thread.name == COMPILE_THREAD:
            thread.join(timeout=600)


@pytest.fixture
def ray_env(cache_home):
    """An environment with a private RAY_TMPDIR; afterwards, no process may still use it."""
    tmp = tempfile.mkdtemp(prefix="rh-", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])  # keeps a site dir set
    # tiny studies compile fast (one that runs many kernels after its search uses optimised(ray_env)), and
    # skip Ray's dashboard, which costs CPU: the named-actors test turns it back on and queries it
    env = fast_compile_env({**os.environ, "RAY_TMPDIR": tmp, "XDG_CACHE_HOME": cache_home, "PYTHONPATH": path,
                            "RL_HARNESS_DASHBOARD": "0"})
    yield env
    deadline = time.monotonic() + 60  # Ray's processes may take a while to exit on a loaded machine
    while (leftover := _ray_processes(tmp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if leftover:
        leftover = [f"{pid}: {_cmdline(pid)}" for pid in leftover]
    for pid in _ray_processes(tmp):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(tmp, ignore_errors=True)
    assert not leftover, f"Ray processes left running: {leftover}"


def stop_ray_processes(tmp: str, *, grace: float = 10.0) -> None:
    """Stops the Ray processes of the private RAY_TMPDIR ``tmp`` by PID (never another Ray on the
    machine, as ``ray stop`` would): SIGTERM, then SIGKILL for those still alive after ``grace`` s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _ray_processes(tmp):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while _ray_processes(tmp) and time.monotonic() < deadline:
            time.sleep(0.5)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def _ray_processes(tmp: str) -> list[int]:
    """Processes started with RAY_TMPDIR ``tmp`` (by command line or environment) and their
    descendants: Ray's agents retitle themselves (setproctitle), which blanks both."""
    found, parent = set(), {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = Path(f"/proc/{pid}/environ").read_bytes()
            parent[int(pid)] = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if tmp in cmd or f"RAY_TMPDIR={tmp}".encode() in env:
            found.add(int(pid))
    grown = True
    while grown:
        children = {pid for pid, ppid in parent.items() if ppid in found} - found
        found |= children
        grown = bool(children)
    return sorted(found)


def listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket in LISTEN state held by ``pids`` (Linux /proc; each
    process's own /proc/PID/net, so processes in other network namespaces are seen as they are)."""
    import ipaddress

    out = []
    for pid in pids:
        by_inode = {}
        try:
            for proto in ("tcp", "tcp6"):
                for line in Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]:
                    f = line.split()
                    if f[3] != "0A":  # LISTEN
                        continue
                    hexaddr, hexport = f[1].split(":")
                    raw = bytes.fromhex(hexaddr)
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # per-word little endian
                    ip = ipaddress.ip_address(raw)
                    ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:127.0.0.1 is 127.0.0.1
                    by_inode[f[9]] = (str(ip), int(hexport, 16))
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:  # a busy process closes some of them meanwhile: skip those, not the process
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in by_inode:
                out.append((pid, *by_inode[link[8:-1]]))
    return out


# -- running the suite on both cores (pytest-xdist, `-n 2 --dist loadgroup` in pyproject.toml) -----
# Tests that start a Ray may run side by side (xdist_group marks never took effect: pytest-xdist#1386). `loadgroup`
# hands out a test at a time and slow tests are collected first, so both workers end together.


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order otherwise
