"""Llama 4 on 4 simulated CPU devices (a subprocess): a model axis of 4, the experts split over it, gives the
one-device tokens and logits. (A data x model mesh: the other families' four-device runs; the data axis splits the
slots and the batch whatever the family.)"""

import numpy as np
import pytest

from fixtures.four_devices import run_on_four_devices

pytestmark = pytest.mark.multidevice

# the prompts (``large`` and ``wide`` image paths set before), built the same way in the child and here
CONVS = r"""
convs = [[{"role": "user", "content": [{"type": "image", "image": large}, {"type": "text", "text": "Compare"},
                                       {"type": "image", "image": wide}]}],
         [{"role": "user", "content": "The mountain village sits above the lake, where the road ends and a path "
                                      "climbs into the pine forest. Tell me more about it."}]]
"""

# the four-device runs load the folder with the session pipeline's settings (conftest.py: llama4_pipeline), whose
# answer here is the one-device answer
SCRIPT = r"""
import json, sys
import jax, numpy as np
from omnijax.app.pipeline import Pipeline
from fixtures.step_shapes import few_step_shapes
from omnijax.common.sharding import make_mesh
assert len(jax.devices()) == 4, jax.devices()
folder, large, wide = sys.argv[1:4]
exec(sys.argv[4])
pipe = Pipeline.from_pretrained(folder, mesh=make_mesh(4), max_batched_tokens=128)
few_step_shapes(pipe)
moe = next(l["mlp"] for l in pipe.engine.params["decoder"]["layers"].values() if "router" in l["mlp"])
scores = pipe.prompt_logits(convs)
out = {"tokens": [r.token_ids for r in pipe.generate(convs, max_new_tokens=12)],
       "scores": [s.tolist() for s in scores], "mesh": dict(pipe.engine.mesh.shape),
       "expert_spec": str(moe["gate_proj"].sharding.spec),
       "expert_shards": len(moe["gate_proj"].addressable_shards)}
print("RESULT" + json.dumps(out))
"""


def test_four_device_meshes_equal_one_device(tiny_llama4_dir, llama4_image_paths, llama4_pipeline):
    large, wide = llama4_image_paths["large"], llama4_image_paths["wide"]
    four = run_on_four_devices(SCRIPT, tiny_llama4_dir, large, wide, CONVS, timeout=900)
    scope = {"large": large, "wide": wide}
    exec(CONVS, scope)
    one_tokens = [r.token_ids for r in llama4_pipeline.generate(scope["convs"], max_new_tokens=12)]
    one_scores = llama4_pipeline.prompt_logits(scope["convs"])
    assert len(one_tokens[0]) == 12
    assert four["mesh"] == {"data": 1, "model": 4}
    assert four["tokens"] == one_tokens
    assert len(four["scores"]) == len(one_scores) == 2
    for ours, ref in zip(four["scores"], one_scores):
        ours = np.asarray(ours)
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
    assert four["expert_spec"] == "P('model', None, None)" and four["expert_shards"] == 4  # experts split 4 ways
