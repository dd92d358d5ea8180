"""The weights of a Gemma 3 checkpoint folder: every tensor's name and shape for a config, and the safetensors
files (one file, or shards with their index) as transformers 5.23 ``save_pretrained`` writes them."""

from __future__ import annotations

import pathlib

import numpy as np
from safetensors.numpy import save_file

from training.gemma3_folder import write_json


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


def shard_groups(names: list[str], sizes: list[int], shards: int) -> list[list[str]]:
    """``names`` (in order, with their byte ``sizes``) cut into ``shards`` consecutive runs, each cut near a
    multiple of total / shards, no run empty (fewer runs only when there are fewer names)."""
    total = sum(sizes)
    shards = min(int(shards), len(names))
    groups: list[list[str]] = [[]]
    running = 0
    for idx, (name, size) in enumerate(zip(names, sizes)):
        later_groups = shards - len(groups)
        if groups[-1] and later_groups > 0 and (running >= total * len(groups) / shards
                                                or len(names) - idx <= later_groups):
            groups.append([])
        groups[-1].append(name)
        running += size
    return groups


def save_weights(folder, tensors: dict[str, np.ndarray], shards: int = 1) -> None:
    """Write ``tensors`` into ``folder`` as safetensors (metadata ``{"format": "pt"}``, names sorted): one
    ``model.safetensors``, or with ``shards`` > 1 that many ``model-0000i-of-0000n.safetensors`` files of
    consecutive names (:func:`shard_groups`) and ``model.safetensors.index.json``."""
    folder = pathlib.Path(folder)
    names = sorted(tensors)
    metadata = {"format": "pt"}
    if shards <= 1:
        save_file({n: tensors[n] for n in names}, str(folder / "model.safetensors"), metadata=metadata)
        return
    groups = shard_groups(names, [tensors[n].nbytes for n in names], shards)
    weight_map = {}
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(folder / fname), metadata=metadata)
        weight_map.update({n: fname for n in group})
    write_json(folder / "model.safetensors.index.json", {
        "metadata": {"total_parameters": int(sum(tensors[n].size for n in names)),
                     "total_size": int(sum(tensors[n].nbytes for n in names))},
        "weight_map": dict(sorted(weight_map.items())),
    })
