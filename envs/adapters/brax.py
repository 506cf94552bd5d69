"""Any Brax environment as an :class:`envs.Environment` (``envs.make("brax:NAME")``).

``"brax:ant"`` uses Brax's default physics backend; ``"brax:ant:positional"`` (or
``backend="positional"``) picks another one: ``mjx``, ``generalized``, ``positional``,
``spring``. Brax's own wrappers are not used: Brax's ``done`` is a termination (the robot fell),
and the time limit (``max_steps``, 1000 as in Brax's trainers) is applied by
:meth:`Environment.step`, which marks it as a truncation, so a timed-out episode bootstraps and a
fallen one does not. Actions are a ``Box`` in [-1, 1] (Brax scales them to the actuators);
they are clipped to it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import Box, Environment, Transition

BACKENDS = ("mjx", "generalized", "positional", "spring")


@struct.dataclass
class BraxState:
    inner: Any  # brax.envs.base.State
    time: jax.Array  # int32 steps since reset


@struct.dataclass
class BraxParams:
    max_steps: int = struct.field(pytree_node=False, default=1000)


@functools.cache
def brax_envs() -> Any:
    """``brax.envs``, imported without the lines MuJoCo prints on stdout when its optional GPU
    backend (``warp``) is not installed ("Failed to import warp: ..."); anything else it prints
    is printed."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        from brax import envs as brax_envs
    for line in out.getvalue().splitlines():
        if not line.startswith(("Failed to import warp:", "Failed to import mujoco_warp:")):
            print(line)
    _mend_fluid()
    return brax_envs


def _clip(x: Any, min: Any = None, max: Any = None, *, a_min: Any = None, a_max: Any = None,  # noqa: A002
          **kwargs: Any) -> jax.Array:
    """``jnp.clip`` that also takes the ``a_min``/``a_max`` spelling jax 0.10 removed."""
    return jnp.clip(x, min if a_min is None else a_min, max if a_max is None else a_max, **kwargs)


def _mend_fluid() -> None:
    """Give ``brax.fluid`` alone a ``jax.numpy`` whose ``clip`` also takes ``a_min``/``a_max``.

    Brax 0.14.2's fluid drag (the swimmer's water) calls ``jnp.clip(x, a_min=...)``, which this jax
    rejects; a jax that still takes ``a_min`` is left alone. Called once per process (from the cached
    :func:`brax_envs`)."""
    import types

    from brax import fluid

    try:
        jnp.clip(jnp.zeros(()), a_min=0.0)
        return
    except TypeError:
        pass
    mended = types.ModuleType("jax.numpy")  # every other name is jax.numpy's own (PEP 562 __getattr__)
    mended.__getattr__ = lambda name: getattr(jnp, name)  # type: ignore[method-assign]
    mended.clip = _clip  # type: ignore[attr-defined]
    fluid.jp = mended


@functools.cache
def _inner(name: str, backend: str | None, kwargs: tuple[tuple[str, Any], ...]) -> Any:
    registry = brax_envs()
    extra = dict(kwargs)
    if backend is not None:
        extra["backend"] = backend
    return registry.get_environment(name, **extra)


@dataclasses.dataclass(frozen=True)
class BraxEnv(Environment):
    """Brax env ``brax_name`` on ``backend`` (``None``: Brax's default for it). Hashable by value."""

    brax_name: str = "inverted_pendulum"
    backend: str | None = None
    kwargs: tuple[tuple[str, Any], ...] = ()  # other constructor arguments, sorted

    @property
    def inner(self) -> Any:
        return _inner(self.brax_name, self.backend, self.kwargs)

    @property
    def default_params(self) -> BraxParams:
        return BraxParams()

    def observation_space(self, params: BraxParams) -> Box:
        return Box(-float("inf"), float("inf"), (int(self.inner.observation_size),))

    def action_space(self, params: BraxParams) -> Box:
        return Box(-1.0, 1.0, (int(self.inner.action_size),))

    def reset(self, key: jax.Array, params: BraxParams) -> tuple[jax.Array, BraxState]:
        s = self.inner.reset(key)
        return s.obs.astype(jnp.float32), BraxState(s, jnp.int32(0))

    def transition(self, key: jax.Array, state: BraxState, action: jax.Array, params: BraxParams) -> Transition:
        s = self.inner.step(state.inner, jnp.clip(action, -1.0, 1.0))
        terminated = jnp.asarray(s.done, jnp.float32) > 0.5
        return Transition(s.obs.astype(jnp.float32), BraxState(s, state.time + 1),
                          jnp.asarray(s.reward, jnp.float32), terminated, {})


def make_brax(name: str, backend: str | None = None, max_steps: int | None = None,
              **kwargs: Any) -> tuple[Environment, Any]:
    """``"NAME"`` or ``"NAME:BACKEND"``; other keyword arguments go to Brax's constructor."""
    registry = brax_envs()
    if ":" in name:
        name, backend = name.split(":", 1)
    known = sorted(n for n in registry._envs if n != "fast")  # "fast" is Brax's test stub
    if name not in known:
        raise ValueError(f"unknown brax env {name!r}; brax envs: {', '.join(known)}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown brax backend {backend!r}; backends: {', '.join(BACKENDS)}")
    env = BraxEnv(name=f"brax:{name}" + (f":{backend}" if backend else ""), brax_name=name, backend=backend,
                  kwargs=tuple(sorted(kwargs.items())))
    try:
        env.inner  # noqa: B018 - build now, so a bad constructor argument fails here
    except ValueError as err:
        if backend is not None and "backend" in str(err).lower():  # swimmer runs only on 'generalized'
            raise ValueError(f"brax:{name} does not run on the {backend!r} backend (Brax: {err}); "
                             f"use brax:{name} for its own default backend") from None
        raise
    params = env.default_params if max_steps is None else BraxParams(max_steps=int(max_steps))
    return env, params
