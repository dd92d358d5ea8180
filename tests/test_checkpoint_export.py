"""Parameters back to checkpoint tensors (app/checkpoint_export.py, TensorSpec.unapply)."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

from omnijax.app.checkpoint_export import checkpoint_tensors
from omnijax.app.families.gemma3 import spec as gemma3
from fixtures.tiny_gemma3 import build_tiny_gemma3, gemma3_weight_shapes
from omnijax.common.weights import TensorSpec, fused_linear, stacked_linear


def test_unapply_inverts_apply_for_every_kind_of_spec():
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (2, 3), (2, 3)))
    for spec, parts in [
        (TensorSpec("w"), [a]),
        (TensorSpec("conv", reshape=(4, 6)), [rng.standard_normal((4, 2, 1, 3)).astype(np.float32)]),
        (TensorSpec("t", transpose=(1, 0)), [a]),
        (fused_linear(["q", "k", "v"]), [a, b, c]),
        (fused_linear(["q", "k", "v"], "bias"), [a[:, 0], b[:, 0], c[:, 0]]),
        (stacked_linear(["e0", "e1"]), [b, c]),
    ]:
        value = spec.apply(parts)
        back = spec.unapply(value, [p.shape for p in parts])
        assert len(back) == len(parts)
        for x, y in zip(back, parts):
            assert x.shape == y.shape and np.array_equal(x, y)
    with pytest.raises(ValueError, match="3 keys but 2 shapes"):
        fused_linear(["q", "k", "v"]).unapply(np.zeros((8, 3)), [(4, 3), (2, 3)])


@pytest.mark.parametrize("overrides", [None, {"tie_word_embeddings": False, "vision_config": {"num_hidden_layers": 1}}])
def test_checkpoint_tensors_give_back_the_checkpoint(tmp_path, overrides):
    """Load a random tiny checkpoint's tensors into parameters with the family weight map, export them again: the
    same tensors, bit for bit."""
    folder = build_tiny_gemma3(tmp_path, seed=5, config_overrides=overrides)
    import json

    config = json.loads((folder / "config.json").read_text())
    disk = load_file(str(folder / "model.safetensors"))
    cfg = gemma3.parse_config(config)
    weight_map = gemma3.weight_map(cfg)
    params = {path: spec.apply([disk[k] for k in spec.keys]) for path, spec in weight_map.items()}
    shapes = gemma3_weight_shapes(config)
    out = checkpoint_tensors(params, weight_map, shapes)
    assert list(out) == sorted(disk)
    for key, tensor in disk.items():
        assert out[key].dtype == np.float32 and np.array_equal(out[key], tensor), key


def test_checkpoint_tensors_name_what_is_missing():
    spec = {("a",): TensorSpec("x.weight")}
    with pytest.raises(ValueError, match="parameter b has no checkpoint tensor"):
        checkpoint_tensors({("b",): np.zeros(2)}, spec, {"x.weight": (2,)})
    with pytest.raises(ValueError, match=r"no parameter gives checkpoint tensors \['y.weight'\]"):
        checkpoint_tensors({("a",): np.zeros(2)}, spec, {"x.weight": (2,), "y.weight": (3,)})
