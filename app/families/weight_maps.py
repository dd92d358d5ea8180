"""Weight-map pieces shared by families whose text decoders use the common Hugging Face layer layout."""

from __future__ import annotations

from typing import Callable

from omnijax.common.weights import TensorSpec, linear, plain, prefixed, stacked_linear
from omnijax.decoder.attention import grouped_qkv
from omnijax.decoder.spec import DecoderSpec, LayerSpec

LLAMA_NORMS = {"attn_norm_in": "input_layernorm", "mlp_norm_in": "post_attention_layernorm"}
GEMMA_NORMS = {"attn_norm_in": "input_layernorm", "attn_norm_out": "post_attention_layernorm",
               "mlp_norm_in": "pre_feedforward_layernorm", "mlp_norm_out": "post_feedforward_layernorm"}


def qkv_map(spec: DecoderSpec, i: int, attn_prefix: str) -> dict:
    """The fused per-kv-head q/k/v kernel (and bias) of layer ``i`` from ``{attn_prefix}{q,k,v}_proj``."""
    att = spec.layers[i].attention
    names = ["q_proj"] if att.kv_source is not None else ["q_proj", "k_proj"] if att.k_eq_v else \
        ["q_proj", "k_proj", "v_proj"]
    regroup, ungroup = grouped_qkv(att)
    out = {("attn", "qkv"): TensorSpec(tuple(f"{attn_prefix}{n}.weight" for n in names), concat_axis=0,
                                       fn=regroup, inverse=ungroup)}
    if att.bias:
        out[("attn", "qkv_bias")] = TensorSpec(tuple(f"{attn_prefix}{n}.bias" for n in names), concat_axis=0,
                                               fn=regroup, inverse=ungroup)
        out[("attn", "o_proj", "bias")] = plain(f"{attn_prefix}o_proj.bias")
    out[("attn", "o_proj", "kernel")] = linear(f"{attn_prefix}o_proj")
    return out


def interleave_gate_up(stacked_2ID):
    """[2, I, D] (gate, up) -> [I, 2, D]: row i's gate and up projections side by side (GatedMLP's layout); its own
    inverse."""
    return stacked_2ID.transpose(1, 0, 2)


def gated_mlp_map(prefix: str, gate: str = "gate_proj", up: str = "up_proj", down: str = "down_proj") -> dict:
    """A GatedMLP (paths relative to it) from separate torch gate / up / down Linear weights."""
    return {("gate_up_proj",): TensorSpec((f"{prefix}{gate}.weight", f"{prefix}{up}.weight"),
                                          fn=interleave_gate_up, inverse=interleave_gate_up),
            ("down_proj", "kernel"): linear(f"{prefix}{down}")}


def feed_forward_map(layer: LayerSpec, p: str) -> dict:
    """A layer's feed-forward (paths relative to its ``mlp``) <- ``{p}mlp.*``: a gated MLP, or experts
    ``{p}mlp.experts.{e}.*`` routed by ``{p}mlp.gate``."""
    if layer.ffn.kind != "moe":
        return gated_mlp_map(f"{p}mlp.")
    experts = [f"{p}mlp.experts.{e}" for e in range(layer.ffn.num_experts)]
    out = {("router", "weight"): linear(f"{p}mlp.gate")}
    for proj in ("gate_proj", "up_proj", "down_proj"):
        out[(proj,)] = stacked_linear([f"{x}.{proj}" for x in experts])
    return out


def decoder_weight_map(spec: DecoderSpec, prefix: str, *, norms: dict[str, str], lm_head: str | None,
                       feed_forward: Callable[[LayerSpec, str], dict] = feed_forward_map) -> dict:
    """Decoder parameter paths (relative to the model's ``decoder``) -> tensors ``{prefix}layers.{i}....``.

    norms: our layer norm names -> the checkpoint's. lm_head: key prefix of an untied output projection.
    feed_forward: (layer spec, layer key prefix ``{prefix}layers.{i}.``) -> the layer's feed-forward tensors, paths
    relative to its ``mlp`` (default ``feed_forward_map``).
    """
    wm = {("embedder", "embedding"): plain(f"{prefix}embed_tokens.weight"),
          ("final_norm", "weight"): plain(f"{prefix}norm.weight")}
    if not spec.tie_embeddings:
        if lm_head is None:
            raise ValueError("an untied decoder needs the lm_head key prefix")
        wm[("embedder", "lm_head")] = linear(lm_head)
    for i, layer_spec in enumerate(spec.layers):
        p = f"{prefix}layers.{i}."
        layer = {(ours, "weight"): plain(f"{p}{theirs}.weight") for ours, theirs in norms.items()}
        layer.update(qkv_map(spec, i, f"{p}self_attn."))
        if layer_spec.attention.qk_norm == "rms":
            layer[("attn", "q_norm", "weight")] = plain(f"{p}self_attn.q_norm.weight")
            if layer_spec.attention.kv_source is None:
                layer[("attn", "k_norm", "weight")] = plain(f"{p}self_attn.k_norm.weight")
        layer.update(prefixed(feed_forward(layer_spec, p), ("mlp",)))
        wm.update(prefixed(layer, ("layers", i)))
    return wm
