"""Video files through PyAV (preprocess/video_decode.py, video_source.py): seeking gives the frames a full decode
gives, streams without a frame count, interlaced streams, the sound track, refusals before heavy work, bad parts;
the frame samplers and torchvision's uint8 resize against torch."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from fixtures.video_files import sample_frames, tone, write_sound_video, write_video
from omnijax.preprocess.audio import load_audio
from omnijax.common.errors import MediaError, PromptError
from omnijax.preprocess import video_decode, video_source
from omnijax.preprocess.prompts import normalize_messages
from omnijax.preprocess.resize_uint8 import resize_uint8
from omnijax.preprocess.video_decode import decode_audio_track, decode_frames, probe
from omnijax.preprocess.video_sampling import qwen_frame_indices, uniform_frame_indices
from fixtures.child_path import child_python_path

pytestmark = pytest.mark.reference

FRAMES = sample_frames(100, 32, 48, seed=21)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("video_files")
    return {
        "mp4": write_video(folder / "long.mp4", FRAMES, 10, gop=12),
        "mkv": write_video(folder / "long.mkv", FRAMES[:30], 15, audio=tone(2.0, channels=2)),
        "webm": write_video(folder / "long.webm", FRAMES[:30], 15, codec="libvpx-vp9"),
        "interlaced": write_video(folder / "interlaced.mkv", FRAMES[:20], 25, codec="mpeg2video", interlaced=True),
    }


def full_decode(path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


@pytest.mark.parametrize("kind, indices", [("mp4", [0, 1, 2, 50, 51, 99]), ("mp4", [7, 93]), ("mkv", [0, 14, 29]),
                                           ("webm", [3, 4, 28])])
def test_seeking_gives_the_frames_of_a_full_decode(files, kind, indices):
    info = probe(files[kind])
    frames, kept = decode_frames(info, indices, lambda f: f)
    assert kept == indices
    full = full_decode(files[kind])
    for frame, i in zip(frames, indices):
        np.testing.assert_array_equal(frame, full[i])


def test_seeking_skips_decoding(files, monkeypatch):
    """Two frames 9 s apart: the decoder seeks instead of converting (or decoding) everything between."""
    import av

    converted = []
    info = probe(files["mp4"])
    decode_frames(info, [0, 95], lambda f: converted.append(f) or f)
    assert len(converted) == 2
    seeks = []
    real_seek = av.container.InputContainer.seek
    monkeypatch.setattr(av.container.InputContainer, "seek", lambda self, *a, **k: seeks.append(a) or
                        real_seek(self, *a, **k))
    decode_frames(info, [0, 95], lambda f: f)
    assert len(seeks) == 2


@pytest.mark.parametrize("kind", ["mkv", "webm"])
def test_streams_without_a_frame_count_use_duration_times_fps(files, kind):
    import av

    with av.open(str(files[kind])) as container:
        assert container.streams.video[0].frames == 0
    info = probe(files[kind])
    assert (info.frames, info.fps) == (30, 15.0)
    assert info.has_audio == (kind == "mkv")


def test_interlaced_stream_decodes_to_whole_frames(files):
    import av

    with av.open(str(files["interlaced"])) as container:
        assert all(f.interlaced_frame for f in container.decode(video=0))
    info = probe(files["interlaced"])
    frames, kept = decode_frames(info, [0, 9, 19], lambda f: f)
    full = full_decode(files["interlaced"])
    for frame, i in zip(frames, kept):
        np.testing.assert_array_equal(frame, full[i])
        assert frame.max() > 200 and frame.mean() > 60  # never black
        error = [np.abs(frame.astype(float) - FRAMES[j]).mean() for j in (i, (i + 10) % 20)]
        assert error[0] < 20 and error[0] < error[1] / 2  # its own picture (both fields), up to 4:2:0 chroma


def test_sound_track_is_read_exactly_and_downmixed(files):
    info = probe(files["mkv"])
    samples = decode_audio_track(info, max_seconds=10, sampling_rate=16000)
    expected = tone(2.0, channels=2).astype(np.float32) / 32768
    np.testing.assert_array_equal(samples, np.mean(expected, axis=0))
    video = video_source.load_video({"video": str(files["mkv"])}, sample=lambda n, fps, _: [0, 10],
                                    target_size=lambda h, w: (h, w), resample=3, with_audio=True,
                                    max_audio_seconds=10)
    np.testing.assert_array_equal(video.audio, np.mean(expected.astype(np.float32), axis=0))
    assert video.sampled.timestamps == [0.0, 10 / 15]
    assert decode_audio_track(probe(files["mp4"]), max_seconds=10, sampling_rate=16000) is None


@pytest.mark.parametrize("limit, value, message", [
    ("MAX_VIDEO_SECONDS", 5, "lasts 10.0 s, longer than the limit of 5 s"),
    ("MAX_VIDEO_FRAME_PIXELS", 1000, "32x48 pixels are larger than the limit"),  # width x height: 48x32
    ("MAX_VIDEO_FRAMES", 50, "100 frames, more than the limit of 50"),
])
def test_limits_refuse_from_the_headers_before_decoding(files, monkeypatch, limit, value, message):
    monkeypatch.setattr(video_decode, limit, value)
    monkeypatch.setattr(video_decode, "decode_frames", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(MediaError, match=message.replace("32x48", "48x32")):
        video_source.load_video({"video": str(files["mp4"])}, sample=lambda n, fps, _: [0],
                                target_size=lambda h, w: (h, w), resample=3, with_audio=False, max_audio_seconds=1)


def test_a_7_1_sound_track_is_averaged_and_resampled(tmp_path):
    """Eight channels (7.1 AAC, as films have) at 48 kHz: the mean of the eight decoded channels, resampled to
    16 kHz, in a child process (PyAV's own array conversion of such frames crashes the process)."""
    import av

    path = write_sound_video(tmp_path / "film.mkv", codec="aac", layout="7.1", rate=48000, seconds=2.0)
    planes = []
    with av.open(str(path)) as container:
        for frame in container.decode(audio=0):
            assert frame.format.name == "fltp" and frame.layout.nb_channels == 8
            planes.append(np.stack([np.frombuffer(frame.planes[c], np.float32, count=frame.samples)
                                    for c in range(8)]))
    expected = load_audio((np.concatenate(planes, axis=1), 48000), 16000)
    out = tmp_path / "sound.npy"
    code = ("import sys, pathlib, numpy as np; from omnijax.preprocess.video_decode import probe, decode_audio_track; "
            "np.save(sys.argv[2], decode_audio_track(probe(pathlib.Path(sys.argv[1])), 10, 16000))")
    child = subprocess.run([sys.executable, "-c", code, str(path), str(out)], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, PYTHONPATH=child_python_path()))
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    samples = np.load(out)
    assert samples.shape == expected.shape and np.abs(expected).max() > 0.1
    np.testing.assert_array_equal(samples, expected)


@pytest.mark.parametrize("first", [True, False])
def test_a_frame_larger_than_the_header_is_refused_before_it_is_decoded(tmp_path, monkeypatch, first):
    """An MJPEG stream whose header says 64 x 64 and one of whose frames is 512 x 512: FFmpeg is told the frame limit
    (here 128 x 128), so the large frame is never decoded, while reading the headers or the frames."""
    import av
    import io

    from PIL import Image

    def jpeg(side):
        buf = io.BytesIO()
        Image.fromarray(np.full((side, side, 3), 120, np.uint8)).save(buf, "JPEG")
        return buf.getvalue()

    path = tmp_path / "bomb.avi"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mjpeg", rate=1)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuvj420p"
        for i, side in enumerate([512, 64, 64] if first else [64, 64, 512, 64]):
            packet = av.Packet(jpeg(side))
            packet.stream, packet.pts, packet.dts = stream, i, i
            container.mux(packet)
    monkeypatch.setattr(video_decode, "MAX_VIDEO_FRAME_PIXELS", 128 * 128)
    info = probe(path)
    assert (info.width, info.height) == (64, 64)
    with pytest.raises(MediaError, match="a frame is corrupt or larger than the limit of 0.016384 MP"):
        decode_frames(info, list(range(info.frames)), lambda f: pytest.fail(f"decoded {f.shape}") if f.shape[0] > 64
                      else f)
    monkeypatch.setattr(video_decode, "MAX_VIDEO_FRAME_PIXELS", 512 * 512)
    frames, _ = decode_frames(probe(path), [0, 1, 2], lambda f: f)
    assert max(f.shape[0] for f in frames) == 512  # under the limit, the same file decodes


def test_unreadable_files(tmp_path):
    import soundfile

    garbage = tmp_path / "x.mp4"
    garbage.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 50)
    with pytest.raises(MediaError, match="x.mp4"):
        probe(garbage)
    sound = tmp_path / "a.wav"
    soundfile.write(sound, np.zeros(1600, np.float32), 16000)
    with pytest.raises(MediaError, match="no video stream"):
        probe(sound)
    with pytest.raises(MediaError, match="not found"):
        video_source.load_video({"video": str(tmp_path / "missing.mp4")}, sample=None, target_size=None,
                                resample=3, with_audio=False, max_audio_seconds=1)


@pytest.mark.parametrize("part, message", [
    ({"type": "video"}, "needs its 'video' value"),
    ({"type": "video", "video": FRAMES[:2]}, "needs its 'fps'"),
    ({"type": "video", "video": FRAMES[:2], "fps": 0}, "'fps' must be a positive number"),
    ({"type": "video", "video": FRAMES[:2], "fps": 2, "use_audio_in_video": "yes"}, "true or false"),
    ({"type": "video", "video": "clip.mp4", "audio": (np.zeros(10, np.float32), 16000)}, "beside an array"),
])
def test_malformed_video_parts_are_prompt_errors(part, message):
    with pytest.raises(PromptError, match=message):
        normalize_messages([{"role": "user", "content": [part]}])


@pytest.mark.parametrize("array, message", [
    (FRAMES[:2].astype(np.float32), "uint8"), (FRAMES[:2, :, :, :2], "uint8 \\[frames"),
    (np.zeros((0, 4, 4, 3), np.uint8), "no pixels"), (np.zeros((2000, 2, 2, 3), np.uint8), "over the limit"),
])
def test_bad_frame_arrays_are_media_errors(array, message):
    with pytest.raises(MediaError, match=message):
        video_source.load_video({"video": array, "fps": 1.0}, sample=None, target_size=lambda h, w: (h, w),
                                resample=3, with_audio=False, max_audio_seconds=1)


def test_uniform_sampler_matches_the_reference_formula():
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    for total, video_fps, num, fps in [(100, 25.0, 8, None), (37, 30.0, None, 2.0), (5, 10.0, 5, None),
                                       (300, 29.97, None, 1.0)]:
        ref = default_sample_indices_fn(VideoMetadata(total_num_frames=total, fps=video_fps), num_frames=num,
                                        fps=fps)
        assert uniform_frame_indices(total, video_fps, num_frames=num, fps=fps) == ref.tolist()


def test_qwen_sampler_matches_torch_arange():
    """The index step of ``Qwen2VLVideoProcessor.sample_frames`` (its module needs torchvision; the count rule is
    checked against the reference in tests/test_qwen3_omni_video.py)."""
    for total in range(4, 400, 7):
        for n in range(2, min(total, 60) + 1, 2):
            ref = torch.arange(0, total, total / n).int().tolist()
            ours = qwen_frame_indices(total, 1.0, fps=None, num_frames=n, temporal_patch_size=2)
            assert ours == ref, (total, n)
    assert qwen_frame_indices(30, 10.0, fps=2.0) == [0, 5, 10, 15, 20, 25]
    assert len(qwen_frame_indices(3000, 10.0, fps=2.0, max_frames=64)) == 64
    assert qwen_frame_indices(5, 10.0, fps=2.0) == [0, 1, 2, 3]  # min_frames 4, even


def test_resize_matches_torch_uint8_antialias():
    """torchvision's uint8 antialiased resize is torch's interpolate on uint8 (bicubic, bilinear)."""
    rng = np.random.default_rng(0)
    for _ in range(40):
        h, w, nh, nw = (int(v) for v in rng.integers(1, 90, 4))
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        x = torch.from_numpy(image).permute(2, 0, 1)[None].contiguous()
        for resample, mode in ((3, "bicubic"), (2, "bilinear")):
            ref = torch.nn.functional.interpolate(x, size=(nh, nw), mode=mode, antialias=True, align_corners=False)
            np.testing.assert_array_equal(resize_uint8(image, nh, nw, resample), ref[0].permute(1, 2, 0).numpy())
