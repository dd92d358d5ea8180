"""Qwen3-Omni thinker (Qwen3OmniMoeForConditionalGeneration / ...ThinkerForConditionalGeneration).

Vision tower with deepstack features, audio tower, and an MoE text decoder with interleaved 3-D MRoPE. A full
checkpoint (thinker + talker + code2wav) loads its thinker; the speech-output weights are skipped.
"""

from __future__ import annotations

import functools
import logging
import math
import pathlib
import re

import numpy as np
from flax import nnx

from omnijax.common.errors import CheckpointError, PromptError
from omnijax.app.families.weight_maps import LLAMA_NORMS, decoder_weight_map
from omnijax.app.families.spec import FamilySpec, ModelConfig, PreparedPrompt
from omnijax.common.weights import prefixed
from omnijax.decoder.spec import AttentionSpec, DecoderSpec, FeedForwardSpec, LayerSpec, RopeSpec
from omnijax.encoders.qwen3_omni.audio import QwenAudioConfig, qwen_audio_weight_map
from omnijax.encoders.qwen3_omni.audio_encoder import QwenAudioEncoder
from omnijax.encoders.qwen3_omni.image_encoder import QwenImageEncoder
from omnijax.encoders.qwen3_omni.vision import QwenVisionConfig, qwen_vision_weight_map
from omnijax.preprocess.audio import load_audio
from omnijax.preprocess.images import load_image
from omnijax.preprocess.qwen3_omni.mrope import MRopeTokens, audio_tokens_from_frames, mrope_positions
from omnijax.preprocess.prompts import media_of, normalize_messages, render_chat
from omnijax.preprocess.user_text import encode_prompt
from omnijax.preprocess.qwen3_omni.image import QwenImageConfig, process_images
from omnijax.preprocess.tokenizer import load_tokenizer
from omnijax.preprocess.qwen3_omni.audio_features import WhisperFeatureConfig, batch_features
from omnijax.preprocess.qwen3_omni.audio_batch import AudioInput, collate as collate_clips
from omnijax.preprocess.qwen3_omni.image_batch import VisionInput, collate as collate_images

log = logging.getLogger(__name__)

# A full model stores the thinker under "thinker."; the canonical layout is the thinker-only one.
KEY_ALIASES = ((r"^thinker\.", ""),)
SPEECH_OUTPUT_KEYS = (r"talker\..*", r"code2wav\..*")
DEFAULT_MAX_AUDIO_SECONDS = 1200.0


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
        return ModelConfig(
            family="qwen3_omni",
            decoder=decoder_config(tc, len(vision.deepstack_visual_indexes),
                                   tie=bool(th.get("tie_word_embeddings", tc.get("tie_word_embeddings", False)))),
            encoders=(("image", vision), ("audio", audio)),
            media_token_ids=(("image", int(th["image_token_id"])), ("audio", int(th["audio_token_id"]))),
            eos_ids=tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),),
            pad_id=int(tc.get("pad_token_id") or 0),
            max_context=int(tc.get("max_position_embeddings", 32768)),
            deepstack_modality="image",
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json is not a valid Qwen3-Omni config: {e!r}") from e


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
    return wm


def unused_keys(cfg: ModelConfig, hf: dict) -> list[str]:
    patterns = list(SPEECH_OUTPUT_KEYS)
    if cfg.decoder.tie_embeddings:
        patterns.append(r"lm_head\.weight")
    return patterns


class Qwen3OmniProcessor:
    """Qwen3-Omni prompts: chat template, image/audio pads expanded per item, 3-D MRoPE positions."""

    def __init__(self, folder: pathlib.Path, cfg: ModelConfig, *, max_audio_seconds: float | None = None):
        self.tokenizer = load_tokenizer(folder)
        hf = _read_config(folder)
        th = thinker_config(hf)
        self.image_cfg = QwenImageConfig.from_folder(folder)
        self.audio_cfg = WhisperFeatureConfig.from_folder(folder)
        self.n_window = cfg.encoder_config("audio").n_window
        self.max_audio_seconds = DEFAULT_MAX_AUDIO_SECONDS if max_audio_seconds is None else max_audio_seconds
        vocab = self.tokenizer.get_vocab()
        inv = {v: k for k, v in vocab.items()}
        self.image_token_id = cfg.media_token_id("image")
        self.audio_token_id = cfg.media_token_id("audio")
        for name, tid in (("image", self.image_token_id), ("audio", self.audio_token_id)):
            if tid not in inv:
                raise CheckpointError(f"{name} token id {tid} is not in the tokenizer's vocabulary")
        self.image_token, self.audio_token = inv[self.image_token_id], inv[self.audio_token_id]
        th = dict(th)
        th.setdefault("vision_start_token_id", vocab.get("<|vision_start|>"))
        th.setdefault("audio_start_token_id", vocab.get("<|audio_start|>"))
        th.setdefault("video_token_id", vocab.get("<|video_pad|>", -1))
        self.mrope = MRopeTokens.from_thinker_config(th)
        self.split = re.compile(f"({re.escape(self.image_token)}|{re.escape(self.audio_token)})")
        # the encoders' largest inputs: the biggest resized image and the longest accepted clip
        max_frames = math.ceil(self.max_audio_seconds * self.audio_cfg.sampling_rate / self.audio_cfg.hop_length) + 1
        vision = vision_input(cfg.encoder_config("image"))
        if self.image_cfg.max_pixels < (vision.patch_size * vision.merge_size) ** 2:
            raise ValueError(f"max_pixels {self.image_cfg.max_pixels} is smaller than one merge block of patches")
        self.collate = {
            "image": functools.partial(collate_images, vision=vision, max_pixels=self.image_cfg.max_pixels),
            "audio": functools.partial(collate_clips, audio=audio_input(cfg.encoder_config("audio")),
                                       max_frames=max_frames)}

    def prepare(self, messages) -> PreparedPrompt:
        messages = normalize_messages(messages)
        images = [load_image(s) for s in media_of(messages, "image")]
        clips = [load_audio(s, max_seconds=self.max_audio_seconds) for s in media_of(messages, "audio")]
        text = render_chat(self.tokenizer, messages)
        pieces = self.split.split(text)
        markers = pieces[1::2]
        n_img, n_aud = markers.count(self.image_token), markers.count(self.audio_token)
        if n_img != len(images) or n_aud != len(clips):
            raise PromptError(f"the prompt has {n_img} image and {n_aud} audio placeholders for {len(images)} "
                              f"images and {len(clips)} audio clips")
        media: dict[str, list] = {}
        grids: list[tuple[int, int, int]] = []
        audio_tokens: list[int] = []
        if images:
            pixels, grid_thw = process_images(images, self.image_cfg)
            sizes = [int(np.prod(g)) for g in grid_thw]
            starts = np.cumsum([0] + sizes)
            grids = [tuple(int(v) for v in g) for g in grid_thw]
            media["image"] = [{"patches": pixels[starts[i]:starts[i + 1]], "grid": grids[i]}
                              for i in range(len(images))]
        if clips:
            feats, mask = batch_features(clips, self.audio_cfg)
            frames = [int(m.sum()) for m in mask]
            audio_tokens = [int(audio_tokens_from_frames(f, self.n_window)) for f in frames]
            media["audio"] = [{"features": feats[i][:, :frames[i]]} for i in range(len(clips))]
        merge = self.image_cfg.merge_size ** 2
        it_img, it_aud = iter(grids), iter(audio_tokens)
        out = [pieces[0]]
        for marker, rest in zip(pieces[1::2], pieces[2::2]):
            if marker == self.image_token:
                out.append(self.image_token * (int(np.prod(next(it_img))) // merge))
            else:
                out.append(self.audio_token * next(it_aud))
            out.append(rest)
        ids = encode_prompt(self.tokenizer, "".join(out))
        positions, delta = mrope_positions(ids, image_grids=grids, audio_lengths=audio_tokens, cfg=self.mrope)
        return PreparedPrompt(token_ids=ids, media=media, bidirectional=np.zeros(len(ids), bool),
                              rope_positions=positions.astype(np.int32), rope_delta=int(delta))

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)


def _read_config(folder: pathlib.Path) -> dict:
    from omnijax.app.checkpoint import read_json

    return read_json(folder, "config.json")


SPEC = FamilySpec(
    name="qwen3_omni", model_types=("qwen3_omni_moe", "qwen3_omni_moe_thinker"), parse_config=parse_config,
    build_encoders=build_encoders, weight_map=weight_map, unused_keys=unused_keys, key_aliases=KEY_ALIASES,
    make_processor=Qwen3OmniProcessor,
)
