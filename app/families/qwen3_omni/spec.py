"""Qwen3-Omni (Qwen3OmniMoeForConditionalGeneration / ...ThinkerForConditionalGeneration).

Vision tower with deepstack features, audio tower, and an MoE text decoder with interleaved 3-D MRoPE (the
thinker). A full checkpoint with audio output enabled also loads its talker, code predictor and code2wav (the
speech output: app/families/qwen3_omni/speech.py); without it (or a thinker-only folder) the speech-output weights
are skipped and the model answers in text only.
"""

from __future__ import annotations

import pathlib

from flax import nnx

from omnijax.app.checkpoint import read_json
from omnijax.common.errors import CheckpointError
from omnijax.app.families.weight_maps import LLAMA_NORMS, decoder_weight_map
from omnijax.app.families.qwen3_omni.speech import speech_config, speech_weight_map
from omnijax.app.families.spec import FamilySpec, ModelConfig
from omnijax.common.weights import prefixed
from omnijax.decoder.qwen3_omni.speech_output import SpeechOutput
from omnijax.decoder.spec import AttentionSpec, DecoderSpec, FeedForwardSpec, LayerSpec, RopeSpec
from omnijax.encoders.qwen3_omni.audio import QwenAudioConfig, qwen_audio_weight_map
from omnijax.encoders.qwen3_omni.audio_encoder import QwenAudioEncoder
from omnijax.encoders.qwen3_omni.image_encoder import QwenImageEncoder
from omnijax.encoders.qwen3_omni.vision import QwenVisionConfig, qwen_vision_weight_map
from omnijax.preprocess.qwen3_omni.audio_batch import AudioInput
from omnijax.preprocess.qwen3_omni.image_batch import VisionInput
from omnijax.preprocess.qwen3_omni.processor import Qwen3OmniProcessor

# A full model stores the thinker under "thinker."; the canonical layout is the thinker-only one.
KEY_ALIASES = ((r"^thinker\.", ""),)
SPEECH_OUTPUT_KEYS = (r"talker\..*", r"code2wav\..*")


def thinker_config(hf: dict) -> dict:
    return hf["thinker_config"] if hf.get("model_type") == "qwen3_omni_moe" else hf


def decoder_config(tc: dict, deepstack_layers: int, tie: bool) -> DecoderSpec:
    """Qwen3-Omni's thinker decoder: pre-norm layers, full attention with 3-D MRoPE, MoE or dense feed-forward."""
    hidden = tc["hidden_size"]
    heads = tc["num_attention_heads"]
    n = tc["num_hidden_layers"]
    rope = tc.get("rope_parameters") or dict(tc.get("rope_scaling") or {}, rope_theta=tc.get("rope_theta", 1e6))
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise CheckpointError(f"unsupported RoPE type {rope.get('rope_type')!r} for Qwen3-Omni")
    section = tuple(rope.get("mrope_section") or (24, 20, 20))
    attention = AttentionSpec(
        num_heads=heads, num_kv_heads=tc.get("num_key_value_heads", heads),
        head_dim=tc.get("head_dim") or hidden // heads,
        rope=RopeSpec(theta=float(rope.get("rope_theta", 1e6)), mrope_section=section), qk_norm="rms",
        bias=tc.get("attention_bias", False))
    act = {"silu": "silu", "swish": "silu"}.get(tc.get("hidden_act", "silu"), "silu")
    experts = tc.get("num_experts", 0)
    sparse_step = tc.get("decoder_sparse_step", 1)
    dense_only = set(tc.get("mlp_only_layers") or [])
    moe = FeedForwardSpec("moe", tc.get("moe_intermediate_size", 0), act, num_experts=experts,
                          top_k=tc.get("num_experts_per_tok", 0), router="softmax",
                          renormalize=tc.get("norm_topk_prob", True)) if experts > 0 else None
    is_moe = [moe is not None and i not in dense_only and (i + 1) % sparse_step == 0 for i in range(n)]
    dense = None if all(is_moe) else FeedForwardSpec("dense", tc.get("intermediate_size", 0), act)
    layers = tuple(LayerSpec(attention, moe if is_moe[i] else dense) for i in range(n))
    return DecoderSpec(vocab_size=tc["vocab_size"], hidden_size=hidden, layers=layers,
                       rms_norm_eps=tc.get("rms_norm_eps", 1e-6), tie_embeddings=tie,
                       deepstack_layers=deepstack_layers)


def parse_config(hf: dict) -> ModelConfig:
    try:
        th = thinker_config(hf)
        tc = th["text_config"]
        vision = QwenVisionConfig.from_hf(th.get("vision_config") or {})
        audio = QwenAudioConfig.from_hf(th.get("audio_config") or {})
        eos = tc.get("eos_token_id") or hf.get("eos_token_id") or th.get("eos_token_id") or ()
        decoder = decoder_config(tc, len(vision.deepstack_visual_indexes),
                                 tie=bool(th.get("tie_word_embeddings", tc.get("tie_word_embeddings", False))))
        return ModelConfig(
            decoder=decoder,
            encoders=(("image", vision), ("audio", audio)),
            media_token_ids=(("image", int(th["image_token_id"])), ("audio", int(th["audio_token_id"])),
                             ("video", int(th["video_token_id"]))),
            shared_encoders=(("video", "image"),),
            eos_ids=tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),),
            pad_id=int(tc.get("pad_token_id") or 0),
            max_context=int(tc.get("max_position_embeddings", 32768)),
            deepstack_modality="image",
            speech=speech_config(hf, decoder.num_layers),
        )
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json is not a valid Qwen3-Omni config: {e!r}") from e


def build_speech(cfg: ModelConfig, *, rngs: nnx.Rngs) -> SpeechOutput:
    return SpeechOutput(cfg.speech.talker, cfg.speech.code2wav, rngs=rngs)


def build_encoders(cfg: ModelConfig, *, rngs: nnx.Rngs) -> dict:
    return {"image": QwenImageEncoder(cfg.encoder_config("image"), rngs=rngs),
            "audio": QwenAudioEncoder(cfg.encoder_config("audio"), rngs=rngs)}


def vision_input(cfg: QwenVisionConfig) -> VisionInput:
    """The vision tower's input layout, as the host-side batching needs it."""
    return VisionInput(patch_size=cfg.patch_size, patch_dim=cfg.patch_dim, merge_size=cfg.spatial_merge_size,
                       grid_side=cfg.num_grid_per_side)


def audio_input(cfg: QwenAudioConfig) -> AudioInput:
    """The audio tower's input layout, as the host-side batching needs it."""
    return AudioInput(num_mel_bins=cfg.num_mel_bins, n_window=cfg.n_window, n_window_infer=cfg.n_window_infer)


def weight_map(cfg: ModelConfig) -> dict:
    wm = prefixed(decoder_weight_map(cfg.decoder, "model.", norms=LLAMA_NORMS, lm_head="lm_head"), ("decoder",))
    wm.update(prefixed(qwen_vision_weight_map(cfg.encoder_config("image"), key_prefix="visual."),
                       ("encoders", "image", "tower")))
    wm.update(prefixed(qwen_audio_weight_map(cfg.encoder_config("audio"), key_prefix="audio_tower."),
                       ("encoders", "audio", "tower")))
    if cfg.speech is not None:
        wm.update(prefixed(speech_weight_map(cfg.speech), ("speech",)))
    return wm


def unused_keys(cfg: ModelConfig, hf: dict) -> list[str]:
    patterns = list(SPEECH_OUTPUT_KEYS) if cfg.speech is None else []
    if cfg.decoder.tie_embeddings:
        patterns.append(r"lm_head\.weight")
    return patterns


def make_processor(folder: pathlib.Path, cfg: ModelConfig, *, max_audio_seconds: float | None = None,
                   video_size: str = "processor") -> Qwen3OmniProcessor:
    """Qwen3-Omni prompts (preprocess/qwen3_omni/processor.py): the thinker config's MRoPE token ids and the towers'
    input layouts."""
    return Qwen3OmniProcessor(
        folder, image_token_id=cfg.media_token_id("image"), audio_token_id=cfg.media_token_id("audio"),
        thinker_config=thinker_config(read_json(folder, "config.json")),
        vision=vision_input(cfg.encoder_config("image")), audio=audio_input(cfg.encoder_config("audio")),
        max_audio_seconds=max_audio_seconds, video_token_id=cfg.media_token_id("video"), video_size=video_size)


SPEC = FamilySpec(
    name="qwen3_omni", model_types=("qwen3_omni_moe", "qwen3_omni_moe_thinker"), parse_config=parse_config,
    build_encoders=build_encoders, weight_map=weight_map, unused_keys=unused_keys, key_aliases=KEY_ALIASES,
    make_processor=make_processor, build_speech=build_speech,
)
