"""The files of a Gemma 3 checkpoint folder other than the weights, laid out the way transformers 5.23 writes them.

``generation_config.json``, and the tokenizer, chat template and processor files (in transformers' layout or in
the older one of the published ``google/gemma-3-*-it`` repositories) for a given ``tokenizers.Tokenizer`` that
holds every Gemma 3 special token (training/gemma3_tokenizer.py builds one). Every JSON file is written by
:func:`write_json` (sorted keys, two-space indent, a final newline). training/model.py writes the embedded default
model's folder with these functions, tests/fixtures/tiny_gemma3.py the test suite's tiny random checkpoints.
"""

from __future__ import annotations

import json
import pathlib

from training.gemma3_tokenizer import (BOI_TOKEN, BOS_TOKEN, EOI_TOKEN, EOS_TOKEN, EOT_TOKEN, HEAD_SPECIAL_TOKENS,
                                       IMAGE_TOKEN, MASK_TOKEN, PAD_TOKEN, TAIL_SPECIAL_TOKENS, UNK_TOKEN)

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


def write_json(path, obj) -> None:
    """Write ``obj`` as JSON: sorted keys, two-space indent, non-ASCII kept, a final newline."""
    pathlib.Path(path).write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                                  encoding="utf-8")


def generation_config(ids: dict[str, int]) -> dict:
    """generation_config.json of the instruction-tuned Gemma 3 checkpoints (eos is ``[<eos>, <end_of_turn>]``,
    sampling defaults top-k 64, top-p 0.95) for the special token ids ``ids``."""
    return {
        "bos_token_id": ids[BOS_TOKEN],
        "cache_implementation": "hybrid",
        "do_sample": True,
        "eos_token_id": [ids[EOS_TOKEN], ids[EOT_TOKEN]],
        "pad_token_id": ids[PAD_TOKEN],
        "top_k": 64,
        "top_p": 0.95,
        "transformers_version": "5.23.0",
    }


def write_generation_config(folder, ids: dict[str, int]) -> pathlib.Path:
    """Write :func:`generation_config` of ``ids`` as ``folder/generation_config.json``; returns its path."""
    path = pathlib.Path(folder) / "generation_config.json"
    write_json(path, generation_config(ids))
    return path


def _special_token_ids_of(tokenizer) -> dict[str, int]:
    """Every Gemma 3 special token -> its id in ``tokenizer``."""
    return {tok: tokenizer.token_to_id(tok) for tok in HEAD_SPECIAL_TOKENS + TAIL_SPECIAL_TOKENS}


def image_processor_settings(image_size: int, *, do_pan_and_scan: bool = False,
                             pan_and_scan_min_crop_size: int | None = None, pan_and_scan_max_num_crops: int = 4,
                             pan_and_scan_min_ratio_to_activate: float = 1.2) -> dict:
    """The ``Gemma3ImageProcessor`` settings: resize to ``image_size`` squared, rescale, normalise to [-1, 1];
    with ``do_pan_and_scan`` the pan-and-scan settings too (the minimum crop defaults to half the image size)."""
    settings = {
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
        if pan_and_scan_min_crop_size is None:
            pan_and_scan_min_crop_size = max(1, int(image_size) // 2)
        settings.update({
            "pan_and_scan_max_num_crops": int(pan_and_scan_max_num_crops),
            "pan_and_scan_min_crop_size": int(pan_and_scan_min_crop_size),
            "pan_and_scan_min_ratio_to_activate": float(pan_and_scan_min_ratio_to_activate),
        })
    return settings


def _tokenizer_config() -> dict:
    """tokenizer_config.json entries both layouts share."""
    return {
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


def _special_token_entry(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def _write_transformers_layout(folder: pathlib.Path, image_processor: dict, mm_tokens_per_image: int) -> None:
    """What ``Gemma3Processor.save_pretrained`` writes in transformers 5.23 (besides ``tokenizer.json``)."""
    write_json(folder / "tokenizer_config.json", {"backend": "tokenizers", **_tokenizer_config(),
                                                  "extra_special_tokens": []})
    (folder / "chat_template.jinja").write_text(GEMMA3_CHAT_TEMPLATE, encoding="utf-8")
    write_json(folder / "processor_config.json", {
        "image_processor": image_processor,
        "image_seq_length": int(mm_tokens_per_image),
        "processor_class": "Gemma3Processor",
    })


def _write_hub_layout(folder: pathlib.Path, image_processor: dict, mm_tokens_per_image: int,
                      ids: dict[str, int]) -> None:
    """The files of the published ``google/gemma-3-*-it`` repositories (besides ``tokenizer.json``)."""
    write_json(folder / "tokenizer_config.json", {
        **_tokenizer_config(),
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "extra_special_tokens": {"boi_token": BOI_TOKEN, "eoi_token": EOI_TOKEN, "image_token": IMAGE_TOKEN},
        "padding_side": "left",
        "sp_model_kwargs": None,
        "spaces_between_special_tokens": False,
        "use_default_system_prompt": False,
        "added_tokens_decoder": {str(idx): {**_special_token_entry(t), "special": True}
                                 for t, idx in sorted(ids.items(), key=lambda kv: kv[1])},
    })
    write_json(folder / "special_tokens_map.json", {
        "boi_token": BOI_TOKEN,
        "bos_token": _special_token_entry(BOS_TOKEN),
        "eoi_token": EOI_TOKEN,
        "eos_token": _special_token_entry(EOS_TOKEN),
        "image_token": IMAGE_TOKEN,
        "pad_token": _special_token_entry(PAD_TOKEN),
        "unk_token": _special_token_entry(UNK_TOKEN),
    })
    write_json(folder / "added_tokens.json", {IMAGE_TOKEN: ids[IMAGE_TOKEN]})
    write_json(folder / "chat_template.json", {"chat_template": GEMMA3_CHAT_TEMPLATE})
    write_json(folder / "preprocessor_config.json", {
        **image_processor,
        "image_seq_length": int(mm_tokens_per_image),
        "processor_class": "Gemma3Processor",
    })
    write_json(folder / "processor_config.json", {
        "image_seq_length": int(mm_tokens_per_image),
        "processor_class": "Gemma3Processor",
    })


_LAYOUT_FILES = {
    "transformers": ("chat_template.jinja",),
    "hub": ("preprocessor_config.json", "chat_template.json", "special_tokens_map.json", "added_tokens.json"),
}


def write_tokenizer_and_processor(folder, tokenizer, *, image_size: int, mm_tokens_per_image: int,
                                  layout: str = "transformers", **pan_and_scan) -> pathlib.Path:
    """Write ``tokenizer`` (a ``tokenizers.Tokenizer`` holding every Gemma 3 special token), the chat template and
    the processor configuration into ``folder`` (created if needed); returns the folder.

    ``layout="transformers"`` (default) writes what ``Gemma3Processor.save_pretrained`` writes in transformers 5.23:
    ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja`` and one ``processor_config.json`` that
    nests the image processor's settings. ``layout="hub"`` writes the older layout the ``google/gemma-3-*-it``
    repositories ship: ``preprocessor_config.json`` (image processor + ``image_seq_length``), a flat
    ``processor_config.json``, ``chat_template.json``, ``special_tokens_map.json``, ``added_tokens.json`` and a
    ``tokenizer_config.json`` with ``added_tokens_decoder`` and the ``extra_special_tokens`` dict.

    ``pan_and_scan``: the keyword arguments of :func:`image_processor_settings` (``do_pan_and_scan`` and its
    settings). Note that transformers' ``Gemma3Processor`` applies its own call defaults (``do_pan_and_scan=False``,
    min crop 256) over these unless they are passed at call time.
    """
    if layout not in _LAYOUT_FILES:
        raise ValueError(f"unknown layout {layout!r}")
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    # Drop the other layout's files so a rewritten folder is never a mix of both.
    others = [name for other, names in _LAYOUT_FILES.items() if other != layout for name in names]
    for name in others:
        (folder / name).unlink(missing_ok=True)
    image_processor = image_processor_settings(image_size, **pan_and_scan)
    if layout == "transformers":
        _write_transformers_layout(folder, image_processor, mm_tokens_per_image)
    else:
        _write_hub_layout(folder, image_processor, mm_tokens_per_image, _special_token_ids_of(tokenizer))
    return folder
