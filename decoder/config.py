"""Frozen configuration of the text decoder. Families translate their HF config into this (see app/families)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one layer type.

    kind: "default" or "linear" (inv_freq / factor).
    theta: base of the frequencies.
    factor: linear scaling factor (1.0 = none).
    mrope_section: for 3-D (t, h, w) positions, the number of frequencies per axis; frequencies are interleaved:
        index i uses h if i % 3 == 1 and i < 3 * section[1], w if i % 3 == 2 and i < 3 * section[2], else t.
    """

    theta: float = 10_000.0
    kind: str = "default"
    factor: float = 1.0
    mrope_section: tuple[int, int, int] | None = None


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Everything the decoder stack needs; one instance describes one checkpoint's text model.

    layer_types: one entry per layer, "sliding" or "full".
    rope: RoPE settings per layer type (a tuple of (layer_type, RopeConfig) pairs, hashable).
    bidirectional_layer_types: layer types on which tokens of one media block attend to each other both ways.
    norm_plus_one: RMSNorm scales by (1 + w) instead of w.
    embed_scale: token embeddings are multiplied by this (Gemma: sqrt(hidden)); media features are not.
    attn_scale: softmax scale applied to q.k (Gemma 3: query_pre_attn_scalar ** -0.5).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    rope: tuple[tuple[str, RopeConfig], ...]
    sliding_window: int | None = None
    rms_norm_eps: float = 1e-6
    norm_plus_one: bool = False
    qk_norm: bool = False
    sandwich_norm: bool = False
    activation: str = "gelu_tanh"
    embed_scale: float = 1.0
    attn_scale: float | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    tie_embeddings: bool = True
    bidirectional_layer_types: frozenset[str] = frozenset()
    mlp_types: tuple[str, ...] | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    deepstack_layers: int = 0
    attention_bias: bool = False

    def __post_init__(self):
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"{len(self.layer_types)} layer types for {self.num_layers} layers")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.mlp_types is not None and len(self.mlp_types) != self.num_layers:
            raise ValueError(f"{len(self.mlp_types)} MLP types for {self.num_layers} layers")
        if "moe" in (self.mlp_types or ()) and not (self.num_experts and self.num_experts_per_tok):
            raise ValueError("MoE layers need num_experts and num_experts_per_tok")
        missing = set(self.layer_types) - set(dict(self.rope))
        if missing:
            raise ValueError(f"no RoPE settings for layer types {sorted(missing)}")

    @property
    def rope_by_type(self) -> dict[str, RopeConfig]:
        return dict(self.rope)

    @property
    def rope_axes(self) -> int:
        """1 for ordinary positions, 3 for (t, h, w) multimodal positions."""
        return 3 if any(r.mrope_section for _, r in self.rope) else 1

    def mlp_type(self, layer: int) -> str:
        return "dense" if self.mlp_types is None else self.mlp_types[layer]

    @property
    def scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim ** -0.5

    def window_of(self, layer_type: str) -> int | None:
        return self.sliding_window if layer_type == "sliding" else None
