"""Gemma 3: Gemma3ForConditionalGeneration (SigLIP image tower + projector, Gemma 3 text decoder), the text-only
Gemma3ForCausalLM (model_type gemma3_text: the 270M and 1B checkpoints), and llama.cpp's gemma3 GGUF files."""

from __future__ import annotations

import pathlib

import numpy as np
from flax import nnx

from omnijax.common.errors import CheckpointError
from omnijax.app.families.spec import FamilySpec, ModelConfig
from omnijax.app.families.sliding_pattern import GEMMA_SLIDING_PATTERN, sliding_layers
from omnijax.app.families.weight_maps import GEMMA_NORMS, decoder_weight_map
from omnijax.app.families.text_only import make_text_processor, no_encoders
from omnijax.app.gguf.arch import GGUFArch, GGUFMetadata, common_hf_config, subtract_one
from omnijax.common.weights import prefixed
from omnijax.decoder.spec import AttentionSpec, DecoderSpec, FeedForwardSpec, LayerSpec, MaskSpec, RopeSpec
from omnijax.encoders.gemma3.image_encoder import Gemma3ImageEncoder
from omnijax.encoders.gemma3.projector import gemma3_projector_weight_map
from omnijax.encoders.gemma3.siglip import SiglipVisionConfig, siglip_unused_keys, siglip_weight_map
from omnijax.preprocess.gemma3.processor import Gemma3Processor

TEXT_PREFIX = "language_model.model."
VISION_PREFIX = "vision_tower."
PROJECTOR_PREFIX = "multi_modal_projector."

# Other published spellings of the same tensors -> the canonical one written by transformers 5 save_pretrained.
KEY_ALIASES = (
    (r"^model\.language_model\.", TEXT_PREFIX),
    (r"^model\.vision_tower\.", VISION_PREFIX),
    (r"^model\.multi_modal_projector\.", PROJECTOR_PREFIX),
    (r"^vision_tower\.vision_model\.", VISION_PREFIX),
    (r"^lm_head\.", "language_model.lm_head."),
)

_LAYER_TYPE = {"sliding_attention": "sliding", "full_attention": "full"}


def _layer_types(tc: dict) -> tuple[str, ...]:
    n = tc["num_hidden_layers"]
    if tc.get("layer_types"):
        return tuple(_LAYER_TYPE[t] for t in tc["layer_types"])
    pattern = tc.get("sliding_window_pattern", tc.get("_sliding_window_pattern", GEMMA_SLIDING_PATTERN))
    return tuple("sliding" if s else "full" for s in sliding_layers(n, pattern))


def _rope_spec(params: dict | None, default_theta: float) -> RopeSpec:
    params = params or {}
    kind = params.get("rope_type", params.get("type", "default"))
    return RopeSpec(theta=float(params.get("rope_theta", default_theta)), kind=kind,
                    factor=float(params.get("factor", 1.0)))


def _ropes(tc: dict) -> dict[str, RopeSpec]:
    params = tc.get("rope_parameters")
    if params and "full_attention" in params:  # transformers 5 layout: one entry per layer type
        return {"full": _rope_spec(params["full_attention"], 1e6),
                "sliding": _rope_spec(params.get("sliding_attention"), 1e4)}
    # transformers 4 layout: rope_theta + rope_scaling for full layers, rope_local_base_freq for sliding ones
    full = dict(tc.get("rope_scaling") or {}, rope_theta=tc.get("rope_theta", 1e6))
    return {"full": _rope_spec(full, 1e6), "sliding": RopeSpec(theta=float(tc.get("rope_local_base_freq", 1e4)))}


def decoder_config(tc: dict) -> DecoderSpec:
    """Gemma 3's text decoder: sandwich-normed layers, 5 sliding : 1 full, image blocks bidirectional on both."""
    hidden = tc["hidden_size"]
    heads = tc["num_attention_heads"]
    head_dim = tc.get("head_dim") or hidden // heads
    ropes = _ropes(tc)
    window = tc.get("sliding_window")
    masks = {"sliding": MaskSpec("sliding", window, media_bidirectional=True),
             "full": MaskSpec("full", None, media_bidirectional=True)}
    act = "gelu_tanh" if "tanh" in tc.get("hidden_activation", "gelu_pytorch_tanh") else "gelu"
    ffn = FeedForwardSpec("dense", tc["intermediate_size"], act)
    layers = tuple(LayerSpec(AttentionSpec(
        num_heads=heads, num_kv_heads=tc.get("num_key_value_heads", heads), head_dim=head_dim, mask=masks[t],
        rope=ropes[t], qk_norm="rms", scale=tc.get("query_pre_attn_scalar", head_dim) ** -0.5,
        softcap=tc.get("attn_logit_softcapping")), ffn, block="sandwich") for t in _layer_types(tc))
    return DecoderSpec(
        vocab_size=tc["vocab_size"], hidden_size=hidden, layers=layers, rms_norm_eps=tc.get("rms_norm_eps", 1e-6),
        norm_plus_one=True, embed_scale=float(np.float32(hidden) ** np.float32(0.5)),
        final_logit_softcap=tc.get("final_logit_softcapping"), tie_embeddings=tc.get("tie_word_embeddings", True))


def parse_config(hf: dict) -> ModelConfig:
    try:
        tc = hf["text_config"]
        vision = SiglipVisionConfig.from_hf(hf.get("vision_config") or {})
        image_token = hf.get("image_token_index", hf.get("image_token_id"))
        eos = tc.get("eos_token_id", hf.get("eos_token_id", 1))
        return ModelConfig(
            decoder=decoder_config(tc),
            encoders=(("image", (vision, hf.get("mm_tokens_per_image", 256))),),
            media_token_ids=(("image", int(image_token)),),
            eos_ids=tuple(eos) if isinstance(eos, list) else (int(eos),),
            pad_id=int(tc.get("pad_token_id", 0) or 0),
            max_context=int(tc.get("max_position_embeddings", 131072)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json is not a valid Gemma 3 config: {e!r}") from e


def build_encoders(cfg: ModelConfig, *, rngs: nnx.Rngs) -> dict:
    vision, mm_tokens = cfg.encoder_config("image")
    return {"image": Gemma3ImageEncoder(vision, mm_tokens, cfg.decoder.hidden_size, rngs=rngs)}


def weight_map(cfg: ModelConfig) -> dict:
    vision, _ = cfg.encoder_config("image")
    wm = prefixed(decoder_weight_map(cfg.decoder, TEXT_PREFIX, norms=GEMMA_NORMS, lm_head="language_model.lm_head"),
                  ("decoder",))
    wm.update(prefixed(siglip_weight_map(vision, key_prefix=VISION_PREFIX), ("encoders", "image", "tower")))
    wm.update(prefixed(gemma3_projector_weight_map(key_prefix=PROJECTOR_PREFIX), ("encoders", "image", "projector")))
    return wm


def unused_keys(cfg: ModelConfig, hf: dict) -> list[str]:
    vision, _ = cfg.encoder_config("image")
    patterns = list(siglip_unused_keys(vision, hf.get("vision_config") or {}, VISION_PREFIX))
    if cfg.decoder.tie_embeddings:
        patterns.append(r"language_model\.lm_head\.weight")  # a tied copy some exports write
    return patterns


def make_processor(folder: pathlib.Path, cfg: ModelConfig, *, max_audio_seconds: float | None = None,
                   video_size: str = "processor") -> Gemma3Processor:
    """Gemma 3 prompts (preprocess/gemma3/processor.py); Gemma 3 takes no audio or video: ``max_audio_seconds``
    and ``video_size`` have no effect."""
    vision, mm_tokens = cfg.encoder_config("image")
    return Gemma3Processor(folder, image_token_id=cfg.media_token_id("image"), tokens_per_image=mm_tokens,
                           pixel_shape=(vision.num_channels, vision.image_size, vision.image_size))


SPEC = FamilySpec(
    name="gemma3", model_types=("gemma3",), parse_config=parse_config, build_encoders=build_encoders,
    weight_map=weight_map, unused_keys=unused_keys, key_aliases=KEY_ALIASES, make_processor=make_processor,
)


# ---- text-only checkpoints: Gemma3ForCausalLM (config.json is the text config itself; keys model.*, lm_head) ----

TEXT_PREFIX_CAUSAL = "model."

# A text model cut out of a multimodal checkpoint keeps that checkpoint's spellings.
TEXT_KEY_ALIASES = (
    (r"^model\.language_model\.", TEXT_PREFIX_CAUSAL),
    (r"^language_model\.model\.", TEXT_PREFIX_CAUSAL),
    (r"^language_model\.lm_head\.", "lm_head."),
)


def parse_text_config(hf: dict) -> ModelConfig:
    if hf.get("use_bidirectional_attention"):
        raise CheckpointError("config.json sets use_bidirectional_attention (an embedding model such as "
                              "EmbeddingGemma): it does not generate text")
    try:
        eos = hf.get("eos_token_id", 1)
        return ModelConfig(
            decoder=decoder_config(hf), encoders=(), media_token_ids=(),
            eos_ids=tuple(eos) if isinstance(eos, list) else (int(eos),),
            pad_id=int(hf.get("pad_token_id", 0) or 0),
            max_context=int(hf.get("max_position_embeddings", 131072)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json is not a valid Gemma 3 text config: {e!r}") from e


def text_weight_map(cfg: ModelConfig) -> dict:
    return prefixed(decoder_weight_map(cfg.decoder, TEXT_PREFIX_CAUSAL, norms=GEMMA_NORMS, lm_head="lm_head"),
                    ("decoder",))


def text_unused_keys(cfg: ModelConfig, hf: dict) -> list[str]:
    return [r"lm_head\.weight"] if cfg.decoder.tie_embeddings else []  # a tied copy some exports write



# ---- llama.cpp GGUF files (general.architecture "gemma3": the text decoder only) ---------------------------------

# llama.cpp recognises Gemma 3 27B by its depth (LLM_TYPE_27B) and scales its queries by 1/sqrt(hidden / heads).
LLAMA_CPP_27B_LAYERS = 62


def gguf_query_scalar(meta: GGUFMetadata, layers: int, hidden: int, heads: int, head_dim: int) -> float:
    """``query_pre_attn_scalar`` (queries are scaled by its inverse square root) of a gemma3 file.

    The file's own ``attention.scale`` when it states one. llama.cpp's converter writes none for gemma3, and the
    shapes do not tell: Google's models scale by head_dim except the 27B (hidden / heads = 168, head_dim 128), yet
    the 1B (288 vs 256) and 4B (320 vs 256) have head_dim below hidden / heads too. So otherwise llama.cpp's own rule
    decides, giving what llama.cpp computes on every file: hidden / heads for the 62-layer 27B, head_dim else."""
    scale = meta.arch("attention.scale", None)
    if scale is not None:
        if not float(scale) > 0:
            raise CheckpointError(f"{meta.path}: attention.scale {scale} is not positive")
        return 1.0 / float(scale) ** 2
    return hidden // heads if layers == LLAMA_CPP_27B_LAYERS else head_dim


def gguf_config(meta: GGUFMetadata) -> dict:
    """The Gemma3TextConfig of a gemma3 GGUF file, read as llama.cpp reads it: sliding layers but every 6th (or
    the file's sliding_window_pattern), RoPE base rope.freq_base on full layers (with rope.scaling linear when
    stated) and rope.freq_base_swa (default 10000) on sliding layers, the query scale of ``gguf_query_scalar``."""
    config = common_hf_config(meta)
    layers, hidden, heads = config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]
    head_dim = config.setdefault("head_dim", hidden // heads)
    config.setdefault("num_key_value_heads", heads)
    config.setdefault("sliding_window", 4096)
    config.setdefault("max_position_embeddings", 131072)
    pattern = meta.arch("attention.sliding_window_pattern", GEMMA_SLIDING_PATTERN)
    if isinstance(pattern, (list, np.ndarray)):
        sliding = [bool(x) for x in pattern]
        if len(sliding) != layers:
            raise CheckpointError(f"{meta.path}: sliding_window_pattern has {len(sliding)} entries for {layers} layers")
    else:
        sliding = sliding_layers(layers, int(pattern))
    full_rope = {"rope_type": "default", "rope_theta": float(meta.arch("rope.freq_base", 1e6))}
    scaling = meta.arch("rope.scaling.type", None)
    if scaling == "linear":
        full_rope.update(rope_type="linear", factor=float(meta.arch("rope.scaling.factor")))
    elif scaling not in (None, "none"):
        raise CheckpointError(f"{meta.path}: RoPE scaling {scaling!r} is not supported for Gemma 3")
    config.update(
        model_type="gemma3_text", architectures=["Gemma3ForCausalLM"],
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        rope_parameters={"full_attention": full_rope,
                         "sliding_attention": {"rope_type": "default",
                                               "rope_theta": float(meta.arch("rope.freq_base_swa", 1e4))}},
        query_pre_attn_scalar=gguf_query_scalar(meta, layers, hidden, heads, head_dim),
        hidden_activation="gelu_pytorch_tanh",
        attn_logit_softcapping=meta.arch("attn_logit_softcapping", None),
        final_logit_softcapping=meta.arch("final_logit_softcapping", None),
    )
    return config


GGUF = GGUFArch(architecture="gemma3", hf_config=gguf_config, transforms=((r"norm\.weight$", subtract_one),))


TEXT_SPEC = FamilySpec(
    name="gemma3", model_types=("gemma3_text",), parse_config=parse_text_config, build_encoders=no_encoders,
    weight_map=text_weight_map, unused_keys=text_unused_keys, key_aliases=TEXT_KEY_ALIASES,
    make_processor=make_text_processor, gguf=GGUF,
)
