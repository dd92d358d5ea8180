"""Gemma 4 image preprocessing and prompt expansion: the pure resize / patch functions on hand-checked cases, pixel
values / positions / soft-token counts equal to transformers' ``Gemma4ImageProcessorPil`` over many sizes and
settings, and prompt token ids equal to ``Gemma4Processor``'s."""

from __future__ import annotations

import json

import numpy as np
import PIL.Image
import pytest
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

from omnijax.common.errors import CheckpointError, MediaError, PromptError
from omnijax.preprocess.gemma4.image import (Gemma4ImageConfig, aspect_ratio_preserving_size, num_soft_tokens, pad_patches,
                                     patch_positions, patchify, process_image, process_images)
from omnijax.preprocess.gemma4.prompt import (Gemma4MediaTokens, audio_replacement, expand_placeholders,
                                      image_replacement)
from omnijax.preprocess.prompts import normalize_messages, render_chat
from omnijax.preprocess.user_text import encode_prompt
from omnijax.preprocess.tokenizer import load_tokenizer

pytestmark = pytest.mark.reference


def _image(height: int, width: int, seed: int = 0, mode: str = "RGB") -> PIL.Image.Image:
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    data = np.random.default_rng(seed + 7 * height + width).integers(0, 256, (height, width, channels), np.uint8)
    return PIL.Image.fromarray(data[..., 0] if channels == 1 else data, mode=mode)


# ---------------------------------------------------------------------------------------------------------------
# Pure functions, hand-checked


@pytest.mark.parametrize("height,width,patch,max_patches,k,expected", [
    # 1000 x 1000, budget 2520 patches of 16 px: scale sqrt(2520 * 256 / 1e6) = 0.8032 -> 803.2 px per side, down
    # to a multiple of 48: 768.
    (1000, 1000, 16, 2520, 3, (768, 768)),
    # 960 x 672 is exactly 2520 patches of 16 px with sides multiples of 48: kept as it is.
    (960, 672, 16, 2520, 3, (960, 672)),
    # 10 x 10000: the short side rounds to 0 -> 48; the long side min(1000 * 48, 280 * 48) = 13440.
    (10, 10000, 16, 2520, 3, (48, 13440)),
    (10000, 10, 16, 2520, 3, (13440, 48)),
    # 1 x 1 with 4-px patches and 630 patches: sqrt(630 * 16) = 100.4 -> 96 (a multiple of 12).
    (1, 1, 4, 630, 3, (96, 96)),
    # 100 x 300 (tall side 100): scale sqrt(630 * 16 / 30000) = 0.5797 -> 57.97 x 173.9 -> 48 x 168.
    (100, 300, 4, 630, 3, (48, 168)),
    # 3 x 200 with 4-px patches: scale sqrt(10080 / 600) = 4.099 -> 12.3 x 819.8 -> 12 x 816.
    (3, 200, 4, 630, 3, (12, 816)),
])
def test_aspect_ratio_preserving_size_hand_cases(height, width, patch, max_patches, k, expected):
    assert aspect_ratio_preserving_size(height, width, patch, max_patches, k) == expected
    cfg = Gemma4ImageConfig(patch_size=patch, max_soft_tokens=max_patches // k ** 2, pooling_kernel_size=k)
    th, tw = expected
    assert num_soft_tokens(height, width, cfg) == (th // patch) * (tw // patch) // k ** 2


def test_soft_tokens_of_hand_cases():
    cfg = Gemma4ImageConfig()  # 16-px patches, kernel 3, 280 soft tokens
    assert num_soft_tokens(1000, 1000, cfg) == 16 * 16  # 768 / 48 = 16 pooled tokens per side
    assert num_soft_tokens(960, 672, cfg) == 20 * 14 == 280
    assert num_soft_tokens(10, 10000, cfg) == 1 * 280
    assert num_soft_tokens(1, 1, Gemma4ImageConfig(patch_size=4, max_soft_tokens=70)) == 8 * 8


def test_zero_size_is_refused():
    with pytest.raises(MediaError, match="zero size"):
        aspect_ratio_preserving_size(0, 10, 16, 2520, 3)


def test_patchify_order_by_hand():
    # [C=3, H=2, W=4], value = 100 c + 10 y + x; 2-px patches: two patches, (row, column, channel) inside.
    c, y, x = np.meshgrid(np.arange(3), np.arange(2), np.arange(4), indexing="ij")
    image = (100 * c + 10 * y + x).astype(np.float32)
    patches = patchify(image, 2)
    assert patches.shape == (2, 12)
    assert patches[0].tolist() == [0, 100, 200, 1, 101, 201, 10, 110, 210, 11, 111, 211]
    assert patches[1].tolist() == [2, 102, 202, 3, 103, 203, 12, 112, 212, 13, 113, 213]
    with pytest.raises(MediaError):
        patchify(image[:, :, :3], 2)


def test_patch_positions_by_hand():
    assert patch_positions(2, 3).tolist() == [[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]]
    assert patch_positions(2, 3).dtype == np.int32


def test_pad_patches_by_hand():
    pixels, positions = pad_patches(np.ones((2, 3), np.float32), np.array([[0, 0], [1, 0]], np.int32), 4)
    assert pixels.tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]]
    assert positions.tolist() == [[0, 0], [1, 0], [-1, -1], [-1, -1]]
    with pytest.raises(MediaError, match="do not fit"):
        pad_patches(np.ones((5, 3), np.float32), np.zeros((5, 2), np.int32), 4)


def test_process_image_is_consistent():
    cfg = Gemma4ImageConfig(patch_size=4, max_soft_tokens=70)
    item = process_image(_image(50, 80), cfg)
    h, w = item.size
    assert (h, w) == aspect_ratio_preserving_size(50, 80, 4, 630, 3)
    assert item.pixel_values.shape == ((h // 4) * (w // 4), 48) and item.pixel_values.dtype == np.float32
    assert item.num_soft_tokens == item.pixel_values.shape[0] // 9 == num_soft_tokens(50, 80, cfg)
    assert 0.0 <= item.pixel_values.min() and item.pixel_values.max() <= 1.0
    assert item.position_ids[-1].tolist() == [w // 4 - 1, h // 4 - 1]


# ---------------------------------------------------------------------------------------------------------------
# Parity with Gemma4ImageProcessorPil

_SIZES = [(1, 1), (2, 3), (5, 5), (47, 13), (50, 80), (64, 64), (96, 96), (480, 640), (1000, 333), (2000, 1500),
          (1, 4000), (4000, 1), (7, 3000), (3000, 7), (12, 1200), (31, 97)]


@pytest.mark.parametrize("settings", [
    dict(patch_size=4, max_soft_tokens=70),
    dict(patch_size=16, max_soft_tokens=280),
    dict(patch_size=8, max_soft_tokens=140, pooling_kernel_size=2),
    dict(patch_size=16, max_soft_tokens=560, resample=2),
])
def test_matches_transformers_over_sizes(settings):
    cfg = Gemma4ImageConfig(**settings)
    ref_proc = Gemma4ImageProcessorPil(**settings)
    for i, (h, w) in enumerate(_SIZES):
        image = _image(h, w, seed=i)
        ref = ref_proc(images=[image])
        pixel_values, position_ids, counts = process_images([image], cfg)
        assert pixel_values.dtype == np.float32 and position_ids.dtype == np.int64
        np.testing.assert_array_equal(pixel_values, ref["pixel_values"], err_msg=f"{h}x{w} {settings}")
        np.testing.assert_array_equal(position_ids, ref["image_position_ids"], err_msg=f"{h}x{w} {settings}")
        assert counts == list(ref["num_soft_tokens_per_image"]), (h, w, settings)
        assert counts[0] == num_soft_tokens(h, w, cfg) <= cfg.max_soft_tokens


def test_matches_transformers_in_a_batch_with_modes_and_the_largest_budget():
    images = [_image(300, 200, 1, "RGBA"), _image(33, 1500, 2, "L"), _image(720, 1280, 3), _image(3, 3, 4)]
    for settings, batch in ((dict(max_soft_tokens=1120), images[2:]), (dict(max_soft_tokens=70), images)):
        images = batch
        ref = Gemma4ImageProcessorPil(**settings)(images=images)
        pixel_values, position_ids, counts = process_images(images, Gemma4ImageConfig(**settings))
        np.testing.assert_array_equal(pixel_values, ref["pixel_values"])
        np.testing.assert_array_equal(position_ids, ref["image_position_ids"])
        assert counts == list(ref["num_soft_tokens_per_image"])


def test_matches_transformers_with_normalize_and_without_resize():
    settings = dict(patch_size=4, max_soft_tokens=70, do_normalize=True, image_mean=[0.5, 0.4, 0.3],
                    image_std=[0.2, 0.5, 0.7])
    images = [_image(50, 80, 5), _image(36, 12, 6)]
    ref = Gemma4ImageProcessorPil(**settings)(images=images)
    pixel_values, position_ids, counts = process_images(images, Gemma4ImageConfig(**settings))
    np.testing.assert_array_equal(pixel_values, ref["pixel_values"])
    assert counts == list(ref["num_soft_tokens_per_image"])

    # Without resizing, sizes that are multiples of 12 px and fit the budget go through as they are.
    settings = dict(patch_size=4, max_soft_tokens=70, do_resize=False)
    images = [_image(36, 12, 7), _image(24, 96, 8)]
    ref = Gemma4ImageProcessorPil(**settings)(images=images)
    pixel_values, position_ids, counts = process_images(images, Gemma4ImageConfig(**settings))
    np.testing.assert_array_equal(pixel_values, ref["pixel_values"])
    np.testing.assert_array_equal(position_ids, ref["image_position_ids"])
    assert counts == list(ref["num_soft_tokens_per_image"]) == [3, 16]
    with pytest.raises(MediaError, match="multiples of"):
        process_image(_image(37, 12), Gemma4ImageConfig(**settings))
    with pytest.raises(MediaError, match="above the budget"):
        process_image(_image(120, 120), Gemma4ImageConfig(**settings))


# ---------------------------------------------------------------------------------------------------------------
# Settings


def test_config_from_folder(tiny_gemma4_small_dir):
    cfg = Gemma4ImageConfig.from_folder(tiny_gemma4_small_dir)
    assert (cfg.patch_size, cfg.max_soft_tokens, cfg.pooling_kernel_size, cfg.resample) == (4, 70, 3, 3)
    assert not cfg.do_normalize and cfg.max_patches == 630 and cfg.side_multiple == 12 and cfg.patch_dim == 48
    assert Gemma4ImageConfig.from_dict({}) == Gemma4ImageConfig()
    assert Gemma4ImageConfig() == Gemma4ImageConfig(**{k: getattr(Gemma4ImageProcessorPil, k) for k in (
        "patch_size", "max_soft_tokens", "pooling_kernel_size", "rescale_factor", "do_resize", "do_rescale",
        "do_normalize", "do_convert_rgb")}, resample=int(Gemma4ImageProcessorPil.resample))


@pytest.mark.parametrize("bad,match", [
    ({"max_soft_tokens": 100}, "max_soft_tokens must be one of"),
    ({"max_soft_tokens": "280"}, "must be an integer"),
    ({"patch_size": 0}, "positive integer"),
    ({"patch_size": 1000}, "above the supported maximum"),
    ({"pooling_kernel_size": 40}, "above the supported maximum"),
    ({"patch_size": 64, "max_soft_tokens": 1120, "pooling_kernel_size": 8}, "values per image"),
    ({"do_resize": "yes"}, "true or false"),
    ({"image_std": [1.0, 0.0, 1.0]}, "must not contain 0"),
    ({"resample": 99}, "PIL resampling filter"),
])
def test_bad_settings_are_refused(bad, match):
    with pytest.raises(CheckpointError, match=match):
        Gemma4ImageConfig.from_dict(bad)


def test_bad_settings_in_a_folder(tmp_path):
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": {"max_soft_tokens": 300}}))
    with pytest.raises(CheckpointError, match="processor_config.json"):
        Gemma4ImageConfig.from_folder(tmp_path)
    with pytest.raises(CheckpointError, match="folder not found"):
        Gemma4ImageConfig.from_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no image processor config"):
        Gemma4ImageConfig.from_folder(tmp_path / "empty")


def test_budget_override():
    cfg = Gemma4ImageConfig().with_max_soft_tokens(1120)
    assert cfg.max_patches == 10080
    with pytest.raises(MediaError, match="max_soft_tokens must be one of"):
        cfg.with_max_soft_tokens(281)


def test_unreadable_images_are_refused():
    with pytest.raises(MediaError):
        process_image(np.zeros((0, 5, 3), np.uint8), Gemma4ImageConfig())
    with pytest.raises(MediaError):
        process_images([], Gemma4ImageConfig())


# ---------------------------------------------------------------------------------------------------------------
# Prompt expansion


def test_replacement_strings():
    assert image_replacement(3) == "<|image><|image|><|image|><|image|><image|>"
    assert audio_replacement(2) == "<|audio><|audio|><|audio|><audio|>"
    assert audio_replacement(0) == "<|audio><audio|>"


def test_expand_placeholders_in_order():
    prompt = "a<|image|>b<|audio|>c<|image|>"
    assert expand_placeholders(prompt, [1, 2], [1]) == (
        "a<|image><|image|><image|>b<|audio><|audio|><audio|>c<|image><|image|><|image|><image|>")
    assert expand_placeholders("no media", [], []) == "no media"
    with pytest.raises(PromptError, match="2 <\\|image\\|> markers but 1 images"):
        expand_placeholders(prompt, [1], [1])
    with pytest.raises(PromptError, match="1 <\\|audio\\|> markers but 0 audio"):
        expand_placeholders(prompt, [1, 2], [])
    with pytest.raises(PromptError, match="non-negative integer"):
        expand_placeholders(prompt, [1, -2], [1])
    with pytest.raises(PromptError, match="non-negative integer"):
        expand_placeholders(prompt, [1, 2.5], [1])


def test_media_tokens_from_tokenizer(tiny_gemma4_small_dir):
    tokenizer = load_tokenizer(tiny_gemma4_small_dir)
    assert Gemma4MediaTokens.from_tokenizer(tokenizer) == Gemma4MediaTokens()
    with pytest.raises(ValueError):
        Gemma4MediaTokens(image_token="")


_QUESTION = "Describe this image in one sentence."


def _our_ids(folder, messages, image_cfg, audio_counts=()) -> list[int]:
    """The prompt token ids the omnijax pieces give: render, expand, tokenize without added specials."""
    tokenizer = load_tokenizer(folder)
    normalized = normalize_messages(messages)
    text = render_chat(tokenizer, normalized)
    counts = [process_image(part["image"], image_cfg).num_soft_tokens
              for m in normalized for part in m["content"] if part["type"] == "image"]
    text = expand_placeholders(text, counts, audio_counts, Gemma4MediaTokens.from_tokenizer(tokenizer))
    return encode_prompt(tokenizer, text).tolist()


def _reference(processor, messages, **kwargs):
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return processor(text=[text], **kwargs)


def test_token_ids_match_processor(tiny_gemma4_small_dir, hf_gemma4_small):
    _, processor = hf_gemma4_small
    image_cfg = Gemma4ImageConfig.from_folder(tiny_gemma4_small_dir)
    a, b = _image(50, 80, 1), _image(300, 40, 2)

    cases = {
        "text only": ([{"role": "system", "content": "Answer briefly."},
                       {"role": "user", "content": "What is the capital of France?"}], []),
        "one image": ([{"role": "user", "content": [{"type": "image", "image": a},
                                                    {"type": "text", "text": _QUESTION}]}], [a]),
        "two images interleaved": ([
            {"role": "user", "content": [{"type": "text", "text": "Here is the first picture:"},
                                         {"type": "image", "image": a},
                                         {"type": "text", "text": "and the second one:"},
                                         {"type": "image", "image": b},
                                         {"type": "text", "text": "Compare them."}]},
            {"role": "assistant", "content": "The first is wider."},
            {"role": "user", "content": "Which one is taller?"}], [a, b]),
    }
    for name, (messages, images) in cases.items():
        ref = _reference(processor, messages, **({"images": [images]} if images else {}))
        ours = _our_ids(tiny_gemma4_small_dir, messages, image_cfg)
        assert ours == ref["input_ids"][0], name
        if images:
            pixel_values, position_ids, counts = process_images(images, image_cfg)
            np.testing.assert_array_equal(pixel_values, ref["pixel_values"])
            np.testing.assert_array_equal(position_ids, ref["image_position_ids"])
            image_id = processor.tokenizer.convert_tokens_to_ids("<|image|>")
            assert ours.count(image_id) == sum(counts) > 0


def test_audio_expansion_matches_processor(tiny_gemma4_small_dir, hf_gemma4_small):
    """The audio marker expands the way the processor expands it, given the processor's own count per clip."""
    _, processor = hf_gemma4_small
    image_cfg = Gemma4ImageConfig.from_folder(tiny_gemma4_small_dir)
    image = _image(40, 40, 3)
    clip = (0.1 * np.random.default_rng(0).standard_normal(12000)).astype(np.float32)
    messages = [{"role": "user", "content": [{"type": "audio", "audio": clip}, {"type": "image", "image": image},
                                             {"type": "text", "text": "What do you hear and see?"}]}]
    ref = _reference(processor, messages, images=[[image]], audio=[clip])
    ids = list(ref["input_ids"][0])
    audio_count = ids.count(processor.tokenizer.convert_tokens_to_ids("<|audio|>"))
    assert audio_count > 0
    assert _our_ids(tiny_gemma4_small_dir, messages, image_cfg, [audio_count]) == ids
