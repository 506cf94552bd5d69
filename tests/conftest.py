"""Test setup: CPU-only JAX with the XLA flag that avoids a first-call hang (RAY_FACTS.md)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
