"""The registry of model families, keyed by config.json's model_type (and, for GGUF files, by the file's
general.architecture). A family module is imported on first use."""

from __future__ import annotations

import importlib

from omnijax.common.errors import UnsupportedModelError
from omnijax.app.families.spec import FamilySpec

# config.json "model_type" -> the module in app/families holding that family's spec (its SPEC, or the one of its
# SPECS that reads this model type)
MODEL_TYPES = {
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "gemma4": "gemma4",
    "gemma4_text": "gemma4",
    "qwen3_omni_moe": "qwen3_omni",
    "qwen3_omni_moe_thinker": "qwen3_omni",
    "llama4": "llama4",
    "llama4_text": "llama4",
}

# GGUF "general.architecture" -> the module in app/families whose GGUF (an app.gguf.arch.GGUFArch) reads it
GGUF_ARCHITECTURES = {
    "gemma3": "gemma3",
}


def family_for_config(hf_config: dict) -> FamilySpec:
    model_type = hf_config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise UnsupportedModelError(f"model_type {model_type!r} (architectures {hf_config.get('architectures')}) "
                                    f"is not supported; supported: {sorted(MODEL_TYPES)}")
    module = importlib.import_module(f"omnijax.app.families.{MODEL_TYPES[model_type]}.spec")
    specs = getattr(module, "SPECS", (module.SPEC,))
    matching = [spec for spec in specs if model_type in spec.model_types]
    assert len(matching) == 1, (model_type, [spec.name for spec in specs])
    return matching[0]


def gguf_arch_for(architecture: str, path=None):
    """The ``GGUFArch`` for a GGUF file's ``general.architecture``; UnsupportedModelError names it otherwise."""
    if architecture not in GGUF_ARCHITECTURES:
        where = f"GGUF file {str(path)!r}" if path is not None else "the GGUF file"
        raise UnsupportedModelError(f"{where} holds architecture {architecture!r}, which omnijax does not read "
                                    f"from GGUF; supported GGUF architectures: {sorted(GGUF_ARCHITECTURES)}")
    arch = importlib.import_module(f"omnijax.app.families.{GGUF_ARCHITECTURES[architecture]}.spec").GGUF
    assert arch.architecture == architecture, (architecture, arch.architecture)
    return arch
