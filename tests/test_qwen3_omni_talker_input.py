"""Which thinker states feed the Qwen3-Omni talker (app/families/qwen3_omni/talker_input.py), alone: the user
turns, the assistant head with its codec tokens, the trailing text, positions and bad prompts."""

from __future__ import annotations

import numpy as np
import pytest

from omnijax.app.families.qwen3_omni.talker_input import (HIDDEN, TEXT, TTS_BOS, TTS_EOS, TTS_PAD, talker_input,
                                                          user_positions)
from omnijax.common.errors import PromptError

from test_qwen3_omni_parity import image


def _text(t):
    return {"type": "text", "text": t}


CHAT = [{"role": "system", "content": [_text("Be brief.")]},
        {"role": "user", "content": [{"type": "image", "image": image(3)}, _text("What is it?")]},
        {"role": "assistant", "content": [_text("A square.")]},
        {"role": "user", "content": [_text("And now?")]}]


def test_the_talker_reads_the_user_turns_and_the_answer(qwen_speech_pipeline):
    pipe = qwen_speech_pipeline
    cfg = pipe.config.speech
    prompt = pipe.prepare(CHAT)
    ids = prompt.token_ids
    answer = np.array([300, 301, 302, 303], np.int32)
    layout = talker_input(ids, answer, cfg, 51, prompt.rope_media)
    decode = pipe.processor.decode
    user = layout.rows[:-9]
    text = decode(ids[user].tolist())
    assert "What is it?" in text and "And now?" in text
    assert "Be brief." not in text and "A square." not in text  # the system and assistant turns are left out
    image_id = pipe.config.media_token_id("image")
    np.testing.assert_array_equal(layout.kinds[:-9], np.where(ids[user] == image_id, HIDDEN, TEXT))
    assert (layout.kinds[:-9] == HIDDEN).sum() == (ids == image_id).sum() > 0
    start = len(ids) - 3  # the prompt ends with <|im_start|>assistant\n
    assert layout.rows[-9:].tolist() == [start, start + 1, start + 2, -1, -1, -1, -1, -1, len(ids)]
    assert layout.kinds[-9:].tolist() == [TEXT] * 3 + [TTS_PAD] * 4 + [TTS_BOS, TEXT]
    c = cfg.codec
    assert layout.codec.tolist() == [-1] * (len(user) + 3) + [c["nothink"], c["think_bos"], c["think_eos"], 51,
                                                               c["pad"], c["bos"]]
    assert layout.trailing_rows.tolist() == [len(ids) + 1, len(ids) + 2, len(ids) + 3, -1]
    assert layout.trailing_kinds.tolist() == [TEXT, TEXT, TEXT, TTS_EOS]
    positions = layout.rope_positions
    assert positions.shape == (3, layout.length) and layout.rope_delta == positions.max() + 1 - layout.length
    assert layout.rope_delta < 0  # the image's tokens share positions: its grid is in the talker's positions


def test_text_only_positions_count_up(qwen_speech_pipeline):
    pipe = qwen_speech_pipeline
    prompt = pipe.prepare([{"role": "user", "content": [_text("Hi")]}])
    layout = talker_input(prompt.token_ids, [300], pipe.config.speech, 50)
    np.testing.assert_array_equal(layout.rope_positions, np.tile(np.arange(layout.length), (3, 1)))
    assert layout.rope_delta == 0 and layout.trailing_kinds.tolist() == [TTS_EOS]


def test_nothing_to_speak_and_no_assistant_turn(qwen_speech_pipeline):
    pipe = qwen_speech_pipeline
    ids = pipe.prepare([{"role": "user", "content": [_text("Hi")]}]).token_ids
    assert talker_input(ids, [], pipe.config.speech, 50) is None
    roles = pipe.config.speech.roles
    with pytest.raises(PromptError, match="no assistant turn"):
        talker_input(ids[:-3], [300], pipe.config.speech, 50)
    mask = user_positions(ids, roles["im_start"], roles["user"])
    assert mask[0] and not mask[-3:].any()
