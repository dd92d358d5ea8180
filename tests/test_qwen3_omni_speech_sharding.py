"""Qwen3-Omni answering aloud on 4 simulated CPU devices (a 2 x 2 data x model mesh: the talker's experts and
projections split over the model axis) speaks what one device speaks (the session pipeline's answer: the child loads
the folder with its settings)."""

import numpy as np

import pytest
from fixtures.four_devices import run_on_four_devices

pytestmark = pytest.mark.multidevice

SCRIPT = r"""
import json, sys
import jax, numpy as np
from omnijax.app.pipeline import Pipeline
from omnijax.common.sharding import make_mesh
assert len(jax.devices()) == 4, jax.devices()
pipe = Pipeline.from_pretrained(sys.argv[1], mesh=make_mesh(2))
r = pipe.generate(MESSAGES, max_new_tokens=8, speak=True, voice="aiden", max_speech_frames=12)
experts = pipe.engine.params["speech"]["talker"]["decoder"]["layers"][0]["mlp"]["gate_proj"]
out = {"codes": r.audio_codes.tolist(), "audio": r.audio.tolist(), "tokens": r.token_ids,
       "spec": str(experts.sharding.spec), "shards": len({str(s.index) for s in experts.addressable_shards})}
print("RESULT" + json.dumps(out))
"""
MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "Tell me about the sea."}]}]


def test_four_device_speech_equals_one_device(tiny_qwen_full_dir, qwen_speech_pipeline):
    four = run_on_four_devices(SCRIPT.replace("MESSAGES", repr(MESSAGES)), tiny_qwen_full_dir, timeout=900)
    one = qwen_speech_pipeline.generate(MESSAGES, max_new_tokens=8, speak=True, voice="aiden", max_speech_frames=12)
    assert four["tokens"] == one.token_ids and four["codes"] == one.audio_codes.tolist() and len(four["codes"]) == 12
    audio = np.asarray(four["audio"], np.float32)
    assert audio.shape == one.audio.shape
    assert np.abs(audio - one.audio).max() <= 1e-5 * np.abs(one.audio).max()
    assert "model" in four["spec"] and four["shards"] == 2
