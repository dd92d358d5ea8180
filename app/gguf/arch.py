"""How a GGUF architecture becomes a checkpoint omnijax reads, described as data.

A family that reads GGUF files gives a ``GGUFArch`` (e.g. ``app/families/gemma3/spec.py``'s ``GGUF``): the GGUF
architecture name, a function from the file's metadata to the Hugging Face ``config.json`` of the model it
holds, and the per-tensor transforms that undo what llama.cpp's converter (convert_hf_to_gguf.py) did to a
tensor. Tensor names need no table: the ``gguf`` package's ``TensorNameMap`` for the architecture already
knows every Hugging Face spelling of every GGUF tensor (``model.layers.3.self_attn.q_proj`` ->
``blk.3.attn_q``), and transformers maps names the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable

import numpy as np

from omnijax.common.errors import CheckpointError

_MISSING = object()


class GGUFMetadata:
    """A GGUF file's metadata with lookups that name the file and key when a required value is missing.

    tensor_shapes: GGUF tensor name -> shape (numpy order), for what the metadata leaves implicit (the
    vocabulary size, whether the output projection is tied to the embedding).
    """

    def __init__(self, metadata: dict, tensor_shapes: dict[str, tuple[int, ...]], path):
        self.metadata = metadata
        self.tensor_shapes = tensor_shapes
        self.path = path
        self.architecture = metadata.get("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise CheckpointError(f"{self.path} has no {key!r} in its metadata")
        return self.metadata[key]

    def arch(self, suffix: str, default: Any = _MISSING) -> Any:
        """The architecture's own key ``{architecture}.{suffix}`` (e.g. ``gemma3.block_count``)."""
        key = f"{self.architecture}.{suffix}"
        if default is _MISSING:
            return self.require(key)
        return self.metadata.get(key, default)

    def has_tensor(self, name: str) -> bool:
        return name in self.tensor_shapes


# llama.cpp metadata key (after "{architecture}.") -> Hugging Face config key, for the keys every decoder-only
# architecture writes with the same meaning (transformers' integrations/ggml.py GGUF_CONFIG_MAPPING).
LLAMA_CPP_CONFIG_KEYS = (
    ("context_length", "max_position_embeddings"),
    ("embedding_length", "hidden_size"),
    ("block_count", "num_hidden_layers"),
    ("feed_forward_length", "intermediate_size"),
    ("attention.head_count", "num_attention_heads"),
    ("attention.head_count_kv", "num_key_value_heads"),
    ("attention.key_length", "head_dim"),
    ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
    ("attention.sliding_window", "sliding_window"),
)
REQUIRED_CONFIG_KEYS = ("embedding_length", "block_count", "feed_forward_length", "attention.head_count")


def _plain(value: Any) -> Any:
    """numpy scalars and arrays of the metadata -> JSON-like Python values."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def end_token_ids(meta: GGUFMetadata) -> list[int]:
    """The ids that end generation: llama.cpp's end-of-generation set (eos, end-of-turn, end-of-message)."""
    ids = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = meta.get(key)
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    return ids


def common_hf_config(meta: GGUFMetadata) -> dict:
    """The part of a Hugging Face config every llama.cpp decoder file states the same way: sizes, norm epsilon,
    sliding window, vocabulary size, tied output, special token ids."""
    for suffix in REQUIRED_CONFIG_KEYS:
        meta.arch(suffix)
    config = {}
    for suffix, hf_key in LLAMA_CPP_CONFIG_KEYS:
        value = meta.arch(suffix, None)
        if value is not None:
            config[hf_key] = _plain(value)
    for hf_key in ("intermediate_size", "num_key_value_heads"):
        if isinstance(config.get(hf_key), list):
            values = set(config[hf_key])
            if len(values) != 1:
                raise CheckpointError(f"{meta.path}: per-layer {hf_key} {config[hf_key]} is not supported for "
                                      f"architecture {meta.architecture!r}")
            config[hf_key] = values.pop()
    tokens = meta.get("tokenizer.ggml.tokens")
    embed = meta.tensor_shapes.get("token_embd.weight")
    vocab = meta.arch("vocab_size", None) or (embed[0] if embed else None) or (len(tokens) if tokens is not None else None)
    if vocab is None:
        raise CheckpointError(f"{meta.path} states no vocabulary size and has no token_embd.weight tensor")
    config["vocab_size"] = int(vocab)
    config["tie_word_embeddings"] = not meta.has_tensor("output.weight")
    ends = end_token_ids(meta)
    if ends:
        config["eos_token_id"] = ends[0] if len(ends) == 1 else ends
    for key, hf_key in (("bos_token_id", "bos_token_id"), ("padding_token_id", "pad_token_id")):
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is not None:
            config[hf_key] = int(value)
    return config


# ---- per-tensor transforms: (float32 array, Hugging Face config) -> array --------------------------------------

def subtract_one(x: np.ndarray, config: dict) -> np.ndarray:
    """Gemma RMSNorm weights: llama.cpp stores 1 + w (its norm multiplies by the weight), transformers keeps w."""
    return x - np.float32(1.0)


def unpermute_rotary_rows(x: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation for Llama-style (rotate_half) RoPE.

    convert_hf_to_gguf.py stores each head's rows [first half, second half] interleaved (row pairs 2j, 2j + 1
    hold rows j and j + half) so that ggml can rotate adjacent pairs; this puts them back.
    """
    rows = x.shape[0]
    if rows % (2 * heads):
        raise CheckpointError(f"{rows} rows cannot be split into {heads} heads of rotary pairs")
    return x.reshape(heads, rows // heads // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def unpermute_query(x: np.ndarray, config: dict) -> np.ndarray:
    return unpermute_rotary_rows(x, config["num_attention_heads"])


def unpermute_key(x: np.ndarray, config: dict) -> np.ndarray:
    return unpermute_rotary_rows(x, config.get("num_key_value_heads") or config["num_attention_heads"])


@dataclasses.dataclass(frozen=True)
class GGUFArch:
    """One GGUF architecture as omnijax reads it.

    architecture: the file's ``general.architecture`` (a ``gguf.MODEL_ARCH_NAMES`` value, e.g. "gemma3").
    hf_config: GGUFMetadata -> the Hugging Face config dict of the model the file holds; its ``model_type``
        selects the family spec (the text-only class for files that hold a text decoder).
    transforms: (regex searched in the Hugging Face tensor key, transform) pairs applied in float32 after
        dequantization (every matching transform, in order).
    ignored: regexes of GGUF tensor names the model does not use (e.g. precomputed RoPE tables).
    """

    architecture: str
    hf_config: Callable[[GGUFMetadata], dict]
    transforms: tuple[tuple[str, Callable[[np.ndarray, dict], np.ndarray]], ...] = ()
    ignored: tuple[str, ...] = ()

    def transforms_for(self, hf_key: str) -> list[Callable[[np.ndarray, dict], np.ndarray]]:
        return [fn for pattern, fn in self.transforms if re.search(pattern, hf_key)]


@functools.lru_cache(maxsize=None)
def _name_map(architecture: str, num_layers: int):
    import gguf

    arch = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == architecture), None)
    if arch is None:
        raise CheckpointError(f"the installed gguf package does not know architecture {architecture!r}")
    return gguf.get_tensor_name_map(arch, num_layers)


def gguf_tensor_name(architecture: str, num_layers: int, hf_key: str) -> str | None:
    """The GGUF name of the Hugging Face tensor ``hf_key`` (``model.layers.3.self_attn.q_proj.weight`` ->
    ``blk.3.attn_q.weight``), or None if the architecture has no such tensor."""
    stem, suffix = hf_key, ""
    for ending in (".weight", ".bias"):
        if hf_key.endswith(ending):
            stem, suffix = hf_key[:-len(ending)], ending
    name = _name_map(architecture, num_layers).get_name(stem)
    return None if name is None else name + suffix
