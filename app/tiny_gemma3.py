"""Tiny, complete Gemma 3 checkpoint folders with random weights, built offline and deterministically.

The test suite's parity checks and the benchmarks build their checkpoints with these functions.

The folder has everything a real ``google/gemma-3-4b-it`` folder has, at toy scale: ``config.json``,
``generation_config.json``, safetensors weights (optionally sharded with ``model.safetensors.index.json``), a
``tokenizers`` tokenizer with every Gemma 3 special token the processor and chat template need, the Gemma 3 chat
template and the processor / image-processor settings. It loads with ``transformers`` (``AutoConfig``,
``AutoProcessor``, ``Gemma3ForConditionalGeneration``) and with this package.

Nothing here needs torch: weights are random float32 numpy arrays written with ``safetensors.numpy``, the
tokenizer is a byte-fallback BPE whose merges are learned here from an embedded English text, and every
configuration file is plain JSON laid out the way ``transformers`` 5.23 ``save_pretrained`` writes it.

Vocabulary layout (ids):

* 0 ``<pad>``, 1 ``<eos>``, 2 ``<bos>``, 3 ``<unk>``, 4 ``<mask>``, 5 ``<start_of_turn>``, 6 ``<end_of_turn>``
* 7 .. 262: the 256 byte-fallback tokens ``<0x00>`` .. ``<0xFF>``
* 263 .. 358: base characters (``▁`` for a space, ``\\n``, printable ASCII)
* 359 .. 486: learned merges
* 487 ``<start_of_image>``, 488 ``<end_of_image>``, 489 ``<image_soft_token>`` (the last id)

As in real Gemma 3, the text vocabulary size (the embedding table) is the image soft token's id: the soft token is
a placeholder that never reaches the embedding table.
"""

from __future__ import annotations

import copy
import pathlib
import re


import numpy as np

from app.tiny_gemma3_tokenizer import (  # noqa: F401 (re-exported)
    BOI_TOKEN,
    BOS_TOKEN,
    EOI_TOKEN,
    EOS_TOKEN,
    EOT_TOKEN,
    GEMMA3_CHAT_TEMPLATE,
    IMAGE_TOKEN,
    PAD_TOKEN,
    SOT_TOKEN,
    SPECIAL_TOKEN_IDS,
    UNK_TOKEN,
    _TEXT_VOCAB_SIZE,
    _dump_json,
    build_tokenizer,
    tokenizer_vocab,
    write_tokenizer_and_processor,
)

__all__ = [
    "BOI_TOKEN",
    "BOS_TOKEN",
    "EOI_TOKEN",
    "EOS_TOKEN",
    "EOT_TOKEN",
    "GEMMA3_CHAT_TEMPLATE",
    "IMAGE_TOKEN",
    "PAD_TOKEN",
    "SOT_TOKEN",
    "SPECIAL_TOKEN_IDS",
    "TINY_GEMMA3_CONFIG",
    "TINY_GEMMA3_GENERATION_CONFIG",
    "UNK_TOKEN",
    "build_tiny_gemma3",
    "build_tokenizer",
    "gemma3_weight_shapes",
    "init_std",
    "random_gemma3_weights",
    "tokenizer_vocab",
    "write_generation_config",
    "write_tokenizer_and_processor",
]

# ----------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------

# config.json as transformers 5.23 writes it for this tiny model (Gemma3Config.to_dict() layout).
TINY_GEMMA3_CONFIG: dict = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": SPECIAL_TOKEN_IDS[BOI_TOKEN],
    "dtype": "float32",
    "eoi_token_index": SPECIAL_TOKEN_IDS[EOI_TOKEN],
    "eos_token_id": [SPECIAL_TOKEN_IDS[EOS_TOKEN], SPECIAL_TOKEN_IDS[EOT_TOKEN]],
    "image_token_index": SPECIAL_TOKEN_IDS[IMAGE_TOKEN],
    "initializer_range": 0.02,
    "mm_tokens_per_image": 16,
    "model_type": "gemma3",
    "text_config": {
        "_sliding_window_pattern": 6,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "bos_token_id": SPECIAL_TOKEN_IDS[BOS_TOKEN],
        "eos_token_id": SPECIAL_TOKEN_IDS[EOS_TOKEN],
        "final_logit_softcapping": None,
        "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "max_position_embeddings": 4096,
        "model_type": "gemma3_text",
        "num_attention_heads": 4,
        "num_hidden_layers": 6,
        "num_key_value_heads": 2,
        "pad_token_id": SPECIAL_TOKEN_IDS[PAD_TOKEN],
        "query_pre_attn_scalar": 16,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {"factor": 8.0, "rope_theta": 1000000.0, "rope_type": "linear"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": 16,
        "tie_word_embeddings": True,
        "use_bidirectional_attention": False,
        "use_cache": True,
        "vocab_size": _TEXT_VOCAB_SIZE,
    },
    "tie_word_embeddings": True,
    "transformers_version": "5.23.0",
    "vision_config": {
        "attention_dropout": 0.0,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 32,
        "image_size": 64,
        "intermediate_size": 64,
        "layer_norm_eps": 1e-06,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 4,
        "num_channels": 3,
        "num_hidden_layers": 2,
        "patch_size": 8,
        "vision_use_head": False,
    },
}

# generation_config.json with the token ids and sampling defaults of the instruction-tuned Gemma 3 checkpoints.
TINY_GEMMA3_GENERATION_CONFIG: dict = {
    "bos_token_id": SPECIAL_TOKEN_IDS[BOS_TOKEN],
    "cache_implementation": "hybrid",
    "do_sample": True,
    "eos_token_id": [SPECIAL_TOKEN_IDS[EOS_TOKEN], SPECIAL_TOKEN_IDS[EOT_TOKEN]],
    "pad_token_id": SPECIAL_TOKEN_IDS[PAD_TOKEN],
    "top_k": 64,
    "top_p": 0.95,
    "transformers_version": "5.23.0",
}


def _deep_update(base: dict, overrides: dict) -> dict:
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = copy.deepcopy(v)
    return base


def _resolve_config(config_overrides: dict | None) -> dict:
    config = copy.deepcopy(TINY_GEMMA3_CONFIG)
    if config_overrides:
        _deep_update(config, config_overrides)
        text = config["text_config"]
        # Keep derived fields consistent with what was overridden.
        if "text_config" in config_overrides and "num_hidden_layers" in config_overrides["text_config"] \
                and "layer_types" not in config_overrides["text_config"]:
            pattern = text.get("_sliding_window_pattern", 6)
            text["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                   for i in range(text["num_hidden_layers"])]
        if "tie_word_embeddings" in config_overrides:
            text["tie_word_embeddings"] = config["tie_word_embeddings"]
    return config


def write_generation_config(folder) -> pathlib.Path:
    """Write ``generation_config.json`` (Gemma 3 instruction-tuned ids: eos is ``[<eos>, <end_of_turn>]``)."""
    path = pathlib.Path(folder) / "generation_config.json"
    _dump_json(path, TINY_GEMMA3_GENERATION_CONFIG)
    return path


# ----------------------------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------------------------


def gemma3_weight_shapes(config: dict, *, layout: str = "transformers") -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape on disk for a Gemma 3 config dict, sorted by name.

    ``layout="transformers"``: the names transformers 5.23 ``save_pretrained`` writes (``language_model.model.*``,
    ``vision_tower.*``, ``multi_modal_projector.*``; an untied head is ``language_model.lm_head.weight``).
    ``layout="hub"``: the names of the published checkpoints, where the vision tower sits under
    ``vision_tower.vision_model.*``.
    """
    t, v = config["text_config"], config["vision_config"]
    hidden, inter, heads, kv_heads, head_dim = (t["hidden_size"], t["intermediate_size"], t["num_attention_heads"],
                                                t["num_key_value_heads"], t["head_dim"])
    shapes: dict[str, tuple[int, ...]] = {}
    p = "language_model.model."
    shapes[p + "embed_tokens.weight"] = (t["vocab_size"], hidden)
    shapes[p + "norm.weight"] = (hidden,)
    for i in range(t["num_hidden_layers"]):
        lp = f"{p}layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            shapes[lp + n + ".weight"] = (hidden,)
        shapes[lp + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[lp + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[lp + "mlp.down_proj.weight"] = (hidden, inter)
        for n, out in (("q_proj", heads * head_dim), ("k_proj", kv_heads * head_dim), ("v_proj", kv_heads * head_dim)):
            shapes[lp + f"self_attn.{n}.weight"] = (out, hidden)
            if t.get("attention_bias"):
                shapes[lp + f"self_attn.{n}.bias"] = (out,)
        shapes[lp + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        if t.get("attention_bias"):
            shapes[lp + "self_attn.o_proj.bias"] = (hidden,)
        shapes[lp + "self_attn.q_norm.weight"] = (head_dim,)
        shapes[lp + "self_attn.k_norm.weight"] = (head_dim,)
    if not config.get("tie_word_embeddings", True):
        shapes["language_model.lm_head.weight"] = (t["vocab_size"], hidden)

    vh, vi, ps, ch = v["hidden_size"], v["intermediate_size"], v["patch_size"], v.get("num_channels", 3)
    vp = "vision_tower.vision_model." if layout == "hub" else "vision_tower."
    shapes[vp + "embeddings.patch_embedding.weight"] = (vh, ch, ps, ps)
    shapes[vp + "embeddings.patch_embedding.bias"] = (vh,)
    shapes[vp + "embeddings.position_embedding.weight"] = ((v["image_size"] // ps) ** 2, vh)
    for i in range(v["num_hidden_layers"]):
        lp = f"{vp}encoder.layers.{i}."
        for n in ("layer_norm1", "layer_norm2"):
            shapes[lp + n + ".weight"] = (vh,)
            shapes[lp + n + ".bias"] = (vh,)
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[lp + f"self_attn.{n}.weight"] = (vh, vh)
            shapes[lp + f"self_attn.{n}.bias"] = (vh,)
        shapes[lp + "mlp.fc1.weight"] = (vi, vh)
        shapes[lp + "mlp.fc1.bias"] = (vi,)
        shapes[lp + "mlp.fc2.weight"] = (vh, vi)
        shapes[lp + "mlp.fc2.bias"] = (vh,)
    shapes[vp + "post_layernorm.weight"] = (vh,)
    shapes[vp + "post_layernorm.bias"] = (vh,)
    if v.get("vision_use_head", True):
        hp = vp + "head."
        shapes[hp + "probe"] = (1, 1, vh)
        shapes[hp + "attention.in_proj_weight"] = (3 * vh, vh)
        shapes[hp + "attention.in_proj_bias"] = (3 * vh,)
        shapes[hp + "attention.out_proj.weight"] = (vh, vh)
        shapes[hp + "attention.out_proj.bias"] = (vh,)
        shapes[hp + "layernorm.weight"] = (vh,)
        shapes[hp + "layernorm.bias"] = (vh,)
        shapes[hp + "mlp.fc1.weight"] = (vi, vh)
        shapes[hp + "mlp.fc1.bias"] = (vi,)
        shapes[hp + "mlp.fc2.weight"] = (vh, vi)
        shapes[hp + "mlp.fc2.bias"] = (vh,)

    shapes["multi_modal_projector.mm_input_projection_weight"] = (vh, hidden)
    shapes["multi_modal_projector.mm_soft_emb_norm.weight"] = (vh,)
    return dict(sorted(shapes.items()))


_GEMMA_RMSNORM = re.compile(r"(layernorm|\.norm|_norm|q_norm|k_norm)\.weight$")
_VISION_LAYERNORM = re.compile(r"(layer_norm\d|post_layernorm|head\.layernorm)\.weight$")


def init_std(name: str) -> tuple[float, float]:
    """``(mean, std)`` of the normal distribution a tensor is drawn from, by its name.

    Gemma RMSNorm weights (used as ``1 + w``): N(0, 0.1). SigLIP LayerNorm weights (used as ``w``): N(1, 0.1).
    Token embeddings, an untied lm_head and the multimodal projection: std 0.05; every other matrix and every
    bias: std 0.02.
    Names may carry either on-disk prefixes or transformers' module prefixes (``model.language_model.*``).
    """
    if _VISION_LAYERNORM.search(name):
        return 1.0, 0.1
    if "vision_tower" not in name and _GEMMA_RMSNORM.search(name):
        return 0.0, 0.1
    if name.endswith("mm_soft_emb_norm.weight"):
        return 0.0, 0.1
    if name.endswith(("embed_tokens.weight", "lm_head.weight", "mm_input_projection_weight")):
        return 0.0, 0.05
    return 0.0, 0.02


def random_gemma3_weights(config: dict, *, seed: int = 0, layout: str = "transformers") -> dict[str, np.ndarray]:
    """Random float32 tensors for every name in :func:`gemma3_weight_shapes`, drawn in name order from
    ``np.random.default_rng(seed)`` (so the same seed always gives the same bytes)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in gemma3_weight_shapes(config, layout=layout).items():
        mean, std = init_std(name)
        out[name] = (mean + std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    return out


def _save_weights(folder: pathlib.Path, tensors: dict[str, np.ndarray], shards: int) -> None:
    from safetensors.numpy import save_file

    names = sorted(tensors)
    metadata = {"format": "pt"}
    if shards <= 1:
        save_file({n: tensors[n] for n in names}, str(folder / "model.safetensors"), metadata=metadata)
        return
    total = sum(tensors[n].nbytes for n in names)
    shards = min(int(shards), len(names))
    # Consecutive runs of names, cut near every multiple of total / shards, every shard non-empty.
    groups: list[list[str]] = [[]]
    running = 0
    for idx, n in enumerate(names):
        later_groups = shards - len(groups)
        if groups[-1] and later_groups > 0 and (running >= total * len(groups) / shards
                                                or len(names) - idx <= later_groups):
            groups.append([])
        groups[-1].append(n)
        running += tensors[n].nbytes
    weight_map = {}
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(folder / fname), metadata=metadata)
        for n in group:
            weight_map[n] = fname
    _dump_json(folder / "model.safetensors.index.json", {
        "metadata": {"total_parameters": int(sum(tensors[n].size for n in names)), "total_size": int(total)},
        "weight_map": dict(sorted(weight_map.items())),
    })


def build_tiny_gemma3(
    folder,
    *,
    seed: int = 0,
    config_overrides: dict | None = None,
    shards: int = 1,
    do_pan_and_scan: bool = False,
    layout: str = "transformers",
) -> pathlib.Path:
    """Write a complete tiny Gemma 3 checkpoint folder and return its path.

    config.json (``TINY_GEMMA3_CONFIG`` updated recursively with ``config_overrides``), generation_config.json,
    random float32 weights (``seed``; one ``model.safetensors`` or ``shards`` files with
    ``model.safetensors.index.json``), and the tokenizer / chat template / processor files. ``layout`` picks the
    on-disk naming: what transformers 5.23 writes (default) or what the published checkpoints use (see
    :func:`gemma3_weight_shapes` and :func:`write_tokenizer_and_processor`).
    """
    if layout not in ("transformers", "hub"):
        raise ValueError(f"unknown layout {layout!r}")
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = _resolve_config(config_overrides)
    _dump_json(folder / "config.json", config)
    write_generation_config(folder)
    _save_weights(folder, random_gemma3_weights(config, seed=seed, layout=layout), shards)
    vision = config["vision_config"]
    write_tokenizer_and_processor(folder, image_size=vision["image_size"],
                                  mm_tokens_per_image=config["mm_tokens_per_image"],
                                  do_pan_and_scan=do_pan_and_scan, layout=layout)
    return folder
