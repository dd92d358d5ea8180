"""Qwen3-Omni image preprocessing and 3-D MRoPE positions against transformers.

References: ``Qwen2VLImageProcessorPil`` (what ``AutoImageProcessor`` picks for Qwen3-Omni without torchvision) and
``Qwen3OmniMoeThinkerForConditionalGeneration.get_rope_index`` on a tiny randomly initialised thinker.
"""

from __future__ import annotations

import json

import numpy as np
import PIL.Image
import pytest
import torch
from transformers import AutoImageProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeThinkerConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeThinkerForConditionalGeneration,
    _get_feat_extract_output_lengths,
)

from omnijax.common.errors import CheckpointError, MediaError, PromptError
from omnijax.preprocess.qwen3_omni.mrope import (
    MRopeTokens,
    audio_tokens_from_frames,
    mrope_positions,
    mrope_positions_batch,
)
from omnijax.preprocess.qwen3_omni.image import (
    QwenImageConfig,
    image_patches,
    num_image_tokens,
    patchify,
    process_images,
    smart_resize,
)

pytestmark = pytest.mark.reference

TOL = 1e-5

# Qwen3-Omni's image settings (patch 16, mean = std = 0.5) with small pixel bounds so the tests stay fast.
OMNI_CFG = QwenImageConfig(
    patch_size=16,
    temporal_patch_size=2,
    merge_size=2,
    min_pixels=64 * 32 * 32,
    max_pixels=256 * 32 * 32,
    image_mean=(0.5, 0.5, 0.5),
    image_std=(0.5, 0.5, 0.5),
)


def hf_image_processor(cfg: QwenImageConfig) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(
        patch_size=cfg.patch_size,
        temporal_patch_size=cfg.temporal_patch_size,
        merge_size=cfg.merge_size,
        size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
        image_mean=list(cfg.image_mean),
        image_std=list(cfg.image_std),
        resample=cfg.resample,
        rescale_factor=cfg.rescale_factor,
        do_resize=cfg.do_resize,
        do_rescale=cfg.do_rescale,
        do_normalize=cfg.do_normalize,
        do_convert_rgb=cfg.do_convert_rgb,
    )


def hf_process(cfg, images):
    out = hf_image_processor(cfg)(images, return_tensors="np")
    return np.asarray(out["pixel_values"]), np.asarray(out["image_grid_thw"])


def random_image(rng, height, width, mode="RGB"):
    channels = {"RGB": 3, "RGBA": 4}[mode]
    return PIL.Image.fromarray(rng.integers(0, 256, (height, width, channels), dtype=np.uint8), mode=mode)


def assert_image_parity(cfg, images):
    ours, ours_grid = process_images(images, cfg)
    ref, ref_grid = hf_process(cfg, images)
    assert ours.dtype == np.float32 and ref.dtype == np.float32
    assert ours_grid.dtype == np.int64
    np.testing.assert_array_equal(ours_grid, ref_grid)
    assert ours.shape == ref.shape == (int(ours_grid.prod(axis=1).sum()), cfg.patch_dim)
    diff = float(np.abs(ours - ref).max())
    assert diff <= TOL, diff
    return ours_grid


@pytest.fixture
def rng():
    return np.random.default_rng(7)


# ---------------------------------------------------------------------------------------------------------------
# Image processing


def test_auto_image_processor_without_torchvision_is_the_pil_backend(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 16})
    )
    assert type(AutoImageProcessor.from_pretrained(tmp_path)).__name__ == "Qwen2VLImageProcessorPil"


@pytest.mark.parametrize(
    "height, width, expect_grid",
    [
        (30, 40, None),  # far below min_pixels: scaled up
        (97, 131, None),  # odd sides
        (333, 517, None),  # inside the bounds: rounded to multiples of 32
        (1000, 1500, None),  # above max_pixels: scaled down
        (64, 64, (1, 16, 16)),  # 4096 pixels -> ceil to exactly min_pixels
    ],
)
def test_pixel_values_match_reference(rng, height, width, expect_grid):
    grid = assert_image_parity(OMNI_CFG, [random_image(rng, height, width)])
    tokens = num_image_tokens(grid[0], OMNI_CFG.merge_size)
    assert OMNI_CFG.min_pixels <= grid[0, 1] * grid[0, 2] * 16 * 16
    if height * width > OMNI_CFG.max_pixels:
        assert grid[0, 1] * grid[0, 2] * 16 * 16 <= OMNI_CFG.max_pixels
    assert tokens == grid[0, 1] * grid[0, 2] // 4
    if expect_grid is not None:
        assert tuple(grid[0]) == expect_grid


def test_several_images_default_config_and_conversions(rng):
    """Class-default settings (patch 14, CLIP mean / std); an RGBA and a grey image are converted like the reference."""
    cfg = QwenImageConfig(min_pixels=56 * 56, max_pixels=200 * 28 * 28)
    grey = PIL.Image.fromarray(rng.integers(0, 256, (45, 71), dtype=np.uint8), mode="L")
    images = [random_image(rng, 50, 90), random_image(rng, 61, 33, "RGBA"), grey, random_image(rng, 400, 300)]
    grid = assert_image_parity(cfg, images)
    assert len(grid) == 4 and (grid[:, 0] == 1).all()


def test_no_resize_and_no_normalize(rng):
    cfg = QwenImageConfig(patch_size=8, do_resize=False, do_normalize=False)
    assert_image_parity(cfg, [random_image(rng, 48, 32), random_image(rng, 16, 64)])
    with pytest.raises(MediaError, match="multiple of 16"):
        process_images([random_image(rng, 40, 32)], cfg)


def test_extreme_aspect_ratio_is_a_media_error(rng):
    image = random_image(rng, 4, 1000)  # ratio 250
    with pytest.raises(ValueError, match="aspect ratio"):
        hf_process(OMNI_CFG, [image])
    with pytest.raises(MediaError, match="aspect ratio 250.0"):
        process_images([image], OMNI_CFG)
    assert_image_parity(OMNI_CFG, [random_image(rng, 5, 1000)])  # ratio 200 is still accepted


def test_patch_order_is_merge_block_order_with_temporal_copies():
    """Independent of the reference: a 4 x 4-patch image whose pixels hold their own patch index."""
    patch, merge, temporal = 2, 2, 3
    patch_rows, patch_cols = np.meshgrid(np.arange(8) // patch, np.arange(8) // patch, indexing="ij")
    image = np.stack([patch_rows * 4 + patch_cols, patch_rows * 4 + patch_cols + 100, np.zeros((8, 8))])
    rows = patchify(image.astype(np.float32), patch, merge, temporal)
    assert rows.shape == (16, 3 * temporal * patch * patch)
    first_value = rows.reshape(16, 3, temporal, patch, patch)[:, 0, 0, 0, 0]
    # blocks row-major, 2 x 2 patches row-major inside each block
    np.testing.assert_array_equal(first_value, [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15])
    per_patch = rows.reshape(16, 3, temporal, patch * patch)
    np.testing.assert_array_equal(per_patch, np.broadcast_to(per_patch[:, :, :1], per_patch.shape))
    np.testing.assert_array_equal(per_patch[:, 1, 0, 0], first_value + 100)


def test_image_patches_single_image(rng):
    image = random_image(rng, 70, 50)
    patches, grid = image_patches(image, OMNI_CFG)
    ref, ref_grid = hf_process(OMNI_CFG, [image])
    assert grid == tuple(int(v) for v in ref_grid[0])
    assert float(np.abs(patches - ref).max()) <= TOL


# ---------------------------------------------------------------------------------------------------------------
# smart_resize


def test_smart_resize_bankers_rounding():
    # 70 / 28 = 2.5 and 126 / 28 = 4.5 round to even (56, 112); 42 / 28 = 1.5 and 98 / 28 = 3.5 round up.
    assert smart_resize(70, 126, 28, 1, 10**9) == (56, 112)
    assert smart_resize(42, 98, 28, 1, 10**9) == (56, 112)
    assert hf_smart_resize(70, 126, 28, 1, 10**9) == (56, 112)


def test_smart_resize_matches_reference_on_a_sweep():
    sides = sorted({*range(1, 200, 3), 14, 42, 70, 98, 126, 154, 182, 16, 48, 80, 112, 144, 513, 999, 1023, 4000})
    bounds = [(1, 10**9), (56 * 56, 28 * 28 * 1280), (64 * 32 * 32, 256 * 32 * 32), (3136, 12845056), (900, 1000)]
    checked = 0
    for factor in (28, 32):
        for min_pixels, max_pixels in bounds:
            for h in sides:
                for w in sides:
                    if max(h, w) / min(h, w) > 200:
                        with pytest.raises(MediaError):
                            smart_resize(h, w, factor, min_pixels, max_pixels)
                        continue
                    ours = smart_resize(h, w, factor, min_pixels, max_pixels)
                    assert ours == hf_smart_resize(h, w, factor, min_pixels, max_pixels), (h, w, factor, min_pixels)
                    checked += 1
    assert checked > 50_000
    with pytest.raises(MediaError, match="no pixels"):
        smart_resize(0, 10, 28, 1, 100)


# ---------------------------------------------------------------------------------------------------------------
# Config reading


def _same_settings(ours: QwenImageConfig, ref: Qwen2VLImageProcessorPil):
    assert ours.min_pixels == ref.size["shortest_edge"] and ours.max_pixels == ref.size["longest_edge"]
    assert (ours.patch_size, ours.temporal_patch_size, ours.merge_size) == (
        ref.patch_size, ref.temporal_patch_size, ref.merge_size)
    assert ours.image_mean == pytest.approx(tuple(ref.image_mean)) and ours.image_std == pytest.approx(
        tuple(ref.image_std))
    assert ours.resample == int(ref.resample) and ours.rescale_factor == ref.rescale_factor
    assert (ours.do_resize, ours.do_rescale, ours.do_normalize, ours.do_convert_rgb) == (
        ref.do_resize, ref.do_rescale, ref.do_normalize, ref.do_convert_rgb)


def test_from_folder_reads_what_transformers_saves(tmp_path):
    ref = hf_image_processor(OMNI_CFG)
    ref.save_pretrained(tmp_path)
    ours = QwenImageConfig.from_folder(tmp_path)
    assert ours == OMNI_CFG
    _same_settings(ours, Qwen2VLImageProcessorPil.from_pretrained(tmp_path))


def test_from_dict_hub_style_keys_and_defaults():
    hub = {  # top-level min / max pixels (they win over "size"), feature extractor keys alongside
        "min_pixels": 3136, "max_pixels": 12845056, "size": {"shortest_edge": 1, "longest_edge": 2},
        "patch_size": 16, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "feature_size": 128, "sampling_rate": 16000, "image_processor_type": "Qwen2VLImageProcessor",
    }
    keep = {k: v for k, v in hub.items() if k not in ("feature_size", "sampling_rate", "image_processor_type")}
    _same_settings(QwenImageConfig.from_dict(hub), Qwen2VLImageProcessorPil(**keep))
    _same_settings(QwenImageConfig.from_dict({}), Qwen2VLImageProcessorPil())
    assert QwenImageConfig.from_dict({}) == QwenImageConfig()


def test_processor_config_section_wins(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"patch_size": 14}))
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": {"patch_size": 16}}))
    assert QwenImageConfig.from_folder(tmp_path).patch_size == 16
    (tmp_path / "processor_config.json").write_text(json.dumps({"feature_extractor": {}}))
    assert QwenImageConfig.from_folder(tmp_path).patch_size == 14


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "cannot read"),
        (json.dumps({"size": {"shortest_edge": 100}}), "pixel bounds"),
        (json.dumps({"size": {"min_pixels": 10, "max_pixels": 100}}), "pixel bounds"),
        (json.dumps({"patch_size": "16"}), "patch_size"),
        (json.dumps({"image_std": [0.5, 0.0, 0.5]}), "image_std"),
        (json.dumps({"do_resize": "yes"}), "do_resize"),
    ],
)
def test_bad_config_is_a_checkpoint_error(tmp_path, content, message):
    (tmp_path / "preprocessor_config.json").write_text(content)
    with pytest.raises(CheckpointError, match=message):
        QwenImageConfig.from_folder(tmp_path)


def test_missing_config_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="no image processor config"):
        QwenImageConfig.from_folder(tmp_path)
    with pytest.raises(CheckpointError, match="not found"):
        QwenImageConfig.from_folder(tmp_path / "absent")


# ---------------------------------------------------------------------------------------------------------------
# MRoPE positions

IMG, AUD, VID, VS, VE, AS, AE = 250, 251, 252, 253, 249, 254, 248
TOKENS = MRopeTokens(
    image_token_id=IMG, audio_token_id=AUD, video_token_id=VID, vision_start_token_id=VS, audio_start_token_id=AS,
    spatial_merge_size=2, position_id_per_seconds=13,
)
N_WINDOW = 50


@pytest.fixture(scope="module")
def thinker():
    config = Qwen3OmniMoeThinkerConfig(
        text_config=dict(
            vocab_size=256, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=2, num_experts_per_tok=1,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
        ),
        vision_config=dict(
            depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4, spatial_merge_size=2,
            temporal_patch_size=2, out_hidden_size=16, num_position_embeddings=16, deepstack_visual_indexes=[0],
        ),
        audio_config=dict(
            num_mel_bins=8, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16,
            output_dim=16, n_window=N_WINDOW, downsample_hidden_size=8, max_source_positions=64,
        ),
        image_token_id=IMG, audio_token_id=AUD, video_token_id=VID, vision_start_token_id=VS,
        audio_start_token_id=AS, position_id_per_seconds=13,
    )
    return Qwen3OmniMoeThinkerForConditionalGeneration(config).eval()


def text(*ids):
    return list(ids)


def image_block(grid):
    return [VS] + [IMG] * num_image_tokens(grid, 2) + [VE]


def audio_block(frames):
    return [AS] + [AUD] * audio_tokens_from_frames(frames, N_WINDOW) + [AE]


def reference_rope_index(thinker, rows, images, audio_frames):
    """The reference on a left-padded batch. rows: token lists; images / audio_frames: per row lists."""
    seq = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (seq - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (seq - len(r)) + [1] * len(r) for r in rows])
    grids = [g for row in images for g in row]
    frames = [f for row in audio_frames for f in row]
    positions, deltas = thinker.get_rope_index(
        ids,
        image_grid_thw=torch.tensor(grids) if grids else None,
        attention_mask=mask,
        audio_seqlens=torch.tensor(frames) if frames else None,
    )
    return ids.numpy(), mask.numpy(), positions.numpy(), deltas.numpy()[:, 0]


PROMPTS = {
    "text": (text(1, 2, 3, 4, 5, 6), [], []),
    "one_image": (text(1, 2) + image_block((1, 4, 6)) + text(7, 8, 9), [(1, 4, 6)], []),
    "two_images": (
        text(1) + image_block((1, 6, 2)) + text(3, 4) + image_block((1, 2, 8)) + text(5),
        [(1, 6, 2), (1, 2, 8)], [],
    ),
    "image_two_frames": (text(1) + image_block((2, 4, 4)) + text(2, 3), [(2, 4, 4)], []),
    "one_audio": (text(1, 2) + audio_block(37) + text(3, 4), [], [37]),
    "two_audios": (audio_block(100) + text(3) + audio_block(317) + text(4, 5), [], [100, 317]),
    "image_audio": (
        text(1) + image_block((1, 4, 4)) + audio_block(60) + text(2, 3) + image_block((1, 2, 2)) + text(6),
        [(1, 4, 4), (1, 2, 2)], [60],
    ),
    "audio_image": (text(1) + audio_block(230) + image_block((1, 8, 2)) + text(2), [(1, 8, 2)], [230]),
}


def ours_single(name):
    ids, grids, frames = PROMPTS[name]
    lengths = [audio_tokens_from_frames(f, N_WINDOW) for f in frames]
    return mrope_positions(np.asarray(ids), image_grids=grids, audio_lengths=lengths, cfg=TOKENS)


@pytest.mark.parametrize("name", list(PROMPTS))
def test_positions_match_reference_single(thinker, name):
    ids, grids, frames = PROMPTS[name]
    _, _, ref_positions, ref_deltas = reference_rope_index(thinker, [ids], [grids], [frames])
    positions, delta = ours_single(name)
    assert positions.dtype == np.float32 and positions.shape == (3, len(ids))
    np.testing.assert_array_equal(positions, ref_positions[:, 0])
    assert delta == int(ref_deltas[0])
    # generation continues at the last prompt position + 1 on every axis
    np.testing.assert_array_equal(positions[:, -1] + 1, len(ids) + delta)


def test_image_positions_by_hand():
    positions, delta = ours_single("one_image")  # 2 text, start, 2 x 3 merged grid, end, 3 text
    np.testing.assert_array_equal(positions[:, :3], [[0, 1, 2]] * 3)
    np.testing.assert_array_equal(positions[0, 3:9], [3] * 6)
    np.testing.assert_array_equal(positions[1, 3:9], [3, 3, 3, 4, 4, 4])
    np.testing.assert_array_equal(positions[2, 3:9], [3, 4, 5, 3, 4, 5])
    np.testing.assert_array_equal(positions[:, 9:], [[6, 7, 8, 9]] * 3)
    assert delta == 10 - 13
    frames, _ = ours_single("image_two_frames")  # second frame at t = 13 (position_id_per_seconds)
    np.testing.assert_array_equal(frames[0, 2:10], [2] * 4 + [15] * 4)
    assert frames[0, 10] == 16


@pytest.mark.parametrize(
    "names",
    [
        ("text", "one_audio", "two_audios"),  # no image in the batch: the reference's text branch, padding 1
        ("one_image", "text", "two_audios", "image_audio"),  # an image: multimodal branch, padding 0
        ("audio_image", "two_images", "one_audio", "image_two_frames"),
    ],
)
def test_positions_match_reference_left_padded_batch(thinker, names):
    rows = [PROMPTS[n][0] for n in names]
    images = [PROMPTS[n][1] for n in names]
    frames = [PROMPTS[n][2] for n in names]
    ids, mask, ref_positions, ref_deltas = reference_rope_index(thinker, rows, images, frames)
    lengths = [[audio_tokens_from_frames(f, N_WINDOW) for f in row] for row in frames]
    positions, deltas = mrope_positions_batch(ids, mask, image_grids=images, audio_lengths=lengths, cfg=TOKENS)
    assert positions.dtype == np.int64 and deltas.dtype == np.int64
    np.testing.assert_array_equal(positions, ref_positions)
    np.testing.assert_array_equal(deltas, ref_deltas)
    pad_value = 0 if any(images) else 1
    assert (positions[:, mask == 0] == pad_value).all()


def test_one_token_row_delta_quirk_of_the_reference_text_branch(thinker):
    """A padded 1-token row in an image-free batch: the reference's delta takes the padding value 1 into its max."""
    rows = [[5], [1, 2, 3]]
    ids, mask, ref_positions, ref_deltas = reference_rope_index(thinker, rows, [[], []], [[], []])
    positions, deltas = mrope_positions_batch(ids, mask, cfg=TOKENS)
    np.testing.assert_array_equal(positions, ref_positions)
    assert list(ref_deltas) == [1, 0] and list(deltas) == [0, 0]


def test_audio_tokens_from_frames_matches_reference():
    frames = np.arange(1, 3001)
    np.testing.assert_array_equal(
        audio_tokens_from_frames(frames, N_WINDOW), _get_feat_extract_output_lengths(torch.tensor(frames)).numpy()
    )
    assert audio_tokens_from_frames(100) == 13 and isinstance(audio_tokens_from_frames(37), int)


@pytest.mark.parametrize(
    "ids, grids, lengths, message",
    [
        (text(1) + image_block((1, 4, 4)), [(1, 4, 6)], [], "needs 6 image tokens"),
        (text(1) + image_block((1, 4, 4)), [], [], "more image blocks"),
        (text(1, 2), [(1, 2, 2)], [], "1 image grids given"),
        (text(1) + [AS, AUD, AUD, AE], [], [3], "expected 3 audio tokens"),
        (text(1) + [AS, AUD, AE], [], [1, 2], "2 audio lengths given"),
        (text(1) + [VS, VID, VID, VE], [], [], "video"),
        (text(1, IMG, 2), [], [], "not inside a media block"),
        (text(1, VS, 2, VE), [], [], "not followed by image tokens"),
        (text(1) + [VS] + [IMG] * 2 + [VE], [(1, 3, 2)], [], "not usable"),
    ],
)
def test_mismatched_media_is_a_prompt_error(ids, grids, lengths, message):
    with pytest.raises(PromptError, match=message):
        mrope_positions(np.asarray(ids), image_grids=grids, audio_lengths=lengths, cfg=TOKENS)


def test_batch_errors_name_the_row():
    ids = np.asarray([[0, 1, IMG], [1, 2, 3]])
    with pytest.raises(PromptError, match="batch row 0"):
        mrope_positions_batch(ids, np.asarray([[0, 1, 1], [1, 1, 1]]), cfg=TOKENS)
    with pytest.raises(PromptError, match="one list of image grids"):
        mrope_positions_batch(ids, np.ones_like(ids), image_grids=[[]], cfg=TOKENS)


def test_tokens_from_thinker_config():
    thinker_config = {
        "image_token_id": IMG, "audio_token_id": AUD, "video_token_id": VID, "vision_start_token_id": VS,
        "audio_start_token_id": AS, "position_id_per_seconds": 13, "vision_config": {"spatial_merge_size": 2},
    }
    assert MRopeTokens.from_thinker_config(thinker_config) == TOKENS
    del thinker_config["vision_start_token_id"]
    with pytest.raises(CheckpointError, match="vision_start_token_id"):
        MRopeTokens.from_thinker_config(thinker_config)
