"""Qwen3-Omni answering aloud against transformers 5.23 in float32 (thinker tokens, every codec code of every group,
the waveform), streamed chunks against the whole answer, code2wav alone, voices, determinism, errors, buckets."""

from __future__ import annotations

import logging
import os
import shutil
import stat

import jax
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from omnijax.app.speech import FIRST_CHUNK_FRAMES
from omnijax.app.speech_events import AudioChunk, TextPiece
from omnijax.common.errors import CapabilityError, OmnijaxError, PromptError, SamplingError
from omnijax.decoder.qwen3_omni.code2wav import chunk_samples

from fixtures.qwen3_omni_speech_reference import load_full_model, reference_speech
from test_qwen3_omni_parity import clip, image, user

pytestmark = [pytest.mark.slow, pytest.mark.reference]

N_TOKENS = 12  # thinker tokens
N_FRAMES = 30  # codec frames (a random talker seldom chooses its end code)
VOICE = "chelsie"


def _text(t: str) -> dict:
    return {"type": "text", "text": t}


CASES = {
    "text": user("Tell me about the sea."),
    "image_audio": user(image(2, (40, 56)), clip(2, 0.5), "Answer the spoken question about this image.",
                        system="You are a helpful assistant."),
    "two_turn_chat": [{"role": "user", "content": [_text("Hello there.")]},
                      {"role": "assistant", "content": [_text("Hi! How can I help?")]},
                      {"role": "user", "content": [{"type": "image", "image": image(5)}, _text("What is this?")]}],
}


def _speak(pipe, messages, **kwargs):
    options = dict(max_new_tokens=N_TOKENS, speak=True, voice=VOICE, max_speech_frames=N_FRAMES)
    return pipe.generate(messages, **{**options, **kwargs})


def test_float32_everywhere():
    assert jax.config.jax_default_matmul_precision in (None, "highest", "float32")
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("case", list(CASES))
def test_spoken_answer_equals_transformers(qwen_speech_pipeline, hf_qwen_full, tiny_qwen_full_dir, case):
    import fixtures.qwen3_omni_checkpoint as qc

    pipe = qwen_speech_pipeline
    ref = reference_speech(hf_qwen_full, qc.load_processor(tiny_qwen_full_dir), CASES[case], speaker=VOICE,
                           max_new_tokens=N_TOKENS, max_frames=N_FRAMES, eos_ids=pipe.config.eos_ids)
    ours = _speak(pipe, CASES[case])
    assert ours.token_ids == ref.tokens[:len(ours.token_ids)] and len(ours.token_ids) == N_TOKENS
    assert ours.audio_codes.shape == ref.codes.shape == (N_FRAMES, 4)
    np.testing.assert_array_equal(ours.audio_codes, ref.codes)
    c2w = pipe.config.speech.code2wav
    assert ours.sample_rate == 24000 and ours.audio.dtype == np.float32
    assert ours.audio.shape == ref.audio.shape == (N_FRAMES * c2w.total_upsample - c2w.lost_samples,)
    peak = float(np.abs(ref.audio).max())
    assert 0.02 < peak < 0.9, "the waveform should be neither silent nor clipped"
    assert np.abs(ours.audio - ref.audio).max() <= 1e-3 * peak


@pytest.fixture(scope="module")
def stopping_dir(tiny_qwen_full_dir, qwen_speech_pipeline, tmp_path_factory):
    """The tiny full folder with the talker's end-code head row set to 1.01 x the row of the code its greedy answer
    to ``CASES["text"]`` chooses at frame 10: the end code then wins where that code would (from frame 10 at the
    latest, earlier if that code led elsewhere)."""
    codes = _speak(qwen_speech_pipeline, CASES["text"]).audio_codes
    folder = tmp_path_factory.mktemp("tiny_qwen3_omni_stopping")
    for f in tiny_qwen_full_dir.iterdir():
        if f.is_file():
            shutil.copy(f, folder / f.name)
    tensors = load_file(folder / "model.safetensors")
    head = tensors["talker.codec_head.weight"]
    head[qwen_speech_pipeline.config.speech.codec["eos"]] = 1.01 * head[codes[10, 0]]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_the_end_code_stops_the_talker_as_in_transformers(stopping_dir):
    import fixtures.qwen3_omni_checkpoint as qc
    from omnijax.app.pipeline import Pipeline

    pipe = Pipeline.from_pretrained(stopping_dir)
    ref = reference_speech(load_full_model(stopping_dir), qc.load_processor(stopping_dir), CASES["text"],
                           speaker=VOICE, max_new_tokens=N_TOKENS, max_frames=N_FRAMES, eos_ids=pipe.config.eos_ids)
    ours = _speak(pipe, CASES["text"])
    assert 1 <= len(ours.audio_codes) <= 10
    np.testing.assert_array_equal(ours.audio_codes, ref.codes)
    assert np.abs(ours.audio - ref.audio).max() <= 1e-3 * float(np.abs(ref.audio).max())


def test_stream_yields_text_then_audio_chunks_that_join_to_the_answer(qwen_speech_pipeline):
    pipe = qwen_speech_pipeline
    whole = _speak(pipe, CASES["two_turn_chat"])
    events = pipe.stream(CASES["two_turn_chat"], max_new_tokens=N_TOKENS, speak=True, voice=VOICE,
                         max_speech_frames=N_FRAMES)
    seen = []
    while True:
        try:
            seen.append(next(events))
        except StopIteration as stop:
            result = stop.value
            break
    texts = [e for e in seen if isinstance(e, TextPiece)]
    chunks = [e for e in seen if isinstance(e, AudioChunk)]
    assert len(texts) + len(chunks) == len(seen)
    assert seen.index(chunks[0]) == len(texts), "the text comes first, then the audio"
    assert "".join(t.text for t in texts) == result.text == whole.text
    assert len(chunks) >= 2 and len(chunks[0].codes) == FIRST_CHUNK_FRAMES
    assert all(c.sample_rate == 24000 and c.samples.dtype == np.float32 for c in chunks)
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), result.audio)
    np.testing.assert_array_equal(result.audio, whole.audio)
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), whole.audio_codes)


def test_code2wav_alone_equals_transformers_whole_and_streamed(qwen_speech_pipeline, hf_qwen_full):
    pipe = qwen_speech_pipeline
    codes = np.random.default_rng(7).integers(0, 32, (70, 4))
    with torch.no_grad():
        ref = hf_qwen_full.code2wav(torch.as_tensor(codes.T[None])).reshape(-1).numpy()
    whole = pipe.speech.decode(codes)
    peak = float(np.abs(ref).max())
    assert whole.shape == ref.shape and 0.02 < peak < 0.9
    assert np.abs(whole - ref).max() <= 1e-3 * peak
    pieces = list(pipe.speech.decode_stream(codes))
    assert [len(p) for p in pieces][:2] == [FIRST_CHUNK_FRAMES * 8 - 6, pipe.speech.chunk * 8]
    streamed = np.concatenate(pieces)
    assert streamed.shape == ref.shape
    assert np.abs(streamed - whole).max() <= 1e-5 * peak  # only float rounding: the left context is enough


def test_the_vocoder_needs_its_left_context(qwen_speech_pipeline):
    """A window of ``context_frames`` earlier states plus new ones decodes the new frames' samples as the whole
    decode does; a window with a quarter of that context does not."""
    from flax import nnx

    pipe = qwen_speech_pipeline
    cfg = pipe.config.speech.code2wav
    vocoder = nnx.merge(pipe.engine.graphdef, pipe.engine.params).speech.code2wav.vocoder
    h = jax.random.normal(jax.random.key(0), (1, 90, cfg.transformer.hidden_size))
    whole = np.asarray(vocoder(h))[0]
    before, new = 60, 10
    first, end = chunk_samples(before, new, cfg)
    window = np.asarray(vocoder(h[:, before - cfg.context_frames:before + new]))[0][first:end]
    expected = whole[before * 8 - cfg.lost_samples:(before + new) * 8 - cfg.lost_samples]
    assert np.abs(window - expected).max() <= 1e-5 * np.abs(whole).max()
    short = cfg.context_frames // 4
    cut = np.asarray(vocoder(h[:, before - short:before + new]))[0]
    offset = (cfg.context_frames - short) * 8
    assert np.abs(cut[first - offset:end - offset] - expected).max() > 1e-3 * np.abs(whole).max()


def test_greedy_speech_is_deterministic_and_sampled_speech_takes_the_seed(qwen_speech_pipeline):
    pipe = qwen_speech_pipeline
    a, b = _speak(pipe, CASES["text"]), _speak(pipe, CASES["text"])
    np.testing.assert_array_equal(a.audio, b.audio)
    sampled = dict(temperature=0.8, top_k=40)
    s1, s1_again, s2 = (_speak(pipe, CASES["text"], seed=seed, **sampled) for seed in (1, 1, 2))
    np.testing.assert_array_equal(s1.audio_codes, s1_again.audio_codes)
    np.testing.assert_array_equal(s1.audio, s1_again.audio)
    assert not np.array_equal(s1.audio_codes, s2.audio_codes)
    assert not np.array_equal(s1.audio_codes, a.audio_codes)


def test_voices_are_the_checkpoints_speakers(qwen_speech_pipeline):
    pipe = qwen_speech_pipeline
    assert pipe.has_talker and set(pipe.voices) == {"chelsie", "ethan", "aiden"}
    with pytest.raises(SamplingError, match="unknown voice 'Alloy'.*aiden, chelsie, ethan"):
        _speak(pipe, CASES["text"], voice="Alloy")
    upper = _speak(pipe, CASES["text"], voice="CHELSIE", max_speech_frames=8)
    lower = _speak(pipe, CASES["text"], voice="chelsie", max_speech_frames=8)
    np.testing.assert_array_equal(upper.audio_codes, lower.audio_codes)
    other = _speak(pipe, CASES["text"], voice="ethan", max_speech_frames=8)
    assert not np.array_equal(other.audio_codes, lower.audio_codes)
    default = _speak(pipe, CASES["text"], voice=None, max_speech_frames=8)
    np.testing.assert_array_equal(default.audio_codes, _speak(pipe, CASES["text"], voice=pipe.voices[0],
                                                              max_speech_frames=8).audio_codes)


def test_models_without_a_talker_refuse_to_speak(qwen_pipeline, tiny_qwen_full_dir, tmp_path, caplog):
    import fixtures.qwen3_omni_checkpoint as qc
    from omnijax.app.pipeline import Pipeline

    assert not qwen_pipeline.has_talker and qwen_pipeline.voices == ()
    with pytest.raises(CapabilityError, match="no talker"):
        qwen_pipeline.generate(CASES["text"], speak=True)
    with pytest.raises(CapabilityError, match="no talker"):
        next(qwen_pipeline.stream(CASES["text"], speak=True))
    text_only = qc.build_tiny_full_model(tmp_path / "text_only", enable_audio_output=False)
    with caplog.at_level(logging.INFO, logger="omnijax.app.checkpoint"):
        pipe = Pipeline.from_pretrained(text_only)
    assert any("skipping" in r.getMessage() and "talker" in r.getMessage() for r in caplog.records)
    assert not pipe.has_talker
    assert pipe.generate(CASES["text"], max_new_tokens=4).token_ids == \
        qwen_pipeline.generate(CASES["text"], max_new_tokens=4).token_ids
    with pytest.raises(CapabilityError, match="cannot answer aloud"):
        pipe.generate(CASES["text"], speak=True)


def test_bad_requests_to_speak(qwen_speech_pipeline):
    pipe = qwen_speech_pipeline
    with pytest.raises(PromptError, match="one conversation"):
        pipe.generate([CASES["text"], CASES["text"]], speak=True)
    with pytest.raises(PromptError, match="chat messages"):
        pipe.generate("Once upon a time", speak=True)
    for frames in (0, 10**12, 2.0):
        with pytest.raises(SamplingError, match="max_speech_frames must be an integer in"):
            pipe.generate(CASES["text"], speak=True, max_speech_frames=frames)
    prompt = pipe.prepare(CASES["text"])
    answer = pipe.generate_prepared([prompt], max_new_tokens=2)[0]
    with pytest.raises(SamplingError, match="max_speech_frames must be an integer in"):
        pipe.speak_answer(prompt, answer, max_speech_frames=10**12)


def test_a_spoken_answer_about_a_video_places_its_frames_and_sound(qwen_speech_pipeline, hf_qwen_full):
    """A video with its sound beside an image and a clip (and an image in the system turn, which the talker does not
    read): the talker's positions are transformers' rule on the talker's ids with the user turns' media, and the
    answer is spoken."""
    import torch

    from omnijax.app.families.qwen3_omni.talker_input import talker_input

    pipe = qwen_speech_pipeline
    frames = np.random.default_rng(4).integers(0, 256, (4, 56, 72, 3), dtype=np.uint8)
    video = {"type": "video", "video": frames, "fps": 2.0, "audio": (clip(3, 1.5), 16000)}
    messages = [{"role": "system", "content": [{"type": "image", "image": image(6)}, _text("Be brief.")]},
                {"role": "user", "content": [{"type": "image", "image": image(2)}, video,
                                             {"type": "audio", "audio": clip(1, 0.7)},
                                             _text("What happens?")]}]
    prompt = pipe.prepare(messages)
    answer = np.array([300, 301, 302], np.int32)
    layout = talker_input(prompt.token_ids, answer, pipe.config.speech, 51, prompt.rope_media)
    talker_ids = np.concatenate([prompt.token_ids[layout.rows[:-9]], [pipe.config.speech.tts["pad"]] * 9])
    media = prompt.rope_media
    frames_of = [item["features"].shape[1] for item in prompt.media["audio"]]  # the clips in prompt order
    hf_qwen_full.talker.config.audio_config = hf_qwen_full.config.thinker_config.audio_config  # as generate needs
    positions, delta = hf_qwen_full.talker.get_rope_index(
        torch.as_tensor(talker_ids[None]), torch.as_tensor([media.image_grids[1]]),
        torch.as_tensor([g for g, _ in media.videos]), torch.ones(1, len(talker_ids), dtype=torch.long), True,
        torch.as_tensor(frames_of), torch.as_tensor([s for _, s in media.videos]))
    np.testing.assert_array_equal(layout.rope_positions, positions[:, 0].numpy().astype(np.float32))
    assert layout.rope_delta == pytest.approx(float(delta[0, 0]))
    spoken = _speak(pipe, messages, max_speech_frames=12)
    assert len(spoken.audio_codes) >= 1 and len(spoken.audio) > 0


def test_new_lengths_inside_a_bucket_do_not_compile_again(qwen_speech_pipeline):
    pipe = qwen_speech_pipeline
    _speak(pipe, user("Say something nice."), max_speech_frames=40)
    before = pipe.speech.compilations() + pipe.compilations()
    for prompt, frames in (("Tell me a story about the moon.", 37), ("Why?", 33)):
        result = _speak(pipe, user(prompt), max_speech_frames=frames)
        assert len(result.audio_codes) == frames
    assert pipe.speech.compilations() + pipe.compilations() == before


def test_cli_writes_the_spoken_answer_to_a_wav_file(tiny_qwen_full_dir, tiny_qwen_dir, qwen_speech_pipeline,
                                                     tmp_path, capsys):
    import wave

    from omnijax.app.cli import main
    from omnijax.app.wav import pcm16_bytes

    out = tmp_path / "answer.wav"
    args = ["generate", "--model", str(tiny_qwen_full_dir), "--prompt", "Tell me about the sea.",
            "--max-new-tokens", str(N_TOKENS)]
    assert main(args + ["--speak", str(out), "--voice", "Ethan", "--max-speech-frames", "20"]) == 0
    expected = _speak(qwen_speech_pipeline, user("Tell me about the sea."), voice="ethan", max_speech_frames=20)
    captured = capsys.readouterr()
    assert captured.out == expected.text + "\n"  # the text still goes to stdout
    assert f"wrote {out}" in captured.err and "20 codec frames" in captured.err
    with wave.open(str(out)) as f:
        assert (f.getframerate(), f.getnchannels(), f.getsampwidth()) == (24000, 1, 2)
        assert f.readframes(f.getnframes()) == pcm16_bytes(expected.audio)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["answer.wav"]  # no temporary file left behind
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    spoken = out.read_bytes()
    for bad, message in [(["--voice", "ethan"], "--voice needs --speak"),
                         (["--speak", str(tmp_path / "missing" / "a.wav")], "does not exist"),
                         (["--speak", str(tmp_path)], "is a folder"),
                         (["--speak", str(fifo)], "is not a regular file"),
                         (["--speak", "/proc/answer.wav"], "cannot write in the folder '/proc'"),
                         (["--speak", str(out), "--audio", str(out)], "is also the --audio input"),
                         (["--speak", str(out), "--max-speech-frames", str(10**12)], "must be an integer in"),
                         (["--speak", str(out), "--voice", "alloy"], "unknown voice 'alloy'")]:
        assert main(args + bad) == 2
        assert message in capsys.readouterr().err
    assert out.read_bytes() == spoken and stat.S_ISFIFO(fifo.stat().st_mode)  # nothing replaced
    assert main(["generate", "--model", str(tiny_qwen_dir), "--prompt", "Hi", "--speak", str(out)]) == 2
    assert "no talker" in capsys.readouterr().err


def test_a_spoken_answer_that_cannot_be_written_is_a_clear_error(tmp_path, monkeypatch, capsys):
    """A full disk while the WAV file is written: an OmnijaxError naming the file; what was there is kept and no
    temporary file is left."""
    import errno
    import types

    from omnijax.app import cli, wav

    out = tmp_path / "answer.wav"
    out.write_bytes(b"before")
    result = types.SimpleNamespace(audio=np.zeros(2400, np.float32), sample_rate=24000, audio_codes=np.zeros((2, 4)))

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(wav.os, "fsync", full)
    with pytest.raises(OmnijaxError, match="cannot write the spoken answer to .*answer.wav.*No space left on device"):
        cli.write_spoken(out, result)
    assert out.read_bytes() == b"before" and sorted(p.name for p in tmp_path.iterdir()) == ["answer.wav"]
    monkeypatch.undo()
    cli.write_spoken(out, result)
    assert out.read_bytes()[:4] == b"RIFF" and "wrote" in capsys.readouterr().err
