"""The decoder described as data: one frozen ``LayerSpec`` per layer, filled in by a family from its HF config.

A layer is an attention block (what it attends to, how positions enter, its own head counts and norms, whose
keys/values it uses) and a feed-forward block (dense or mixture of experts), wired by a named block type
(decoder/blocks.py). Nothing here knows a family: a family writes its layers as data, and a genuinely new block,
router or per-layer input is a type the family adds to the decoder's parts (decoder/parts.py) under the name its
specs use; its settings are a frozen dataclass of its own (``LayerSpec.options``, ``LayerInputsSpec.options``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

ATTENTION_KINDS = ("full", "sliding", "chunked")
QK_NORMS = ("none", "rms", "l2")
ROPE_KINDS = ("default", "linear", "llama3", "proportional")


@dataclasses.dataclass(frozen=True)
class RopeSpec:
    """Rotary position embedding of one layer.

    kind: "default"; "linear" (inv_freq / factor); "llama3" (frequency-dependent scaling with ``low_freq_factor``,
        ``high_freq_factor``, ``original_max_position``); "proportional" (only the first ``fraction`` of the
        frequency pairs rotate, the rest have frequency 0).
    interleaved: rotate the pairs (2j, 2j+1) as complex numbers (Llama 4) instead of the halves (j, j + H/2).
    mrope_section: for 3-D (t, h, w) positions, frequencies per axis, interleaved: index i uses h if i % 3 == 1
        and i < 3 * section[1], w if i % 3 == 2 and i < 3 * section[2], else t.
    """

    theta: float = 10_000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    fraction: float = 1.0
    interleaved: bool = False
    mrope_section: tuple[int, int, int] | None = None

    def __post_init__(self):
        if self.kind not in ROPE_KINDS:
            raise ValueError(f"unknown RoPE kind {self.kind!r}; known: {ROPE_KINDS}")
        if not (self.theta > 0 and self.factor > 0 and 0 <= self.fraction <= 1):
            raise ValueError(f"bad RoPE settings {self}")

    def inverse_frequencies(self, head_dim: int) -> np.ndarray:
        """inv_freq [head_dim // 2] in float32, as transformers computes it for this kind."""
        half = head_dim // 2
        if self.kind == "proportional":
            rotated = int(self.fraction * head_dim // 2)
            exps = np.arange(0, 2 * rotated, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
            inv = (1.0 / (np.float32(self.theta) ** exps)).astype(np.float32)
            inv = np.concatenate([inv, np.zeros(half - rotated, np.float32)])
            return (inv / np.float32(self.factor)).astype(np.float32)
        exps = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
        inv = (1.0 / (np.float32(self.theta) ** exps)).astype(np.float32)
        if self.kind == "linear":
            inv = (inv / np.float32(self.factor)).astype(np.float32)
        elif self.kind == "llama3":
            inv = _llama3_scaled(inv, self)
        return inv


def _llama3_scaled(inv_freq: np.ndarray, rope: RopeSpec) -> np.ndarray:
    """Llama 3.1 frequency scaling: long wavelengths / factor, short ones kept, smooth in between."""
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class MaskSpec:
    """Which keys a query sees (every kind is causal; positions are sequence positions).

    kind: "full"; "sliding" (q - size < k <= q: ``size`` keys including itself); "chunked" (same
        floor(pos / size) and k <= q).
    media_bidirectional: tokens of one media block also see the block's later tokens on this layer
        (AND-ed with the sliding window / chunk, as transformers composes them).
    """

    kind: str = "full"
    size: int | None = None
    media_bidirectional: bool = False

    def __post_init__(self):
        if self.kind not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention kind {self.kind!r}; known: {ATTENTION_KINDS}")
        if (self.kind == "full") != (self.size is None):
            raise ValueError(f"{self.kind} attention {'needs' if self.size is None else 'takes no'} a size")
        if self.size is not None and self.size < 1:
            raise ValueError(f"attention window/chunk must be >= 1, got {self.size}")

    @property
    def local(self) -> bool:
        """True when a query sees at most ``size`` earlier keys (its cache can be a ring of ``size`` slots)."""
        return self.kind != "full"


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """One layer's attention.

    qk_norm: "none"; "rms" (weighted RMSNorm of each head of q and k, before RoPE); "l2" (weightless RMS
        normalisation after RoPE, Llama 4). v_norm: weightless RMS normalisation of v.
    k_eq_v: no v projection; v is the k projection's output (before the k norm and RoPE).
    scale: the q.k multiplier. softcap: tanh soft cap of the scores.
    temperature: (floor_scale, attn_scale): q *= log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1.
    kv_source: index of an earlier layer whose keys/values this layer uses (it projects and caches none).
    kv_repeat: each kv head is held this many times (so a model axis larger than the kv heads still splits
        whole heads; set by ``with_kv_repeat`` when the model is placed on a mesh).
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    mask: MaskSpec = MaskSpec()
    rope: RopeSpec | None = RopeSpec()
    qk_norm: str = "none"
    v_norm: bool = False
    k_eq_v: bool = False
    scale: float | None = None
    softcap: float | None = None
    temperature: tuple[float, float] | None = None
    kv_source: int | None = None
    bias: bool = False
    kv_repeat: int = 1

    def __post_init__(self):
        for name in ("num_heads", "num_kv_heads", "head_dim", "kv_repeat"):
            if getattr(self, name) < 1:
                raise ValueError(f"attention {name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % (self.num_kv_heads * self.kv_repeat):
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads} "
                             f"x kv_repeat {self.kv_repeat}")
        if self.qk_norm not in QK_NORMS:
            raise ValueError(f"unknown qk_norm {self.qk_norm!r}; known: {QK_NORMS}")
        if self.rope is not None and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")

    @property
    def kv_heads(self) -> int:
        """kv heads as held (after repetition)."""
        return self.num_kv_heads * self.kv_repeat

    @property
    def group(self) -> int:
        """query heads per held kv head."""
        return self.num_heads // self.kv_heads

    @property
    def q_scale(self) -> float:
        return self.scale if self.scale is not None else self.head_dim ** -0.5


@dataclasses.dataclass(frozen=True)
class FeedForwardSpec:
    """kind: "dense" (gated MLP of width ``intermediate``) or "moe" (``num_experts`` gated experts of width
    ``intermediate``, ``top_k`` per token chosen by the named ``router``, plus a shared gated MLP of width
    ``shared_intermediate`` when > 0; with ``shared_gate`` the shared MLP's output is scaled per token by
    sigmoid(x . w) of a learned [1, embed] gate)."""

    kind: str = "dense"
    intermediate: int = 0
    activation: str = "silu"
    num_experts: int = 0
    top_k: int = 0
    router: str = "softmax"
    renormalize: bool = True
    shared_intermediate: int = 0
    shared_gate: bool = False

    def __post_init__(self):
        if self.kind not in ("dense", "moe"):
            raise ValueError(f"unknown feed-forward kind {self.kind!r}")
        if self.intermediate < 1:
            raise ValueError(f"feed-forward width must be >= 1, got {self.intermediate}")
        if self.kind == "moe" and not (1 <= self.top_k <= self.num_experts):
            raise ValueError(f"MoE needs 1 <= top_k <= num_experts, got {self.top_k} of {self.num_experts}")
        if self.shared_gate and not self.shared_intermediate:
            raise ValueError("a shared-expert gate needs a shared expert (shared_intermediate > 0)")


def check_options(options: Any, owner: str) -> None:
    """Settings of a block or provider type are a frozen dataclass (hashable: specs are static jit arguments) or
    None."""
    if options is None:
        return
    params = getattr(options, "__dataclass_params__", None)
    if isinstance(options, type) or params is None or not params.frozen:
        raise TypeError(f"{owner} options must be a frozen dataclass instance or None, got {options!r}")
    hash(options)  # a field that is not hashable fails here, not inside jit


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: its attention, its feed-forward and the named block type wiring them.

    options: the block type's own settings (a frozen dataclass that block type defines and reads), or None.
    """

    attention: AttentionSpec
    ffn: FeedForwardSpec
    block: str = "pre_norm"
    options: Any = None

    def __post_init__(self):
        check_options(self.options, f"block {self.block!r}")


@dataclasses.dataclass(frozen=True)
class LayerInputsSpec:
    """A per-layer input provider: its type's name and its own settings (a frozen dataclass it defines)."""

    kind: str
    options: Any = None

    def __post_init__(self):
        check_options(self.options, f"per-layer input {self.kind!r}")


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
    """The whole text decoder.

    norm_plus_one: RMSNorm scales by (1 + w) (Gemma 3) instead of w. embed_scale: token embeddings (not media
    features) are multiplied by it. deepstack_layers: extra media feature maps are added after layers
    0..deepstack_layers-1. layer_inputs: a per-layer input provider (e.g. per-layer token embeddings) and its
    settings, or None. embed_substitutes: (token id, id whose embedding row it reads) pairs, for token ids
    the reference embeds as another token (e.g. a media placeholder read as the pad token when the model itself
    generates it).
    """

    vocab_size: int
    hidden_size: int
    layers: tuple[LayerSpec, ...]
    rms_norm_eps: float = 1e-6
    norm_plus_one: bool = False
    embed_scale: float = 1.0
    final_logit_softcap: float | None = None
    tie_embeddings: bool = True
    deepstack_layers: int = 0
    layer_inputs: LayerInputsSpec | None = None
    embed_substitutes: tuple[tuple[int, int], ...] = ()

    def __post_init__(self):
        if not self.layers:
            raise ValueError("a decoder needs at least one layer")
        for i, layer in enumerate(self.layers):
            src = layer.attention.kv_source
            if src is None:
                continue
            if not 0 <= src < i:
                raise ValueError(f"layer {i} takes keys/values from layer {src}, which is not an earlier layer")
            donor = self.layers[src].attention
            if donor.kv_source is not None:
                raise ValueError(f"layer {i} takes keys/values from layer {src}, which has none of its own")
            mine = layer.attention
            if (donor.kv_heads, donor.head_dim, donor.mask) != (mine.kv_heads, mine.head_dim, mine.mask):
                raise ValueError(f"layer {i} shares keys/values with layer {src} but differs in kv heads, head_dim "
                                 f"or attention kind")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def rope_axes(self) -> int:
        """1 for ordinary positions, 3 for (t, h, w) multimodal positions."""
        return 3 if any(l.attention.rope and l.attention.rope.mrope_section for l in self.layers) else 1

    @property
    def sliding_window(self) -> int | None:
        """The largest sliding window of any layer (None when no layer slides)."""
        return max((l.attention.mask.size for l in self.layers if l.attention.mask.kind == "sliding"), default=None)

    def owns_kv(self, i: int) -> bool:
        return self.layers[i].attention.kv_source is None

    def kv_layer(self, i: int) -> int:
        """The layer whose keys/values layer ``i`` attends to (itself unless it shares)."""
        src = self.layers[i].attention.kv_source
        return i if src is None else src

    @property
    def last_kv_layer(self) -> int:
        """The last layer that computes keys/values of its own: later layers need only the positions whose
        outputs are wanted."""
        return max(i for i in range(self.num_layers) if self.owns_kv(i))

    def with_kv_repeat(self, model_axis: int) -> "DecoderSpec":
        """This spec with kv heads repeated so that ``model_axis`` shards each hold whole kv heads (and their
        query heads): a layer with fewer kv heads than shards holds each head model_axis / kv_heads times."""
        layers = []
        for layer in self.layers:
            att = layer.attention
            repeat = 1
            if model_axis > att.num_kv_heads and model_axis % att.num_kv_heads == 0 and \
                    att.num_heads % model_axis == 0:
                repeat = model_axis // att.num_kv_heads
            layers.append(dataclasses.replace(layer, attention=dataclasses.replace(att, kv_repeat=repeat)))
        return dataclasses.replace(self, layers=tuple(layers))
