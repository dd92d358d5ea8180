"""Tiny, complete Llama 4 checkpoint folders, built offline and deterministically, for tests.

* :func:`build_tiny_llama4`: a ``Llama4ForConditionalGeneration`` folder (``model_type`` ``llama4``; tensors
  ``language_model.model.*``, ``language_model.lm_head.weight``, ``vision_model.*``,
  ``multi_modal_projector.linear_1.weight``), the layout of the published ``meta-llama/Llama-4-*-Instruct``.
* :func:`build_tiny_llama4_text`: a text-only ``Llama4ForCausalLM`` folder (``model_type`` ``llama4_text``;
  tensors ``model.*``, ``lm_head.weight``) with the same text configuration.

Both hold ``config.json`` and ``model.safetensors`` (float32, HF ``save_pretrained``; every parameter drawn at
random, norms included), ``generation_config.json`` (eos = ``<|end_of_text|>``, ``<|eom|>``, ``<|eot|>``) and the
tokenizer files of tests/llama4_tokenizer.py (``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja``); the multimodal folder also has ``processor_config.json`` (the image processor nested, as
transformers 5.23 writes it).

The text model (:data:`TINY_LLAMA4_TEXT_CONFIG`) has 4 layers: layers 0-2 use RoPE (llama3 scaling, with
``original_max_position_embeddings`` 64 so the tiny head dim has frequencies in all three llama3 regimes) and
chunked attention (``attention_chunk_size`` 32), layer 3 is a NoPE layer (every 4th) with attention temperature
tuning (``floor_scale`` 8, so positions past 7 are scaled); layers 1 and 3 are mixture-of-experts layers
(``interleave_moe_layer_step`` 2: 4 experts, top-1, plus the shared expert), layers 0 and 2 dense
(``intermediate_size_mlp`` 96). The vision tower (:data:`TINY_LLAMA4_VISION_CONFIG`) takes 36-pixel tiles of 6-pixel
patches: 36 patches, pixel-shuffled to 9 tokens per tile.

The torch reference: :func:`load_reference` (model, float32, eager attention). The reference processor
(``Llama4Processor``) needs torchvision; tests/llama4_reference.py runs it in a subprocess.
"""

from __future__ import annotations

import copy
import json
import math
import pathlib

from llama4_tokenizer import (BOS_TOKEN, PAD_TOKEN, SPECIAL_TOKEN_IDS, VOCAB_SIZE, build_tokenizer, chat_template,
                              processor_config, tokenizer_config)

__all__ = [
    "TINY_LLAMA4_CONFIG",
    "TINY_LLAMA4_GENERATION_CONFIG",
    "TINY_LLAMA4_TEXT_CONFIG",
    "TINY_LLAMA4_VISION_CONFIG",
    "TORCH_SEED",
    "build_tiny_llama4",
    "build_tiny_llama4_text",
    "init_std",
    "load_processor",
    "load_reference",
    "randomise_",
    "tiny_llama4_config",
    "write_tokenizer_files",
]

TORCH_SEED = 1234

TINY_LLAMA4_TEXT_CONFIG: dict = {
    "attention_chunk_size": 32,
    "attn_scale": 0.1,
    "attn_temperature_tuning": True,
    "bos_token_id": SPECIAL_TOKEN_IDS[BOS_TOKEN],
    "eos_token_id": [SPECIAL_TOKEN_IDS["<|end_of_text|>"], SPECIAL_TOKEN_IDS["<|eom|>"], SPECIAL_TOKEN_IDS["<|eot|>"]],
    "floor_scale": 8,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "interleave_moe_layer_step": 2,
    "intermediate_size": 32,
    "intermediate_size_mlp": 96,
    "max_position_embeddings": 4096,
    "no_rope_layer_interval": 4,
    "num_attention_heads": 4,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "pad_token_id": SPECIAL_TOKEN_IDS[PAD_TOKEN],
    "rms_norm_eps": 1e-5,
    "rope_parameters": {
        "factor": 16.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 500000.0,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "use_qk_norm": True,
    "vocab_size": VOCAB_SIZE,
}

TINY_LLAMA4_VISION_CONFIG: dict = {
    "hidden_act": "gelu",
    "hidden_size": 32,
    "image_size": 36,
    "intermediate_size": 128,  # hidden_size / pixel_shuffle_ratio**2: the adapter's input width
    "norm_eps": 1e-5,
    "num_attention_heads": 4,
    "num_channels": 3,
    "num_hidden_layers": 2,
    "patch_size": 6,
    "pixel_shuffle_ratio": 0.5,
    "projector_input_dim": 48,
    "projector_output_dim": 48,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "vision_output_dim": 48,
}

# Keyword arguments of Llama4Config.
TINY_LLAMA4_CONFIG: dict = {
    "boi_token_index": SPECIAL_TOKEN_IDS["<|image_start|>"],
    "eoi_token_index": SPECIAL_TOKEN_IDS["<|image_end|>"],
    "image_token_index": SPECIAL_TOKEN_IDS["<|patch|>"],
    "text_config": TINY_LLAMA4_TEXT_CONFIG,
    "tie_word_embeddings": False,
    "vision_config": TINY_LLAMA4_VISION_CONFIG,
}

# generation_config.json of the instruction-tuned checkpoints (ids of this tokenizer).
TINY_LLAMA4_GENERATION_CONFIG: dict = {
    "bos_token_id": SPECIAL_TOKEN_IDS[BOS_TOKEN],
    "do_sample": True,
    "eos_token_id": [SPECIAL_TOKEN_IDS["<|end_of_text|>"], SPECIAL_TOKEN_IDS["<|eom|>"], SPECIAL_TOKEN_IDS["<|eot|>"]],
    "pad_token_id": SPECIAL_TOKEN_IDS[PAD_TOKEN],
    "temperature": 0.6,
    "top_p": 0.9,
    "transformers_version": "5.23.0",
}


def tiny_llama4_config(**overrides) -> dict:
    """``TINY_LLAMA4_CONFIG`` with ``overrides``: ``text_config`` / ``vision_config`` dicts are merged into the
    defaults key by key, other keys replace top-level values."""
    config = copy.deepcopy(TINY_LLAMA4_CONFIG)
    for key, value in overrides.items():
        if key in ("text_config", "vision_config"):
            config[key] = {**config[key], **copy.deepcopy(value)}
        else:
            config[key] = copy.deepcopy(value)
    return config


# ----------------------------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------------------------

_ROUTERS = ("feed_forward.router.weight",)


def init_std(name: str, shape) -> tuple[float, float]:
    """``(mean, std)`` of the normal distribution the parameter ``name`` of ``shape`` is drawn from.

    * Norm weights (RMSNorm and LayerNorm scale by ``w``): N(1, 0.1); LayerNorm biases: N(0, 0.1).
    * Other biases: N(0, 0.02).
    * MoE routers: N(0, 0.5), so that router logits spread and the top-1 choice is rarely a near tie.
    * The vision class and positional embeddings: N(0, 0.5) (the reference's scale hidden**-0.5 at toy width).
    * Vision and projector matrices: N(0, 1 / fan_in), so that features stay of order one through the tower, the
      adapter's GELUs and the projector (with 0.05 the image features shrink to about 0.02).
    * Everything else (text matrices, fused expert tensors, embeddings, heads): N(0, 0.05).
    """
    shape = tuple(shape)
    if "norm" in name and len(shape) == 1:
        return (1.0, 0.1) if name.endswith(".weight") else (0.0, 0.1)
    if name.endswith(".bias"):
        return 0.0, 0.02
    if name.endswith(_ROUTERS):
        return 0.0, 0.5
    if name.endswith(("class_embedding", "positional_embedding_vlm")):
        return 0.0, 0.5
    if name.startswith(("vision_model.", "multi_modal_projector.")) and len(shape) == 2:
        return 0.0, 1.0 / math.sqrt(shape[1])
    return 0.0, 0.05


def randomise_(model, seed: int = TORCH_SEED) -> None:
    """Overwrite every parameter of ``model`` in place, in ``named_parameters`` order, from a ``torch.Generator``
    seeded with ``seed`` and the per-name distributions of :func:`init_std`."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            mean, std = init_std(name, param.shape)
            param.copy_(mean + std * torch.randn(param.shape, generator=gen, dtype=torch.float32))


def _dump_json(path: pathlib.Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def write_tokenizer_files(folder, *, image_processor: dict | None = None, with_processor: bool = True,
                          patch_size: int = TINY_LLAMA4_VISION_CONFIG["patch_size"]) -> pathlib.Path:
    """Write ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``, ``generation_config.json`` and
    (with ``with_processor``) ``processor_config.json`` into ``folder``; ``image_processor`` replaces the image
    processor settings (default: tests/llama4_tokenizer.py's ``IMAGE_PROCESSOR_CONFIG``), ``patch_size`` is the
    processor's (the vision tower's patch side)."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(folder / "tokenizer.json"))
    _dump_json(folder / "tokenizer_config.json", tokenizer_config())
    (folder / "chat_template.jinja").write_text(chat_template(), encoding="utf-8")
    _dump_json(folder / "generation_config.json", TINY_LLAMA4_GENERATION_CONFIG)
    if with_processor:
        _dump_json(folder / "processor_config.json",
                   processor_config(image_processor, patch_size=patch_size))
    return folder


def build_tiny_llama4(folder, *, seed: int = TORCH_SEED, image_processor: dict | None = None,
                      **overrides) -> pathlib.Path:
    """Write a tiny ``Llama4ForConditionalGeneration`` folder (every parameter random, float32) with its tokenizer,
    chat template, processor and generation files, and return its path.

    ``overrides`` go to :func:`tiny_llama4_config`; ``image_processor`` replaces the image processor settings. The
    processor's ``patch_size`` is the vision config's."""
    import torch
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    folder = pathlib.Path(folder)
    torch.manual_seed(seed)
    settings = tiny_llama4_config(**overrides)
    config = Llama4Config(**settings)
    model = Llama4ForConditionalGeneration(config).eval()  # float32 (.to() would drop the complex RoPE buffer)
    randomise_(model, seed)
    model.save_pretrained(folder)
    write_tokenizer_files(folder, image_processor=image_processor,
                          patch_size=settings["vision_config"]["patch_size"])
    return folder


def build_tiny_llama4_text(folder, *, seed: int = TORCH_SEED, **text_overrides) -> pathlib.Path:
    """Write a tiny text-only ``Llama4ForCausalLM`` folder (``model.*`` / ``lm_head.weight`` keys) with the tokenizer,
    chat template and generation files, and return its path. ``text_overrides`` update
    :data:`TINY_LLAMA4_TEXT_CONFIG`."""
    import torch
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    folder = pathlib.Path(folder)
    torch.manual_seed(seed)
    config = Llama4TextConfig(**{**copy.deepcopy(TINY_LLAMA4_TEXT_CONFIG), **copy.deepcopy(text_overrides)})
    model = Llama4ForCausalLM(config).eval()
    randomise_(model, seed)
    model.save_pretrained(folder)
    write_tokenizer_files(folder, with_processor=False)
    return folder


def load_reference(folder):
    """The torch model of a tiny folder of either kind (``Llama4ForConditionalGeneration`` for ``llama4``,
    ``Llama4ForCausalLM`` for ``llama4_text``): float32, eager attention, eval mode."""
    import torch
    from transformers import Llama4ForCausalLM, Llama4ForConditionalGeneration

    folder = pathlib.Path(folder)
    model_type = json.loads((folder / "config.json").read_text(encoding="utf-8"))["model_type"]
    cls = Llama4ForConditionalGeneration if model_type == "llama4" else Llama4ForCausalLM
    return cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()



def load_processor(folder):
    """``AutoProcessor.from_pretrained(folder)``: a ``Llama4Processor`` with its ``Llama4ImageProcessor``.

    transformers builds that image processor only where torchvision is importable, which the test session is not
    (see tests/llama4_reference.py): call this in the reference worker, or request ``chat`` / ``image_processor``
    outputs through ``llama4_reference.run_reference`` (the session fixture ``llama4_reference`` runs
    ``llama4_reference.CHAT_CASES``)."""
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    if not is_torchvision_available():
        raise RuntimeError("Llama4Processor needs torchvision; run it through tests/llama4_reference.py")
    return AutoProcessor.from_pretrained(folder)
