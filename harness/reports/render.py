"""Pictures of an environment, for ``harness.play``'s GIFs (PIL; not in the JAX core).

Our envs are drawn from their observations (:data:`RENDERERS`). The adapters' envs are drawn
from their states by their own libraries (:func:`state_frames`): Brax robots by MuJoCo's
offscreen renderer, Jumanji envs by their own ``render``, gymnax envs by gymnax's ``Visualizer``
(matplotlib, off screen), gymnax's classic-control envs by gymnasium's renderer (pygame, off
screen), as gymnax's Visualizer means to."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from envs.adapters import LIBRARIES


def _cartpole(obs: np.ndarray, params: Any) -> Any:
    from PIL import Image, ImageDraw

    w, h = 480, 240
    scale = w / (2 * params.x_threshold * 1.2)
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    ground = h * 0.75
    d.line([(0, ground), (w, ground)], fill="black")
    for edge in (-params.x_threshold, params.x_threshold):  # where the episode ends
        x = w / 2 + edge * scale
        d.line([(x, ground - 8), (x, ground + 8)], fill="red", width=2)
    x, theta = float(obs[0]), float(obs[2])
    cx = w / 2 + x * scale
    d.rectangle([cx - 25, ground - 15, cx + 25, ground + 15], fill=(60, 60, 60))
    pole = 2 * params.length * scale
    tip = (cx + pole * math.sin(theta), ground - 15 - pole * math.cos(theta))
    d.line([(cx, ground - 15), tip], fill=(205, 140, 80), width=8)
    d.ellipse([cx - 4, ground - 19, cx + 4, ground - 11], fill=(120, 120, 220))
    return img


def _pendulum(obs: np.ndarray, params: Any) -> Any:
    from PIL import Image, ImageDraw

    size = 240
    img = Image.new("RGB", (size, size), "white")
    d = ImageDraw.Draw(img)
    theta = math.atan2(float(obs[1]), float(obs[0]))  # 0 = upright
    c, r = size / 2, size * 0.38
    tip = (c + r * math.sin(theta), c - r * math.cos(theta))
    d.line([(c, c), tip], fill=(200, 70, 70), width=14)
    d.ellipse([c - 6, c - 6, c + 6, c + 6], fill="black")
    d.line([(c, c - r - 10), (c, c - r + 5)], fill=(150, 150, 150), width=2)  # upright mark
    return img


def _grid_image(cells: int, cell_px: int, top: int = 24) -> tuple[Any, Any]:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (cells * cell_px, top + cells * cell_px), "white")
    d = ImageDraw.Draw(img)
    for i in range(cells + 1):  # grid lines
        d.line([(i * cell_px, top), (i * cell_px, top + cells * cell_px)], fill=(225, 225, 225))
        d.line([(0, top + i * cell_px), (cells * cell_px, top + i * cell_px)], fill=(225, 225, 225))
    return img, d


def _snake(obs: np.ndarray, params: Any) -> Any:
    from envs.snake import FEATURES

    f = {name: np.asarray(obs)[..., i] for i, name in enumerate(FEATURES)}
    n, px, top = params.size, max(16, 240 // params.size), 24
    img, d = _grid_image(n, px, top)
    for r, c in zip(*np.nonzero(f["body"]), strict=True):
        shade = int(200 - 150 * f["order"][r, c])  # the head darkest, fading to the tail
        color = (20, 20, 160) if f["head"][r, c] else (shade // 3, shade, shade // 3)
        d.rectangle([c * px + 1, top + r * px + 1, (c + 1) * px - 1, top + (r + 1) * px - 1], fill=color)
    for r, c in zip(*np.nonzero(f["apple"]), strict=True):
        d.ellipse([c * px + 3, top + r * px + 3, (c + 1) * px - 3, top + (r + 1) * px - 3], fill=(210, 30, 30))
    return img


def _dungeon(obs: np.ndarray, params: Any) -> Any:
    from envs.dungeon import ABILITIES

    n = params.size
    flat = np.asarray(obs)
    channels = 4 + len(ABILITIES)
    grid = flat[: n * n * channels].reshape(n, n, channels)  # FlattenObservation: grid, inventory, player
    inventory = flat[n * n * channels: n * n * channels + len(ABILITIES)]
    health, energy, shield, level = flat[-4:]
    px, top = 48, 40
    img, d = _grid_image(n, px, top)
    colors = {0: (90, 90, 90), 3: (240, 200, 40), 2: (200, 40, 40), 1: (40, 90, 220)}  # wall exit enemy player
    pickup_colors = [(255, 140, 0), (160, 60, 200), (0, 170, 170), (120, 200, 80)]
    for r in range(n):
        for c in range(n):
            box = [c * px + 2, top + r * px + 2, (c + 1) * px - 2, top + (r + 1) * px - 2]
            for k in (0, 3):
                if grid[r, c, k]:
                    d.rectangle(box, fill=colors[k])
            for k, name in enumerate(ABILITIES):
                if grid[r, c, 4 + k]:
                    d.ellipse([box[0] + 10, box[1] + 10, box[2] - 10, box[3] - 10], fill=pickup_colors[k])
                    d.text((box[0] + 3, box[1] + 1), name[0].upper(), fill="black")
            for k in (2, 1):
                if grid[r, c, k]:
                    d.ellipse([box[0] + 4, box[1] + 4, box[2] - 4, box[3] - 4], fill=colors[k])
    owned = "".join(name[0].upper() for name, have in zip(ABILITIES, inventory, strict=True) if have) or "-"
    d.text((4, 22), f"hp {round(health * params.max_health)}  energy {round(energy * params.max_energy)}  "
                    f"shield {round(shield * params.shield_turns)}  level {round(level * params.max_levels)}  "
                    f"abilities {owned}", fill="black")
    return img


RENDERERS: dict[str, Callable[[np.ndarray, Any], Any]] = {
    "Snake-v1": _snake,
    "DungeonCrawl-v1": _dungeon,
    "CartPole-v1": _cartpole,
    "ContinuousCartPole-v1": _cartpole,
    "Pendulum-v1": _pendulum,
}


class RenderError(RuntimeError):
    """No renderer could draw the frames (one line for the user)."""


def use_offscreen_gl() -> str | None:
    """Picks MuJoCo's headless OpenGL unless MUJOCO_GL is set: EGL (the GPU's driver, or Mesa's
    software rasteriser on a CPU machine) when libEGL is installed, else OSMesa when libOSMesa is.
    MuJoCo reads MUJOCO_GL once, when first imported. Returns what MUJOCO_GL is now."""
    if "MUJOCO_GL" not in os.environ:
        import ctypes.util

        for gl, lib in (("egl", "EGL"), ("osmesa", "OSMesa")):
            if ctypes.util.find_library(lib):
                os.environ["MUJOCO_GL"] = gl
                break
    return os.environ.get("MUJOCO_GL")


def brax_frames(env: Any, states: list[Any], *, width: int = 320, height: int = 240) -> list[Any]:
    """Pictures of a Brax env's states (``envs.adapters.brax.BraxState``, host arrays): MuJoCo's
    offscreen renderer, a camera tracking the robot's first body. Raises RenderError when MuJoCo
    has no OpenGL to render with."""
    use_offscreen_gl()
    import mujoco
    from PIL import Image

    model = env.inner.sys.mj_model
    try:
        renderer = mujoco.Renderer(model, height, width)
    except Exception as err:  # noqa: BLE001 - MuJoCo raises several kinds when no GL loads
        gl = os.environ.get("MUJOCO_GL", "unset")
        raise RenderError(f"MuJoCo cannot render with MUJOCO_GL={gl} ({str(err).splitlines()[0]}); on a machine "
                          "without a GPU install Mesa's EGL (apt install libegl1 libegl-mesa0), or OSMesa "
                          "(libosmesa6) and set MUJOCO_GL=osmesa") from None
    data = mujoco.MjData(model)
    camera = mujoco.MjvCamera()
    camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING
    camera.trackbodyid = 1
    camera.elevation = -25.0
    frames = []
    try:
        for k, state in enumerate(states):
            pipeline = state.inner.pipeline_state
            q = getattr(pipeline, "q", None)
            data.qpos[:] = np.asarray(pipeline.qpos if q is None else q)
            mujoco.mj_forward(model, data)
            if k == 0:  # framed to the robot's size (the model's extent counts the floor too)
                spread = np.linalg.norm(data.xpos[1:] - data.xpos[1], axis=-1).max()
                camera.distance = max(1.5, 4.0 * float(spread))
            renderer.update_scene(data, camera=camera)
            frames.append(Image.fromarray(renderer.render()))
    finally:
        renderer.close()
    return frames


def drawn_from_states(env_id: str) -> bool:
    """Whether ``env_id`` (``envs.make``'s name) is drawn from its env states by its library: every
    adapter's env (``envs.adapters.LIBRARIES``)."""
    return env_id.split(":", 1)[0] in LIBRARIES


def state_frames(env: Any, env_params: Any, states: list[Any], *, width: int = 320) -> list[Any]:
    """Pictures of an adapter env's states (host arrays, as ``env.reset``/``step`` return them),
    each ``width`` pixels wide, drawn by the env's own library (gymnax's classic-control envs by
    gymnasium's renderer, as gymnax's Visualizer means to). Raises RenderError when that
    library cannot draw this env (one line saying why)."""
    from envs.check import first_line

    library = env.name.split(":", 1)[0]
    if library == "brax":
        return brax_frames(env, states, width=width, height=width * 3 // 4)
    inner = env
    while not hasattr(inner, "inner"):  # under our wrappers (FlattenObservation ...): the adapter
        inner = inner.env
    if library == "gymnax" and inner.inner.name in GYMNASIUM_DRAWN:
        return gymnasium_frames(inner.inner, env_params.inner, [s.inner for s in states], width=width)
    plt = _offscreen_pyplot()  # Jumanji's and gymnax's own pictures: matplotlib, off screen
    if library == "jumanji":
        import jax
        import jax.numpy as jnp

        frames, as_jax = [], False
        try:
            for state in states:  # each drawn on the viewer's own figure, which becomes pyplot's current one
                try:
                    inner.inner.render(jax.tree.map(jnp.asarray, state.inner) if as_jax else state.inner)
                except AttributeError:  # a viewer that updates JAX arrays (``.at``: Maze, PacMan)
                    if as_jax:  # host arrays first: the other viewers draw them faster
                        raise
                    as_jax = True
                    inner.inner.render(jax.tree.map(jnp.asarray, state.inner))
                frames.append(_picture(plt.gcf(), width))
        except Exception as err:  # noqa: BLE001 - a library's drawing code raises anything
            raise RenderError(f"Jumanji cannot draw {env.name} ({first_line(err)})") from None
        finally:
            inner.inner.close()
        return frames
    if library == "gymnax":
        from gymnax.visualize import Visualizer

        vis = Visualizer(inner.inner, env_params.inner, [s.inner for s in states])
        try:
            vis.init()
            if not hasattr(vis, "im"):  # gymnax's Visualizer silently draws nothing for the others
                raise RenderError(f"gymnax's Visualizer has no picture of {env.name}")
            frames = []
            for k in range(len(states)):
                vis.update(k)
                frames.append(_picture(vis.fig, width))
            return frames
        except RenderError:
            raise
        except Exception as err:  # noqa: BLE001
            raise RenderError(f"gymnax's Visualizer cannot draw {env.name} here ({first_line(err)})") from None
        finally:
            plt.close(vis.fig)
    raise RenderError(f"no library draws {env.name}; drawn from their states: "
                      f"{', '.join(f'{lib}:*' for lib in LIBRARIES)}")


# gymnax's classic-control envs: its Visualizer draws them through gym's ``render(mode=...)``, gone in
# gymnasium 1.x, so gymnasium draws them here with gymnax's own mapping (``gymnax.visualize.vis_gym``)
GYMNASIUM_DRAWN = ("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0")


def gymnasium_frames(env: Any, params: Any, states: list[Any], *, width: int = 320) -> list[Any]:
    """Pictures of a gymnax classic-control env's states (gymnax's own, host arrays), drawn by
    gymnasium's renderer of the same env (pygame, off screen: SDL's dummy drivers while drawing),
    ``width`` pixels wide. Raises RenderError when gymnasium cannot draw (pygame missing: one line
    saying what to install)."""
    from types import SimpleNamespace

    import jax

    from envs.check import first_line

    def failed(err: BaseException) -> RenderError:
        if type(err).__name__ == "DependencyNotInstalled" or isinstance(err, ImportError) and "pygame" in str(err):
            return RenderError(f"gymnasium draws gymnax:{env.name} with pygame, which is not installed here: "
                               "pip install pygame (it comes with rl-harness[adapters])")
        return RenderError(f"gymnasium cannot draw gymnax:{env.name} ({first_line(err)})")

    try:
        import gymnasium
        from gymnax.visualize.vis_gym import get_gym_state, set_gym_params
        from PIL import Image

        drawn = gymnasium.make(env.name, render_mode="rgb_array")
    except Exception as err:  # noqa: BLE001 - an import or registry error, in one line
        raise failed(err) from None
    sdl = {name: os.environ.get(name) for name in ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER")}
    os.environ.update(dict.fromkeys(sdl, "dummy"))  # no window, no sound device; as it was after
    try:
        drawn.reset(seed=0)
        plain = drawn.unwrapped
        plain_params = jax.tree.map(lambda x: np.asarray(x).item() if np.size(x) == 1 else np.asarray(x),
                                    params)  # gym's drawing takes Python numbers
        set_gym_params(SimpleNamespace(env=plain), env.name, plain_params)  # it sets them on ``.env``
        frames = []
        for state in states:
            values = get_gym_state(state, env.name)
            if env.name == "Pendulum-v1":
                plain.last_u = float(values[-1])  # the torque arrow
            plain.state = values
            picture = Image.fromarray(drawn.render())
            frames.append(picture.resize((width, round(picture.height * width / picture.width))))
        return frames
    except Exception as err:  # noqa: BLE001 - pygame missing, or a drawing error, in one line
        raise failed(err) from None
    finally:
        drawn.close()  # pygame.quit(): the next drawing reads SDL's variables again
        for name, value in sdl.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _offscreen_pyplot() -> Any:
    """pyplot on the Agg backend (no window opens; the libraries' ``fig.show()`` warnings muted)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")
    return plt


def _picture(fig: Any, width: int) -> Any:
    """``fig`` as an RGB image ``width`` pixels wide (drawn at that size, not scaled after)."""
    from PIL import Image

    fig.set_dpi(width / fig.get_figwidth())
    fig.canvas.draw()
    return Image.fromarray(np.asarray(fig.canvas.buffer_rgba())).convert("RGB")
