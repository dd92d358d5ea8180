"""Qwen3-Omni answering aloud on 4 simulated CPU devices (a 2 x 2 data x model mesh: the talker's experts and
projections split over the model axis) speaks what one device speaks."""

import pytest
from fixtures.four_devices import run_on_four_devices

pytestmark = pytest.mark.multidevice

SCRIPT = r"""
import json, sys
import jax, numpy as np
from omnijax.app.pipeline import Pipeline
from omnijax.common.sharding import make_mesh
assert len(jax.devices()) == 4, jax.devices()
messages = [{"role": "user", "content": [{"type": "text", "text": "Tell me about the sea."}]}]
out = {}
for name, mesh in (("one", make_mesh(1, jax.devices()[:1])), ("data2_model2", make_mesh(2))):
    pipe = Pipeline.from_pretrained(sys.argv[1], mesh=mesh, max_batch=2, max_context=1024)
    r = pipe.generate(messages, max_new_tokens=8, speak=True, voice="aiden", max_speech_frames=12)
    experts = pipe.engine.params["speech"]["talker"]["decoder"]["layers"][0]["mlp"]["gate_proj"]
    out[name] = {"codes": r.audio_codes.tolist(), "audio": r.audio.tolist(), "tokens": r.token_ids,
                 "spec": str(experts.sharding.spec), "shards": len({str(s.index) for s in experts.addressable_shards})}
print("RESULT" + json.dumps(out))
"""


def test_four_device_speech_equals_one_device(tiny_qwen_full_dir):
    out = run_on_four_devices(SCRIPT, tiny_qwen_full_dir, timeout=900)
    one, four = out["one"], out["data2_model2"]
    assert four["tokens"] == one["tokens"] and four["codes"] == one["codes"] and len(one["codes"]) == 12
    peak = max(abs(x) for x in one["audio"])
    assert max(abs(a - b) for a, b in zip(one["audio"], four["audio"])) <= 1e-5 * peak
    assert "model" in four["spec"] and four["shards"] == 2
