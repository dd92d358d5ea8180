"""The speech-output half of a Qwen3-Omni model: its talker (with the code predictor) and code2wav."""

from __future__ import annotations

from flax import nnx

from omnijax.decoder.parts import BUILTIN_PARTS
from omnijax.decoder.qwen3_omni.code2wav import Code2Wav, Code2WavConfig
from omnijax.decoder.qwen3_omni.talker import Talker, TalkerConfig


class SpeechOutput(nnx.Module):
    def __init__(self, talker: TalkerConfig, code2wav: Code2WavConfig, *, rngs: nnx.Rngs):
        self.talker = Talker(talker, BUILTIN_PARTS, rngs=rngs)
        self.code2wav = Code2Wav(code2wav, rngs=rngs)
