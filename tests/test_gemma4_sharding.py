"""Gemma 4 on 4 simulated CPU devices gives what one device gives: the small layout (per-layer embeddings, KV
sharing, image + audio) on a 2 x 2 (data x model) mesh, the mixture-of-experts layout with the experts split 4 ways.
The one-device answers are the session pipelines' (conftest.py), whose settings the four-device runs copy."""

import pytest
from fixtures.four_devices import run_on_four_devices

pytestmark = pytest.mark.multidevice

# the prompts of a kind (``kind`` set before), built the same way in the child and here
CONVS = r"""
import numpy as np
from PIL import Image
img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 64, 3), dtype=np.uint8))
t = np.arange(12000) / 16000
clip = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
media = [{"type": "image", "image": img}] + ([{"type": "audio", "audio": clip}] if kind == "small" else [])
convs = [[{"role": "user", "content": media + [{"type": "text", "text": "Describe it."}]}],
         [{"role": "user", "content": "Tell me a story about a fox."}]]
"""

SCRIPT = r"""
import json, sys
import jax
from omnijax.app.pipeline import Pipeline
from fixtures.step_shapes import few_step_shapes
from omnijax.common.sharding import make_mesh
assert len(jax.devices()) == 4, jax.devices()
out = {}
for kind, folder, model_axis in [("small", sys.argv[1], 2), ("moe", sys.argv[2], 4)]:
    exec(sys.argv[3])
    pipe = Pipeline.from_pretrained(folder, mesh=make_mesh(model_axis), max_batched_tokens=384)
    pipe.engine.buckets = (384, pipe.engine.max_context)
    few_step_shapes(pipe)
    layer = pipe.engine.params["decoder"]["layers"][0]
    leaf = layer["moe"]["gate_proj"] if kind == "moe" else layer["mlp"]["gate_up_proj"]
    out[kind] = {"tokens": [r.token_ids for r in pipe.generate(convs, max_new_tokens=10)],
                 "spec": str(leaf.sharding.spec), "shards": len({str(s.index) for s in leaf.addressable_shards})}
print("RESULT" + json.dumps(out))
"""


def one_device(kind: str, pipe) -> list[list[int]]:
    scope: dict = {"kind": kind}
    exec(CONVS, scope)
    return [r.token_ids for r in pipe.generate(scope["convs"], max_new_tokens=10)]


def test_four_device_runs_equal_one_device(tiny_gemma4_small_dir, tiny_gemma4_moe_dir, gemma4_small_pipeline,
                                           gemma4_moe_pipeline):
    out = run_on_four_devices(SCRIPT, tiny_gemma4_small_dir, tiny_gemma4_moe_dir, CONVS, timeout=900)
    for kind, pipe in (("small", gemma4_small_pipeline), ("moe", gemma4_moe_pipeline)):
        one = one_device(kind, pipe)
        assert out[kind]["tokens"] == one and all(len(t) > 0 for t in one), kind
    assert "model" in out["small"]["spec"] and out["small"]["shards"] == 2
    assert out["moe"]["spec"] == "P('model', None, None)" and out["moe"]["shards"] == 4
