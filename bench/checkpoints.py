"""Random-weight checkpoints in the Hugging Face format for the benchmarks (built once, reused)."""

from __future__ import annotations

import json
import pathlib

from fixtures.tiny_gemma3 import build_tiny_gemma3

# Gemma-3-shaped, about 128M parameters: hidden 768, 12 layers, 12 heads, head_dim 64, MLP 3072, vocab 32k,
# sliding window 512, and a small SigLIP tower (224 px, patch 14 -> 256 patches pooled to 64 soft tokens).
GEMMA3_BENCH = {
    "text_config": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4,
                    "head_dim": 64, "intermediate_size": 3072, "vocab_size": 32000, "sliding_window": 512,
                    "query_pre_attn_scalar": 64, "max_position_embeddings": 8192,
                    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2},
    "vision_config": {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6,
                      "num_attention_heads": 6, "image_size": 224, "patch_size": 14},
    "mm_tokens_per_image": 64,
}

# A few-MB variant with the same structure, for the benchmark's smoke test.
GEMMA3_SMOKE = {
    "text_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000, "sliding_window": 32,
                    "query_pre_attn_scalar": 16, "max_position_embeddings": 2048,
                    "layer_types": ["sliding_attention", "full_attention"]},
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                      "num_attention_heads": 4, "image_size": 56, "patch_size": 14},
    "mm_tokens_per_image": 4,
}

# Llama-4-shaped, about 175M parameters: hidden 768, 12 layers (chunked-attention RoPE layers, every 4th a NoPE
# layer), 12 heads, 4 kv heads, head_dim 64, vocab 32k, a mixture of experts on every second layer (8 experts of
# width 512, top-1, plus a shared expert; dense layers of width 2048 in between), and a small vision tower on 336-px
# tiles of 28-px patches (144 patches, pixel-shuffled to 36 tokens per tile).
LLAMA4_BENCH = {
    "text_config": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4,
                    "head_dim": 64, "intermediate_size": 512, "intermediate_size_mlp": 2048, "vocab_size": 32000,
                    "num_local_experts": 8, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
                    "attention_chunk_size": 256, "floor_scale": 8192, "attn_scale": 0.1,
                    "max_position_embeddings": 8192,
                    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192}},
    "vision_config": {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6,
                      "num_attention_heads": 6, "image_size": 336, "patch_size": 28, "projector_input_dim": 768,
                      "projector_output_dim": 768, "vision_output_dim": 768},
    "image_processor": {"size": {"height": 336, "width": 336}, "max_patches": 16},
}

# A few-MB variant with the same structure, for a quick check of the benchmark's code path.
LLAMA4_SMOKE = {
    "text_config": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "head_dim": 16, "intermediate_size": 64, "intermediate_size_mlp": 128, "vocab_size": 1000,
                    "num_local_experts": 4, "interleave_moe_layer_step": 2, "attention_chunk_size": 64,
                    "max_position_embeddings": 2048},
    "vision_config": {"hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
                      "image_size": 56, "patch_size": 14, "projector_input_dim": 48, "projector_output_dim": 48,
                      "vision_output_dim": 48},
    "image_processor": {"size": {"height": 56, "width": 56}, "max_patches": 4},
}

CONFIGS = {("gemma3", False): GEMMA3_BENCH, ("gemma3", True): GEMMA3_SMOKE,
           ("llama4", False): LLAMA4_BENCH, ("llama4", True): LLAMA4_SMOKE}


def _build_llama4(folder: pathlib.Path, overrides: dict) -> None:
    """A random Llama4ForConditionalGeneration (transformers' save_pretrained) with the Llama 4 tokenizer, chat
    template and processor files of the test checkpoints (tests/fixtures/llama4_checkpoint.py)."""
    from fixtures import llama4_checkpoint
    from fixtures.llama4_tokenizer import IMAGE_PROCESSOR_CONFIG

    image_processor = {**IMAGE_PROCESSOR_CONFIG, **overrides["image_processor"]}
    llama4_checkpoint.build_tiny_llama4(folder, seed=0, image_processor=image_processor,
                                        text_config=overrides["text_config"],
                                        vision_config=overrides["vision_config"])


BUILDERS = {"gemma3": lambda folder, overrides: build_tiny_gemma3(folder, seed=0, config_overrides=overrides),
            "llama4": _build_llama4}


def bench_checkpoint(family: str, root: pathlib.Path, *, smoke: bool = False) -> pathlib.Path:
    """The benchmark checkpoint folder for ``family`` under ``root`` (built on first use)."""
    overrides = CONFIGS.get((family, smoke))
    if overrides is None:
        raise SystemExit(f"no benchmark checkpoint for family {family!r}; known: {sorted({f for f, _ in CONFIGS})}")
    folder = root / f"{family}-{'smoke' if smoke else 'bench'}"
    marker = folder / ".bench-config.json"
    if marker.exists() and json.loads(marker.read_text()) == overrides:
        return folder
    BUILDERS[family](folder, overrides)
    marker.write_text(json.dumps(overrides))
    return folder
