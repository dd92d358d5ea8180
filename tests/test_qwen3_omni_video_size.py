"""Qwen3-Omni videos sized as transformers' default call sizes them: ``Qwen3OmniMoeProcessor`` gives its video
processor its own frame size bounds (128 .. 768 x 32 x 32 pixels a frame) whenever the caller names no ``size``,
over the checkpoint's saved ``size``; omnijax does the same by default (``video_size="processor"``) and keeps the
saved bounds with ``video_size="checkpoint"``.

On a tiny thinker with the published 16-pixel patches (merge 2: frames in multiples of 32 pixels) whose saved video
size (256 .. 4,096 pixels) differs from that default: token ids, patches, grids, 3-D positions, prompt logits and
greedy tokens against transformers' processor called with no size (tests/fixtures/video_reference.py) and its
thinker, for a small video with its sound (scaled up to the smallest frame size) and a 720p-shaped one (scaled down
to the largest).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.video_files import sample_frames, tone
from fixtures.video_reference import placeholders, run_reference, torch_inputs

pytestmark = [pytest.mark.reference, pytest.mark.slow]

SR = 16000
SMALL = sample_frames(4, 24, 32, seed=11)
HD = sample_frames(2, 720, 1280, seed=12)
SOUND = (tone(2.0, frequency=420.0)[0] / 32768).astype(np.float32)


def user(*parts):
    return [{"role": "user", "content": list(parts)}]


def text(t):
    return {"type": "text", "text": t}


CASES = {
    "small": (user({"type": "video", "video": SMALL, "fps": 2.0, "audio": (SOUND, SR)}, text("What happens?")),
              {"videos": ["small"], "fps": [2.0], "audio": ["sound"],
               "kwargs": {"fps": 2.0, "use_audio_in_video": True, "audio_from_video_indices": [0]}}),
    "hd": (user(text("Describe"), {"type": "video", "video": HD, "fps": 1.0}, text("in one line.")),
           {"videos": ["hd"], "fps": [1.0], "kwargs": {"fps": 1.0}}),
}
WITH_SOUND = {"small"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import fixtures.qwen3_omni_checkpoint as qc

    return qc.build_tiny_thinker(tmp_path_factory.mktemp("qwen3_omni_patch16"), patch_size=16)


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory):
    """transformers' processor outputs, called with no ``size``."""
    requests = [{"name": name, "kind": "chat", "folder": str(folder), "messages": placeholders(messages), **request}
                for name, (messages, request) in CASES.items()]
    return run_reference(requests, {"small": SMALL, "hd": HD, "sound": SOUND},
                         tmp_path_factory.mktemp("qwen_video_size_reference"))


@pytest.fixture(scope="module")
def hf_thinker(folder):
    import fixtures.qwen3_omni_checkpoint as qc

    return qc.load_reference(folder)[0]


@pytest.fixture(scope="module")
def pipe(folder):
    from omnijax.app.pipeline import Pipeline

    return Pipeline.from_pretrained(folder, max_batch=1, max_context=1024)


def model_inputs(reference, case) -> dict:
    return {**torch_inputs(reference, case), **({"use_audio_in_video": True} if case in WITH_SOUND else {})}


def test_the_default_replaces_the_saved_size_and_checkpoint_keeps_it(folder):
    from omnijax.preprocess.qwen3_omni.image import QwenImageConfig
    from omnijax.preprocess.qwen3_omni.video import PROCESSOR_VIDEO_SIZE, QwenVideoConfig

    image_cfg = QwenImageConfig.from_folder(folder)
    default = QwenVideoConfig.from_folder(folder, image_cfg)
    saved = QwenVideoConfig.from_folder(folder, image_cfg, "checkpoint")
    assert (default.pixels.min_pixels, default.pixels.max_pixels) == (PROCESSOR_VIDEO_SIZE["shortest_edge"],
                                                                      PROCESSOR_VIDEO_SIZE["longest_edge"])
    assert (saved.pixels.min_pixels, saved.pixels.max_pixels) == (256, 4096)
    assert default.pixels.patch_size == saved.pixels.patch_size == 16
    assert default.target_size(720, 1280) == (640, 1152) and saved.target_size(720, 1280) == (32, 64)


def test_a_bad_video_size_setting_is_refused_before_loading(folder):
    from omnijax.app.pipeline import Pipeline
    from omnijax.common.errors import SettingError

    with pytest.raises(SettingError, match="video_size"):
        Pipeline.from_pretrained(folder, video_size="native")


@pytest.mark.parametrize("case", list(CASES))
def test_processor_and_positions_parity(pipe, hf_thinker, reference, case):
    ours = pipe.prepare(CASES[case][0])
    ref = {k: v.numpy() for k, v in torch_inputs(reference, case).items()}
    np.testing.assert_array_equal(ours.token_ids, ref["input_ids"][0])
    (item,) = ours.media["video"]
    assert item["grid"] == tuple(ref["video_grid_thw"][0].tolist())
    np.testing.assert_array_equal(item["patches"], ref["pixel_values_videos"])
    inputs = torch_inputs(reference, case)
    positions, deltas = hf_thinker.get_rope_index(
        inputs["input_ids"], video_grid_thw=inputs["video_grid_thw"], attention_mask=inputs["attention_mask"],
        use_audio_in_video=case in WITH_SOUND,
        audio_seqlens=inputs["feature_attention_mask"].sum(-1) if "feature_attention_mask" in inputs else None,
        second_per_grids=inputs["video_second_per_grid"])
    np.testing.assert_array_equal(ours.rope_positions, positions[:, 0].numpy())
    assert ours.rope_delta == float(deltas[0, 0])


def test_frames_take_the_processor_default_size(reference):
    """Scaled up to at least 128 x 32 x 32 pixels, and a 720p frame down to at most 768 x 32 x 32 (the saved size
    would give 1 and 2 merge blocks a frame)."""
    small = torch_inputs(reference, "small")["video_grid_thw"][0].tolist()
    hd = torch_inputs(reference, "hd")["video_grid_thw"][0].tolist()
    assert small == [2, 20, 28] and hd == [1, 40, 72]


@pytest.mark.parametrize("case", list(CASES))
def test_logit_parity(pipe, hf_thinker, reference, case):
    with torch.no_grad():
        ref = hf_thinker(**model_inputs(reference, case)).logits[0].numpy()
    ours = pipe.prompt_logits(CASES[case][0])
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_generation_equals_transformers(pipe, hf_thinker, reference, case):
    inputs = model_inputs(reference, case)
    with torch.no_grad():
        ref = hf_thinker.generate(**inputs, max_new_tokens=8, do_sample=False)
    ref_new = ref[0, inputs["input_ids"].shape[1]:].tolist()
    assert len(ref_new) == 8
    assert pipe.generate(CASES[case][0], max_new_tokens=8).token_ids == ref_new
