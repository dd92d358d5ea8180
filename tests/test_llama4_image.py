"""Llama 4 image preprocessing and prompt placeholders against transformers' Llama4ImageProcessor / Llama4Processor
(run in a subprocess, see tests/fixtures/llama4_reference.py), plus hand-checked cases of the pure functions."""

from __future__ import annotations

import json
import re

import numpy as np
import PIL.Image
import pytest

import fixtures.llama4_reference as lr
from omnijax.common.errors import CheckpointError, MediaError, PromptError
from omnijax.preprocess.llama4 import image as llama4_image
from omnijax.preprocess.images import load_image
from omnijax.preprocess.llama4.image import (Llama4ImageConfig, best_canvas, image_tiles, process_images, resample_weights,
                                     resize_uint8, resized_size, round_bf16, split_tiles, supported_canvases)
from omnijax.preprocess.llama4.prompt import (IMAGE_START, PATCH, Llama4PromptConfig, expand_image_placeholders,
                                      image_prompt, num_patch_tokens)
from omnijax.preprocess.prompts import normalize_messages, render_chat
from omnijax.preprocess.user_text import encode_prompt
from omnijax.preprocess.tokenizer import load_tokenizer
from fixtures.llama4_tokenizer import SPECIAL_TOKEN_IDS

pytestmark = pytest.mark.reference


def _config(settings: dict) -> Llama4ImageConfig:
    return Llama4ImageConfig.from_dict(settings)


def _assert_images_match(reference, paths, request: str, names: list[str], settings: dict):
    cfg = _config(settings)
    ref_tiles = lr.tiles_of(reference, request)
    ref_layouts = reference[f"{request}/aspect_ratios"]
    assert len(ref_tiles) == len(names)
    ours = process_images([load_image(paths[n]) for n in names], cfg)
    capability = str(reference["environment/cpu_capability"])
    for name, got, ref, layout in zip(names, ours, ref_tiles, ref_layouts):
        assert (got.rows, got.cols) == tuple(int(v) for v in layout), name
        assert got.tiles.dtype == np.float32 and got.tiles.shape == ref.shape, (name, got.tiles.shape, ref.shape)
        diff = np.abs(got.tiles - ref)
        assert diff.max() == 0.0, (f"{name}: {int((diff > 0).sum())} values differ, max {diff.max()} "
                                   f"(reference CPU capability {capability})")


# ---------------------------------------------------------------------------------------------------------------
# Pure functions, checked by hand.


def test_supported_canvases_order():
    # max 4: n = 4 -> (1,4), (2,2), (4,1); n = 3 -> (1,3), (3,1); n = 2 -> (1,2), (2,1); n = 1 -> (1,1),
    # grouped by rows / cols in order of first appearance: 1/4, 1, 4, 1/3, 3, 1/2, 2.
    assert supported_canvases(4) == [(1, 4), (2, 2), (1, 1), (4, 1), (1, 3), (3, 1), (1, 2), (2, 1)]
    assert supported_canvases(1) == [(1, 1)]
    assert len(supported_canvases(16)) == sum(len([d for d in range(1, n + 1) if n % d == 0]) for n in range(1, 17))
    with pytest.raises(ValueError):
        supported_canvases(0)


def test_best_canvas_hand_cases():
    # 200 x 300 image, 224 tiles, up to 5: the smallest upscale is 1.12 (224 / 200), reached by 1 x 2 .. 1 x 5;
    # the least area wins.
    assert best_canvas(200, 300, 224, 5) == (1, 2)
    # 1000 x 1000, 100 tiles, up to 4: no canvas upscales; 2 x 2 gives the largest scale (0.2).
    assert best_canvas(1000, 1000, 100, 4) == (2, 2)
    # 1000 x 500: scale 0.2 for 2 x 1, 3 x 1, 4 x 1 and 2 x 2; 2 x 1 has the least area.
    assert best_canvas(1000, 500, 100, 4) == (2, 1)
    # 50 x 50: every canvas upscales; the smallest upscale (2) is shared by 1 x 1 .. 1 x 4 and 4 x 1 .. : 1 x 1.
    assert best_canvas(50, 50, 100, 4) == (1, 1)
    # ... and the largest upscale (4, by 2 x 2) with resize_to_max_canvas.
    assert best_canvas(50, 50, 100, 4, resize_to_max_canvas=True) == (2, 2)
    with pytest.raises(MediaError):
        best_canvas(0, 5, 100, 4)


def test_resized_size_hand_cases():
    # Fits the 1 x 2 canvas as it is (each side capped at max(side, tile)): not resized.
    assert resized_size(200, 300, (1, 2), 224) == (200, 300)
    # 20 x 30 into one 36-pixel tile: the width limits (36 / 30 < 36 / 20): 30 -> 36, 20 -> floor(24.0).
    assert resized_size(20, 30, (1, 1), 36) == (24, 36)
    # 1000 x 500 into 2 x 1 tiles of 100: both scales 0.2, the height fills: 200 x 100.
    assert resized_size(1000, 500, (2, 1), 100) == (200, 100)
    # With resize_to_max_canvas the image is upscaled to fill the canvas: 50 x 50 -> 200 x 200.
    assert resized_size(50, 50, (2, 2), 100, resize_to_max_canvas=True) == (200, 200)
    # A 1-pixel-high panorama keeps at least one row.
    assert resized_size(1, 1000, (1, 4), 100) == (1, 400)


def test_split_tiles_row_major():
    canvas = np.arange(3 * 4 * 6, dtype=np.float32).reshape(3, 4, 6)  # a 2 x 3 canvas of 2-pixel tiles
    tiles = split_tiles(canvas, 2, 3)
    assert tiles.shape == (6, 3, 2, 2)
    for r in range(2):
        for c in range(3):
            np.testing.assert_array_equal(tiles[r * 3 + c], canvas[:, 2 * r:2 * r + 2, 2 * c:2 * c + 2])
    with pytest.raises(MediaError):
        split_tiles(canvas, 3, 3)


def test_resample_weights_hand_case():
    # Bilinear 4 -> 2: scale 2, support 2. Output 0 (centre 1) takes inputs 0..2 with triangle weights
    # 0.75, 0.75, 0.25 (normalised 3/7, 3/7, 1/7); output 1 (centre 3) inputs 1..3 with 1/7, 3/7, 3/7. The largest
    # weight 3/7 allows 16 bits: round(3/7 * 2**16) = 28087, round(1/7 * 2**16) = 9362.
    xmin, weights, precision = resample_weights(4, 2, "bilinear")
    assert precision == 16
    np.testing.assert_array_equal(xmin, [0, 1])
    np.testing.assert_array_equal(weights[:, :3], [[28087, 28087, 9362], [9362, 28087, 28087]])
    assert not weights[:, 3:].any()
    # [0, 70, 140, 210] -> 3/7*70 + 1/7*140 = 50 and 1/7*70 + 3/7*(140 + 210) = 160 (fixed point, half rounded
    # up after the shift).
    row = np.array([0, 70, 140, 210], np.uint8)
    image = np.broadcast_to(row, (3, 1, 4)).copy()
    np.testing.assert_array_equal(resize_uint8(image, 1, 2)[:, 0], [[50, 160]] * 3)
    # An unchanged size is the identity.
    np.testing.assert_array_equal(resize_uint8(image, 1, 4), image)


def test_round_bf16_ties_to_even():
    one = np.float32(1.0)
    half_ulp = np.float32(2.0 ** -8)  # bfloat16 has 7 mantissa bits: 1 + 2**-7 is the next value after 1
    got = round_bf16(np.array([one + half_ulp, one + 3 * half_ulp, one + 1.5 * half_ulp], np.float32))
    np.testing.assert_array_equal(got, np.array([1.0, 1.0 + 2.0 ** -6, 1.0 + 2.0 ** -7], np.float32))


def test_image_prompt_forms():
    # One tile: no tile rows, just the global form.
    assert image_prompt(1, 1, 2) == "<|image_start|><|image|><|patch|><|patch|><|image_end|>"
    # 2 x 2 tiles of 1 token, then the global tile.
    assert image_prompt(2, 2, 1) == (
        "<|image_start|>"
        "<|patch|><|tile_x_separator|><|patch|><|tile_y_separator|>"
        "<|patch|><|tile_x_separator|><|patch|><|tile_y_separator|>"
        "<|image|><|patch|><|image_end|>")
    assert num_patch_tokens(1, 1, 9) == 9 and num_patch_tokens(2, 3, 9) == 63
    with pytest.raises(PromptError):
        image_prompt(0, 1, 1)


def test_several_images_get_their_own_runs():
    text = "a <|image|> b <|image|> c <|image|>"
    out = expand_image_placeholders(text, [(2, 3), (1, 1), (1, 2)], 2)
    runs = out.split(IMAGE_START)[1:]
    assert [run.count(PATCH) for run in runs] == [14, 2, 6]  # (6 + 1) * 2, 1 * 2, (2 + 1) * 2
    assert out.startswith("a <|image_start|>") and out.endswith("<|image_end|>")
    assert " b <|image_start|><|image|>" in out  # the second image's run follows " b ", not the first one's
    with pytest.raises(PromptError, match=re.escape("3 <|image|> placeholders for 2 images")):
        expand_image_placeholders(text, [(1, 1), (1, 1)], 2)


# ---------------------------------------------------------------------------------------------------------------
# Settings.


def test_config_from_checkpoint_folders(tiny_llama4_dir, tmp_path):
    cfg = Llama4ImageConfig.from_folder(tiny_llama4_dir)
    assert (cfg.tile_size, cfg.max_patches, cfg.resample, cfg.resize_to_max_canvas) == (36, 6, 2, False)
    prompt = Llama4PromptConfig.from_folder(tiny_llama4_dir)
    assert (prompt.patch_size, prompt.pixel_shuffle_ratio, prompt.image_token) == (6, 0.5, "<|image|>")
    assert prompt.tokens_per_tile(cfg.tile_size) == 9
    # The layout hub checkpoints ship: preprocessor_config.json with the image settings, a flat processor config.
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Llama4ImageProcessorFast", "max_patches": 16, "resample": 2,
        "size": {"height": 336, "width": 336}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "rescale_factor": 1 / 255, "resize_to_max_canvas": False, "processor_class": "Llama4Processor"}))
    (tmp_path / "processor_config.json").write_text(json.dumps({
        "fake_image_token": "<|image|>", "image_token": "<|image|>", "patch_size": 14,
        "processor_class": "Llama4Processor"}))
    hub = Llama4ImageConfig.from_folder(tmp_path)
    assert (hub.tile_size, hub.max_patches) == (336, 16)
    assert Llama4PromptConfig.from_folder(tmp_path).tokens_per_tile(336) == 144
    (tmp_path / "processor_config.json").unlink()
    assert Llama4PromptConfig.from_folder(tmp_path) == Llama4PromptConfig()


@pytest.mark.parametrize("settings,message", [
    ({"size": {"height": 336, "width": 224}}, "square"),
    ({"do_resize": False}, "do_resize"),
    ({"max_patches": 0}, "max_patches"),
    ({"max_patches": 100000}, "max_patches"),
    ({"size": {"height": 100000, "width": 100000}}, "tile_size"),
    ({"max_patches": 256, "size": {"height": 2048, "width": 2048}}, "canvas limit"),
    ({"resample": 0}, "resample"),
    ({"image_std": [0.5, 0.0, 0.5]}, "image_std"),
    ({"do_rescale": False}, "do_normalize"),
    ({"size": "big"}, "size"),
])
def test_bad_settings_are_checkpoint_errors(settings, message):
    with pytest.raises(CheckpointError, match=message):
        Llama4ImageConfig.from_dict(settings, source="test config")


def test_bad_prompt_settings(tmp_path):
    (tmp_path / "processor_config.json").write_text(json.dumps({"patch_size": 0}))
    with pytest.raises(CheckpointError, match="patch_size"):
        Llama4PromptConfig.from_folder(tmp_path)
    with pytest.raises(CheckpointError, match="tokens per tile"):
        Llama4PromptConfig(patch_size=14).tokens_per_tile(10)


def test_oversized_and_unreadable_images(monkeypatch, tmp_path):
    monkeypatch.setattr(llama4_image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(MediaError, match="over the limit"):
        image_tiles(PIL.Image.new("RGB", (20, 20)), Llama4ImageConfig(tile_size=8, max_patches=4))
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(MediaError):
        image_tiles(str(bad), Llama4ImageConfig(tile_size=8, max_patches=4))


# ---------------------------------------------------------------------------------------------------------------
# Parity with transformers.


def test_tiles_match_reference_tiny_tiles(llama4_reference, llama4_image_paths):
    """small / exact / odd / large / wide / tall / tiny images through 36-pixel tiles (up to 6)."""
    _assert_images_match(llama4_reference, llama4_image_paths, "tiny", lr.TINY_IMAGES, lr.TINY_TILES)
    layouts = [tuple(int(v) for v in r) for r in llama4_reference["tiny/aspect_ratios"]]
    # The set covers one tile, several tiles and both extreme aspect ratios.
    assert layouts[0] == (1, 1) and (1, 6) in layouts and (6, 1) in layouts and (3, 2) in layouts


def test_tiles_match_reference_real_scale(llama4_reference, llama4_image_paths):
    """336-pixel tiles, up to 16: a photo and a panorama (downscaled) and a small image (upscaled)."""
    _assert_images_match(llama4_reference, llama4_image_paths, "real", lr.REAL_IMAGES, lr.REAL_TILES)


def test_tiles_match_reference_bicubic_and_max_canvas(llama4_reference, llama4_image_paths):
    _assert_images_match(llama4_reference, llama4_image_paths, "bicubic", ["large", "small"],
                         {**lr.TINY_TILES, "resample": 3})
    _assert_images_match(llama4_reference, llama4_image_paths, "max_canvas", ["small", "odd", "large", "tiny"],
                         {**lr.TINY_TILES, "resize_to_max_canvas": True})


def test_tiles_match_reference_size_sweep(llama4_reference, llama4_image_paths):
    """116 sizes from 1 x 1 to 77 x 13 through 8-pixel tiles (up to 5): layouts, resize sizes and roundings,
    float32 quirks of the reference's size arithmetic included."""
    names = list(lr.sweep_image_specs())
    _assert_images_match(llama4_reference, llama4_image_paths, "sweep", names, lr.SWEEP_TILES)
    layouts = {tuple(int(v) for v in r) for r in llama4_reference["sweep/aspect_ratios"]}
    assert len(layouts) >= 8, layouts
    sizes = dict(zip(names, (ours.shape for ours in lr.tiles_of(llama4_reference, "sweep"))))
    assert sizes["sweep_41x41"][0] == 5  # 2 x 2 + global


def _our_prompt_ids(folder, messages, images):
    tokenizer = load_tokenizer(folder)
    image_cfg = Llama4ImageConfig.from_folder(folder)
    prompt_cfg = Llama4PromptConfig.from_folder(folder)
    parts = iter(images)
    filled = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else [
        {"type": "image", "image": next(parts)} if p["type"] == "image" else p for p in m["content"]]}
        for m in messages]
    filled = normalize_messages(filled)
    text = render_chat(tokenizer, filled)
    tiles = process_images([load_image(p) for p in images], image_cfg) if images else []
    text = expand_image_placeholders(text, [(t.rows, t.cols) for t in tiles],
                                     prompt_cfg.tokens_per_tile(image_cfg.tile_size), prompt_cfg.image_token)
    ids = encode_prompt(tokenizer, text)
    return ids, tiles


@pytest.mark.parametrize("case", ["text_only", "one_small", "one_large", "two_images", "mixed_tiles"])
def test_token_ids_match_reference_processor(case, tiny_llama4_dir, llama4_reference, llama4_image_paths):
    messages, names = next((m, n) for c, m, n in lr.CHAT_CASES if c == case)
    ids, tiles = _our_prompt_ids(tiny_llama4_dir, messages, [llama4_image_paths[n] for n in names])
    ref_ids = llama4_reference[f"{case}/input_ids"]
    assert ids.tolist() == ref_ids.tolist()
    bos = SPECIAL_TOKEN_IDS["<|begin_of_text|>"]
    assert ids[0] == bos and (ids == bos).sum() == 1
    starts = np.flatnonzero(ids == SPECIAL_TOKEN_IDS["<|image_start|>"])
    ends = np.flatnonzero(ids == SPECIAL_TOKEN_IDS["<|image_end|>"])
    assert len(starts) == len(ends) == len(names)
    for start, end, t in zip(starts, ends, tiles):  # one run per image, with that image's patch count
        tokens_per_tile = 9  # (36 // 6)**2 // 4
        assert (ids[start:end] == SPECIAL_TOKEN_IDS["<|patch|>"]).sum() == num_patch_tokens(t.rows, t.cols,
                                                                                             tokens_per_tile)
    if names:
        np.testing.assert_array_equal(np.concatenate([t.tiles for t in tiles]),
                                      llama4_reference[f"{case}/pixel_values"])
