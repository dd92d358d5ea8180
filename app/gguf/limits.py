"""Bounds on a GGUF file's metadata, checked before an architecture turns it into a config (before any value is
used in arithmetic, a loop or an allocation).

The sizes a llama.cpp key states are bounded as the config.json key it becomes (app/config_limits.py: a block
count of 2**31 is refused like ``num_hidden_layers`` = 2**31, a head count of 0 like ``num_attention_heads`` = 0);
every other number of the architecture's own keys must at least be finite; the tokenizer's vocabulary and merges
are bounded before transformers builds a tokenizer from them.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from omnijax.app.config_limits import FLOAT_LIMITS, INT_LIMITS, TOKEN_ID_LIMIT
from omnijax.app.gguf.arch import LLAMA_CPP_CONFIG_KEYS, GGUFMetadata
from omnijax.common.errors import CheckpointError
from omnijax.preprocess.tokenizer import MAX_VOCAB

# llama.cpp key (after "{architecture}.") -> the config.json key whose bounds apply to it
BOUNDED_KEYS: dict[str, str] = dict(LLAMA_CPP_CONFIG_KEYS) | {
    "vocab_size": "vocab_size",
    "attention.value_length": "head_dim",
    "attention.sliding_window_pattern": "sliding_window_pattern",
    "rope.freq_base": "rope_theta",
    "rope.freq_base_swa": "rope_theta",
    "rope.scaling.factor": "factor",
    "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
}
MAX_ARCH_ARRAY = 1 << 16  # elements of an array under the architecture's keys (per-layer values: at most 1024)
MAX_MERGES = 1 << 21  # BPE merges (real: ~500k)
MAX_ATTENTION_SCALE = 1e3


def _numbers(value) -> list:
    if isinstance(value, np.ndarray):
        return value.reshape(-1).tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value.item() if isinstance(value, np.generic) else value]


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _check_key(meta: GGUFMetadata, key: str, suffix: str, value) -> None:
    where = f"{meta.path}: metadata {key}"
    if isinstance(value, np.ndarray) and value.size > MAX_ARCH_ARRAY:
        raise CheckpointError(f"{where} holds {value.size} values; at most {MAX_ARCH_ARRAY}")
    hf_key = BOUNDED_KEYS.get(suffix)
    values = _numbers(value) if not isinstance(value, str) else []
    if hf_key in INT_LIMITS:
        lo, hi = INT_LIMITS[hf_key]
        if suffix == "attention.sliding_window_pattern" and isinstance(value, np.ndarray) and value.dtype == bool:
            return  # a per-layer list of flags
        for v in values or [value]:
            if not _is_int(v) or not lo <= v <= hi:
                raise CheckpointError(f"{where} = {str(value)[:60]} is not usable (an integer in [{lo}, {hi}], as "
                                      f"config.json's {hf_key})")
    elif hf_key in FLOAT_LIMITS or suffix == "attention.scale":
        lo, hi = FLOAT_LIMITS.get(hf_key, (0.0, MAX_ATTENTION_SCALE))
        for v in values or [value]:
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not lo < v <= hi:
                raise CheckpointError(f"{where} = {str(value)[:60]} is not usable (a number in ({lo:g}, {hi:g}])")
    else:
        for v in values:
            if isinstance(v, float) and not math.isfinite(v):
                raise CheckpointError(f"{where} = {str(value)[:60]} is not a finite number")


def check_gguf_metadata(meta: GGUFMetadata) -> None:
    """CheckpointError naming the file and the first metadata value out of its bounds (module docstring)."""
    prefix = f"{meta.architecture}."
    for key, value in meta.metadata.items():
        if key.startswith(prefix):
            _check_key(meta, key, key[len(prefix):], value)
    for key in ("bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "padding_token_id",
                "unknown_token_id"):
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is not None and (not _is_int(value) or not 0 <= value < TOKEN_ID_LIMIT):
            raise CheckpointError(f"{meta.path}: metadata tokenizer.ggml.{key} = {str(value)[:40]} is not a token id")
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) > MAX_VOCAB:
        raise CheckpointError(f"{meta.path} holds a vocabulary of {len(tokens)} tokens; at most {MAX_VOCAB} are "
                              f"accepted")
    merges = meta.get("tokenizer.ggml.merges")
    if merges is not None and len(merges) > MAX_MERGES:
        raise CheckpointError(f"{meta.path} holds {len(merges)} merges; at most {MAX_MERGES} are accepted")
