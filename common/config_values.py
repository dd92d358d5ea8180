"""Reading values out of Hugging Face config dicts: defaults for missing keys, type checks."""

from __future__ import annotations

from typing import Any, Callable


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
