"""Llama 4 image placeholders: each image's ``<|image|>`` in the rendered prompt becomes its run of patch tokens.

As ``Llama4Processor._prompt_split_image`` writes it, an image laid out as rows x cols tiles with ``n`` tokens per
tile becomes::

    <|image_start|>
      (only when rows * cols > 1) for each tile row:
          <|patch|> x n, joined by <|tile_x_separator|> between the row's tiles, then <|tile_y_separator|>
    <|image|> <|patch|> x n          (the global tile; the only tile of a single-tile image)
    <|image_end|>

The model's image token is ``<|patch|>``: the vision features, tile after tile (row-major, global tile last) and
image after image, fill the ``<|patch|>`` positions in order. The reference writes these token strings literally
(whatever its token settings say); only the placeholder it looks for is configurable (``image_token``).

n = (tile_size // patch_size)**2 // round(1 / pixel_shuffle_ratio**2), with ``patch_size`` and
``pixel_shuffle_ratio`` from the processor settings (``processor_config.json``; defaults 14 and 0.5).
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import pathlib
from typing import Any, Sequence

from omnijax.common.config_values import as_float, as_int
from omnijax.common.errors import CheckpointError, PromptError
from omnijax.preprocess.processor_config import PROCESSOR_CONFIG_NAME, read_json

IMAGE_START = "<|image_start|>"
IMAGE_END = "<|image_end|>"
IMAGE = "<|image|>"
PATCH = "<|patch|>"
TILE_X_SEPARATOR = "<|tile_x_separator|>"
TILE_Y_SEPARATOR = "<|tile_y_separator|>"

# Bounds: a tile's patch tokens and one image's tiles (real checkpoints: 144 tokens, at most 16 + 1 tiles).
MAX_TOKENS_PER_TILE = 1 << 16
MAX_TILES_PER_IMAGE = 1024


@dataclasses.dataclass(frozen=True)
class Llama4PromptConfig:
    """The processor settings that shape an image's placeholder run (``Llama4Processor`` defaults).

    image_token: the placeholder the chat template writes for an image (``<|image|>``).
    patch_size: the vision patch side in pixels.
    pixel_shuffle_ratio: the vision adapter's pixel-shuffle ratio (tokens per tile shrink by its square).
    """

    image_token: str = IMAGE
    patch_size: int = 14
    pixel_shuffle_ratio: float = 0.5

    def __post_init__(self):
        if not isinstance(self.image_token, str) or not self.image_token:
            raise ValueError(f"image_token must be a non-empty string, got {self.image_token!r}")
        if isinstance(self.patch_size, bool) or int(self.patch_size) != self.patch_size or self.patch_size <= 0:
            raise ValueError(f"patch_size must be a positive integer, got {self.patch_size!r}")
        if not 0.0 < float(self.pixel_shuffle_ratio) <= 1.0:
            raise ValueError(f"pixel_shuffle_ratio must be in (0, 1], got {self.pixel_shuffle_ratio!r}")
        object.__setattr__(self, "patch_size", int(self.patch_size))
        object.__setattr__(self, "pixel_shuffle_ratio", float(self.pixel_shuffle_ratio))

    @property
    def downsample_ratio(self) -> int:
        return int(round(1.0 / self.pixel_shuffle_ratio ** 2))

    def tokens_per_tile(self, tile_size: int) -> int:
        """Patch tokens of one tile of ``tile_size`` pixels, as the reference counts them. Raises
        ``CheckpointError`` when that is not in [1, MAX_TOKENS_PER_TILE]."""
        n = (int(tile_size) // self.patch_size) ** 2 // self.downsample_ratio
        if not 1 <= n <= MAX_TOKENS_PER_TILE:
            raise CheckpointError(f"a {tile_size}-pixel tile with patch_size {self.patch_size} and "
                                  f"pixel_shuffle_ratio {self.pixel_shuffle_ratio} gives {n} tokens per tile; "
                                  f"expected 1 .. {MAX_TOKENS_PER_TILE}")
        return n

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "processor config") -> "Llama4PromptConfig":
        """From the processor dict (top level of ``processor_config.json``); missing keys take the defaults."""
        if not isinstance(d, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(d).__name__}")
        defaults = cls()
        try:
            image_token = d.get("image_token") if d.get("image_token") is not None else defaults.image_token
            patch_size = d.get("patch_size") if d.get("patch_size") is not None else defaults.patch_size
            ratio = d.get("pixel_shuffle_ratio")
            ratio = defaults.pixel_shuffle_ratio if ratio is None else ratio
            return cls(image_token=image_token, patch_size=as_int(patch_size, "patch_size"),
                       pixel_shuffle_ratio=as_float(ratio, "pixel_shuffle_ratio"))
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{source}: {exc}") from exc

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> "Llama4PromptConfig":
        """The settings in the folder's ``processor_config.json``; the defaults when the folder has none."""
        folder = pathlib.Path(path)
        if not folder.is_dir():
            raise CheckpointError(f"checkpoint folder not found: {folder}")
        file = folder / PROCESSOR_CONFIG_NAME
        if not file.is_file():
            return cls()
        return cls.from_dict(read_json(file), source=str(file))


def _check_layout(rows: int, cols: int, tokens_per_tile: int) -> None:
    for name, value in (("rows", rows), ("cols", cols), ("tokens_per_tile", tokens_per_tile)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise PromptError(f"image layout {name} must be a positive integer, got {value!r}")
    if rows * cols + 1 > MAX_TILES_PER_IMAGE:
        raise PromptError(f"an image of {rows}x{cols} tiles is over the limit of {MAX_TILES_PER_IMAGE} tiles")
    if tokens_per_tile > MAX_TOKENS_PER_TILE:
        raise PromptError(f"{tokens_per_tile} tokens per tile is over the limit of {MAX_TOKENS_PER_TILE}")


def image_prompt(rows: int, cols: int, tokens_per_tile: int) -> str:
    """The placeholder run of one image laid out as rows x cols tiles (see the module docstring)."""
    _check_layout(rows, cols, tokens_per_tile)
    rows, cols, tokens_per_tile = int(rows), int(cols), int(tokens_per_tile)
    tile = PATCH * tokens_per_tile
    parts = [IMAGE_START]
    if rows * cols > 1:
        row = TILE_X_SEPARATOR.join([tile] * cols) + TILE_Y_SEPARATOR
        parts.append(row * rows)
    parts += [IMAGE, tile, IMAGE_END]
    return "".join(parts)


def num_patch_tokens(rows: int, cols: int, tokens_per_tile: int) -> int:
    """``<|patch|>`` tokens of one image: one run per tile, plus the global tile's when rows * cols > 1."""
    _check_layout(rows, cols, tokens_per_tile)
    rows, cols = int(rows), int(cols)
    return (rows * cols + (1 if rows * cols > 1 else 0)) * tokens_per_tile


def expand_image_placeholders(text: str, layouts: Sequence[tuple[int, int]], tokens_per_tile: int,
                              image_token: str = IMAGE) -> str:
    """``text`` with its i-th ``image_token`` replaced by the :func:`image_prompt` of ``layouts[i]`` (rows, cols).

    The placeholders are found in ``text`` as given, before any replacement, so the ``<|image|>`` inside a
    multi-tile image's run is never taken for the next image's placeholder: each image gets its own run, in order.
    Raises ``PromptError`` when the number of placeholders differs from the number of layouts.
    """
    pieces = text.split(image_token)
    layouts = [tuple(layout) for layout in layouts]
    if any(len(layout) != 2 for layout in layouts):
        raise PromptError(f"image layouts must be (rows, cols) pairs, got {layouts}")
    if len(pieces) - 1 != len(layouts):
        raise PromptError(f"the prompt has {len(pieces) - 1} {image_token} placeholders for {len(layouts)} images")
    out = [pieces[0]]
    for (rows, cols), rest in zip(layouts, pieces[1:]):
        out.append(image_prompt(rows, cols, tokens_per_tile))
        out.append(rest)
    return "".join(out)

