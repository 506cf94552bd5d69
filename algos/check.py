"""``check(spec, env, env_params, config)``: does an algorithm keep the contract the kernel relies on?

The algorithm is traced the way the kernel runs it (``jit``; ``vmap`` over configurations x seeds;
hyperparameters traced; a refill of some lanes), with ``jax.eval_shape``: shapes, dtypes and
structure, nothing compiled or run, so it costs seconds. The first broken promise is an
:class:`AlgoContractError` in one line naming the function and what it did.
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from typing import Any

import jax
import jax.numpy as jnp

from algos.common import Algo, batched, refill_lanes
from envs import Box, Discrete, Environment, MultiDiscrete

_TRACER_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                  jax.errors.TracerIntegerConversionError, jax.errors.TracerArrayConversionError)
METRICS = ("env_steps", "episode_return", "diverged")  # what the harness reads of a chunk's metrics


class AlgoContractError(ValueError):
    """An algorithm that breaks the contract (docs/own-algo.md), said in one line."""


def action_kind(env: Environment, env_params: Any) -> str:
    space = env.action_space(env_params)
    return "discrete" if isinstance(space, Discrete | MultiDiscrete) else "continuous"


def check(spec: Any, env: Environment, env_params: Any, config: Any = None, *, trace: bool = True,
          configs: int = 2, seeds: int = 2) -> Algo | None:
    """Checks that ``spec`` (an ``algos.AlgoSpec``) trains on ``env`` the way the kernel runs it.

    Args:
        config: the static config to check (``spec.config_cls()`` when None).
        trace: False checks only the action space (a built-in's functions are tested by the suite).
        configs, seeds: the lanes of the traced kernel.

    Returns:
        The algorithm ``spec.make`` built (None when not ``trace``).

    Raises:
        AlgoContractError: the first broken promise, in one line.
    """
    name = spec.name
    space = env.action_space(env_params)
    if spec.actions != "any" and spec.actions != action_kind(env, env_params):
        raise AlgoContractError(f"algo {name} is for {spec.actions} actions; env {env.name} has "
                                f"{'discrete' if spec.actions == 'continuous' else 'continuous'} ones ({space})")
    if not trace:
        return None
    check_classes(spec)
    try:
        config = spec.config_cls() if config is None else config
    except (TypeError, ValueError) as err:
        raise AlgoContractError(f"algo {name}: {spec.config_cls.__name__}() failed: {err}") from None
    hp = _default_hparams(spec)
    try:
        algo = spec.make(config, env, env_params)
    except ValueError as err:  # the algorithm's own refusal (e.g. an action space it cannot use)
        raise AlgoContractError(f"algo {name} on {env.name}: {err}") from None
    except Exception as err:
        raise AlgoContractError(f"algo {name}: make(config, env, env_params) failed: {_why(err)}") from None
    if not isinstance(algo, Algo):
        raise AlgoContractError(f"algo {name}: make(config, env, env_params) must return algos.Algo, "
                                f"got {type(algo).__name__}")
    for field in ("init", "chunk", "evaluate", "act", "policy_params"):
        if not callable(getattr(algo, field)):
            raise AlgoContractError(f"algo {name}: Algo.{field} must be a function, got {getattr(algo, field)!r}")

    key = jax.random.key(0)
    state = _trace(name, "init(key, hparams)", algo.init, key, hp)
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        if getattr(leaf, "weak_type", False):
            raise AlgoContractError(f"algo {name}: init returned a Python number at state{_path(path)}; "
                                    "make it an array of a fixed dtype (jnp.int32(0), jnp.float32(0.0))")
    out = _trace(name, "chunk(state, hparams)", algo.chunk, state, hp)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise AlgoContractError(f"algo {name}: chunk must return (state, metrics), got {_shape_of(out)}")
    _same_state(name, state, out[0])
    _check_metrics(name, out[1])
    diverged = getattr(state, "diverged", None)
    if getattr(diverged, "shape", None) != () or getattr(diverged, "dtype", None) != jnp.bool_:
        raise AlgoContractError(f"algo {name}: init's state needs a field diverged, a bool scalar (sticky: the "
                                f"harness reads it), got {_shape_of(diverged)}")
    if algo.learner_fields and not callable(getattr(state, "replace", None)):
        raise AlgoContractError(f"algo {name}: with learner_fields the state must be a flax struct.dataclass "
                                "(population-based training copies those fields with state.replace)")
    # as the kernel calls it: after each chunk on a few episodes (a study's curve), and at the end
    ev = _trace(name, "evaluate(state, key, num_episodes)", lambda s, k: algo.evaluate(s, k, 2), state, key)
    if not hasattr(ev, "return_mean") or getattr(ev.return_mean, "shape", None) != ():
        raise AlgoContractError(f"algo {name}: evaluate must return algos.EvalMetrics with a scalar return_mean, "
                                f"got {_shape_of(ev)}")
    _trace(name, "evaluate(state, key)", algo.evaluate, state, key)
    obs_space = env.observation_space(env_params)
    obs = jax.ShapeDtypeStruct((1, *obs_space.shape), getattr(obs_space, "dtype", jnp.float32))
    env_mask = jax.eval_shape(lambda k: env.action_mask(env.reset(k, env_params)[1], env_params), key)
    mask = None if env_mask is None else jax.ShapeDtypeStruct((1, *env_mask.shape), env_mask.dtype)
    policy = _trace(name, "policy_params(state)", algo.policy_params, state)
    action = _trace(name, "act(policy_params, obs, mask, key)", algo.act, policy, obs, mask, key)
    want = (1, *(space.shape if isinstance(space, Box | MultiDiscrete) else ()))
    if getattr(action, "shape", None) != want:
        raise AlgoContractError(f"algo {name}: act(policy_params, obs [1, ...]) must return actions of shape "
                                f"{want}, got {_shape_of(action)}")
    fields = {f.name for f in dataclasses.fields(state)} if dataclasses.is_dataclass(state) else set()
    if missing := [f for f in algo.learner_fields if f not in fields]:
        raise AlgoContractError(f"algo {name}: learner_fields names {', '.join(missing)}, which the state "
                                f"({type(state).__name__}) does not have")

    keys = jax.random.split(key, configs * seeds).reshape(configs, seeds)
    hps = jax.tree.map(lambda x: jnp.stack([x] * configs), hp)
    lanes = _trace(name, "init under vmap over configurations x seeds", batched(algo.init), keys, hps)
    lanes_out = _trace(name, "chunk under vmap over configurations x seeds", batched(algo.chunk), lanes, hps)
    _same_state(name, lanes, lanes_out[0])
    _trace(name, "evaluate under vmap over configurations x seeds",
           batched(algo.evaluate, hparams_argnum=None), lanes, keys)
    mask = jnp.arange(configs) == 0
    init = batched(algo.init)
    refilled = _trace(name, "init when a lane is refilled", lambda *a: refill_lanes(init, *a), lanes, hps, keys,
                      mask)
    _same_state(name, lanes, refilled, what="a refill")
    return algo


def check_classes(spec: Any) -> None:
    """The spec's config and hyperparameter classes have the shape the harness reads (no tracing).

    Raises:
        AlgoContractError: a class that is not a dataclass, or a missing field or method.
    """
    name = spec.name
    if not dataclasses.is_dataclass(spec.config_cls):
        raise AlgoContractError(f"algo {name}: config_cls must be a frozen dataclass, got {spec.config_cls!r}")
    for field in ("total_timesteps", "eval_episodes"):
        if field not in {f.name for f in dataclasses.fields(spec.config_cls)}:
            raise AlgoContractError(f"algo {name}: {spec.config_cls.__name__} has no field {field!r}")
    for attr in ("num_chunks", "env_steps_after"):
        if not hasattr(spec.config_cls, attr):
            raise AlgoContractError(f"algo {name}: {spec.config_cls.__name__} has no {attr!r} "
                                    "(num_chunks: chunks per run; env_steps_after(k): env steps after k chunks)")
    if not dataclasses.is_dataclass(spec.hparams_cls) or not hasattr(spec.hparams_cls, "default"):
        raise AlgoContractError(f"algo {name}: hparams_cls must be a flax struct.dataclass with a default() "
                                f"classmethod, got {spec.hparams_cls!r}")


def _default_hparams(spec: Any) -> Any:
    name, cls = spec.name, spec.hparams_cls
    try:
        hp = cls.default()
    except Exception as err:
        raise AlgoContractError(f"algo {name}: {cls.__name__}.default() failed: {_why(err)}") from None
    if not isinstance(hp, cls):
        raise AlgoContractError(f"algo {name}: {cls.__name__}.default() must return a {cls.__name__}, "
                                f"got {type(hp).__name__}")
    ranges = getattr(cls, "RANGES", {})
    fields = [f.name for f in dataclasses.fields(cls)]
    for field in fields:
        value = getattr(hp, field)
        if not (isinstance(value, jax.Array) and value.dtype == jnp.float32 and value.shape == ()):
            got = (f"{value.dtype}{list(value.shape)}" if hasattr(value, "dtype") else type(value).__name__)
            raise AlgoContractError(f"algo {name}: {cls.__name__}.default().{field} is {got}, not a float32 "
                                    "scalar: every hyperparameter is traced as float32 (a shape-changing "
                                    "setting goes in the config)")
        if field in ranges and float(value) not in ranges[field]:
            raise AlgoContractError(f"algo {name}: {cls.__name__}.default().{field}={float(value):g} is outside "
                                    f"its own RANGES {ranges[field]}")
    if unknown := sorted(set(ranges) - set(fields)):
        raise AlgoContractError(f"algo {name}: {cls.__name__}.RANGES names {', '.join(unknown)}, which are not "
                                "its fields")
    return hp


def _trace(name: str, what: str, fn: Any, *args: Any) -> Any:
    """``jax.eval_shape(fn, *args)``: traced as ``jit`` traces it, errors said in one line."""
    try:
        return jax.eval_shape(fn, *args)
    except _TRACER_ERRORS as err:
        raise AlgoContractError(
            f"algo {name}: {what} works only eagerly: it uses a traced value as a Python value{_where(err)} "
            f"({_first_line(err)}); hyperparameters are traced arrays: use jnp.where or lax.cond, and put "
            "shape-changing settings in the config") from None
    except AlgoContractError:
        raise
    except Exception as err:
        raise AlgoContractError(f"algo {name}: {what} failed under jit{_where(err)}: {_why(err)}") from None


def _same_state(name: str, before: Any, after: Any, what: str = "chunk") -> None:
    """The kernel feeds chunk's state to the next chunk: a changed structure, shape or dtype recompiles
    it (or fails), so none may change."""
    if jax.tree.structure(before) != jax.tree.structure(after):
        raise AlgoContractError(f"algo {name}: {what} returned a state of another structure than init's "
                                f"({type(after).__name__}); return the same fields, none added or dropped")
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(before), jax.tree.leaves(after), strict=True):
        if (a.shape, a.dtype) != (b.shape, b.dtype):
            raise AlgoContractError(f"algo {name}: {what} changes state{_path(path)} from "
                                    f"{a.dtype}{list(a.shape)} to {b.dtype}{list(b.shape)}; "
                                    "the next chunk would not fit")


def _check_metrics(name: str, metrics: Any) -> None:
    length = None
    for field in METRICS:
        if not hasattr(metrics, field):
            raise AlgoContractError(f"algo {name}: chunk's metrics have no {field!r} (they need "
                                    f"{', '.join(METRICS)}, one row per update: [K])")
        shape = getattr(getattr(metrics, field), "shape", None)
        if shape is None or len(shape) != 1 or (length is not None and shape[0] != length):
            same = "" if length is None else f", K={length}"
            raise AlgoContractError(f"algo {name}: chunk's metrics.{field} has shape {shape}, not [K] "
                                    f"(one value per update of the chunk{same})")
        length = shape[0]


def _path(path: Any) -> str:
    return jax.tree_util.keystr(path)


def _shape_of(x: Any) -> str:
    return str(jax.tree.map(lambda a: f"{a.dtype}{list(a.shape)}" if hasattr(a, "shape") else type(a).__name__, x))


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()] or [type(err).__name__]
    text = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]  # "...they differ:" needs its detail
    return text[:300]


def _why(err: BaseException) -> str:
    return f"{type(err).__name__}: {_first_line(err)}"


def _where(err: BaseException) -> str:
    """`` at file:line`` of the deepest frame in the algorithm's own code (not JAX's, not this file's)."""
    skip = (os.path.dirname(jax.__file__), os.path.dirname(os.__file__), __file__)
    found = None
    for frame in traceback.extract_tb(err.__traceback__):
        if not frame.filename.startswith(skip) and "site-packages" not in frame.filename:
            found = frame
    if found is None:
        return ""
    home = os.getcwd() + os.sep
    return f" at {found.filename.removeprefix(home)}:{found.lineno}"


__all__ = ["AlgoContractError", "METRICS", "action_kind", "check", "check_classes"]
