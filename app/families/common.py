"""Weight-map pieces shared by families whose text decoders use the common Hugging Face layer layout."""

from __future__ import annotations

from common.weights import fused_linear, linear, plain, prefixed, stacked_linear
from decoder.config import DecoderConfig

LLAMA_NORMS = {"attn_norm_in": "input_layernorm", "mlp_norm_in": "post_attention_layernorm"}
GEMMA_NORMS = {"attn_norm_in": "input_layernorm", "attn_norm_out": "post_attention_layernorm",
               "mlp_norm_in": "pre_feedforward_layernorm", "mlp_norm_out": "post_feedforward_layernorm"}


def decoder_weight_map(cfg: DecoderConfig, prefix: str, *, norms: dict[str, str], lm_head: str | None) -> dict:
    """Decoder parameter paths (relative to the model's ``decoder``) -> tensors ``{prefix}layers.{i}....``.

    norms: our layer norm names -> the checkpoint's. lm_head: key prefix of an untied output projection.
    """
    wm = {("embedder", "embedding"): plain(f"{prefix}embed_tokens.weight"),
          ("final_norm", "weight"): plain(f"{prefix}norm.weight")}
    if not cfg.tie_embeddings:
        if lm_head is None:
            raise ValueError("an untied decoder needs the lm_head key prefix")
        wm[("embedder", "lm_head")] = linear(lm_head)
    for i in range(cfg.num_layers):
        p = f"{prefix}layers.{i}."
        layer = {(ours, "weight"): plain(f"{p}{theirs}.weight") for ours, theirs in norms.items()}
        qkv = [f"{p}self_attn.{proj}" for proj in ("q_proj", "k_proj", "v_proj")]
        layer[("attn", "qkv_proj", "kernel")] = fused_linear(qkv)
        layer[("attn", "o_proj", "kernel")] = linear(f"{p}self_attn.o_proj")
        if cfg.attention_bias:
            layer[("attn", "qkv_proj", "bias")] = fused_linear(qkv, "bias")
            layer[("attn", "o_proj", "bias")] = plain(f"{p}self_attn.o_proj.bias")
        if cfg.qk_norm:
            for norm in ("q_norm", "k_norm"):
                layer[("attn", norm, "weight")] = plain(f"{p}self_attn.{norm}.weight")
        if cfg.mlp_type(i) == "moe":
            experts = [f"{p}mlp.experts.{e}" for e in range(cfg.num_experts)]
            layer[("mlp", "router")] = linear(f"{p}mlp.gate")
            for proj in ("gate_proj", "up_proj", "down_proj"):
                layer[("mlp", proj)] = stacked_linear([f"{x}.{proj}" for x in experts])
        else:
            layer[("mlp", "gate_up_proj", "kernel")] = fused_linear([f"{p}mlp.gate_proj", f"{p}mlp.up_proj"])
            layer[("mlp", "down_proj", "kernel")] = linear(f"{p}mlp.down_proj")
        wm.update(prefixed(layer, ("layers", i)))
    return wm
