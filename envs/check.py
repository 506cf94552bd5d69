"""The environment contract, checked in one call: :func:`check` names the first thing that is wrong.

Run before a study starts (``harness.study``), so an env of one's own that would fail inside a
compiled trial fails here instead, in one line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from envs.core import Box, Discrete, Environment, MultiDiscrete, Space, Step


class EnvContractError(ValueError):
    """An environment that breaks the contract of :class:`envs.core.Environment`."""


def _fail(env: Environment, what: str) -> EnvContractError:
    return EnvContractError(f"env {getattr(env, 'name', type(env).__name__)!r}: {what}")


# The check runs its rollout once, so it compiles at XLA's lowest level (bench/RESULTS.md) and, on a CPU,
# without the fusion emitters, which are most of what is left of the compile there.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
_FAST_COMPILE_CPU = {**_FAST_COMPILE, "xla_cpu_use_fusion_emitters": False}


def check(env: Environment, params: Any, steps: int = 64) -> None:
    """Checks ``env`` with ``params`` against the contract.

    Spaces are a :class:`~envs.core.Box` observation and a ``Box``/``Discrete``/``MultiDiscrete``
    action space, asked for eagerly (as the kernel does, once, outside any trace); ``reset``,
    ``step`` and ``action_mask`` each run under ``jit`` and ``vmap`` with ``params`` passed in as
    an argument (its leaves traced, its static fields not), as inside a trial; observations match
    the observation space's shape and are float32; rewards are float32 scalars,
    ``terminated``/``truncated`` bool scalars, never both; an action mask is bool, ``[n]`` for
    ``Discrete(n)`` and ``[len(nvec), max(nvec)]`` for ``MultiDiscrete``; the state has an int32
    ``time`` and params a ``max_steps``; with ``max_steps`` set to 3, an episode that does not
    terminate is truncated at step 3 and reset.

    Raises:
        EnvContractError: what is wrong, in one line naming the method.
    """
    if not isinstance(env, Environment):
        raise EnvContractError(f"{type(env).__name__} is not an envs.Environment")
    obs_space = _call(env, "observation_space", lambda: env.observation_space(params))
    act_space = _call(env, "action_space", lambda: env.action_space(params))
    if not isinstance(obs_space, Box):
        raise _fail(env, f"observation_space must be an envs.Box, got {type(obs_space).__name__}")
    if not isinstance(act_space, Box | Discrete | MultiDiscrete):
        raise _fail(env, "action_space must be an envs.Box, envs.Discrete or envs.MultiDiscrete, got "
                         f"{type(act_space).__name__}")
    if not hasattr(params, "max_steps"):
        raise _fail(env, "params need a static max_steps (the time limit Environment.step applies)")

    keys = jax.random.split(jax.random.key(0), 2)
    # each method traced on its own (shapes only, nothing compiled), so a failure names it
    obs, state = _traced(env, "reset", jax.vmap(env.reset, (0, None)), keys, params)
    _check_mask(env, _traced(env, "action_mask", jax.vmap(env.action_mask, (0, None)), state, params), act_space)

    def rollout(key: jax.Array, p: Any) -> Step:  # reset passed above: a failure here is step's
        def body(s: Any, k: jax.Array) -> tuple[Any, Step]:
            k_a, k_s = jax.random.split(k)
            out = env.step(k_s, s, act_space.sample(k_a), p)
            return out.state, out

        return jax.lax.scan(body, env.reset(key, p)[1], jax.random.split(key, steps))[1]

    out = _traced(env, "step", jax.vmap(rollout, in_axes=(0, None)), keys, params)
    if not isinstance(out, Step):
        raise _fail(env, f"step must return envs.Step, got {type(out).__name__}")
    if not hasattr(state, "time") or state.time.dtype != jnp.int32:
        raise _fail(env, "the state needs an int32 `time` field (steps since reset)")
    for what, x, lead in (("reset observation", obs, 1), ("step observation", out.obs, 2),
                          ("final_obs", out.final_obs, 2)):
        if tuple(np.shape(x)[lead:]) != tuple(obs_space.shape) or x.dtype != jnp.float32:
            raise _fail(env, f"{what} has shape {tuple(np.shape(x)[lead:])} dtype {x.dtype}; "
                             f"the observation space says shape {obs_space.shape} dtype float32")
    for what, x, dtype in (("reward", out.reward, jnp.float32), ("terminated", out.terminated, jnp.bool_),
                           ("truncated", out.truncated, jnp.bool_)):
        if np.shape(x) != (2, steps) or x.dtype != dtype:
            raise _fail(env, f"{what} has shape {tuple(np.shape(x)[2:])} dtype {x.dtype} per step; "
                             f"want a {jnp.dtype(dtype)} scalar")
    short = _short(env, params)

    @jax.jit
    def run(keys: jax.Array, p: Any, limit_keys: jax.Array) -> tuple:  # one compile for the values
        return jax.vmap(rollout, (0, None))(keys, p), jax.vmap(lambda k: _three_steps(env, short, act_space, k))(
            limit_keys)

    try:
        args = (keys, params, jax.random.split(jax.random.key(1), 8))
        options = _FAST_COMPILE_CPU if jax.default_backend() == "cpu" else _FAST_COMPILE
        out, limit = run.lower(*args).compile(options)(*args)
    except Exception as err:
        raise _fail(env, f"step failed when compiled and run: {first_line(err)}") from None
    if not np.isfinite(np.asarray(out.obs)).all() or not np.isfinite(np.asarray(out.reward)).all():
        raise _fail(env, f"observations or rewards are not finite within {steps} random steps")
    if bool((out.terminated & out.truncated).any()):
        raise _fail(env, "a step is both terminated and truncated (they are exclusive)")
    _check_time_limit(env, *(np.asarray(x) for x in limit))


def first_line(err: BaseException) -> str:
    """``err`` in one line: its type and the first non-blank line of its message."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def _call(env: Environment, method: str, fn: Any) -> Any:
    try:
        return fn()
    except Exception as err:
        raise _fail(env, f"{method} failed: {first_line(err)}") from None


def _traced(env: Environment, method: str, fn: Any, *args: Any) -> Any:
    """The shapes ``jit(fn)(*args)`` would give (traced, not compiled); a failure names ``method``
    (an env that works only eagerly fails here)."""
    try:
        return jax.eval_shape(fn, *args)
    except Exception as err:
        raise _fail(env, f"{method} does not run under jit and vmap with traced params: "
                         f"{first_line(err)}") from None


def _check_mask(env: Environment, mask: Any, space: Space) -> None:
    if mask is None:
        return
    if isinstance(space, Box):
        raise _fail(env, "action_mask must return None for a continuous (Box) action space")
    want = (space.n,) if isinstance(space, Discrete) else (len(space.nvec), space.width)
    if tuple(mask.shape) != (2, *want) or mask.dtype != jnp.bool_:
        shape = tuple(mask.shape[1:])
        raise _fail(env, f"action_mask has shape {shape} dtype {mask.dtype}; {space} needs a bool mask of "
                         f"shape {want}")


def _short(env: Environment, params: Any) -> Any:
    try:
        return params.replace(max_steps=3)
    except Exception as err:
        raise _fail(env, f"params.replace(max_steps=3) failed ({type(err).__name__}); params should be a "
                         "flax.struct.dataclass with max_steps") from None


def _three_steps(env: Environment, short: Any, act_space: Space, key: jax.Array) -> tuple[Any, Any, Any]:
    """(terminated, truncated, state.time) over 3 steps of the zero action with ``max_steps`` 3."""
    zero = jnp.zeros(act_space.shape, act_space.dtype)

    def body(state: Any, i: jax.Array) -> tuple[Any, tuple]:  # a scan: one copy of step to compile
        out = env.step(jax.random.fold_in(key, i), state, zero, short)
        return out.state, (out.terminated, out.truncated, out.state.time)

    return jax.lax.scan(body, env.reset(key, short)[1], jnp.arange(3))[1]


def _check_time_limit(env: Environment, terms: np.ndarray, truncs: np.ndarray, times: np.ndarray) -> None:
    """Judged on the first of the starts where the zero action does not terminate within 3 steps."""
    starts = [i for i, term in enumerate(terms) if not term.any()]
    if not starts:
        return  # every start ends at once under the zero action: nothing to learn about truncation
    trunc, time_ = truncs[starts[0]], times[starts[0]]
    if trunc[:2].any():
        raise _fail(env, "truncated before max_steps (with max_steps=3, at step "
                         f"{int(np.argmax(trunc[:2])) + 1})")
    if not trunc[2]:
        raise _fail(env, f"not truncated at max_steps (with max_steps=3, state.time was {time_.tolist()}; "
                         "transition must advance state.time by one)")
    if time_[2] != 0:
        raise _fail(env, "not reset after the time limit (state.time is not 0 after truncation)")
