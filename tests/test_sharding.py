"""The same prompts on 1 device and on 4 simulated CPU devices (model axis 4; data 2 x model 2 across two processes)
give the same tokens."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from jax.sharding import PartitionSpec
from fixtures.four_devices import run_on_four_devices, with_devices
from fixtures.child_path import child_python_path

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The prompts of the gemma3 runs (built the same way in the children, which hold no session pipeline).
GEMMA3_CONVS = r"""
import numpy as np
from PIL import Image
img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 30, 3), dtype=np.uint8))
convs = [[{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "What is this?"}]}],
         [{"role": "user", "content": "Tell me a story about a fox."}]]
"""

# Each four-device run loads the folder with the session pipeline's settings (conftest.py); the one-device answer
# it must equal is the session pipeline's, in the pytest process.
SCRIPT = r"""
import json, sys
import jax
from omnijax.app.pipeline import Pipeline
from fixtures.step_shapes import few_step_shapes
from omnijax.common.sharding import make_mesh
assert len(jax.devices()) == 4, jax.devices()
folder = sys.argv[1]
""" + GEMMA3_CONVS + r"""
pipe = Pipeline.from_pretrained(folder, mesh=make_mesh(4), dtype="float32")
few_step_shapes(pipe)
leaf = pipe.engine.params["decoder"]["layers"][0]["mlp"]["gate_up_proj"]
out = {"tokens": [r.token_ids for r in pipe.generate(convs, max_new_tokens=12)],
       "shards": len(leaf.addressable_shards), "spec": str(leaf.sharding.spec)}
print("RESULT" + json.dumps(out))
"""


def gemma3_one_device(pipe, max_new_tokens: int) -> list[list[int]]:
    scope: dict = {}
    exec(GEMMA3_CONVS, scope)
    return [r.token_ids for r in pipe.generate(scope["convs"], max_new_tokens=max_new_tokens)]


@pytest.mark.multidevice
def test_four_device_runs_equal_one_device(tiny_gemma3_dir, gemma3_pipeline):
    """A model axis of 4. (A data 2 x model 2 mesh: the two-process run below and
    test_serving_engine.py::test_four_devices_split_slots_and_weights.)"""
    four = run_on_four_devices(SCRIPT, tiny_gemma3_dir)
    one = gemma3_one_device(gemma3_pipeline, 12)
    assert four["tokens"] == one and len(one[0]) > 0
    assert four["shards"] == 4 and "model" in four["spec"]  # weights really are split


def test_partition_spec_drops_axes_that_do_not_divide():
    import jax
    from omnijax.common.sharding import make_mesh, partition_spec

    mesh = make_mesh(1, jax.devices()[:1])
    assert partition_spec(("embed", "mlp"), (8, 16), mesh) == PartitionSpec(None, None)

    class FakeMesh:
        shape = {"data": 2, "model": 4}

    assert partition_spec(("embed", "mlp"), (8, 16), FakeMesh()) == PartitionSpec(None, "model")
    assert partition_spec(("embed", "kv_heads"), (8, 6), FakeMesh()) == PartitionSpec(None, None)
    assert partition_spec(("batch", "length"), (4, 5), FakeMesh()) == PartitionSpec("data", None)
    assert partition_spec(("heads", "mlp"), (8, 8), FakeMesh()) == PartitionSpec("model", None)


QWEN_CONVS = r"""
import numpy as np
from PIL import Image
img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8))
t = np.arange(16000) / 16000
clip = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
convs = [[{"role": "user", "content": [{"type": "image", "image": img}, {"type": "audio", "audio": clip},
                                       {"type": "text", "text": "Describe both."}]}],
         [{"role": "user", "content": "Tell me a story about a fox."}]]
"""

QWEN_SCRIPT = r"""
import json, sys
import jax
from omnijax.app.pipeline import Pipeline
from fixtures.step_shapes import few_step_shapes
from omnijax.common.sharding import make_mesh
folder = sys.argv[1]
""" + QWEN_CONVS + r"""
pipe = Pipeline.from_pretrained(folder, mesh=make_mesh(4))
few_step_shapes(pipe)
moe = next(l["mlp"] for l in pipe.engine.params["decoder"]["layers"].values() if "router" in l["mlp"])
out = {"tokens": [r.token_ids for r in pipe.generate(convs, max_new_tokens=10)],
       "expert_spec": str(moe["gate_proj"].sharding.spec)}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.multidevice
def test_expert_parallel_runs_equal_one_device(tiny_qwen_dir, qwen_pipeline):
    """The experts split over a model axis of 4, with an image and audio. (The thinker on a data 2 x model 2 mesh:
    test_qwen3_omni_speech_sharding.py.)"""
    four = run_on_four_devices(QWEN_SCRIPT, tiny_qwen_dir)
    scope: dict = {}
    exec(QWEN_CONVS, scope)
    one = [r.token_ids for r in qwen_pipeline.generate(scope["convs"], max_new_tokens=10)]
    assert four["tokens"] == one and len(one[0]) > 0
    assert four["expert_spec"] == "P('model', None, None)"  # experts split over the model axis


COLLECTIVES_SCRIPT = r"""
import collections, json, re, sys
import jax, jax.numpy as jnp
from omnijax.app.pipeline import Pipeline
from omnijax.common.sharding import make_mesh, use_mesh
folder = sys.argv[1]
out = {}
for name, model in [("model4", 4), ("data2_model2", 2)]:
    pipe = Pipeline.from_pretrained(folder, mesh=make_mesh(model), max_batch=2, max_context=256)
    eng, slots = pipe.engine, pipe.scheduler.slots
    slots.ensure_allocated()
    with use_mesh(eng.mesh):
        hlo = slots.lower_step(slots.slots).compile().as_text()
    found = re.findall(r"= (\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(",
                       hlo)
    # per-row bookkeeping (a scalar or one value per slot: tokens, lengths, flags) vs activations / caches
    rows = [op for shape, op in found if re.fullmatch(r"\w+\[(\d*)\].*", shape)]
    ops = [op for shape, op in found if not re.fullmatch(r"\w+\[(\d*)\].*", shape)]
    out[name] = {"collectives": dict(collections.Counter(ops)), "row_collectives": len(rows),
                 "layers": pipe.config.decoder.num_layers,
                 "kv_heads": [l["attn"]["qkv"].shape[0] for l in eng.params["decoder"]["layers"].values()],
                 "qkv_spec": str(eng.params["decoder"]["layers"][0]["attn"]["qkv"].sharding.spec)}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.multidevice
def test_decode_step_collectives_are_bounded(tiny_gemma3_dir):
    """A sharded decode step needs one all-reduce after the attention output and one after the MLP per layer (the
    fused q/k/v and gate/up kernels are split by whole heads / matching rows); kv heads are repeated when the model
    axis exceeds them, and cache writes stay shard-local. Beside them, the slots' per-row state (the tokens fed,
    lengths and flags of the rows each data shard decodes, a few int32 / bool values each) is gathered a bounded
    number of times per step, whatever the depth (the tokens are drawn by the sample program, after the step)."""
    out = run_on_four_devices(COLLECTIVES_SCRIPT, tiny_gemma3_dir)
    for name, got in out.items():
        total = sum(got["collectives"].values())
        assert total <= 2 * got["layers"] + 2, (name, got["collectives"])
        assert set(got["collectives"]) <= {"all-reduce"}, (name, got["collectives"])
        assert got["row_collectives"] <= 6, (name, got)
    assert out["model4"]["kv_heads"] == [4] * out["model4"]["layers"]  # 2 kv heads, each held twice
    assert out["model4"]["qkv_spec"] == "P('model', None, None)"
    assert out["data2_model2"]["kv_heads"] == [2] * out["data2_model2"]["layers"]


MULTIHOST_SCRIPT = r"""
import json, sys
import jax
pid, n, port, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if n > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=pid)
from omnijax.app.pipeline import Pipeline
from fixtures.step_shapes import few_step_shapes
from omnijax.common.sharding import make_mesh
""" + GEMMA3_CONVS + r"""
pipe = Pipeline.from_pretrained(folder, mesh=make_mesh(2), dtype="float32")
few_step_shapes(pipe)
stream = pipe.stream(convs[1], max_new_tokens=6)
while True:
    try:
        next(stream)
    except StopIteration as done:
        streamed = done.value.token_ids
        break
out = {"devices": len(jax.devices()), "local": len(jax.local_devices()), "mesh": dict(pipe.engine.mesh.shape),
       "tokens": [r.token_ids for r in pipe.generate(convs, max_new_tokens=10)], "stream": streamed}
print("RESULT" + json.dumps(out), flush=True)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multidevice
def test_two_processes_share_one_mesh_and_equal_one_process(tiny_gemma3_dir, gemma3_pipeline):
    """Two JAX processes on this machine (jax.distributed over localhost, CPU collectives), 2 devices each, one
    (data 2 x model 2) mesh across both: both get the single-process, one-device answer (the session pipeline's)."""
    env = dict(os.environ, XLA_FLAGS=with_devices(2), JAX_PLATFORMS="cpu",
               PYTHONPATH=child_python_path(ROOT, ROOT / "tests"))
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", MULTIHOST_SCRIPT, str(i), "2", port, str(tiny_gemma3_dir)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    results = [json.loads(next(l for l in o.splitlines() if l.startswith("RESULT"))[len("RESULT"):]) for o, _ in outs]
    one = gemma3_one_device(gemma3_pipeline, 10)
    assert len(one[0]) > 0
    for r in results:
        assert (r["devices"], r["local"], r["mesh"]) == (4, 2, {"data": 2, "model": 2})
        assert r["tokens"] == one and r["stream"] == one[1][:6]
