"""A tiny, complete Gemma 3 checkpoint folder, built offline and deterministically.

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
import json
import os
import pathlib
import re
import shutil
import tempfile
from collections import Counter

import numpy as np

__all__ = [
    "BOI_TOKEN",
    "BOS_TOKEN",
    "DEFAULT_MODEL_VERSION",
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
    "default_model_dir",
    "gemma3_weight_shapes",
    "init_std",
    "random_gemma3_weights",
    "tokenizer_vocab",
    "write_generation_config",
    "write_tokenizer_and_processor",
]

DEFAULT_MODEL_VERSION = "1"
_MARKER = ".omnijax-default-model.json"

# ----------------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------------

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"
UNK_TOKEN = "<unk>"
MASK_TOKEN = "<mask>"
SOT_TOKEN = "<start_of_turn>"
EOT_TOKEN = "<end_of_turn>"
BOI_TOKEN = "<start_of_image>"
EOI_TOKEN = "<end_of_image>"
IMAGE_TOKEN = "<image_soft_token>"

_HEAD_SPECIALS = [PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN, MASK_TOKEN, SOT_TOKEN, EOT_TOKEN]
_TAIL_SPECIALS = [BOI_TOKEN, EOI_TOKEN, IMAGE_TOKEN]
_SPACE = "\u2581"  # "▁", what the Gemma normalizer turns a space into
_BASE_CHARS = [_SPACE, "\n"] + [chr(c) for c in range(33, 127)]
_NUM_MERGES = 128

_FIRST_MERGE_ID = len(_HEAD_SPECIALS) + 256 + len(_BASE_CHARS)
SPECIAL_TOKEN_IDS: dict[str, int] = {tok: i for i, tok in enumerate(_HEAD_SPECIALS)}
SPECIAL_TOKEN_IDS.update({tok: _FIRST_MERGE_ID + _NUM_MERGES + i for i, tok in enumerate(_TAIL_SPECIALS)})
_TEXT_VOCAB_SIZE = SPECIAL_TOKEN_IDS[IMAGE_TOKEN]

# The text the merges are learned from: plain English prose, written for this module.
_CORPUS = """\
The old lighthouse stands at the end of the harbour road, where the houses give way to rocks and the sea.
For many years a keeper lived there with his daughter. Every evening he climbed the stairs to light the lamp,
and every morning he wrote in a small book what the weather had been and which ships had passed in the night.

The daughter liked the book more than the lamp. She read it on rainy days, when the wind was too strong for
the boats to leave the harbour. There were notes about storms and calm seas, about a boat that lost its mast
and a whale that swam so close to the shore that the whole town came down to see it. She thought that the
book was a kind of map: not of places, but of days.

When she was older she started her own book. She wrote about the people in the town, the baker who sang in
the morning, the teacher who walked her dog along the water, the fishermen who argued about the best place
to find cod. She wrote about the colours of the sky before a storm and the sound of the rain on the roof.

Years later the lighthouse was given an electric lamp that did not need a keeper. The family moved into a
house in the town, but the daughter still walked to the end of the road every evening. She would sit on the
rocks and watch the light turn, and she would write down what she saw, because she had learned that a day
that is written down is a day that is not lost.

Questions and answers

What is in the picture? A small red boat is resting on the sand next to a wooden house.
How many birds are there? There are three white birds standing on the roof, and one is flying.
What colour is the sky? The sky is light blue with a few grey clouds over the hills.
Describe the image in one sentence. A quiet street with old stone houses, a green door and a cat on a wall.
Where is the person going? The person is walking towards the station with a bag and an umbrella.

Notes for the day: the train leaves at 9:30 and returns at 18:45. Bring water, bread, cheese and apples.
The meeting is on the second floor, in the room with the large table by the window. Please be on time.
"""


def _learn_merges(text: str, num_merges: int) -> list[tuple[str, str]]:
    """Byte-pair merges learned greedily from ``text`` (ties broken by the pair's text, so fully deterministic).

    Words are a space marker plus the following characters, or runs of newlines; merges never cross words.
    """
    normalized = text.replace(" ", _SPACE)
    chunks = re.findall(f"{_SPACE}?[^{_SPACE}\\n]+|\\n+|{_SPACE}+", normalized)
    alphabet = set(_BASE_CHARS)
    counts = Counter(c for c in chunks if all(ch in alphabet for ch in c))
    words = [(list(w), n) for w, n in sorted(counts.items())]
    known = set(_BASE_CHARS)
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        pairs: Counter = Counter()
        for symbols, n in words:
            for a, b in zip(symbols, symbols[1:]):
                pairs[(a, b)] += n
        candidates = [(-n, pair) for pair, n in pairs.items() if pair[0] + pair[1] not in known]
        if not candidates:
            raise ValueError("the embedded text is too short for the requested number of merges")
        _, best = min(candidates)
        merges.append(best)
        merged = best[0] + best[1]
        known.add(merged)
        for symbols, _ in words:
            i = 0
            while i < len(symbols) - 1:
                if symbols[i] == best[0] and symbols[i + 1] == best[1]:
                    symbols[i:i + 2] = [merged]
                i += 1
    return merges


_VOCAB_CACHE: tuple[dict[str, int], list[tuple[str, str]]] | None = None


def tokenizer_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The tokenizer's ``(vocab, merges)``: token -> id for every token (special ones included), and the merges."""
    global _VOCAB_CACHE
    if _VOCAB_CACHE is None:
        vocab: dict[str, int] = {}
        for tok in _HEAD_SPECIALS:
            vocab[tok] = len(vocab)
        for b in range(256):
            vocab[f"<0x{b:02X}>"] = len(vocab)
        for ch in _BASE_CHARS:
            vocab[ch] = len(vocab)
        merges = _learn_merges(_CORPUS, _NUM_MERGES)
        for a, b in merges:
            vocab[a + b] = len(vocab)
        for tok in _TAIL_SPECIALS:
            vocab[tok] = len(vocab)
        for tok, idx in SPECIAL_TOKEN_IDS.items():
            assert vocab[tok] == idx, (tok, vocab[tok], idx)
        _VOCAB_CACHE = (vocab, merges)
    vocab, merges = _VOCAB_CACHE
    return dict(vocab), list(merges)


def build_tokenizer():
    """The ``tokenizers.Tokenizer``: Gemma's pipeline (spaces -> ``▁``, BPE with byte fallback, ``<bos>`` prepended).

    The pipeline is the one ``transformers``' ``GemmaTokenizer`` rebuilds when it loads ``tokenizer.json``, so the
    file and the class agree.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    vocab, merges = tokenizer_vocab()
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token=UNK_TOKEN, dropout=None,
                        byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", _SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    bos_id = SPECIAL_TOKEN_IDS[BOS_TOKEN]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN}:0 $A:0",
        pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    specials = sorted(SPECIAL_TOKEN_IDS, key=SPECIAL_TOKEN_IDS.get)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


# The chat template shipped with the instruction-tuned Gemma 3 checkpoints.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}"
)


def _dump_json(path: pathlib.Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _image_processor_dict(image_size: int, do_pan_and_scan: bool, pan_and_scan: dict) -> dict:
    d = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_pan_and_scan": bool(do_pan_and_scan),
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Gemma3ImageProcessor",
        "image_std": [0.5, 0.5, 0.5],
        "resample": 2,
        "rescale_factor": 1 / 255,
        "size": {"height": int(image_size), "width": int(image_size)},
    }
    if do_pan_and_scan:
        d.update(pan_and_scan)
    return d


def write_tokenizer_and_processor(
    folder,
    *,
    image_size: int = 64,
    mm_tokens_per_image: int = 16,
    do_pan_and_scan: bool = False,
    pan_and_scan_min_crop_size: int | None = None,
    pan_and_scan_max_num_crops: int = 4,
    pan_and_scan_min_ratio_to_activate: float = 1.2,
    layout: str = "transformers",
) -> pathlib.Path:
    """Write the tokenizer, chat template and processor configuration into ``folder`` (created if needed).

    ``layout="transformers"`` (default) writes what ``Gemma3Processor.save_pretrained`` writes in transformers 5.23:
    ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja`` and one ``processor_config.json`` that
    nests the image processor's settings. ``layout="hub"`` writes the older layout the ``google/gemma-3-*-it``
    repositories ship: ``preprocessor_config.json`` (image processor + ``image_seq_length``), a flat
    ``processor_config.json``, ``chat_template.json``, ``special_tokens_map.json``, ``added_tokens.json`` and a
    ``tokenizer_config.json`` with ``added_tokens_decoder`` and the ``extra_special_tokens`` dict.

    With ``do_pan_and_scan`` the pan-and-scan settings are written too (``pan_and_scan_min_crop_size`` defaults to
    half the image size). Note that transformers' ``Gemma3Processor`` applies its own call defaults
    (``do_pan_and_scan=False``, min crop 256) over these unless they are passed at call time.
    """
    if layout not in ("transformers", "hub"):
        raise ValueError(f"unknown layout {layout!r}")
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    (folder / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")

    if pan_and_scan_min_crop_size is None:
        pan_and_scan_min_crop_size = max(1, int(image_size) // 2)
    pan_and_scan = {
        "pan_and_scan_max_num_crops": int(pan_and_scan_max_num_crops),
        "pan_and_scan_min_crop_size": int(pan_and_scan_min_crop_size),
        "pan_and_scan_min_ratio_to_activate": float(pan_and_scan_min_ratio_to_activate),
    }
    image_processor = _image_processor_dict(image_size, do_pan_and_scan, pan_and_scan)
    tokenizer_config = {
        "backend": "tokenizers",
        "boi_token": BOI_TOKEN,
        "bos_token": BOS_TOKEN,
        "eoi_token": EOI_TOKEN,
        "eos_token": EOS_TOKEN,
        "image_token": IMAGE_TOKEN,
        "mask_token": MASK_TOKEN,
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": PAD_TOKEN,
        "processor_class": "Gemma3Processor",
        "tokenizer_class": "GemmaTokenizer",
        "unk_token": UNK_TOKEN,
    }
    # Drop the other layout's files so a rewritten folder is never a mix of both.
    other = (("chat_template.jinja",) if layout == "hub" else
             ("preprocessor_config.json", "chat_template.json", "special_tokens_map.json", "added_tokens.json"))
    for name in other:
        (folder / name).unlink(missing_ok=True)
    if layout == "transformers":
        tokenizer_config["extra_special_tokens"] = []
        _dump_json(folder / "tokenizer_config.json", tokenizer_config)
        (folder / "chat_template.jinja").write_text(GEMMA3_CHAT_TEMPLATE, encoding="utf-8")
        _dump_json(folder / "processor_config.json", {
            "image_processor": image_processor,
            "image_seq_length": int(mm_tokens_per_image),
            "processor_class": "Gemma3Processor",
        })
        return folder

    # The layout of the published google/gemma-3-*-it repositories.
    tokenizer_config.pop("backend")
    tokenizer_config.update({
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "extra_special_tokens": {"boi_token": BOI_TOKEN, "eoi_token": EOI_TOKEN, "image_token": IMAGE_TOKEN},
        "padding_side": "left",
        "sp_model_kwargs": None,
        "spaces_between_special_tokens": False,
        "use_default_system_prompt": False,
        "added_tokens_decoder": {
            str(idx): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                       "special": True}
            for t, idx in sorted(SPECIAL_TOKEN_IDS.items(), key=lambda kv: kv[1])
        },
    })
    _dump_json(folder / "tokenizer_config.json", tokenizer_config)
    _dump_json(folder / "special_tokens_map.json", {
        "boi_token": BOI_TOKEN,
        "bos_token": {"content": BOS_TOKEN, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
        "eoi_token": EOI_TOKEN,
        "eos_token": {"content": EOS_TOKEN, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
        "image_token": IMAGE_TOKEN,
        "pad_token": {"content": PAD_TOKEN, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
        "unk_token": {"content": UNK_TOKEN, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
    })
    _dump_json(folder / "added_tokens.json", {IMAGE_TOKEN: SPECIAL_TOKEN_IDS[IMAGE_TOKEN]})
    _dump_json(folder / "chat_template.json", {"chat_template": GEMMA3_CHAT_TEMPLATE})
    _dump_json(folder / "preprocessor_config.json", {
        **image_processor,
        "image_seq_length": int(mm_tokens_per_image),
        "processor_class": "Gemma3Processor",
    })
    _dump_json(folder / "processor_config.json", {
        "image_seq_length": int(mm_tokens_per_image),
        "processor_class": "Gemma3Processor",
    })
    return folder


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


# ----------------------------------------------------------------------------------------------------------------
# The embedded default model
# ----------------------------------------------------------------------------------------------------------------


def _marker_ok(folder: pathlib.Path) -> bool:
    try:
        marker = json.loads((folder / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return marker.get("version") == DEFAULT_MODEL_VERSION


def default_model_dir() -> pathlib.Path:
    """The embedded default model: a tiny Gemma 3 folder built on first use and reused afterwards.

    It lives in ``$OMNIJAX_HOME/default-gemma3-tiny`` (``OMNIJAX_HOME`` defaults to ``~/.cache/omnijax``). The
    folder is built in a temporary sibling and renamed into place, and it is rebuilt when its version marker is
    missing or stale.
    """
    home = os.environ.get("OMNIJAX_HOME")
    root = pathlib.Path(home).expanduser() if home else pathlib.Path.home() / ".cache" / "omnijax"
    target = root / "default-gemma3-tiny"
    if _marker_ok(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".default-gemma3-tiny-", dir=root))
    try:
        build_tiny_gemma3(tmp, seed=0)
        _dump_json(tmp / _MARKER, {"version": DEFAULT_MODEL_VERSION, "seed": 0})
        if target.exists() and not _marker_ok(target):
            stale = pathlib.Path(tempfile.mkdtemp(prefix=".stale-", dir=root))
            os.replace(target, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _marker_ok(target):  # someone else's complete build is fine; anything else is an error
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
