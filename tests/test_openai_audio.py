"""Spoken answers in OpenAI's chat shapes (demo/openai_audio.py) and the audio encodings (app/wav.py), alone."""

from __future__ import annotations

import base64
import io
import os
import types
import wave

import numpy as np
import pytest

from omnijax.app.speech_events import AudioChunk
from omnijax.app.wav import pcm16_bytes, wav_bytes, write_wav
from omnijax.demo.openai_audio import (EXPIRES_SECONDS, AudioDeltas, audio_message, audio_request, encode_audio,
                                       message_audio, wav_stream_header)
from omnijax.demo.openai_protocol import RequestError

VOICES = ("chelsie", "ethan", "aiden")


def _wave(data: bytes) -> tuple[int, np.ndarray]:
    with wave.open(io.BytesIO(data)) as f:
        assert (f.getnchannels(), f.getsampwidth()) == (1, 2)
        return f.getframerate(), np.frombuffer(f.readframes(f.getnframes()), "<i2")


def test_pcm16_rounds_and_clips():
    pcm = np.frombuffer(pcm16_bytes(np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0, 1e-5], np.float32)), "<i2")
    assert pcm.tolist() == [0, 16384, -16384, 32767, -32767, 32767, -32767, 0]


def test_wav_files_hold_the_samples(tmp_path):
    samples = np.sin(np.arange(1000) / 7).astype(np.float32) * 0.4
    rate, pcm = _wave(wav_bytes(samples, 24000))
    assert rate == 24000 and pcm.tobytes() == pcm16_bytes(samples)
    out = write_wav(tmp_path / "answer.wav", samples, 24000)
    assert out.read_bytes() == wav_bytes(samples, 24000) and os.listdir(tmp_path) == ["answer.wav"]
    write_wav(out, samples[:10], 24000)  # replaced whole
    assert _wave(out.read_bytes())[1].tobytes() == pcm16_bytes(samples[:10])
    assert encode_audio(samples, 24000, "pcm16") == pcm16_bytes(samples)
    with pytest.raises(ValueError, match="mp3"):
        encode_audio(samples, 24000, "mp3")


def test_audio_request_reads_modalities_and_audio():
    assert audio_request({}, VOICES) is None
    assert audio_request({"modalities": ["text"]}, VOICES) is None
    body = {"modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "wav"}}
    assert audio_request(body, VOICES) == {"voice": "ethan", "format": "wav"}
    assert audio_request({"modalities": ["text", "audio"], "audio": {"format": "pcm16"}}, VOICES) == {
        "voice": "chelsie", "format": "pcm16"}
    for bad, param in [({"audio": {"format": "wav"}}, "modalities"),
                       ({"modalities": ["audio"], "audio": {"format": "wav"}}, "modalities"),
                       ({"modalities": "text"}, "modalities"),
                       ({"modalities": ["text", "audio"]}, "audio"),
                       ({"modalities": ["text", "audio"], "audio": {"format": "mp3"}}, "audio.format"),
                       ({"modalities": ["text", "audio"], "audio": {"format": "wav", "voice": "alloy"}},
                        "audio.voice")]:
        with pytest.raises(RequestError) as info:
            audio_request(bad, VOICES)
        assert info.value.param == param and info.value.status == 400
    with pytest.raises(RequestError, match="unknown voice 'alloy'; this model's voices are chelsie, ethan, aiden"):
        audio_request({"modalities": ["text", "audio"], "audio": {"format": "wav", "voice": "alloy"}}, VOICES)
    with pytest.raises(RequestError, match="no talker"):
        audio_request({"modalities": ["text", "audio"], "audio": {"format": "wav"}}, ())


def test_message_audio_is_openais_shape():
    samples = np.linspace(-0.5, 0.5, 480, dtype=np.float32)
    result = types.SimpleNamespace(text="Hello.", audio=samples, sample_rate=24000)
    message = audio_message(result, "wav", audio_id="audio_1", now=1000.0)
    assert message["role"] == "assistant" and message["content"] is None
    audio = message["audio"]
    assert set(audio) == {"id", "data", "expires_at", "transcript"}
    assert (audio["id"], audio["expires_at"], audio["transcript"]) == ("audio_1", 1000 + EXPIRES_SECONDS, "Hello.")
    assert base64.b64decode(audio["data"]) == wav_bytes(samples, 24000)
    raw = message_audio(samples, 24000, "pcm16", "Hello.")
    assert base64.b64decode(raw["data"]) == pcm16_bytes(samples) and raw["id"].startswith("audio_")


@pytest.mark.parametrize("fmt", ["pcm16", "wav"])
def test_streamed_deltas_join_to_the_answer(fmt):
    parts = [np.full(n, 0.1 * i, np.float32) for i, n in enumerate((5, 9, 4))]
    deltas = AudioDeltas(fmt, 24000, audio_id="audio_7")
    events = [deltas.start(), deltas.transcript("Hel"), deltas.transcript("lo.")]
    events += [deltas.data(AudioChunk(p, 24000, np.zeros((1, 4), np.int32))) for p in parts]
    events.append(deltas.end(now=50.0))
    assert all(set(e) == {"audio"} for e in events)
    assert events[0]["audio"] == {"id": "audio_7", "transcript": ""}
    assert "".join(e["audio"].get("transcript", "") for e in events) == "Hello."
    assert events[-1]["audio"] == {"expires_at": 50 + EXPIRES_SECONDS}
    data = b"".join(base64.b64decode(e["audio"]["data"]) for e in events if "data" in e["audio"])
    pcm = b"".join(pcm16_bytes(p) for p in parts)
    if fmt == "pcm16":
        assert data == pcm
    else:
        assert data == wav_stream_header(24000) + pcm
        with wave.open(io.BytesIO(wav_stream_header(24000) + pcm)) as f:  # a streamed WAV header readers accept
            assert (f.getframerate(), f.getnchannels(), f.getsampwidth()) == (24000, 1, 2)
