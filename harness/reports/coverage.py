"""Which envs of the adapter registries (gymnax, Jumanji, Brax) build and run through the kernel.

:func:`probe` takes one env through exactly what a study does with it: ``envs.make`` and
``envs.check`` (as ``harness.study`` does before Ray starts), then one trial's kernel
(:func:`harness.kernel.runners.runner_for`: init, its chunks, evaluation over C x S lanes) at a
tiny budget. ``bench/env_coverage.py`` sweeps every registry with it; the tests run a subset.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

LIBRARIES = ("gymnax", "jumanji", "brax")

# the tiny trial: 2 configurations x 2 seeds, two chunks of two updates, 1 evaluation episode
TINY = {
    "ppo": dict(num_envs=4, num_steps=8, num_minibatches=1, update_epochs=1, updates_per_chunk=2,
                total_timesteps=128, hidden=(32, 32), eval_episodes=1),
    "sac": dict(num_envs=4, buffer_size=256, batch_size=16, learning_starts=16, updates_per_step=1,
                total_timesteps=80, steps_per_chunk=8, hidden=(32, 32), eval_episodes=1),
    "pqn": dict(num_envs=4, num_steps=8, num_minibatches=1, update_epochs=1, updates_per_chunk=2,
                total_timesteps=128, hidden=(32, 32), eval_episodes=1),
}


def registry(library: str) -> list[str]:
    """Every env name ``library`` registers, as ``envs.make`` spells it (``"gymnax:CartPole-v1"``).

    Raises:
        ImportError: the library is not installed.
    """
    if library == "gymnax":
        import gymnax

        return [f"gymnax:{n}" for n in gymnax.registered_envs]
    if library == "jumanji":
        import jumanji

        return [f"jumanji:{n}" for n in sorted(jumanji.registered_environments())]
    if library == "brax":
        from envs.adapters.brax import brax_envs

        return [f"brax:{n}" for n in sorted(brax_envs()._envs) if n != "fast"]  # "fast": Brax's test stub
    raise ValueError(f"unknown library {library!r}; choose from {', '.join(LIBRARIES)}")


@dataclass
class Row:
    env: str
    algo: str
    status: str  # "runs" (the kernel ran, no run diverged, every run's policy moved), "refused" (by make
    # or the contract check) or "failed" (in the kernel)
    action_space: str = ""
    obs_shape: str = ""
    reason: str = ""  # one line, for "refused" and "failed"
    compile_s: float = float("nan")
    steps_per_s: float = float("nan")  # env steps per second of the second chunk, all lanes
    final_return: float = float("nan")  # mean evaluation return after the chunk (untrained)
    draws: str = ""  # "yes" when harness.play draws the env (its reset state), else why not; "": not tried


def algos_for(space: Any) -> list[str]:
    """PPO for every action space; SAC too where actions are continuous."""
    from envs import Box

    return ["ppo", "sac"] if isinstance(space, Box) else ["ppo"]


def probe(name: str, algo: str | None = None, *, seeds: int = 2, configs: int = 2) -> list[Row]:
    """One row per algorithm that fits the env (or just ``algo``): does a tiny trial run?

    (Runs: its policy moved; not a claim that it learned.)

    A refusal (``make`` or ``check`` fails) is one row with the reason; nothing here raises.
    """
    import algos
    import envs
    from envs.check import first_line
    from harness.kernel.plan import TrialPlan
    from harness.kernel.runners import runner_for

    if name.startswith("brax:"):
        from harness.reports.render import use_offscreen_gl

        use_offscreen_gl()  # before Brax imports MuJoCo, so that draws() can render
    try:
        env, params = envs.make(name)
        envs.check(env, params)
    except (envs.UnknownEnvError, envs.EnvContractError) as err:
        return [Row(name, algo or "-", "refused", reason=str(err).splitlines()[0])]
    space, obs = env.action_space(params), env.observation_space(params)
    drawn = draws(env, params)
    rows = []
    for a in [algo] if algo else algos_for(space):
        row = Row(name, a, "runs", str(space), str(obs.shape), draws=drawn)
        default = algos.get(a).hparams_cls.default()
        hparams = {f.name: float(getattr(default, f.name)) for f in dataclasses.fields(default)}
        plan = TrialPlan(env=name, algo=a, config=TINY[a], seeds=seeds, trial=0, curve_episodes=0,
                         hparams=[hparams] * configs)
        t = time.perf_counter()
        try:
            runner = runner_for(plan)
            before = runner.policy_params()
            while not runner.done:
                runner.chunk()
            moved = _changed(before, runner.policy_params())
            result = runner.finish()
        except Exception as err:  # the reason in one line
            row.status, row.reason = "failed", first_line(err)
            row.compile_s = time.perf_counter() - t
        else:
            row.compile_s = result.compile_seconds
            row.steps_per_s = result.curves[-1].steps_per_sec  # the second chunk: no compile in it
            row.final_return = float(np.nanmean(result.final_returns))
            if result.diverged.any():
                row.status, row.reason = "failed", "diverged within one chunk at default hyperparameters"
            elif not moved:
                row.status, row.reason = "failed", "its policy's parameters did not change in training"
        rows.append(row)
    return rows


def _changed(before: Any, after: Any) -> bool:
    """Whether every run's policy parameters (leaves ``[C, S, ...]``, any dtype) moved in training.
    (With ``normalize_observations`` the policy's leaves include the observation statistics, which
    move without any update: :data:`TINY` leaves it off.)"""
    import jax

    moved = [(np.asarray(a) != np.asarray(b)).reshape(*np.shape(a)[:2], -1).any(-1)
             for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)]
    return bool(moved) and bool(np.logical_or.reduce(moved).all())


def draws(env: Any, params: Any) -> str:
    """``"yes"`` when ``harness.play`` can draw ``env`` (its reset state, drawn as a GIF's frame
    would be, not one flat colour), else why not, in one line."""
    import jax

    from envs.check import first_line
    from harness.reports.render import RENDERERS, RenderError, drawn_from_states, state_frames

    from_states = drawn_from_states(env.name)
    if env.name not in RENDERERS and not from_states:
        return "no renderer"
    try:
        obs, state = jax.device_get(jax.jit(env.reset)(jax.random.key(0), params))
        (img,) = state_frames(env, params, [state]) if from_states else [RENDERERS[env.name](obs, params)]
    except RenderError as err:
        return str(err)
    except Exception as err:  # noqa: BLE001 - a row says what failed; the sweep goes on
        return first_line(err)
    return "yes" if np.asarray(img).std() > 1.0 else "its picture of the reset state is one flat colour"
