"""Sane bounds on a checkpoint's config.json, checked on the raw dict before any family builds anything.

A hostile or broken config must fail fast with a CheckpointError naming the value, not allocate memory (a billion
image tokens), hang (a million layers to trace) or fail later with an unrelated message (zero attention heads
reported by the tokenizer). The checks are generic: every dict in the config (text_config, vision_config,
thinker_config, rope_parameters, ...) is searched for the keys below, whatever the family.

The bounds are far beyond any published checkpoint (the largest of each is noted) and far below what would
exhaust a machine while building the model's shapes.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from omnijax.common.errors import CheckpointError
from omnijax.preprocess.tokenizer import MAX_VOCAB

# key -> (smallest, largest) for integer settings
INT_LIMITS: dict[str, tuple[int, int]] = {
    # layers (real: 126)
    "num_hidden_layers": (1, 1024), "num_layers": (1, 1024), "encoder_layers": (1, 1024), "depth": (1, 1024),
    "decoder_layers": (1, 1024),
    # widths (real: 16384 hidden, 53248 intermediate)
    "hidden_size": (1, 65536), "d_model": (1, 65536), "embed_dim": (1, 65536), "out_hidden_size": (1, 65536),
    "output_dim": (1, 65536), "projection_dim": (1, 65536), "vision_output_dim": (1, 65536),
    "intermediate_size": (0, 1 << 20), "moe_intermediate_size": (0, 1 << 20),
    "shared_expert_intermediate_size": (0, 1 << 20), "intermediate_size_mlp": (0, 1 << 20),
    "encoder_ffn_dim": (0, 1 << 20),
    # attention (real: 128 heads, head_dim 256)
    "num_attention_heads": (1, 1024), "num_heads": (1, 1024), "encoder_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024), "head_dim": (1, 4096),
    # vocabulary and context (real: 262208 tokens, 10M positions)
    "vocab_size": (1, MAX_VOCAB), "max_position_embeddings": (1, 1 << 24), "sliding_window": (1, 1 << 24),
    "sliding_window_pattern": (1, 1024), "_sliding_window_pattern": (1, 1024), "attention_chunk_size": (1, 1 << 24),
    # media (real: 256 .. 1120 image tokens, 896 px images, 14-16 px patches)
    "mm_tokens_per_image": (1, 16384), "image_size": (1, 16384), "patch_size": (1, 1024),
    "spatial_merge_size": (1, 64), "temporal_patch_size": (1, 64), "num_channels": (1, 16),
    "num_mel_bins": (1, 1024), "max_source_positions": (1, 1 << 20), "n_window": (1, 1 << 16),
    "n_window_infer": (1, 1 << 20), "downsample_hidden_size": (1, 65536),
    # mixture of experts (real: 512 experts, 10 per token)
    "num_experts": (0, 4096), "num_local_experts": (0, 4096), "n_routed_experts": (0, 4096),
    "num_experts_per_tok": (0, 4096), "decoder_sparse_step": (1, 1024), "interleave_moe_layer_step": (1, 1024),
}
# keys whose value is an integer list, with bounds per element
INT_LIST_LIMITS: dict[str, tuple[int, int]] = {
    "mrope_section": (0, 4096), "deepstack_visual_indexes": (0, 1023), "mlp_only_layers": (0, 1023),
    "fullatt_block_indexes": (0, 1023),
}
# key -> (exclusive lower bound, upper bound) for positive real settings
FLOAT_LIMITS: dict[str, tuple[float, float]] = {
    "rms_norm_eps": (0.0, 1.0), "layer_norm_eps": (0.0, 1.0), "rope_theta": (0.0, 1e12),
    "rope_local_base_freq": (0.0, 1e12), "factor": (0.0, 1e6), "query_pre_attn_scalar": (0.0, 1e9),
    "attn_logit_softcapping": (0.0, 1e9), "final_logit_softcapping": (0.0, 1e9),
}
# integer settings that are never null in a usable config (null: left unset by a broken export)
NOT_NULL = frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"})
TOKEN_ID_LIMIT = 1 << 31
MAX_DEPTH = 16


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _fail(where: str, value: Any, expected: str, source: str = "config.json") -> CheckpointError:
    shown = repr(value)
    return CheckpointError(f"{source}: {where} = {shown[:80]}{'...' if len(shown) > 80 else ''} is not "
                           f"usable ({expected})")


def check_token_ids(where: str, value: Any, source: str = "config.json") -> None:
    """CheckpointError unless ``value`` is a token id or a list of at most 1024 (None and -1 allowed: unset)."""
    ids = value if isinstance(value, list) else [value]
    if len(ids) > 1024:
        raise _fail(where, value, "at most 1024 token ids", source)
    for v in ids:
        if v is not None and (not _is_int(v) or not -1 <= v < TOKEN_ID_LIMIT):
            raise _fail(where, value, f"token ids are integers in [0, {TOKEN_ID_LIMIT})", source)



def _check_value(key: str, where: str, value: Any) -> None:
    if key in NOT_NULL and value is None:
        raise _fail(where, value, "it has no value; every model states it")
    if key in INT_LIMITS and value is not None:
        lo, hi = INT_LIMITS[key]
        if not _is_int(value) or not lo <= value <= hi:
            raise _fail(where, value, f"an integer in [{lo}, {hi}]")
    elif key in INT_LIST_LIMITS and value is not None:
        lo, hi = INT_LIST_LIMITS[key]
        if not isinstance(value, list) or len(value) > 1024 or any(not _is_int(v) or not lo <= v <= hi
                                                                   for v in value):
            raise _fail(where, value, f"a list of at most 1024 integers in [{lo}, {hi}]")
    elif key in FLOAT_LIMITS and value is not None:
        lo, hi = FLOAT_LIMITS[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                or not lo < value <= hi:
            raise _fail(where, value, f"a number in ({lo:g}, {hi:g}]")
    elif key.endswith(("_token_id", "_token_index", "_token_ids")) or key in ("eos_token_id", "image_token_index"):
        check_token_ids(where, value)
    elif key.endswith("_config") and value is not None and not isinstance(value, dict):
        raise _fail(where, value, "a JSON object of settings")


def _check_dict(d: dict, where: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise CheckpointError(f"config.json: {where or 'the config'} nests deeper than {MAX_DEPTH} levels")
    for key, value in d.items():
        path = f"{where}.{key}" if where else str(key)
        _check_value(str(key), path, value)
        if isinstance(value, dict):
            _check_dict(value, path, depth + 1)
        elif isinstance(value, list) and len(value) > 1 << 16:
            raise _fail(path, f"[{len(value)} items]", "at most 65536 items")
    _check_consistency(d, where)


def _check_consistency(d: dict, where: str) -> None:
    """Relations between the values of one dict that every family relies on."""
    prefix = f"{where}." if where else ""
    heads, kv_heads = d.get("num_attention_heads"), d.get("num_key_value_heads")
    if _is_int(heads) and _is_int(kv_heads) and heads % kv_heads:
        raise CheckpointError(f"config.json: {prefix}num_attention_heads = {heads} is not a multiple of "
                              f"{prefix}num_key_value_heads = {kv_heads}")
    hidden = d.get("hidden_size")
    if _is_int(heads) and _is_int(hidden) and d.get("head_dim") is None and hidden // heads < 1:
        raise CheckpointError(f"config.json: {prefix}hidden_size = {hidden} is smaller than "
                              f"{prefix}num_attention_heads = {heads} (no head_dim given)")
    layers, layer_types = d.get("num_hidden_layers"), d.get("layer_types")
    if _is_int(layers) and isinstance(layer_types, list) and len(layer_types) != layers:
        raise CheckpointError(f"config.json: {prefix}layer_types lists {len(layer_types)} layers, "
                              f"{prefix}num_hidden_layers is {layers}")
    experts, per_token = d.get("num_experts"), d.get("num_experts_per_tok")
    if _is_int(experts) and _is_int(per_token) and experts > 0 and per_token > experts:
        raise CheckpointError(f"config.json: {prefix}num_experts_per_tok = {per_token} is more than "
                              f"{prefix}num_experts = {experts}")


def check_config_limits(config: Any) -> None:
    """Raise CheckpointError naming the first setting of ``config`` (config.json as a dict) outside its bounds."""
    if not isinstance(config, dict):
        raise CheckpointError(f"config.json must hold a JSON object, got {type(config).__name__}")
    _check_dict(config, "", 0)
