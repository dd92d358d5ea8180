"""Gemma 4: ``Gemma4ForConditionalGeneration`` (model_type "gemma4": text decoder, vision tower, audio tower when
the config has one) and the text-only ``Gemma4ForCausalLM`` (model_type "gemma4_text").

The decoder as data (``decoder_config``), per layer:

- attention: sliding (window ``sliding_window``, RoPE "default") or full (``layer_types``; full layers take their
  own head_dim / kv heads: ``global_head_dim`` and, with ``attention_k_eq_v``, ``num_global_key_value_heads``, or a
  saved ``per_layer_config``; "proportional" partial RoPE; keys double as values with ``attention_k_eq_v``);
  weighted q/k RMSNorm and a weightless v norm, scale 1.0. The last ``num_kv_shared_layers`` layers use the keys /
  values of the last earlier layer of their own type (no projection, no cache). Image blocks attend both ways only
  on sliding layers and only with ``use_bidirectional_attention`` "vision".
- block "gemma4" (decoder/gemma4/block.py; ``SPEC`` adds it to the decoder's parts, as the router and the per-layer
  inputs below): sandwich norms, the dense gated MLP (twice as wide on KV-sharing layers
  with ``use_double_wide_mlp``), with ``enable_moe_block`` experts beside it (router "gemma4",
  decoder/gemma4/moe.py), the per-layer-input residual, ``layer_scalar``.
- per-layer inputs "gemma4" (decoder/gemma4/layer_inputs.py) when ``hidden_size_per_layer_input`` > 0.

RMSNorm scales by w; embeddings are scaled by sqrt(hidden); logits are soft-capped by ``final_logit_softcapping``.
Checkpoint keys: ``model.language_model.*`` (multimodal) and ``model.*`` (text-only) are one canonical ``model.*``
(``KEY_ALIASES``); the towers' keys ``model.vision_tower.*`` / ``model.embed_vision.*`` / ``model.audio_tower.*`` /
``model.embed_audio.*``. Prompts: preprocess/gemma4/processor.py.
"""

from __future__ import annotations

import pathlib
import types

import numpy as np
from flax import nnx

from omnijax.app.families.sliding_pattern import sliding_layers
from omnijax.app.families.weight_maps import GEMMA_NORMS, decoder_weight_map
from omnijax.app.families.spec import FamilySpec, ModelConfig
from omnijax.common.config_values import config_getter
from omnijax.common.errors import CheckpointError
from omnijax.common.weights import TensorSpec, linear, plain, prefixed
from omnijax.decoder.gemma4.block import Gemma4Block, Gemma4BlockOptions
from omnijax.decoder.gemma4.layer_inputs import Gemma4LayerInputs, Gemma4LayerInputsOptions
from omnijax.decoder.gemma4.moe import Gemma4Router
from omnijax.decoder.spec import (AttentionSpec, DecoderSpec, FeedForwardSpec, LayerInputsSpec, LayerSpec, MaskSpec,
                                  RopeSpec)
from omnijax.encoders.gemma4.audio import Gemma4AudioEncoder, gemma4_audio_weight_map
from omnijax.encoders.gemma4.audio_config import Gemma4AudioEncoderConfig
from omnijax.encoders.gemma4.vision import Gemma4VisionConfig, Gemma4VisionEncoder, gemma4_vision_weight_map
from omnijax.preprocess.gemma4.image import Gemma4ImageConfig
from omnijax.preprocess.gemma4.processor import Gemma4Processor

TEXT_PREFIX = "model."
# The multimodal model's text decoder keys -> the text-only model's spelling (one canonical text prefix).
KEY_ALIASES = ((r"^model\.language_model\.", TEXT_PREFIX),)

# Gemma4TextConfig's defaults (used for keys a config.json leaves out).
TEXT_DEFAULTS = types.SimpleNamespace(
    vocab_size=262_144, hidden_size=2304, intermediate_size=9216, num_hidden_layers=30, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131_072,
    rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, tie_word_embeddings=True, attention_bias=False,
    sliding_window=512, final_logit_softcapping=None, vocab_size_per_layer_input=262_144,
    hidden_size_per_layer_input=256, attention_k_eq_v=False, num_kv_shared_layers=0, enable_moe_block=False,
    use_double_wide_mlp=False, num_experts=None, top_k_experts=None, moe_intermediate_size=None,
    global_head_dim=512, num_global_key_value_heads=None)
# Gemma4Config's token id defaults.
TOKEN_DEFAULTS = {"image_token_id": 258_880, "audio_token_id": 258_881, "video_token_id": 258_884}
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0}}
_LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}
_OVERRIDABLE = ("head_dim", "num_key_value_heads")


# ---------------------------------------------------------------------------------------------------------------
# Config


def layer_types(tc: dict, n: int) -> tuple[str, ...]:
    """"sliding" / "full" per layer: ``layer_types`` or the default 5 sliding : 1 full; the last layer is always
    full (transformers forces it)."""
    raw = tc.get("layer_types")
    if raw is None:
        kinds = ["sliding" if s else "full" for s in sliding_layers(n)]
    else:
        if not isinstance(raw, list) or len(raw) != n or any(t not in _LAYER_TYPES for t in raw):
            raise ValueError(f"layer_types must list {n} of {sorted(_LAYER_TYPES)}, got {raw!r}")
        kinds = [_LAYER_TYPES[t] for t in raw]
    kinds[-1] = "full"
    return tuple(kinds)


def rope_of(params: dict | None, kind: str) -> RopeSpec:
    """The RopeSpec of one layer type from its ``rope_parameters`` entry."""
    params = dict(DEFAULT_ROPE[f"{kind}_attention"] if params is None else params)
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", "proportional", "linear"):
        raise ValueError(f"unsupported rope_type {rope_type!r} for {kind} layers")
    return RopeSpec(theta=float(params.get("rope_theta", 10_000.0 if kind == "sliding" else 1_000_000.0)),
                    kind=rope_type, factor=float(params.get("factor", 1.0)),
                    fraction=float(params.get("partial_rotary_factor", 1.0)) if rope_type == "proportional" else 1.0)


def layer_overrides(tc: dict, kinds: tuple[str, ...], get) -> dict[int, dict]:
    """{layer: {"head_dim": ..., "num_key_value_heads": ...}}: a saved ``per_layer_config`` (transformers 5), or
    what the published configs imply: full layers take ``global_head_dim`` and, when ``attention_k_eq_v``,
    ``num_global_key_value_heads``."""
    saved = tc.get("per_layer_config")
    if saved is not None:
        if not isinstance(saved, dict):
            raise ValueError(f"per_layer_config must be an object, got {saved!r}")
        out = {}
        for key, value in saved.items():
            if not isinstance(value, dict) or set(value) - set(_OVERRIDABLE):
                raise ValueError(f"per_layer_config[{key!r}] may only set {_OVERRIDABLE}, got {value!r}")
            out[int(key)] = dict(value)
        return out
    override = {"head_dim": int(get("global_head_dim"))}
    if get("attention_k_eq_v") and tc.get("num_global_key_value_heads") is not None:
        override["num_key_value_heads"] = int(tc["num_global_key_value_heads"])
    return {i: override for i, kind in enumerate(kinds) if kind == "full"}


def kv_sources(kinds: tuple[str, ...], shared: int) -> tuple[int | None, ...]:
    """The layer whose keys/values each layer uses (None: its own): the last ``shared`` layers use the last earlier
    layer of their own type (``Gemma4TextConfig.kv_sharing_modes``)."""
    n = len(kinds)
    if not 0 <= shared < n:
        raise ValueError(f"num_kv_shared_layers {shared} must be below num_hidden_layers {n}")
    first = n - shared
    if not shared:
        return (None,) * n
    donors = {}
    for i in range(first):
        donors[kinds[i]] = i
    missing = set(kinds[first:]) - set(donors)
    if missing:
        raise ValueError(f"KV-sharing layers of type {sorted(missing)} have no earlier layer of that type")
    return tuple(None if i < first else donors[kinds[i]] for i in range(n))


def decoder_config(tc: dict, placeholder_ids: tuple[int, ...] = ()) -> DecoderSpec:
    """Gemma 4's text decoder from a text config dict (see the module docstring). ``placeholder_ids``: media
    placeholder ids the token embeddings and the per-layer embeddings read as the pad id (the multimodal reference
    replaces them so before embedding; prompt positions then take the media features)."""
    get = config_getter(tc, TEXT_DEFAULTS)
    bidirectional = tc.get("use_bidirectional_attention")
    if bidirectional == "all":
        raise ValueError("use_bidirectional_attention 'all' makes an encoder (no causal attention), which cannot "
                         "generate text")
    if bidirectional not in (None, "vision"):
        raise ValueError(f"unknown use_bidirectional_attention {bidirectional!r}")
    n = int(get("num_hidden_layers"))
    kinds = layer_types(tc, n)
    overrides = layer_overrides(tc, kinds, get)
    sources = kv_sources(kinds, int(get("num_kv_shared_layers")))
    ropes = tc.get("rope_parameters") or DEFAULT_ROPE
    rope = {kind: rope_of(ropes.get(f"{kind}_attention"), kind) for kind in set(kinds)}
    masks = {"sliding": MaskSpec("sliding", int(get("sliding_window")), media_bidirectional=bidirectional == "vision"),
             "full": MaskSpec("full")}
    act = str(get("hidden_activation"))
    hidden = int(get("hidden_size"))
    moe = None
    if get("enable_moe_block"):
        moe = FeedForwardSpec("moe", int(get("moe_intermediate_size")), act, num_experts=int(get("num_experts")),
                              top_k=int(get("top_k_experts")), router="gemma4")
    width = int(get("hidden_size_per_layer_input") or 0)
    options = Gemma4BlockOptions(moe=moe, layer_input_width=width)
    layers = []
    for i, kind in enumerate(kinds):
        own = overrides.get(i, {})
        attention = AttentionSpec(
            num_heads=int(get("num_attention_heads")),
            num_kv_heads=int(own.get("num_key_value_heads", get("num_key_value_heads"))),
            head_dim=int(own.get("head_dim", get("head_dim"))), mask=masks[kind], rope=rope[kind], qk_norm="rms",
            v_norm=True, k_eq_v=bool(get("attention_k_eq_v")) and kind == "full", scale=1.0, kv_source=sources[i],
            bias=bool(get("attention_bias")))
        wide = 2 if get("use_double_wide_mlp") and sources[i] is not None else 1
        ffn = FeedForwardSpec("dense", int(get("intermediate_size")) * wide, act)
        layers.append(LayerSpec(attention, ffn, block="gemma4", options=options))
    pad = int(get("pad_token_id") or 0)
    layer_inputs = None
    if width:
        layer_inputs = LayerInputsSpec("gemma4", Gemma4LayerInputsOptions(
            width=width, vocab_size=int(get("vocab_size_per_layer_input")), pad_id=pad,
            placeholder_ids=tuple(int(t) for t in placeholder_ids)))
    cap = get("final_logit_softcapping")
    return DecoderSpec(
        vocab_size=int(get("vocab_size")), hidden_size=hidden, layers=tuple(layers),
        rms_norm_eps=float(get("rms_norm_eps")), norm_plus_one=False,
        embed_scale=float(np.float32(hidden ** 0.5)), final_logit_softcap=None if cap is None else float(cap),
        tie_embeddings=bool(get("tie_word_embeddings")), layer_inputs=layer_inputs,
        embed_substitutes=tuple((int(t), pad) for t in placeholder_ids))


def parse_config(hf: dict) -> ModelConfig:
    try:
        text_only = hf.get("model_type") == "gemma4_text"
        tc = hf if text_only else hf["text_config"]
        if not isinstance(tc, dict):
            raise ValueError(f"text_config must be an object, got {tc!r}")
        hidden = tc.get("hidden_size", TEXT_DEFAULTS.hidden_size)
        encoders, media = [], []
        if not text_only and hf.get("vision_config") is not None:
            encoders.append(("image", Gemma4VisionConfig.from_hf(hf["vision_config"], hidden)))
            media.append(("image", int(hf.get("image_token_id", TOKEN_DEFAULTS["image_token_id"]))))
            media.append(("video", int(hf.get("video_token_id", TOKEN_DEFAULTS["video_token_id"]))))
        if not text_only and hf.get("audio_config") is not None:
            encoders.append(("audio", Gemma4AudioEncoderConfig.from_hf(hf["audio_config"], hidden)))
            media.append(("audio", int(hf.get("audio_token_id", TOKEN_DEFAULTS["audio_token_id"]))))
        # the reference embeds every multimodal placeholder (image, audio, video) as the pad token
        placeholders = () if text_only else tuple(int(hf.get(k, v)) for k, v in TOKEN_DEFAULTS.items())
        eos = tc.get("eos_token_id", hf.get("eos_token_id", TEXT_DEFAULTS.eos_token_id))
        return ModelConfig(
            decoder=decoder_config(tc, placeholders), encoders=tuple(encoders),
            media_token_ids=tuple(media),
            eos_ids=tuple(int(e) for e in eos) if isinstance(eos, list) else (int(eos),),
            shared_encoders=(("video", "image"),) if any(m == "image" for m, _ in media) else (),
            pad_id=int(tc.get("pad_token_id", 0) or 0),
            max_context=int(tc.get("max_position_embeddings", TEXT_DEFAULTS.max_position_embeddings)),
        )
    except CheckpointError as e:
        raise CheckpointError(f"config.json is not a valid Gemma 4 config: {e}") from e
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json is not a valid Gemma 4 config: {e!r}") from e


# ---------------------------------------------------------------------------------------------------------------
# Encoders and weights


def build_encoders(cfg: ModelConfig, *, rngs: nnx.Rngs) -> dict:
    out = {}
    if "image" in cfg.modalities:
        out["image"] = Gemma4VisionEncoder(cfg.encoder_config("image"), rngs=rngs)
    if "audio" in cfg.modalities:
        out["audio"] = Gemma4AudioEncoder(cfg.encoder_config("audio"), rngs=rngs)
    return out


def expert_gate_up(half: int):
    """[experts, 2 I, D] (gate rows, then up rows, as ``Gemma4TextExperts.gate_up_proj``) -> the gate (half 0) or
    up (half 1) weights as [experts, D, I]."""

    def take(a):
        i = a.shape[1] // 2
        return np.ascontiguousarray(a[:, half * i:(half + 1) * i].transpose(0, 2, 1))

    return take


def gemma4_layer_map(layer: LayerSpec, p: str) -> dict:
    """The Gemma 4 block's parameters beyond the sandwich block's (paths relative to the block) <- ``{p}*``."""
    m = {("layer_scalar",): plain(f"{p}layer_scalar")}
    if layer.options.moe is not None:
        m.update({
            ("moe", "router", "weight"): linear(f"{p}router.proj"),
            ("moe", "router", "scale"): plain(f"{p}router.scale"),
            ("moe", "router", "per_expert_scale"): plain(f"{p}router.per_expert_scale"),
            ("moe", "gate_proj"): TensorSpec(f"{p}experts.gate_up_proj", fn=expert_gate_up(0)),
            ("moe", "up_proj"): TensorSpec(f"{p}experts.gate_up_proj", fn=expert_gate_up(1)),
            ("moe", "down_proj"): TensorSpec(f"{p}experts.down_proj", transpose=(0, 2, 1)),
            ("dense_norm_out", "weight"): plain(f"{p}post_feedforward_layernorm_1.weight"),
            ("moe_norm_in", "weight"): plain(f"{p}pre_feedforward_layernorm_2.weight"),
            ("moe_norm_out", "weight"): plain(f"{p}post_feedforward_layernorm_2.weight"),
        })
    if layer.options.layer_input_width:
        m.update({("layer_input_gate", "kernel"): linear(f"{p}per_layer_input_gate"),
                  ("layer_input_proj", "kernel"): linear(f"{p}per_layer_projection"),
                  ("layer_input_norm", "weight"): plain(f"{p}post_per_layer_input_norm.weight")})
    return m


def gemma4_decoder_weight_map(spec: DecoderSpec, prefix: str = TEXT_PREFIX) -> dict:
    """Every decoder parameter (paths relative to the model's ``decoder``) <- ``{prefix}*`` tensors."""
    wm = decoder_weight_map(spec, prefix, norms=GEMMA_NORMS, lm_head="lm_head")
    for i, layer in enumerate(spec.layers):
        wm.update(prefixed(gemma4_layer_map(layer, f"{prefix}layers.{i}."), ("layers", i)))
    if spec.layer_inputs is not None:
        wm.update({("layer_inputs", "embedding"): plain(f"{prefix}embed_tokens_per_layer.weight"),
                   ("layer_inputs", "projection", "kernel"): linear(f"{prefix}per_layer_model_projection"),
                   ("layer_inputs", "norm", "weight"): plain(f"{prefix}per_layer_projection_norm.weight")})
    return wm


def weight_map(cfg: ModelConfig) -> dict:
    wm = prefixed(gemma4_decoder_weight_map(cfg.decoder), ("decoder",))
    if "image" in cfg.modalities:
        wm.update(prefixed(gemma4_vision_weight_map(cfg.encoder_config("image"), key_prefix="model."),
                           ("encoders", "image")))
    if "audio" in cfg.modalities:
        wm.update(prefixed(gemma4_audio_weight_map(cfg.encoder_config("audio"), key_prefix="model."),
                           ("encoders", "audio")))
    return wm


def unused_keys(cfg: ModelConfig, hf: dict) -> list[str]:
    """Tensors some exports hold that the model does not read: the key / value projections and norms of KV-sharing
    layers (the published checkpoints keep them) and a tied output head's copy."""
    shared = [str(i) for i in range(cfg.decoder.num_layers) if not cfg.decoder.owns_kv(i)]
    patterns = [rf"model\.layers\.({'|'.join(shared)})\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\..*"] if shared \
        else []
    if cfg.decoder.tie_embeddings:
        patterns.append(r"lm_head\.weight")
    return patterns


# ---------------------------------------------------------------------------------------------------------------
# Prompts


def check_image_config(cfg: Gemma4VisionConfig, image_cfg: Gemma4ImageConfig) -> None:
    """Raise ``CheckpointError`` when the image processor's settings do not fit the vision tower: another patch
    size or pooling kernel, or a soft-token budget whose longest patch row (``max_soft_tokens * k`` patches) does
    not fit the learned position tables."""
    if image_cfg.patch_size != cfg.patch_size:
        raise CheckpointError(f"the image processor cuts {image_cfg.patch_size}-pixel patches but the vision tower "
                              f"takes {cfg.patch_size}-pixel patches")
    if image_cfg.pooling_kernel_size != cfg.pooling_kernel_size:
        raise CheckpointError(f"the image processor pools {image_cfg.pooling_kernel_size} patches per side but the "
                              f"vision tower pools {cfg.pooling_kernel_size}")
    longest = image_cfg.max_soft_tokens * image_cfg.pooling_kernel_size
    if longest > cfg.position_embedding_size:
        raise CheckpointError(f"max_soft_tokens {image_cfg.max_soft_tokens} allows images {longest} patches long, "
                              f"beyond the vision tower's {cfg.position_embedding_size} learned positions")


def make_processor(folder: pathlib.Path, cfg: ModelConfig, *, max_audio_seconds: float | None = None,
                   video_size: str = "processor") -> Gemma4Processor:
    """The checkpoint's processor (preprocess/gemma4/processor.py), its image settings checked against the vision
    tower. Gemma 4's processor sizes videos by the saved video processor's settings alone, so ``video_size`` has no
    effect."""
    processor = Gemma4Processor(
        folder, token_ids={m: cfg.media_token_id(m) for m in cfg.modalities},
        image_bidirectional=any(layer.attention.mask.media_bidirectional for layer in cfg.decoder.layers),
        max_audio_seconds=max_audio_seconds)
    if "image" in cfg.modalities:
        check_image_config(cfg.encoder_config("image"), processor.image_cfg)
        check_image_config(cfg.encoder_config("image"), processor.video_cfg.pixels)
    return processor


SPEC = FamilySpec(
    name="gemma4", model_types=("gemma4", "gemma4_text"), parse_config=parse_config, build_encoders=build_encoders,
    weight_map=weight_map, unused_keys=unused_keys, key_aliases=KEY_ALIASES, make_processor=make_processor,
    blocks={"gemma4": Gemma4Block}, routers={"gemma4": Gemma4Router}, layer_inputs={"gemma4": Gemma4LayerInputs},
)
