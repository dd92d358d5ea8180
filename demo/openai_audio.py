"""Spoken answers in the OpenAI chat API's shapes: the request's ``modalities`` / ``audio`` fields, ``message.audio``
for a whole answer, streamed ``delta.audio`` pieces, and the WAV / pcm16 encodings (16-bit little-endian mono at
the model's rate, 24 kHz for Qwen3-Omni).

OpenAI's shapes: a request asks for speech with ``"modalities": ["text", "audio"]`` and
``"audio": {"voice": NAME, "format": "wav" | "pcm16"}``; the answer's message is ``{"role": "assistant",
"content": null, "audio": {"id", "data" (base64), "expires_at", "transcript"}}``; a stream sends ``delta.audio``
objects: the first with the ``id``, ``transcript`` pieces as the text arrives, ``data`` pieces as the audio does,
and ``expires_at`` last. A streamed "wav" starts with a header whose sizes say "unknown length" (0xFFFFFFFF), as
streamed WAV usually does; "pcm16" is the raw samples (the encodings: app/wav.py). Nothing here imports JAX.
"""

from __future__ import annotations

import base64
import struct
import time
import uuid

import numpy as np

from omnijax.app.wav import pcm16_bytes, wav_bytes
from omnijax.demo.openai_protocol import RequestError

AUDIO_OUTPUT_FORMATS = ("wav", "pcm16")
EXPIRES_SECONDS = 3600  # how long OpenAI says an audio id stays valid (this server keeps nothing)


def wav_stream_header(sample_rate: int) -> bytes:
    """The 44-byte header of a mono 16-bit WAV stream of unknown length (RIFF and data sizes 0xFFFFFFFF)."""
    rate = int(sample_rate)
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2,
                                                                                16)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """A whole answer's samples as ``fmt`` ("wav": a WAV file; "pcm16": raw samples)."""
    if fmt == "wav":
        return wav_bytes(samples, sample_rate)
    if fmt == "pcm16":
        return pcm16_bytes(samples)
    raise ValueError(f"unknown audio format {fmt!r}; use one of {AUDIO_OUTPUT_FORMATS}")


def audio_request(body: dict, voices: tuple[str, ...]) -> dict | None:
    """The request's spoken-answer settings ``{"voice", "format"}``, or None when it asks for text only.

    ``modalities`` must be ["text"] or ["text", "audio"]; with audio, ``audio.format`` is "wav" or "pcm16" and
    ``audio.voice`` one of ``voices`` (any case; absent: the model's first). RequestError names a bad field; a model
    without voices (no talker) refuses audio."""
    modalities = body.get("modalities")
    if modalities is None:
        if body.get("audio") is not None:
            raise RequestError("'audio' needs 'modalities': [\"text\", \"audio\"]", param="modalities")
        return None
    if not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities) or \
            not set(modalities) <= {"text", "audio"} or "text" not in modalities:
        raise RequestError(f"'modalities' must be [\"text\"] or [\"text\", \"audio\"], got {modalities!r}"[:300],
                           param="modalities")
    if "audio" not in modalities:
        return None
    if not voices:
        raise RequestError("this model has no talker: it cannot answer with audio", param="modalities")
    audio = body.get("audio")
    if not isinstance(audio, dict):
        raise RequestError("'modalities' asks for audio: give 'audio': {\"voice\": ..., \"format\": \"wav\" | "
                           "\"pcm16\"}", param="audio")
    fmt = audio.get("format")
    if fmt not in AUDIO_OUTPUT_FORMATS:
        raise RequestError(f"audio.format must be one of {', '.join(AUDIO_OUTPUT_FORMATS)}, got {fmt!r}"[:300],
                           param="audio.format")
    voice = audio.get("voice", voices[0])
    if not isinstance(voice, str) or voice.lower() not in voices:
        raise RequestError(f"unknown voice {voice!r}; this model's voices are {', '.join(voices)}"[:300],
                           param="audio.voice")
    return {"voice": voice.lower(), "format": fmt}


def new_audio_id() -> str:
    return f"audio_{uuid.uuid4().hex}"


def message_audio(samples: np.ndarray, sample_rate: int, fmt: str, transcript: str, *,
                  audio_id: str | None = None, now: float | None = None) -> dict:
    """OpenAI's ``message.audio`` object: id, base64 data, expires_at (unix seconds) and the transcript."""
    now = time.time() if now is None else now
    return {"id": audio_id or new_audio_id(), "data": base64.b64encode(encode_audio(samples, sample_rate, fmt)).decode(),
            "expires_at": int(now) + EXPIRES_SECONDS, "transcript": transcript}


def audio_message(result, fmt: str, **kwargs) -> dict:
    """The assistant message of a spoken answer (a ``GenerationResult`` with ``audio``): the text is the audio's
    transcript, ``content`` is null, as OpenAI answers."""
    return {"role": "assistant", "content": None,
            "audio": message_audio(result.audio, result.sample_rate, fmt, result.text, **kwargs)}


class AudioDeltas:
    """The ``delta`` objects of a streamed spoken answer, in order: ``start()`` (the id), ``transcript(piece)`` per
    text piece, ``data(chunk)`` per ``AudioChunk``, ``end()`` (expires_at). ``data`` pieces joined and decoded
    are the answer's audio in ``fmt`` (a streamed "wav" has its header first)."""

    def __init__(self, fmt: str, sample_rate: int, *, audio_id: str | None = None):
        if fmt not in AUDIO_OUTPUT_FORMATS:
            raise ValueError(f"unknown audio format {fmt!r}; use one of {AUDIO_OUTPUT_FORMATS}")
        self.fmt, self.sample_rate, self.id = fmt, int(sample_rate), audio_id or new_audio_id()
        self._header = fmt == "wav"

    def start(self) -> dict:
        return {"audio": {"id": self.id, "transcript": ""}}

    def transcript(self, piece: str) -> dict:
        return {"audio": {"transcript": piece}}

    def data(self, chunk) -> dict:
        payload = pcm16_bytes(chunk.samples)
        if self._header:
            payload, self._header = wav_stream_header(self.sample_rate) + payload, False
        return {"audio": {"data": base64.b64encode(payload).decode()}}

    def end(self, now: float | None = None) -> dict:
        return {"audio": {"expires_at": int(time.time() if now is None else now) + EXPIRES_SECONDS}}
