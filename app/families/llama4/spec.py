"""Llama 4 (Llama4ForConditionalGeneration, and the text-only Llama4ForCausalLM).

Image side: tiles of the processor's tile size (preprocess/llama4/image.py), one placeholder run per image
(preprocess/llama4/prompt.py; prompts: preprocess/llama4/processor.py), the vision tower + projector
(encoders/llama4/vision.py); the j-th projected feature row lands at the j-th ``<|patch|>`` token.

Text decoder, as data (decoder/spec.py): pre-norm layers with RMSNorm w * x, no embedding scale, RoPE on interleaved
pairs (llama3 scaling), chunked causal attention and a weightless L2 q/k norm after RoPE on RoPE layers, NoPE
layers (``no_rope_layers`` 0, every 4th by default) with full causal attention and query temperature tuning. The
feed-forward is a mixture of experts on ``moe_layers`` (every ``interleave_moe_layer_step``-th layer by default):
top-k of the raw router logits, the sigmoid of each chosen logit scaling that expert's input
(``sigmoid_input`` router), SiLU-GLU experts, plus a shared expert; dense SiLU-GLU MLPs of width
``intermediate_size_mlp`` elsewhere.

Checkpoint layout (as published and as transformers writes it): ``language_model.model.*`` /
``language_model.lm_head.weight`` / ``vision_model.*`` / ``multi_modal_projector.*`` for the multimodal model,
``model.*`` / ``lm_head.weight`` for the text-only one. Experts are stored fused: ``feed_forward.experts.gate_up_proj``
[E, hidden, 2 * I] (gate columns first, then up) and ``feed_forward.experts.down_proj`` [E, I, hidden].
"""

from __future__ import annotations

import pathlib

import numpy as np
from flax import nnx

from omnijax.app.families.weight_maps import LLAMA_NORMS, decoder_weight_map, gated_mlp_map
from omnijax.app.families.spec import FamilySpec, ModelConfig
from omnijax.common.errors import CheckpointError
from omnijax.common.weights import TensorSpec, linear, plain, prefixed
from omnijax.decoder.spec import AttentionSpec, DecoderSpec, FeedForwardSpec, LayerSpec, MaskSpec, RopeSpec
from omnijax.encoders.llama4.vision import Llama4ImageEncoder, Llama4VisionConfig, llama4_image_encoder_weight_map
from omnijax.preprocess.llama4.processor import Llama4Processor

MULTIMODAL_TEXT_PREFIX = "language_model.model."
MULTIMODAL_LM_HEAD = "language_model.lm_head"
TEXT_ONLY_PREFIX = "model."
TEXT_ONLY_LM_HEAD = "lm_head"
VISION_PREFIX = "vision_model."
PROJECTOR_PREFIX = "multi_modal_projector."

LAYER_TYPES = {"chunked_attention": "chunked", "full_attention": "full"}
ROPE_TYPES = ("default", "linear", "llama3")


# ---- config -> decoder spec (small pure functions) ---------------------------------------------------------------

def is_multimodal(hf: dict) -> bool:
    return hf.get("model_type") == "llama4"


def text_config(hf: dict) -> dict:
    """The text model's settings: ``text_config`` of a multimodal config, the config itself for a text-only one."""
    tc = hf.get("text_config") if is_multimodal(hf) else hf
    if not isinstance(tc, dict):
        raise CheckpointError("config.json: a Llama 4 model needs a 'text_config' object")
    return tc


def rope_spec(tc: dict) -> RopeSpec:
    """RoPE on interleaved pairs from ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling``
    (older exports); llama3 scaling falls back to ``max_position_embeddings`` for its original length, as
    transformers does."""
    params = tc.get("rope_parameters") or dict(tc.get("rope_scaling") or {})
    theta = params.get("rope_theta", tc.get("rope_theta", 500_000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"RoPE type {kind!r} is not supported for Llama 4 (supported: {ROPE_TYPES})")
    if kind == "default":
        return RopeSpec(theta=float(theta), interleaved=True)
    if kind == "linear":
        return RopeSpec(theta=float(theta), kind="linear", factor=float(params["factor"]), interleaved=True)
    return RopeSpec(theta=float(theta), kind="llama3", factor=float(params["factor"]),
                    low_freq_factor=float(params["low_freq_factor"]),
                    high_freq_factor=float(params["high_freq_factor"]),
                    original_max_position=int(params.get("original_max_position_embeddings",
                                                         tc.get("max_position_embeddings", 131072))),
                    interleaved=True)


def rope_layers(tc: dict, n: int) -> list[bool]:
    """Whether each layer uses RoPE: ``no_rope_layers`` (1 = RoPE, 0 = NoPE; at least n entries), or a NoPE layer
    every ``no_rope_layer_interval`` layers when it is absent or empty."""
    given = tc.get("no_rope_layers")
    if not given:
        interval = int(tc.get("no_rope_layer_interval", 4))
        if interval < 1:
            raise ValueError(f"no_rope_layer_interval must be >= 1, got {interval}")
        return [(i + 1) % interval != 0 for i in range(n)]
    if len(given) < n or any(v not in (0, 1) for v in given):
        raise ValueError(f"no_rope_layers must hold a 0 or 1 for each of the {n} layers, got {given}")
    return [bool(v) for v in given[:n]]


def attention_kinds(tc: dict, uses_rope: list[bool]) -> list[str]:
    """"chunked" or "full" per layer, from ``layer_types`` (or: chunked on RoPE layers, full on NoPE layers)."""
    types = tc.get("layer_types") or ["chunked_attention" if r else "full_attention" for r in uses_rope]
    if len(types) != len(uses_rope) or any(t not in LAYER_TYPES for t in types):
        raise ValueError(f"layer_types must name one of {sorted(LAYER_TYPES)} for each of the {len(uses_rope)} "
                         f"layers, got {types}")
    return [LAYER_TYPES[t] for t in types]


def moe_layer_set(tc: dict, n: int) -> set[int]:
    """Indices of the mixture-of-experts layers: ``moe_layers``, else every ``interleave_moe_layer_step``-th."""
    given = tc.get("moe_layers")
    if given is None:
        step = int(tc.get("interleave_moe_layer_step", 1))  # (bounded by app/config_limits.py)
        return set(range(step - 1, n, step))
    if any(not isinstance(i, int) or not 0 <= i < n for i in given):
        raise ValueError(f"moe_layers must be layer indices in [0, {n}), got {given}")
    return set(given)


def decoder_config(tc: dict) -> DecoderSpec:
    """Llama 4's text decoder as per-layer data (see the module docstring)."""
    n = int(tc["num_hidden_layers"])
    if n < 1:  # (the sanity bounds of every setting are app/config_limits.py's; this one the spec itself needs)
        raise ValueError(f"num_hidden_layers must be >= 1, got {n}")
    hidden = int(tc["hidden_size"])
    heads = int(tc["num_attention_heads"])
    head_dim = int(tc.get("head_dim") or hidden // heads)
    kv_heads = int(tc.get("num_key_value_heads") or heads)
    act = tc.get("hidden_act", "silu")
    uses_rope = rope_layers(tc, n)
    kinds = attention_kinds(tc, uses_rope)
    chunk = tc.get("attention_chunk_size")
    if "chunked" in kinds and chunk is None:
        raise ValueError("chunked attention layers need 'attention_chunk_size'")
    rope = rope_spec(tc)
    qk_norm = "l2" if tc.get("use_qk_norm", True) else "none"
    tuning = bool(tc.get("attn_temperature_tuning", True))
    temperature = (float(tc.get("floor_scale", 8192)), float(tc.get("attn_scale", 0.1))) if tuning else None
    if temperature is not None and not temperature[0] > 0:
        raise ValueError(f"floor_scale must be > 0, got {temperature[0]}")
    moe_at = moe_layer_set(tc, n)
    experts = int(tc.get("num_local_experts", 16))
    moe = FeedForwardSpec("moe", int(tc["intermediate_size"]), act, num_experts=experts,
                          top_k=int(tc.get("num_experts_per_tok", 1)), router="sigmoid_input",
                          shared_intermediate=int(tc["intermediate_size"])) if moe_at else None
    dense = FeedForwardSpec("dense", int(tc["intermediate_size_mlp"]), act) if len(moe_at) < n else None
    layers = []
    for i in range(n):
        mask = MaskSpec("chunked", int(chunk)) if kinds[i] == "chunked" else MaskSpec("full")
        attention = AttentionSpec(
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, mask=mask,
            rope=rope if uses_rope[i] else None, qk_norm=qk_norm if uses_rope[i] else "none",
            temperature=None if uses_rope[i] else temperature, bias=bool(tc.get("attention_bias", False)))
        layers.append(LayerSpec(attention, moe if i in moe_at else dense, block="pre_norm"))
    return DecoderSpec(vocab_size=int(tc["vocab_size"]), hidden_size=hidden, layers=tuple(layers),
                       rms_norm_eps=float(tc.get("rms_norm_eps", 1e-5)), norm_plus_one=False, embed_scale=1.0,
                       tie_embeddings=bool(tc.get("tie_word_embeddings", False)))


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


def parse_config(hf: dict) -> ModelConfig:
    tc = text_config(hf)
    try:
        decoder = decoder_config(tc)
        encoders: tuple = ()
        media: tuple = ()
        if is_multimodal(hf):
            vision = Llama4VisionConfig.from_model_config(hf)
            image_token = hf.get("image_token_index", hf.get("image_token_id"))
            if image_token is None:
                raise ValueError("no 'image_token_index'")
            if not 0 <= int(image_token) < decoder.vocab_size:
                raise ValueError(f"image_token_index {image_token} is outside the vocabulary of "
                                 f"{decoder.vocab_size}")
            encoders, media = (("image", vision),), (("image", int(image_token)),)
        return ModelConfig(
            decoder=decoder, encoders=encoders, media_token_ids=media,
            eos_ids=_ids(tc.get("eos_token_id", hf.get("eos_token_id"))),
            pad_id=int(tc.get("pad_token_id") if tc.get("pad_token_id") is not None else 0),
            max_context=int(tc.get("max_position_embeddings", 131072)),
        )
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json is not a valid Llama 4 config: {e!r}") from e


def build_encoders(cfg: ModelConfig, *, rngs: nnx.Rngs) -> dict:
    if "image" not in cfg.modalities:
        return {}
    return {"image": Llama4ImageEncoder(cfg.encoder_config("image"), rngs=rngs)}


# ---- weights ------------------------------------------------------------------------------------------------

def expert_gate_half(gate_up_EHJ: np.ndarray) -> np.ndarray:
    """Fused experts [E, hidden, 2 * I] -> the gate projections [E, hidden, I] (the first I columns)."""
    return _half(gate_up_EHJ, 0)


def expert_up_half(gate_up_EHJ: np.ndarray) -> np.ndarray:
    """Fused experts [E, hidden, 2 * I] -> the up projections [E, hidden, I] (the last I columns)."""
    return _half(gate_up_EHJ, 1)


def _half(gate_up_EHJ: np.ndarray, which: int) -> np.ndarray:
    if gate_up_EHJ.ndim != 3 or gate_up_EHJ.shape[-1] % 2:
        raise ValueError(f"fused expert gate/up projections must be [experts, hidden, 2 * width], got "
                         f"{list(gate_up_EHJ.shape)}")
    width = gate_up_EHJ.shape[-1] // 2
    return np.ascontiguousarray(gate_up_EHJ[..., which * width:(which + 1) * width])


def moe_weight_map(prefix: str) -> dict:
    """A MoEMLP (paths relative to it) from Llama 4's ``{prefix}router`` / fused ``experts`` / ``shared_expert``."""
    fused = f"{prefix}experts.gate_up_proj"
    out = {("router", "weight"): linear(f"{prefix}router"),
           ("gate_proj",): TensorSpec(fused, fn=expert_gate_half),
           ("up_proj",): TensorSpec(fused, fn=expert_up_half),
           ("down_proj",): plain(f"{prefix}experts.down_proj")}
    out.update(prefixed(gated_mlp_map(f"{prefix}shared_expert."), ("shared",)))
    return out


def feed_forward_map(layer: LayerSpec, p: str) -> dict:
    """A layer's feed-forward (paths relative to its ``mlp``) <- ``{p}feed_forward.*``."""
    if layer.ffn.kind == "moe":
        return moe_weight_map(f"{p}feed_forward.")
    return gated_mlp_map(f"{p}feed_forward.")


def llama4_decoder_weight_map(spec: DecoderSpec, prefix: str, lm_head: str) -> dict:
    """Decoder parameter paths (relative to the model's ``decoder``) -> tensors ``{prefix}...``."""
    return decoder_weight_map(spec, prefix, norms=LLAMA_NORMS, lm_head=lm_head, feed_forward=feed_forward_map)


def weight_map(cfg: ModelConfig) -> dict:
    if "image" in cfg.modalities:
        wm = prefixed(llama4_decoder_weight_map(cfg.decoder, MULTIMODAL_TEXT_PREFIX, MULTIMODAL_LM_HEAD),
                      ("decoder",))
        wm.update(prefixed(llama4_image_encoder_weight_map(cfg.encoder_config("image"), VISION_PREFIX,
                                                           PROJECTOR_PREFIX), ("encoders", "image")))
        return wm
    return prefixed(llama4_decoder_weight_map(cfg.decoder, TEXT_ONLY_PREFIX, TEXT_ONLY_LM_HEAD), ("decoder",))


def unused_keys(cfg: ModelConfig, hf: dict) -> list[str]:
    if not cfg.decoder.tie_embeddings:
        return []
    head = MULTIMODAL_LM_HEAD if "image" in cfg.modalities else TEXT_ONLY_LM_HEAD
    return [head.replace(".", r"\.") + r"\.weight"]  # a tied copy some exports write


# ---- prompts --------------------------------------------------------------------------------------------------

def make_processor(folder: pathlib.Path, cfg: ModelConfig, *, max_audio_seconds: float | None = None,
                   video_size: str = "processor") -> Llama4Processor:
    """Llama 4 prompts (preprocess/llama4/processor.py), the processor's tiles checked against the vision tower
    (tile size, tokens per tile). Llama 4 takes no audio or video: ``max_audio_seconds`` and ``video_size`` have no
    effect."""
    if "image" not in cfg.modalities:
        return Llama4Processor(folder, image_token_id=None)
    processor = Llama4Processor(folder, image_token_id=cfg.media_token_id("image"))
    vision: Llama4VisionConfig = cfg.encoder_config("image")
    if processor.image_cfg.tile_size != vision.image_size:
        raise CheckpointError(f"the image processor's tile size {processor.image_cfg.tile_size} differs from the "
                              f"vision tower's image_size {vision.image_size}")
    if processor.tokens_per_tile != vision.tokens_per_tile:
        raise CheckpointError(f"the processor writes {processor.tokens_per_tile} tokens per tile (patch_size "
                              f"{processor.prompt_cfg.patch_size}, pixel_shuffle_ratio "
                              f"{processor.prompt_cfg.pixel_shuffle_ratio}) but the vision tower gives "
                              f"{vision.tokens_per_tile}")
    return processor


SPEC = FamilySpec(
    name="llama4", model_types=("llama4", "llama4_text"), parse_config=parse_config, build_encoders=build_encoders,
    weight_map=weight_map, unused_keys=unused_keys, key_aliases=(), make_processor=make_processor,
)
