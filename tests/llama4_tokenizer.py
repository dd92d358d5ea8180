"""The tokenizer, chat template and processor settings of the tiny Llama 4 test checkpoints (see
tests/llama4_checkpoint.py for the folders they go into).

Tokenizer: Llama 4's pipeline at toy scale. A byte-level BPE (the Llama 4 / o200k split regex, byte-level
pre-tokenizer and decoder) whose merges are learned here from an embedded English text, then the special tokens of
:data:`SPECIAL_TOKENS`, and a post-processor that puts ``<|begin_of_text|>`` in front (as the published
tokenizer.json does; the chat template writes it too, so prompts are tokenized without special tokens).

Vocabulary layout (ids): 0 .. 255 the byte-level alphabet, 256 .. 415 learned merges, then the special tokens in the
order of the real vocabulary (which starts them at 200000): ``<|begin_of_text|>`` 416, ``<|end_of_text|>`` 417,
..., ``<|header_start|>`` 421, ``<|header_end|>`` 422, ``<|eom|>`` 423, ``<|eot|>`` 424, ...,
``<|finetune_right_pad|>`` 428, ``<|image_start|>`` 429, ``<|image_end|>`` 430, ``<|tile_x_separator|>`` 431,
``<|tile_y_separator|>`` 432, ``<|image|>`` 433, ``<|patch|>`` 434 (the last id; the vocabulary has 435 tokens).
"""

from __future__ import annotations

import copy

# The Llama 4 pre-tokenizer split pattern (the o200k pattern the published tokenizer.json uses).
SPLIT_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|eot|>"
PAD_TOKEN = "<|finetune_right_pad|>"

# The special tokens, in the order of the real Llama 4 vocabulary (a subset: the reserved ones are left out).
SPECIAL_TOKENS: list[str] = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|eom|>",
    "<|eot|>",
    "<|step|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|finetune_right_pad|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
    "<|image|>",
    "<|patch|>",
]

_NUM_REGULAR_TOKENS = 416  # 256 byte-level symbols + 160 learned merges
SPECIAL_TOKEN_IDS: dict[str, int] = {tok: _NUM_REGULAR_TOKENS + i for i, tok in enumerate(SPECIAL_TOKENS)}
VOCAB_SIZE = _NUM_REGULAR_TOKENS + len(SPECIAL_TOKENS)

# The text the merges are learned from: plain English prose and short chat lines, written for this module.
_CORPUS = """\
The mountain village sits above the lake, where the road ends and a path climbs into the pine forest. In the
morning the fishermen row out on the still water, and the baker opens the shutters of the small shop by the
church. The children walk to the school along the shore and count the boats that are already far from land.

In the spring the meadows are full of yellow flowers, and the shepherd takes the goats up to the high pastures.
He carries a wooden stick, a loaf of bread and a notebook in which he draws the clouds. When it rains he sits
under a large rock and listens to the water running down the hill in a hundred small streams.

In the autumn the forest turns red and gold. The villagers collect mushrooms and chestnuts, and in the evening
they roast the chestnuts in the square and tell stories about the winters of the past, when the snow was so deep
that the lake froze and people could walk across the ice to the town on the other side.

user: What is in the picture?
assistant: A green boat is tied to a wooden pier, and two white swans swim next to it on the calm lake.
user: How many people are in the photo?
assistant: There are three people: one is fishing from the pier and two are sitting on a bench near the water.
user: Describe the image in one sentence.
assistant: A narrow street with stone houses, red flowers on the windows and a cat sleeping on a step.
system: You are a helpful assistant. Answer in one short sentence.
user: What colour is the door?
assistant: The door is bright blue, with a brass handle and a small window at the top.
user: Compare the two pictures.
assistant: The first picture shows the lake in summer; the second shows the same lake covered in snow.

Notes for the walk: we leave at 8:30 and return at 17:15. Bring water, apples, bread, cheese and a warm jacket.
The hut is open from June to September; the key is with the family in the last house before the bridge.
"""


def _train_tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=_NUM_REGULAR_TOKENS,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    if tok.get_vocab_size() != _NUM_REGULAR_TOKENS:
        raise RuntimeError(f"the embedded text gave {tok.get_vocab_size()} tokens, expected {_NUM_REGULAR_TOKENS}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    for t, idx in SPECIAL_TOKEN_IDS.items():
        if tok.token_to_id(t) != idx:
            raise RuntimeError(f"{t} got id {tok.token_to_id(t)}, expected {idx}")
    bos = SPECIAL_TOKEN_IDS[BOS_TOKEN]
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single=f"{BOS_TOKEN}:0 $A:0", pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
                                      special_tokens=[(BOS_TOKEN, bos)]),
    ])
    return tok


_TOKENIZER_JSON: str | None = None


def build_tokenizer():
    """The ``tokenizers.Tokenizer`` (deterministic; trained once per process, a fresh copy returned)."""
    from tokenizers import Tokenizer

    global _TOKENIZER_JSON
    if _TOKENIZER_JSON is None:
        _TOKENIZER_JSON = _train_tokenizer().to_str()
    return Tokenizer.from_str(_TOKENIZER_JSON)


def tokenizer_config() -> dict:
    """tokenizer_config.json as transformers 5.23 writes it for this tokenizer."""
    return {
        "backend": "tokenizers",
        "bos_token": BOS_TOKEN,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 10485760,
        "pad_token": PAD_TOKEN,
        "processor_class": "Llama4Processor",
        "tokenizer_class": "TokenizersBackend",
    }


def chat_template() -> str:
    """The Llama 4 chat template as published with the instruction-tuned checkpoints (the one transformers ships as
    ``Llama4Processor``'s default): ``<|begin_of_text|>``, each turn ``<|header_start|>ROLE<|header_end|>\\n\\n``
    + content (an image part is ``<|image|>``) + ``<|eot|>``, the generation prompt an open assistant header."""
    from transformers.models.llama4.processing_llama4 import chat_template as published

    return published


# Image processor settings of the tiny checkpoints: Llama 4's (bilinear, mean = std = 0.5, bf16 rescale) with
# 36-pixel tiles (the tiny vision tower's image size) and canvases of at most 6 tiles.
IMAGE_PROCESSOR_CONFIG: dict = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Llama4ImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "max_patches": 6,
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "resize_to_max_canvas": False,
    "size": {"height": 36, "width": 36},
}


def processor_config(image_processor: dict | None = None, patch_size: int = 6) -> dict:
    """processor_config.json as ``Llama4Processor.save_pretrained`` writes it in transformers 5.23 (the image
    processor nested; ``patch_size`` the vision patch side, so that tokens per tile match the tower)."""
    return {
        "fake_image_token": "<|image|>",
        "image_processor": copy.deepcopy(IMAGE_PROCESSOR_CONFIG if image_processor is None else image_processor),
        "image_token": "<|image|>",
        "patch_size": int(patch_size),
        "processor_class": "Llama4Processor",
    }
