"""Random-weight checkpoints in the Hugging Face format for the benchmarks (built once, reused)."""

from __future__ import annotations

import json
import pathlib

from app.tiny_gemma3 import build_tiny_gemma3

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

CONFIGS = {("gemma3", False): GEMMA3_BENCH, ("gemma3", True): GEMMA3_SMOKE}


def bench_checkpoint(family: str, root: pathlib.Path, *, smoke: bool = False) -> pathlib.Path:
    """The benchmark checkpoint folder for ``family`` under ``root`` (built on first use)."""
    overrides = CONFIGS.get((family, smoke))
    if overrides is None:
        raise SystemExit(f"no benchmark checkpoint for family {family!r}; known: {sorted({f for f, _ in CONFIGS})}")
    folder = root / f"{family}-{'smoke' if smoke else 'bench'}"
    marker = folder / ".bench-config.json"
    if marker.exists() and json.loads(marker.read_text()) == overrides:
        return folder
    build_tiny_gemma3(folder, seed=0, config_overrides=overrides)
    marker.write_text(json.dumps(overrides))
    return folder
