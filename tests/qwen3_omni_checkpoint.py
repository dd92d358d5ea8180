"""Tiny, complete Qwen3-Omni checkpoint folders, built offline and deterministically, for tests.

Two folders, both loadable by ``transformers`` 5.23:

* :func:`build_tiny_thinker`: a ``Qwen3OmniMoeThinkerForConditionalGeneration`` folder (``model_type``
  ``qwen3_omni_moe_thinker``; tensors ``model.*``, ``visual.*``, ``audio_tower.*``, ``lm_head.weight``).
* :func:`build_tiny_full_model`: a ``Qwen3OmniMoeForConditionalGeneration`` folder, the layout of the published
  ``Qwen/Qwen3-Omni-30B-A3B-Instruct`` (``model_type`` ``qwen3_omni_moe``; tensors ``thinker.*``, ``talker.*``,
  ``code2wav.*``).

Both hold ``config.json`` and ``model.safetensors`` (float32, written by HF ``save_pretrained``),
``generation_config.json``, and the tokenizer / chat template / processor files of
:func:`build_tokenizer_and_processor_files`: a byte-level BPE tokenizer trained here with ``tokenizers`` on an
embedded English text, every Qwen3-Omni special token, the Qwen3-Omni chat template and the image-processor /
feature-extractor settings, laid out the way transformers 5.23 saves them (``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``, ``processor_config.json``).

The tokenizer, chat template and processor settings live in tests/qwen3_omni_tokenizer.py.

Vocabulary layout (ids), in the order of the real Qwen3-Omni vocabulary:

* 0 .. 255: the byte-level alphabet; 256 .. 447: learned merges (``user``, ``assistant`` and ``system`` are single
  tokens, as in the real vocabulary).
* 448 ..: the special tokens of :data:`SPECIAL_TOKENS` (``<|endoftext|>`` 448, ``<|im_start|>`` 449, ``<|im_end|>``
  450, ..., ``<|vision_start|>`` 457, ``<|image_pad|>`` 460, ``<|video_pad|>`` 461, ``<|audio_start|>`` 474,
  ``<|audio_end|>`` 475, ``<|audio_pad|>`` 480): real id minus 151643 plus 448.

The text vocabulary (embedding table) is exactly the tokenizer's size, 481.

Without ``torchvision``, ``AutoProcessor`` cannot build a ``Qwen3OmniMoeProcessor``: its video processor
(``Qwen2VLVideoProcessor``) needs torchvision, and ``ProcessorMixin`` refuses any ``video_processor`` argument
(``None`` included) when torchvision is missing. :class:`Qwen3OmniMoeProcessorWithoutVideo` is the same processor
minus video; :func:`load_processor` returns it when torchvision is not installed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import pathlib

from transformers import Qwen3OmniMoeProcessor
from transformers.processing_utils import ProcessorMixin

from qwen3_omni_tokenizer import (_EXTRA_SPECIAL_TOKENS, _MODEL_SPECIFIC_TOKENS, FEATURE_EXTRACTOR_CONFIG,
                                  IMAGE_PROCESSOR_CONFIG, QWEN3_OMNI_CHAT_TEMPLATE, SPECIAL_TOKEN_IDS, SPECIAL_TOKENS,
                                  VIDEO_PROCESSOR_CONFIG, VOCAB_SIZE, build_tokenizer, role_token_ids)

__all__ = [
    "FEATURE_EXTRACTOR_CONFIG",
    "IMAGE_PROCESSOR_CONFIG",
    "QWEN3_OMNI_CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "SPECIAL_TOKEN_IDS",
    "TINY_QWEN3_OMNI_CODE2WAV_CONFIG",
    "TINY_QWEN3_OMNI_CONFIG",
    "TINY_QWEN3_OMNI_GENERATION_CONFIG",
    "TINY_QWEN3_OMNI_TALKER_CONFIG",
    "TINY_QWEN3_OMNI_THINKER_CONFIG",
    "TORCH_SEED",
    "VIDEO_PROCESSOR_CONFIG",
    "VOCAB_SIZE",
    "Qwen3OmniMoeProcessorWithoutVideo",
    "build_tiny_full_model",
    "build_tiny_thinker",
    "build_tokenizer",
    "build_tokenizer_and_processor_files",
    "init_std",
    "load_processor",
    "load_reference",
    "randomise_",
    "role_token_ids",
]

TORCH_SEED = 1234

_MODEL_MAX_LENGTH = 4096


def _dump_json(path: pathlib.Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def build_tokenizer_and_processor_files(folder) -> pathlib.Path:
    """Write ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``, ``processor_config.json`` and
    ``generation_config.json`` into ``folder`` (created if needed) and return it."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(folder / "tokenizer.json"))
    _dump_json(folder / "tokenizer_config.json", {
        "add_prefix_space": False,
        "backend": "tokenizers",
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "extra_special_tokens": list(_EXTRA_SPECIAL_TOKENS),
        "model_max_length": _MODEL_MAX_LENGTH,
        "pad_token": "<|endoftext|>",
        "processor_class": "Qwen3OmniMoeProcessor",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
        **_MODEL_SPECIFIC_TOKENS,
    })
    (folder / "chat_template.jinja").write_text(QWEN3_OMNI_CHAT_TEMPLATE, encoding="utf-8")
    _dump_json(folder / "processor_config.json", {
        "feature_extractor": dict(FEATURE_EXTRACTOR_CONFIG),
        "image_processor": copy.deepcopy(IMAGE_PROCESSOR_CONFIG),
        "processor_class": "Qwen3OmniMoeProcessor",
        "video_processor": copy.deepcopy(VIDEO_PROCESSOR_CONFIG),
    })
    _dump_json(folder / "generation_config.json", TINY_QWEN3_OMNI_GENERATION_CONFIG)
    return folder


# ----------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------

_ROLE_IDS = role_token_ids()

# Keyword arguments of Qwen3OmniMoeThinkerConfig. Token ids are this tokenizer's; everything else follows the
# published thinker config at toy scale (MoE on every layer but layer 1, interleaved MRoPE, deepstack from vision
# blocks 0 and 1, 13 position ids per second).
TINY_QWEN3_OMNI_THINKER_CONFIG: dict = {
    "audio_config": {
        "activation_function": "gelu",
        "d_model": 32,
        "downsample_hidden_size": 16,
        "encoder_attention_heads": 4,
        "encoder_ffn_dim": 64,
        "encoder_layers": 2,
        "max_source_positions": 1500,
        "n_window": 50,  # the reference hard-codes 13 tokens per 100-frame chunk, which needs n_window = 50
        "n_window_infer": 200,  # attention windows of 2 chunks (26 tokens): a 12 s clip has 6 windows
        "num_mel_bins": 128,
        "output_dim": 64,
        "scale_embedding": False,
    },
    "audio_end_token_id": SPECIAL_TOKEN_IDS["<|audio_end|>"],
    "audio_start_token_id": SPECIAL_TOKEN_IDS["<|audio_start|>"],
    "audio_token_id": SPECIAL_TOKEN_IDS["<|audio_pad|>"],
    "image_token_id": SPECIAL_TOKEN_IDS["<|image_pad|>"],
    "initializer_range": 0.02,
    "position_id_per_seconds": 13,
    "text_config": {
        "attention_bias": False,
        "decoder_sparse_step": 1,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 96,
        "max_position_embeddings": _MODEL_MAX_LENGTH,
        "mlp_only_layers": [1],
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        # head_dim 16 -> 8 rotary frequencies, interleaved t, h, w, t, h, w, ...
        "rope_parameters": {
            "interleaved": True,
            "mrope_interleaved": True,
            "mrope_section": [2, 3, 3],
            "rope_theta": 1000000.0,
            "rope_type": "default",
        },
        "vocab_size": VOCAB_SIZE,
    },
    "tie_word_embeddings": False,
    "user_token_id": _ROLE_IDS["user"],
    "video_token_id": SPECIAL_TOKEN_IDS["<|video_pad|>"],
    "vision_config": {
        "deepstack_visual_indexes": [0, 1],
        "depth": 3,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 32,
        "in_channels": 3,
        "intermediate_size": 64,
        "num_heads": 4,
        "num_position_embeddings": 64,  # an 8x8 grid of learned positions, interpolated to each image's grid
        "out_hidden_size": 64,
        "patch_size": 4,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
    "vision_end_token_id": SPECIAL_TOKEN_IDS["<|vision_end|>"],
    "vision_start_token_id": SPECIAL_TOKEN_IDS["<|vision_start|>"],
}

# Keyword arguments of Qwen3OmniMoeTalkerConfig: a 2-layer MoE talker (with the shared expert the published one
# has) reading thinker layer 2, a 1-layer code predictor, 4 code groups of 32 codes; codec ids inside its 64-token
# codec vocabulary.
TINY_QWEN3_OMNI_TALKER_CONFIG: dict = {
    "accept_hidden_layer": 2,
    "audio_start_token_id": SPECIAL_TOKEN_IDS["<|audio_start|>"],
    "audio_token_id": SPECIAL_TOKEN_IDS["<|audio_pad|>"],
    "code_predictor_config": {
        "head_dim": 16,
        "hidden_size": 32,
        "intermediate_size": 48,
        "max_position_embeddings": _MODEL_MAX_LENGTH,
        "num_attention_heads": 2,
        "num_code_groups": 4,
        "num_hidden_layers": 1,
        "num_key_value_heads": 1,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "vocab_size": 32,
    },
    "codec_bos_id": 41,
    "codec_eos_token_id": 42,
    "codec_nothink_id": 43,
    "codec_pad_id": 40,
    "codec_think_bos_id": 44,
    "codec_think_eos_id": 45,
    "image_token_id": SPECIAL_TOKEN_IDS["<|image_pad|>"],
    "num_code_groups": 4,
    "position_id_per_seconds": 13,
    "speaker_id": {"aiden": 52, "chelsie": 50, "ethan": 51},
    "spatial_merge_size": 2,
    "text_config": {
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 32,
        "intermediate_size": 48,
        "max_position_embeddings": _MODEL_MAX_LENGTH,
        "moe_intermediate_size": 16,
        "norm_topk_prob": False,
        "num_attention_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "interleaved": True,
            "mrope_interleaved": True,
            "mrope_section": [2, 3, 3],
            "rope_theta": 1000000.0,
            "rope_type": "default",
        },
        "shared_expert_intermediate_size": 24,
        "vocab_size": 64,
    },
    "thinker_hidden_size": 64,
    "video_token_id": SPECIAL_TOKEN_IDS["<|video_pad|>"],
    "vision_start_token_id": SPECIAL_TOKEN_IDS["<|vision_start|>"],
}

# Keyword arguments of Qwen3OmniMoeCode2WavConfig: 4 quantizers of 32 codes, one transformer layer, x8 upsampling.
TINY_QWEN3_OMNI_CODE2WAV_CONFIG: dict = {
    "codebook_size": 32,
    "decoder_dim": 32,
    "hidden_size": 32,
    "intermediate_size": 48,
    "max_position_embeddings": 1024,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "num_key_value_heads": 2,
    "num_quantizers": 4,
    "sliding_window": 8,
    "upsample_rates": [2, 2],
    "upsampling_ratios": [2],
}

# Keyword arguments of Qwen3OmniMoeConfig (the full model).
TINY_QWEN3_OMNI_CONFIG: dict = {
    "assistant_token_id": _ROLE_IDS["assistant"],
    "code2wav_config": TINY_QWEN3_OMNI_CODE2WAV_CONFIG,
    "enable_audio_output": True,
    "im_end_token_id": SPECIAL_TOKEN_IDS["<|im_end|>"],
    "im_start_token_id": SPECIAL_TOKEN_IDS["<|im_start|>"],
    "system_token_id": _ROLE_IDS["system"],
    "talker_config": TINY_QWEN3_OMNI_TALKER_CONFIG,
    "thinker_config": TINY_QWEN3_OMNI_THINKER_CONFIG,
    "tts_bos_token_id": SPECIAL_TOKEN_IDS["<tts_text_bos>"],
    "tts_eos_token_id": SPECIAL_TOKEN_IDS["<tts_text_eod>"],
    "tts_pad_token_id": SPECIAL_TOKEN_IDS["<tts_pad>"],
    "user_token_id": _ROLE_IDS["user"],
}

# generation_config.json: generation ends at <|im_end|> or <|endoftext|>; sampling defaults of the Qwen3 instruct
# checkpoints.
TINY_QWEN3_OMNI_GENERATION_CONFIG: dict = {
    "bos_token_id": SPECIAL_TOKEN_IDS["<|endoftext|>"],
    "do_sample": True,
    "eos_token_id": [SPECIAL_TOKEN_IDS["<|im_end|>"], SPECIAL_TOKEN_IDS["<|endoftext|>"]],
    "pad_token_id": SPECIAL_TOKEN_IDS["<|endoftext|>"],
    "temperature": 0.7,
    "top_k": 20,
    "top_p": 0.8,
    "transformers_version": "5.23.0",
}

# ----------------------------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------------------------

_NORM_WORDS = ("norm", "ln_q", "ln_post")
_ROUTERS = ("mlp.gate.weight",)
_AUDIO_FRONT_END = tuple(f"audio_tower.{n}.weight" for n in ("conv2d1", "conv2d2", "conv2d3", "conv_out"))


def init_std(name: str, shape) -> tuple[float, float]:
    """``(mean, std)`` of the normal distribution the tensor ``name`` of ``shape`` is drawn from.

    * 1-D norm weights (RMSNorm and LayerNorm both scale by ``w``, not ``1 + w``): N(1, 0.1).
    * Biases: N(0, 0.02). Other 1-D tensors (code2wav layer scales, snake alpha / beta, ConvNeXt gamma): N(0, 0.1).
    * MoE routers (``mlp.gate.weight``): N(0, 0.5), so router logits spread by about 4 and the top-k choice is
      rarely a near tie that rounding could flip.
    * The audio tower's convolutions and ``conv_out``: N(0, 1 / fan_in), so the mel features are not drowned by the
      sinusoidal positions added after ``conv_out`` (with 0.05 the tower's output barely depends on the audio).
    * Everything else (matrices, fused expert tensors, convolutions, embeddings and heads): N(0, 0.05).
    """
    if len(tuple(shape)) == 1:
        if name.endswith(".weight") and any(w in name for w in _NORM_WORDS):
            return 1.0, 0.1
        if name.endswith(".bias"):
            return 0.0, 0.02
        return 0.0, 0.1
    if name.endswith(_ROUTERS):
        return 0.0, 0.5
    if name.endswith(_AUDIO_FRONT_END):
        fan_in = math.prod(tuple(shape)[1:])
        return 0.0, 1.0 / math.sqrt(fan_in)
    return 0.0, 0.05


def randomise_(model, seed: int = TORCH_SEED) -> None:
    """Overwrite every parameter of ``model`` in place, in ``named_parameters`` order, from ``torch.Generator``
    seeded with ``seed`` and the per-name distributions of :func:`init_std`."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            mean, std = init_std(name, param.shape)
            param.copy_(mean + std * torch.randn(param.shape, generator=gen, dtype=torch.float32))


def build_tiny_thinker(folder, *, seed: int = TORCH_SEED) -> pathlib.Path:
    """Write a tiny ``Qwen3OmniMoeThinkerForConditionalGeneration`` folder (every parameter random, float32) plus
    the tokenizer / processor / generation files, and return its path."""
    import torch
    from transformers import Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration

    folder = pathlib.Path(folder)
    config = Qwen3OmniMoeThinkerConfig(**copy.deepcopy(TINY_QWEN3_OMNI_THINKER_CONFIG))
    model = Qwen3OmniMoeThinkerForConditionalGeneration(config).to(torch.float32).eval()
    randomise_(model, seed)
    model.save_pretrained(folder)
    build_tokenizer_and_processor_files(folder)
    return folder


def build_tiny_full_model(folder, *, seed: int = TORCH_SEED) -> pathlib.Path:
    """Write a tiny ``Qwen3OmniMoeForConditionalGeneration`` folder (thinker + talker + code2wav, every parameter
    random, float32) plus the tokenizer / processor / generation files, and return its path."""
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    folder = pathlib.Path(folder)
    config = Qwen3OmniMoeConfig(**copy.deepcopy(TINY_QWEN3_OMNI_CONFIG))
    model = Qwen3OmniMoeForConditionalGeneration(config).to(torch.float32).eval()
    randomise_(model, seed)
    model.save_pretrained(folder)
    build_tokenizer_and_processor_files(folder)
    return folder


# ----------------------------------------------------------------------------------------------------------------
# Reference (transformers) objects
# ----------------------------------------------------------------------------------------------------------------


class Qwen3OmniMoeProcessorWithoutVideo(Qwen3OmniMoeProcessor):
    """``Qwen3OmniMoeProcessor`` without its video processor, for machines without torchvision.

    Images, audio, text and the chat template go through the parent's own code; only the video processor is left
    out (``ProcessorMixin`` rejects any ``video_processor`` argument, ``None`` included, when torchvision is
    missing). ``from_pretrained`` reads the tokenizer, image processor and feature extractor of a Qwen3-Omni folder.
    """

    def __init__(self, image_processor=None, feature_extractor=None, tokenizer=None, chat_template=None):
        ProcessorMixin.__init__(self, image_processor, feature_extractor, tokenizer, chat_template=chat_template)
        # What Qwen3OmniMoeProcessor.__init__ copies from the tokenizer.
        for attr in ("image_token", "audio_token", "video_token", "image_token_id", "audio_token_id",
                     "video_token_id", "vision_bos_token", "vision_eos_token", "audio_bos_token", "audio_eos_token"):
            setattr(self, attr, getattr(self.tokenizer, attr))

    @property
    def model_input_names(self):
        return list(dict.fromkeys(
            self.tokenizer.model_input_names + self.feature_extractor.model_input_names
            + self.image_processor.model_input_names + ["feature_attention_mask"]
        ))


def load_processor(folder):
    """The HF processor for ``folder``: ``AutoProcessor`` (a ``Qwen3OmniMoeProcessor``) when torchvision is
    installed, else :class:`Qwen3OmniMoeProcessorWithoutVideo` loaded from the same files."""
    if importlib.util.find_spec("torchvision") is not None:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(folder)
    return Qwen3OmniMoeProcessorWithoutVideo.from_pretrained(folder)


def load_reference(folder):
    """``(thinker, processor)`` for a folder of either kind: the torch thinker (float32, eager attention, eval; the
    full model's ``.thinker`` for a full folder) and :func:`load_processor`'s processor."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration, Qwen3OmniMoeThinkerForConditionalGeneration

    folder = pathlib.Path(folder)
    model_type = json.loads((folder / "config.json").read_text(encoding="utf-8"))["model_type"]
    if model_type == "qwen3_omni_moe":
        full = Qwen3OmniMoeForConditionalGeneration.from_pretrained(folder, dtype=torch.float32,
                                                                    attn_implementation="eager")
        thinker = full.thinker
    else:
        thinker = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(folder, dtype=torch.float32,
                                                                            attn_implementation="eager")
    return thinker.eval(), load_processor(folder)
