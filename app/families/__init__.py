"""The registry of model families, built from one list: ``FAMILIES``. Each ``FamilySpec`` states the config.json
model types it reads and the GGUF architecture it reads, if any; lookups go by those."""

from __future__ import annotations

from omnijax.app.families.gemma3.spec import SPEC as GEMMA3, TEXT_SPEC as GEMMA3_TEXT
from omnijax.app.families.gemma4.spec import SPEC as GEMMA4
from omnijax.app.families.llama4.spec import SPEC as LLAMA4
from omnijax.app.families.qwen3_omni.spec import SPEC as QWEN3_OMNI
from omnijax.app.families.spec import FamilySpec
from omnijax.app.gguf.arch import GGUFArch
from omnijax.common.errors import UnsupportedModelError

FAMILIES: tuple[FamilySpec, ...] = (GEMMA3, GEMMA3_TEXT, GEMMA4, LLAMA4, QWEN3_OMNI)


def by_model_type(families: tuple[FamilySpec, ...]) -> dict[str, FamilySpec]:
    """config.json "model_type" -> the family spec that reads it; a type claimed twice is refused."""
    out: dict[str, FamilySpec] = {}
    for family in families:
        for model_type in family.model_types:
            if model_type in out:
                raise ValueError(f"model_type {model_type!r} is claimed by two family specs "
                                 f"({out[model_type].name} and {family.name})")
            out[model_type] = family
    return out


def by_gguf_architecture(families: tuple[FamilySpec, ...]) -> dict[str, GGUFArch]:
    """GGUF "general.architecture" -> how a family reads such files; an architecture claimed twice is refused."""
    out: dict[str, GGUFArch] = {}
    for family in families:
        if family.gguf is None:
            continue
        if family.gguf.architecture in out:
            raise ValueError(f"GGUF architecture {family.gguf.architecture!r} is claimed by two family specs")
        out[family.gguf.architecture] = family.gguf
    return out


MODEL_TYPES = by_model_type(FAMILIES)
GGUF_ARCHITECTURES = by_gguf_architecture(FAMILIES)


def family_for_config(hf_config: dict) -> FamilySpec:
    model_type = hf_config.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise UnsupportedModelError(f"model_type {model_type!r} (architectures {hf_config.get('architectures')}) "
                                    f"is not supported; supported: {sorted(MODEL_TYPES)}")
    return MODEL_TYPES[model_type]


def gguf_arch_for(architecture: str, path=None) -> GGUFArch:
    """The ``GGUFArch`` for a GGUF file's ``general.architecture``; UnsupportedModelError names it otherwise."""
    if architecture not in GGUF_ARCHITECTURES:
        where = f"GGUF file {str(path)!r}" if path is not None else "the GGUF file"
        raise UnsupportedModelError(f"{where} holds architecture {architecture!r}, which omnijax does not read "
                                    f"from GGUF; supported GGUF architectures: {sorted(GGUF_ARCHITECTURES)}")
    return GGUF_ARCHITECTURES[architecture]
