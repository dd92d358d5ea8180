"""The model every family shares: per-modality encoders feeding one decoder model."""

from __future__ import annotations

from flax import nnx

from omnijax.app.families.spec import FamilySpec, ModelConfig
from omnijax.decoder.model import DecoderModel


class MultimodalModel(nnx.Module):
    """``encoders[modality](inputs)`` (see FamilySpec.build_encoders), ``decoder`` (decoder/model.py) and, for a model
    that answers aloud, ``speech`` (FamilySpec.build_speech; None otherwise)."""

    def __init__(self, cfg: ModelConfig, spec: FamilySpec, *, rngs: nnx.Rngs):
        self.decoder = DecoderModel(cfg.decoder, parts=spec.decoder_parts(), rngs=rngs)
        self.encoders = nnx.Dict(spec.build_encoders(cfg, rngs=rngs))
        speaks = cfg.speech is not None and spec.build_speech is not None
        self.speech = spec.build_speech(cfg, rngs=rngs) if speaks else None


def abstract_model(cfg: ModelConfig, spec: FamilySpec) -> MultimodalModel:
    """The model with shapes only (no memory for weights): the skeleton the checkpoint fills."""
    return nnx.eval_shape(lambda: MultimodalModel(cfg, spec, rngs=nnx.Rngs(0)))
