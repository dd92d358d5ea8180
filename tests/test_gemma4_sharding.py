"""Gemma 4 on 4 simulated CPU devices gives what one device gives: the small layout (per-layer embeddings, KV
sharing, image + audio) on a 2 x 2 (data x model) mesh, the mixture-of-experts layout with the experts split 4 ways."""

import pytest
from fixtures.four_devices import run_on_four_devices

pytestmark = pytest.mark.multidevice

SCRIPT = r"""
import json, sys
import jax, numpy as np
from PIL import Image
from omnijax.app.pipeline import Pipeline
from omnijax.common.sharding import make_mesh
assert len(jax.devices()) == 4, jax.devices()
img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 64, 3), dtype=np.uint8))
t = np.arange(12000) / 16000
clip = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
out = {}
for kind, folder, meshes in [("small", sys.argv[1], [("one", 1), ("data2_model2", 2)]),
                             ("moe", sys.argv[2], [("one", 1), ("model4", 4)])]:
    media = [{"type": "image", "image": img}] + ([{"type": "audio", "audio": clip}] if kind == "small" else [])
    convs = [[{"role": "user", "content": media + [{"type": "text", "text": "Describe it."}]}],
             [{"role": "user", "content": "Tell me a story about a fox."}]]
    for name, model_axis in meshes:
        mesh = make_mesh(1, jax.devices()[:1]) if model_axis == 1 else make_mesh(model_axis)
        pipe = Pipeline.from_pretrained(folder, mesh=mesh, max_batch=2, max_context=1024)
        pipe.engine.buckets = (192, pipe.engine.max_context)
        layer = pipe.engine.params["decoder"]["layers"][0]
        leaf = layer["moe"]["gate_proj"] if kind == "moe" else layer["mlp"]["gate_up_proj"]
        out[kind + "/" + name] = {"tokens": [r.token_ids for r in pipe.generate(convs, max_new_tokens=10)],
                                  "spec": str(leaf.sharding.spec),
                                  "shards": len({str(s.index) for s in leaf.addressable_shards})}
print("RESULT" + json.dumps(out))
"""


def test_four_device_runs_equal_one_device(tiny_gemma4_small_dir, tiny_gemma4_moe_dir):
    out = run_on_four_devices(SCRIPT, tiny_gemma4_small_dir, tiny_gemma4_moe_dir, timeout=900)
    for kind, split in (("small", "data2_model2"), ("moe", "model4")):
        one, four = out[f"{kind}/one"], out[f"{kind}/{split}"]
        assert four["tokens"] == one["tokens"] and all(len(t) > 0 for t in one["tokens"])
    assert "model" in out["small/data2_model2"]["spec"] and out["small/data2_model2"]["shards"] == 2
    assert out["moe/model4"]["spec"] == "P('model', None, None)" and out["moe/model4"]["shards"] == 4
