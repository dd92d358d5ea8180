"""The tokenizer, chat template and processor settings of the tiny Qwen3-Omni test checkpoints (see
tests/qwen3_omni_checkpoint.py for the vocabulary layout and the folders they go into)."""

from __future__ import annotations

from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX  # the pipeline Qwen2Tokenizer builds

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
