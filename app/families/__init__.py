"""The registry of model families, keyed by config.json's model_type. A family module is imported on first use."""

from __future__ import annotations

import importlib

from common.errors import UnsupportedModelError
from app.families.spec import FamilySpec

# config.json "model_type" -> the module in app/families holding that family's SPEC
MODEL_TYPES = {
    "gemma3": "gemma3",
    "qwen3_omni_moe": "qwen3_omni",
    "qwen3_omni_moe_thinker": "qwen3_omni",
    "llama4": "llama4",
    "llama4_text": "llama4",
}


def family_for_config(hf_config: dict) -> FamilySpec:
    model_type = hf_config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise UnsupportedModelError(f"model_type {model_type!r} (architectures {hf_config.get('architectures')}) "
                                    f"is not supported; supported: {sorted(MODEL_TYPES)}")
    spec = importlib.import_module(f"app.families.{MODEL_TYPES[model_type]}").SPEC
    assert model_type in spec.model_types, (model_type, spec.name)
    return spec
