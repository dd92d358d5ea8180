"""A model family described as data: how to read its config, build its encoders, map its weights, prepare prompts.

Adding a family means writing one module in app/families that returns a ``FamilySpec`` (its decoder as per-layer
``LayerSpec`` data, its encoders, weight map and processor, the model types and GGUF architecture it reads) and
adding it to ``FAMILIES`` in app/families/__init__.py; its processor is a ``preprocess.processor.Processor`` (the
shared steps) with the family's hooks in preprocess/<family>/processor.py. A genuinely new decoder block, router or
per-layer input is a type in decoder/ that the ``FamilySpec`` adds under the name its layer specs use (``blocks``,
``routers``, ``layer_inputs``); the model forward, generation loop, loader and front ends stay untouched.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from omnijax.app.gguf.arch import GGUFArch
from omnijax.decoder.parts import BUILTIN_PARTS, DecoderParts
from omnijax.decoder.spec import DecoderSpec
from omnijax.preprocess.processor import Processor


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A checkpoint's model, as omnijax needs it.

    media_token_ids: (modality, placeholder id in input ids) pairs; features of that modality land there.
    encoders: (modality, encoder config) pairs.
    deepstack_modality: the modality whose encoder's extra feature maps are added after the first decoder layers
        (and those of every modality read by the same encoder).
    shared_encoders: (modality, encoder modality) pairs: a modality read by another modality's encoder (video
        frames by the image encoder).
    speech: the family's speech-output config (a model that can answer aloud), or None.
    """

    decoder: DecoderSpec
    encoders: tuple[tuple[str, Any], ...]
    media_token_ids: tuple[tuple[str, int], ...]
    eos_ids: tuple[int, ...]
    pad_id: int
    max_context: int
    deepstack_modality: str | None = None
    speech: Any = None
    shared_encoders: tuple[tuple[str, str], ...] = ()

    @property
    def modalities(self) -> tuple[str, ...]:
        return tuple(m for m, _ in self.encoders) + tuple(m for m, _ in self.shared_encoders)

    def encoder_of(self, modality: str) -> str:
        """The encoder (by the modality it is built for) that reads ``modality``."""
        return dict(self.shared_encoders).get(modality, modality)

    def encoder_config(self, modality: str):
        return dict(self.encoders)[self.encoder_of(modality)]

    def media_token_id(self, modality: str) -> int:
        return dict(self.media_token_ids)[modality]

    def deepstack_ids(self, modalities) -> tuple[int, ...]:
        """The placeholder ids, among ``modalities``, whose encoder's extra feature maps are added after the first
        decoder layers: those read by the deepstack modality's encoder (images, and video frames by the same
        tower)."""
        deep = self.deepstack_modality
        if deep is None:
            return ()
        return tuple(self.media_token_id(m) for m in modalities if self.encoder_of(m) == self.encoder_of(deep))


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """Everything family-specific, as data and small pure functions.

    model_types: values of config.json's "model_type" this family reads.
    parse_config: config.json dict -> ModelConfig.
    build_encoders: (ModelConfig, rngs) -> {modality: encoder module}. An encoder module's ``__call__(inputs) ->
        encoders.output.EncoderOutput`` (features [rows, hidden], valid [rows], extras) takes what the processor's
        ``collate`` of its modality makes (host-side batching into bucketed shapes, true sizes as data, so new sizes
        inside a bucket do not compile again); the j-th valid row lands at the j-th placeholder.
    weight_map: ModelConfig -> {param path: TensorSpec} for the whole model (paths start with "decoder"/"encoders").
    unused_keys: (ModelConfig, config dict) -> regexes of checkpoint keys present on disk that the model ignores.
    key_aliases: (regex, replacement) rewrites from other published key spellings to the canonical one.
    make_processor: (checkpoint folder, ModelConfig, *, max_audio_seconds, video_size, ...) -> Processor: the family's
        processor, given what it needs from the model config as plain values (placeholder ids, tokens per image,
        the encoders' input layouts); it checks the processor's settings against the encoder configs.
    gguf: how the GGUF files this family reads become its checkpoints (their ``general.architecture`` and config),
        or None.
    blocks, routers, layer_inputs: decoder types this family adds to the decoder's own (decoder/parts.py), by the
        names its specs use.
    build_speech: (ModelConfig, rngs) -> the speech-output module of a model whose config has ``speech`` (the
        speech loop, app/speech.py, runs it), or None for a family that only writes text.
    """

    name: str
    model_types: tuple[str, ...]
    parse_config: Callable[[dict], ModelConfig]
    build_encoders: Callable[..., dict]
    weight_map: Callable[[ModelConfig], dict]
    unused_keys: Callable[[ModelConfig, dict], list[str]]
    key_aliases: tuple[tuple[str, str], ...]
    make_processor: Callable[..., Processor]
    gguf: GGUFArch | None = None
    blocks: Mapping[str, type] = dataclasses.field(default_factory=dict)
    routers: Mapping[str, type] = dataclasses.field(default_factory=dict)
    layer_inputs: Mapping[str, type] = dataclasses.field(default_factory=dict)
    build_speech: Callable[..., Any] | None = None

    def decoder_parts(self) -> DecoderParts:
        """The decoder's own blocks, routers and per-layer inputs plus this family's."""
        return BUILTIN_PARTS.extended(blocks=self.blocks, routers=self.routers, layer_inputs=self.layer_inputs)
