"""The Gemma 4 vision tower + embedder against transformers on the tiny checkpoints: image features for a batch of
images of different sizes, one compiled program for every size, every vision tensor mapped, and the pieces (2-D
RoPE, position pooling, clipped linears) on their own."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
import pytest
import safetensors
import torch
from flax import nnx
from transformers.models.gemma4 import modeling_gemma4 as hf
from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig as HFVisionConfig

from omnijax.common.errors import CheckpointError, MediaError
from omnijax.app.families.gemma4.spec import check_image_config
from omnijax.encoders.attention import attention
from omnijax.encoders.gemma4.vision import (ROPE_SECTIONS, Gemma4VisionConfig, Gemma4VisionEncoder,
                                            gemma4_vision_weight_map, pool_by_position)
from omnijax.encoders.rope_2d import apply_rope_2d, rope_2d_angles, rope_2d_cos_sin
from omnijax.preprocess.gemma4.image_batch import budget_for, collate, collate_smallest_budget, padded_image_count
from omnijax.preprocess.gemma4.image import Gemma4ImageConfig, process_image, process_images

from fixtures.module_parity import assert_close, flat_paths, load_module

pytestmark = pytest.mark.reference

_SIZES = [(50, 80), (120, 30), (7, 300), (96, 96), (200, 150), (13, 47)]


def _image(height: int, width: int, seed: int) -> PIL.Image.Image:
    return PIL.Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8))


def _tensors(folder) -> dict[str, np.ndarray]:
    with safetensors.safe_open(str(folder / "model.safetensors"), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _vision_keys(tensors) -> set[str]:
    return {k for k in tensors if k.startswith(("model.vision_tower.", "model.embed_vision."))}


class _Loaded:
    """Our encoder for one tiny folder: config, image config, params, and one jitted call."""

    def __init__(self, folder):
        self.cfg = Gemma4VisionConfig.from_model_config(json.loads((folder / "config.json").read_text()))
        self.image_cfg = Gemma4ImageConfig.from_folder(folder)
        check_image_config(self.cfg, self.image_cfg)
        self.tensors = _tensors(folder)
        self.weight_map = gemma4_vision_weight_map(self.cfg)
        self.graphdef, self.params = load_module(lambda: Gemma4VisionEncoder(self.cfg, rngs=nnx.Rngs(0)),
                                                 self.weight_map, self.tensors)
        self.fn = jax.jit(lambda params, inputs: nnx.merge(self.graphdef, params)(inputs))

    def __call__(self, images, params=None):
        inputs = collate([process_image(im, self.image_cfg) for im in images], self.image_cfg)
        features, valid, extras = self.fn(self.params if params is None else params, inputs)
        assert extras == ()
        return np.asarray(features), np.asarray(valid), inputs


@pytest.fixture(scope="module")
def small(tiny_gemma4_small_dir):
    return _Loaded(tiny_gemma4_small_dir)


@pytest.fixture(scope="module")
def moe(tiny_gemma4_moe_dir):
    return _Loaded(tiny_gemma4_moe_dir)


def _reference_features(model, images, image_cfg) -> np.ndarray:
    pixel_values, position_ids, _ = process_images(images, image_cfg)
    with torch.no_grad():
        out = model.model.get_image_features(torch.from_numpy(pixel_values), torch.from_numpy(position_ids))
    return np.concatenate([t.numpy() for t in out.pooler_output])


def _check_against_reference(loaded, model, images) -> float:
    features, valid, inputs = loaded(images)
    rows = loaded.image_cfg.max_soft_tokens
    n = padded_image_count(len(images))
    assert features.shape == (n * rows, loaded.cfg.text_hidden_size) and valid.shape == (n * rows,)
    counts = inputs["num_soft_tokens"]
    expected_valid = (np.arange(rows)[None, :] < counts[:, None]).reshape(-1)
    np.testing.assert_array_equal(valid, expected_valid)
    assert not features[~valid].any()
    return assert_close(features[valid], _reference_features(model, images, loaded.image_cfg))


@pytest.mark.parametrize("layout", ["small", "moe"])
def test_features_match_transformers(layout, request):
    loaded = request.getfixturevalue(layout)
    model, _ = request.getfixturevalue(f"hf_gemma4_{layout}")
    images = [_image(h, w, i) for i, (h, w) in enumerate(_SIZES[:3])]  # 3 images -> a bucket of 4
    rel = _check_against_reference(loaded, model, images)
    print(f"gemma4 vision ({layout}): rel err {rel:.2e}")


def test_new_sizes_do_not_recompile(small, hf_gemma4_small):
    model, _ = hf_gemma4_small
    batches = [[_image(*_SIZES[i], 10 + i) for i in (0, 1, 2)],
               [_image(*_SIZES[i], 20 + i) for i in (3, 4, 5, 0)],
               [_image(1, 1, 30), _image(500, 3, 31), _image(64, 64, 32)]]
    for images in batches[:-1]:
        _, valid, inputs = small(images)
        assert valid.sum() == inputs["num_soft_tokens"].sum() > 0
    _check_against_reference(small, model, batches[-1])  # the extreme sizes against the reference
    assert small.fn._cache_size() == 1


def test_weight_map_covers_every_vision_tensor(small, moe):
    for loaded in (small, moe):
        mapped = {key for spec in loaded.weight_map.values() for key in spec.keys}
        assert mapped == _vision_keys(loaded.tensors)
    clip_keys = {k for k in small.tensors if k.endswith(("input_min", "input_max", "output_min", "output_max"))}
    assert clip_keys and clip_keys <= _vision_keys(small.tensors) | {k for k in clip_keys if "audio" in k}
    assert {"model.vision_tower.std_bias", "model.vision_tower.std_scale"} <= _vision_keys(moe.tensors)


def test_clip_bounds_take_effect(small):
    """With the clip bounds opened to +-inf the features change: the loaded bounds clip."""
    images = [_image(60, 60, 40), _image(20, 90, 41), _image(90, 20, 42)]  # the bucket of 4 compiled above
    clipped, valid, _ = small(images)
    opened = jax.tree_util.tree_map_with_path(
        lambda path, v: jnp.full_like(v, -jnp.inf if str(path[-1].key).endswith("min") else jnp.inf)
        if str(path[-1].key) in ("input_min", "input_max", "output_min", "output_max") else v, small.params)
    unclipped, _, _ = small(images, opened)
    assert np.abs(clipped[valid] - unclipped[valid]).max() > 1e-2 * np.abs(clipped[valid]).max()


# ---------------------------------------------------------------------------------------------------------------
# Pieces against the reference's own modules


def test_rope_matches_reference():
    head_dim, theta = 16, 100.0
    hf_cfg = HFVisionConfig(hidden_size=32, num_attention_heads=2, head_dim=head_dim,
                            rope_parameters={"rope_type": "axial", "rope_theta": theta})
    rope = hf.Gemma4VisionRotaryEmbedding(hf_cfg)
    rng = np.random.default_rng(0)
    positions = rng.integers(-1, 40, (2, 9, 2))
    x = rng.standard_normal((2, 9, 3, head_dim)).astype(np.float32)
    with torch.no_grad():
        cos, sin = rope(torch.from_numpy(x), torch.from_numpy(positions))
        ref = hf.apply_multidimensional_rope(torch.from_numpy(x), cos, sin, torch.from_numpy(positions)).numpy()

    @jax.jit
    def ours(x, positions):
        c, s = rope_2d_cos_sin(rope_2d_angles(positions, head_dim, theta), sections=ROPE_SECTIONS)
        return c, apply_rope_2d(x, c, s, sections=ROPE_SECTIONS)

    ours_cos, rotated = ours(jnp.asarray(x), jnp.asarray(positions))
    np.testing.assert_allclose(np.asarray(ours_cos), cos.numpy(), atol=1e-6)
    assert_close(rotated, ref)


def test_pooling_matches_reference():
    """Two images of 6 x 3 and 3 x 9 patches (k = 3) padded to 36 patches: 2 and 3 soft tokens of 4."""
    pooler = hf.Gemma4VisionPooler(HFVisionConfig(hidden_size=8))
    positions = np.full((2, 36, 2), -1, np.int64)
    positions[0, :18] = [(x, y) for y in range(3) for x in range(6)]
    positions[1, :27] = [(x, y) for y in range(3) for x in range(9)]
    padding = np.all(positions == -1, axis=-1)
    hidden = np.random.default_rng(1).standard_normal((2, 36, 8)).astype(np.float32)
    with torch.no_grad():
        ref, ref_mask = pooler(torch.from_numpy(hidden), torch.from_numpy(positions), torch.from_numpy(padding), 4)
    pool = jax.jit(lambda h, p, m: pool_by_position(h, p, m, 3, 4))
    pooled, valid = (np.asarray(a) for a in pool(jnp.asarray(hidden), jnp.asarray(positions), jnp.asarray(padding)))
    np.testing.assert_array_equal(valid, ref_mask.numpy())
    assert valid.sum(axis=1).tolist() == [2, 3]
    assert_close(pooled[valid] * np.sqrt(8.0), ref.numpy()[ref_mask.numpy()])
    # By hand: image 0's first soft token averages its patches x < 3, y < 3; image 1's third its patches x >= 6.
    np.testing.assert_allclose(pooled[0, 0], hidden[0, [0, 1, 2, 6, 7, 8, 12, 13, 14]].mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(pooled[1, 2], hidden[1, [6, 7, 8, 15, 16, 17, 24, 25, 26]].mean(axis=0), rtol=1e-5)


def test_attention_blocks_and_grouped_heads():
    """Grouped kv heads and query blocks give the reference's eager attention (repeated kv heads, additive key
    mask, scale 1); a padded image with no valid key gives finite rows."""
    rng = np.random.default_rng(2)
    b, p, heads, kv, d = 3, 50, 4, 2, 8
    q = rng.standard_normal((b, p, heads, d)).astype(np.float32)
    k = rng.standard_normal((b, p, kv, d)).astype(np.float32)
    v = rng.standard_normal((b, p, kv, d)).astype(np.float32)
    valid = np.arange(p)[None, :] < np.array([[50], [17], [0]])
    mask = torch.where(torch.from_numpy(valid)[:, None, None, :], 0.0, torch.finfo(torch.float32).min)

    class _Module(torch.nn.Module):
        num_key_value_groups = heads // kv
        training = False

    ref, _ = hf.eager_attention_forward(_Module(), torch.from_numpy(q).transpose(1, 2),
                                        torch.from_numpy(k).transpose(1, 2), torch.from_numpy(v).transpose(1, 2),
                                        mask, scaling=1.0)
    ref = ref.numpy()
    run = jax.jit(attention, static_argnames=("scale", "query_block"))
    for block in (64, 7):  # one block, then 8 blocks (the last one padded)
        ours = np.asarray(run(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(valid), query_block=block))
        assert np.isfinite(ours).all()
        assert_close(ours[:2], ref[:2])


# ---------------------------------------------------------------------------------------------------------------
# Contract and bad input


def test_collate_pads_to_a_power_of_two(small):
    items = [process_image(_image(50, 80, 1), small.image_cfg), process_image(_image(9, 9, 2), small.image_cfg),
             process_image(_image(30, 70, 3), small.image_cfg)]
    inputs = collate(items, small.image_cfg)
    assert inputs["pixel_values"].shape == (4, 630, 48) and inputs["pixel_values"].dtype == np.float32
    assert inputs["position_ids"].shape == (4, 630, 2) and inputs["position_ids"].dtype == np.int32
    assert inputs["num_soft_tokens"].tolist() == [it.num_soft_tokens for it in items] + [0]
    assert (inputs["position_ids"][3] == -1).all() and not inputs["pixel_values"][3].any()
    rows = items[1].pixel_values.shape[0]
    assert (inputs["position_ids"][1, rows:] == -1).all() and not inputs["pixel_values"][1, rows:].any()
    assert [padded_image_count(n) for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]
    with pytest.raises(MediaError, match="no images"):
        collate([], small.image_cfg)
    with pytest.raises(MediaError, match="do not fit"):
        collate(items, Gemma4ImageConfig(patch_size=16, max_soft_tokens=70))


def test_encoder_collate_picks_the_smallest_budget_and_the_budget_does_not_change_features(small):
    """``collate_smallest_budget`` (the engine's batching of Gemma 4 images) pads to the smallest supported
    soft-token budget that holds the largest image of the batch; a larger budget (more padding patches) gives the
    same features."""
    items = [process_image(_image(50, 80, 1), small.image_cfg), process_image(_image(9, 9, 2), small.image_cfg)]
    inputs = collate_smallest_budget(items, small.image_cfg)
    assert inputs["pixel_values"].shape == (2, 70 * 9, 48)
    assert budget_for(items, small.image_cfg).max_soft_tokens == 70
    big = [dataclasses.replace(items[0], num_soft_tokens=100)]
    assert budget_for(big, small.image_cfg).max_soft_tokens == 140
    with pytest.raises(MediaError, match="largest supported budget"):
        budget_for([dataclasses.replace(items[0], num_soft_tokens=1121)], small.image_cfg)
    features, valid, _ = small.fn(small.params, inputs)
    wide = collate(items, small.image_cfg.with_max_soft_tokens(140))
    features_wide, valid_wide, _ = small.fn(small.params, wide)
    rows = np.asarray(valid).sum()
    assert rows == np.asarray(valid_wide).sum() == sum(it.num_soft_tokens for it in items)
    np.testing.assert_allclose(np.asarray(features_wide)[np.asarray(valid_wide)],
                               np.asarray(features)[np.asarray(valid)], rtol=0, atol=1e-5)


def test_config_checks(small):
    assert small.cfg.text_hidden_size == 64 and small.cfg.use_clipped_linears and not small.cfg.standardize
    assert small.cfg.rope_theta == 100.0 and small.cfg.position_embedding_size == 1024
    check_image_config(small.cfg, small.image_cfg.with_max_soft_tokens(280))  # 840 patches long: fits 1024
    with pytest.raises(CheckpointError, match="learned positions"):
        check_image_config(small.cfg, small.image_cfg.with_max_soft_tokens(560))
    with pytest.raises(CheckpointError, match="-pixel patches"):
        check_image_config(small.cfg, Gemma4ImageConfig(patch_size=8, max_soft_tokens=70))
    with pytest.raises(CheckpointError, match="multiple of 4"):
        Gemma4VisionConfig.from_hf({"head_dim": 18}, 64)
    with pytest.raises(CheckpointError, match="num_key_value_heads"):
        Gemma4VisionConfig.from_hf({"num_attention_heads": 12, "num_key_value_heads": 5}, 64)
    with pytest.raises(CheckpointError, match="no vision_config"):
        Gemma4VisionConfig.from_model_config({"text_config": {}})
    defaults = Gemma4VisionConfig.from_hf({}, 64)
    hf_defaults = HFVisionConfig()
    assert (defaults.hidden_size, defaults.num_hidden_layers, defaults.head_dim, defaults.patch_size,
            defaults.pooling_kernel_size, defaults.position_embedding_size, defaults.rms_norm_eps) == (
        hf_defaults.hidden_size, hf_defaults.num_hidden_layers, hf_defaults.head_dim, hf_defaults.patch_size,
        hf_defaults.pooling_kernel_size, hf_defaults.position_embedding_size, hf_defaults.rms_norm_eps)


def test_params_carry_logical_axes(small, moe):
    for loaded in (small, moe):
        module = nnx.eval_shape(lambda: Gemma4VisionEncoder(loaded.cfg, rngs=nnx.Rngs(0)))
        state = nnx.state(module, nnx.Param)
        for path, var in nnx.to_flat_state(state):
            axes = var.get_metadata().get("axes")
            assert axes is not None and len(axes) == len(var.shape), (path, axes, var.shape)
        assert set(flat_paths(nnx.to_pure_dict(state))) == set(loaded.weight_map)
