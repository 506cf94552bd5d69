"""Population-based training inside the kernel: the C configurations of a trial are a population.

Every few chunks the worst ``fraction`` of the configurations copy the learner state (network
and optimizer states, the divergence flag) of configurations drawn from the best ``fraction``
and perturb the copied hyperparameters (Jaderberg et al. 2017; vectorised on one device as in
Flajolet et al. 2022). It is one jitted function of the batched state: no recompile between
exploits and nothing leaves the device but the ``[C]`` source indices. Each configuration keeps
its own environments and random keys, so a copy does not replay its source's episodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Bound:
    """Where a perturbed hyperparameter may go: ``[low, high]``, log-uniform when ``log``."""

    name: str
    low: float
    high: float
    log: bool = False


@dataclasses.dataclass(frozen=True)
class PBTConfig:
    """Static settings of the exploit/explore step.

    Attributes:
        fraction: the share of the population replaced (and the share it copies from).
        perturb: ``multiply`` each copied hyperparameter by one of ``factors`` (chosen at
            random), or ``resample`` it from its bound's distribution; clipped to the bound.
        bounds: the perturbed hyperparameters; others are copied unchanged.
    """

    bounds: tuple[Bound, ...]
    fraction: float = 0.25
    perturb: Literal["multiply", "resample"] = "multiply"
    factors: tuple[float, float] = (0.8, 1.25)

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 0.5:
            raise ValueError(f"PBT fraction must be in (0, 0.5], got {self.fraction}")
        if self.perturb not in ("multiply", "resample"):
            raise ValueError(f"PBT perturb must be 'multiply' or 'resample', got {self.perturb!r}")

    def replaced(self, population: int) -> int:
        """How many of ``population`` configurations are replaced at each step."""
        return int(population * self.fraction)


def exploit_explore(key: jax.Array, state: Any, hparams: Any, fitness: jax.Array, *, config: PBTConfig,
                    learner_fields: tuple[str, ...]) -> tuple[Any, Any, jax.Array]:
    """One exploit/explore step over a population.

    Args:
        key: a PRNG key.
        state: the batched algorithm state, leaves ``[C, S, ...]``.
        hparams: the hyperparameter struct, leaves ``[C]``.
        fitness: ``[C]`` higher is better; NaN (e.g. diverged) ranks last.
        learner_fields: the state's fields a replaced configuration copies.

    Returns:
        ``(state, hparams, source [C])``: ``source[i]`` is the configuration ``i`` copied
        (``i`` itself when it was kept).
    """
    c = fitness.shape[0]
    n = config.replaced(c)
    source = jnp.arange(c)
    if n == 0:
        return state, hparams, source
    k_pick, k_perturb = jax.random.split(key)
    order = jnp.argsort(-jnp.where(jnp.isnan(fitness), -jnp.inf, fitness), stable=True)  # best first
    source = source.at[order[c - n:]].set(order[jax.random.randint(k_pick, (n,), 0, n)])
    copied = {f: jax.tree.map(lambda x: x[source], getattr(state, f)) for f in learner_fields}
    hparams = perturb(k_perturb, jax.tree.map(lambda x: x[source], hparams), source != jnp.arange(c),
                      config)
    return state.replace(**copied), hparams, source


def perturb(key: jax.Array, hparams: Any, which: jax.Array, config: PBTConfig) -> Any:
    """``hparams`` (leaves ``[C]``) with the bounded ones perturbed where ``which [C]`` is True."""
    changes = {}
    for i, b in enumerate(config.bounds):
        k_factor, k_sample = jax.random.split(jax.random.fold_in(key, i))
        x = getattr(hparams, b.name)
        if config.perturb == "multiply":
            factor = jnp.asarray(config.factors, x.dtype)[jax.random.randint(k_factor, x.shape, 0, 2)]
            new = x * factor
        else:
            u = jax.random.uniform(k_sample, x.shape, x.dtype)
            new = (jnp.exp(jnp.log(b.low) + u * (jnp.log(b.high) - jnp.log(b.low))) if b.log
                   else b.low + u * (b.high - b.low))
        changes[b.name] = jnp.where(which, jnp.clip(new, b.low, b.high), x)
    return hparams.replace(**changes)
