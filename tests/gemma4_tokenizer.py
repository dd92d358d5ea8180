"""The tokenizer, chat template and processor settings of the tiny Gemma 4 test checkpoints (the folders are built
by tests/gemma4_checkpoint.py).

Vocabulary layout (ids), in the order of the real Gemma 4 vocabulary (262144 tokens there):

* 0 .. 16: ``<pad>``, ``<eos>``, ``<bos>``, ``<unk>``, ``<mask>``, then the tool, thinking and turn tokens
  (``<|tool>`` .. ``<|"|>``, ``<|think|>``, ``<|channel>``, ``<channel|>``, ``<|turn>``, ``<turn|>``), as the real
  vocabulary has them among its first ids (real ids: 0, 1, 2, 3, 4, .., 50 = ``<|tool_response>``, .., 105, 106).
* 17 .. 272: the byte-fallback tokens ``<0x00>`` .. ``<0xFF>``; then the characters and learned merges of a
  Gemma-style BPE (spaces become ``▁``, no pre-tokenizer split beyond spaces, byte fallback).
* the last 7 ids: ``<|image>`` (begin of image), ``<|audio>`` (begin of audio), ``<|image|>`` (image soft token),
  ``<|audio|>`` (audio soft token), ``<image|>`` (end of image), ``<audio|>`` (end of audio), ``<|video|>``, in the
  real order (255999, 256000, 258880, 258881, 258882, 258883, 258884).

Every token the processor and the chat template use is a special added token. The tokenizer adds no ``<bos>`` by
itself (the published conversion saves it with ``add_bos_token=False``); the chat template writes ``<bos>``.
"""

from __future__ import annotations

import json

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"
UNK_TOKEN = "<unk>"
MASK_TOKEN = "<mask>"

# Model-specific named tokens, as the published tokenizer_config.json lists them (tokenizer.image_token, ...).
MODEL_SPECIFIC_TOKENS: dict[str, str] = {
    "audio_token": "<|audio|>",
    "boa_token": "<|audio>",
    "boi_token": "<|image>",
    "eoa_token": "<audio|>",
    "eoc_token": "<channel|>",
    "eoi_token": "<image|>",
    "eot_token": "<turn|>",
    "escape_token": '<|"|>',
    "etc_token": "<tool_call|>",
    "etd_token": "<tool|>",
    "etr_token": "<tool_response|>",
    "image_token": "<|image|>",
    "soc_token": "<|channel>",
    "sot_token": "<|turn>",
    "stc_token": "<|tool_call>",
    "std_token": "<|tool>",
    "str_token": "<|tool_response>",
    "think_token": "<|think|>",
}

_HEAD_SPECIALS = [
    PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN, MASK_TOKEN,
    "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>',
    "<|think|>", "<|channel>", "<channel|>", "<|turn>", "<turn|>",
]
_TAIL_SPECIALS = ["<|image>", "<|audio>", "<|image|>", "<|audio|>", "<image|>", "<audio|>", "<|video|>"]

_SPACE = "\u2581"  # "▁": what the Gemma normalizer turns a space into
_BASE_CHARS = [_SPACE, "\n"] + [chr(c) for c in range(33, 127)]
_NUM_LEARNED = 256  # base characters + merges learned from the corpus

# The text the merges are learned from: plain English prose and short chat lines, written for this module.
_CORPUS = """\
The hill farm sits above the lake, where the road turns to gravel and the fields run down to the water. In the
spring the farmer walks the fences every morning to see which posts the winter has pushed over. His daughter
follows with a hammer and a bag of nails, and she counts the sheep while her father counts the posts. When the
sun comes over the ridge the lake turns from grey to green, and the ducks leave the reeds to look for bread.

In the summer the farm is busy from dawn to dark. There is hay to cut and turn and carry, fruit to pick, and
water to bring to the animals on the high field. The neighbours come to help with the hay, and in the evening
everyone eats at the long table in the yard. Someone plays a guitar, the children chase the cats, and the old
dog sleeps under the bench until the last plate is cleared.

In the autumn the leaves on the hill turn red and gold, and the wind brings the first cold rain. The farmer
mends the roof of the barn and the daughter paints the gate. They listen to the radio while they work: the
weather, the news from the town, a song about a sailor who came home after ten years at sea.

user: Describe the image in one sentence.
model: A small white boat floats on a calm lake with green hills and a red house behind it.
user: What can you hear in the audio clip?
model: The clip has birds singing, a door that closes and a person who says good morning.
user: How many animals are in the picture?
model: There are five sheep in the field and one dog sitting next to the gate.
system: You are a helpful assistant. Answer briefly and describe what you see or hear.
user: What colour is the sky in this photo?
model: The sky is pale blue with a few white clouds over the water.
user: Compare the two images.
model: The first image shows the lake in summer and the second shows the same lake covered in snow.

Notes: the market opens at 8:00 and closes at 13:30. Bring eggs, apples, honey and two loaves of bread.
"""


def _learned_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(token -> rank, merges) of a BPE trained on the corpus with Gemma's normalizer and space split."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(unk_token=UNK_TOKEN, fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", _SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=_SPACE, behavior="merged_with_next", invert=False)
    trainer = trainers.BpeTrainer(vocab_size=_NUM_LEARNED, min_frequency=2, show_progress=False,
                                  initial_alphabet=_BASE_CHARS, limit_alphabet=len(_BASE_CHARS), special_tokens=[])
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges


_CACHE: tuple[dict[str, int], list[tuple[str, str]]] | None = None


def tokenizer_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """``(vocab, merges)``: token -> id for every token (special ones included), and the BPE merges."""
    global _CACHE
    if _CACHE is None:
        learned, merges = _learned_vocab()
        vocab: dict[str, int] = {}
        for tok in _HEAD_SPECIALS:
            vocab[tok] = len(vocab)
        for b in range(256):
            vocab[f"<0x{b:02X}>"] = len(vocab)
        for tok, _ in sorted(learned.items(), key=lambda kv: kv[1]):
            if tok not in vocab:
                vocab[tok] = len(vocab)
        for tok in _TAIL_SPECIALS:
            vocab[tok] = len(vocab)
        _CACHE = (vocab, merges)
    vocab, merges = _CACHE
    return dict(vocab), list(merges)


def special_token_ids() -> dict[str, int]:
    vocab, _ = tokenizer_vocab()
    return {t: vocab[t] for t in _HEAD_SPECIALS + _TAIL_SPECIALS}


def vocab_size() -> int:
    return len(tokenizer_vocab()[0])


def build_tokenizer():
    """The ``tokenizers.Tokenizer``: Gemma's pipeline (spaces -> ``▁``, BPE with byte fallback), no ``<bos>``
    added by the post-processor, every special token added as a special, unnormalized token."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    vocab, merges = tokenizer_vocab()
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token=UNK_TOKEN, dropout=None,
                        byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", _SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    specials = sorted(special_token_ids().items(), key=lambda kv: kv[1])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, _ in specials])
    return tok


def tokenizer_config() -> dict:
    """tokenizer_config.json as the published Gemma 4 checkpoints ship it (transformers 5 layout)."""
    return {
        "backend": "tokenizers",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "extra_special_tokens": ["<|video|>"],
        "mask_token": MASK_TOKEN,
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": PAD_TOKEN,
        "padding_side": "left",
        "processor_class": "Gemma4Processor",
        "tokenizer_class": "GemmaTokenizer",
        "unk_token": UNK_TOKEN,
        **MODEL_SPECIFIC_TOKENS,
    }


# The chat template of the published Gemma 4 instruction-tuned checkpoints, reduced to what omnijax renders: the
# structure for system / user / model turns and text, image, audio and video content is the published one
# (``<bos>``; an optional system turn, opened when the first message is a system or developer message or thinking is
# enabled, with ``<|think|>`` first when it is; each message ``<|turn>{role}\n`` .. ``<turn|>\n`` with ``assistant``
# written as ``model``; text parts trimmed; an image part as ``<|image|>``, audio as ``<|audio|>``, video as
# ``<|video|>``; thinking removed from earlier model turns; the generation prompt ``<|turn>model\n``, as the small
# checkpoints write it). Tool declarations, tool calls and tool responses are left out.
GEMMA4_CHAT_TEMPLATE = (
    "{%- macro strip_thinking(text) -%}\n"
    "    {%- set ns = namespace(result='') -%}\n"
    "    {%- for part in text.split('<channel|>') -%}\n"
    "        {%- if '<|channel>' in part -%}\n"
    "            {%- set ns.result = ns.result + part.split('<|channel>')[0] -%}\n"
    "        {%- else -%}\n"
    "            {%- set ns.result = ns.result + part -%}\n"
    "        {%- endif -%}\n"
    "    {%- endfor -%}\n"
    "    {{- ns.result | trim -}}\n"
    "{%- endmacro -%}\n"
    "{%- set loop_messages = messages -%}\n"
    "{{- bos_token -}}\n"
    "{%- if (enable_thinking is defined and enable_thinking) or messages[0]['role'] in ['system', 'developer'] -%}\n"
    "    {{- '<|turn>system\\n' -}}\n"
    "    {%- if enable_thinking is defined and enable_thinking -%}\n"
    "        {{- '<|think|>\\n' -}}\n"
    "    {%- endif -%}\n"
    "    {%- if messages[0]['role'] in ['system', 'developer'] -%}\n"
    "        {%- if messages[0]['content'] is string -%}\n"
    "            {{- messages[0]['content'] | trim -}}\n"
    "        {%- else -%}\n"
    "            {%- for item in messages[0]['content'] -%}\n"
    "                {%- if item['type'] == 'text' -%}{{- item['text'] | trim -}}{%- endif -%}\n"
    "            {%- endfor -%}\n"
    "        {%- endif -%}\n"
    "        {%- set loop_messages = messages[1:] -%}\n"
    "    {%- endif -%}\n"
    "    {{- '<turn|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\n"
    "    {{- '<|turn>' + role + '\\n' -}}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {%- if role == 'model' -%}\n"
    "            {{- strip_thinking(message['content']) -}}\n"
    "        {%- else -%}\n"
    "            {{- message['content'] | trim -}}\n"
    "        {%- endif -%}\n"
    "    {%- elif message['content'] is sequence -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'text' -%}\n"
    "                {%- if role == 'model' -%}\n"
    "                    {{- strip_thinking(item['text']) -}}\n"
    "                {%- else -%}\n"
    "                    {{- item['text'] | trim -}}\n"
    "                {%- endif -%}\n"
    "            {%- elif item['type'] == 'image' -%}\n"
    "                {{- '<|image|>' -}}\n"
    "            {%- elif item['type'] == 'audio' -%}\n"
    "                {{- '<|audio|>' -}}\n"
    "            {%- elif item['type'] == 'video' -%}\n"
    "                {{- '<|video|>' -}}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- endif -%}\n"
    "    {{- '<turn|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{- '<|turn>model\\n' -}}\n"
    "{%- endif -%}\n"
)

# Image processor settings of the published checkpoints (processor_config.json "image_processor"), except that the
# tiny models use patch_size 4 (the vision configs' patch size) instead of 16.
def image_processor_config(patch_size: int, max_soft_tokens: int = 280, pooling_kernel_size: int = 3) -> dict:
    return {
        "do_convert_rgb": True,
        "do_normalize": False,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.0, 0.0, 0.0],
        "image_processor_type": "Gemma4ImageProcessor",
        "image_seq_length": int(max_soft_tokens),
        "image_std": [1.0, 1.0, 1.0],
        "max_soft_tokens": int(max_soft_tokens),
        "patch_size": int(patch_size),
        "pooling_kernel_size": int(pooling_kernel_size),
        "resample": 3,
        "rescale_factor": 1 / 255,
    }


# The audio feature extractor settings of the published checkpoints (Gemma4AudioFeatureExtractor's defaults).
FEATURE_EXTRACTOR_CONFIG: dict = {
    "dither": 0.0,
    "feature_extractor_type": "Gemma4AudioFeatureExtractor",
    "feature_size": 128,
    "fft_length": 512,
    "fft_overdrive": False,
    "frame_length": 320,
    "hop_length": 160,
    "input_scale_factor": 1.0,
    "max_frequency": 8000.0,
    "mel_floor": 0.001,
    "min_frequency": 0.0,
    "padding_side": "right",
    "padding_value": 0.0,
    "per_bin_mean": None,
    "per_bin_stddev": None,
    "preemphasis": 0.0,
    "preemphasis_htk_flavor": True,
    "return_attention_mask": True,
    "sampling_rate": 16000,
}


# The video processor settings of the published checkpoints (written for completeness; omnijax takes no video).
def video_processor_config(patch_size: int) -> dict:
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "do_sample_frames": True,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "max_soft_tokens": 70,
        "num_frames": 32,
        "patch_size": int(patch_size),
        "pooling_kernel_size": 3,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "return_metadata": False,
        "video_processor_type": "Gemma4VideoProcessor",
    }
