"""Ray's private names this project relies on, all in this module: :data:`RELIED_ON` lists them
for ``tests/test_private_names.py``, which fails naming the name and Ray's version when an upgrade
removes one. Ray is imported inside each function: the variables Ray reads when it is first
imported are set before (:func:`harness.cluster.session.start`).

Why they are needed: Ray has no public handle on the embedded Ray's session folder (where a
killed driver's leftover processes are found), nor a public hook on the messages its processes
send the driver (a stopped autoscaler's stack trace is not a failure to print).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# (where, name): an attribute of a Ray module or class
RELIED_ON: tuple[tuple[str, str], ...] = (
    ("ray._private.worker", "_global_node"),  # the node this process started or joined: a Node
    ("ray._private.node.Node", "get_session_dir_path"),
    ("ray._private.worker", "print_to_stdstream"),
)


def session_dir() -> str:
    """The session folder of the Ray this process started or joined."""
    from ray._private import worker

    return worker._global_node.get_session_dir_path()


def drop_driver_messages(drop: Callable[[dict[str, Any]], bool]) -> None:
    """Leaves out the messages Ray's processes send this driver (``{"lines", "pid", ...}``) for
    which ``drop`` is true; every other message still prints. Once per process (a second call
    does nothing); nothing where Ray's printer has moved."""
    try:
        from ray._private import worker
    except ImportError:
        return
    printer = worker.print_to_stdstream
    if getattr(printer, "_rl_harness_quiet", False):
        return

    def quiet(data: dict, ignore_prefix: bool) -> None:
        if drop(data):
            return
        printer(data, ignore_prefix)

    quiet._rl_harness_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = quiet
