"""Watch a trained policy: load a kept checkpoint, play one episode, write an animated GIF.

    python -m harness.play results/cartpole_ppo --gif best.gif
    python -m harness.play results/pendulum_sac --config t0003c1 --seed 2 --gif p.gif

The checkpoints are the best configurations' policies from the study's final re-training
(``results/NAME/checkpoints/<config>/seed_K.msgpack`` + ``policy.json``). Before playing, the
loaded policy is evaluated again exactly as at save time and both returns are printed.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cli import Parser


class PlayError(Exception):
    """A user mistake: one line, exit status 2."""


@dataclass
class Episode:
    """One played episode: the observation before each step and the last one (``final_obs``),
    the return so far at each of them, and (for an env drawn from its states) the env states
    before each step."""

    obs: list[Any]
    returns: list[float]
    states: list[Any] = field(default_factory=list)


def _choose(root: Path, config: str | None, seed: int) -> tuple[dict[str, Any], Path]:
    from envs.check import first_line
    from harness.store.folder import ResultsFolder

    folder = ResultsFolder(root)
    if not root.is_dir():
        raise PlayError(f"no results folder at {root}")
    if not folder.is_study():
        raise PlayError(f"{root} is not a study's results folder (no study.json)")
    kept = folder.kept_policies()
    if not kept:
        raise PlayError(f"{root} has no checkpoints yet (they are written when the study finishes)")
    if config is None:
        try:
            config = json.loads(folder.report("best.json").read_text()).get("config_id")
        except (OSError, ValueError, AttributeError):  # no best.json (yet), or one that cannot be read
            config = None
        config = config if config in kept else kept[0]
    if config not in kept:
        raise PlayError(f"no checkpoint for configuration {config!r}; kept: {', '.join(kept)}")
    where = folder.policy_dir(config) / "policy.json"
    try:
        policy = json.loads(where.read_text())
        seeds = [s["seed"] for s in policy["seeds"]]
        if not all(isinstance(policy.get(k), str) for k in ("env", "algo", "config_id")):
            raise KeyError("env, algo or config_id")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PlayError(f"{where} is not a kept policy's policy.json ({first_line(err)})") from None
    if seed not in seeds:
        raise PlayError(f"configuration {config} has no seed {seed}; seeds: {', '.join(map(str, seeds))}")
    return policy, folder.policy_file(config, seed)


def play(root: Path, *, config: str | None = None, seed: int = 0, episode_seed: int = 0,
         gif: Path | None = None) -> dict[str, Any]:
    """Loads a checkpoint, re-evaluates it, plays one episode; returns what it found.

    Raises:
        PlayError: no such results folder, checkpoint, configuration or seed, a kept policy that
            cannot be loaded, or no renderer.
    """
    from harness.kernel.device import configure_xla

    configure_xla()
    import jax
    from flax import serialization

    import envs
    from algos.common import evaluate_policy
    from envs.adapters import LIBRARIES
    from envs.check import first_line
    from harness.kernel.compile import build_config, keys_for, make_algo
    from harness.kernel.plan import TrialPlan
    from harness.reports.render import RENDERERS, drawn_from_states, use_offscreen_gl

    if gif is not None and not Path(gif).resolve().parent.is_dir():  # said now, not after the episode
        raise PlayError(f"cannot write {gif}: no folder {Path(gif).resolve().parent}")
    policy, path = _choose(Path(root), config, seed)
    from_states = drawn_from_states(policy["env"])
    if gif is not None and policy["env"] not in RENDERERS and not from_states:
        raise PlayError(f"no renderer for {policy['env']}; renderers: {', '.join(RENDERERS)} and every "
                        f"{', '.join(f'{lib}:*' for lib in LIBRARIES)} env its library draws")
    if gif is not None and policy["env"].startswith("brax:"):
        use_offscreen_gl()  # before Brax imports MuJoCo
    try:  # a kept policy changed or damaged on disk, or written by another version
        params = serialization.msgpack_restore(path.read_bytes())
    except Exception as err:  # noqa: BLE001 - msgpack raises many kinds for bytes it cannot read
        raise PlayError(f"the kept policy {path} cannot be read ({first_line(err)})") from None
    try:
        cfg = build_config(policy["algo"], policy["config"])
        algo = make_algo(policy["env"], policy["algo"], cfg)
        env, env_params = envs.make(policy["env"])
    except (ValueError, TypeError, KeyError, ImportError) as err:  # unknown names, a missing library ...
        raise PlayError(f"the study's {policy['algo']} on {policy['env']} cannot be made here "
                        f"({first_line(err)})") from None
    info = next(s for s in policy["seeds"] if s["seed"] == seed)
    eval_key = keys_for(TrialPlan(**info["plan"]))[1][info["config_index"], info["seed_index"]]
    try:
        again = evaluate_policy(env, env_params, lambda o, m, k: algo.act(params, o, m, k), eval_key,
                                cfg.eval_episodes)
    except Exception as err:  # noqa: BLE001 - flax says so when the parameters do not fit the network
        raise PlayError(f"the kept policy {path} does not fit its network ({first_line(err)})") from None

    episode = _episode(env, env_params, jax.jit(algo.act), params, episode_seed,
                       keep_states=gif is not None and from_states)
    frames = [] if gif is None else _write_gif(gif, policy, env, env_params, episode)
    return {"config_id": policy["config_id"], "seed": seed, "saved_eval": info["score"],
            "eval": float(again.return_mean), "episode_return": episode.returns[-1],
            "steps": len(episode.returns) - 1, "frames": len(frames)}


def _episode(env: Any, env_params: Any, act: Any, params: Any, episode_seed: int, *,
             keep_states: bool) -> Episode:
    """One episode from ``episode_seed``, its env states kept with ``keep_states`` (an adapter's
    env is drawn from its states, not its observations)."""
    import jax

    step = jax.jit(env.step)
    key = jax.random.key(episode_seed)
    obs, state = env.reset(jax.random.fold_in(key, 0), env_params)
    ep, total, t = Episode([jax.device_get(obs)], [0.0]), 0.0, 0
    if keep_states:
        ep.states.append(jax.device_get(state))
    while True:
        k_env, k_act = jax.random.split(jax.random.fold_in(key, t + 1))  # k_act: a policy that samples
        s = step(k_env, state, act(params, obs, env.action_mask(state, env_params), k_act), env_params)
        total, t = total + float(s.reward), t + 1
        ep.obs.append(jax.device_get(s.final_obs))
        ep.returns.append(total)
        if bool(s.done):
            return ep
        obs, state = s.obs, s.state
        if keep_states:
            ep.states.append(jax.device_get(state))


def _write_gif(gif: Path, policy: dict[str, Any], env: Any, env_params: Any, episode: Episode) -> list[Any]:
    """Draws the episode (an adapter's env by its library from its states, at most 200 frames;
    ours from their observations), captions each frame, writes the GIF; returns the frames."""
    from PIL import ImageDraw

    from harness.reports.render import RENDERERS, RenderError, drawn_from_states, state_frames

    states = episode.states
    if drawn_from_states(policy["env"]):  # the states before the last step (the end resets the state)
        steps_shown = range(0, len(states), max(1, -(-len(states) // 200)))
        try:
            frames = state_frames(env, env_params, [states[i] for i in steps_shown])
        except RenderError as err:
            raise PlayError(str(err)) from None
    else:
        frames = [RENDERERS[policy["env"]](o, env_params) for o in episode.obs]
        steps_shown = range(len(frames))
    robot = policy["env"].startswith("brax:")  # drawn on MuJoCo's dark floor: a white caption
    for img, i in zip(frames, steps_shown, strict=False):
        # the caption also keeps every frame distinct (GIF writers merge identical frames)
        ImageDraw.Draw(img).text((6, 4), f"{policy['config_id']}  t={i}  return={episode.returns[i]:.1f}",
                                 fill="black" if not robot else "white")
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=40, loop=0)
    return frames


def main(argv: list[str] | None = None) -> int:
    p = Parser("python -m harness.play", __doc__)
    p.add_argument("results", help="a study's results folder, e.g. results/cartpole_ppo")
    p.add_argument("--config", help="configuration id (default: the study's best)")
    p.add_argument("--seed", type=int, default=0, help="which re-trained seed's policy (default 0)")
    p.add_argument("--episode-seed", type=int, default=0, help="seed of the episode played (default 0)")
    p.add_argument("--gif", type=Path, help="write the episode as an animated GIF here")
    a = p.parse_args(argv)
    try:
        r = play(Path(a.results), config=a.config, seed=a.seed, episode_seed=a.episode_seed, gif=a.gif)
    except PlayError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    saved = "diverged" if r["saved_eval"] is None else f"{r['saved_eval']:.2f}"
    print(f"{r['config_id']} seed {r['seed']}: evaluation return {r['eval']:.2f} (at save time {saved}); "
          f"episode return {r['episode_return']:.2f} in {r['steps']} steps")
    if a.gif:
        print(f"wrote {a.gif} ({r['frames']} frames)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
