"""Pictures of an environment's observation, for ``harness.play``'s GIFs (PIL; not in the JAX core)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np


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


RENDERERS: dict[str, Callable[[np.ndarray, Any], Any]] = {
    "CartPole-v1": _cartpole,
    "ContinuousCartPole-v1": _cartpole,
    "Pendulum-v1": _pendulum,
}
