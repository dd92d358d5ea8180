"""The model every family shares: per-modality encoders feeding one decoder model."""

from __future__ import annotations

from flax import nnx

from omnijax.app.families.spec import FamilySpec, ModelConfig
from omnijax.decoder.model import DecoderModel


class MultimodalModel(nnx.Module):
    """``encoders[modality](inputs)`` (see FamilySpec.build_encoders) and ``decoder`` (decoder/model.py)."""

    def __init__(self, cfg: ModelConfig, spec: FamilySpec, *, rngs: nnx.Rngs):
        self.decoder = DecoderModel(cfg.decoder, parts=spec.decoder_parts(), rngs=rngs)
        self.encoders = nnx.Dict(spec.build_encoders(cfg, rngs=rngs))


def abstract_model(cfg: ModelConfig, spec: FamilySpec) -> MultimodalModel:
    """The model with shapes only (no memory for weights): the skeleton the checkpoint fills."""
    return nnx.eval_shape(lambda: MultimodalModel(cfg, spec, rngs=nnx.Rngs(0)))
