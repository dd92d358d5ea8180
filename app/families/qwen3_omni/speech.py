"""Qwen3-Omni speech output as data: the talker, code predictor and code2wav configs, their weight maps, and the
token ids and settings the speech loop reads (app/speech.py).

A checkpoint speaks when its config enables audio output and holds the talker and code2wav sections
(``enable_audio_output``, ``talker_config``, ``code2wav_config``). Voices are the talker config's ``speaker_id``
map. transformers' ``generate`` suppresses the top 1,024 talker ids but the end code (its special codec tokens)
and applies a repetition penalty even when greedy; the sampled defaults are its ``generate``'s.
"""

from __future__ import annotations

import dataclasses

from omnijax.common.errors import CheckpointError
from omnijax.common.weights import TensorSpec, linear, plain, prefixed
from omnijax.app.families.weight_maps import LLAMA_NORMS, decoder_weight_map, gated_mlp_map, feed_forward_map
from omnijax.decoder.qwen3_omni.code2wav import Code2WavConfig
from omnijax.decoder.qwen3_omni.talker import TalkerConfig
from omnijax.decoder.qwen3_omni.vocoder import DILATIONS
from omnijax.decoder.spec import AttentionSpec, DecoderSpec, FeedForwardSpec, LayerSpec, MaskSpec, RopeSpec
from omnijax.preprocess.qwen3_omni.mrope import MRopeTokens

SAMPLE_RATE = 24_000  # code2wav's output rate: a family constant, in no config
SUPPRESSED_TOP_IDS = 1024  # the talker ids above the codebook (special codec tokens) generate never picks
TALKER_SAMPLING = dict(temperature=0.9, top_k=50, top_p=1.0)  # transformers' generate defaults when sampling
PREDICTOR_SAMPLING = dict(temperature=1.0, top_k=50, top_p=0.8)
REPETITION_PENALTY = 1.05


@dataclasses.dataclass(frozen=True)
class SpeechConfig:
    """What speaking needs beyond the thinker.

    accept_hidden_layer: the thinker hidden state (transformers' ``hidden_states`` index) the talker reads at media
    positions. speakers: (voice name, codec id) pairs. codec: the talker's special codec ids (pad, bos, eos, nothink,
    think_bos, think_eos). tts: the thinker-vocabulary ids of tts_pad, tts_bos, tts_eos. roles: the ids of
    <|im_start|>, "user" and "assistant"; media_ids: the thinker's image / audio / video placeholders;
    talker_mrope: the talker's 3-D position settings.
    """

    talker: TalkerConfig
    code2wav: Code2WavConfig
    accept_hidden_layer: int
    speakers: tuple[tuple[str, int], ...]
    codec: dict
    tts: dict
    roles: dict
    media_ids: tuple[int, ...]
    talker_mrope: MRopeTokens
    sample_rate: int = SAMPLE_RATE
    repetition_penalty: float = REPETITION_PENALTY

    @property
    def voices(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.speakers)

    @property
    def suppressed(self) -> tuple[int, int]:
        """The [first, end) talker ids suppressed, the end code excepted."""
        vocab = self.talker.decoder.vocab_size
        return max(0, vocab - SUPPRESSED_TOP_IDS), vocab

    def __hash__(self):  # dict fields: hash by identity (one config per loaded model)
        return id(self)


def _int(d: dict, key: str, where: str) -> int:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{where}: '{key}' must be an integer, got {value!r}")
    return value


def _rope(c: dict, default_theta: float) -> dict:
    return c.get("rope_parameters") or dict(c.get("rope_scaling") or {}, rope_theta=c.get("rope_theta", default_theta))


def _attention(c: dict, *, rope: RopeSpec, qk_norm: str, mask: MaskSpec = MaskSpec()) -> AttentionSpec:
    heads = c["num_attention_heads"]
    return AttentionSpec(num_heads=heads, num_kv_heads=c.get("num_key_value_heads") or heads,
                         head_dim=c.get("head_dim") or c["hidden_size"] // heads, mask=mask, rope=rope,
                         qk_norm=qk_norm, bias=bool(c.get("attention_bias", False)))


def talker_decoder_spec(tc: dict) -> DecoderSpec:
    """The talker: every layer MoE (softmax router, top-k, optional renormalisation) plus a sigmoid-gated shared
    expert, 3-D MRoPE, q/k RMS norms."""
    rope = _rope(tc, 1e6)
    section = tuple(rope.get("mrope_section") or (24, 20, 20))
    att = _attention(tc, rope=RopeSpec(theta=float(rope.get("rope_theta", 1e6)), mrope_section=section),
                     qk_norm="rms")
    moe = FeedForwardSpec("moe", tc["moe_intermediate_size"], tc.get("hidden_act", "silu"),
                          num_experts=tc.get("num_experts") or tc["num_local_experts"], top_k=tc["num_experts_per_tok"], router="softmax",
                          renormalize=bool(tc.get("norm_topk_prob", False)),
                          shared_intermediate=tc["shared_expert_intermediate_size"], shared_gate=True)
    return DecoderSpec(vocab_size=tc["vocab_size"], hidden_size=tc["hidden_size"],
                       layers=tuple(LayerSpec(att, moe) for _ in range(tc["num_hidden_layers"])),
                       rms_norm_eps=tc.get("rms_norm_eps", 1e-6), tie_embeddings=False)


def predictor_spec(pc: dict, groups: int) -> DecoderSpec:
    """The code predictor: dense pre-norm layers, 1-D RoPE, q/k RMS norms; its table holds groups - 1 codebooks."""
    if pc.get("sliding_window") is not None:
        raise CheckpointError("a code predictor with sliding-window layers is not supported")
    rope = _rope(pc, 10_000.0)
    att = _attention(pc, rope=RopeSpec(theta=float(rope.get("rope_theta", 10_000.0))), qk_norm="rms")
    mlp = FeedForwardSpec("dense", pc["intermediate_size"], pc.get("hidden_act", "silu"))
    return DecoderSpec(vocab_size=(groups - 1) * pc["vocab_size"], hidden_size=pc["hidden_size"],
                       layers=tuple(LayerSpec(att, mlp) for _ in range(pc["num_hidden_layers"])),
                       rms_norm_eps=pc.get("rms_norm_eps", 1e-6), tie_embeddings=True)


def code2wav_config(cc: dict) -> Code2WavConfig:
    """code2wav: a sliding-window transformer of layer-scaled pre-norm blocks (no q/k norm), then the vocoder."""
    rope = _rope(cc, 10_000.0)
    att = _attention(cc, rope=RopeSpec(theta=float(rope.get("rope_theta", 10_000.0))), qk_norm="none",
                     mask=MaskSpec("sliding", int(cc.get("sliding_window", 72))))
    mlp = FeedForwardSpec("dense", cc["intermediate_size"], cc.get("hidden_act", "silu"))
    codebook, groups = cc.get("codebook_size", 2048), cc.get("num_quantizers", 16)
    spec = DecoderSpec(vocab_size=codebook * groups, hidden_size=cc["hidden_size"],
                       layers=tuple(LayerSpec(att, mlp, block="layer_scale") for _ in range(cc["num_hidden_layers"])),
                       rms_norm_eps=cc.get("rms_norm_eps", 1e-5), tie_embeddings=True)
    return Code2WavConfig(codebook_size=codebook, num_quantizers=groups, transformer=spec,
                          decoder_dim=cc.get("decoder_dim", 1536),
                          upsampling_ratios=tuple(cc.get("upsampling_ratios", (2, 2))),
                          upsample_rates=tuple(cc.get("upsample_rates", (8, 5, 4, 3))))


def speech_config(hf: dict, thinker_layers: int) -> SpeechConfig | None:
    """The speech-output config of a full Qwen3-Omni config dict, or None when it has no audio output."""
    if hf.get("model_type") != "qwen3_omni_moe" or not hf.get("enable_audio_output", True):
        return None
    tk, cc = hf.get("talker_config"), hf.get("code2wav_config")
    if not isinstance(tk, dict) or not isinstance(cc, dict):
        return None
    try:
        tc, pc = tk["text_config"], tk["code_predictor_config"]
        groups = _int(tk, "num_code_groups", "talker_config")
        talker = TalkerConfig(decoder=talker_decoder_spec(tc), predictor=predictor_spec(pc, groups),
                              num_code_groups=groups, codebook_size=_int(pc, "vocab_size", "code_predictor_config"),
                              thinker_hidden=_int(tk, "thinker_hidden_size", "talker_config"),
                              projection=tc["intermediate_size"], projection_act=tc.get("hidden_act", "silu"))
        c2w = code2wav_config(cc)
        accept = _int(tk, "accept_hidden_layer", "talker_config")
        if not 0 <= accept < thinker_layers:
            raise CheckpointError(f"talker_config: accept_hidden_layer {accept} is not a hidden state of the "
                                  f"{thinker_layers}-layer thinker")
        if c2w.num_quantizers != groups or c2w.codebook_size != talker.codebook_size:
            raise CheckpointError(f"code2wav takes {c2w.num_quantizers} groups of {c2w.codebook_size} codes but the "
                                  f"talker makes {groups} of {talker.codebook_size}")
        speakers = tk.get("speaker_id") or {}
        if not speakers or not all(isinstance(v, int) and not isinstance(v, bool) for v in speakers.values()):
            raise CheckpointError(f"talker_config: 'speaker_id' must map voice names to codec ids, got {speakers!r}")
        codec = {k: _int(tk, f"codec_{k}_id" if k != "eos" else "codec_eos_token_id", "talker_config")
                 for k in ("pad", "bos", "eos", "nothink", "think_bos", "think_eos")}
        tts = {k: _int(hf, f"tts_{k}_token_id", "config") for k in ("pad", "bos", "eos")}
        roles = {"im_start": _int(hf, "im_start_token_id", "config"), "user": _int(hf, "user_token_id", "config"),
                 "assistant": _int(hf, "assistant_token_id", "config")}
        th = hf["thinker_config"]
        media = tuple(_int(th, k, "thinker_config") for k in ("audio_token_id", "image_token_id", "video_token_id"))
        mrope = MRopeTokens(image_token_id=_int(tk, "image_token_id", "talker_config"),
                            audio_token_id=_int(tk, "audio_token_id", "talker_config"),
                            video_token_id=_int(tk, "video_token_id", "talker_config"),
                            vision_start_token_id=_int(tk, "vision_start_token_id", "talker_config"),
                            audio_start_token_id=_int(tk, "audio_start_token_id", "talker_config"),
                            spatial_merge_size=tk.get("spatial_merge_size", 2),
                            position_id_per_seconds=tk.get("position_id_per_seconds", 25))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"config.json: the talker / code2wav sections are not valid: {e!r}") from e
    return SpeechConfig(talker=talker, code2wav=c2w, accept_hidden_layer=accept,
                        speakers=tuple((str(k).lower(), int(v)) for k, v in speakers.items()), codec=codec, tts=tts,
                        roles=roles, media_ids=media, talker_mrope=mrope)


# ---- weight maps --------------------------------------------------------------------------------------------------

def _resize_mlp(prefix: str) -> dict:
    out = {}
    for i in (1, 2):
        out[(f"linear_fc{i}", "kernel")] = linear(f"{prefix}.linear_fc{i}")
        out[(f"linear_fc{i}", "bias")] = plain(f"{prefix}.linear_fc{i}.bias")
    return out


def _talker_ffn(layer: LayerSpec, p: str) -> dict:
    """The routed experts and router (``feed_forward_map``) plus the shared expert and its gate."""
    out = feed_forward_map(layer, p)
    out.update(prefixed(gated_mlp_map(f"{p}mlp.shared_expert."), ("shared",)))
    out[("shared_gate",)] = plain(f"{p}mlp.shared_expert_gate.weight")
    return out


def talker_weight_map(cfg: TalkerConfig, prefix: str = "talker.") -> dict:
    """Paths relative to the Talker module -> ``talker.*`` tensors."""
    dec = decoder_weight_map(cfg.decoder, f"{prefix}model.", norms=LLAMA_NORMS, lm_head=f"{prefix}codec_head",
                             feed_forward=_talker_ffn)
    dec[("embedder", "embedding")] = plain(f"{prefix}model.codec_embedding.weight")
    pred = decoder_weight_map(cfg.predictor, f"{prefix}code_predictor.model.", norms=LLAMA_NORMS, lm_head=None)
    tables = cfg.num_code_groups - 1
    pred[("embedder", "embedding")] = TensorSpec(
        tuple(f"{prefix}code_predictor.model.codec_embedding.{g}.weight" for g in range(tables)),
        reshape=(tables * cfg.codebook_size, cfg.decoder.hidden_size))
    wm = {**prefixed(dec, ("decoder",)), **prefixed(pred, ("predictor",)),
          ("heads",): TensorSpec(tuple(f"{prefix}code_predictor.lm_head.{g}.weight" for g in range(tables)))}
    for name in ("text_projection", "hidden_projection"):
        wm.update(prefixed(_resize_mlp(f"{prefix}{name}"), (name,)))
    return wm


def _conv(prefix: str) -> dict:
    return {("weight",): plain(f"{prefix}.weight"), ("bias",): plain(f"{prefix}.bias")}


def _snake(prefix: str) -> dict:
    return {("alpha",): plain(f"{prefix}.alpha"), ("beta",): plain(f"{prefix}.beta")}


def code2wav_weight_map(cfg: Code2WavConfig, prefix: str = "code2wav.") -> dict:
    """Paths relative to the Code2Wav module -> ``code2wav.*`` tensors."""
    norms = dict(LLAMA_NORMS)
    tf = decoder_weight_map(cfg.transformer, f"{prefix}pre_transformer.", norms=norms, lm_head=None)
    tf[("embedder", "embedding")] = plain(f"{prefix}code_embedding.weight")
    for i in range(cfg.transformer.num_layers):
        p = f"{prefix}pre_transformer.layers.{i}."
        tf[("layers", i, "attn_scale")] = plain(f"{p}self_attn_layer_scale.scale")
        tf[("layers", i, "mlp_scale")] = plain(f"{p}mlp_layer_scale.scale")
    voc: dict = {}
    for i in range(len(cfg.upsampling_ratios)):
        p = f"{prefix}upsample.{i}."
        voc.update(prefixed(_conv(f"{p}0.conv"), ("upsamplers", i)))
        nx = {**prefixed(_conv(f"{p}1.dwconv.conv"), ("dwconv",)),
              ("norm", "weight"): plain(f"{p}1.norm.weight"), ("norm", "bias"): plain(f"{p}1.norm.bias"),
              ("gamma",): plain(f"{p}1.gamma")}
        for j in (1, 2):
            nx[(f"pwconv{j}", "kernel")] = linear(f"{p}1.pwconv{j}")
            nx[(f"pwconv{j}", "bias")] = plain(f"{p}1.pwconv{j}.bias")
        voc.update(prefixed(nx, ("convnexts", i)))
    voc.update(prefixed(_conv(f"{prefix}decoder.0.conv"), ("conv_in",)))
    for i in range(len(cfg.upsample_rates)):
        p = f"{prefix}decoder.{i + 1}.block."
        block = {**prefixed(_snake(f"{p}0"), ("act",)), **prefixed(_conv(f"{p}1.conv"), ("up",))}
        for u in range(len(DILATIONS)):
            q = f"{p}{u + 2}."
            unit = {**prefixed(_snake(f"{q}act1"), ("act1",)), **prefixed(_snake(f"{q}act2"), ("act2",)),
                    **prefixed(_conv(f"{q}conv1.conv"), ("conv1",)), **prefixed(_conv(f"{q}conv2.conv"), ("conv2",))}
            block.update(prefixed(unit, ("units", u)))
        voc.update(prefixed(block, ("blocks", i)))
    n = len(cfg.upsample_rates)
    voc.update(prefixed(_snake(f"{prefix}decoder.{n + 1}"), ("act_out",)))
    voc.update(prefixed(_conv(f"{prefix}decoder.{n + 2}.conv"), ("conv_out",)))
    return {**prefixed(tf, ("transformer",)), **prefixed(voc, ("vocoder",))}


def speech_weight_map(cfg: SpeechConfig) -> dict:
    """Paths relative to the model's ``speech`` module."""
    return {**prefixed(talker_weight_map(cfg.talker), ("talker",)),
            **prefixed(code2wav_weight_map(cfg.code2wav), ("code2wav",))}
