"""Process-level JAX setup, done before JAX first runs anything, and where a node's persistent
compilation cache lives. No JAX at import."""

from __future__ import annotations

import os

_CPU_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def configure_xla() -> None:
    """Before ``import jax`` has initialised a backend: the XLA CPU flag that avoids vmapped
    kernels hanging in their first call, and, on a GPU, no preallocation (JAX would otherwise
    take 75% of the GPU in every process, so two processes could not share one). Each of our
    processes then holds only what its kernels need; a user's own setting wins.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if _CPU_FLAG not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + _CPU_FLAG).strip()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def cache_dir() -> str:
    """JAX's persistent compilation cache, shared by every study and trial process on a node."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rl-harness", "jax")


def use_compile_cache(cache_dir: str) -> None:
    """Every compile of this process goes to (and is read from) the node's persistent cache, even
    a fast one: trials of one shape then compile it once per node."""
    import jax

    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def driver_on_cpu() -> None:
    """Keeps this process's JAX on the CPU backend (the study driver: it validates and builds
    small arrays, and must never take GPU memory from the trials). Set through JAX's config,
    not ``JAX_PLATFORMS``, so the Ray workers this process starts still see the GPU.
    """
    configure_xla()
    import jax

    jax.config.update("jax_platforms", "cpu")
