"""The tiny random Gemma 3 checkpoints' tokenizer, chat template and processor files, built offline and
deterministically.

A byte-fallback BPE whose merges are learned from an embedded English text, with every Gemma 3 special token the
processor and chat template need (ids: see app/tiny_gemma3.py), the Gemma 3 chat template, and the processor /
image-processor settings laid out the way transformers 5.23 saves them. No torch needed.

:func:`gemma_bpe_tokenizer` and :func:`byte_fallback_vocab` build the same kind of tokenizer for another vocabulary (the
embedded default model's, app/shape_tokenizer.py).
"""

from __future__ import annotations

import json
import re
import pathlib
from collections import Counter

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


def learn_merges(text: str, num_merges: int) -> list[tuple[str, str]]:
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


def byte_fallback_vocab(text: str, num_merges: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """``(vocab, merges)`` of a Gemma-style byte-fallback BPE: ids 0-6 the head special tokens, then the 256 byte
    tokens, the base characters, one token per merge learned from ``text``, and last the image special tokens."""
    vocab: dict[str, int] = {}
    for tok in _HEAD_SPECIALS:
        vocab[tok] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in _BASE_CHARS:
        vocab[ch] = len(vocab)
    merges = learn_merges(text, num_merges)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    for tok in _TAIL_SPECIALS:
        vocab[tok] = len(vocab)
    return vocab, merges


_VOCAB_CACHE: tuple[dict[str, int], list[tuple[str, str]]] | None = None


def tokenizer_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The tokenizer's ``(vocab, merges)``: token -> id for every token (special ones included), and the merges."""
    global _VOCAB_CACHE
    if _VOCAB_CACHE is None:
        vocab, merges = byte_fallback_vocab(_CORPUS, _NUM_MERGES)
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
    vocab, merges = tokenizer_vocab()
    return gemma_bpe_tokenizer(vocab, merges)


def gemma_bpe_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]]):
    """A Gemma-style ``tokenizers.Tokenizer`` for ``vocab`` (which holds every Gemma 3 special token) and
    ``merges``: spaces -> ``▁``, BPE with byte fallback, ``<bos>`` prepended, the special tokens added."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token=UNK_TOKEN, dropout=None,
                        byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", _SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    bos_id = vocab[BOS_TOKEN]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN}:0 $A:0",
        pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    specials = sorted(_HEAD_SPECIALS + _TAIL_SPECIALS, key=vocab.__getitem__)
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
    tokenizer=None,
) -> pathlib.Path:
    """Write the tokenizer, chat template and processor configuration into ``folder`` (created if needed).

    ``tokenizer``: the ``tokenizers.Tokenizer`` to write (default :func:`build_tokenizer`'s); another one must
    hold the same special tokens (the ``layout="hub"`` files name the ids of :data:`SPECIAL_TOKEN_IDS`).

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
    tok = build_tokenizer() if tokenizer is None else tokenizer
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
