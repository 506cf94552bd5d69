"""Process-level JAX setup, done before JAX first runs anything."""

from __future__ import annotations

import os

_CPU_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def configure_xla() -> None:
    """Sets the XLA CPU flag that avoids vmapped kernels hanging in their first call.

    Must run before ``import jax`` has initialised a backend. Harmless on GPU.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if _CPU_FLAG not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + _CPU_FLAG).strip()
