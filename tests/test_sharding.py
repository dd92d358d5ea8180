"""The same prompts on 1 device and on 4 simulated CPU devices (model axis 2 and 4) give the same tokens."""

import json
import os
import pathlib
import subprocess
import sys

from jax.sharding import PartitionSpec

ROOT = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import jax, numpy as np
from PIL import Image
from app.pipeline import Pipeline
from common.sharding import make_mesh
assert len(jax.devices()) == 4, jax.devices()
folder = sys.argv[1]
img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 30, 3), dtype=np.uint8))
convs = [[{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "What is this?"}]}],
         [{"role": "user", "content": "Tell me a story about a fox."}]]
out = {}
for name, mesh in [("one", make_mesh(1, jax.devices()[:1])), ("model4", make_mesh(4)), ("data2_model2", make_mesh(2))]:
    pipe = Pipeline.from_pretrained(folder, mesh=mesh)
    leaf = pipe.engine.params["decoder"]["layers"][0]["mlp"]["gate_up_proj"]["kernel"]
    out[name] = {"tokens": [r.token_ids for r in pipe.generate(convs, max_new_tokens=12)],
                 "shards": len(leaf.addressable_shards), "spec": str(leaf.sharding.spec)}
print("RESULT" + json.dumps(out))
"""


def test_four_device_runs_equal_one_device(tiny_gemma3_dir):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_gemma3_dir)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    out = json.loads(line[len("RESULT"):])
    assert out["one"]["tokens"] == out["model4"]["tokens"] == out["data2_model2"]["tokens"]
    assert len(out["one"]["tokens"][0]) > 0
    assert out["model4"]["shards"] == 4 and "model" in out["model4"]["spec"]  # weights really are split


def test_partition_spec_drops_axes_that_do_not_divide():
    import jax
    from common.sharding import make_mesh, partition_spec

    mesh = make_mesh(1, jax.devices()[:1])
    assert partition_spec(("embed", "mlp"), (8, 16), mesh) == PartitionSpec(None, None)

    class FakeMesh:
        shape = {"data": 2, "model": 4}

    assert partition_spec(("embed", "mlp"), (8, 16), FakeMesh()) == PartitionSpec(None, "model")
    assert partition_spec(("embed", "kv_heads"), (8, 6), FakeMesh()) == PartitionSpec(None, None)
    assert partition_spec(("batch", "length"), (4, 5), FakeMesh()) == PartitionSpec("data", None)
    assert partition_spec(("heads", "mlp"), (8, 8), FakeMesh()) == PartitionSpec("model", None)


QWEN_SCRIPT = r"""
import json, sys
import jax, numpy as np
from PIL import Image
from app.pipeline import Pipeline
from common.sharding import make_mesh
folder = sys.argv[1]
img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8))
t = np.arange(16000) / 16000
clip = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
convs = [[{"role": "user", "content": [{"type": "image", "image": img}, {"type": "audio", "audio": clip},
                                       {"type": "text", "text": "Describe both."}]}],
         [{"role": "user", "content": "Tell me a story about a fox."}]]
out = {}
for name, mesh in [("one", make_mesh(1, jax.devices()[:1])), ("model4", make_mesh(4)), ("data2_model2", make_mesh(2))]:
    pipe = Pipeline.from_pretrained(folder, mesh=mesh)
    moe = next(l["mlp"] for l in pipe.engine.params["decoder"]["layers"].values() if "router" in l["mlp"])
    out[name] = {"tokens": [r.token_ids for r in pipe.generate(convs, max_new_tokens=10)],
                 "expert_spec": str(moe["gate_proj"].sharding.spec)}
print("RESULT" + json.dumps(out))
"""


def test_expert_parallel_runs_equal_one_device(tiny_qwen_dir):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", QWEN_SCRIPT, str(tiny_qwen_dir)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))[len("RESULT"):])
    assert out["one"]["tokens"] == out["model4"]["tokens"] == out["data2_model2"]["tokens"]
    assert out["model4"]["expert_spec"] == "P('model', None, None)"  # experts split over the model axis
