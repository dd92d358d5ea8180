"""Tiny gemma3 GGUF files for tests, written the way llama.cpp's convert_hf_to_gguf.py writes a Gemma 3 text model.

``write_tiny_gemma3_gguf(path, ...)`` randomises a tiny ``Gemma3ForCausalLM`` (every parameter, norms included),
names its tensors with the gguf package's ``TensorNameMap``, stores norm weights as ``1 + w`` (llama.cpp's
norms multiply by the weight) and writes each tensor in the ggml type ``types`` picks for it: F32, F16 and BF16
tensors and Q8_0 / Q4_0 / Q5_0 blocks quantized by ``gguf.quants.quantize``; Q4_K and Q6_K blocks (which the
gguf package cannot quantize) are random blocks with small scales, so the file's weights are whatever those
blocks dequantize to. The tokenizer metadata is the tiny default tokenizer's vocabulary (app/tiny_gemma3_tokenizer.py).
"""

from __future__ import annotations

import pathlib

import numpy as np

from app import tiny_gemma3_tokenizer as dt

# Hugging Face config of the tiny text model (rows of 256 so that every block type fits every matrix).
TINY_TEXT_CONFIG = dict(
    vocab_size=len(dt.tokenizer_vocab()[0]), hidden_size=256, intermediate_size=512, num_hidden_layers=6,
    num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=8,
    max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=1, pad_token_id=0,
    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
    layer_types=["sliding_attention"] * 5 + ["full_attention"], tie_word_embeddings=True,
)

# one ggml type per kind of tensor: every type the loader must read appears
DEFAULT_TYPES = {"token_embd": "Q8_0", "attn_q": "Q4_K", "attn_k": "Q6_K", "attn_v": "BF16", "attn_output": "F16",
                 "ffn_gate": "Q4_0", "ffn_up": "Q5_0", "ffn_down": "Q6_K"}


def tiny_hf_text_model(seed: int = 0, **overrides):
    """A randomised float32 ``Gemma3ForCausalLM`` with ``TINY_TEXT_CONFIG`` (+ overrides)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**dict(TINY_TEXT_CONFIG, **overrides))).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            std = 0.3 if "norm" in name else 0.05
            param.copy_(std * torch.randn(param.shape, generator=gen, dtype=torch.float32))
    return model


def _random_k_blocks(qtype, shape, rng) -> np.ndarray:
    """Random Q4_K / Q6_K blocks for a float tensor of ``shape``, with small positive f16 scales."""
    import gguf

    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows, blocks = int(np.prod(shape[:-1])), shape[-1] // block
    raw = rng.integers(0, 256, (rows, blocks, block_bytes), dtype=np.uint8)
    if qtype == gguf.GGMLQuantizationType.Q4_K:  # d, dmin (f16) then 12 bytes of 6-bit scales/mins, 128 of quants
        raw[..., 0:2] = np.array([0.002], np.float16).view(np.uint8)
        raw[..., 2:4] = np.array([0.01], np.float16).view(np.uint8)
    else:  # Q6_K: 128 low bits, 64 high bits, 16 int8 scales, d (f16) last
        raw[..., 192:208] = rng.integers(-20, 21, (rows, blocks, 16)).astype(np.int8).view(np.uint8)
        raw[..., 208:210] = np.array([0.0015], np.float16).view(np.uint8)
    return raw.reshape(rows, blocks * block_bytes)


def _encode(array: np.ndarray, type_name: str, rng):
    """(data, raw_dtype) for GGUFWriter.add_tensor."""
    import gguf
    from gguf.quants import quantize

    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name == "F32":
        return array.astype(np.float32), None
    if type_name == "F16":
        return array.astype(np.float16), None
    if type_name in ("Q4_K", "Q6_K"):
        return _random_k_blocks(qtype, array.shape, rng), qtype
    return quantize(array.astype(np.float32), qtype), qtype


def write_tiny_gemma3_gguf(path, *, model=None, types: dict | None = None, architecture: str = "gemma3",
                           chat_template: str | None = None, seed: int = 0,
                           extra_tensors: dict[str, np.ndarray] | None = None) -> pathlib.Path:
    """Write the tiny model (``tiny_hf_text_model(seed)`` unless given) as a GGUF file; returns ``path``."""
    import gguf

    path = pathlib.Path(path)
    model = model if model is not None else tiny_hf_text_model(seed)
    cfg = model.config
    types = dict(DEFAULT_TYPES, **(types or {}))
    rng = np.random.default_rng(seed + 1)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny gemma3 test model")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
    writer.add_sliding_window(cfg.sliding_window)
    vocab, _ = dt.tokenizer_vocab()
    tokens = sorted(vocab, key=vocab.get)
    special = set(dt.SPECIAL_TOKEN_IDS) | {dt.MASK_TOKEN}
    token_types = [3 if t in special else 6 if t.startswith("<0x") else 1 for t in tokens]
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([float(-i) for i in range(len(tokens))])
    writer.add_token_types(token_types)
    writer.add_bos_token_id(vocab[dt.BOS_TOKEN])
    writer.add_eos_token_id(vocab[dt.EOS_TOKEN])
    writer.add_unk_token_id(vocab[dt.UNK_TOKEN])
    writer.add_pad_token_id(vocab[dt.PAD_TOKEN])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "gemma3")
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        stem, suffix = hf_name.rsplit(".", 1)
        name = names.get_name(stem) + "." + suffix
        array = tensor.detach().numpy().astype(np.float32)
        if name.endswith("norm.weight"):
            writer.add_tensor(name, array + np.float32(1.0))
            continue
        kind = name.split(".")[-2]
        data, qtype = _encode(array, types.get(kind, "F32"), rng)
        writer.add_tensor(name, data, raw_dtype=qtype)
    for name, array in (extra_tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
