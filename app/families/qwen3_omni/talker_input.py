"""Which thinker states feed the Qwen3-Omni talker, position by position: a pure function of token ids (host side).

As transformers 5.23's ``Qwen3OmniMoeForConditionalGeneration.generate`` lays it out, over the thinker sequence
S = prompt + spoken answer (the answer's tokens without its end token):

* the user turns (every position whose last ``<|im_start|>`` is followed by the user role token), in order: media
  placeholders read the thinker's hidden state at ``accept_hidden_layer`` through ``hidden_projection``, other
  tokens their input embedding through ``text_projection``;
* then nine positions from the last ``<|im_start|>assistant``: its first three tokens (text), four tts_pad, one
  tts_bos and the answer's first token, plus the talker's codec embeddings of
  (none, none, none, nothink, think_bos, think_eos, the voice, codec pad, codec bos);
* the rest of the answer and a final tts_eos are the "trailing" text: one entry joins each generated frame, then
  tts_pad.

The talker's 3-D positions are the thinker's rule applied to its own input ids (the user tokens, then nine
tts_pad ids) with the images and clips of the user turns.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from omnijax.common.errors import PromptError
from omnijax.preprocess.qwen3_omni.mrope import MRopeMedia, mrope_positions

# What a talker input position reads (``TalkerInput.kinds``).
TEXT, HIDDEN, TTS_PAD, TTS_BOS, TTS_EOS = range(5)
ASSISTANT_HEAD = 3  # <|im_start|>, "assistant", "\n": the assistant tokens before the answer


@dataclasses.dataclass(frozen=True)
class TalkerInput:
    """rows [n]: the thinker position each talker input position reads (-1 for the tts tokens); kinds [n]: TEXT,
    HIDDEN, TTS_PAD or TTS_BOS; codec [n]: the codec id whose talker embedding is added (-1: none);
    rope_positions [3, n] and rope_delta: the talker's positions; trailing_rows [m] and trailing_kinds [m]: the text
    still to speak (TEXT rows, then one TTS_EOS)."""

    rows: np.ndarray
    kinds: np.ndarray
    codec: np.ndarray
    rope_positions: np.ndarray
    rope_delta: float
    trailing_rows: np.ndarray
    trailing_kinds: np.ndarray

    @property
    def length(self) -> int:
        return len(self.rows)


def user_positions(prompt_ids: np.ndarray, im_start: int, user: int) -> np.ndarray:
    """[P] bool: the positions of user turns (the token after the last ``<|im_start|>`` at or before each position
    is the user role; before any ``<|im_start|>`` the token at 1 decides, as the reference's clamp makes it)."""
    n = len(prompt_ids)
    pos = np.arange(n)
    last = np.maximum.accumulate(np.where(prompt_ids == im_start, pos, -1)).clip(min=0)
    return prompt_ids[np.minimum(last + 1, n - 1)] == user


def assistant_start(prompt_ids: np.ndarray, im_start: int, assistant: int) -> int:
    """The position of the last ``<|im_start|>`` followed by the assistant role token."""
    hits = np.nonzero((prompt_ids[:-1] == im_start) & (prompt_ids[1:] == assistant))[0]
    if not len(hits):
        raise PromptError("the prompt has no assistant turn to speak (speech needs a chat prompt)")
    return int(hits[-1])


def talker_input(prompt_ids, answer_ids, cfg, speaker_id: int, rope_media: MRopeMedia | None = None
                 ) -> TalkerInput | None:
    """The talker's input layout for a prompt and its spoken answer (``cfg``: the family's ``SpeechConfig``;
    ``rope_media``: what the prompt's positions were computed from, ``PreparedPrompt.rope_media``; None: no media).
    None when the answer has no token to speak."""
    prompt = np.asarray(prompt_ids, np.int64)
    seq = np.concatenate([prompt, np.asarray(answer_ids, np.int64)])
    roles, codec, tts = cfg.roles, cfg.codec, cfg.tts
    start = assistant_start(prompt, roles["im_start"], roles["assistant"])
    spoken = len(seq) - start - ASSISTANT_HEAD  # the answer tokens after the assistant head
    if spoken < 1:
        return None
    user = np.nonzero(user_positions(prompt, roles["im_start"], roles["user"]))[0]
    media = np.isin(seq[user], cfg.media_ids)
    head = start + np.arange(ASSISTANT_HEAD)
    rows = np.concatenate([user, head, [-1] * 5, [start + ASSISTANT_HEAD]])
    kinds = np.concatenate([np.where(media, HIDDEN, TEXT), [TEXT] * ASSISTANT_HEAD, [TTS_PAD] * 4, [TTS_BOS],
                            [TEXT]])
    codes = [-1] * (len(user) + ASSISTANT_HEAD) + [codec["nothink"], codec["think_bos"], codec["think_eos"],
                                                   speaker_id, codec["pad"], codec["bos"]]
    trailing = np.arange(start + ASSISTANT_HEAD + 1, len(seq))
    ids = np.concatenate([seq[user], [tts["pad"]] * (ASSISTANT_HEAD + 6)])
    mrope = cfg.talker_mrope
    in_user = np.zeros(len(prompt), bool)
    in_user[user] = True
    kept = (rope_media or MRopeMedia()).kept(prompt, mrope, in_user)  # the images, clips and videos of the user turns
    positions, delta = mrope_positions(ids, image_grids=kept.image_grids, audio_lengths=kept.audio_lengths,
                                       videos=kept.videos, cfg=mrope)
    return TalkerInput(rows=rows.astype(np.int32), kinds=kinds.astype(np.int32), codec=np.asarray(codes, np.int32),
                       rope_positions=positions.astype(np.float32), rope_delta=float(delta),
                       trailing_rows=np.append(trailing, -1).astype(np.int32),
                       trailing_kinds=np.append(np.full(len(trailing), TEXT), TTS_EOS).astype(np.int32))
