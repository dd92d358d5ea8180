"""Tiny, complete Gemma 4 checkpoint folders, built offline and deterministically, for tests.

Three folders, each loadable by ``transformers`` 5.23, in the layouts of the published checkpoints:

* :func:`build_tiny_small`: a ``Gemma4ForConditionalGeneration`` folder shaped like ``google/gemma-4-E2B-it`` /
  ``E4B-it`` (:data:`TINY_GEMMA4_SMALL_CONFIG`): dense MLP (double width on the KV-sharing layers, as
  ``use_double_wide_mlp`` makes it), per-layer input embeddings, the last layers reusing the keys / values of the
  last earlier layer of their type, sliding and full layers where full layers have their own head_dim
  (``global_head_dim``; ``num_global_key_value_heads`` null and ``attention_k_eq_v`` false, as published for these
  models), proportional partial RoPE on full layers, a final logit softcap, causal attention for image tokens
  (``use_bidirectional_attention`` null), a vision tower with clipped linears and an audio tower.
* :func:`build_tiny_moe`: a ``Gemma4ForConditionalGeneration`` folder shaped like ``google/gemma-4-26B-A4B-it``
  (:data:`TINY_GEMMA4_MOE_CONFIG`): a mixture of experts in parallel with the dense MLP on every layer
  (``enable_moe_block``, ``num_experts``, ``top_k_experts``, ``moe_intermediate_size``), full layers with their own
  head_dim and kv heads whose values are their keys (``global_head_dim``, ``num_global_key_value_heads``,
  ``attention_k_eq_v``), bidirectional image blocks on sliding layers (``use_bidirectional_attention: "vision"``),
  no per-layer embeddings, no KV sharing, a vision tower that standardizes its output, no audio tower.
* :func:`build_tiny_text_only`: a ``Gemma4ForCausalLM`` folder (``model_type`` ``gemma4_text``; what the
  published conversion writes for a text-only model): tensors ``model.*`` (``model.embed_tokens.weight``,
  ``model.layers.{i}.*``, ...; the output head is tied), the text config of the small layout, the tokenizer, chat
  template and generation config, no processor files.

The multimodal folders hold tensors ``model.language_model.*``, ``model.vision_tower.*``, ``model.embed_vision.*``
(and ``model.audio_tower.*``, ``model.embed_audio.*``), written by HF ``save_pretrained`` in float32. Every
parameter and every persistent buffer is drawn at random (:func:`randomise_`): norms, ``layer_scalar``, router
scales, the vision standardization, the position tables, and the clip bounds of the clipped linears (finite, so
they clip). ``sliding_window`` is 16 and an image gives up to 70 soft tokens, so a prompt with an image exceeds the
window.

Each folder also holds ``generation_config.json`` (eos = ``<eos>``, ``<turn|>``, ``<|tool_response>``, as
published) and the tokenizer / chat template (tests/gemma4_tokenizer.py); the multimodal folders hold
``processor_config.json`` in the layout transformers 5.23 writes (image processor, audio feature extractor with the
published settings, video processor, ``image_seq_length``, ``audio_seq_length``, ``audio_ms_per_token``).

The tiny image processor keeps the published settings except ``patch_size`` 4 (the tiny vision patch) and
``max_soft_tokens`` 70 (the smallest supported budget, to keep tests fast): images are resized to multiples of 12
pixels with at most 630 patches.

Without ``torchvision``, ``AutoProcessor`` cannot build a ``Gemma4Processor`` (its video processor needs
torchvision and ``ProcessorMixin`` refuses any ``video_processor`` argument when torchvision is missing).
:class:`Gemma4ProcessorWithoutVideo` is the same processor minus video; :func:`load_processor` returns it when
torchvision is not installed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import pathlib

from transformers import Gemma4Processor
from transformers.processing_utils import ProcessorMixin

import gemma4_tokenizer as gt

__all__ = [
    "GEMMA4_CHAT_TEMPLATE",
    "IMAGE_MAX_SOFT_TOKENS",
    "SPECIAL_TOKEN_IDS",
    "TINY_GEMMA4_AUDIO_CONFIG",
    "TINY_GEMMA4_GENERATION_CONFIG",
    "TINY_GEMMA4_MOE_CONFIG",
    "TINY_GEMMA4_MOE_TEXT_CONFIG",
    "TINY_GEMMA4_SMALL_CONFIG",
    "TINY_GEMMA4_SMALL_TEXT_CONFIG",
    "TINY_GEMMA4_SMALL_VISION_CONFIG",
    "TINY_GEMMA4_MOE_VISION_CONFIG",
    "TORCH_SEED",
    "VOCAB_SIZE",
    "Gemma4ProcessorWithoutVideo",
    "build_tiny_moe",
    "build_tiny_small",
    "build_tiny_text_only",
    "init_distribution",
    "load_processor",
    "load_reference",
    "published_text_config",
    "randomise_",
    "write_tokenizer_and_processor_files",
]

TORCH_SEED = 4321
GEMMA4_CHAT_TEMPLATE = gt.GEMMA4_CHAT_TEMPLATE
SPECIAL_TOKEN_IDS = gt.special_token_ids()
VOCAB_SIZE = gt.vocab_size()
IMAGE_MAX_SOFT_TOKENS = 70
_PATCH_SIZE = 4
_MAX_POSITIONS = 4096

# ----------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------

_ROPE_PARAMETERS = {
    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
}

# Keyword arguments of Gemma4TextConfig for the small (E2B / E4B) layout: 6 layers (sliding, sliding, full) x 2;
# the last 3 reuse the keys / values of layer 1 (sliding) and layer 2 (full).
TINY_GEMMA4_SMALL_TEXT_CONFIG: dict = {
    "attention_bias": False,
    "attention_k_eq_v": False,
    "bos_token_id": SPECIAL_TOKEN_IDS["<bos>"],
    "enable_moe_block": False,
    "eos_token_id": SPECIAL_TOKEN_IDS["<eos>"],
    "final_logit_softcapping": 4.0,
    "global_head_dim": 32,
    "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 64,
    "hidden_size_per_layer_input": 8,
    "intermediate_size": 96,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
    "max_position_embeddings": _MAX_POSITIONS,
    "num_attention_heads": 4,
    "num_global_key_value_heads": None,
    "num_hidden_layers": 6,
    "num_key_value_heads": 1,
    "num_kv_shared_layers": 3,
    "pad_token_id": SPECIAL_TOKEN_IDS["<pad>"],
    "rms_norm_eps": 1e-06,
    "rope_parameters": copy.deepcopy(_ROPE_PARAMETERS),
    "sliding_window": 16,
    "tie_word_embeddings": True,
    "use_bidirectional_attention": None,
    "use_double_wide_mlp": True,
    "vocab_size": VOCAB_SIZE,
    "vocab_size_per_layer_input": VOCAB_SIZE,
}

# Keyword arguments of Gemma4TextConfig for the mixture-of-experts (26B-A4B) layout.
TINY_GEMMA4_MOE_TEXT_CONFIG: dict = {
    "attention_bias": False,
    "attention_k_eq_v": True,
    "bos_token_id": SPECIAL_TOKEN_IDS["<bos>"],
    "enable_moe_block": True,
    "eos_token_id": SPECIAL_TOKEN_IDS["<eos>"],
    "final_logit_softcapping": 4.0,
    "global_head_dim": 32,
    "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 64,
    "hidden_size_per_layer_input": 0,
    "intermediate_size": 48,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
    "max_position_embeddings": _MAX_POSITIONS,
    "moe_intermediate_size": 16,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_global_key_value_heads": 1,
    "num_hidden_layers": 6,
    "num_key_value_heads": 2,
    "num_kv_shared_layers": 0,
    "pad_token_id": SPECIAL_TOKEN_IDS["<pad>"],
    "rms_norm_eps": 1e-06,
    "rope_parameters": copy.deepcopy(_ROPE_PARAMETERS),
    "sliding_window": 16,
    "tie_word_embeddings": True,
    "top_k_experts": 2,
    "use_bidirectional_attention": "vision",
    "use_double_wide_mlp": False,
    "vocab_size": VOCAB_SIZE,
    "vocab_size_per_layer_input": VOCAB_SIZE,
}

_VISION_COMMON: dict = {
    "attention_bias": False,
    "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "patch_size": _PATCH_SIZE,
    "pooling_kernel_size": 3,
    # x / y tables of 1024 positions: images up to 280 soft tokens (840 patches along one side) fit.
    "position_embedding_size": 1024,
    "rms_norm_eps": 1e-06,
}
# The on-device (E2B / E4B) vision tower: clipped linears, no standardization.
TINY_GEMMA4_SMALL_VISION_CONFIG: dict = {**_VISION_COMMON, "standardize": False, "use_clipped_linears": True}
# The large-model (26B / 31B) vision tower: plain linears, standardized output.
TINY_GEMMA4_MOE_VISION_CONFIG: dict = {**_VISION_COMMON, "standardize": True, "use_clipped_linears": False}

# Keyword arguments of Gemma4AudioConfig: the published structure at toy width. The first subsampling channel count
# stays 128 (= mel bins), which the reference's input projection size assumes.
TINY_GEMMA4_AUDIO_CONFIG: dict = {
    "attention_chunk_size": 12,
    "attention_context_left": 13,
    "attention_context_right": 0,
    "attention_invalid_logits_value": -1.0e9,
    "attention_logit_cap": 50.0,
    "conv_kernel_size": 5,
    "gradient_clipping": 1.0e10,
    "hidden_act": "silu",
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "output_proj_dims": 48,
    "residual_weight": 0.5,
    "rms_norm_eps": 1e-06,
    "subsampling_conv_channels": [128, 4],
    "use_clipped_linears": True,
}

_MULTIMODAL_TOKEN_IDS: dict = {
    "audio_token_id": SPECIAL_TOKEN_IDS["<|audio|>"],
    "boa_token_id": SPECIAL_TOKEN_IDS["<|audio>"],
    "boi_token_id": SPECIAL_TOKEN_IDS["<|image>"],
    "eoa_token_id": SPECIAL_TOKEN_IDS["<audio|>"],
    "eoa_token_index": SPECIAL_TOKEN_IDS["<audio|>"],
    "eoi_token_id": SPECIAL_TOKEN_IDS["<image|>"],
    "eos_token_id": [SPECIAL_TOKEN_IDS["<eos>"], SPECIAL_TOKEN_IDS["<turn|>"]],
    "image_token_id": SPECIAL_TOKEN_IDS["<|image|>"],
    "video_token_id": SPECIAL_TOKEN_IDS["<|video|>"],
}

# Keyword arguments of Gemma4Config for the small layout (vision + audio).
TINY_GEMMA4_SMALL_CONFIG: dict = {
    **_MULTIMODAL_TOKEN_IDS,
    "audio_config": TINY_GEMMA4_AUDIO_CONFIG,
    "text_config": TINY_GEMMA4_SMALL_TEXT_CONFIG,
    "tie_word_embeddings": True,
    "vision_config": TINY_GEMMA4_SMALL_VISION_CONFIG,
    "vision_soft_tokens_per_image": IMAGE_MAX_SOFT_TOKENS,
}

# Keyword arguments of Gemma4Config for the mixture-of-experts layout (vision, no audio).
TINY_GEMMA4_MOE_CONFIG: dict = {
    **_MULTIMODAL_TOKEN_IDS,
    "audio_config": None,
    "text_config": TINY_GEMMA4_MOE_TEXT_CONFIG,
    "tie_word_embeddings": True,
    "vision_config": TINY_GEMMA4_MOE_VISION_CONFIG,
    "vision_soft_tokens_per_image": IMAGE_MAX_SOFT_TOKENS,
}

# generation_config.json: generation ends at <eos>, <turn|> or <|tool_response>; sampling defaults as published.
TINY_GEMMA4_GENERATION_CONFIG: dict = {
    "bos_token_id": SPECIAL_TOKEN_IDS["<bos>"],
    "do_sample": True,
    "eos_token_id": [SPECIAL_TOKEN_IDS["<eos>"], SPECIAL_TOKEN_IDS["<turn|>"], SPECIAL_TOKEN_IDS["<|tool_response>"]],
    "pad_token_id": SPECIAL_TOKEN_IDS["<pad>"],
    "temperature": 1.0,
    "top_k": 64,
    "top_p": 0.95,
    "transformers_version": "5.23.0",
}

# ----------------------------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------------------------


def _dump_json(path: pathlib.Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def write_tokenizer_and_processor_files(folder, *, processor: bool = True,
                                        max_soft_tokens: int = IMAGE_MAX_SOFT_TOKENS) -> pathlib.Path:
    """Write ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``, ``generation_config.json`` and
    (with ``processor``) ``processor_config.json`` into ``folder`` (created if needed); return it."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gt.build_tokenizer().save(str(folder / "tokenizer.json"))
    _dump_json(folder / "tokenizer_config.json", gt.tokenizer_config())
    (folder / "chat_template.jinja").write_text(gt.GEMMA4_CHAT_TEMPLATE, encoding="utf-8")
    _dump_json(folder / "generation_config.json", TINY_GEMMA4_GENERATION_CONFIG)
    if processor:
        _dump_json(folder / "processor_config.json", {
            "audio_ms_per_token": 40,
            "audio_seq_length": 750,
            "feature_extractor": dict(gt.FEATURE_EXTRACTOR_CONFIG),
            "image_processor": gt.image_processor_config(_PATCH_SIZE, max_soft_tokens),
            "image_seq_length": int(max_soft_tokens),
            "processor_class": "Gemma4Processor",
            "video_processor": gt.video_processor_config(_PATCH_SIZE),
        })
    else:
        (folder / "processor_config.json").unlink(missing_ok=True)
    return folder


# ----------------------------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------------------------

_CLIP_BOUNDS = {"input_min": (-2.0, -1.0), "input_max": (1.0, 2.0), "output_min": (-0.6, -0.2),
                "output_max": (0.2, 0.6)}


def init_distribution(name: str, shape) -> tuple[str, float, float]:
    """``(kind, a, b)``: how the tensor ``name`` of ``shape`` is drawn. ``kind`` "normal" is N(a, b) (mean, std),
    "uniform" is U(a, b).

    * Clip bounds of clipped linears (``*.input_min`` / ``input_max`` / ``output_min`` / ``output_max``): uniform in
      [-2, -1] / [1, 2] for inputs (inputs are normalized, so about a tenth of them clip) and [-0.6, -0.2] /
      [0.2, 0.6] for outputs.
    * ``layer_scalar``: U(0.5, 1.5). Router ``scale`` and ``per_expert_scale``, vision ``std_scale``: N(1, 0.2).
      Vision ``std_bias``: N(0, 1) (the pooled features are scaled by sqrt(hidden)).
    * 1-D norm weights (every Gemma 4 RMSNorm scales by ``w``): N(1, 0.2). Biases: N(0, 0.02). The audio
      ``per_dim_scale``: N(0, 0.5).
    * The vision position tables: N(0, 0.3). MoE router projections: N(0, 0.5) (so the top-k choice is rarely a near
      tie). The audio tower's convolutions: N(0, 1 / fan_in).
    * Everything else (matrices, embeddings, experts): N(0, 0.05).
    """
    leaf = name.rsplit(".", 1)[-1]
    if leaf in _CLIP_BOUNDS:
        return ("uniform", *_CLIP_BOUNDS[leaf])
    if leaf == "layer_scalar":
        return "uniform", 0.5, 1.5
    if leaf in ("scale", "per_expert_scale", "std_scale"):
        return "normal", 1.0, 0.2
    if leaf == "std_bias":
        return "normal", 0.0, 1.0
    if leaf == "per_dim_scale":
        return "normal", 0.0, 0.5
    if leaf == "position_embedding_table":
        return "normal", 0.0, 0.3
    if name.endswith("router.proj.weight"):
        return "normal", 0.0, 0.5
    shape = tuple(shape)
    if len(shape) == 1:
        if leaf == "bias":
            return "normal", 0.0, 0.02
        if "norm" in name:
            return "normal", 1.0, 0.2
        return "normal", 0.0, 0.1
    if "audio_tower" in name and ("conv" in name.split(".")[-2] or "depthwise" in name) and len(shape) >= 3:
        return "normal", 0.0, 1.0 / math.sqrt(math.prod(shape[1:]))
    return "normal", 0.0, 0.05


def randomise_(model, seed: int = TORCH_SEED) -> None:
    """Overwrite every parameter and persistent buffer of ``model`` in place (``state_dict`` order, each storage
    once) from ``torch.Generator`` seeded with ``seed`` and :func:`init_distribution`."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    seen: set[int] = set()
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if tensor.data_ptr() in seen or not tensor.is_floating_point():
                continue
            seen.add(tensor.data_ptr())
            kind, a, b = init_distribution(name, tensor.shape)
            if kind == "uniform":
                value = a + (b - a) * torch.rand(tensor.shape, generator=gen, dtype=torch.float32)
            else:
                value = a + b * torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
            tensor.copy_(value)


def published_text_config(text_config: dict, text_kwargs: dict) -> dict:
    """The text config dict as the published checkpoints write it: transformers 5.23 saves the full layers' own
    head_dim / kv heads as ``per_layer_config``; the published config.json files hold ``global_head_dim`` and
    ``num_global_key_value_heads`` instead (from which transformers rebuilds ``per_layer_config`` on load)."""
    out = {k: v for k, v in text_config.items() if k != "per_layer_config"}
    out["global_head_dim"] = text_kwargs["global_head_dim"]
    out["num_global_key_value_heads"] = text_kwargs["num_global_key_value_heads"]
    return out


def _build(folder, model, seed: int, *, processor: bool, text_kwargs: dict) -> pathlib.Path:
    import torch

    folder = pathlib.Path(folder)
    model = model.to(torch.float32).eval()
    randomise_(model, seed)
    model.save_pretrained(folder)
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if "text_config" in config:
        config["text_config"] = published_text_config(config["text_config"], text_kwargs)
    else:
        config = published_text_config(config, text_kwargs)
    _dump_json(config_file, config)
    write_tokenizer_and_processor_files(folder, processor=processor)
    return folder


def build_tiny_small(folder, *, seed: int = TORCH_SEED) -> pathlib.Path:
    """Write the tiny small-layout ``Gemma4ForConditionalGeneration`` folder (vision + audio) and return its path."""
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(Gemma4Config(**copy.deepcopy(TINY_GEMMA4_SMALL_CONFIG)))
    return _build(folder, model, seed, processor=True, text_kwargs=TINY_GEMMA4_SMALL_TEXT_CONFIG)


def build_tiny_moe(folder, *, seed: int = TORCH_SEED + 1) -> pathlib.Path:
    """Write the tiny mixture-of-experts ``Gemma4ForConditionalGeneration`` folder (vision) and return its path."""
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(Gemma4Config(**copy.deepcopy(TINY_GEMMA4_MOE_CONFIG)))
    return _build(folder, model, seed, processor=True, text_kwargs=TINY_GEMMA4_MOE_TEXT_CONFIG)


def build_tiny_text_only(folder, *, seed: int = TORCH_SEED + 2) -> pathlib.Path:
    """Write the tiny text-only ``Gemma4ForCausalLM`` folder (the small layout's text config) and return its path."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**copy.deepcopy(TINY_GEMMA4_SMALL_TEXT_CONFIG)))
    return _build(folder, model, seed, processor=False, text_kwargs=TINY_GEMMA4_SMALL_TEXT_CONFIG)


# ----------------------------------------------------------------------------------------------------------------
# Reference (transformers) objects
# ----------------------------------------------------------------------------------------------------------------


class Gemma4ProcessorWithoutVideo(Gemma4Processor):
    """``Gemma4Processor`` without its video processor, for machines without torchvision.

    Images, audio, text and the chat template go through the parent's own code; only the video processor is left
    out. ``from_pretrained`` reads the tokenizer, image processor, feature extractor and the processor's own
    settings (``image_seq_length``, ``audio_seq_length``, ``audio_ms_per_token``) of a Gemma 4 folder.
    """

    def __init__(self, feature_extractor=None, image_processor=None, tokenizer=None, chat_template=None,
                 image_seq_length: int = 280, audio_seq_length: int = 750, audio_ms_per_token: int = 40, **kwargs):
        # What Gemma4Processor.__init__ sets before calling ProcessorMixin.__init__.
        self.image_seq_length = image_seq_length
        self.image_token_id = tokenizer.image_token_id
        self.boi_token = tokenizer.boi_token
        self.eoi_token = tokenizer.eoi_token
        self.image_token = tokenizer.image_token
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|video|>"]})
        self.video_token = "<|video|>"
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        self.audio_seq_length = audio_seq_length
        self.audio_ms_per_token = audio_ms_per_token
        self.audio_token_id = getattr(tokenizer, "audio_token_id", None)
        self.audio_token = getattr(tokenizer, "audio_token", None)
        self.boa_token = getattr(tokenizer, "boa_token", None)
        self.eoa_token = getattr(tokenizer, "eoa_token", None)
        ProcessorMixin.__init__(self, feature_extractor, image_processor, tokenizer, chat_template=chat_template,
                                **kwargs)


def load_processor(folder):
    """The HF processor for a multimodal Gemma 4 ``folder``: ``AutoProcessor`` (a ``Gemma4Processor``) when
    torchvision is installed, else :class:`Gemma4ProcessorWithoutVideo` loaded from the same files."""
    if importlib.util.find_spec("torchvision") is not None:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(folder)
    return Gemma4ProcessorWithoutVideo.from_pretrained(folder)


def load_reference(folder):
    """``(model, processor)`` for a folder of any of the three kinds: the torch model (float32, eager attention,
    eval) and, for multimodal folders, :func:`load_processor`'s processor (None for the text-only folder)."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4ForConditionalGeneration

    folder = pathlib.Path(folder)
    model_type = json.loads((folder / "config.json").read_text(encoding="utf-8"))["model_type"]
    if model_type == "gemma4_text":
        model = Gemma4ForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
        return model.eval(), None
    model = Gemma4ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    return model.eval(), load_processor(folder)
