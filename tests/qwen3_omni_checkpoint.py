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
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX  # the pipeline Qwen2Tokenizer builds
from transformers.processing_utils import ProcessorMixin

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
    "hf_qwen_processor",
    "hf_qwen_thinker",
    "init_std",
    "load_processor",
    "load_reference",
    "randomise_",
    "role_token_ids",
    "tiny_qwen_dir",
    "tiny_qwen_full_dir",
]

TORCH_SEED = 1234

# ----------------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------------

# The special tokens of the Qwen3-Omni vocabulary, in id order (the real ids are 151643 ..), with the "special"
# flag of the published tokenizer (the tool-call and think tags are added tokens that are not special).
SPECIAL_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
]

# The published tokenizer_config.json's additional special tokens (the first Qwen2-VL-era specials).
_EXTRA_SPECIAL_TOKENS = [
    "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
    "<|video_pad|>",
]

# Named multimodal tokens the Qwen3-Omni processor reads from the tokenizer (tokenizer.image_token, ...).
_MODEL_SPECIFIC_TOKENS = {
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "audio_token": "<|audio_pad|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}

_NUM_REGULAR_TOKENS = 448  # 256 byte-level symbols + 192 learned merges
SPECIAL_TOKEN_IDS: dict[str, int] = {tok: _NUM_REGULAR_TOKENS + i for i, (tok, _) in enumerate(SPECIAL_TOKENS)}
VOCAB_SIZE = _NUM_REGULAR_TOKENS + len(SPECIAL_TOKENS)


# The text the merges are learned from: plain English prose and short chat transcripts, written for this module.
# The role words recur often enough that ``system``, ``user`` and ``assistant`` become single tokens.
_CORPUS = """\
The river town wakes early. Before the sun is over the hills, the baker has lit her oven and the ferry is already
crossing the water with the first carts of the day. The ferryman counts the carts and writes the number in a
small blue notebook, because his father did the same and his grandfather before him. Nobody reads the notebooks,
but the ferryman says that a town that counts its carts knows how it is doing.

In the summer the market fills the square. There are tables of tomatoes, beans and cherries, baskets of bread,
jars of honey and cheese wrapped in cloth. Children run between the tables and dogs sleep in the shade of the
old church. In the afternoon a band plays near the fountain, and the people who have finished their shopping
sit on the steps and listen. When the light turns orange the traders pack their tables and the square is quiet
again, except for the pigeons and the sound of the water.

In the winter the river is grey and fast, and the ferry waits for calm days. The school teacher walks the
children to the bridge to watch the ice. She tells them that the river has seen more winters than anyone in the
town, and that it will see many more. The children throw small stones onto the ice and listen to the sound they
make, a high and strange note that seems to travel all the way to the other side.

system: You are a helpful assistant that answers questions about pictures and sounds.
user: What is in the picture?
assistant: A small red boat rests on the sand next to a wooden house, and three white birds stand on the roof.
user: What can you hear in the recording?
assistant: The recording has rain on a window, a kettle that starts to whistle and a dog that barks twice.
user: How many people are in the photo?
assistant: There are four people: two are sitting at a table and two are walking towards the door.
system: You are a careful assistant. Answer in one short sentence.
user: Describe the image in one sentence.
assistant: A quiet street with old stone houses, a green door and a cat sleeping on a wall.
user: What is the person saying in the audio?
assistant: The person says that the train to the coast leaves at half past nine.
user: Is the sky clear?
assistant: No, the sky is light grey and there are dark clouds over the hills.
system: You are a friendly assistant who listens to the user and describes what the user shares.
user: What colour is the car in the image?
assistant: The car is dark blue, and it is parked under a tree with yellow leaves.
user: What instrument is playing?
assistant: A piano plays a slow melody, and a violin joins it near the end.
user: Thank you, assistant.
assistant: You are welcome. Ask me anything else about the pictures or the sounds.

Notes for the trip: the bus leaves at 7:15 and returns at 19:40. Bring water, bread, apples and a warm coat.
The museum opens at 10:00; the guided tour starts in the main hall, next to the large map of the river.
"""


def _train_tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
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
    tok.add_tokens([AddedToken(t, special=special, normalized=False) for t, special in SPECIAL_TOKENS])
    for t, idx in SPECIAL_TOKEN_IDS.items():
        if tok.token_to_id(t) != idx:
            raise RuntimeError(f"{t} got id {tok.token_to_id(t)}, expected {idx}")
    return tok


_TOKENIZER_JSON: str | None = None


def build_tokenizer():
    """The ``tokenizers.Tokenizer``: Qwen2's byte-level BPE pipeline (NFC, the Qwen split regex, byte-level
    pre-tokenizer / post-processor / decoder), merges learned from the embedded text, then the special tokens.

    Training is deterministic (same bytes every time); the result is cached as JSON and a fresh copy returned.
    """
    from tokenizers import Tokenizer

    global _TOKENIZER_JSON
    if _TOKENIZER_JSON is None:
        _TOKENIZER_JSON = _train_tokenizer().to_str()
    return Tokenizer.from_str(_TOKENIZER_JSON)


def role_token_ids() -> dict[str, int]:
    """Ids of the single tokens ``system``, ``user`` and ``assistant`` (what the full config's role ids name)."""
    tok = build_tokenizer()
    out = {}
    for word in ("system", "user", "assistant"):
        ids = tok.encode(word, add_special_tokens=False).ids
        if len(ids) != 1:
            raise RuntimeError(f"{word!r} is not a single token: {ids}")
        out[word] = ids[0]
    return out


# The chat template of Qwen/Qwen3-Omni-30B-A3B-Instruct. Its system-message and content-part handling (a list
# content renders images as <|vision_start|><|image_pad|><|vision_end|>, audio as
# <|audio_start|><|audio_pad|><|audio_end|>, videos as <|vision_start|><|video_pad|><|vision_end|>, text as is;
# a list system message renders one system turn per part) is that of the published Qwen3-Omni chat_template.json;
# assistant turns are written as given and the generation prompt is "<|im_start|>assistant\n" (no think block),
# as in the Qwen3 instruct templates.
QWEN3_OMNI_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {%- if messages[0].content is string %}\n"
    "            {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "        {%- else %}\n"
    "            {%- for content in messages[0].content %}\n"
    "                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}\n"
    "                    {{- '<|im_start|>system\\n' +\"<|vision_start|><|image_pad|><|vision_end|>\"+ "
    "'<|im_end|>\\n' }}\n"
    "                {%- elif content.type == 'audio' or 'audio' in content or 'audio_url' in content %}\n"
    "                    {{- '<|im_start|>system\\n' +\"<|audio_start|><|audio_pad|><|audio_end|>\"+ "
    "'<|im_end|>\\n' }}\n"
    "                {%- elif content.type == 'video' or 'video' in content %}\n"
    "                    {{- '<|im_start|>system\\n' +\"<|vision_start|><|video_pad|><|vision_end|>\"+ "
    "'<|im_end|>\\n' }}\n"
    "                {%- elif content.type == 'text' %}\n"
    "                    {{- '<|im_start|>system\\n' +content.text+ '<|im_end|>\\n' }}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.content is string %}\n"
    "        {%- set content = message.content %}\n"
    "    {%- else %}\n"
    "        {%- set content = namespace(text=\"\") %}\n"
    "        {%- for mcontent in message.content %}\n"
    "            {%- if mcontent.type == 'image' or 'image' in mcontent or 'image_url' in mcontent %}\n"
    "                {%- set content.text = content.text~\"<|vision_start|><|image_pad|><|vision_end|>\" %}\n"
    "            {%- elif mcontent.type == 'audio' or 'audio' in mcontent or 'audio_url' in mcontent %}\n"
    "                {%- set content.text = content.text~\"<|audio_start|><|audio_pad|><|audio_end|>\" %}\n"
    "            {%- elif mcontent.type == 'video' or 'video' in mcontent %}\n"
    "                {%- set content.text = content.text~\"<|vision_start|><|video_pad|><|vision_end|>\" %}\n"
    "            {%- elif mcontent.type == 'text' %}\n"
    "                {%- set content.text = content.text~mcontent.text %}\n"
    "            {%- endif %}\n"
    "        {%- endfor %}\n"
    "        {%- set content = content.text %}\n"
    "    {%- endif %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}"
    "{%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# Image processor settings: Qwen3-Omni's (Qwen2-VL processing, mean = std = 0.5, temporal patch 2, merge 2) at toy
# scale: 4-pixel patches, 256 .. 4096 pixels (4 .. 64 merged tokens; a 64x48 image gives 48).
IMAGE_PROCESSOR_CONFIG: dict = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "merge_size": 2,
    "patch_size": 4,
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 4096, "shortest_edge": 256},
    "temporal_patch_size": 2,
}

# The video processor section transformers 5.23 writes for Qwen2VLVideoProcessor with the image settings above
# (AutoProcessor needs a video section to build a Qwen3OmniMoeProcessor; building it also needs torchvision).
VIDEO_PROCESSOR_CONFIG: dict = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "do_sample_frames": False,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_frames": 768,
    "max_video_tokens": 128000,
    "merge_size": 2,
    "min_frames": 4,
    "patch_size": 4,
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "return_metadata": False,
    "size": {"longest_edge": 4096, "shortest_edge": 256},
    "temporal_patch_size": 2,
    "video_processor_type": "Qwen2VLVideoProcessor",
}

# The feature extractor of the published Qwen3-Omni checkpoints (128 mel bins, 16 kHz, hop 160, up to 300 s).
FEATURE_EXTRACTOR_CONFIG: dict = {
    "chunk_length": 300,
    "dither": 0.0,
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 4800000,
    "nb_max_frames": 30000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 16000,
}

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


# ----------------------------------------------------------------------------------------------------------------
# Session fixtures (plain functions; tests/conftest.py wraps them with @pytest.fixture(scope="session"))
# ----------------------------------------------------------------------------------------------------------------


def tiny_qwen_dir(tmp_path_factory) -> pathlib.Path:
    """A tiny Qwen3-Omni thinker folder (seed ``TORCH_SEED``)."""
    return build_tiny_thinker(tmp_path_factory.mktemp("tiny_qwen3_omni_thinker"))


def tiny_qwen_full_dir(tmp_path_factory) -> pathlib.Path:
    """A tiny full Qwen3-Omni folder (thinker + talker + code2wav, seed ``TORCH_SEED``)."""
    return build_tiny_full_model(tmp_path_factory.mktemp("tiny_qwen3_omni_full"))


def hf_qwen_thinker(tiny_qwen_dir):
    """The torch reference thinker loaded from ``tiny_qwen_dir``: float32, eager attention, eval mode."""
    import torch
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

    model = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(
        tiny_qwen_dir, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def hf_qwen_processor(tiny_qwen_dir):
    """The HF processor for ``tiny_qwen_dir`` (see :func:`load_processor`)."""
    return load_processor(tiny_qwen_dir)
