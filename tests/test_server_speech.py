"""Spoken answers through the OpenAI-compatible server (demo/server.py, demo/openai_audio.py): a chat request with
``"modalities": ["text", "audio"]`` gets the same audio as ``Pipeline.generate(speak=True)`` (whole and streamed, WAV
and pcm16), and bad audio requests are 400s. In-process through the ASGI app, on the tiny full Qwen3-Omni."""

from __future__ import annotations

import base64
import json

import pytest
from starlette.testclient import TestClient

from omnijax.app.wav import pcm16_bytes, wav_bytes
from omnijax.demo import openai_protocol as api
from omnijax.demo.host_check import allowed_names
from omnijax.demo.openai_audio import wav_stream_header
from omnijax.demo.server import build_app, serving

URL = "http://127.0.0.1:8000"
N_TOKENS = 6
N_FRAMES = 12  # a random talker seldom chooses its end code: the cap ends the speech


@pytest.fixture(scope="module")
def client(qwen_speech_pipeline):
    with serving(qwen_speech_pipeline, model="omni", max_speech_frames=N_FRAMES) as s:
        yield TestClient(build_app(s, names=allowed_names("127.0.0.1")), base_url=URL)


def _body(voice: str, fmt: str, **extra) -> dict:
    return {"model": "omni", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": N_TOKENS,
            "temperature": 0, "modalities": ["text", "audio"], "audio": {"voice": voice, "format": fmt}, **extra}


@pytest.fixture(scope="module")
def reference(qwen_speech_pipeline):
    pipe = qwen_speech_pipeline
    voice = pipe.voices[-1]
    messages = api.chat_messages(_body(voice, "wav"))
    return voice, pipe.generate(messages, max_new_tokens=N_TOKENS, speak=True, voice=voice,
                                max_speech_frames=N_FRAMES)


def test_a_whole_spoken_answer_is_the_pipelines(client, reference):
    voice, ref = reference
    assert len(ref.audio) > 0
    for fmt, encode in (("wav", lambda a: wav_bytes(a, ref.sample_rate)), ("pcm16", pcm16_bytes)):
        r = client.post("/v1/chat/completions", json=_body(voice.upper(), fmt))
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert message["content"] is None
        assert message["audio"]["transcript"] == ref.text
        assert message["audio"]["id"].startswith("audio_") and message["audio"]["expires_at"] > 0
        assert base64.b64decode(message["audio"]["data"]) == encode(ref.audio)
        assert r.json()["usage"]["completion_tokens"] == len(ref.token_ids)


def test_a_streamed_spoken_answer_is_the_pipelines(client, reference):
    voice, ref = reference
    with client.stream("POST", "/v1/chat/completions", json=_body(voice, "wav", stream=True)) as r:
        assert r.status_code == 200
        lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    deltas = [json.loads(line)["choices"][0]["delta"] for line in lines[:-1]]
    audio = [d["audio"] for d in deltas if "audio" in d]
    assert audio[0]["id"].startswith("audio_") and "content" not in deltas[1]
    assert "".join(a.get("transcript", "") for a in audio) == ref.text
    data = b"".join(base64.b64decode(a["data"]) for a in audio if "data" in a)
    assert data == wav_stream_header(ref.sample_rate) + pcm16_bytes(ref.audio)
    assert sum("data" in a for a in audio) >= 2  # chunk by chunk, not one piece at the end
    assert "expires_at" in audio[-1]
    assert json.loads(lines[-2])["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("change, param", [
    ({"audio": {"voice": "nobody", "format": "wav"}}, "audio.voice"),
    ({"audio": {"voice": None, "format": "mp3"}}, "audio.format"),
    ({"audio": None}, "audio"),
    ({"modalities": ["audio"]}, "modalities"),
    ({"modalities": "text"}, "modalities"),
    ({"logprobs": True}, "logprobs"),  # a spoken answer comes without log probabilities
    ({"n": 2}, "n"),  # and as one choice
])
def test_bad_audio_requests_are_400s(client, qwen_speech_pipeline, change, param):
    body = {**_body(qwen_speech_pipeline.voices[0], "wav"), **change}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_completions_and_models_without_a_talker_refuse_audio(client, gemma3_pipeline):
    r = client.post("/v1/completions", json={"model": "omni", "prompt": "Hi", "modalities": ["text", "audio"],
                                             "audio": {"format": "wav"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "modalities"
    with serving(gemma3_pipeline, model="tiny") as s:
        other = TestClient(build_app(s, names=allowed_names("127.0.0.1")), base_url=URL)
        r = other.post("/v1/chat/completions", json={**_body("x", "wav"), "model": "tiny"})
    assert r.status_code == 400 and "no talker" in r.json()["error"]["message"]
