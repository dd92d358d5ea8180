"""The registry of model families, keyed by config.json's model_type."""

from __future__ import annotations

from app.errors import UnsupportedModelError
from app.families.spec import FamilySpec


def _specs() -> list[FamilySpec]:
    from app.families import gemma3

    return [gemma3.SPEC]


def family_for_config(hf_config: dict) -> FamilySpec:
    model_type = hf_config.get("model_type")
    for spec in _specs():
        if model_type in spec.model_types:
            return spec
    known = sorted(t for s in _specs() for t in s.model_types)
    raise UnsupportedModelError(f"model_type {model_type!r} (architectures {hf_config.get('architectures')}) "
                                f"is not supported; supported: {known}")
