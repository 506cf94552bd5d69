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


def _shape_dtype(x: Any) -> str:
    return f"shape {tuple(jnp.shape(x))} dtype {jnp.asarray(x).dtype}"


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
    obs, state = _traced(env, "reset", jax.vmap(env.reset, (0, None)), keys, params)
    mask = _traced(env, "action_mask", jax.vmap(env.action_mask, (0, None)), state, params)
    _check_mask(env, mask, act_space)

    def rollout(key: jax.Array, p: Any) -> Step:  # reset passed above: a failure here is step's
        def body(s: Any, k: jax.Array) -> tuple[Any, Step]:
            k_a, k_s = jax.random.split(k)
            out = env.step(k_s, s, act_space.sample(k_a), p)
            return out.state, out

        return jax.lax.scan(body, env.reset(key, p)[1], jax.random.split(key, steps))[1]

    out = _traced(env, "step", jax.vmap(rollout, in_axes=(0, None)), keys, params)
    if not isinstance(out, Step):
        raise _fail(env, f"step must return envs.Step, got {type(out).__name__}")
    if not hasattr(state, "time") or jnp.asarray(state.time).dtype != jnp.int32:
        raise _fail(env, "the state needs an int32 `time` field (steps since reset)")
    for what, x in (("reset observation", obs), ("step observation", out.obs), ("final_obs", out.final_obs)):
        want = (2, *obs_space.shape) if what == "reset observation" else (2, steps, *obs_space.shape)
        if jnp.shape(x) != want or jnp.asarray(x).dtype != jnp.float32:
            raise _fail(env, f"{what} has {_shape_dtype(x[0] if what == 'reset observation' else x[0, 0])}; "
                             f"the observation space says shape {obs_space.shape} dtype float32")
    for what, x, dtype in (("reward", out.reward, jnp.float32), ("terminated", out.terminated, jnp.bool_),
                           ("truncated", out.truncated, jnp.bool_)):
        if jnp.shape(x) != (2, steps) or jnp.asarray(x).dtype != dtype:
            raise _fail(env, f"{what} has {_shape_dtype(x[0, 0])} per step; want a {jnp.dtype(dtype)} scalar")
    if not np.isfinite(np.asarray(out.obs)).all() or not np.isfinite(np.asarray(out.reward)).all():
        raise _fail(env, f"observations or rewards are not finite within {steps} random steps")
    if bool((out.terminated & out.truncated).any()):
        raise _fail(env, "a step is both terminated and truncated (they are exclusive)")
    _check_time_limit(env, params, act_space)


def _first_line(err: Exception) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def _call(env: Environment, method: str, fn: Any) -> Any:
    try:
        return fn()
    except Exception as err:
        raise _fail(env, f"{method} failed: {_first_line(err)}") from None


def _traced(env: Environment, method: str, fn: Any, *args: Any) -> Any:
    """``jit(fn)(*args)``; a failure names ``method`` (an env that works only eagerly fails here)."""
    try:
        return jax.jit(fn)(*args)
    except Exception as err:
        raise _fail(env, f"{method} does not run under jit and vmap with traced params: {_first_line(err)}") from None


def _check_mask(env: Environment, mask: Any, space: Space) -> None:
    if mask is None:
        return
    if isinstance(space, Box):
        raise _fail(env, "action_mask must return None for a continuous (Box) action space")
    want = (space.n,) if isinstance(space, Discrete) else (len(space.nvec), space.width)
    if jnp.shape(mask) != (2, *want) or jnp.asarray(mask).dtype != jnp.bool_:
        raise _fail(env, f"action_mask has {_shape_dtype(mask[0])}; {space} needs a bool mask of shape {want}")


def _check_time_limit(env: Environment, params: Any, act_space: Space) -> None:
    try:
        short = params.replace(max_steps=3)
    except Exception as err:
        raise _fail(env, f"params.replace(max_steps=3) failed ({type(err).__name__}); params should be a "
                         "flax.struct.dataclass with max_steps") from None
    zero = jnp.zeros(act_space.shape, act_space.dtype)

    @jax.jit
    def three_steps(key: jax.Array) -> tuple[Any, Any, Any, Any]:
        _, state = env.reset(key, short)
        outs = []
        for i in range(3):
            out = env.step(jax.random.fold_in(key, i), state, zero, short)
            outs.append(out)
            state = out.state
        return (jnp.stack([o.terminated for o in outs]), jnp.stack([o.truncated for o in outs]),
                jnp.stack([o.state.time for o in outs]), outs[-1].obs)

    for seed in range(8):  # find a start where the zero action does not terminate within 3 steps
        term, trunc, time, _ = (np.asarray(x) for x in three_steps(jax.random.key(seed)))
        if not term.any():
            break
    else:
        return  # every start ends at once under the zero action: nothing to learn about truncation
    if trunc[:2].any():
        raise _fail(env, "truncated before max_steps (with max_steps=3, at step "
                         f"{int(np.argmax(trunc[:2])) + 1})")
    if not trunc[2]:
        raise _fail(env, f"not truncated at max_steps (with max_steps=3, state.time was {time.tolist()}; "
                         "transition must advance state.time by one)")
    if time[2] != 0:
        raise _fail(env, "not reset after the time limit (state.time is not 0 after truncation)")
