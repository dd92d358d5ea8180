"""Reading values out of Hugging Face config dicts: defaults for missing keys, type checks."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from omnijax.common.errors import CheckpointError


def uniform_int(value, name: str) -> int:
    """HF allows some sizes as an int or a list of equal ints (e.g. ``image_size`` as (h, w)); only uniform sizes
    are supported."""
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise ValueError(f"non-uniform {name} {value} is not supported")
        return int(value[0])
    return int(value)


def config_getter(d: dict, defaults: Any) -> Callable[..., Any]:
    """``get(*names)``: the first of ``names`` present in ``d`` with a non-None value, else the attribute
    ``names[0]`` of ``defaults`` (a config built with its defaults)."""

    def get(*names: str) -> Any:
        for name in names:
            if name in d and d[name] is not None:
                return d[name]
        return getattr(defaults, names[0])

    return get


def as_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ValueError(f"'{key}' must be an integer, got {value!r}")
    return int(value)


def as_float(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"'{key}' must be a number, got {value!r}")
    return float(value)


def channel_floats(value: Any, key: str) -> tuple[float, ...]:
    """Per-channel constants (``image_mean``, ``image_std``): one number, repeated for the 3 channels, or a list of
    numbers, as a tuple of floats. How many values a list holds is left to the caller to check."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,) * 3
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"'{key}' must be a list of 3 numbers, got {value!r}")
    return tuple(as_float(v, key) for v in value)


def boolean(value: Any, key: str) -> bool:
    """``value`` when it is a JSON boolean; anything else (0, 1, "true", None) is refused."""
    if not isinstance(value, bool):
        raise ValueError(f"'{key}' must be true or false, got {value!r}")
    return value


def height_width(size: Any, default: tuple[int, int], expected: str) -> tuple[int, int]:
    """(height, width) from an HF ``"size"`` setting: ``{"height": H, "width": W}``, an int for a square, or None
    for ``default``. ``expected`` describes the accepted form in the error for anything else (e.g.
    ``"{'height': H, 'width': W} for Gemma 3"``)."""
    if size is None:
        height, width = default
    elif isinstance(size, int) and not isinstance(size, bool):
        height = width = size
    elif isinstance(size, dict) and "height" in size and "width" in size:
        height, width = size["height"], size["width"]
    else:
        raise ValueError(f"'size' must be {expected}, got {size!r}")
    return as_int(height, "size.height"), as_int(width, "size.width")


@contextlib.contextmanager
def as_checkpoint_error(source: str) -> Iterator[None]:
    """Turns a ``TypeError`` or ``ValueError`` raised in the block (a bad config value) into
    ``CheckpointError(f"{source}: {exc}")``; other errors pass unchanged."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: {exc}") from exc
