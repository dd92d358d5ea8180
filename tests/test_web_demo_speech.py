"""The web demo with a model that answers aloud: the speak switch and voice, the streamed player values and the
whole spoken answer, on the tiny full Qwen3-Omni pipeline."""

from __future__ import annotations

import base64
import json
import types

import numpy as np

from omnijax.app.wav import pcm16_bytes
from omnijax.demo.chat_state import SPEECH_WINDOW, AnswerStats, format_stats, speech_update

from fixtures.web_demo_parts import MAX_NEW, STATS_RE, _text, _user

FRAMES = 20  # codec frames of a spoken answer here (a first chunk of 8, then 12)


def _played(updates: list[str]) -> bytes:
    """The PCM bytes a page plays from these player values: each chunk number once, in order, per answer."""
    played, last = [], -1
    for value in updates:
        for chunk in json.loads(value)["chunks"]:
            if chunk["seq"] > last:
                assert chunk["seq"] == last + 1, "a chunk was skipped"
                played.append(base64.b64decode(chunk["pcm"]))
                last = chunk["seq"]
    return b"".join(played)


def test_speech_update_repeats_the_last_chunks():
    chunks = [np.full(3, 0.1 * i, np.float32) for i in range(5)]
    value = json.loads(speech_update(7, chunks, 24000))
    assert value["answer"] == 7 and value["rate"] == 24000
    assert [c["seq"] for c in value["chunks"]] == list(range(5 - SPEECH_WINDOW, 5))
    assert base64.b64decode(value["chunks"][-1]["pcm"]) == pcm16_bytes(chunks[-1])
    assert _played([speech_update(1, chunks[:n], 24000) for n in (1, 2, 5)]) == b"".join(map(pcm16_bytes, chunks))


def test_stats_name_the_spoken_answer():
    line = format_stats(AnswerStats(51, 32, 0.5, 2.0, first_audio_s=1.25, audio_s=2.4))
    assert line.endswith(" · spoken 2.40 s (first audio 1.25 s)") and STATS_RE.match(line)


def test_responder_speaks_the_answer_when_asked(qwen_speech_pipeline):
    from omnijax.demo.web import make_responder

    pipe = qwen_speech_pipeline
    respond = make_responder(pipe, max_speech_frames=FRAMES)
    messages = [_user(_text("Tell me about the sea."))]
    expected = pipe.generate(messages, max_new_tokens=MAX_NEW, speak=True, voice="ethan", max_speech_frames=FRAMES)
    outputs = list(respond({"text": "Tell me about the sea.", "files": []}, [], MAX_NEW, 0.0, 1.0, 0, 0, True,
                           "ethan"))
    assert all(len(o) == 4 for o in outputs)
    assert outputs[-1][0]["content"][0]["text"] == expected.text
    updates = [o[2] for o in outputs if isinstance(o[2], str)]
    assert len(updates) >= 2 and all(isinstance(o[2], str) for o in outputs[-len(updates) - 1:-1])
    assert _played(updates) == pcm16_bytes(expected.audio)  # played as it came: the whole spoken answer
    rate, whole = outputs[-1][3]
    assert rate == 24000 and whole.dtype == np.int16 and whole.tobytes() == pcm16_bytes(expected.audio)
    assert "spoken" in outputs[-1][1] and STATS_RE.match(outputs[-1][1])
    assert outputs[0][3] is None  # the first piece clears the previous spoken answer


def test_responder_stays_silent_without_the_switch(qwen_speech_pipeline):
    from omnijax.demo.web import make_responder

    outputs = list(make_responder(qwen_speech_pipeline, max_speech_frames=FRAMES)(
        {"text": "Hi", "files": []}, [], MAX_NEW, 0.0, 1.0, 0, 0, False, "ethan"))
    assert not any(isinstance(o[2], str) for o in outputs) and outputs[-1][3] is None
    assert STATS_RE.fullmatch(outputs[-1][1])


def _fake_pipe(talker: bool):
    return types.SimpleNamespace(name="m", family="fam", has_talker=talker, voices=("chelsie", "ethan"),
                                 config=types.SimpleNamespace(modalities=("image", "audio"), max_context=2048))


def test_the_page_has_the_speak_switch_only_for_a_model_with_a_talker():
    from omnijax.demo.web import build_demo

    def ids(demo):
        return {c["props"].get("elem_id") for c in demo.get_config_file()["components"]}

    with_talker = ids(build_demo(_fake_pipe(True)))
    assert {"speak", "voice", "speech-player", "spoken-answer"} <= with_talker
    assert not {"speak", "voice", "speech-player", "spoken-answer"} & ids(build_demo(_fake_pipe(False)))
    voice = next(c for c in build_demo(_fake_pipe(True)).get_config_file()["components"]
                 if c["props"].get("elem_id") == "voice")
    assert [choice[0] for choice in voice["props"]["choices"]] == ["chelsie", "ethan"]
