"""Llama 4 on 4 simulated CPU devices (a subprocess): a data x model mesh and a model-only mesh, experts split over
the model axis, give the one-device tokens and logits."""

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
folder, large, wide = sys.argv[1:4]
convs = [[{"role": "user", "content": [{"type": "image", "image": large}, {"type": "text", "text": "Compare"},
                                       {"type": "image", "image": wide}]}],
         [{"role": "user", "content": "The mountain village sits above the lake, where the road ends and a path "
                                      "climbs into the pine forest. Tell me more about it."}]]
out = {}
for name, mesh in [("one", make_mesh(1, jax.devices()[:1])), ("model4", make_mesh(4)), ("data2_model2", make_mesh(2))]:
    pipe = Pipeline.from_pretrained(folder, mesh=mesh, max_batch=2, max_context=1024)
    moe = next(l["mlp"] for l in pipe.engine.params["decoder"]["layers"].values() if "router" in l["mlp"])
    scores = pipe.prompt_logits(convs)
    out[name] = {"tokens": [r.token_ids for r in pipe.generate(convs, max_new_tokens=12)],
                 "scores": [s.tolist() for s in scores], "mesh": dict(pipe.engine.mesh.shape),
                 "expert_spec": str(moe["gate_proj"].sharding.spec),
                 "expert_shards": len(moe["gate_proj"].addressable_shards)}
print("RESULT" + json.dumps(out))
"""


def test_four_device_meshes_equal_one_device(tiny_llama4_dir, llama4_image_paths):
    out = run_on_four_devices(SCRIPT, tiny_llama4_dir, llama4_image_paths["large"], llama4_image_paths["wide"],
                              timeout=900)
    one = out["one"]
    assert len(one["tokens"][0]) == 12
    assert out["model4"]["mesh"] == {"data": 1, "model": 4} and out["data2_model2"]["mesh"] == {"data": 2, "model": 2}
    for name in ("model4", "data2_model2"):
        got = out[name]
        assert got["tokens"] == one["tokens"], name
        for ours, ref in zip(got["scores"], one["scores"]):
            ours, ref = np.asarray(ours), np.asarray(ref)
            assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max())), name
        assert got["expert_spec"] == "P('model', None, None)", name  # experts split over the model axis
    assert out["model4"]["expert_shards"] == 4
