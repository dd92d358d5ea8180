"""Qwen3-Omni video against transformers (float32): processor outputs (token ids, ``pixel_values_videos``, grids,
seconds per grid, audio features), 3-D positions, prompt logits and greedy tokens, for frame arrays (with and
without their sound, at a rate that gives fractional temporal positions), a video file the test writes (sampled and
decoded by omnijax with PyAV; by the reference with its own PyAV reader), a video beside an image, an audio clip
beside a video with sound, a mixed batch, and a new video length inside a bucket compiling nothing.

transformers' video processor needs torchvision, so its outputs come from a subprocess
(tests/fixtures/video_reference.py); the reference model runs here on them. Its processor is called with the
checkpoint's own video pixel bounds (``size``): ``Qwen3OmniMoeProcessor`` otherwise substitutes its class default,
while omnijax reads the checkpoint's video processor settings.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fixtures.video_files import sample_frames, tone, write_video
from fixtures.video_reference import placeholders, run_reference, torch_inputs

pytestmark = [pytest.mark.reference, pytest.mark.slow]

SR = 16000
SIZE = {"shortest_edge": 256, "longest_edge": 4096}  # the tiny checkpoint's video processor size
FRAMES_A = sample_frames(4, 24, 32, seed=1)
FRAMES_B = sample_frames(6, 30, 40, seed=2)
IMAGE = sample_frames(1, 48, 64, seed=3)[0]
SOUND_B = (tone(2.0, frequency=300.0)[0] / 32768).astype(np.float32)
CLIP = (tone(1.3, frequency=500.0)[0] / 32768).astype(np.float32)
FILE_FRAMES = sample_frames(30, 36, 48, seed=4)
FILE_SOUND = tone(3.0, frequency=350.0)


# Cases whose video brings its sound: the reference model is told so (``use_audio_in_video=True``), without which its
# positions treat the interleaved block as plain audio.
WITH_SOUND = {"frames_audio", "file", "clip_and_video"}


def model_inputs(reference, case) -> dict:
    return {**torch_inputs(reference, case), **({"use_audio_in_video": True} if case in WITH_SOUND else {})}


def user(*parts):
    return [{"role": "user", "content": list(parts)}]


def text(t):
    return {"type": "text", "text": t}


def video(frames, fps, **extra):
    return {"type": "video", "video": frames, "fps": fps, **extra}


@pytest.fixture(scope="module")
def video_file(tmp_path_factory):
    """3 s at 10 fps, 36 x 48, H.264 with a 16-bit PCM sound track (decodes exactly) in a QuickTime file (whose
    header states the frame count, which transformers' PyAV reader needs)."""
    return write_video(tmp_path_factory.mktemp("qwen_video") / "clip.mov", FILE_FRAMES, 10, audio=FILE_SOUND)


@pytest.fixture(scope="module")
def cases(video_file):
    """name -> (our messages, the reference request without its name / folder, input arrays)."""
    sampled_fps = 6 / 30 * 10  # 6 frames kept of 30 at 10 fps (2 a second)
    return {
        "frames": (user(video(FRAMES_A, 2.0), text("What happens in the video?")),
                   {"videos": ["a"], "fps": [2.0], "kwargs": {"fps": 2.0}}),
        # 3 frames a second: 2/3 s per temporal patch, fractional temporal positions; the sound interleaved
        "frames_audio": (user(video(FRAMES_B, 3.0, audio=(SOUND_B, SR)), text("Describe it.")),
                         {"videos": ["b"], "fps": [3.0], "audio": ["sound_b"],
                          "kwargs": {"fps": 3.0, "use_audio_in_video": True, "audio_from_video_indices": [0]}}),
        "frames_muted": (user(video(FRAMES_B, 3.0, audio=(SOUND_B, SR), use_audio_in_video=False), text("Hi")),
                         {"videos": ["b"], "fps": [3.0], "kwargs": {"fps": 3.0}}),
        "file": (user(text("Watch:"), {"type": "video", "video": str(video_file)}, text("What do you hear?")),
                 {"videos": ["decode_file/frames"], "fps": [sampled_fps], "audio": ["file_sound"],
                  "kwargs": {"fps": sampled_fps, "use_audio_in_video": True, "audio_from_video_indices": [0]}}),
        "video_image": (user({"type": "image", "image": Image.fromarray(IMAGE)}, video(FRAMES_A, 1.0),
                             text("Compare the picture with the video.")),
                        {"videos": ["a"], "fps": [1.0], "images": ["image"], "kwargs": {"fps": 1.0}}),
        "clip_and_video": (user({"type": "audio", "audio": CLIP}, video(FRAMES_B, 3.0, audio=(SOUND_B, SR)),
                                text("Which sound is higher?")),
                           {"videos": ["b"], "fps": [3.0], "audio": ["clip", "sound_b"],
                            "kwargs": {"fps": 3.0, "use_audio_in_video": True,
                                       "audio_from_video_indices": [None, 0]}}),
    }


@pytest.fixture(scope="module")
def reference(cases, tiny_qwen_dir, video_file, tmp_path_factory):
    requests = [{"name": "decode_file", "kind": "decode", "path": str(video_file), "sampler": "qwen",
                 "folder": str(tiny_qwen_dir), "kwargs": {"fps": 2.0}}]
    for name, (messages, request) in cases.items():
        request = dict(request, kwargs={"size": SIZE, **request["kwargs"]})
        requests.append({"name": name, "kind": "chat", "folder": str(tiny_qwen_dir),
                         "messages": placeholders(messages), **request})
    arrays = {"a": FRAMES_A, "b": FRAMES_B, "image": IMAGE, "sound_b": SOUND_B, "clip": CLIP,
              "file_sound": (FILE_SOUND[0] / 32768).astype(np.float32)}
    return run_reference(requests, arrays, tmp_path_factory.mktemp("qwen_video_reference"))


@pytest.fixture(scope="module")
def prepared(qwen_pipeline, cases):
    return {name: qwen_pipeline.prepare(messages) for name, (messages, _) in cases.items()}


def test_file_frames_are_the_reference_readers(qwen_pipeline, video_file, reference):
    """Seeking to the sampled frames gives the frames transformers' PyAV reader keeps decoding every frame."""
    from omnijax.preprocess.video_decode import decode_frames, probe

    info = probe(video_file)
    indices = qwen_pipeline.processor.video_cfg.frame_indices(info.frames, info.fps, None)
    assert indices == reference["decode_file/indices"].tolist() == [0, 5, 10, 15, 20, 25]
    frames, kept = decode_frames(info, indices, lambda f: f)
    assert kept == indices
    np.testing.assert_array_equal(np.stack(frames), reference["decode_file/frames"])


@pytest.mark.parametrize("case", ["frames", "frames_audio", "frames_muted", "file", "video_image",
                                  "clip_and_video"])
def test_processor_and_positions_parity(qwen_pipeline, hf_qwen_thinker, prepared, reference, case):
    ours = prepared[case]
    ref = {k: v.numpy() for k, v in torch_inputs(reference, case).items()}
    np.testing.assert_array_equal(ours.token_ids, ref["input_ids"][0])
    patches = np.concatenate([item["patches"] for item in ours.media["video"]])
    np.testing.assert_array_equal(patches, ref["pixel_values_videos"])
    assert [item["grid"] for item in ours.media["video"]] == [tuple(g) for g in ref["video_grid_thw"].tolist()]
    if "pixel_values" in ref:
        np.testing.assert_array_equal(np.concatenate([i["patches"] for i in ours.media["image"]]),
                                      ref["pixel_values"])
    if "input_features" in ref:
        mask = ref["feature_attention_mask"].astype(bool)
        assert len(ours.media["audio"]) == len(mask)
        for item, feats, m in zip(ours.media["audio"], ref["input_features"], mask):
            assert np.abs(item["features"] - feats[:, m]).max() <= 1e-4
    else:
        assert "audio" not in ours.media
    inputs = torch_inputs(reference, case)
    positions, deltas = hf_qwen_thinker.get_rope_index(
        inputs["input_ids"], image_grid_thw=inputs.get("image_grid_thw"), video_grid_thw=inputs["video_grid_thw"],
        attention_mask=inputs["attention_mask"], use_audio_in_video=case in WITH_SOUND,
        audio_seqlens=inputs["feature_attention_mask"].sum(-1) if "feature_attention_mask" in inputs else None,
        second_per_grids=inputs["video_second_per_grid"])
    np.testing.assert_array_equal(ours.rope_positions, positions[:, 0].numpy())
    assert ours.rope_delta == float(deltas[0, 0])
    if case == "frames_audio":  # 2/3 s per temporal patch at 13 positions a second
        assert not np.all(ours.rope_positions == np.round(ours.rope_positions))


@pytest.fixture(scope="module")
def scores(qwen_pipeline, prepared):
    names = list(prepared)
    return dict(zip(names, qwen_pipeline.prompt_logits([prepared[n] for n in names])))


@pytest.mark.parametrize("case", ["frames", "frames_audio", "file", "video_image", "clip_and_video"])
def test_logit_parity(hf_qwen_thinker, reference, scores, case):
    with torch.no_grad():
        ref = hf_qwen_thinker(**model_inputs(reference, case)).logits[0].numpy()
    ours = scores[case]
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))


@pytest.mark.parametrize("case", ["frames_audio", "file", "video_image"])
def test_greedy_generation_equals_transformers(qwen_pipeline, hf_qwen_thinker, cases, reference, case):
    inputs = model_inputs(reference, case)
    with torch.no_grad():
        ref = hf_qwen_thinker.generate(**inputs, max_new_tokens=18, do_sample=False)
    ref_new = ref[0, inputs["input_ids"].shape[1]:].tolist()
    ours = qwen_pipeline.generate(cases[case][0], max_new_tokens=18)
    assert len(ref_new) >= 16
    assert ours.token_ids == ref_new


def test_mixed_batch_equals_each_alone(qwen_pipeline, cases):
    convs = [cases["frames_audio"][0], user(text("Tell me about the sea.")), cases["video_image"][0],
             user({"type": "audio", "audio": CLIP}, text("What is it?"))]
    batch = qwen_pipeline.generate(convs, max_new_tokens=10)
    alone = [qwen_pipeline.generate(c, max_new_tokens=10) for c in convs]
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone]


def test_new_video_length_inside_a_bucket_compiles_nothing(qwen_pipeline):
    """6 and 8 frames (3 and 4 temporal patches: one frame bucket of 4) in prompts of one length bucket."""
    def run(frames: int):
        return qwen_pipeline.generate(user(video(sample_frames(frames, 16, 16, seed=frames), 2.0), text("Hi")),
                                      max_new_tokens=4)

    run(6)
    before = qwen_pipeline.compilations()
    assert run(8).token_ids
    assert qwen_pipeline.compilations() == before
