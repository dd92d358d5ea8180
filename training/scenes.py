"""Procedural pictures of simple shapes: what the embedded default model was trained on and is evaluated on.

A scene is a plain background (white, black, greys, beige, pastel or dark tones: colours clearly unlike the shape
colours) with 1 to 3 non-overlapping shapes (circle, square, triangle), each red, green, blue, yellow, purple or
orange, each 15-40% of the picture's shorter side, anywhere in the frame. Pictures are 64 to 1024 pixels a side
with aspect ratios from 1:2 to 2:1. Everything is a pure function of a ``numpy.random.Generator``: the same seed
always gives the same scene and the same pixels.
"""

from __future__ import annotations

import dataclasses
import io
import math

import numpy as np
import PIL.Image
import PIL.ImageDraw

KINDS = ("circle", "square", "triangle")

# Shape colours (name -> RGB); every shape's colour is jittered a little around these.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 35, 35),
    "green": (40, 165, 60),
    "blue": (35, 85, 225),
    "yellow": (245, 210, 30),
    "purple": (135, 55, 185),
    "orange": (250, 135, 20),
}

# Background colours (name -> RGB): light and dark neutrals and tones far from every shape colour.
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (250, 250, 250),
    "light grey": (205, 205, 205),
    "grey": (135, 135, 135),
    "dark grey": (65, 65, 65),
    "black": (15, 15, 15),
    "beige": (240, 228, 200),
    "pale pink": (250, 220, 225),
    "pale blue": (212, 228, 248),
    "pale green": (215, 240, 215),
    "navy": (22, 28, 70),
    "dark brown": (62, 42, 30),
}

MIN_SIDE, MAX_SIDE = 64, 1024
MAX_ASPECT = 2.0
MIN_SHAPE, MAX_SHAPE = 0.15, 0.40  # shape size as a fraction of the shorter side
MAX_SHAPES = 3


@dataclasses.dataclass(frozen=True)
class Shape:
    """One shape: ``kind`` in KINDS, ``colour`` in COLOURS, its square bounding box (left, top, size) in pixels,
    and the RGB it is painted with."""

    kind: str
    colour: str
    left: int
    top: int
    size: int
    rgb: tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Scene:
    """A picture's content: size, background name and RGB, and its shapes."""

    width: int
    height: int
    background: str
    background_rgb: tuple[int, int, int]
    shapes: tuple[Shape, ...]


def scene_from_dict(d: dict) -> Scene:
    """The scene ``dataclasses.asdict`` gave ``d`` for (as stored in JSON: lists for tuples)."""
    shapes = tuple(Shape(s["kind"], s["colour"], int(s["left"]), int(s["top"]), int(s["size"]), tuple(s["rgb"]))
                   for s in d["shapes"])
    return Scene(int(d["width"]), int(d["height"]), d["background"], tuple(d["background_rgb"]), shapes)


def _jitter(rgb: tuple[int, int, int], rng: np.random.Generator, amount: int) -> tuple[int, int, int]:
    return tuple(int(np.clip(c + rng.integers(-amount, amount + 1), 0, 255)) for c in rgb)


def sample_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height): the width log-uniform in [64, 1024], the aspect ratio log-uniform in [1:2, 2:1], the height
    then clipped to [64, 1024] (clipping only brings the ratio closer to 1)."""
    width = int(round(math.exp(rng.uniform(math.log(MIN_SIDE), math.log(MAX_SIDE)))))
    ratio = math.exp(rng.uniform(-math.log(MAX_ASPECT), math.log(MAX_ASPECT)))
    height = int(np.clip(round(width * ratio), MIN_SIDE, MAX_SIDE))
    return width, height


def _place(sizes: list[int], width: int, height: int, rng: np.random.Generator,
           tries: int = 200) -> list[tuple[int, int]] | None:
    """Top-left corners for squares of ``sizes`` inside the frame, pairwise apart by a small gap (None if none found
    in ``tries`` attempts per square)."""
    gap = max(2, min(width, height) // 40)
    boxes: list[tuple[int, int, int]] = []
    for size in sizes:
        for _ in range(tries):
            left = int(rng.integers(0, width - size + 1))
            top = int(rng.integers(0, height - size + 1))
            if all(left + size + gap <= x or x + s + gap <= left or top + size + gap <= y or y + s + gap <= top
                   for x, y, s in boxes):
                boxes.append((left, top, size))
                break
        else:
            return None
    return [(x, y) for x, y, _ in boxes]


def sample_scene(rng: np.random.Generator, *, num_shapes: int | None = None, size: tuple[int, int] | None = None,
                 background: str | None = None) -> Scene:
    """A random scene; ``num_shapes`` (1-3), ``size`` (width, height) and ``background`` (a BACKGROUNDS name) may be
    fixed, everything else is drawn from ``rng``."""
    width, height = size if size is not None else sample_size(rng)
    n = int(rng.integers(1, MAX_SHAPES + 1)) if num_shapes is None else int(num_shapes)
    if not 1 <= n <= MAX_SHAPES:
        raise ValueError(f"a scene has 1 to {MAX_SHAPES} shapes, not {n}")
    bg = background if background is not None else list(BACKGROUNDS)[int(rng.integers(len(BACKGROUNDS)))]
    bg_rgb = _jitter(BACKGROUNDS[bg], rng, 8)
    short = min(width, height)
    while True:
        sizes = [max(6, int(round(short * rng.uniform(MIN_SHAPE, MAX_SHAPE)))) for _ in range(n)]
        corners = _place(sizes, width, height, rng)
        if corners is not None:
            break
    shapes = []
    for s, (left, top) in zip(sizes, corners):
        kind = KINDS[int(rng.integers(len(KINDS)))]
        colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
        shapes.append(Shape(kind, colour, left, top, s, _jitter(COLOURS[colour], rng, 18)))
    return Scene(width, height, bg, bg_rgb, tuple(shapes))


def _draw_shapes(draw: PIL.ImageDraw.ImageDraw, scene: Scene, fills: list, scale: float = 1.0) -> None:
    """Paint every shape of ``scene`` with its fill from ``fills``, coordinates multiplied by ``scale``."""
    for s, fill in zip(scene.shapes, fills):
        x0, y0 = s.left * scale, s.top * scale
        x1, y1 = (s.left + s.size - 1) * scale, (s.top + s.size - 1) * scale
        if s.kind == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        elif s.kind == "square":
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        elif s.kind == "triangle":
            draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=fill)
        else:
            raise ValueError(f"unknown shape kind {s.kind!r}")


def render(scene: Scene) -> PIL.Image.Image:
    """The scene as an RGB image: circles fill their box, squares are the box, triangles point up with their base
    on the box's bottom edge."""
    image = PIL.Image.new("RGB", (scene.width, scene.height), scene.background_rgb)
    _draw_shapes(PIL.ImageDraw.Draw(image), scene, [s.rgb for s in scene.shapes])
    return image


def shape_map(scene: Scene, grid: int, min_cover: float = 0.2, resolution: int = 256) -> np.ndarray:
    """Which shape each cell of a ``grid`` x ``grid`` division of the whole picture shows: [grid * grid] int,
    row-major, the index of the shape covering most of the cell (at least ``min_cover`` of it) or -1. Cells are
    measured on a drawing at most ``resolution`` pixels a side."""
    scale = min(1.0, resolution / max(scene.width, scene.height))
    w, h = max(1, round(scene.width * scale)), max(1, round(scene.height * scale))
    labels = PIL.Image.new("L", (w, h), 0)
    _draw_shapes(PIL.ImageDraw.Draw(labels), scene, list(range(1, len(scene.shapes) + 1)), scale)
    pixels = np.asarray(labels)
    out = np.full(grid * grid, -1, np.int64)
    rows = np.linspace(0, h, grid + 1).round().astype(int)
    cols = np.linspace(0, w, grid + 1).round().astype(int)
    for i in range(grid):
        for j in range(grid):
            cell = pixels[rows[i]:rows[i + 1], cols[j]:cols[j + 1]]
            if cell.size == 0:
                continue
            counts = np.bincount(cell.ravel(), minlength=len(scene.shapes) + 1)[1:]
            if counts.size and counts.max() >= min_cover * cell.size:
                out[i * grid + j] = int(counts.argmax())
    return out


def encode(image: PIL.Image.Image, fmt: str = "PNG", quality: int = 90) -> bytes:
    """The image as PNG or JPEG file bytes (``quality`` for JPEG)."""
    buf = io.BytesIO()
    if fmt.upper() in ("JPEG", "JPG"):
        image.save(buf, format="JPEG", quality=int(quality))
    elif fmt.upper() == "PNG":
        image.save(buf, format="PNG")
    else:
        raise ValueError(f"unsupported format {fmt!r}; use PNG or JPEG")
    return buf.getvalue()


def render_file_like(scene: Scene, rng: np.random.Generator, jpeg_fraction: float = 0.3) -> PIL.Image.Image:
    """The scene as a model sees a file of it: rendered, then with probability ``jpeg_fraction`` saved as JPEG
    (quality 60-95) and read back; otherwise the lossless rendering (a PNG reads back the same pixels)."""
    image = render(scene)
    if rng.uniform() < jpeg_fraction:
        data = encode(image, "JPEG", int(rng.integers(60, 96)))
        image = PIL.Image.open(io.BytesIO(data)).convert("RGB")
    return image
