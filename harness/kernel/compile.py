"""A :class:`~harness.kernel.plan.TrialPlan`'s compiled functions: its keys, ``jit(vmap(vmap(chunk)))``
over C configurations x S seeds, PBT's exploit/explore step, the lane refill; compiled once per
node where trials share a persistent compilation cache.

No Ray or Optuna here. Compiled functions are cached per process, so a reused worker compiles
a static config once.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import algos
import envs
from algos.common import refill_lanes
from algos.pbt import Bound, PBTConfig, exploit_explore
from harness.kernel.plan import CONFIG_TAG, CURVE_TAG, TrialPlan


def keys_for(plan: TrialPlan) -> tuple[Any, Any]:
    """Training and evaluation keys ``[C, S]``; every configuration of a trial shares its seeds
    (with ``config_keys``: each configuration has its own, :func:`config_keys`)."""
    if plan.config_keys is not None:
        return config_keys(plan.study_seed, plan.config_keys, plan.stream, plan.seeds)
    base = jax.random.fold_in(jax.random.key(plan.study_seed), plan.trial)

    def stream(tag: int) -> Any:
        k = jax.random.fold_in(base, 2 * plan.stream + tag)
        keys = jax.vmap(lambda s: jax.random.fold_in(k, s))(np.arange(plan.seeds))
        return jax.numpy.broadcast_to(keys, (len(plan.hparams), plan.seeds))

    return stream(0), stream(1)


def config_keys(study_seed: int, numbers: list[int], stream: int, seeds: int) -> tuple[Any, Any]:
    """Training and evaluation keys ``[C, S]`` of configurations keyed by their own ``numbers``:
    (study seed, number, stream, seed index), whichever trial or lane trains them."""
    return _config_keys_fn(seeds)(np.uint32(study_seed), np.asarray(numbers, np.uint32), np.uint32(stream))


@functools.lru_cache(maxsize=8)
def _config_keys_fn(seeds: int) -> Callable:
    def one(study_seed: Any, number: Any, stream: Any) -> tuple[Any, Any]:
        base = jax.random.fold_in(jax.random.fold_in(jax.random.key(study_seed), CONFIG_TAG), number)

        def keys(tag: int) -> Any:
            k = jax.random.fold_in(base, 2 * stream + tag)
            return jax.vmap(lambda s: jax.random.fold_in(k, s))(np.arange(seeds))
        return keys(0), keys(1)

    return jax.jit(jax.vmap(one, in_axes=(None, 0, None)))


def make_algo(env_name: str, algo_name: str, config: Any) -> Any:
    """The algorithm's pure functions for a registered env and a static config instance."""
    env, env_params = envs.make(env_name)
    return algos.get(algo_name).make(config, env, env_params)


@functools.lru_cache(maxsize=16)
def _compiled(env_name: str, algo_name: str, config: Any,
              curve_episodes: int = 0) -> tuple[Callable, Callable, Callable, Any]:
    """Jitted ``init``, ``chunk`` and ``evaluate`` over ``[C, S]`` lanes.

    ``chunk(state, hparams, eval_keys, k [C]) -> (state, metrics, evals [C, S])`` trains one
    chunk (the ``k[c]``-th of configuration c, 0-based) and then evaluates the policy
    (deterministic unless the config samples) on ``curve_episodes``
    episodes per run, in the same compiled call (NaN when ``curve_episodes`` is 0); its state
    argument is donated (the old state is never read again, so the device holds one copy).
    """
    algo = make_algo(env_name, algo_name, config)

    def train_then_evaluate(state: Any, hp: Any, key: Any) -> tuple[Any, Any, Any]:
        state, metrics = algo.chunk(state, hp)
        if not curve_episodes:
            return state, metrics, jnp.float32(jnp.nan)
        return state, metrics, algo.evaluate(state, key, curve_episodes).return_mean

    def chunk(state: Any, hp: Any, eval_keys: Any, k: Any) -> tuple[Any, Any, Any]:
        fold = jax.vmap(lambda keys, kc: jax.vmap(
            lambda key: jax.random.fold_in(jax.random.fold_in(key, CURVE_TAG), kc))(keys))
        return algos.batched(train_then_evaluate)(state, hp, fold(eval_keys, k))

    return (jax.jit(algos.batched(algo.init)), jax.jit(chunk, donate_argnums=0),
            jax.jit(algos.batched(algo.evaluate, hparams_argnum=None)), algo)


@functools.lru_cache(maxsize=16)
def _exploiter(env_name: str, algo_name: str, config: Any, pbt: Any) -> Callable:
    """Jitted ``exploit(state, hparams, key, fitness [C]) -> (state, hparams, source [C])``
    (``algos.pbt.exploit_explore``) for ``pbt``, an ``algos.pbt.PBTConfig``; state donated."""
    fields = _compiled(env_name, algo_name, config)[3].learner_fields

    def exploit(state: Any, hp: Any, key: Any, fitness: Any) -> Any:
        return exploit_explore(key, state, hp, fitness, config=pbt, learner_fields=fields)

    return jax.jit(exploit, donate_argnums=0)


@functools.lru_cache(maxsize=16)
def _refiller(env_name: str, algo_name: str, config: Any) -> Callable:
    """Jitted ``refill(state, hparams, train_keys, mask [C]) -> state``: the masked lanes started
    afresh with their (new) hyperparameters and keys (``algos.common.refill_lanes``); state donated."""
    init = algos.batched(_compiled(env_name, algo_name, config)[3].init)
    return jax.jit(lambda state, hp, keys, mask: refill_lanes(init, state, hp, keys, mask), donate_argnums=0)


def pbt_config(spec: dict[str, Any]) -> Any:
    """A plan's ``pbt`` entry as an ``algos.pbt.PBTConfig`` (hashable: one compile per setting)."""
    return PBTConfig(bounds=tuple(Bound(*b) for b in spec["bounds"]), fraction=spec.get("fraction", 0.25),
                     perturb=spec.get("perturb", "multiply"), factors=tuple(spec.get("factors", (0.8, 1.25))))


def build_config(algo_name: str, config: dict[str, Any]) -> Any:
    spec = algos.get(algo_name)
    return spec.config_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})


def _stack_hparams(algo_name: str, hparams: list[dict[str, float]]) -> Any:
    cls = algos.get(algo_name).hparams_cls
    return jax.tree.map(lambda *x: jnp.stack(x), *[cls.default(**h) for h in hparams])


def is_out_of_memory(err: BaseException) -> bool:
    """True for XLA's out-of-memory error (``RESOURCE_EXHAUSTED``) on any backend."""
    return isinstance(err, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(err)



COMPILE_THREAD = "compile-evaluate"  # the name of :func:`_compile_soon`'s threads (the tests wait for them)


def _compile_soon(jitted: Any, *args: Any) -> threading.Thread:
    """Compiles ``jitted`` for the shapes of ``args`` (:func:`_compile_once_per_node`) on a thread
    of its own (XLA's compiler releases the GIL), so a trial's final evaluation compiles while its
    chunks run; the call at the end finds it in JAX's cache."""
    thread = threading.Thread(target=_compile_once_per_node, args=(jitted, *args), name=COMPILE_THREAD,
                              daemon=True)
    thread.start()
    return thread



LOCK_WAIT_S = 900.0  # a compile holding its program's lock longer than this is not waited for


def _compile_once_per_node(jitted: Any, *args: Any) -> None:
    """Compiles ``jitted`` for the shapes of ``args`` (the call then finds it in JAX's caches),
    one process of the node at a time per program where a persistent compilation cache is set:
    trials that start together with the same kernel (every trial of a static shape) compile it
    once, and the others wait for it and read it from the cache. A failure here is only lost
    time: the call compiles and raises as before."""
    try:
        lowered = jitted.lower(*jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args))
        with _program_lock(lowered.as_text()):
            lowered.compile()  # the cache's copy when another process compiled it meanwhile
    except Exception:
        pass


@contextmanager
def _program_lock(program: str) -> Iterator[None]:
    """Holds the node's lock on ``program``: a file beside JAX's persistent cache named by the
    program's hash (a process that dies holding it releases it), waited for at most LOCK_WAIT_S.
    Without a local persistent cache there is nothing to share, so no lock."""
    cache = jax.config.jax_compilation_cache_dir
    if not cache or "://" in cache:
        yield
        return
    folder = os.path.join(os.path.dirname(os.path.abspath(cache)), "compile-locks")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, hashlib.sha256(program.encode()).hexdigest()[:40]), "a") as lock:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        yield

