"""Gemma 4 video against transformers (float32) on the tiny checkpoints: processor outputs (token ids with the frame
timestamps, ``pixel_values_videos`` and positions per frame, bidirectional flags, the sound's mel features), prompt
logits and greedy tokens, for a frame array with its sound (``small``: audio tower, causal image tokens), a video
file the test writes with a sound track (its sound placed as ``apply_chat_template(..., load_audio_from_video=True)``
places it: an audio part right after the video), frames on the bidirectional ``moe`` layout, a video beside an
image, each video prompt generated and scored in a batch beside text and image prompts (a mixed batch).

transformers' video processor needs torchvision, so its outputs come from a subprocess
(tests/fixtures/video_reference.py); the reference model runs here on them.
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
NEW = 16
FRAMES_A = sample_frames(2, 40, 56, seed=11)
FRAMES_B = sample_frames(2, 36, 36, seed=12)
IMAGE = sample_frames(1, 60, 44, seed=13)[0]
SOUND = (tone(1.0, frequency=260.0)[0] / 32768).astype(np.float32)
FILE_FRAMES = sample_frames(20, 32, 48, seed=14)
FILE_SOUND = tone(2.0, frequency=330.0)


def user(*parts):
    return [{"role": "user", "content": list(parts)}]


def text(t):
    return {"type": "text", "text": t}


@pytest.fixture(scope="module")
def video_file(tmp_path_factory):
    """2 s at 10 fps, 32 x 48, H.264 with a 16-bit PCM sound track, in a QuickTime file."""
    return write_video(tmp_path_factory.mktemp("gemma_video") / "clip.mov", FILE_FRAMES, 10, audio=FILE_SOUND)


@pytest.fixture(scope="module")
def cases(video_file):
    """name -> (folder kind, our messages, the reference's messages, its request fields)."""
    reference_av = [{"type": "video"}, {"type": "audio"}]
    return {
        "frames_audio": ("small", user({"type": "video", "video": FRAMES_A, "fps": 1.0, "audio": (SOUND, SR)},
                                       text("What happens?")),
                         user(*reference_av, text("What happens?")),
                         {"videos": ["a"], "fps": [1.0], "audio": ["sound"]}),
        "file": ("small", user(text("Watch"), {"type": "video", "video": str(video_file), "fps": 1.0},
                               text("and listen.")),
                 user(text("Watch"), *reference_av, text("and listen.")),
                 {"videos": ["decode_file/frames"], "fps": [10.0], "audio": ["file_sound"],
                  "video_metadata": [{"fps": 10.0, "total_num_frames": 20, "frames_indices": [0, 10]}]}),
        "frames": ("moe", user({"type": "video", "video": FRAMES_B, "fps": 0.5}, text("Describe the clip.")),
                   None, {"videos": ["b"], "fps": [0.5]}),
        "video_image": ("moe", user({"type": "image", "image": Image.fromarray(IMAGE)}, text("and"),
                                    {"type": "video", "video": FRAMES_A, "fps": 2.0}, text("compare them.")),
                        None, {"videos": ["a"], "fps": [2.0], "images": ["image"]}),
    }


@pytest.fixture(scope="module")
def models(gemma4_small_pipeline, gemma4_moe_pipeline, hf_gemma4_small, hf_gemma4_moe,
           tiny_gemma4_small_dir, tiny_gemma4_moe_dir):
    """{kind: (our pipeline, reference model, folder)}."""
    return {"small": (gemma4_small_pipeline, hf_gemma4_small[0], tiny_gemma4_small_dir),
            "moe": (gemma4_moe_pipeline, hf_gemma4_moe[0], tiny_gemma4_moe_dir)}


@pytest.fixture(scope="module")
def reference(cases, models, video_file, tmp_path_factory):
    requests = [{"name": "decode_file", "kind": "decode", "path": str(video_file), "sampler": "uniform",
                 "kwargs": {"fps": 1.0}}]
    for name, (kind, messages, theirs, request) in cases.items():
        requests.append({"name": name, "kind": "chat", "folder": str(models[kind][2]),
                         "messages": theirs or placeholders(messages), **request})
    arrays = {"a": FRAMES_A, "b": FRAMES_B, "image": IMAGE, "sound": SOUND,
              "file_sound": (FILE_SOUND[0] / 32768).astype(np.float32)}
    return run_reference(requests, arrays, tmp_path_factory.mktemp("gemma_video_reference"))


@pytest.fixture(scope="module")
def prepared(cases, models):
    return {name: models[kind][0].prepare(messages) for name, (kind, messages, _, _) in cases.items()}


def test_file_frames_and_timestamps(models, video_file, reference, prepared):
    """Uniform sampling at the part's fps seeks to the frames transformers' PyAV reader keeps; the prompt carries
    their times (0 and 1 s)."""
    from omnijax.preprocess.video_decode import decode_frames, probe

    info = probe(video_file)
    indices = models["small"][0].processor.video_cfg.frame_indices(info.frames, info.fps, 1.0)
    assert indices == reference["decode_file/indices"].tolist() == [0, 10]
    frames, _ = decode_frames(info, indices, lambda f: f)
    np.testing.assert_array_equal(np.stack(frames), reference["decode_file/frames"])
    prompt = models["small"][0].processor.tokenizer.decode(prepared["file"].token_ids)
    assert [prompt.count(f"00:0{s} ") for s in range(3)] == [1, 1, 0]


@pytest.mark.parametrize("case", ["frames_audio", "file", "frames", "video_image"])
def test_processor_parity(models, cases, reference, prepared, case):
    kind = cases[case][0]
    pipe, model, _ = models[kind]
    ours = prepared[case]
    ref = {k: v.numpy() for k, v in torch_inputs(reference, case).items()}
    np.testing.assert_array_equal(ours.token_ids, ref["input_ids"][0])
    bidirectional = model.config.text_config.use_bidirectional_attention == "vision"
    np.testing.assert_array_equal(ours.bidirectional, np.isin(ref["mm_token_type_ids"][0], (1, 2)) & bidirectional)
    assert ours.bidirectional.any() == bidirectional
    frames = ours.media["video"]
    assert len(frames) == ref["pixel_values_videos"].shape[0] == int(ref["num_frames_per_video"].sum())
    for item, pixels, positions in zip(frames, ref["pixel_values_videos"], ref["video_position_ids"]):
        n = item.pixel_values.shape[0]
        np.testing.assert_array_equal(item.pixel_values, pixels[:n])
        np.testing.assert_array_equal(item.position_ids, positions[:n])
        assert not pixels[n:].any() and (positions[n:] == -1).all()
    if "input_features" in ref:
        mask = ref["input_features_mask"].astype(bool)
        for feats, theirs, m in zip(ours.media["audio"], ref["input_features"], mask):
            assert np.abs(feats - theirs[m]).max() <= 1e-5 * max(1.0, np.abs(theirs[m]).max())
    else:
        assert "audio" not in ours.media


# A text and an image prompt ride along in each folder's batch: every video row is generated and scored beside
# prompts of other kinds (a mixed batch) and compared with the reference run on that prompt alone.
EXTRA = [user(text("Tell me about the sea.")), user({"type": "image", "image": Image.fromarray(IMAGE)},
                                                    text("What is it?"))]


def _batch(cases, kind):
    return [c for c, spec in cases.items() if spec[0] == kind]


@pytest.fixture(scope="module")
def scores(models, cases, prepared):
    out = {}
    for kind in ("small", "moe"):
        pipe = models[kind][0]
        names = _batch(cases, kind)
        logits = pipe.prompt_logits([prepared[n] for n in names] + [pipe.prepare(m) for m in EXTRA])
        out.update(zip(names, logits))
    return out


@pytest.fixture(scope="module")
def generated(models, cases, prepared):
    out = {}
    for kind in ("small", "moe"):
        pipe = models[kind][0]
        names = _batch(cases, kind)
        rows = pipe.generate_prepared([prepared[n] for n in names] + [pipe.prepare(m) for m in EXTRA],
                                      max_new_tokens=NEW, ignore_eos=True)
        out.update({n: row.token_ids for n, row in zip(names, rows)})
    return out


@pytest.mark.parametrize("case", ["frames_audio", "file", "frames", "video_image"])
def test_logit_parity(models, cases, reference, scores, case):
    pipe, model, _ = models[cases[case][0]]
    with torch.no_grad():
        ref = model(**torch_inputs(reference, case)).logits[0].numpy()
    ours = scores[case]
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))


@pytest.mark.parametrize("case", ["frames_audio", "file", "frames", "video_image"])
def test_greedy_tokens_equal_transformers(models, cases, reference, generated, case):
    """16 greedy tokens past any EOS: ours from the folder's mixed batch, the reference's from the prompt alone."""
    _, model, _ = models[cases[case][0]]
    inputs = torch_inputs(reference, case)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False, eos_token_id=None)
    ref = out[0, inputs["input_ids"].shape[1]:].tolist()
    assert len(ref) == NEW and generated[case] == ref


def test_muted_video_has_no_audio_part(models):
    pipe = models["small"][0]
    muted = pipe.prepare(user({"type": "video", "video": FRAMES_A, "fps": 1.0, "audio": (SOUND, SR),
                               "use_audio_in_video": False}, text("Hi")))
    assert "audio" not in muted.media and len(muted.media["video"]) == 2
