"""The embedded default model's architecture and its checkpoint files other than the weights.

A Gemma 3-architecture model at toy scale: a 3-layer SigLIP-style vision tower on 96 x 96 pictures in 12 x 12
patches (64 patches), the Gemma 3 projector pooling them to 16 soft tokens, and a 4-layer Gemma 3 decoder (three
sliding-window layers, then a global one; hidden size 128) over the vocabulary of training/tokenizer.py.
training/train_default_model.py trains it; app/checkpoints/shapes-gemma3 holds the result.
"""

from __future__ import annotations

import pathlib

from training.gemma3_folder import write_generation_config, write_json, write_tokenizer_and_processor
from training.tokenizer import build_shape_tokenizer, special_token_ids

IDS = special_token_ids()
IMAGE_SIZE = 96
PATCH_SIZE = 12
MM_TOKENS = 16

# config.json of the default model (the layout transformers 5.23 writes for Gemma3Config).
CONFIG: dict = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": IDS["<start_of_image>"],
    "dtype": "float32",
    "eoi_token_index": IDS["<end_of_image>"],
    "eos_token_id": [IDS["<eos>"], IDS["<end_of_turn>"]],
    "image_token_index": IDS["<image_soft_token>"],
    "initializer_range": 0.02,
    "mm_tokens_per_image": MM_TOKENS,
    "model_type": "gemma3",
    "text_config": {
        "_sliding_window_pattern": 4,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "bos_token_id": IDS["<bos>"],
        "eos_token_id": IDS["<eos>"],
        "final_logit_softcapping": None,
        "head_dim": 32,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 384,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "max_position_embeddings": 1024,
        "model_type": "gemma3_text",
        "num_attention_heads": 4,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "pad_token_id": IDS["<pad>"],
        "query_pre_attn_scalar": 32,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {"factor": 8.0, "rope_theta": 1000000.0, "rope_type": "linear"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": 128,
        "tie_word_embeddings": True,
        "use_bidirectional_attention": False,
        "use_cache": True,
        "vocab_size": IDS["<image_soft_token>"],
    },
    "tie_word_embeddings": True,
    "transformers_version": "5.23.0",
    "vision_config": {
        "attention_dropout": 0.0,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 128,
        "image_size": IMAGE_SIZE,
        "intermediate_size": 256,
        "layer_norm_eps": 1e-06,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 4,
        "num_channels": 3,
        "num_hidden_layers": 3,
        "patch_size": PATCH_SIZE,
        "vision_use_head": False,
    },
}


def write_folder_files(folder) -> pathlib.Path:
    """Write config.json, generation_config.json, the tokenizer, chat template and processor files (everything
    but the weights) into ``folder`` (created if needed); returns its path."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", CONFIG)
    write_generation_config(folder, IDS)
    write_tokenizer_and_processor(folder, build_shape_tokenizer(), image_size=IMAGE_SIZE, mm_tokens_per_image=MM_TOKENS)
    return folder
