"""Settings of the Gemma 4 audio encoder (conformer tower + embedder into the text width), read from the Hugging Face
``audio_config`` dict (``Gemma4AudioConfig``; field names as there) and the text hidden size."""

from __future__ import annotations

import dataclasses
import math

from omnijax.common.activations import activation
from omnijax.common.config_values import as_float, as_int, config_getter

# Gemma4RMSNorm's own eps, used where the reference does not pass the config's (feed-forward and layer norms).
FIXED_NORM_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class Gemma4AudioEncoderConfig:
    """Defaults are ``Gemma4AudioConfig``'s.

    hidden_size / num_hidden_layers / num_attention_heads / hidden_act: conformer width, depth, heads, activation
        (feed-forward and light conv).
    subsampling_conv_channels: output channels of the two Conv2d(3x3, stride 2) subsampling layers. The reference
        sizes the projection after them as ``(channels[0] // 4) * channels[1]``, i.e. it assumes
        ``ceil(ceil(mel_bins / 2) / 2) == channels[0] // 4`` (128 mel bins with 128 channels).
    conv_kernel_size: depthwise causal conv kernel of the light conv module.
    residual_weight: scale of each half feed-forward's output before its residual add.
    attention_chunk_size / attention_context_left / attention_context_right: chunked local attention; queries are
        cut into chunks of ``chunk_size`` and see ``context_left - 1`` earlier and ``context_right`` later keys.
    attention_logit_cap: tanh softcap of the attention logits; attention_invalid_logits_value: masked logits.
    use_clipped_linears: whether every conformer linear clamps its input and output to stored bounds.
    rms_norm_eps: eps of the light conv norms, the subsampling LayerNorms and the embedder norm (the feed-forward
        and layer norms use 1e-6 whatever this says, as the reference does).
    gradient_clipping: clamp bound applied around the norms (a huge value in published checkpoints).
    output_proj_dims: width of the tower's output projection (the embedder's input).
    text_hidden_size: width of the text model the embedder projects to.
    """

    hidden_size: int = 1024
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    hidden_act: str = "silu"
    subsampling_conv_channels: tuple[int, int] = (128, 32)
    conv_kernel_size: int = 5
    residual_weight: float = 0.5
    attention_chunk_size: int = 12
    attention_context_left: int = 13
    attention_context_right: int = 0
    attention_logit_cap: float = 50.0
    attention_invalid_logits_value: float = -1.0e9
    use_clipped_linears: bool = True
    rms_norm_eps: float = 1e-6
    gradient_clipping: float = 1e10
    output_proj_dims: int = 1536
    text_hidden_size: int = 2304

    @classmethod
    def from_hf(cls, audio_config: dict, text_hidden_size: int) -> "Gemma4AudioEncoderConfig":
        """From config.json's ``audio_config`` dict (missing keys take the reference's defaults) and
        ``text_config.hidden_size``. Raises ValueError naming the field on a wrong type or range."""
        if not isinstance(audio_config, dict):
            raise ValueError(f"audio_config must be a JSON object, got {type(audio_config).__name__}")
        get = config_getter(audio_config, cls())
        channels = get("subsampling_conv_channels")
        if not isinstance(channels, (list, tuple)) or len(channels) != 2:
            raise ValueError(f"'subsampling_conv_channels' must be two channel counts, got {channels!r}")
        flags = {}
        for key in ("use_clipped_linears",):
            if not isinstance(get(key), bool):
                raise ValueError(f"'{key}' must be true or false, got {get(key)!r}")
            flags[key] = get(key)
        if not isinstance(get("hidden_act"), str):
            raise ValueError(f"'hidden_act' must be a string, got {get('hidden_act')!r}")
        cfg = cls(
            hidden_size=as_int(get("hidden_size"), "hidden_size"),
            num_hidden_layers=as_int(get("num_hidden_layers"), "num_hidden_layers"),
            num_attention_heads=as_int(get("num_attention_heads"), "num_attention_heads"),
            hidden_act=get("hidden_act"),
            subsampling_conv_channels=tuple(as_int(c, "subsampling_conv_channels") for c in channels),
            conv_kernel_size=as_int(get("conv_kernel_size"), "conv_kernel_size"),
            residual_weight=as_float(get("residual_weight"), "residual_weight"),
            attention_chunk_size=as_int(get("attention_chunk_size"), "attention_chunk_size"),
            attention_context_left=as_int(get("attention_context_left"), "attention_context_left"),
            attention_context_right=as_int(get("attention_context_right"), "attention_context_right"),
            attention_logit_cap=as_float(get("attention_logit_cap"), "attention_logit_cap"),
            attention_invalid_logits_value=as_float(get("attention_invalid_logits_value"),
                                                    "attention_invalid_logits_value"),
            rms_norm_eps=as_float(get("rms_norm_eps"), "rms_norm_eps"),
            gradient_clipping=as_float(get("gradient_clipping"), "gradient_clipping"),
            output_proj_dims=as_int(get("output_proj_dims"), "output_proj_dims"),
            text_hidden_size=as_int(text_hidden_size, "text_config.hidden_size"),
            **flags,
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "conv_kernel_size",
                    "attention_chunk_size", "attention_context_left", "output_proj_dims", "text_hidden_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"audio '{key}' must be positive, got {getattr(self, key)}")
        if self.attention_context_right < 0:
            raise ValueError(f"audio 'attention_context_right' must be >= 0, got {self.attention_context_right}")
        if any(c < 1 for c in self.subsampling_conv_channels):
            raise ValueError(f"audio 'subsampling_conv_channels' must be positive, got "
                             f"{self.subsampling_conv_channels}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"audio hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                             f"{self.num_attention_heads}")
        for key in ("attention_logit_cap", "rms_norm_eps", "gradient_clipping"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"audio '{key}' must be a positive number, got {value}")
        activation(self.hidden_act)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def max_past_horizon(self) -> int:
        """Earlier keys in a chunk's context: ``attention_context_left - 1``."""
        return self.attention_context_left - 1

    @property
    def context_size(self) -> int:
        """Keys in one chunk's context: ``chunk + context_left - 1 + context_right``."""
        return self.attention_chunk_size + self.max_past_horizon + self.attention_context_right

    @property
    def subsampled_mel_bins(self) -> int:
        """Mel bins the subsampling projection expects after its two convolutions: ``channels[0] // 4``."""
        return self.subsampling_conv_channels[0] // 4
