"""Gemma 3's image encoder for the generation engine: SigLIP tower + multimodal projector on a bucketed batch.

Every image (or pan-and-scan crop) is a fixed-size [3, image_size, image_size] pixel array giving
``mm_tokens_per_image`` soft tokens; the host batches them (the image count rounded up to a power of two) in
preprocess/gemma3/image_batch.py. Parameter tree: ("tower", ...) as ``SiglipVisionTower``, ("projector", ...) as
``Gemma3Projector``.

Inputs (preprocess/gemma3/image_batch.py ``collate``)::

    "pixels"       [images, 3, image_size, image_size] float32   (zeros for padding images)
    "image_valid"  [images] bool

Output: ``EncoderOutput(features [images * mm_tokens, text_hidden], valid [images * mm_tokens], extras=())``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.encoders.gemma3.projector import Gemma3Projector
from omnijax.encoders.output import EncoderOutput
from omnijax.encoders.gemma3.siglip import SiglipVisionConfig, SiglipVisionTower


class Gemma3ImageEncoder(nnx.Module):
    """Pixels -> soft tokens in the text model's width, ``mm_tokens`` per image."""

    def __init__(self, vision: SiglipVisionConfig, mm_tokens: int, text_hidden: int, *, rngs: nnx.Rngs):
        if math.isqrt(mm_tokens) ** 2 != mm_tokens:
            raise ValueError(f"mm_tokens_per_image {mm_tokens} is not a square number")
        self.mm_tokens = mm_tokens
        self.tower = SiglipVisionTower(vision, rngs=rngs)
        self.projector = Gemma3Projector(vision.hidden_size, text_hidden, vision.patches_per_side,
                                         math.isqrt(mm_tokens), vision.layer_norm_eps, rngs=rngs)

    def __call__(self, inputs: dict[str, jax.Array]) -> EncoderOutput:
        feats = self.projector(self.tower(inputs["pixels"]))  # [images, mm_tokens, text_hidden]
        valid = jnp.repeat(jnp.asarray(inputs["image_valid"], bool), feats.shape[1])
        return EncoderOutput(feats.reshape(-1, feats.shape[-1]), valid, ())
