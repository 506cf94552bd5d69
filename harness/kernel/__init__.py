"""The trial kernel: a trial as plain data (``plan``), the objectives and statistics over seeds
(``stats``), the process's JAX setup (``device``), its compiled functions (``compile``) and the
runners that drive them chunk by chunk (``runners``). Imports no other part of ``harness``; only
``compile`` and ``runners`` import JAX at their top."""
